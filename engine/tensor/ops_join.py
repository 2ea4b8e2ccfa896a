"""Joining tensors: `cat` along an existing dim and `stack` along a new one, each beside its
backward rule (the gradient is cut back into one piece per input)."""
from __future__ import annotations

from .indices import _desc, _dims, _need
from .tensor import Tensor, TensorError, check_same_device, dim_index, record


def _check_joinable(op: str, tensors) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        raise TypeError(f"{op}: expected a list of tensors, found a single Tensor")
    ts = list(tensors)
    if not ts:
        raise TensorError(f"{op}: expected at least one tensor, found an empty list")
    first = ts[0]
    for i, t in enumerate(ts):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected tensors, found {type(t).__name__} at position {i}")
        if t._device is not first._device:
            check_same_device(op, first, t)
        if t.dtype != first.dtype:
            raise TensorError(f"{op}: expected every tensor of dtype {first.dtype} (as the first), found {_desc(t)} at position {i}")
        if t._data.ndim != first._data.ndim:
            raise TensorError(f"{op}: expected every tensor of rank {first.rank} (as the first), found {_desc(t)} at position {i}")
    return ts


def cat(tensors, dim=0) -> Tensor:
    """Join tensors along an existing `dim`; their other dims must agree."""
    op = "cat"
    ts = _check_joinable(op, tensors)
    first = ts[0]
    if first._data.ndim == 0:
        raise TensorError(f"{op}: cannot concatenate rank-0 tensors; use stack()")
    d = dim_index(op, dim, first._data.ndim)
    ref = first._data.shape
    for i, t in enumerate(ts):
        s = t._data.shape
        if s[:d] != ref[:d] or s[d + 1 :] != ref[d + 1 :]:
            raise TensorError(
                f"{op}: expected dims matching {_dims(ref)} except along dim {d}, found {_desc(t)} at position {i}"
            )
    xp = first._device.xp
    out = xp.concatenate([t._data for t in ts], axis=d)
    bounds = []
    s0 = 0
    for t in ts:
        n = t._data.shape[d]
        bounds.append((s0, s0 + n))
        s0 += n
    need = [_need(t) for t in ts]
    lead = (slice(None),) * d

    def rule(g):
        return tuple(g[lead + (slice(a, b),)] if n else None for (a, b), n in zip(bounds, need))

    return record(out, first._device, ts, rule, op)


def stack(tensors, dim=0) -> Tensor:
    """Join tensors of equal dims along a new `dim`."""
    op = "stack"
    ts = _check_joinable(op, tensors)
    first = ts[0]
    rank = first._data.ndim
    if not -(rank + 1) <= dim <= rank:
        raise TensorError(f"{op}: dim {dim} is out of range for a result of rank {rank + 1}")
    d = dim % (rank + 1)
    for i, t in enumerate(ts):
        if t._data.shape != first._data.shape:
            raise TensorError(f"{op}: expected every tensor with dims {_dims(first.shape)} (as the first), found {_desc(t)} at position {i}")
    xp = first._device.xp
    out = xp.stack([t._data for t in ts], axis=d)
    need = [_need(t) for t in ts]
    lead = (slice(None),) * d

    def rule(g):
        return tuple(g[lead + (i,)] if n else None for i, n in enumerate(need))

    return record(out, first._device, ts, rule, op)


Tensor.cat = staticmethod(cat)
Tensor.stack = staticmethod(stack)
