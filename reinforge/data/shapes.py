"""Built-in procedural image task: a picture of coloured shapes and a question only the picture answers.

Every task is an index into a grid of scenes (``grid.grid_splits``: a seeded random subset of indices is
held out, the splits never overlap and ids are stable); the scene is drawn from the index alone (PIL), so
a task is the same in every process. Two questions:

- ``colour``: one shape (square, circle or triangle) of one of four colours at a random place and size on a
  grey ground; the prompt is ``"colour?"`` and the answer the colour's name (``red``, ``green``, ``blue``,
  ``yellow``). A model that does not look is right with probability 1/4 (``CHANCE``).
- ``box``: the ``colour`` scene; the prompt is ``"box?"`` and the answer the shape's bounding box
  ``x1,y1,x2,y2`` in pixels, both corners included (score it with the ``box_iou`` verifier,
  rewards/grounding.py). No chance level: a box is graded by its overlap.
- ``count``: 1 to 4 dots of one colour at places that do not overlap; the prompt is ``"count?"`` and the
  answer the number of dots. Chance is again 1/4.
- ``shape``: one shape of a random colour, drawn as for ``colour``; the prompt is ``"shape?"`` and the answer
  the shape's name (``square``, ``circle``, ``triangle``). Chance is 1/3.

The prompt is one user message whose content is an image part followed by the question, and
``Task.images`` holds the picture (the model's processor places its tokens, rollout/vision.py).
``metadata`` records the scene (colour, shape, count) for evaluation's breakdowns.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from reinforge.data.base import TaskSplits
from reinforge.data.grid import grid_splits
from reinforge.types import Task

COLOURS: dict[str, tuple[int, int, int]] = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220),
                                            "yellow": (230, 220, 40)}
SHAPES = ("square", "circle", "triangle")
QUESTIONS = {"colour": "colour?", "count": "count?", "shape": "shape?", "box": "box?"}
MAX_DOTS = 4
ANSWERS: dict[str, tuple[str, ...]] = {"colour": tuple(COLOURS), "count": tuple(str(n) for n in range(1, MAX_DOTS + 1)),
                                       "shape": SHAPES}
CHANCE = {question: 1 / len(answers) for question, answers in ANSWERS.items()}
GROUND = (128, 128, 128)
SCENES_PER_ANSWER = 10_000  # grid size per answer: scenes are drawn from the index, so the grid is just ids


def _draw_shape(draw: Any, shape: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    if shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "circle":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)


def colour_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """The picture of scene ``index`` for the ``colour`` question and its record (colour, shape)."""
    rng = np.random.default_rng([index, 17])
    return _one_shape(rng, list(COLOURS)[index % len(COLOURS)], SHAPES[int(rng.integers(len(SHAPES)))], size)


def shape_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """The picture of scene ``index`` for the ``shape`` question: the shape is the index's, the colour random."""
    rng = np.random.default_rng([index, 23])
    return _one_shape(rng, list(COLOURS)[int(rng.integers(len(COLOURS)))], SHAPES[index % len(SHAPES)], size)


def _one_shape(rng: np.random.Generator, colour: str, shape: str, size: int) -> tuple[Any, dict[str, Any]]:
    """One ``shape`` of ``colour`` at a random place, a side of a third to a half of the picture."""
    from PIL import Image, ImageDraw

    side = int(rng.integers(size // 3, size // 2 + 1))
    x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
    image = Image.new("RGB", (size, size), GROUND)
    _draw_shape(ImageDraw.Draw(image), shape, (x0, y0, x0 + side - 1, y0 + side - 1), COLOURS[colour])
    return image, {"colour": colour, "shape": shape, "box": f"{x0},{y0},{x0 + side - 1},{y0 + side - 1}"}


def count_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """The picture of scene ``index`` for the ``count`` question: 1..4 dots on a 4 x 4 lattice of cells."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng([index, 29])
    count = index % MAX_DOTS + 1
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    cell = size // 4
    image = Image.new("RGB", (size, size), GROUND)
    draw = ImageDraw.Draw(image)
    for c in rng.choice(16, size=count, replace=False):
        x, y = int(c) % 4 * cell, int(c) // 4 * cell
        draw.ellipse((x + 1, y + 1, x + cell - 2, y + cell - 2), fill=COLOURS[colour])
    return image, {"count": count, "colour": colour}


SCENES = {"colour": (colour_scene, "colour"), "count": (count_scene, "count"), "shape": (shape_scene, "shape"),
          "box": (colour_scene, "box")}


def shapes_task(index: int, question: str, size: int) -> Task:
    """Task ``index`` of the ``question`` grid: its picture, the question and the exact answer."""
    draw, key = SCENES[question]
    image, scene = draw(index, size)
    return Task(
        id=f"shapes-{question}-{index}",
        prompt=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTIONS[question]}]}],
        answer=str(scene[key]),
        metadata={**scene, "question": question},
        images=(image,),
    )


def shapes_splits(question: str = "colour", size: int = 32, heldout_size: int = 200, seed: int = 1234
                  ) -> TaskSplits:
    """Disjoint train / held-out splits of the ``question`` grid (seeded); pictures ``size`` x ``size`` pixels."""
    if question not in SCENES:
        raise ValueError(f"question must be one of {sorted(SCENES)}, got {question!r}")
    if isinstance(size, bool) or not isinstance(size, int) or not 16 <= size <= 512:
        raise ValueError(f"size must be an integer number of pixels in 16..512, got {size!r}")
    answers = len(ANSWERS.get(question, COLOURS))  # box: the colour scenes' grid
    return grid_splits(answers * SCENES_PER_ANSWER, heldout_size, seed,
                       partial(shapes_task, question=question, size=size), f"shapes(question={question}, size={size})")
