"""Reading and writing entries at index tensors: `gather`, `scatter_add`, `select`,
`select_assign` and `one_hot`, each beside its backward rule (the scatter-add kernels of
`indices.py`)."""
from __future__ import annotations

from . import dtype as _dt
from .indices import (TensorIndexError, _check_bounds, _check_int, _desc, _dims, _index_add_axis, _index_array,
                      _need, _scatter_add_along)
from .tensor import Tensor, TensorError, check_same_device, dim_index, record, tensor_method


def _along_checks(op: str, self: Tensor, dim, indices, values_shape=None):
    """Common checks for gather / scatter_add: returns (axis, index array, sub-region key)."""
    x = self._data
    d = dim_index(op, dim, x.ndim)
    idx = _index_array(op, self, indices)
    if idx.ndim != x.ndim:
        raise TensorError(
            f"{op}: expected indices of rank {x.ndim} (as the tensor, dims {_dims(x.shape)}), found indices dims {_dims(idx.shape)}"
        )
    for a, (n, s) in enumerate(zip(idx.shape, x.shape)):
        if a != d and n > s:
            raise TensorError(
                f"{op}: expected indices no larger than the tensor outside dim {d}: axis {a} has {n} > {s} "
                f"(indices dims {_dims(idx.shape)}, tensor dims {_dims(x.shape)})"
            )
    _check_bounds(op, d, idx, x.shape[d])
    sub = tuple(slice(None) if a == d else slice(0, n) for a, n in enumerate(idx.shape))
    return d, idx, sub


@tensor_method
def gather(self, dim, indices) -> Tensor:
    """`out[..., i, ...] = self[..., indices[..., i, ...], ...]` along `dim` (indices of self's rank)."""
    op = "gather"
    d, idx, sub = _along_checks(op, self, dim, indices)
    x = self._data
    xp = self._device.xp
    xs = x[sub]
    out = xp.take_along_axis(xs, idx, axis=d)
    shape, sub_shape = x.shape, xs.shape

    def rule(g):
        gs = xp.zeros(sub_shape, dtype=g.dtype)
        _scatter_add_along(xp, gs, d, idx, g)
        if sub_shape == shape:
            return (gs,)
        gx = xp.zeros(shape, dtype=g.dtype)
        gx[sub] = gs
        return (gx,)

    return record(out, self._device, (self,), rule, op)


@tensor_method
def scatter_add(self, dim, indices, values) -> Tensor:
    """A new tensor: self plus each `values[p]` added at `indices[p]` along `dim` (Burn's `scatter`).

    `indices` and `values` share dims, of self's rank; repeated indices accumulate.
    """
    op = "scatter_add"
    if not isinstance(values, Tensor):
        raise TypeError(f"{op}: expected a Tensor for values, found {type(values).__name__}")
    check_same_device(op, self, values)
    if values.dtype != self.dtype:
        raise TensorError(f"{op}: expected values of dtype {self.dtype}, found {_desc(values)}")
    d, idx, sub = _along_checks(op, self, dim, indices)
    v = values._data
    if v.shape != idx.shape:
        raise TensorError(f"{op}: expected values with the indices' dims {_dims(idx.shape)}, found {_desc(values)}")
    x = self._data
    xp = self._device.xp
    out = x.copy()  # C-contiguous
    if _covers(sub, x.shape):
        _scatter_add_along(xp, out, d, idx, v)
    else:
        part = xp.ascontiguousarray(out[sub])
        _scatter_add_along(xp, part, d, idx, v)
        out[sub] = part
    need_v = _need(values)

    def rule(g):
        gv = xp.take_along_axis(g[sub], idx, axis=d) if need_v else None
        return g, gv

    return record(out, self._device, (self, values), rule, op)


def _covers(sub, shape) -> bool:
    return all(s.stop is None or s.stop == n for s, n in zip(sub, shape))


Tensor.scatter = scatter_add


@tensor_method
def select(self, dim, indices) -> Tensor:
    """The entries at `indices` (a 1-D int tensor or list) along `dim`; repeats allowed."""
    op = "select"
    x = self._data
    d = dim_index(op, dim, x.ndim)
    idx = _index_array(op, self, indices)
    if idx.ndim != 1:
        raise TensorError(f"{op}: expected 1-D indices, found indices dims {_dims(idx.shape)}")
    _check_bounds(op, d, idx, x.shape[d])
    xp = self._device.xp
    out = xp.take(x, idx, axis=d)
    shape = x.shape

    def rule(g):
        return (_index_add_axis(xp, shape, d, idx, g),)

    return record(out, self._device, (self,), rule, op)


Tensor.index_select = select


@tensor_method
def select_assign(self, dim, indices, values) -> Tensor:
    """A new tensor: self with `values` added at `indices` along `dim` (Burn's `select_assign`).

    `values` has self's dims with `dim` resized to `len(indices)`; repeated indices accumulate.
    """
    op = "select_assign"
    if not isinstance(values, Tensor):
        raise TypeError(f"{op}: expected a Tensor for values, found {type(values).__name__}")
    check_same_device(op, self, values)
    if values.dtype != self.dtype:
        raise TensorError(f"{op}: expected values of dtype {self.dtype}, found {_desc(values)}")
    x = self._data
    d = dim_index(op, dim, x.ndim)
    idx = _index_array(op, self, indices)
    if idx.ndim != 1:
        raise TensorError(f"{op}: expected 1-D indices, found indices dims {_dims(idx.shape)}")
    expected = x.shape[:d] + (idx.shape[0],) + x.shape[d + 1 :]
    if values._data.shape != expected:
        raise TensorError(f"{op}: expected values with dims {_dims(expected)}, found {_desc(values)}")
    _check_bounds(op, d, idx, x.shape[d])
    xp = self._device.xp
    out = _index_add_axis(xp, x.shape, d, idx, values._data, base=x)
    need_v = _need(values)

    def rule(g):
        return g, (xp.take(g, idx, axis=d) if need_v else None)

    return record(out, self._device, (self, values), rule, op)


@tensor_method
def one_hot(self, num_classes, dtype=None) -> Tensor:
    """Class indices (an int tensor) to one-hot vectors along a new last dim.

    The result has self's dtype unless `dtype` is given (e.g. "float32" for losses).
    """
    op = "one_hot"
    if self.kind != "int":
        raise TensorError(f"{op}: expected an int tensor of class indices, found {_desc(self)}")
    num_classes = _check_int(op, "num_classes", num_classes)
    if num_classes < 0:
        raise TensorError(f"{op}: expected num_classes >= 0, found {num_classes}")
    x = self._data
    if x.size and (int(x.min()) < 0 or int(x.max()) >= num_classes):
        bad = int(x.min()) if int(x.min()) < 0 else int(x.max())
        raise TensorIndexError(
            f"{op}: class index {bad} is out of range for num_classes {num_classes} "
            f"(expected 0 <= index < {num_classes}; dims {_dims(x.shape)})"
        )
    dt = self.dtype if dtype is None else _dt.as_dtype(dtype)
    xp = self._device.xp
    out = (x[..., None] == xp.arange(num_classes)).astype(dt.np)
    return Tensor._wrap(out, self._device, False)
