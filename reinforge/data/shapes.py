"""Built-in procedural image task: a picture of coloured shapes and a question only the picture answers.

Every task is an index into a grid of scenes (``grid.grid_splits``: a seeded random subset of indices is
held out, the splits never overlap and ids are stable); the scene is drawn from the index alone (PIL), so
a task is the same in every process. The questions:

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
- ``count_colour``: 1 to 4 shapes of one colour among 1 to 3 of the other colours; the prompt names the colour
  (``"red?"``) and the answer is how many shapes have it. Chance 1/4.
- ``position``: two shapes in the halves (left / right or top / bottom) or four in the quadrants, each of its own
  colour; the prompt names a place (``"left?"``, ``"bottom right?"``) and the answer is the colour there. Chance 1/4.
- ``digits``: a 2- or 3-digit number (no leading zero) drawn in a 3 x 5 bitmap font; the prompt is ``"digits?"``
  and the answer the number as written. Chance: the most frequent answer's share, 1/2 x 1/90.
- ``bars``: two vertical bars of different heights; the prompt is ``"taller?"`` and the answer ``left`` or
  ``right``. Chance 1/2.
- ``geometry``: a regular polygon of 3 to 6 sides at a random size, place and turn; the prompt is ``"sides?"``
  and the answer the number of sides. Chance 1/4.

The scenes of the last five are in data/shapes_scenes.py, the drawing primitives in data/picture.py.

The prompt is one user message whose content is an image part followed by the question, and
``Task.images`` holds the picture (the model's processor places its tokens, rollout/vision.py).
``metadata`` records the scene (colour, shape, count) for evaluation's breakdowns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from reinforge.data import shapes_scenes as scenes
from reinforge.data.base import TaskSplits
from reinforge.data.grid import grid_splits
from reinforge.data.picture import COLOURS, GROUND, SHAPES, canvas, draw_shape
from reinforge.types import Task

__all__ = ["ANSWERS", "CHANCE", "COLOURS", "GROUND", "QUESTIONS", "SHAPES", "in_format", "random_answer",
           "shapes_splits", "shapes_task"]

MAX_DOTS = scenes.MAX_COUNT
COUNTS = tuple(str(n) for n in range(1, MAX_DOTS + 1))
QUESTIONS = {"colour": "colour?", "count": "count?", "shape": "shape?", "box": "box?", "count_colour": "<colour>?",
             "position": "<place>?", "digits": "digits?", "bars": "taller?", "geometry": "sides?"}
ANSWERS: dict[str, tuple[str, ...]] = {
    "colour": tuple(COLOURS), "count": COUNTS, "shape": SHAPES, "count_colour": COUNTS, "position": tuple(COLOURS),
    "digits": tuple(str(n) for n in range(10, 1000)), "bars": ("left", "right"),
    "geometry": tuple(str(n) for n in scenes.SIDES)}
CHANCE = {question: 1 / len(answers) for question, answers in ANSWERS.items()} | {"digits": 0.5 / 90}
BOX = re.compile(r"\d+,\d+,\d+,\d+")
SCENES_PER_ANSWER = 10_000  # grid size per answer: scenes are drawn from the index, so the grid is just ids
DIGIT_SCENES = 40_000  # the digits grid (its answers are too many for SCENES_PER_ANSWER each)


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
    side = int(rng.integers(size // 3, size // 2 + 1))
    x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
    image, draw = canvas(size)
    draw_shape(draw, shape, (x0, y0, x0 + side - 1, y0 + side - 1), COLOURS[colour])
    return image, {"colour": colour, "shape": shape, "box": f"{x0},{y0},{x0 + side - 1},{y0 + side - 1}"}


def count_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """The picture of scene ``index`` for the ``count`` question: 1..4 dots on a 4 x 4 lattice of cells."""
    rng = np.random.default_rng([index, 29])
    count = index % MAX_DOTS + 1
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    cell = size // 4
    image, draw = canvas(size)
    for c in rng.choice(16, size=count, replace=False):
        x, y = int(c) % 4 * cell, int(c) // 4 * cell
        draw.ellipse((x + 1, y + 1, x + cell - 2, y + cell - 2), fill=COLOURS[colour])
    return image, {"count": count, "colour": colour}


Scene = Callable[[int, int], tuple[Any, dict[str, Any]]]
# question -> (scene drawer, the record's key that holds the answer)
SCENES: dict[str, tuple[Scene, str]] = {
    "colour": (colour_scene, "colour"), "count": (count_scene, "count"), "shape": (shape_scene, "shape"),
    "box": (colour_scene, "box"), "count_colour": (scenes.count_colour_scene, "count"),
    "position": (scenes.position_scene, "colour"), "digits": (scenes.digits_scene, "digits"),
    "bars": (scenes.bars_scene, "bars"), "geometry": (scenes.geometry_scene, "sides")}


def grid_size(question: str) -> int:
    """Scenes in the ``question`` grid: ``SCENES_PER_ANSWER`` per answer (box: the colour scenes'), digits 40,000."""
    return DIGIT_SCENES if question == "digits" else len(ANSWERS.get(question, COLOURS)) * SCENES_PER_ANSWER


def in_format(question: str, text: str) -> bool:
    """Whether ``text`` is an answer of ``question``'s kind (one of its ``ANSWERS``; box: ``x1,y1,x2,y2``)."""
    return bool(BOX.fullmatch(text)) if question == "box" else text in ANSWERS[question]


def random_answer(question: str, rng: np.random.Generator, size: int = 32) -> str:
    """An answer of ``question``'s kind drawn as the task draws them, independent of any picture: uniform over
    ``ANSWERS`` (digits: the length 2 or 3 with probability 1/2, no leading zero), box: a random box of the
    ``colour`` scene's sizes in a ``size`` picture."""
    if question == "box":
        side = int(rng.integers(size // 3, size // 2 + 1))
        x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
        return f"{x0},{y0},{x0 + side - 1},{y0 + side - 1}"
    if question == "digits":
        n = 2 + int(rng.integers(2))
        return str(int(rng.integers(1, 10))) + "".join(str(int(d)) for d in rng.integers(0, 10, size=n - 1))
    answers = ANSWERS[question]
    return answers[int(rng.integers(len(answers)))]


def shapes_task(index: int, question: str, size: int) -> Task:
    """Task ``index`` of the ``question`` grid: its picture, the question and the exact answer."""
    draw, key = SCENES[question]
    image, scene = draw(index, size)
    text = scene.pop("prompt", QUESTIONS[question])
    return Task(
        id=f"shapes-{question}-{index}",
        prompt=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
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
    return grid_splits(grid_size(question), heldout_size, seed,
                       partial(shapes_task, question=question, size=size), f"shapes(question={question}, size={size})")
