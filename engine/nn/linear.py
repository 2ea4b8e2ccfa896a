"""Linear: `O = I W + b` with the weight stored `[d_input, d_output]`, as Burn stores it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import _ops
from ._base import Config, Layer, assert_shape, check_dtype, init_with, initializers, multiplied
from ..shapes.rules import Shape, expect, float_input, with_dim
from .spec import Burn, declare

__all__ = ["LinearConfig", "Linear"]


def _kaiming_default():
    return initializers.KaimingUniform(gain=1.0 / math.sqrt(3.0), fan_out_only=False)


@dataclass
class LinearConfig(Config):
    """Configuration of a [`Linear`] layer (Burn's fields and defaults)."""

    d_input: int
    d_output: int
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "Linear":
        weight = init_with(self.initializer, (self.d_input, self.d_output), self.d_input, self.d_output, device)
        bias = None
        if self.bias:
            bias = init_with(self.initializer, (self.d_output,), self.d_input, self.d_output, device)
        return Linear(weight, bias)


class Linear(Layer):
    """Applies a linear transformation `O = IW + b` to the last dim of the input.

    `weight` is `[d_input, d_output]`, `bias` (optional) `[d_output]`; both start from
    KaimingUniform with gain `1/sqrt(3)`, i.e. `U(-k, k)` with `k = sqrt(1 / d_input)`.
    """

    def __init__(self, weight, bias=None):
        super().__init__()
        self.weight = weight
        self.bias = bias

    @property
    def d_input(self) -> int:
        return self.weight.shape[0]

    @property
    def d_output(self) -> int:
        return self.weight.shape[1]

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., d_input]`
        - output: `[..., d_output]`
        """
        d_input, _ = self.weight.shape
        assert_shape(input, [..., d_input])
        out = multiplied(self.weight, input)
        if out is not None:  # a weight kept quantized multiplies in its blocks
            return out + self.bias.val() if self.bias is not None else out
        weight = self.weight.val()
        check_dtype(self, input, weight)
        bias = self.bias.val() if self.bias is not None else None
        return _ops.linear(input, weight, bias)

    def custom_content(self, content):
        d_input, d_output = self.weight.shape
        return (
            content.add("d_input", d_input)
            .add("d_output", d_output)
            .add("bias", self.bias is not None)
            .optional()
        )


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _linear_shape(m, ins, ctx):
    d_input, d_output = m.weight.shape
    expect("assert_shape(input, [..., d_input])", ins[0], [..., d_input])
    float_input("Linear", ins[0])
    return Shape(with_dim(ins[0].dims, -1, d_output))


declare(Linear, shape=_linear_shape)
declare(Linear, burn=Burn(""))
