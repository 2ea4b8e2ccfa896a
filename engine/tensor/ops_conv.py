"""Convolutions (1-D, 2-D, 3-D) and transposed convolutions, each beside its backward rule.

Layouts are Burn's (and PyTorch's): input `[batch, channels_in, *spatial]`; a convolution's
weight is `[channels_out, channels_in / groups, *kernel]`, a transposed convolution's
`[channels_in, channels_out / groups, *kernel]`; the bias is `[channels_out]`.

One implementation serves every number of spatial dimensions. A convolution gathers the
input windows into a column buffer ("im2col": one strided copy per kernel offset, no loop
over output positions) and multiplies it with the weight in one batched matrix product.
The backward pass reuses that buffer for the weight gradient and spreads the column
gradient back over the input ("col2im": one strided add per kernel offset). A transposed
convolution is the same two steps in the other order.
"""
from __future__ import annotations

import itertools
import numbers

import numpy as np

from .tensor import Tensor, TensorError, check_same_device, record, tensor_method

_SPATIAL_NAMES = {1: "length", 2: "height, width", 3: "depth, height, width"}


# ---------------------------------------------------------------------- argument checks
def _int_tuple(op: str, name: str, value, n: int, minimum: int) -> tuple[int, ...]:
    """An int or a sequence of `n` ints, each >= minimum, as a tuple of n ints."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        vals = (int(value),) * n
    else:
        try:
            vals = tuple(value)
        except TypeError:
            raise TensorError(f"{op}: {name} must be an int or a sequence of {n} ints, got {value!r}") from None
        if len(vals) != n or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in vals):
            raise TensorError(f"{op}: {name} must be an int or a sequence of {n} ints, got {value!r}")
        vals = tuple(int(v) for v in vals)
    if any(v < minimum for v in vals):
        raise TensorError(f"{op}: {name} must be >= {minimum} in every dimension, got {list(vals)}")
    return vals


def _padding_pairs(op: str, padding, n: int, kernel, dilation, stride) -> tuple[tuple[int, int], ...]:
    """Padding as one (before, after) pair per spatial dimension.

    Accepts an int, a sequence of n ints (symmetric per dimension), a sequence of n
    (before, after) pairs (asymmetric), "valid" (no padding) or "same" (stride 1 only: the
    output keeps the input's size; an odd total puts the extra element after, as PyTorch).
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return ((0, 0),) * n
        if mode == "same":
            if any(s != 1 for s in stride):
                raise TensorError(f"{op}: padding 'same' needs stride 1, got stride {list(stride)}")
            pairs = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                pairs.append((total // 2, total - total // 2))
            return tuple(pairs)
        raise TensorError(f"{op}: padding must be an int, a sequence, 'valid' or 'same', got {padding!r}")
    if isinstance(padding, numbers.Integral) and not isinstance(padding, bool):
        if padding < 0:
            raise TensorError(f"{op}: padding must be >= 0, got {padding}")
        return ((int(padding), int(padding)),) * n
    try:
        items = tuple(padding)
    except TypeError:
        raise TensorError(f"{op}: padding must be an int, a sequence of {n} ints or of {n} (before, after) pairs, got {padding!r}") from None
    if len(items) != n:
        raise TensorError(f"{op}: padding needs one entry per spatial dimension ({n}), got {padding!r}")
    pairs = []
    for p in items:
        if isinstance(p, numbers.Integral) and not isinstance(p, bool):
            pair = (int(p), int(p))
        else:
            try:
                lo, hi = p
                pair = (int(lo), int(hi))
            except (TypeError, ValueError):
                raise TensorError(f"{op}: padding entries must be ints or (before, after) pairs, got {padding!r}") from None
        if pair[0] < 0 or pair[1] < 0:
            raise TensorError(f"{op}: padding must be >= 0, got {padding!r}")
        pairs.append(pair)
    return tuple(pairs)


def _check_float_input(op: str, x, n: int, what: str = "input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor as {what}, got {type(x).__name__}")
    if x.rank != n + 2:
        spatial = _SPATIAL_NAMES.get(n, "spatial")
        raise TensorError(
            f"{op}: expected the {what} of rank {n + 2} [batch, channels, {spatial}], got dims {list(x.shape)}"
        )
    if x._data.dtype.kind != "f":
        raise TensorError(f"{op}: expected a float {what}, got {x.dtype}")


def _check_weight(op: str, w, n: int, layout: str):
    if not isinstance(w, Tensor):
        raise TypeError(f"{op}: expected a Tensor as weight, got {type(w).__name__}")
    if w.rank != n + 2:
        raise TensorError(f"{op}: expected a weight of rank {n + 2} {layout}, got dims {list(w.shape)}")
    if w._data.dtype.kind != "f":
        raise TensorError(f"{op}: expected a float weight, got {w.dtype}")


def _check_bias(op: str, b, channels_out: int, x: Tensor):
    if b is None:
        return
    if not isinstance(b, Tensor):
        raise TypeError(f"{op}: expected a Tensor or None as bias, got {type(b).__name__}")
    check_same_device(op, x, b)
    if b.shape != (channels_out,):
        raise TensorError(f"{op}: expected a bias of dims [{channels_out}] (one per output channel), got dims {list(b.shape)}")
    if b._data.dtype.kind != "f":
        raise TensorError(f"{op}: expected a float bias, got {b.dtype}")


def _common(xp, arrays):
    """Cast the arrays to their common float dtype (no copy where they already have it)."""
    dt = np.result_type(*[a.dtype for a in arrays])
    return dt, [a if a.dtype == dt else a.astype(dt) for a in arrays]


def _back_cast(g, like):
    return g if g is None or g.dtype == like.dtype else g.astype(like.dtype)


# ---------------------------------------------------------------------- im2col / col2im
def _pad(xp, x, pads):
    """Zero-pad the spatial axes (all axes after the first two) by (before, after) pairs."""
    if not any(lo or hi for lo, hi in pads):
        return x
    shape = x.shape[:2] + tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads))
    out = xp.zeros(shape, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(x.shape[2:], pads))] = x
    return out


def _window_slices(kernel, stride, dilation, out):
    """For each kernel offset: its index tuple and the strided slices of the padded input."""
    for offs in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offs, dilation, stride, out)
        )
        yield offs, sl


def _im2col(xp, xpad, kernel, stride, dilation, out):
    """Columns `[batch, channels, *kernel, *out]`: cols[b, c, k, o] = xpad[b, c, o*s + k*d]."""
    b, c = xpad.shape[:2]
    cols = xp.empty((b, c) + tuple(kernel) + tuple(out), dtype=xpad.dtype)
    lead = (slice(None), slice(None))
    for offs, sl in _window_slices(kernel, stride, dilation, out):
        cols[lead + offs] = xpad[lead + sl]
    return cols


def _col2im(xp, cols, padded_shape, kernel, stride, dilation, out):
    """The adjoint of `_im2col`: sum every column entry back into a zero `padded_shape` array."""
    res = xp.zeros(padded_shape, dtype=cols.dtype)
    lead = (slice(None), slice(None))
    for offs, sl in _window_slices(kernel, stride, dilation, out):
        res[lead + sl] += cols[lead + offs]
    return res


def _crop(x, pads, sizes):
    if not any(lo or hi for lo, hi in pads) and x.shape[2:] == tuple(sizes):
        return x
    return x[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for (lo, _), s in zip(pads, sizes))]


def _out_sizes(op, in_sizes, kernel, stride, dilation, pads):
    out = []
    for L, k, s, d, (lo, hi) in zip(in_sizes, kernel, stride, dilation, pads):
        span = L + lo + hi - d * (k - 1) - 1
        if span < 0:
            raise TensorError(
                f"{op}: the kernel (size {list(kernel)}, dilation {list(dilation)}) is larger than the padded input "
                f"(spatial dims {list(in_sizes)}, padding {[list(p) for p in pads]})"
            )
        out.append(span // s + 1)
    return tuple(out)


# ---------------------------------------------------------------------- convolution
def _conv(op, n, x, weight, bias, stride, padding, dilation, groups):
    _check_float_input(op, x, n)
    _check_weight(op, weight, n, "[channels_out, channels_in / groups, *kernel]")
    check_same_device(op, x, weight)
    if not isinstance(groups, numbers.Integral) or groups < 1:
        raise TensorError(f"{op}: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    batch, c_in = x.shape[:2]
    c_out, c_in_g = weight.shape[:2]
    kernel = weight.shape[2:]
    if c_in != c_in_g * groups:
        raise TensorError(
            f"{op}: input has {c_in} channels, weight expects {c_in_g * groups} "
            f"({c_in_g} per group, groups {groups}; input dims {list(x.shape)}, weight dims {list(weight.shape)})"
        )
    if c_out % groups:
        raise TensorError(f"{op}: weight has {c_out} output channels, not divisible by groups {groups} (weight dims {list(weight.shape)})")
    if any(k < 1 for k in kernel):
        raise TensorError(f"{op}: the kernel must have every size >= 1, weight dims {list(weight.shape)}")
    _check_bias(op, bias, c_out, x)
    stride = _int_tuple(op, "stride", stride, n, 1)
    dilation = _int_tuple(op, "dilation", dilation, n, 1)
    pads = _padding_pairs(op, padding, n, kernel, dilation, stride)
    out_sp = _out_sizes(op, x.shape[2:], kernel, stride, dilation, pads)

    dev = x._device
    xp = dev.xp
    inputs = [x, weight] + ([bias] if bias is not None else [])
    dt, arrs = _common(xp, [t._data for t in inputs])
    xa, wa = arrs[0], arrs[1]
    ba = arrs[2] if bias is not None else None

    g_ = groups
    c_out_g = c_out // g_
    ksize = int(np.prod(kernel))
    p = int(np.prod(out_sp))
    with dev.context():
        xpad = _pad(xp, xa, pads)
        cols = _im2col(xp, xpad, kernel, stride, dilation, out_sp)  # [B, C, *K, *O]
        cols_m = cols.reshape(batch, g_, c_in_g * ksize, p)
        w_m = wa.reshape(g_, c_out_g, c_in_g * ksize)
        out = xp.matmul(w_m, cols_m)  # [B, G, Og, P]
        out = out.reshape((batch, c_out) + out_sp)
        if ba is not None:
            out += ba.reshape((1, c_out) + (1,) * n)

    need_x = x._node is not None
    need_w = weight._node is not None
    need_b = bias is not None and bias._node is not None
    xshape, padded_shape = xa.shape, xpad.shape
    del xpad
    if not need_w:
        cols_m = None  # the weight gradient is the only user of the columns

    def rule(g):
        with dev.context():
            gm = g.reshape(batch, g_, c_out_g, p)
            gx = gw = gb = None
            if need_w:
                gw = xp.matmul(gm, cols_m.swapaxes(-1, -2)).sum(axis=0).reshape(wa.shape)
            if need_x:
                gcols = xp.matmul(w_m.swapaxes(-1, -2), gm)  # [B, G, Cg*K, P]
                gcols = gcols.reshape((batch, c_in) + tuple(kernel) + out_sp)
                gpad = _col2im(xp, gcols, padded_shape, kernel, stride, dilation, out_sp)
                gx = _crop(gpad, pads, xshape[2:])
            if need_b:
                gb = g.sum(axis=(0,) + tuple(range(2, n + 2)))
        res = (_back_cast(gx, x._data), _back_cast(gw, weight._data))
        if bias is not None:
            res += (_back_cast(gb, bias._data),)
        return res

    return record(out, dev, inputs, rule, op)


@tensor_method
def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution: x `[batch, ch_in, length]`, weight `[ch_out, ch_in/groups, kernel]`.

    `padding`: an int, a 1-sequence, a ((before, after),) pair, "valid" or "same".
    """
    return _conv("conv1d", 1, x, weight, bias, stride, padding, dilation, groups)


@tensor_method
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution: x `[batch, ch_in, h, w]`, weight `[ch_out, ch_in/groups, kh, kw]`.

    `stride`, `dilation`: an int or a pair. `padding`: an int, a pair (symmetric per
    dimension), a pair of (before, after) pairs (asymmetric), "valid" or "same".
    """
    return _conv("conv2d", 2, x, weight, bias, stride, padding, dilation, groups)


@tensor_method
def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-D convolution: x `[batch, ch_in, d, h, w]`, weight `[ch_out, ch_in/groups, kd, kh, kw]`."""
    return _conv("conv3d", 3, x, weight, bias, stride, padding, dilation, groups)


# ---------------------------------------------------------------------- transposed convolution
def _conv_transpose(op, n, x, weight, bias, stride, padding, padding_out, dilation, groups):
    _check_float_input(op, x, n)
    _check_weight(op, weight, n, "[channels_in, channels_out / groups, *kernel]")
    check_same_device(op, x, weight)
    if not isinstance(groups, numbers.Integral) or groups < 1:
        raise TensorError(f"{op}: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    batch, c_in = x.shape[:2]
    w_in, c_out_g = weight.shape[:2]
    kernel = weight.shape[2:]
    if c_in != w_in:
        raise TensorError(
            f"{op}: input has {c_in} channels, weight expects {w_in} "
            f"(groups {groups}; input dims {list(x.shape)}, weight dims {list(weight.shape)})"
        )
    if c_in % groups:
        raise TensorError(f"{op}: input channels {c_in} are not divisible by groups {groups}")
    if any(k < 1 for k in kernel):
        raise TensorError(f"{op}: the kernel must have every size >= 1, weight dims {list(weight.shape)}")
    c_out = c_out_g * groups
    _check_bias(op, bias, c_out, x)
    stride = _int_tuple(op, "stride", stride, n, 1)
    dilation = _int_tuple(op, "dilation", dilation, n, 1)
    pad = _int_tuple(op, "padding", padding, n, 0)
    pad_out = _int_tuple(op, "padding_out", padding_out, n, 0)
    for po, s, d in zip(pad_out, stride, dilation):
        if po >= max(s, d):
            raise TensorError(
                f"{op}: padding_out must be smaller than stride or dilation, got padding_out {list(pad_out)}, "
                f"stride {list(stride)}, dilation {list(dilation)}"
            )
    in_sp = x.shape[2:]
    full = tuple((L - 1) * s + d * (k - 1) + 1 + po for L, s, d, k, po in zip(in_sp, stride, dilation, kernel, pad_out))
    out_sp = tuple(f - 2 * p for f, p in zip(full, pad))
    if any(o < 1 for o in out_sp):
        raise TensorError(
            f"{op}: the output would be empty (spatial dims {list(out_sp)}) for input dims {list(x.shape)}, "
            f"kernel {list(kernel)}, stride {list(stride)}, padding {list(pad)}"
        )
    pads = tuple((p, p) for p in pad)

    dev = x._device
    xp = dev.xp
    inputs = [x, weight] + ([bias] if bias is not None else [])
    dt, arrs = _common(xp, [t._data for t in inputs])
    xa, wa = arrs[0], arrs[1]
    ba = arrs[2] if bias is not None else None
    g_ = groups
    c_in_g = c_in // g_
    ksize = int(np.prod(kernel))
    p_in = int(np.prod(in_sp))
    with dev.context():
        x_m = xa.reshape(batch, g_, c_in_g, p_in)
        w_m = wa.reshape(g_, c_in_g, c_out_g * ksize)
        cols = xp.matmul(w_m.swapaxes(-1, -2), x_m)  # [B, G, Og*K, P_in]
        cols = cols.reshape((batch, c_out) + tuple(kernel) + tuple(in_sp))
        res = _col2im(xp, cols, (batch, c_out) + full, kernel, stride, dilation, in_sp)
        del cols
        out = _crop(res, pads, out_sp)
        if ba is not None:
            out = out + ba.reshape((1, c_out) + (1,) * n)
        elif not out.flags.c_contiguous:
            out = xp.ascontiguousarray(out)

    need_x = x._node is not None
    need_w = weight._node is not None
    need_b = bias is not None and bias._node is not None

    def rule(g):
        with dev.context():
            gx = gw = gb = None
            if need_x or need_w:
                gpad = _pad(xp, g, tuple((p, f - o - p) for p, f, o in zip(pad, full, out_sp)))
                gcols = _im2col(xp, gpad, kernel, stride, dilation, in_sp)
                gcols = gcols.reshape(batch, g_, c_out_g * ksize, p_in)
                if need_x:
                    gx = xp.matmul(w_m, gcols).reshape(xa.shape)
                if need_w:
                    gw = xp.matmul(x_m, gcols.swapaxes(-1, -2)).sum(axis=0).reshape(wa.shape)
            if need_b:
                gb = g.sum(axis=(0,) + tuple(range(2, n + 2)))
        r = (_back_cast(gx, x._data), _back_cast(gw, weight._data))
        if bias is not None:
            r += (_back_cast(gb, bias._data),)
        return r

    return record(out, dev, inputs, rule, op)


@tensor_method
def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, padding_out=0, dilation=1, groups=1):
    """1-D transposed convolution: x `[batch, ch_in, length]`, weight `[ch_in, ch_out/groups, kernel]`.

    Output length: (length - 1) * stride - 2 * padding + dilation * (kernel - 1) + padding_out + 1.
    """
    return _conv_transpose("conv_transpose1d", 1, x, weight, bias, stride, padding, padding_out, dilation, groups)


@tensor_method
def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, padding_out=0, dilation=1, groups=1):
    """2-D transposed convolution: x `[batch, ch_in, h, w]`, weight `[ch_in, ch_out/groups, kh, kw]`."""
    return _conv_transpose("conv_transpose2d", 2, x, weight, bias, stride, padding, padding_out, dilation, groups)


@tensor_method
def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, padding_out=0, dilation=1, groups=1):
    """3-D transposed convolution: x `[batch, ch_in, d, h, w]`, weight `[ch_in, ch_out/groups, kd, kh, kw]`."""
    return _conv_transpose("conv_transpose3d", 3, x, weight, bias, stride, padding, padding_out, dilation, groups)
