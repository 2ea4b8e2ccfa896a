"""Raw access to tensors, for the code that computes on their arrays itself: the fused kernels
of `engine.nn`, the optimizers' updates, the parameters, LoRA and initializers of
`engine.module`, the record stores and the training losses. Everything else uses the public
`Tensor` API; outside `engine/tensor` and `engine/autodiff` nothing reads a tensor's slots.

Tensors are immutable: never write into an array that `array()` returned (clones, modules and
other tensors share it); compute a new array and `wrap` or `record` it.

- `array(t)`: the NumPy/CuPy array behind `t` (no copy).
- `wrap(arr, device, autodiff=False)`: a tensor over `arr` (no copy), in no graph.
- `tracking(*ts)`: whether an op on `ts` records a node (recording is on and one of them takes
  part in a graph). Kernels test it first and skip building a backward rule otherwise.
- `untracked(out, inputs)`: the result `out` of an op on `inputs` that recorded nothing: on the
  first input's device, autodiff when any input is (what `record` gives without a graph).
- `record(out, device, inputs, rule, op)`: the result of an op, with a graph node whose backward
  `rule(grad)` gives one gradient (array or None) per input when an input takes part in a graph.
- `op_of(t)`: the name of the op whose result `t` is in a graph ("leaf" for a gradient leaf),
  or None outside any graph.
- `unbroadcast(g, shape)`: a broadcast gradient summed back to an operand's shape;
  `sum_leading(g, k)`: a sum over the leading k axes (a bias's gradient).
- `check_same_device(op, a, b)`: raise `DeviceError` unless `a` and `b` share a device.
- `recomputable(t, again)`, `recompute_of(arr)`: an array a backward rule computes again instead of
  keeping (engine.tensor.recompute).

Each is one attribute read or one call deep, so that the kernels pay no more than they did
reading the slots themselves.
"""
from __future__ import annotations

from ..autodiff.tape import is_recording
from .device import Device
from .recompute import recompute_of, recomputable
from .tensor import Tensor, check_same_device, record, sum_leading, unbroadcast

__all__ = ["array", "wrap", "tracking", "untracked", "record", "op_of", "unbroadcast", "sum_leading", "check_same_device",
           "recomputable", "recompute_of"]

_wrap = Tensor._wrap


def array(t: Tensor):
    """The NumPy/CuPy array behind `t` (no copy; never write into it)."""
    return t._data


def wrap(arr, device: Device, autodiff: bool = False) -> Tensor:
    """A tensor over `arr` (no copy) on `device`, in no graph; autodiff-associated if asked."""
    return _wrap(arr, device, autodiff)


def tracking(*ts) -> bool:
    """Whether an op on the tensors `ts` (None entries allowed) records a node: recording is on
    and at least one of them takes part in a graph."""
    if not is_recording():
        return False
    for t in ts:
        if t is not None and t._node is not None:
            return True
    return False


def untracked(out, inputs) -> Tensor:
    """The result `out` (an array) of an op on `inputs` that records nothing: on the first
    input's device, autodiff-associated when any input is."""
    first = inputs[0]
    ad = first._ad
    if not ad and len(inputs) > 1:
        ad = any(t._ad for t in inputs)
    return _wrap(out, first._device, ad)


def op_of(t: Tensor) -> str | None:
    """The name of the op whose result `t` is in a graph ("leaf" for a gradient leaf), or None
    when `t` takes part in no graph."""
    n = t._node
    return None if n is None else n.op
