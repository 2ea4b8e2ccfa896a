"""Index arrays: the checks every indexing op makes, and the scatter-add kernels their
backward rules share.

Index arrays are checked before use: CuPy wraps an out-of-range index silently, so an index
that does not fit raises `TensorIndexError` naming the operation, the dim, the index and the
size. Scatter-style additions (the backward of gather and select, scatter_add, select_assign)
sort the indices and sum runs with `np.add.reduceat`, which is faster than `np.add.at` (see
engine-notes.md); on CuPy they use `cupyx.scatter_add`.
"""
from __future__ import annotations

import numbers

import numpy as np

from .tensor import Tensor, TensorError, check_same_device


class TensorIndexError(TensorError, IndexError):
    """An index does not fit the tensor (also an IndexError, so that iteration stops)."""



def _dims(shape) -> list[int]:
    return [int(s) for s in shape]


def _desc(t: Tensor) -> str:
    return f"dims {_dims(t.shape)} {t.dtype} on {t.device}"


def _is_int(v) -> bool:
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_int(op: str, name: str, v) -> int:
    if not _is_int(v):
        raise TypeError(f"{op}: expected an int for {name}, found {v!r} ({type(v).__name__})")
    return int(v)


def _index_array(op: str, self: Tensor, indices, name: str = "indices"):
    """The array of an int index tensor (a list of ints is accepted too) on self's device."""
    if isinstance(indices, Tensor):
        check_same_device(op, self, indices)
        if indices.kind != "int":
            raise TensorError(f"{op}: expected an int tensor for {name}, found {_desc(indices)}")
        return indices._data
    if isinstance(indices, (list, tuple, range, np.ndarray)) or (hasattr(indices, "get") and hasattr(indices, "dtype")):
        arr = self._device.asarray(indices)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise TensorError(f"{op}: expected integer {name}, found values of dtype {arr.dtype}")
        return arr
    raise TypeError(f"{op}: expected an int Tensor for {name}, found {type(indices).__name__}")


def _check_bounds(op: str, dim: int, idx, size: int) -> None:
    """Raise unless every index lies in [0, size)."""
    if idx.size == 0:
        return
    lo = int(idx.min())
    hi = int(idx.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise TensorIndexError(
            f"{op}: index {bad} is out of range for dim {dim} of size {size} "
            f"(expected 0 <= index < {size}; indices dims {_dims(idx.shape)})"
        )


def _index_add(out, idx, vals) -> None:
    """`out[idx[k]] += vals[k]` along axis 0, in place, accumulating repeated indices."""
    n = idx.size
    if n == 0:
        return
    if isinstance(out, np.ndarray):
        if n == 1:
            out[int(idx[0])] += vals[0]
            return
        order = np.argsort(idx, kind="stable")
        s = idx[order]
        starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
        sums = np.add.reduceat(vals[order], starts, axis=0)
        out[s[starts]] += sums
        return
    import cupyx  # noqa: PLC0415

    cupyx.scatter_add(out, idx, vals.astype(out.dtype, copy=False))


def _index_add_axis(xp, shape, axis: int, idx, vals, base=None):
    """A new array of `shape` (zeros, or a copy of `base`) plus `vals` added at `idx` along `axis`.

    `vals` has `shape` with `axis` resized to `len(idx)`.
    """
    moved = (shape[axis],) + tuple(s for i, s in enumerate(shape) if i != axis)
    if base is None:
        out = xp.zeros(moved, dtype=vals.dtype)
    else:
        out = xp.moveaxis(base, axis, 0).copy()  # a C-contiguous copy: base stays untouched
    _index_add(out, idx, xp.moveaxis(vals, axis, 0))
    return xp.moveaxis(out, 0, axis)


def _scatter_add_along(xp, out, axis: int, idx, vals) -> None:
    """`out[..., idx[p], ...] += vals[p]` along `axis` for every position p of idx (in place).

    `out` is C-contiguous; idx and vals share a shape equal to out's except along `axis`.
    """
    if idx.size == 0:
        return
    shape = out.shape
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    lin = idx.astype(np.int64, copy=False) * strides[axis]
    for d, n in enumerate(idx.shape):
        if d == axis or n == 1:
            continue
        view = [1] * idx.ndim
        view[d] = n
        lin = lin + (xp.arange(n, dtype=np.int64) * strides[d]).reshape(view)
    _index_add(out.reshape(-1), lin.reshape(-1), vals.reshape(-1))


def _need(t: Tensor) -> bool:
    return t._node is not None
