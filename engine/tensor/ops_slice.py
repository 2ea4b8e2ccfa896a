"""Slicing: `slice`, `t[...]`, `slice_assign`, `slice_fill`, `narrow`, `chunk`, `split`,
each beside its backward rule. Burn's ranges are strict: a bound that does not fit raises
`TensorIndexError` instead of being clamped."""
from __future__ import annotations

import numbers

import numpy as np

from .indices import TensorIndexError, _check_int, _desc, _dims, _is_int, _need
from .tensor import Tensor, TensorError, check_same_device, dim_index, record, tensor_method, unbroadcast


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
