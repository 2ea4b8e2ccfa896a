"""Matrix multiplication with batch broadcasting.

Both operands must have the same dtype: float32 @ float64 or int64 @ float32 raise
`DTypeError` instead of promoting (as PyTorch's matmul refuses them), so a float32 model never
silently computes in float64. Convert one operand with `.cast(...)`.
"""
from __future__ import annotations

from ..autodiff.tape import Node, is_recording
from .cpu import matmul as _product
from .recompute import recompute_of
from .tensor import DTypeError, Tensor, TensorError, check_same_device, tensor_method, unbroadcast


@tensor_method
def matmul(self, other):
    """`self @ other` over the last two axes; leading (batch) axes broadcast. Both rank >= 2."""
    if not isinstance(other, Tensor):
        raise TypeError(f"matmul: expected a Tensor, got {type(other).__name__}")
    if self._device is not other._device:
        check_same_device("matmul", self, other)
    a, b = self._data, other._data
    if a.dtype is not b.dtype and a.dtype != b.dtype:
        raise DTypeError(
            f"matmul: expected both operands of one dtype, got {self.dtype} @ {other.dtype} "
            f"(dims {list(a.shape)} @ {list(b.shape)}); convert one of them with .cast(...)"
        )
    if a.ndim < 2 or b.ndim < 2:
        raise TensorError(f"matmul: expected tensors of rank >= 2, got dims {list(a.shape)} and {list(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise TensorError(
            f"matmul: inner dimensions differ: dims {list(a.shape)} @ {list(b.shape)} "
            f"(axis -1 of the left, {a.shape[-1]}, must equal axis -2 of the right, {b.shape[-2]})"
        )
    try:
        out = _product(a, b)
    except ValueError as exc:
        raise TensorError(f"matmul: batch axes cannot be broadcast: dims {list(a.shape)} @ {list(b.shape)} ({exc})") from None
    if (self._node is None and other._node is None) or not is_recording():
        return Tensor._wrap(out, self._device, self._ad or other._ad)
    need_a = self._node is not None
    need_b = other._node is not None
    a_shape, b_shape = a.shape, b.shape
    # each operand is kept only for the other's gradient, or computed again where it was marked
    # so (a GGUF weight's blocks: engine.tensor.recompute)
    again_a = recompute_of(a) if need_b else None
    again_b = recompute_of(b) if need_a else None
    kept_a = a if need_b and again_a is None else None
    kept_b = b if need_a and again_b is None else None

    def rule(g):
        ga = gb = None
        if need_a:
            bb = kept_b if again_b is None else again_b()
            ga = unbroadcast(_product(g, bb.swapaxes(-1, -2)), a_shape)
        if need_b:
            aa = kept_a if again_a is None else again_a()
            gb = unbroadcast(_product(aa.swapaxes(-1, -2), g), b_shape)
        return ga, gb

    return Tensor._wrap(out, self._device, True, Node((self._node, other._node), rule, "matmul"))


Tensor.__matmul__ = matmul
