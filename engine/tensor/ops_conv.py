"""Convolutions (1-D, 2-D, 3-D) and transposed convolutions, each beside its backward rule.

Layouts are Burn's (and PyTorch's): input `[batch, channels_in, *spatial]`; a convolution's
weight is `[channels_out, channels_in / groups, *kernel]`, a transposed convolution's
`[channels_in, channels_out / groups, *kernel]`; the bias is `[channels_out]`.

One implementation serves every number of spatial dimensions. A convolution gathers the
input windows into a channel-major column buffer ("im2col": one strided copy per kernel
offset, no loop over output positions) and multiplies it with the weight in one large
matrix product (per image when the inner dimension is tiny, as for a one-channel first
layer); with groups 1 the bias rides along as a row of ones. The backward pass reuses that
buffer for the weight gradient and spreads the column gradient back over the input
("col2im": one strided add per kernel offset). Both go in two stages (the last axis's
offsets first), so that every copy and add moves whole output rows or planes. With groups 1
and many channels the same steps run channels-last instead, a run of images at a time
(the CPU door's `engine.tensor.cpu.conv`, as does Winograd's 3x3): every copy and add moves whole channel vectors, and the input gradient is
spread one kernel offset's product at a time while it is in cache. A transposed convolution
is the same two steps in the other order. Every path is tested against loop references
(tests/engine/tensor/test_ops_conv.py forces each one).

Input, weight and bias must share one float dtype: a float64 input to a float32 weight raises
`DTypeError` instead of promoting (convert one with `.cast(...)`).
"""
from __future__ import annotations

import itertools
import numbers

import numpy as np

from .tensor import DTypeError, Tensor, TensorError, check_same_device, record, tensor_method
from . import cpu
from .cpu import copy_into, run_blocks, split
from .cpu.conv import channel_sum as _channel_sum, window_slices as _window_slices

_SPATIAL_NAMES = {1: "length", 2: "height, width", 3: "depth, height, width"}
# below this inner dimension (channels_in/groups * kernel size) one matrix product per image
# beats one large product followed by a transpose of its result
_SMALL_K = 32
_IMAGES_PER_PARTIAL = 16  # the per-image weight gradient sums this many images per partial
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


def _check_dtypes(op: str, x: Tensor, weight: Tensor, bias) -> None:
    """Input, weight and bias must share one float dtype: no silent promotion (PyTorch refuses
    a float64 input to a float32 convolution too)."""
    dt = x._data.dtype
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and t._data.dtype != dt:
            raise DTypeError(
                f"{op}: the input is {x.dtype} but the {what} is {t.dtype} (input dims {list(x.shape)}, "
                f"{what} dims {list(t.shape)}); convert one of them with .cast(...)"
            )


def _operands(x, weight, bias):
    """The op's tensor inputs (for `record`) and the input, weight and bias arrays (bias None
    when absent)."""
    inputs = [x, weight] + ([bias] if bias is not None else [])
    return inputs, x._data, weight._data, (bias._data if bias is not None else None)


# ---------------------------------------------------------------------- im2col / col2im
# Columns are channel-major, `[channels, *kernel, batch, *out]`: each kernel offset's copy then
# writes one contiguous block, and `[channels * kernel, batch * out]` is the right operand of
# a single large matrix product (much faster than one small product per image).


def _pad_cm(xp, x, pads):
    """`x` [B, C, *S] as channel-major [C, B, *S'], zero-padded by (before, after) pairs.

    Without padding this is a transposed view (no copy)."""
    xt = xp.moveaxis(x, 1, 0)
    if not any(lo or hi for lo, hi in pads):
        return xt
    shape = xt.shape[:2] + tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads))
    out = xp.zeros(shape, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(x.shape[2:], pads))] = xt
    return out


def _col_buffer(xp, rows, cols, dtype, with_ones):
    """A [rows (+1), cols] buffer for columns; the optional last row of ones carries the bias
    through the matrix product (saving a pass over the output)."""
    buf = xp.empty((rows + (1 if with_ones else 0), cols), dtype=dtype)
    if with_ones:
        buf[-1] = 1
    return buf


def _last_axis_slice(k, dilation, stride, out):
    """The strided slice of the last (padded) input axis that kernel offset `k` reads."""
    return slice(k * dilation, k * dilation + stride * (out - 1) + 1, stride)


def _lead_windows(kernel, stride, dilation, out):
    """Per offset along the leading spatial axes (all but the last): the offset tuple and its
    strided slices of those axes."""
    for offs in itertools.product(*[range(k) for k in kernel]):
        yield offs, tuple(slice(o * d, o * d + s * (m - 1) + 1, s) for o, d, s, m in zip(offs, dilation, stride, out))


def _im2col(xp, xpad_cm, kernel, stride, dilation, out, cols=None):
    """Columns [C, *kernel, B, *out] from a channel-major padded input [C, B, *S]:
    cols[c, k, b, o] = xpad[c, b, o*s + k*d]. Written into `cols` when given.

    Two stages, so that no copy moves runs shorter than an output row: per offset along the
    last axis, that axis's strided slice of every input row (one copy, [C, B, *S_lead, O_last]);
    then per offset along the leading axes, whole output planes of that copy (contiguous runs of
    O_last, and of whole planes with stride 1)."""
    c, b = xpad_cm.shape[:2]
    if cols is None:
        cols = xp.empty((c,) + tuple(kernel) + (b,) + tuple(out), dtype=xpad_cm.dtype)
    if xp is np:
        # channels are independent: one run of channels per kernel thread
        run_blocks(lambda cs: _im2col_part(xp, xpad_cm[cs], kernel, stride, dilation, out, cols[cs]),
                   split(c, cols.nbytes))
    else:
        _im2col_part(xp, xpad_cm, kernel, stride, dilation, out, cols)
    return cols


def _im2col_part(xp, xpad_cm, kernel, stride, dilation, out, cols):
    n = len(kernel)
    lead = (slice(None), slice(None))
    for k in range(kernel[-1]):
        last = xpad_cm[..., _last_axis_slice(k, dilation[-1], stride[-1], out[-1])]
        if n == 1:
            cols[:, k] = last
            continue
        last = xp.ascontiguousarray(last)
        for offs, sl in _lead_windows(kernel[:-1], stride[:-1], dilation[:-1], out[:-1]):
            cols[(slice(None),) + offs + (k,)] = last[lead + sl]


def _col2im_matmul(xp, w_r, rhs, padded_cm_shape, kernel, stride, dilation, out):
    """The adjoint of `_im2col` applied to the columns `w^T @ rhs`, summed into zeros [C, B, *S].

    `w_r` is a weight `[G, R, Cc, *kernel]` (R the contracted channels), `rhs` `[G, R, B * P]`;
    column row (c, k) is `sum_r w_r[g, r, c, k] * rhs[g, r]`. The product is formed per offset
    along the last kernel axis into one reused buffer, which is spread over the input while it
    is in cache: first its leading-axis offsets into a buffer of whole output rows, then that
    buffer into its strided slice of the last axis."""
    g_, r, cc = w_r.shape[:3]
    n = len(kernel)
    klead = tuple(kernel[:-1])
    nlead = int(np.prod(klead))
    c, b = padded_cm_shape[:2]
    res = xp.zeros(padded_cm_shape, dtype=rhs.dtype)
    lead = (slice(None), slice(None))
    acc = xp.empty(padded_cm_shape[:-1] + (out[-1],), dtype=rhs.dtype) if n > 1 else None
    blk = None
    parts = split(c, res.nbytes) if xp is np else [slice(0, c)]
    mm = cpu.matmul
    for k in range(kernel[-1]):
        wk = w_r[..., k].reshape(g_, r, cc * nlead).swapaxes(-1, -2)  # [G, Cc * K_lead, R]
        blk = mm(wk, rhs, out=blk)
        cols_k = blk.reshape((c,) + klead + (b,) + tuple(out))
        target = res[..., _last_axis_slice(k, dilation[-1], stride[-1], out[-1])]

        def spread(cs, cols_k=cols_k, target=target):  # channels are independent
            if n == 1:
                target[cs] += cols_k[cs]
                return
            a = acc[cs]
            a[...] = 0
            for offs, sl in _lead_windows(klead, stride[:-1], dilation[:-1], out[:-1]):
                a[lead + sl] += cols_k[(cs,) + offs]
            target[cs] += a

        run_blocks(spread, parts)
    return res


def _crop(x, pads, sizes):
    if not any(lo or hi for lo, hi in pads) and x.shape[2:] == tuple(sizes):
        return x
    return x[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for (lo, _), s in zip(pads, sizes))]


def _contiguous(xp, view):
    """A C-contiguous copy of `view` (a transposed view); on NumPy split over the kernel threads."""
    if xp is not np:
        return xp.ascontiguousarray(view)
    if view.flags.c_contiguous:
        return view
    dst = np.empty(view.shape, dtype=view.dtype)
    copy_into(dst, view)
    return dst


def _from_cm(xp, a):
    """[C, B, ...] channel-major to a C-contiguous [B, C, ...]."""
    return _contiguous(xp, xp.moveaxis(a, 0, 1))


def _to_cm_groups(xp, a, groups):
    """[B, C, *S] to a C-contiguous [G, C/G, B * prod(S)]."""
    b, c = a.shape[:2]
    return _contiguous(xp, xp.moveaxis(a, 1, 0)).reshape(groups, c // groups, -1)


def _matmul_cm(xp, w_m, cols_m, batch, small_k):
    """[G, M, K] @ [G, K, B*P] -> [B, G*M, P].

    One large product and a transpose of the result, except for a tiny inner dimension
    (a first layer on one channel), where the transpose would cost as much as the product:
    then one product per image, writing the [B, G*M, P] layout directly."""
    g_, m, k = w_m.shape
    p = cols_m.shape[-1] // batch
    if small_k:
        rhs = xp.moveaxis(cols_m.reshape(g_, k, batch, p), 2, 0)  # [B, G, K, P]
        if xp is not np:
            return xp.matmul(w_m[None], rhs).reshape(batch, g_ * m, p)
        res = np.empty((batch, g_, m, p), dtype=np.result_type(w_m, cols_m))
        # one small product per image: the images split over the kernel threads
        run_blocks(lambda bs: cpu.matmul(w_m[None], rhs[bs], out=res[bs]), split(batch, res.nbytes))
        return res.reshape(batch, g_ * m, p)
    if cpu.conv.transposed_product(xp):
        # formed transposed, cols^T @ w^T -> [G, B*P, M]; one copy puts it in the [B, G*M, P]
        # layout (the door says when: the long dimension B*P is then the rows BLAS splits)
        res = cpu.matmul(cols_m.swapaxes(-1, -2), w_m.swapaxes(-1, -2))  # [G, B*P, M]
        return _contiguous(xp, res.reshape(g_, batch, p, m).transpose(1, 0, 3, 2)).reshape(batch, g_ * m, p)
    res = cpu.matmul(w_m, cols_m)  # [G, M, B*P]
    return _contiguous(xp, xp.moveaxis(res.reshape(g_ * m, batch, p), 1, 0))


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
    _check_dtypes(op, x, weight, bias)
    stride = _int_tuple(op, "stride", stride, n, 1)
    dilation = _int_tuple(op, "dilation", dilation, n, 1)
    pads = _padding_pairs(op, padding, n, kernel, dilation, stride)
    out_sp = _out_sizes(op, x.shape[2:], kernel, stride, dilation, pads)

    dev = x._device
    xp = dev.xp
    inputs, xa, wa, ba = _operands(x, weight, bias)
    done = cpu.conv.convolve(op, n, dev, x, weight, bias, inputs, xa, groups, kernel, stride, dilation, pads, out_sp)
    if done is not None:  # the CPU door's channels-last or Winograd path
        return done

    g_ = groups
    c_out_g = c_out // g_
    ksize = int(np.prod(kernel))
    p = int(np.prod(out_sp))
    small_k = c_in_g * ksize < _SMALL_K
    with dev.context():
        xpad = _pad_cm(xp, xa, pads)  # [C, B, *S]
        fold = ba is not None and g_ == 1  # the bias rides along in the product
        buf = _col_buffer(xp, c_in * ksize, batch * p, xa.dtype, fold)
        cols = buf[: c_in * ksize].reshape((c_in,) + tuple(kernel) + (batch,) + out_sp)
        _im2col(xp, xpad, kernel, stride, dilation, out_sp, cols)  # [C, *K, B, *O]
        cols_m = cols.reshape(g_, c_in_g * ksize, batch * p)
        w_m = wa.reshape(g_, c_out_g, c_in_g * ksize)
        if fold:
            w_b = xp.concatenate([w_m, ba.reshape(1, c_out, 1)], axis=2)
            out = _matmul_cm(xp, w_b, buf[None], batch, small_k).reshape((batch, c_out) + out_sp)
        else:
            out = _matmul_cm(xp, w_m, cols_m, batch, small_k).reshape((batch, c_out) + out_sp)
            if ba is not None:
                out += ba.reshape((1, c_out) + (1,) * n)

    need_x = x._node is not None
    need_w = weight._node is not None
    need_b = bias is not None and bias._node is not None
    in_sp, padded_cm_shape = xa.shape[2:], xpad.shape
    del xpad, cols
    # with a tiny inner dimension the weight gradient is one small product per image,
    # [Og, P] @ [P, Cg*K (+1)], reading the gradient where it lies (no transposed copy); with
    # the bias folded the row of ones yields the bias gradient in the same product
    per_image_w = small_k and need_w
    if not per_image_w:
        buf = None
    if not need_w:
        cols_m = None  # the weight gradient is the only user of the columns

    def rule(g):
        with dev.context():
            gx = gw = gb = None
            if per_image_w:
                rows = buf.shape[0] if fold else c_in_g * ksize
                src = (buf if fold else cols_m).reshape(g_, rows, batch, p).transpose(2, 0, 3, 1)  # [B, G, P, rows]
                gwb = _per_image_weight_grad(xp, g.reshape(batch, g_, c_out_g, p), src)  # [G, Og, rows]
                gw = gwb[..., : c_in_g * ksize].reshape(wa.shape)
                if fold and need_b:
                    gb = gwb[0, :, -1]
            if need_x or (need_w and not per_image_w):
                g2 = _to_cm_groups(xp, g, g_)  # [G, Og, B*P]
            if need_w and not per_image_w:
                gw = _weight_grad(xp, g2, cols_m).reshape(wa.shape)
            if need_x:
                w_r = wa.reshape((g_, c_out_g, c_in_g) + tuple(kernel))
                gpad = _col2im_matmul(xp, w_r, g2, padded_cm_shape, kernel, stride, dilation, out_sp)
                gx = _from_cm(xp, _crop(gpad, pads, in_sp))
            if need_b and gb is None:
                gb = _channel_sum(xp, g)
        return (gx, gw) if bias is None else (gx, gw, gb)

    return record(out, dev, inputs, rule, op)


def _weight_grad(xp, g2, cols_m):
    """`g2 @ cols_m^T` ([G, M, N] and [G, K, N] -> [G, M, K], N the batch's positions: the
    weight gradient), formed as `(cols_m @ g2^T)^T`: the long inner dimension N is then the
    second operand's leading one and the few output channels M its columns, a shape
    OpenBLAS splits well over its threads (the direct form, M = 64 rows by N = 7744, ran 2-3x
    slower at 2 threads on the benchmark's 64->64 layer). The small result (K * M elements)
    is copied back to C order; the sums are the same, in BLAS's order."""
    return xp.ascontiguousarray(cpu.matmul(cols_m, g2.swapaxes(-1, -2)).swapaxes(-1, -2))


def _per_image_weight_grad(xp, g4, src):
    """sum over images b of g4[b] @ src[b] ([B, G, Og, P] and [B, G, P, R] -> [G, Og, R]); on
    NumPy in runs of _IMAGES_PER_PARTIAL images, spread over the kernel threads, whose partial
    sums are then added in order (the same bits on any number of threads)."""
    if xp is not np:
        return xp.matmul(g4, src).sum(axis=0)
    batch = g4.shape[0]
    parts = [slice(lo, lo + _IMAGES_PER_PARTIAL) for lo in range(0, batch, _IMAGES_PER_PARTIAL)]
    partial = [None] * len(parts)

    def run(i):
        partial[i] = cpu.matmul(g4[parts[i]], src[parts[i]]).sum(axis=0)

    run_blocks(run, range(len(parts)))
    total = partial[0]
    for more in partial[1:]:
        total += more
    return total


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
    _check_dtypes(op, x, weight, bias)
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
    inputs, xa, wa, ba = _operands(x, weight, bias)
    g_ = groups
    c_in_g = c_in // g_
    ksize = int(np.prod(kernel))
    p_in = int(np.prod(in_sp))
    small_k = c_out_g * ksize < _SMALL_K
    with dev.context():
        x2 = _to_cm_groups(xp, xa, g_)  # [G, Cg_in, B*P_in]
        w_m = wa.reshape(g_, c_in_g, c_out_g * ksize)
        w_r = wa.reshape((g_, c_in_g, c_out_g) + tuple(kernel))
        res = _col2im_matmul(xp, w_r, x2, (c_out, batch) + full, kernel, stride, dilation, in_sp)  # [C_out, B, *full]
        out = _from_cm(xp, _crop(res, pads, out_sp))
        if ba is not None:
            out += ba.reshape((1, c_out) + (1,) * n)

    need_x = x._node is not None
    need_w = weight._node is not None
    need_b = bias is not None and bias._node is not None
    if not need_w:
        x2 = None

    def rule(g):
        with dev.context():
            gx = gw = gb = None
            if need_x or need_w:
                gpad = _pad_cm(xp, g, pads)  # [C_out, B, *full]
                gcols = _im2col(xp, gpad, kernel, stride, dilation, in_sp).reshape(g_, c_out_g * ksize, batch * p_in)
                if need_x:
                    gx = _matmul_cm(xp, w_m, gcols, batch, small_k).reshape(xa.shape)
                if need_w:
                    gw = _weight_grad(xp, x2, gcols).reshape(wa.shape)
            if need_b:
                gb = _channel_sum(xp, g)
        return (gx, gw) if bias is None else (gx, gw, gb)

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
