"""Pooling over the spatial axes of `[batch, channels, *spatial]` tensors, with backward rules.

Max and average pooling walk the kernel offsets (one strided slice of the padded input per
offset, no loop over output positions). Max pooling finds each window's max and argmax by
combining the offsets pairwise in scan order; where windows do not overlap (the usual
kernel == stride), its backward is one scatter of the gradient to the argmax positions.
Adaptive average pooling multiplies each spatial
axis by a small averaging matrix. Output sizes, `ceil_mode`, padding rules, the average's
divisor and the max indices follow PyTorch (and Burn, which matches it):

- out = floor((L + 2p - d(k-1) - 1) / s) + 1 (ceil instead of floor with `ceil_mode`, where
  a last window that would start in the right padding is dropped);
- padding may be at most half the kernel;
- max indices index the flattened spatial input of each (batch, channel) plane.
"""
from __future__ import annotations

import functools

import numpy as np

from .ops_conv import _SPATIAL_NAMES, _crop, _int_tuple, _window_slices
from .cpu import run_blocks
from .tensor import Tensor, TensorError, record, tensor_method


# ---------------------------------------------------------------------- shared helpers
def _check_input(op: str, x, n: int, need_float: bool = False):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if x.rank != n + 2:
        raise TensorError(
            f"{op}: expected an input of rank {n + 2} [batch, channels, {_SPATIAL_NAMES[n]}], got dims {list(x.shape)}"
        )
    kind = x._data.dtype.kind
    if kind == "b" or (need_float and kind != "f"):
        raise TensorError(f"{op}: expected a {'float' if need_float else 'numeric'} input, got {x.dtype}")


def _pool_geometry(op, in_sp, kernel, stride, padding, dilation, ceil_mode):
    """Output sizes and the (before, after) padding that covers every window."""
    out, pads = [], []
    for L, k, s, p, d in zip(in_sp, kernel, stride, padding, dilation):
        if p > k // 2:
            raise TensorError(
                f"{op}: padding must be at most half the kernel size, got padding {list(padding)} for kernel {list(kernel)}"
            )
        eff = d * (k - 1) + 1
        num = L + 2 * p - eff
        if num < 0:
            raise TensorError(
                f"{op}: the kernel (size {list(kernel)}, dilation {list(dilation)}) is larger than the padded input "
                f"(spatial dims {list(in_sp)}, padding {list(padding)})"
            )
        o = (-(-num // s) if ceil_mode else num // s) + 1
        if ceil_mode and (o - 1) * s >= L + p:
            o -= 1
        out.append(o)
        pads.append((p, max((o - 1) * s + eff - L - p, 0)))
    return tuple(out), tuple(pads)


def _pad_value(xp, x, pads, value):
    if not any(lo or hi for lo, hi in pads):
        return x
    shape = x.shape[:2] + tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads))
    out = xp.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(x.shape[2:], pads))] = x
    return out


def _apply_axis(xp, a, m, axis):
    """Contract `axis` of `a` with the columns of matrix `m`: new axis size is m.shape[0]."""
    moved = xp.moveaxis(a, axis, -1)
    return xp.moveaxis(xp.matmul(moved, m.T), -1, axis)


def _bool(op, name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise TensorError(f"{op}: {name} must be a bool, got {v!r}")
    return bool(v)


# ---------------------------------------------------------------------- max pooling
def _max_pool(op, n, x, kernel, stride, padding, dilation, ceil_mode, with_indices):
    _check_input(op, x, n)
    kernel = _int_tuple(op, "kernel_size", kernel, n, 1)
    stride = kernel if stride is None else _int_tuple(op, "stride", stride, n, 1)
    padding = _int_tuple(op, "padding", padding, n, 0)
    dilation = _int_tuple(op, "dilation", dilation, n, 1)
    ceil_mode = _bool(op, "ceil_mode", ceil_mode)
    in_sp = x.shape[2:]
    out_sp, pads = _pool_geometry(op, in_sp, kernel, stride, padding, dilation, ceil_mode)

    dev = x._device
    xp = dev.xp
    xa = x._data
    is_float = xa.dtype.kind == "f"
    lowest = -np.inf if is_float else np.iinfo(xa.dtype).min
    need_arg = with_indices or x._node is not None
    windows = list(_window_slices(kernel, stride, dilation, out_sp))
    lead = (slice(None), slice(None))
    with dev.context():
        xpad = _pad_value(xp, xa, pads, lowest)
        if need_arg:
            best, arg = _max_and_argmax(xp, xpad, windows, lowest, is_float, in_sp, out_sp, kernel, stride, padding, dilation)
        else:
            best = xpad[lead + windows[0][1]].copy()
            for _, sl in windows[1:]:
                xp.maximum(best, xpad[lead + sl], out=best)  # NaN propagates, as in PyTorch
    values = best

    if x._node is not None:
        padded_shape = xpad.shape
        non_overlap = all(s >= d * (k - 1) + 1 for s, d, k in zip(stride, dilation, kernel))
        del xpad

        def rule(g):
            with dev.context():
                if non_overlap:
                    # every input position belongs to at most one window: one scatter of the
                    # gradient to the flat positions of the window maxima
                    gpad = xp.zeros(padded_shape, dtype=g.dtype)
                    _scatter_to_argmax(xp, gpad, g, arg, windows, out_sp, stride, dilation)
                else:
                    # overlapping windows: one strided add of the masked gradient per offset
                    gpad = xp.zeros(padded_shape, dtype=g.dtype)
                    for k, (_, sl) in enumerate(windows):
                        gpad[lead + sl] += g * (arg == k)
                return (_crop(gpad, pads, in_sp),)

        out = record(values, dev, (x,), rule, op)
    else:
        out = Tensor._wrap(values, dev, x._ad)
    if with_indices:
        return out, Tensor._wrap(_flat_indices(xp, arg, windows, in_sp, out_sp, stride, padding, dilation), dev)
    return out


# bytes of input per block of images for the max-pool tree (about an L2 cache)
_POOL_BLOCK_BYTES = 1 << 20


def _pairwise_argmax(xp, views, dt):
    """Max and scan-order argmax over `views` (one per kernel offset, in scan order), combined
    pairwise: neighbours, then pairs of neighbours, ...; the right one wins only where strictly
    greater, which keeps the first maximum."""
    level = list(zip(views, range(len(views))))
    if len(level) == 1:
        return level[0][0].copy(), xp.zeros(level[0][0].shape, dtype=dt)
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            (vl, il), (vr, ir) = level[i], level[i + 1]
            right = xp.greater(vr, vl)
            v = xp.maximum(vl, vr)  # NaN propagates, as in PyTorch
            if isinstance(il, int):  # first level: constant offsets
                idx = right.astype(dt)
                if ir - il != 1:
                    idx *= dt(ir - il)
                if il:
                    idx += dt(il)
            else:
                if isinstance(ir, int):
                    ir = xp.full(vl.shape, ir, dtype=dt)
                idx = ir - il  # wraps for unsigned types, but il + right * (ir - il) is exact
                idx *= right
                idx += il
            nxt.append((v, idx))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _max_and_argmax(xp, xpad, windows, lowest, is_float, in_sp, out_sp, kernel, stride, padding, dilation):
    """Each window's max and the index (in scan order) of the kernel offset PyTorch's kernel picks.

    PyTorch scans a window's in-input positions in order and replaces the running max
    (initially -inf at the first position inside the input) when a value is greater or NaN:
    the first maximum wins, NaN beats everything (the last NaN wins), and a window whose
    values are all -inf (the dtype's lowest) points at its first position inside the input.

    The offsets are combined pairwise in scan order (a tree: neighbours, then pairs of
    neighbours, ...), the right one winning only where strictly greater, which keeps the
    first maximum; only the first level reads the strided input windows. NaN and all -inf
    windows are then fixed up.
    """
    n = len(in_sp)
    nk = len(windows)
    dt = np.uint8 if nk < 2**8 else (np.int16 if nk < 2**15 else np.int32)
    lead = (slice(None), slice(None))
    batch = xpad.shape[0]
    per_image = int(np.prod(xpad.shape[1:])) * xpad.itemsize
    step = max(1, _POOL_BLOCK_BYTES // max(per_image, 1)) if xp is np else batch
    if step >= batch:
        best, arg = _pairwise_argmax(xp, [xpad[lead + sl] for _, sl in windows], dt)
    else:
        # a block of images at a time: the tree's passes over a block find it in cache
        # (in parallel on the engine's kernel threads: the blocks write disjoint rows)
        best = xp.empty((batch,) + xpad.shape[1:2] + tuple(out_sp), dtype=xpad.dtype)
        arg = xp.empty(best.shape, dtype=dt)

        def block(lo):
            blk = xpad[lo:lo + step]
            best[lo:lo + step], arg[lo:lo + step] = _pairwise_argmax(xp, [blk[lead + sl] for _, sl in windows], dt)

        run_blocks(block, range(0, batch, step))
    # one reduction rules both fix-ups out in the usual case: the min is NaN if any value is,
    # and above the dtype's lowest if no window is all -inf
    low = best.min() if best.size else lowest
    if is_float and bool(xp.isnan(low)):
        nan = xp.isnan(best)
        for k, (_, sl) in enumerate(windows):
            xp.copyto(arg, k, where=nan & xp.isnan(xpad[lead + sl]))
    missing = (best == lowest) if bool(xp.isnan(low)) or low <= lowest else None
    if missing is not None and bool(missing.any()):
        # the first kernel offset inside the input, per axis, combined in row-major order
        first = None
        for i in range(n):
            starts = np.arange(out_sp[i]) * stride[i] - padding[i]
            j = np.minimum(np.maximum(-(starts // dilation[i]), 0), kernel[i] - 1)  # ceil(-start / d)
            shp = [1] * n
            shp[i] = out_sp[i]
            term = (j * int(np.prod(kernel[i + 1:]))).reshape(shp)
            first = term if first is None else first + term
        arg = xp.where(missing, xp.asarray(first.astype(arg.dtype)), arg)
    return best, arg


def _scatter_to_argmax(xp, gpad, g, arg, windows, out_sp, stride, dilation):
    """gpad (zeros, the whole padded input `[B, C, *S']`) at each window's argmax = g.

    The flat int64 targets are the window origins (cached per geometry) plus the offset of
    the chosen kernel position; on NumPy a block of images at a time, so that the indices
    are consumed while in cache."""
    padded_shape = gpad.shape
    geometry = (tuple(padded_shape), tuple(out_sp), tuple(stride), tuple(dilation), tuple(offs for offs, _ in windows))
    if xp is np:
        deltas, base = _flat_geometry(*geometry)
    else:
        deltas, base = (xp.asarray(a) for a in _flat_geometry.__wrapped__(*geometry))
    flat = gpad.reshape(-1)
    batch = padded_shape[0]
    step = max(1, _POOL_BLOCK_BYTES // max(arg[:1].size * 8, 1)) if xp is np else batch

    def block(lo):  # a block of images scatters only into its own images' rows
        idx = xp.take(deltas, arg[lo:lo + step])
        idx += base[lo:lo + step]
        flat[idx.reshape(-1)] = g[lo:lo + step].reshape(-1)

    run_blocks(block, range(0, batch, step))


@functools.lru_cache(maxsize=8)
def _flat_geometry(padded_shape, out_sp, stride, dilation, offsets):
    """Per kernel offset, its flat distance from a window's origin; per window, the flat index
    of its origin in the whole padded input. Cached (read-only): a training loop pools the
    same shapes every step."""
    n = len(out_sp)
    sp = padded_shape[2:]
    st = [int(np.prod(sp[i + 1:])) for i in range(n)]
    deltas = np.array([sum(o * d * t for o, d, t in zip(offs, dilation, st)) for offs in offsets], dtype=np.int64)
    base = np.arange(padded_shape[0] * padded_shape[1], dtype=np.int64).reshape(padded_shape[:2] + (1,) * n)
    base = base * int(np.prod(sp))
    for i in range(n):
        shp = [1] * (n + 2)
        shp[2 + i] = out_sp[i]
        base = base + (np.arange(out_sp[i], dtype=np.int64) * (stride[i] * st[i])).reshape(shp)
    deltas.flags.writeable = False
    base.flags.writeable = False
    return deltas, base


def _flat_indices(xp, arg, windows, in_sp, out_sp, stride, padding, dilation):
    """PyTorch's int64 indices into each flattened input plane, from the chosen offsets."""
    n = len(in_sp)
    in_strides = [int(np.prod(in_sp[i + 1:])) for i in range(n)]
    deltas = np.array([sum(o * d * st for o, d, st in zip(offs, dilation, in_strides)) for offs, _ in windows], dtype=np.int64)
    base = None
    for i in range(n):
        shp = [1] * n
        shp[i] = out_sp[i]
        term = ((np.arange(out_sp[i]) * stride[i] - padding[i]) * in_strides[i]).reshape(shp)
        base = term if base is None else base + term
    idx = xp.take(xp.asarray(deltas), arg)
    idx += xp.asarray(base)
    # a window lying wholly in the padding (possible with dilation) has no position to
    # point at: clamp into the plane rather than return an out-of-range index
    return xp.clip(idx, 0, int(np.prod(in_sp)) - 1, out=idx)


@tensor_method
def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max over windows of `[batch, channels, length]`; stride defaults to the kernel size."""
    return _max_pool("max_pool1d", 1, x, kernel_size, stride, padding, dilation, ceil_mode, False)


@tensor_method
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max over windows of `[batch, channels, height, width]`; stride defaults to the kernel size."""
    return _max_pool("max_pool2d", 2, x, kernel_size, stride, padding, dilation, ceil_mode, False)


@tensor_method
def max_pool1d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """(values, int64 indices into each plane's length) as PyTorch returns them."""
    return _max_pool("max_pool1d_with_indices", 1, x, kernel_size, stride, padding, dilation, ceil_mode, True)


@tensor_method
def max_pool2d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """(values, int64 indices into each flattened height*width plane) as PyTorch returns them."""
    return _max_pool("max_pool2d_with_indices", 2, x, kernel_size, stride, padding, dilation, ceil_mode, True)


# ---------------------------------------------------------------------- average pooling
def _avg_divisor(xp, in_sp, kernel, stride, padding, out_sp, count_include_pad, dtype):
    """PyTorch's divisor per output position: the window clipped to the padded input (or to
    the input itself without `count_include_pad`); separable, so an outer product."""
    div = None
    n = len(in_sp)
    for i, (L, k, s, p, o) in enumerate(zip(in_sp, kernel, stride, padding, out_sp)):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, L + p)
        if count_include_pad:
            cnt = end - start
        else:
            cnt = np.minimum(end, L) - np.maximum(start, 0)
        shp = [1] * n
        shp[i] = o
        c = cnt.astype(np.float64).reshape(shp)
        div = c if div is None else div * c
    return xp.asarray(div.astype(dtype))


def _avg_pool(op, n, x, kernel, stride, padding, count_include_pad, ceil_mode):
    _check_input(op, x, n, need_float=True)
    kernel = _int_tuple(op, "kernel_size", kernel, n, 1)
    stride = kernel if stride is None else _int_tuple(op, "stride", stride, n, 1)
    padding = _int_tuple(op, "padding", padding, n, 0)
    count_include_pad = _bool(op, "count_include_pad", count_include_pad)
    ceil_mode = _bool(op, "ceil_mode", ceil_mode)
    in_sp = x.shape[2:]
    ones = (1,) * n
    out_sp, pads = _pool_geometry(op, in_sp, kernel, stride, padding, ones, ceil_mode)
    dev = x._device
    xp = dev.xp
    xa = x._data
    lead = (slice(None), slice(None))
    with dev.context():
        div = _avg_divisor(xp, in_sp, kernel, stride, padding, out_sp, count_include_pad, xa.dtype)
        xpad = _pad_value(xp, xa, pads, 0)
        acc = None
        for _, sl in _window_slices(kernel, stride, ones, out_sp):
            v = xpad[lead + sl]
            if acc is None:
                acc = v.copy()
            else:
                acc += v
        acc /= div
    padded_shape = xpad.shape
    del xpad

    def rule(g):
        with dev.context():
            gd = g / div
            gpad = xp.zeros(padded_shape, dtype=g.dtype)
            for _, sl in _window_slices(kernel, stride, ones, out_sp):
                gpad[lead + sl] += gd
            return (_crop(gpad, pads, in_sp),)

    return record(acc, dev, (x,), rule, op)


@tensor_method
def avg_pool1d(x, kernel_size, stride=None, padding=0, count_include_pad=True, ceil_mode=False):
    """Mean over windows of `[batch, channels, length]` (PyTorch's divisor rules)."""
    return _avg_pool("avg_pool1d", 1, x, kernel_size, stride, padding, count_include_pad, ceil_mode)


@tensor_method
def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True, ceil_mode=False):
    """Mean over windows of `[batch, channels, height, width]` (PyTorch's divisor rules)."""
    return _avg_pool("avg_pool2d", 2, x, kernel_size, stride, padding, count_include_pad, ceil_mode)


# ---------------------------------------------------------------------- adaptive average pooling
def adaptive_bins(in_size: int, out_size: int):
    """PyTorch's bins: start = floor(i * in / out), end = ceil((i + 1) * in / out)."""
    i = np.arange(out_size)
    start = (i * in_size) // out_size
    end = -((-(i + 1) * in_size) // out_size)
    return start, end


def _adaptive_matrix(in_size, out_size, dtype):
    start, end = adaptive_bins(in_size, out_size)
    m = np.zeros((out_size, in_size), dtype=np.float64)
    for r, (a, b) in enumerate(zip(start, end)):
        m[r, a:b] = 1.0 / (b - a)
    return m.astype(dtype)


def _adaptive_avg_pool(op, n, x, output_size):
    _check_input(op, x, n, need_float=True)
    out_sp = _int_tuple(op, "output_size", output_size, n, 1)
    in_sp = x.shape[2:]
    if any(L < 1 for L in in_sp):
        raise TensorError(f"{op}: expected non-empty spatial dims, got dims {list(x.shape)}")
    dev = x._device
    xp = dev.xp
    xa = x._data
    with dev.context():
        mats = [xp.asarray(_adaptive_matrix(L, o, xa.dtype)) for L, o in zip(in_sp, out_sp)]
        y = xa
        for i, m in enumerate(mats):
            y = _apply_axis(xp, y, m, 2 + i)
        y = xp.ascontiguousarray(y)

    def rule(g):
        with dev.context():
            gx = g
            for i, m in enumerate(mats):
                gx = _apply_axis(xp, gx, m.T, 2 + i)
            return (xp.ascontiguousarray(gx),)

    return record(y, dev, (x,), rule, op)


@tensor_method
def adaptive_avg_pool1d(x, output_size):
    """Mean over PyTorch's adaptive bins of `[batch, channels, length]` to `output_size`."""
    return _adaptive_avg_pool("adaptive_avg_pool1d", 1, x, output_size)


@tensor_method
def adaptive_avg_pool2d(x, output_size):
    """Mean over PyTorch's adaptive bins of `[batch, channels, height, width]` to `output_size`."""
    return _adaptive_avg_pool("adaptive_avg_pool2d", 2, x, output_size)


__all__ = [
    "max_pool1d",
    "max_pool2d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_bins",
]
