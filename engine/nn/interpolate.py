"""Interpolate1d / Interpolate2d: resize `[N, C, L]` / `[N, C, H, W]` tensors."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..tensor import ops_interp
from ._base import Config, Debug, Layer, assert_shape, member_of, option, rust_debug
from fractions import Fraction
from ..shapes.dims import Dim, as_dim
from ..shapes.rules import RuleError, Shape, dims_text, expect, float_input, tuple_of
from .spec import declare

__all__ = ["InterpolateMode", "Interpolate1dConfig", "Interpolate1d", "Interpolate2dConfig", "Interpolate2d"]


class InterpolateMode(enum.Enum):
    """Algorithm used to resample: Nearest, NearestExact, Linear, Cubic."""

    Nearest = "nearest"
    NearestExact = "nearest_exact"
    Linear = "linear"
    Cubic = "cubic"

    @staticmethod
    def of(value) -> "InterpolateMode":
        return member_of(InterpolateMode, value, "interpolate mode",
                         lambda m, v: v.replace("-", "_").lower() in (m.value, m.name.lower()))


def _f32_debug(v) -> str:
    return rust_debug(np.float32(v))


def _size_error(owner: str, output_size, scale_factor) -> ValueError:
    return ValueError(
        f"{owner}: Either output_size or scale_factor must be provided (exactly one of them; "
        f"got output_size {option(output_size)} and scale_factor {option(scale_factor)})"
    )


@dataclass
class Interpolate1dConfig(Config):
    """Configuration of an [`Interpolate1d`] layer: exactly one of output_size / scale_factor."""

    output_size: int | None = None
    scale_factor: float | None = None
    mode: InterpolateMode = InterpolateMode.Nearest
    align_corners: bool = True

    def init(self, device=None) -> "Interpolate1d":
        return Interpolate1d(self.output_size, self.scale_factor, InterpolateMode.of(self.mode), self.align_corners)


class Interpolate1d(Layer):
    """Resizes `[batch, channels, length]` inputs to `output_size`, or by `scale_factor`."""

    def __init__(self, output_size, scale_factor, mode, align_corners: bool = True):
        super().__init__()
        self.output_size = None if output_size is None else int(output_size)
        self.scale_factor = None if scale_factor is None else float(np.float32(scale_factor))
        self.mode = InterpolateMode.of(mode)
        self.align_corners = bool(align_corners)

    def forward(self, input):
        """Performs the forward pass of the 1D interpolation module.

        # Shapes

        - input: `[batch_size, channels, length]`
        - output: `[batch_size, channels, length_out]`
        """
        assert_shape(input, [None, None, None])
        if (self.output_size is None) == (self.scale_factor is None):
            raise _size_error("Interpolate1d", self.output_size, self.scale_factor)
        size = self.output_size
        if size is None:
            size = int(input.shape[2] * float(np.float32(self.scale_factor)))
        return ops_interp.interpolate(input, size, self.mode.value, self.align_corners)

    def custom_content(self, content):
        # Burn adds the Option<f32> itself: `None`, or the value as Display writes it
        sf = "None" if self.scale_factor is None else np.float32(self.scale_factor)
        return (
            content.add("mode", self.mode.name)
            .add("output_size", option(self.output_size))
            .add("scale_factor", sf)
            .optional()
        )


@dataclass
class Interpolate2dConfig(Config):
    """Configuration of an [`Interpolate2d`] layer: exactly one of output_size / scale_factor."""

    output_size: tuple | None = None
    scale_factor: tuple | None = None
    mode: InterpolateMode = InterpolateMode.Nearest
    align_corners: bool = True

    def init(self, device=None) -> "Interpolate2d":
        return Interpolate2d(self.output_size, self.scale_factor, InterpolateMode.of(self.mode), self.align_corners)


class Interpolate2d(Layer):
    """Resizes `[batch, channels, height, width]` inputs to `output_size`, or by `scale_factor`."""

    def __init__(self, output_size, scale_factor, mode, align_corners: bool = True):
        super().__init__()
        self.output_size = None if output_size is None else [int(v) for v in output_size]
        self.scale_factor = None if scale_factor is None else [float(np.float32(v)) for v in scale_factor]
        self.mode = InterpolateMode.of(mode)
        self.align_corners = bool(align_corners)

    def forward(self, input):
        """Performs the forward pass of the interpolation module.

        # Shapes

        - input: `[batch_size, channels, height, width]`
        - output: `[batch_size, channels, height_out, width_out]`
        """
        assert_shape(input, [None, None, None, None])
        if (self.output_size is None) == (self.scale_factor is None):
            raise _size_error("Interpolate2d", self.output_size, self.scale_factor)
        size = self.output_size
        if size is None:
            h, w = input.shape[2:]
            size = [int(h * float(np.float32(self.scale_factor[0]))), int(w * float(np.float32(self.scale_factor[1])))]
        return ops_interp.interpolate(input, tuple(size), self.mode.value, self.align_corners)

    def custom_content(self, content):
        if self.scale_factor is None:
            sf = "None"
        else:
            sf = Debug("[" + ", ".join(_f32_debug(v) for v in self.scale_factor) + "]")
        return (
            content.add("mode", self.mode.name)
            .add("output_size", option(self.output_size))
            .add("scale_factor", sf)
            .optional()
        )


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _scaled(size: Dim, scale: float) -> Dim:
    """int(size * float32(scale)), exactly: the float32 scale is a dyadic rational p / 2**q."""
    f = Fraction(float(np.float32(scale)))
    return (size * f.numerator) // f.denominator


def _interpolate(m, ins, ctx, n: int):
    t = ins[0]
    owner = f"Interpolate{n}d"
    expect("assert_shape(input, [None, None, None])" if n == 1 else "assert_shape(input, [None, None, None, None])",
           t, [None] * (n + 2))
    if (m.output_size is None) == (m.scale_factor is None):
        raise RuleError(f"{owner}: Either output_size or scale_factor must be provided (exactly one of them; got "
                        f"output_size {m.output_size} and scale_factor {m.scale_factor})")
    float_input("interpolate", t)
    if m.output_size is not None:
        out = tuple(as_dim(v) for v in tuple_of(m.output_size, n))
    else:
        out = tuple(_scaled(L, s) for L, s in zip(t.dims[2:], _tuple_f(m.scale_factor, n)))
    for o in out:
        ctx.require(o, "min", 1, lambda: f"interpolate: output_size must be >= 1 in every dimension, got "
                                         f"{dims_text(out)}")
    return Shape(t.dims[:2] + out)


def _tuple_f(v, n):
    return tuple(float(x) for x in v) if isinstance(v, (tuple, list)) else (float(v),) * n


def _interpolate1d_shape(m, ins, ctx):
    return _interpolate(m, ins, ctx, 1)


def _interpolate2d_shape(m, ins, ctx):
    return _interpolate(m, ins, ctx, 2)


declare(Interpolate1d, shape=_interpolate1d_shape)
declare(Interpolate2d, shape=_interpolate2d_shape)
