"""The shapes task's questions beyond colour, count, shape and box (data/shapes_scenes.py, docs/vision.md): each
answer is read back from the drawn picture by a method of the test's own (pixel counts, connected regions, bar
heights, glyphs against hand-written bitmaps, polygon areas), the splits are seeded and disjoint, every prompt
and answer is in tiny-vlm's vocabulary, and bad settings are refused naming the field."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from reinforge.assets import resolve_model_path
from reinforge.config import task_config
from reinforge.data.picture import FONT, polygon_area_share
from reinforge.data.shapes import (
    ANSWERS,
    CHANCE,
    COLOURS,
    GROUND,
    QUESTIONS,
    SCENES,
    in_format,
    random_answer,
    shapes_splits,
)
from reinforge.data.shapes_scenes import place_box
from reinforge.data.sources import build_task_splits
from reinforge.errors import ConfigError

pytest.importorskip("PIL.Image")
NEW = ("count_colour", "position", "digits", "bars", "geometry")


def _pixels(task) -> np.ndarray:
    return np.asarray(task.images[0]).astype(int)


def _mask(task, colour: tuple[int, int, int]) -> np.ndarray:
    return (_pixels(task) == colour).all(-1)


def _regions(mask: np.ndarray) -> int:
    """Connected regions (4-neighbours) of a boolean picture, by flood fill."""
    seen, regions = np.zeros_like(mask), 0
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        regions += 1
        stack = [start]
        while stack:
            y, x = stack.pop()
            if 0 <= y < mask.shape[0] and 0 <= x < mask.shape[1] and mask[y, x] and not seen[y, x]:
                seen[y, x] = True
                stack += [(y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)]
    return regions


def _text(task) -> str:
    return task.prompt[0]["content"][1]["text"]


def test_count_colour_answer_is_the_number_of_shapes_of_the_named_colour():
    tasks = shapes_splits("count_colour").heldout[:40]
    for t in tasks:
        named = _text(t).removesuffix("?")
        assert named in COLOURS and t.metadata["colour"] == named
        assert str(_regions(_mask(t, COLOURS[named]))) == t.answer, t.id
        others = sum(_regions(_mask(t, rgb)) for name, rgb in COLOURS.items() if name != named)
        assert 1 <= others <= 3, t.id  # distractors of the other colours, always some
    assert {t.answer for t in tasks} == {"1", "2", "3", "4"}


def test_position_answer_is_the_colour_in_the_named_place():
    tasks = shapes_splits("position").heldout[:40]
    for t in tasks:
        place = _text(t).removesuffix("?")
        x0, y0, x1, y1 = place_box(place, 32)
        region = _pixels(t)[y0:y1, x0:x1].reshape(-1, 3)
        inked = {tuple(px) for px in region if tuple(px) != GROUND}
        assert inked == {COLOURS[t.answer]}, t.id  # one colour in the named place, and it is the answer
        everywhere = {tuple(px) for px in _pixels(t).reshape(-1, 3)} - {GROUND}
        assert len(everywhere) == (4 if " " in place else 2), t.id  # two halves or four quadrants, one colour each
    assert {_text(t) for t in tasks} >= {"left?", "top?", "top left?"}
    assert Counter(t.answer for t in shapes_splits("position").heldout).keys() == set(COLOURS)


# Three glyphs written out here by hand (the 3 x 5 font), so the test does not only read FONT back.
HAND = {"1": [".#.", "##.", ".#.", ".#.", "###"], "4": ["#.#", "#.#", "###", "..#", "..#"],
        "7": ["###", "..#", ".#.", ".#.", ".#."]}


def _read_digits(task) -> str:
    """The digits in the picture: the inked box, cut into glyphs 4 font pixels apart, each matched to a bitmap."""
    inked = (_pixels(task) != GROUND).any(-1)
    ys, xs = np.nonzero(inked)
    scale = (ys.max() - ys.min() + 1) // 5  # 5 font rows
    top, left = ys.min(), xs.min()
    width = xs.max() - left + 1
    out = ""
    for k in range((width // scale + 1) // 4):
        glyph = inked[top:top + 5 * scale:scale, left + 4 * k * scale:left + (4 * k + 3) * scale:scale]
        rows = tuple("".join("#" if v else "." for v in row) for row in glyph)
        out += {bitmap: d for d, bitmap in FONT.items()}[rows]
    return out


def test_digits_answer_is_the_number_drawn():
    assert all(FONT[d] == tuple(rows) for d, rows in HAND.items())
    assert len(set(FONT.values())) == 10  # every digit its own bitmap
    tasks = shapes_splits("digits").heldout[:30]
    for t in tasks:
        assert _read_digits(t) == t.answer, t.id
        assert t.metadata["scale"] == 2  # 32 pixels: each font pixel 2 x 2
    assert {len(t.answer) for t in tasks} == {2, 3} and all(t.answer[0] != "0" for t in tasks)
    big = shapes_splits("digits", size=64).heldout[0]
    assert _read_digits(big) == big.answer and big.metadata["scale"] == 4


def test_bars_answer_is_the_side_of_the_taller_bar():
    tasks = shapes_splits("bars").heldout[:40]
    for t in tasks:
        inked = (_pixels(t) != GROUND).any(-1)
        height = {side: inked[:, cols].any(1).sum() for side, cols in (("left", slice(0, 16)), ("right", slice(16, 32)))}
        assert height["left"] != height["right"] and abs(height["left"] - height["right"]) >= 4, t.id
        assert t.answer == max(height, key=height.get), t.id
        assert _regions(inked) == 2
    assert Counter(t.answer for t in shapes_splits("bars").heldout) == {"left": 100, "right": 100}


def test_geometry_answer_is_the_polygons_number_of_sides():
    """Drawn at 128 pixels, a regular n-gon covers (n / 2pi) sin(2pi / n) of its circumscribed circle (0.41, 0.64,
    0.76, 0.83 for 3-6 sides); the circle's radius is the largest distance of an inked pixel from their mean."""
    tasks = shapes_splits("geometry", size=128).heldout[:24]
    for t in tasks:
        ys, xs = np.nonzero((_pixels(t) != GROUND).any(-1))
        radius = np.hypot(ys - ys.mean(), xs - xs.mean()).max() + 0.5
        share = len(xs) / (math.pi * radius**2)
        guess = min((3, 4, 5, 6), key=lambda n: abs(polygon_area_share(n) - share))
        assert str(guess) == t.answer, (t.id, share)
    assert {t.answer for t in tasks} == {"3", "4", "5", "6"}
    small = shapes_splits("geometry").heldout[:24]  # at 32 pixels, the same scenes' size order
    assert all(_mask(t, COLOURS[t.metadata["colour"]]).sum() >= 100 for t in small)  # radius 9 or more: >= ~140 px


@pytest.mark.parametrize("question", NEW)
def test_new_questions_are_seeded_disjoint_deterministic_and_in_format(question):
    splits = shapes_splits(question, heldout_size=50, seed=7)
    assert not set(splits.train.indices) & set(splits.heldout.indices)
    assert list(shapes_splits(question, heldout_size=50, seed=7).heldout.indices) == list(splits.heldout.indices)
    assert list(shapes_splits(question, heldout_size=50, seed=8).heldout.indices) != list(splits.heldout.indices)
    a, b = splits.heldout[3], shapes_splits(question, heldout_size=50, seed=7).heldout[3]
    assert a.images[0].tobytes() == b.images[0].tobytes() and a.answer == b.answer and a.prompt == b.prompt
    assert all(in_format(question, t.answer) and t.metadata["question"] == question for t in splits.heldout)
    assert SCENES[question] and 0 < CHANCE[question] <= 0.5
    rng = np.random.default_rng(0)
    assert all(in_format(question, random_answer(question, rng)) for _ in range(50))


def test_chance_levels():
    assert CHANCE["count_colour"] == CHANCE["position"] == CHANCE["geometry"] == 0.25 and CHANCE["bars"] == 0.5
    assert CHANCE["digits"] == pytest.approx(1 / 180)  # a 2-digit number (half the scenes), one of 90
    assert len(ANSWERS["digits"]) == 990 and "box" not in CHANCE


def test_every_prompt_and_answer_is_in_tiny_vlms_vocabulary():
    vocab = json.loads((resolve_model_path("tiny-vlm") / "tokenizer.json").read_text())["model"]["vocab"]
    rng = np.random.default_rng(1)
    for question in QUESTIONS:
        for t in shapes_splits(question, heldout_size=40).heldout:
            assert set(_text(t)) <= vocab.keys() and set(t.answer) <= vocab.keys(), (question, t.id)
        assert set(random_answer(question, rng)) <= vocab.keys()


def test_tiny_vlm_was_pretrained_on_every_question():
    stats = json.loads((resolve_model_path("tiny-vlm") / "build_stats.json").read_text())
    assert set(stats["heldout"]) == set(SCENES) == set(stats["question_shares"])
    for question, measured in stats["heldout"].items():  # answers in the question's format (box: not required,
        assert measured["greedy_format"] >= 0.9 or question == "box", question  # an 11-character answer, 1/17)


@pytest.mark.parametrize(("setting", "field"), [({"question": "digit"}, "question"), ({"image_size": 8}, "image_size"),
                                                ({"heldout_size": 0}, "heldout_size")])
def test_bad_settings_are_refused_naming_the_field(setting, field):
    with pytest.raises((ValueError, ConfigError), match=field):
        build_task_splits(task_config({"kind": "shapes", **setting}))
    with pytest.raises(ValueError, match="size must be"):
        shapes_splits("bars", size=12)
    with pytest.raises(ValueError, match="heldout_size must be in 1..19999"):
        shapes_splits("bars", heldout_size=20_000)
