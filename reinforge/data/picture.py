"""Drawing primitives of the built-in ``shapes`` task (data/shapes.py, data/shapes_scenes.py): its colours, its
grey ground, its three shapes, regular polygons and a 3 x 5 bitmap font of the digits (drawn pixel by pixel, no
font file, so a picture is the same on every machine)."""

from __future__ import annotations

import math
from typing import Any

COLOURS: dict[str, tuple[int, int, int]] = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220),
                                            "yellow": (230, 220, 40)}
SHAPES = ("square", "circle", "triangle")
GROUND = (128, 128, 128)

# Each digit: 5 rows of 3 pixels, top to bottom ("#" ink, "." ground): the common 3 x 5 pixel font.
FONT: dict[str, tuple[str, ...]] = {
    "0": ("###", "#.#", "#.#", "#.#", "###"),
    "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"),
    "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"),
    "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"),
    "7": ("###", "..#", ".#.", ".#.", ".#."),
    "8": ("###", "#.#", "###", "#.#", "###"),
    "9": ("###", "#.#", "###", "..#", "###"),
}
GLYPH_W, GLYPH_H = 3, 5


def canvas(size: int) -> tuple[Any, Any]:
    """A ``size`` x ``size`` picture of the grey ground and its drawing context."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), GROUND)
    return image, ImageDraw.Draw(image)


def draw_shape(draw: Any, shape: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]) -> None:
    """``shape`` filling the pixel box ``(x0, y0, x1, y1)`` (corners included); a triangle points up."""
    x0, y0, x1, y1 = box
    if shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "circle":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)


def polygon_corners(sides: int, centre: tuple[float, float], radius: float, turn: float) -> list[tuple[float, float]]:
    """The corners of the regular ``sides``-gon inscribed in the circle of ``radius`` about ``centre``, the first
    at angle ``turn`` (radians)."""
    cx, cy = centre
    return [(cx + radius * math.cos(turn + 2 * math.pi * k / sides), cy + radius * math.sin(turn + 2 * math.pi * k / sides))
            for k in range(sides)]


def polygon_area_share(sides: int) -> float:
    """Area of a regular ``sides``-gon over that of its circumscribed circle: (n / 2pi) sin(2pi / n)."""
    return sides / (2 * math.pi) * math.sin(2 * math.pi / sides)


def draw_digits(draw: Any, text: str, left: int, top: int, scale: int, fill: tuple[int, int, int]) -> None:
    """``text`` (digits) in the 3 x 5 font, each font pixel a ``scale`` x ``scale`` block, one font pixel (``scale``
    pixels) between digits, the first digit's top-left corner at ``(left, top)``."""
    for i, ch in enumerate(text):
        x0 = left + i * (GLYPH_W + 1) * scale
        for row, line in enumerate(FONT[ch]):
            for col, mark in enumerate(line):
                if mark == "#":
                    x, y = x0 + col * scale, top + row * scale
                    draw.rectangle((x, y, x + scale - 1, y + scale - 1), fill=fill)


def digits_width(n: int, scale: int) -> int:
    """Pixels across ``n`` digits drawn by ``draw_digits``."""
    return (n * (GLYPH_W + 1) - 1) * scale
