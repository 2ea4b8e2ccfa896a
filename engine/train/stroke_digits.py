"""Digits 0-9 drawn from a built-in vector stroke font, rasterized with NumPy.

No font file, no imaging library: each glyph is a few polylines (straight strokes and elliptic
arcs) in a unit box. A sample is rendered by transforming the stroke points (slant, size,
aspect, rotation, shift) and giving every pixel of the 28x28 grid an anti-aliased coverage
from its distance to the nearest stroke segment: `clip(width / 2 + 0.5 - distance, 0, 1)`.
The same code runs on any machine, so the data set is identical everywhere for one seed.

"Fonts" are styles of the one skeleton: glyph variants (a serif `1`, an open `4`, a crossed
`7`, a straight-tailed `9`, ...), stroke widths and slants; `FONTS` lists them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _arc(cx, cy, rx, ry, a0, a1, n=None):
    """Points of an elliptic arc from angle a0 to a1 (degrees, 90 = top; y grows downwards)."""
    if n is None:
        n = max(4, int(abs(a1 - a0) / 15))
    a = np.radians(np.linspace(a0, a1, n + 1))
    return np.stack([cx + rx * np.cos(a), cy - ry * np.sin(a)], axis=1)


def _line(*pts):
    return np.asarray(pts, dtype=np.float64)


def _glyph(digit: int, variant: int) -> list[np.ndarray]:
    """Polylines of one digit in the unit box (x right, y down)."""
    v = variant
    if digit == 0:
        return [_arc(0.5, 0.5, 0.32, 0.45, 0, 360, 24)]
    if digit == 1:
        strokes = [_line((0.52, 0.05), (0.52, 0.95))]
        if v % 2 == 0:
            strokes.append(_line((0.28, 0.25), (0.52, 0.05)))
        if v % 3 == 1:
            strokes.append(_line((0.3, 0.95), (0.74, 0.95)))
        return strokes
    if digit == 2:
        top = _arc(0.5, 0.3, 0.3, 0.25, 160, -30)
        if v % 2 == 0:
            tail = _line(tuple(top[-1]), (0.18, 0.95), (0.84, 0.95))
        else:  # curled bottom
            tail = np.concatenate([_line(tuple(top[-1])), _arc(0.62, 0.78, 0.44, 0.17, 150, 200, 4)[1:],
                                   _line((0.22, 0.95), (0.84, 0.93))])
        return [top, tail]
    if digit == 3:
        if v % 2 == 0:
            return [_arc(0.5, 0.28, 0.28, 0.23, 150, -90), _arc(0.5, 0.72, 0.32, 0.23, 90, -150)]
        # flat-topped 3
        return [_line((0.2, 0.05), (0.78, 0.05), (0.45, 0.45)), _arc(0.5, 0.7, 0.32, 0.25, 110, -150)]
    if digit == 4:
        if v % 2 == 0:
            return [_line((0.66, 0.95), (0.66, 0.05), (0.14, 0.66), (0.86, 0.66))]
        return [_line((0.22, 0.05), (0.16, 0.6), (0.86, 0.6)), _line((0.66, 0.28), (0.66, 0.95))]
    if digit == 5:
        return [_line((0.8, 0.05), (0.3, 0.05), (0.25, 0.45)), _arc(0.5, 0.68, 0.31, 0.27, 130, -150)]
    if digit == 6:
        return [_arc(0.58, 0.55, 0.36, 0.48, 75, 200), _arc(0.5, 0.72, 0.28, 0.23, 180, 540, 24)]
    if digit == 7:
        strokes = [_line((0.15, 0.05), (0.85, 0.05), (0.4, 0.95))]
        if v % 2 == 1:
            strokes.append(_line((0.38, 0.5), (0.78, 0.5)))
        return strokes
    if digit == 8:
        return [_arc(0.5, 0.27, 0.25, 0.22, -90, 270, 20), _arc(0.5, 0.72, 0.31, 0.24, 90, 450, 20)]
    if digit == 9:
        loop = _arc(0.5, 0.3, 0.28, 0.25, 0, 360, 24)
        if v % 2 == 0:
            return [loop, _line((0.78, 0.3), (0.72, 0.95))]
        return [loop, _arc(0.38, 0.3, 0.4, 0.65, 0, -80)]
    raise ValueError(f"digit must be 0-9, got {digit}")


def _segments(polylines: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    a = np.concatenate([p[:-1] for p in polylines])
    b = np.concatenate([p[1:] for p in polylines])
    return a, b


@dataclass(frozen=True)
class Font:
    """A style: glyph variant, stroke width (pixels), slant (x shift per unit of height), aspect."""

    name: str
    variant: int
    width: float
    slant: float
    aspect: float = 0.75


FONTS = (
    Font("plain", 0, 2.2, 0.0),
    Font("plain-bold", 1, 3.2, 0.0),
    Font("italic", 0, 2.0, 0.22),
    Font("italic-bold", 1, 2.8, 0.18),
    Font("thin", 2, 1.5, 0.05, 0.7),
    Font("wide", 3, 2.5, -0.08, 0.9),
    Font("narrow", 1, 2.0, 0.1, 0.6),
    Font("back-slant", 2, 2.4, -0.18),
)

_SIZE = 28
_GRID = None


def _pixel_centres() -> np.ndarray:
    global _GRID
    if _GRID is None:
        ys, xs = np.mgrid[0:_SIZE, 0:_SIZE].astype(np.float64) + 0.5
        _GRID = np.stack([xs.ravel(), ys.ravel()], axis=1)
    return _GRID


def render_digit(digit: int, font: Font, rotation_deg: float = 0.0, shift=(0.0, 0.0), scale: float = 1.0,
                 width_jitter: float = 0.0) -> np.ndarray:
    """One 28x28 image (float32, 0..1 coverage) of `digit` in `font`, transformed as given."""
    a, b = _segments(_glyph(digit, font.variant))
    height = 20.0 * scale  # as MNIST: the digit fits a 20-pixel box centred in 28x28

    def place(p):
        x = (p[:, 0] - 0.5) * font.aspect
        y = p[:, 1] - 0.5
        x = x - font.slant * y
        x, y = x * height, y * height
        t = math.radians(rotation_deg)
        c, s = math.cos(t), math.sin(t)
        return np.stack([c * x - s * y + 14.0 + shift[0], s * x + c * y + 14.0 + shift[1]], axis=1)

    a, b = place(a), place(b)
    p = _pixel_centres()[:, None, :]  # [pixels, 1, 2]
    d = b - a  # [segments, 2]
    len2 = np.maximum((d * d).sum(axis=1), 1e-12)
    t = np.clip(((p - a) * d).sum(axis=2) / len2, 0.0, 1.0)  # [pixels, segments]
    nearest = a + t[..., None] * d
    dist = np.sqrt(((p - nearest) ** 2).sum(axis=2)).min(axis=1)
    w = max(font.width + width_jitter, 0.8)
    img = np.clip(w / 2.0 + 0.5 - dist, 0.0, 1.0)
    return img.reshape(_SIZE, _SIZE).astype(np.float32)


def render_digits(n: int, seed: int = 0, max_shift: float = 2.0, max_rotation: float = 12.0,
                  fonts=FONTS) -> tuple[np.ndarray, np.ndarray]:
    """`n` images (uint8 [n, 28, 28], 0..255) with balanced labels (int64 [n]), seeded."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.int64) % 10
    rng.shuffle(labels)
    images = np.empty((n, _SIZE, _SIZE), dtype=np.uint8)
    for i, digit in enumerate(labels):
        font = fonts[int(rng.integers(len(fonts)))]
        img = render_digit(
            int(digit), font,
            rotation_deg=float(rng.uniform(-max_rotation, max_rotation)),
            shift=(float(rng.uniform(-max_shift, max_shift)), float(rng.uniform(-max_shift, max_shift))),
            scale=float(rng.uniform(0.85, 1.1)),
            width_jitter=float(rng.uniform(-0.4, 0.4)),
        )
        images[i] = np.round(img * 255.0).astype(np.uint8)
    return images, labels
