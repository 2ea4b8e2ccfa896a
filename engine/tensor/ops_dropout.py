"""`dropout`: zero entries at random from the device's generator and scale the rest, beside
its backward rule."""
from __future__ import annotations

import numbers

import numpy as np

from .indices import _desc
from .tensor import Tensor, TensorError, record, tensor_method


@tensor_method
def dropout(self, prob) -> Tensor:
    """Zero each entry with probability `prob` and scale the rest by 1 / (1 - prob).

    The mask comes from the tensor's device generator; gradients flow through the kept entries
    with the same scale.
    """
    op = "dropout"
    if not isinstance(prob, (numbers.Real, np.floating)) or not 0.0 <= float(prob) <= 1.0:
        raise TensorError(f"{op}: expected a probability 0 <= prob <= 1, found {prob!r}")
    if self.kind != "float":
        raise TensorError(f"{op}: expected a float tensor, found {_desc(self)}")
    prob = float(prob)
    if prob == 0.0:
        return self
    x = self._data
    dev = self._device
    xp = dev.xp
    with dev.context():
        if prob >= 1.0:
            mult = xp.zeros(x.shape, dtype=x.dtype)
        else:
            u = dev.rng.random(x.shape, dtype=np.float64 if x.dtype == np.float64 else np.float32)
            mult = (u >= prob).astype(x.dtype)
            mult *= 1.0 / (1.0 - prob)
    out = x * mult

    def rule(g):
        return (g * mult,)

    return record(out, dev, (self,), rule, op)
