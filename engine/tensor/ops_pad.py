"""Copying entries into a new layout: `repeat`, `repeat_dim`, `pad` (constant, reflect,
replicate) and `flip`, each beside its backward rule."""
from __future__ import annotations

import numbers

import numpy as np

from .indices import _check_int, _dims, _index_add_axis, _is_int
from .tensor import Tensor, TensorError, dim_index, record, tensor_method


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
