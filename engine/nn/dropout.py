"""Dropout: zero entries at random while training, scaling the rest by `1 / (1 - prob)`."""
from __future__ import annotations

from dataclasses import dataclass

from ._base import Config, Flag, Layer, f64
from ..shapes.rules import same
from .spec import Burn, declare

__all__ = ["DropoutConfig", "Dropout"]


@dataclass
class DropoutConfig(Config):
    """Configuration of a [`Dropout`] layer."""

    prob: float

    def init(self, device=None) -> "Dropout":
        if not 0.0 <= self.prob <= 1.0:
            raise ValueError(f"Dropout probability should be between 0 and 1, but got {f64(self.prob)}")
        return Dropout(self.prob)


class Dropout(Layer):
    """Sets entries of the input to zero with probability `prob` during training.

    Active only while the module's training flag is on (`valid()` and `freeze()` turn it off)
    and the input is associated with autodiff, as Burn's dropout is only active on an autodiff
    backend. Kept entries are scaled by `1 / (1 - prob)`.
    """

    def __init__(self, prob: float):
        super().__init__()
        self.prob = float(prob)
        self.training = Flag(True)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., any]`
        - output: `[..., any]`
        """
        p = self.rate_for(input)
        return input if p == 0.0 else input.dropout(p)

    def rate_for(self, input) -> float:
        """The probability `forward(input)` drops with: `prob` in training for a tensor that
        takes part in autodiff, else 0 (Burn's rule). Fused kernels that drop inside (the
        attention's scores) ask it instead of deciding again."""
        if not self.training or self.prob == 0.0 or not input.is_autodiff():
            return 0.0
        return self.prob

    def custom_content(self, content):
        return content.add("prob", f64(self.prob)).optional()


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _dropout_shape(m, ins, ctx):
    return same(ins[0])


declare(Dropout, shape=_dropout_shape)
declare(Dropout, burn=Burn("", device=False))
