"""Picture ablations of a held-out split: does the policy read the picture?

Two transforms of a list of tasks with pictures, each keeping the question and the answer and changing only
what is shown (``eval.picture_ablation``, docs/vision.md):

- ``blank_pictures``: every picture replaced by a uniform mid-grey one of the same size (``BLANK``, the
  ``shapes`` task's empty ground). A policy that reads the picture falls to what it answers with no
  information: at most the share of the most frequent answer.
- ``shuffled_pictures``: the pictures permuted among the rows by a seeded derangement (a random cyclic order,
  each row shown the next row's pictures, so no row keeps its own): every picture is a real one, but of
  another question's scene. A policy that reads it answers for the wrong scene: its accuracy falls to
  sum_a p_a^2 over the answers' shares p_a (1/k for k balanced answers), the chance that the other scene
  has the same answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from reinforge.errors import ConfigError
from reinforge.types import Task

BLANK = (128, 128, 128)


def _with_pictures(tasks: Sequence[Task]) -> list[Task]:
    tasks = list(tasks)
    if not tasks or not all(t.images for t in tasks):
        raise ConfigError("eval.picture_ablation: a picture ablation needs held-out tasks that all have pictures")
    return tasks


def blank_pictures(tasks: Sequence[Task]) -> list[Task]:
    """``tasks`` with each picture replaced by a uniform ``BLANK`` picture of its size."""
    from PIL import Image

    from reinforge.rollout.vision import read_image

    out = []
    for t in _with_pictures(tasks):
        sizes = [read_image(image, f"task {t.id!r}").size for image in t.images]
        out.append(dataclasses.replace(t, images=tuple(Image.new("RGB", size, BLANK) for size in sizes)))
    return out


def shuffled_pictures(tasks: Sequence[Task], seed: int = 0) -> list[Task]:
    """``tasks`` with the pictures moved along a seeded random cycle through the rows: row ``order[i]`` shows
    the pictures of row ``order[i + 1]`` (wrapping), so none keeps its own (needs at least two rows)."""
    tasks = _with_pictures(tasks)
    if len(tasks) < 2:
        raise ValueError("shuffling pictures needs at least two tasks")
    order = np.random.default_rng(seed).permutation(len(tasks))
    source = np.empty(len(tasks), dtype=int)
    source[order] = np.roll(order, -1)
    return [dataclasses.replace(t, images=tasks[int(j)].images) for t, j in zip(tasks, source, strict=True)]
