"""The ``shapes`` task's scenes beyond one shape and plain counting (data/shapes.py registers them): counting one
colour among distractors, the colour at a named place, a digit string, the taller of two bars, and the number of
sides of a regular polygon. Each scene is drawn from its index alone (a numpy generator seeded by the index and
a per-question salt), and the answer is chosen by the index so that the answers are balanced over the grid.

Every function takes ``(index, size)`` and returns the picture and its record: the answer under the key
data/shapes.py reads, what else was drawn (for tests and evaluation breakdowns) and, where the question names
something of the picture, the prompt (``"red?"``, ``"top left?"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reinforge.data.picture import (
    COLOURS,
    GLYPH_H,
    SHAPES,
    canvas,
    digits_width,
    draw_digits,
    draw_shape,
    polygon_corners,
)

MAX_COUNT = 4  # count, count_colour: 1..4
MAX_DISTRACTORS = 3
PLACES: dict[str, tuple[str, ...]] = {"halves": ("left", "right"), "rows": ("top", "bottom"),
                                      "quadrants": ("top left", "top right", "bottom left", "bottom right")}
SIDES = (3, 4, 5, 6)


def _colour(rng: np.random.Generator) -> str:
    return list(COLOURS)[int(rng.integers(len(COLOURS)))]


def count_colour_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """1..4 shapes of the named colour (the count is the index's) and 1..3 shapes of the other colours, each a
    random shape in its own cell of a 4 x 4 lattice (a one-pixel margin in the cell, so no two touch)."""
    rng = np.random.default_rng([index, 31])
    count = index % MAX_COUNT + 1
    colour = _colour(rng)
    others = [c for c in COLOURS if c != colour]
    distractors = [others[int(i)] for i in rng.integers(len(others), size=int(rng.integers(1, MAX_DISTRACTORS + 1)))]
    cell = size // 4
    image, draw = canvas(size)
    for c, name in zip(rng.choice(16, size=count + len(distractors), replace=False), [colour] * count + distractors,
                       strict=True):
        x, y = int(c) % 4 * cell, int(c) // 4 * cell
        draw_shape(draw, SHAPES[int(rng.integers(len(SHAPES)))], (x + 1, y + 1, x + cell - 2, y + cell - 2),
                   COLOURS[name])
    return image, {"count": count, "colour": colour, "distractors": distractors, "prompt": f"{colour}?"}


def place_box(place: str, size: int) -> tuple[int, int, int, int]:
    """The pixels ``[x0, x1) x [y0, y1)`` of ``place``: a half (left, right, top, bottom) or a quadrant."""
    half = size // 2
    x0, x1 = (0, half) if "left" in place else (half, size) if "right" in place else (0, size)
    y0, y1 = (0, half) if "top" in place else (half, size) if "bottom" in place else (0, size)
    return x0, y0, x1, y1


def position_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """Two shapes in the two halves (left / right or top / bottom) or four in the four quadrants, each of a
    different colour and inside its region with a pixel to spare; the prompt names one region, the answer is
    its shape's colour (the index's, so the answers are balanced)."""
    rng = np.random.default_rng([index, 37])
    layout = list(PLACES)[int(rng.integers(len(PLACES)))]
    places = PLACES[layout]
    asked = places[int(rng.integers(len(places)))]
    colour = list(COLOURS)[index % len(COLOURS)]
    rest = [c for c in COLOURS if c != colour]
    others = iter(rest[int(i)] for i in rng.permutation(len(rest)))
    image, draw = canvas(size)
    colours = {}
    for place in places:
        colours[place] = colour if place == asked else next(others)
        x0, y0, x1, y1 = place_box(place, size)
        room = min(x1 - x0, y1 - y0) - 2
        side = int(rng.integers(room // 2, room + 1))
        left = int(rng.integers(x0 + 1, x1 - side)) if x1 - side > x0 + 1 else x0 + 1
        top = int(rng.integers(y0 + 1, y1 - side)) if y1 - side > y0 + 1 else y0 + 1
        draw_shape(draw, SHAPES[int(rng.integers(len(SHAPES)))], (left, top, left + side - 1, top + side - 1),
                   COLOURS[colours[place]])
    return image, {"colour": colour, "place": asked, "layout": layout, "colours": colours, "prompt": f"{asked}?"}


def digits_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """A 2- or 3-digit number (its length the index's parity, no leading zero) in the 3 x 5 bitmap font, each font
    pixel a ``size // 16`` square (2 x 2 at 32 pixels: a 3-digit number is 22 x 10 pixels), of one random colour, at
    a random place."""
    rng = np.random.default_rng([index, 41])
    n = 2 + index % 2
    text = str(int(rng.integers(1, 10))) + "".join(str(int(d)) for d in rng.integers(0, 10, size=n - 1))
    scale = max(1, size // 16)
    width, height = digits_width(n, scale), GLYPH_H * scale
    left, top = int(rng.integers(1, size - width)), int(rng.integers(1, size - height))
    colour = _colour(rng)
    image, draw = canvas(size)
    draw_digits(draw, text, left, top, scale, COLOURS[colour])
    return image, {"digits": text, "colour": colour, "scale": scale, "origin": (left, top)}


def bars_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """Two vertical bars of one random colour standing on a common baseline, one in each half, their heights
    ``size // 8`` to ``size - 2 * margin`` pixels and at least ``size // 8`` apart; the answer is the side of the
    taller one (the index's parity)."""
    rng = np.random.default_rng([index, 43])
    taller = ("left", "right")[index % 2]
    margin, gap, width = max(1, size // 16), max(2, size // 8), max(2, size // 5)
    highest = size - 2 * margin
    short = int(rng.integers(gap, highest - gap + 1))
    tall = int(rng.integers(short + gap, highest + 1))
    heights = {"left": tall, "right": short} if taller == "left" else {"left": short, "right": tall}
    half, base = size // 2, size - margin - 1
    lefts = {"left": int(rng.integers(margin, half - width - margin + 1)),
             "right": int(rng.integers(half + margin, size - width - margin + 1))}
    colour = _colour(rng)
    image, draw = canvas(size)
    for side in ("left", "right"):
        draw.rectangle((lefts[side], base - heights[side] + 1, lefts[side] + width - 1, base), fill=COLOURS[colour])
    return image, {"bars": taller, "heights": heights, "colour": colour}


def geometry_scene(index: int, size: int) -> tuple[Any, dict[str, Any]]:
    """A regular polygon of 3 to 6 sides (the index's), of one random colour, inscribed in a circle of radius
    0.28 to 0.45 of the picture (9 to 14 pixels at 32) about a random centre, turned by a random angle; the answer
    is its number of sides."""
    rng = np.random.default_rng([index, 47])
    sides = SIDES[index % len(SIDES)]
    radius = float(rng.uniform(0.28, 0.45)) * size
    cx, cy = (float(v) for v in rng.uniform(radius + 1, size - radius - 1, size=2))
    turn = float(rng.uniform(0, 2 * np.pi))
    colour = _colour(rng)
    image, draw = canvas(size)
    draw.polygon(polygon_corners(sides, (cx, cy), radius, turn), fill=COLOURS[colour])
    return image, {"sides": sides, "radius": radius, "centre": (cx, cy), "colour": colour}
