"""Indexing operations: slicing, joining, splitting, gather/scatter, select, padding, flips,
triangles and dropout masks, each beside its backward rule.

Index arrays are checked here before use: CuPy wraps an out-of-range index silently, so an
index that does not fit raises `TensorIndexError` naming the operation, the dim, the index
and the size. Scatter-style additions (the backward of gather and select, scatter_add,
select_assign) sort the indices and sum runs with `np.add.reduceat`, which is faster than
`np.add.at` (see engine-notes.md); on CuPy they use `cupyx.scatter_add`.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import dtype as _dt
from .device import as_device
from .tensor import Tensor, TensorError, check_same_device, dim_index, record, tensor_method, unbroadcast

__all__ = ["TensorIndexError", "cat", "stack"]


class TensorIndexError(TensorError, IndexError):
    """An index does not fit the tensor (also an IndexError, so that iteration stops)."""


# ====================================================================== helpers
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


# ====================================================================== slicing
def _axis_bounds(op: str, d: int, size: int, spec):
    """Normalise one Burn-style range (strict: every bound must fit) to a slice."""
    if spec is None:
        return slice(None)
    if _is_int(spec):
        i = int(spec)
        if not -size <= i < size:
            raise TensorIndexError(f"{op}: index {i} is out of range for dim {d} of size {size} (expected {-size} <= index < {size})")
        i %= size
        return slice(i, i + 1)
    if isinstance(spec, (slice, range)):
        start, end, step = spec.start, spec.stop, spec.step
    elif isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
        start, end = spec[0], spec[1]
        step = spec[2] if len(spec) == 3 else None
    else:
        raise TypeError(
            f"{op}: expected for dim {d} a (start, end) pair, (start, end, step), a slice, a range, an int "
            f"or None, found {spec!r}"
        )
    step = 1 if step is None else _check_int(op, "a step", step)
    if step < 1:
        raise TensorError(f"{op}: expected a positive step for dim {d}, found {step} (use flip() to reverse)")
    lo = 0 if start is None else _check_int(op, "a range start", start)
    hi = size if end is None else _check_int(op, "a range end", end)
    for name, v in (("start", lo), ("end", hi)):
        if not -size <= v <= size:
            raise TensorIndexError(
                f"{op}: range {name} {v} is out of range for dim {d} of size {size} (expected {-size} <= {name} <= {size})"
            )
    lo, hi = (lo + size if lo < 0 else lo), (hi + size if hi < 0 else hi)
    if lo > hi:
        raise TensorError(f"{op}: expected start <= end for dim {d}, found range {lo}..{hi} (size {size})")
    return slice(lo, hi, step)


def _ranges_key(op: str, shape, ranges) -> tuple:
    if isinstance(ranges, (slice, range)) or _is_int(ranges) or ranges is None:
        ranges = [ranges]
    try:
        ranges = list(ranges)
    except TypeError:
        raise TypeError(f"{op}: expected a list of ranges, one per leading dim, found {ranges!r}") from None
    if len(ranges) > len(shape):
        raise TensorError(f"{op}: expected at most {len(shape)} ranges (one per dim), found {len(ranges)} for dims {_dims(shape)}")
    return tuple(_axis_bounds(op, d, shape[d], r) for d, r in enumerate(ranges))


def _ranges_text(key) -> str:
    def one(k):
        lo = "" if k.start is None else k.start
        hi = "" if k.stop is None else k.stop
        return f"{lo}..{hi}" + (f";{k.step}" if k.step not in (None, 1) else "")

    return "[" + ", ".join(one(k) for k in key) + "]"


def _getitem_key(shape, key) -> tuple:
    """Check a NumPy basic-indexing key (ints, slices, None, Ellipsis) against `shape`."""
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise TensorIndexError(f"index: expected at most one Ellipsis (...), found {n_ell} in {key!r}")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    rank = len(shape)
    if consumed > rank:
        raise TensorIndexError(f"index: too many indices for a tensor of rank {rank} (dims {_dims(shape)}): {key!r}")
    out = []
    axis = 0
    for k in key:
        if k is None:
            out.append(None)
        elif k is Ellipsis:
            out.append(Ellipsis)
            axis += rank - consumed
        elif isinstance(k, slice):
            for part in (k.start, k.stop, k.step):
                if part is not None and not _is_int(part):
                    raise TypeError(f"index: slice bounds must be ints or None, found {k!r}")
            if k.step == 0:
                raise TensorError(f"index: slice step cannot be zero (dim {axis})")
            out.append(k)
            axis += 1
        elif _is_int(k):
            size = shape[axis]
            i = int(k)
            if not -size <= i < size:
                raise TensorIndexError(
                    f"index: index {i} is out of range for dim {axis} of size {size} (expected {-size} <= index < {size})"
                )
            out.append(i % size)
            axis += 1
        else:
            raise TypeError(
                f"index: expected ints, slices, None or Ellipsis, found {type(k).__name__} {k!r}; "
                "use select()/gather() for index tensors and mask_where()/mask_fill() for masks"
            )
    return tuple(out)


def _basic_index(self: Tensor, key: tuple, op: str) -> Tensor:
    x = self._data
    out = x[key]
    shape = x.shape
    xp = self._device.xp

    def rule(g):
        gx = xp.zeros(shape, dtype=g.dtype)
        gx[key] = g
        return (gx,)

    return record(out, self._device, (self,), rule, op)


@tensor_method(name="slice")
def slice_(self, ranges) -> Tensor:
    """Burn's `slice`: one range per leading dim, the rank stays the same.

    Each range is `(start, end)`, `(start, end, step)`, a `range`, a `slice`, an int `i`
    (the range i..i+1) or None (the whole dim); negative bounds count from the end. Unlike
    Python slicing, bounds are not clamped: a range that does not fit raises.
    """
    return _basic_index(self, _ranges_key("slice", self._data.shape, ranges), "slice")


def _getitem(self, key) -> Tensor:
    """NumPy basic indexing: ints (drop the dim), slices with steps, None (new dim), Ellipsis."""
    return _basic_index(self, _getitem_key(self._data.shape, key), "index")


Tensor.__getitem__ = _getitem


@tensor_method
def slice_assign(self, ranges, values) -> Tensor:
    """A new tensor: self with the region `ranges` (as in `slice`) replaced by `values`.

    `values` is a tensor broadcastable to the region's dims (same dtype and device), or a number.
    Gradients go to self outside the region and to values inside it.
    """
    op = "slice_assign"
    x = self._data
    key = _ranges_key(op, x.shape, ranges)
    region = x[key].shape
    xp = self._device.xp
    if isinstance(values, Tensor):
        check_same_device(op, self, values)
        if values.dtype != self.dtype:
            raise TensorError(f"{op}: expected values of dtype {self.dtype}, found {_desc(values)}")
        v = values._data
        try:
            fits = np.broadcast_shapes(v.shape, region) == tuple(region)
        except ValueError:
            fits = False
        if not fits:
            raise TensorError(
                f"{op}: expected values with dims {_dims(region)} (or broadcastable to them) for the region "
                f"{_ranges_text(key)}, found {_desc(values)}"
            )
        inputs = (self, values)
    elif isinstance(values, (numbers.Number, np.generic)):
        v = values
        inputs = (self,)
    else:
        raise TypeError(f"{op}: expected a Tensor or a number for values, found {type(values).__name__}")
    out = x.copy()
    out[key] = v
    vshape = v.shape if isinstance(values, Tensor) else None
    need_x = _need(self)
    need_v = isinstance(values, Tensor) and _need(values)

    def rule(g):
        gx = None
        if need_x:
            gx = g.copy()
            gx[key] = 0
        if len(inputs) == 1:
            return (gx,)
        gv = unbroadcast(g[key], vshape) if need_v else None
        return gx, gv

    return record(out, self._device, inputs, rule, op)


@tensor_method
def slice_fill(self, ranges, value) -> Tensor:
    """A new tensor: self with the region `ranges` set to the number `value`."""
    return self.slice_assign(ranges, value)


@tensor_method
def narrow(self, dim, start, length) -> Tensor:
    """The `length` entries of `dim` from `start` (negative start counts from the end)."""
    op = "narrow"
    x = self._data
    d = dim_index(op, dim, x.ndim)
    size = x.shape[d]
    start = _check_int(op, "start", start)
    length = _check_int(op, "length", length)
    if not -size <= start <= size:
        raise TensorIndexError(f"{op}: start {start} is out of range for dim {d} of size {size}")
    if start < 0:
        start += size
    if length < 0 or start + length > size:
        raise TensorIndexError(
            f"{op}: expected 0 <= length <= {size - start} (start {start}, dim {d} of size {size}), found length {length}"
        )
    key = (slice(None),) * d + (slice(start, start + length),)
    return _basic_index(self, key, op)


@tensor_method
def chunk(self, chunks, dim=0) -> list[Tensor]:
    """At most `chunks` pieces along `dim`, each ceil(size / chunks) long (the last may be shorter)."""
    op = "chunk"
    chunks = _check_int(op, "chunks", chunks)
    if chunks < 1:
        raise TensorError(f"{op}: expected chunks >= 1, found {chunks}")
    d = dim_index(op, dim, self._data.ndim)
    size = self._data.shape[d]
    if size == 0:
        return [self.narrow(d, 0, 0)]
    step = -(-size // chunks)
    return [self.narrow(d, s, min(step, size - s)) for s in range(0, size, step)]


@tensor_method
def split(self, split_size_or_sizes, dim=0) -> list[Tensor]:
    """Pieces along `dim`: of `split_size` each (the last may be shorter), or of the listed sizes."""
    op = "split"
    d = dim_index(op, dim, self._data.ndim)
    size = self._data.shape[d]
    if _is_int(split_size_or_sizes):
        step = int(split_size_or_sizes)
        if step < 1:
            raise TensorError(f"{op}: expected a split size >= 1, found {step}")
        if size == 0:
            return [self.narrow(d, 0, 0)]
        return [self.narrow(d, s, min(step, size - s)) for s in range(0, size, step)]
    sizes = [_check_int(op, "a split size", s) for s in split_size_or_sizes]
    if any(s < 0 for s in sizes) or sum(sizes) != size:
        raise TensorError(f"{op}: expected non-negative sizes summing to {size} (dim {d} of dims {_dims(self.shape)}), found {sizes}")
    out, s0 = [], 0
    for s in sizes:
        out.append(self.narrow(d, s0, s))
        s0 += s
    return out


@tensor_method
def split_with_sizes(self, sizes, dim=0) -> list[Tensor]:
    return self.split(list(sizes), dim)


# ====================================================================== joining
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


# ====================================================================== gather / scatter
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


# ====================================================================== repeat / pad / flip
@tensor_method
def repeat(self, sizes) -> Tensor:
    """Tile the tensor: `sizes[i]` copies along dim i (Burn's `repeat`; missing trailing sizes are 1)."""
    op = "repeat"
    if _is_int(sizes):
        sizes = [sizes]
    reps = [_check_int(op, "a repeat count", s) for s in sizes]
    x = self._data
    if len(reps) > x.ndim:
        raise TensorError(f"{op}: expected at most {x.ndim} repeat counts (one per dim of dims {_dims(x.shape)}), found {reps}")
    if any(r < 0 for r in reps):
        raise TensorError(f"{op}: expected non-negative repeat counts, found {reps}")
    reps = reps + [1] * (x.ndim - len(reps))
    xp = self._device.xp
    out = xp.tile(x, reps) if x.ndim else x.copy()
    shape = x.shape

    def rule(g):
        inter = []
        for r, s in zip(reps, shape):
            inter += [r, s]
        return (g.reshape(inter).sum(axis=tuple(range(0, 2 * len(shape), 2))),)

    return record(out, self._device, (self,), rule, op)


@tensor_method
def repeat_dim(self, dim, times) -> Tensor:
    """`times` copies of the tensor along `dim`."""
    d = dim_index("repeat_dim", dim, self._data.ndim)
    reps = [1] * self._data.ndim
    reps[d] = _check_int("repeat_dim", "times", times)
    return self.repeat(reps)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "replicate", "edge": "replicate"}


@tensor_method
def pad(self, pads, mode="constant", value=0.0) -> Tensor:
    """Pad the last dims. `pads` is PyTorch's (left, right, top, bottom, front, back, ...): pairs
    for the last dim, then the one before it, and so on.

    `mode`: "constant" (fill with `value`), "reflect" (mirror without repeating the edge;
    each pad must be smaller than its dim) or "replicate" (repeat the edge; Burn's "edge").
    Passing a number as `mode` pads with that constant (Burn's `pad(pads, value)`).
    """
    op = "pad"
    if isinstance(mode, (numbers.Number, np.generic)) and not isinstance(mode, str):
        mode, value = "constant", mode
    if mode not in _PAD_MODES:
        raise TensorError(f"{op}: expected mode 'constant', 'reflect' or 'replicate', found {mode!r}")
    mode = _PAD_MODES[mode]
    pads = [_check_int(op, "a pad", p) for p in pads]
    x = self._data
    if len(pads) % 2 or len(pads) > 2 * x.ndim:
        raise TensorError(
            f"{op}: expected an even number of pads, at most {2 * x.ndim} for dims {_dims(x.shape)}, found {pads}"
        )
    if any(p < 0 for p in pads):
        raise TensorError(f"{op}: expected non-negative pads, found {pads}")
    widths = {}
    for i in range(len(pads) // 2):
        a = x.ndim - 1 - i
        widths[a] = (pads[2 * i], pads[2 * i + 1])
    for a, (l, r) in widths.items():
        n = x.shape[a]
        if mode == "reflect" and (l >= n or r >= n) and (l or r):
            raise TensorError(f"{op}: reflect padding ({l}, {r}) of dim {a} needs pads smaller than its size {n} (dims {_dims(x.shape)})")
        if mode == "replicate" and n == 0 and (l or r):
            raise TensorError(f"{op}: replicate padding of dim {a} needs a non-empty dim (dims {_dims(x.shape)})")
    xp = self._device.xp
    shape = x.shape
    if mode == "constant":
        new = tuple(s + sum(widths.get(a, (0, 0))) for a, s in enumerate(shape))
        out = xp.full(new, value, dtype=x.dtype)
        inner = tuple(slice(widths[a][0], widths[a][0] + s) if a in widths else slice(None) for a, s in enumerate(shape))
        out[inner] = x

        def rule(g):
            return (g[inner],)

        return record(out, self._device, (self,), rule, op)

    maps = []
    out = x
    for a in sorted(widths):
        l, r = widths[a]
        if not (l or r):
            continue
        n = shape[a]
        j = xp.arange(-l, n + r)
        if mode == "replicate":
            j = xp.clip(j, 0, n - 1)
        else:
            j = xp.abs(j)
            j = xp.where(j > n - 1, 2 * (n - 1) - j, j)
        maps.append((a, j))
        out = xp.take(out, j, axis=a)
    if out is x:
        out = x.copy()

    def rule_map(g):
        cur = list(g.shape)
        for a, j in reversed(maps):
            cur[a] = shape[a]
            g = _index_add_axis(xp, tuple(cur), a, j, g)
        return (g,)

    return record(out, self._device, (self,), rule_map, op)


@tensor_method
def flip(self, dims) -> Tensor:
    """Reverse the order of entries along each of `dims`."""
    op = "flip"
    if _is_int(dims):
        dims = [dims]
    x = self._data
    axes = tuple(dim_index(op, _check_int(op, "a dim", a), x.ndim) for a in dims)
    if len(set(axes)) != len(axes):
        raise TensorError(f"{op}: expected distinct dims, found {list(dims)} for rank {x.ndim}")
    xp = self._device.xp
    out = xp.flip(x, axis=axes) if axes else x

    def rule(g):
        return (xp.flip(g, axis=axes) if axes else g,)

    return record(out, self._device, (self,), rule, op)


# ====================================================================== triangles
def _tri_keep(xp, rows, cols, diagonal, lower):
    r = xp.arange(rows).reshape(-1, 1)
    c = xp.arange(cols).reshape(1, -1)
    return (c - r <= diagonal) if lower else (c - r >= diagonal)


def _tri(self: Tensor, diagonal, lower: bool, op: str) -> Tensor:
    x = self._data
    if x.ndim < 2:
        raise TensorError(f"{op}: expected a tensor of rank >= 2, found {_desc(self)}")
    diagonal = _check_int(op, "diagonal", diagonal)
    xp = self._device.xp
    keep = _tri_keep(xp, x.shape[-2], x.shape[-1], diagonal, lower)
    out = xp.where(keep, x, xp.zeros((), dtype=x.dtype))

    def rule(g):
        return (xp.where(keep, g, xp.zeros((), dtype=g.dtype)),)

    return record(out, self._device, (self,), rule, op)


@tensor_method
def tril(self, diagonal=0) -> Tensor:
    """Keep the lower triangle of the last two dims (entries with col - row <= diagonal), zero the rest."""
    return _tri(self, diagonal, True, "tril")


@tensor_method
def triu(self, diagonal=0) -> Tensor:
    """Keep the upper triangle of the last two dims (entries with col - row >= diagonal), zero the rest."""
    return _tri(self, diagonal, False, "triu")


def _tri_mask(shape, offset, device, part: str) -> Tensor:
    from .tensor import _shape  # noqa: PLC0415

    dims = _shape(shape)
    op = f"{part}_mask"
    if len(dims) < 2:
        raise TensorError(f"{op}: expected a shape of rank >= 2, found {list(dims)}")
    offset = _check_int(op, "offset", offset)
    dev = as_device(device)
    xp = dev.xp
    with dev.context():
        r = xp.arange(dims[-2]).reshape(-1, 1)
        c = xp.arange(dims[-1]).reshape(1, -1)
        if part == "tril":
            m = c - r > offset
        elif part == "triu":
            m = c - r < offset
        else:
            m = c - r != offset
        m = xp.ascontiguousarray(xp.broadcast_to(m, dims))
    return Tensor._wrap(m, dev, False)


def tril_mask(shape, offset=0, device=None) -> Tensor:
    """Burn's `tril_mask`: a bool mask, True outside the lower triangle (col - row > offset), for mask_fill."""
    return _tri_mask(shape, offset, device, "tril")


def triu_mask(shape, offset=0, device=None) -> Tensor:
    """Burn's `triu_mask`: True outside the upper triangle (col - row < offset)."""
    return _tri_mask(shape, offset, device, "triu")


def diag_mask(shape, offset=0, device=None) -> Tensor:
    """Burn's `diag_mask`: True off the diagonal (col - row != offset)."""
    return _tri_mask(shape, offset, device, "diag")


Tensor.tril_mask = staticmethod(tril_mask)
Tensor.triu_mask = staticmethod(triu_mask)
Tensor.diag_mask = staticmethod(diag_mask)


# ====================================================================== dropout
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
