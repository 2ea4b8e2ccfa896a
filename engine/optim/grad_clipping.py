"""Gradient clipping, as Burn's `GradientClipping`: by value or by norm, per parameter tensor.

- `GradientClippingConfig.value(t)`: every component is clamped into `[-t, t]`.
- `GradientClippingConfig.norm(m)`: a gradient whose L2 norm exceeds `m` is scaled by
  `m / (norm + tiny)` (tiny: the dtype's smallest positive normal), as Burn does.

Burn clips each parameter's gradient on its own (not the global norm over all parameters);
`clip_grad_norm_global(grads, max_norm)` on `GradientsParams` gives the global variant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GradientClippingConfig:
    kind: str  # "value" or "norm"
    threshold: float

    def __post_init__(self):
        if self.kind not in ("value", "norm"):
            raise ValueError(f"GradientClippingConfig: kind must be 'value' or 'norm', got {self.kind!r}")
        if not self.threshold > 0:
            raise ValueError(f"GradientClippingConfig: threshold must be greater than 0, got {self.threshold}")

    @staticmethod
    def value(threshold: float) -> "GradientClippingConfig":
        return GradientClippingConfig("value", float(threshold))

    @staticmethod
    def norm(max_norm: float) -> "GradientClippingConfig":
        return GradientClippingConfig("norm", float(max_norm))

    def init(self) -> "GradientClipping":
        return GradientClipping(self.kind, self.threshold)


class GradientClipping:
    """Clips one gradient array (NumPy or CuPy); returns a new array, the input is not changed."""

    __slots__ = ("kind", "threshold")

    def __init__(self, kind: str, threshold: float):
        self.kind = kind
        self.threshold = float(threshold)

    @staticmethod
    def value(threshold: float) -> "GradientClipping":
        return GradientClipping("value", threshold)

    @staticmethod
    def norm(max_norm: float) -> "GradientClipping":
        return GradientClipping("norm", max_norm)

    def clip_array(self, grad, xp=np):
        if self.kind == "value":
            return xp.clip(grad, -self.threshold, self.threshold)
        norm = float(xp.sqrt(xp.sum(xp.square(grad, dtype=np.float64))))
        tiny = float(np.finfo(grad.dtype).tiny) if grad.dtype.kind == "f" else float(np.finfo(np.float32).tiny)
        coef = min(self.threshold / (norm + tiny), 1.0)
        if coef >= 1.0:
            return grad
        return grad * grad.dtype.type(coef)

    def clip_gradient(self, grad):
        """Clip a `Tensor` gradient; returns a Tensor on the same device."""
        from ..tensor.raw import array, wrap

        return wrap(self.clip_array(array(grad), grad.device.xp), grad.device)

    def __repr__(self) -> str:
        return f"GradientClipping.{self.kind}({self.threshold})"
