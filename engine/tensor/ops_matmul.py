"""Matrix multiplication with batch broadcasting.

Both operands must have the same dtype: float32 @ float64 or int64 @ float32 raise
`DTypeError` instead of promoting (as PyTorch's matmul refuses them), so a float32 model never
silently computes in float64. Convert one operand with `.cast(...)`.
"""
from __future__ import annotations

from ..autodiff.tape import Node, is_recording
from .cpu import matmul as _product
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

    def rule(g):
        ga = unbroadcast(_product(g, b.swapaxes(-1, -2)), a.shape) if need_a else None
        gb = unbroadcast(_product(a.swapaxes(-1, -2), g), b.shape) if need_b else None
        return ga, gb

    return Tensor._wrap(out, self._device, True, Node((self._node, other._node), rule, "matmul"))


Tensor.__matmul__ = matmul
