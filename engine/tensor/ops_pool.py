"""Pooling over the spatial axes of `[batch, channels, *spatial]` tensors, with backward rules.

Max and average pooling walk the kernel offsets (one strided slice of the padded input per
offset, no loop over output positions); adaptive average pooling multiplies each spatial
axis by a small averaging matrix. Output sizes, `ceil_mode`, padding rules, the average's
divisor and the max indices follow PyTorch (and Burn, which matches it):

- out = floor((L + 2p - d(k-1) - 1) / s) + 1 (ceil instead of floor with `ceil_mode`, where
  a last window that would start in the right padding is dropped);
- padding may be at most half the kernel;
- max indices index the flattened spatial input of each (batch, channel) plane.
"""
from __future__ import annotations

import numpy as np

from .ops_conv import _SPATIAL_NAMES, _crop, _int_tuple, _window_slices
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
    need_idx = with_indices or x._node is not None
    # row-major strides of one (batch, channel) plane of the unpadded input
    plane = int(np.prod(in_sp))
    in_strides = [int(np.prod(in_sp[i + 1:])) for i in range(n)]
    lead = (slice(None), slice(None))
    with dev.context():
        xpad = _pad_value(xp, xa, pads, lowest)
        best = xp.full((xa.shape[0], xa.shape[1]) + out_sp, lowest, dtype=xa.dtype)
        if need_idx:
            # PyTorch's scan: a value replaces the running max when it is greater or NaN;
            # -1 marks a window that has not seen a value above the dtype's lowest yet
            arg = xp.full(best.shape, -1, dtype=np.int64)
            for offs, sl in _window_slices(kernel, stride, dilation, out_sp):
                v = xpad[lead + sl]
                m = v > best
                if is_float:
                    m |= xp.isnan(v)
                xp.copyto(best, v, where=m)
                xp.copyto(arg, sum(o * d * st for o, d, st in zip(offs, dilation, in_strides)), where=m)
            # windows whose values are all the lowest value (-inf) point at their first
            # position inside the input, as PyTorch's kernels do
            base_ax, first_ax = [], []
            for i in range(n):
                starts = np.arange(out_sp[i]) * stride[i] - padding[i]
                first = np.where(starts < 0, starts + (-starts + dilation[i] - 1) // dilation[i] * dilation[i], starts)
                first = np.minimum(first, in_sp[i] - 1)
                shp = [1] * n
                shp[i] = out_sp[i]
                base_ax.append(xp.asarray((starts * in_strides[i]).reshape(shp)))
                first_ax.append(xp.asarray((first * in_strides[i]).reshape(shp)))
            missing = arg < 0
            idx = arg + sum(base_ax)
            if bool(missing.any()):
                idx = xp.where(missing, xp.broadcast_to(sum(first_ax), idx.shape), idx)
        else:
            for _, sl in _window_slices(kernel, stride, dilation, out_sp):
                xp.maximum(best, xpad[lead + sl], out=best)  # NaN propagates, as in PyTorch
    values = best

    if x._node is not None:
        batch, chans = xa.shape[:2]
        non_overlap = all(s >= d * (k - 1) + 1 for s, d, k in zip(stride, dilation, kernel))
        flat_idx = idx

        def rule(g):
            with dev.context():
                offsets = (xp.arange(batch * chans, dtype=np.int64) * plane).reshape((batch, chans) + (1,) * n)
                pos = (flat_idx + offsets).ravel()
                if non_overlap:
                    gx = xp.zeros(batch * chans * plane, dtype=g.dtype)
                    gx[pos] = g.ravel()  # every input position is in at most one window
                else:
                    gx = xp.bincount(pos, weights=g.ravel(), minlength=batch * chans * plane).astype(g.dtype, copy=False)
            return (gx.reshape(xa.shape),)

        out = record(values, dev, (x,), rule, op)
    else:
        out = Tensor._wrap(values, dev, x._ad)
    if with_indices:
        return out, Tensor._wrap(idx, dev)
    return out


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
