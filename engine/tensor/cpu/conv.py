"""The convolutions' CPU paths: channels-last and Winograd F(2x2, 3x3) (engine.tensor.ops_conv
keeps the argument checks and the channel-major im2col path that serves every device).

`convolve` decides whether a convolution runs here (NumPy, groups 1, many channels, a kernel of
more than one element) and which way (Winograd for a float32 3x3 with stride and dilation 1
when the compiled kernels are there, else channels-last); it returns None for the others.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..tensor import record
from . import jit as _jit
from . import mkl as _mkl
from . import threads as _threads
from .threads import copy_into, run_blocks, run_chunks, split

__all__ = ["convolve", "transposed_product", "channel_sum", "window_slices", "CL_MIN_CHANNELS", "CL_CHUNK_BYTES", "WINOGRAD_RUN_DIVISOR"]

# with groups 1, a kernel of more than one element and at least this many input and output
# channels, convolutions run channels-last (see `_conv_cl`): every copy and add then moves runs
# of whole channel vectors (a 1x1 kernel gains nothing from columns, and stays channel-major)
CL_MIN_CHANNELS = 16
# channels-last convolutions work a run of whole images at a time, about this many bytes of
# their columns, so that each run's copies, products and adds stay in cache (the shared L3)
CL_CHUNK_BYTES = 3 << 20
# Winograd's runs (their transformed input and product, 16 tiles' worth per 2x2 outputs) hold
# this fraction of that. Not where MKL takes the products (`engine.tensor.cpu.mkl`, the mkl
# extra on an Intel CPU): there the smaller runs' stacked products would fall under
# MKL_MIN_ITEM_WORK per item and go back to OpenBLAS, which MKL beats at these sizes
WINOGRAD_RUN_DIVISOR = 2


def _winograd_run_divisor() -> int:
    return 1 if _mkl.active() else WINOGRAD_RUN_DIVISOR



def window_slices(kernel, stride, dilation, out):
    """For each kernel offset: its index tuple and the strided slices of the padded input."""
    for offs in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offs, dilation, stride, out)
        )
        yield offs, sl


def channel_sum(xp, g):
    """`g.sum` over every axis but 1 ([B, C, *S] -> [C]); on NumPy as one matrix-vector
    product, several times faster than NumPy's reduction over non-trailing axes."""
    if xp is np and g.flags.c_contiguous:
        b, c = g.shape[:2]
        p = g.size // max(b * c, 1)
        return (g.reshape(b * c, p) @ np.ones(p, dtype=g.dtype)).reshape(b, c).sum(axis=0)
    return g.sum(axis=(0,) + tuple(range(2, g.ndim)))


# ---------------------------------------------------------------------- channels-last convolution
# With groups 1 and many channels (the inner layers of a CNN), the convolution works on a
# channels-last copy of the padded input, `[B, *S', C]`, a run of whole images at a time
# (about CL_CHUNK_BYTES of columns), so that each run's passes stay in cache:
# - forward: the run's columns `[m, *out, *kernel, C]`, one copy of a strided window view in
#   which every run is a whole channel vector (whole `kernel_last * C` rows with stride and
#   dilation 1); the product `cols [m*P, K*C] @ w^T [K*C, O]`; its transposing copy (plus the
#   bias) into the NCHW output;
# - backward: the run's output gradient channels-last; its columns built again (cheaper than
#   keeping all of them: they would come back from memory, 18 MB on the 64 -> 64 benchmark
#   layer) for a partial weight gradient `cols^T @ g`, the partials summed in run order (the
#   same bits on any number of threads); the input gradient one kernel offset at a time,
#   `g [m*P, O] @ w_k [O, C]` added to its strided window of the run's padded input gradient,
#   every add moving whole channel vectors, then copied out to NCHW. The channel-major path's
#   col2im instead spreads one large column buffer in runs of one output row (11 floats).
# The runs are shared among the kernel threads, OpenBLAS held at one thread while they run (see
# `_cl_runs` for the one exception).


def _pad_cl(xa, pads):
    """[B, C, *S] as a C-contiguous channels-last [B, *S', C], zero-padded by (before, after)."""
    batch, c = xa.shape[:2]
    sizes = tuple(s + lo + hi for s, (lo, hi) in zip(xa.shape[2:], pads))
    padded = any(lo or hi for lo, hi in pads)
    out = (np.zeros if padded else np.empty)((batch,) + sizes + (c,), dtype=xa.dtype)
    inner = out[(slice(None),) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(xa.shape[2:], pads))]
    copy_into(inner, np.moveaxis(xa, 1, -1))
    return out


def _windows_cl(xpad, kernel, stride, dilation, out_sp):
    """The read-only window view [B, *out, *kernel, C] of a channels-last padded input:
    view[b, o, k, c] = xpad[b, o * s + k * d, c] (NumPy's `sliding_window_view` over each
    dilated kernel's extent, stepped by the stride and the dilation)."""
    n = len(kernel)
    extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilation))
    view = np.lib.stride_tricks.sliding_window_view(xpad, extent, axis=tuple(range(1, n + 1)))  # [B, *full, C, *extent]
    view = view[(slice(None),) + tuple(slice(0, o * s, s) for o, s in zip(out_sp, stride)) + (slice(None),)
                + tuple(slice(None, None, d) for d in dilation)]
    return np.moveaxis(view, n + 1, -1)


def _sum_in_order(partials, shape, dtype):
    """The runs' partial weight gradients added in run order (the same bits on any number of
    threads); zeros of `shape` when there were no runs (no images)."""
    if not partials:
        return np.zeros(shape, dtype=dtype)
    total = partials[0]
    for more in partials[1:]:
        total += more
    return total


def _cl_runs(batch, image_bytes, divisor=1):
    """Runs of whole images of about CL_CHUNK_BYTES / `divisor` of columns each (`image_bytes`
    per image), and whether they run whole in the calling thread.

    The runs are shared among the kernel threads, each making its own products with OpenBLAS
    held at one thread while they run (`threads.run_chunks(..., own_products=True)`). Only
    where BLAS has several threads whose count cannot be set do the runs grow 16x (the
    benchmark's 64 -> 64 layer in one run) and all run in the calling thread, BLAS splitting
    each product: kernel threads making products of their own would then compete with BLAS's
    threads, which spin between products."""
    whole = _threads.blas_threads() > 1 and not _threads.one_blas_thread_possible()
    target = CL_CHUNK_BYTES * (16 if whole else 1) // divisor
    nb = max(1, min(batch, target // max(1, image_bytes)))
    return whole, nb, [slice(lo, min(lo + nb, batch)) for lo in range(0, batch, nb)]


def _cl_run(whole, work, items):
    """`work(items)` here when the runs are whole, else the items shared among the kernel
    threads, each making its own products (`run_chunks(..., own_products=True)`)."""
    if whole:
        work(list(items))
    else:
        run_chunks(work, items, own_products=True)


# ---------------------------------------------------------------------- Winograd 3x3
# A 3x3 convolution with stride and dilation 1 that would run channels-last (groups 1, at least
# CL_MIN_CHANNELS channels in and out), in float32, runs as Winograd's F(2x2, 3x3) when the
# compiled kernels are there: 16 products [tiles, C] @ [C, O] (a tile: 2x2 outputs) instead of
# one [positions, 9 C] @ [9 C, O], 2.25x fewer multiplications, and no 9x column copy (the
# transforms are the compiled kernels `winograd_*` in `_kernels_conv`, which spell out the
# transform matrices). The runs of images, their threads and the order of the weight gradient's
# partial sums are those of the channels-last path (faster than that path from 16 channels:
# benchmarks/TUNING.md, "Winograd"). Results differ from the direct sum in the last
# bits only: the transforms' coefficients are 0, +-1 and +-1/2, each output a sum of 16 products
# instead of 9 (within 1e-6 of float64 relative to the largest output in the tests).
_WINOGRAD_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
_WINOGRAD_GG = np.kron(_WINOGRAD_G, _WINOGRAD_G)  # [16, 9]: U[4i+j] = sum G[i,a] G[j,b] w[3a+b]


def _winograd_fits(n, kernel, stride, dilation, dtype) -> bool:
    return (n == 2 and tuple(kernel) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)
            and dtype == np.float32)


def _winograd_weight(wa):
    """U = G w G^T for each output and input channel: [O, C, 3, 3] -> [16, O, C] (float64
    sums, then float32), the transform index 4 i + j first."""
    c_out, c_in = wa.shape[:2]
    u = _WINOGRAD_GG @ wa.reshape(c_out * c_in, 9).T.astype(np.float64)  # [16, O*C]
    return u.astype(np.float32).reshape(16, c_out, c_in)


def _winograd_weight_grad(du):
    """The weight transform's adjoint: dw = G^T dU G, [16, O, C] -> [O, C, 3, 3]."""
    c_out, c_in = du.shape[1:]
    dw = _WINOGRAD_GG.T @ du.reshape(16, c_out * c_in).astype(np.float64)  # [9, O*C]
    return np.ascontiguousarray(dw.T, dtype=np.float32).reshape(c_out, c_in, 3, 3)


def _conv_winograd(op, dev, x, weight, bias, inputs, pads, out_sp, kw):
    xa, wa = x._data, weight._data
    ba = bias._data if bias is not None else None
    batch, c_in = xa.shape[:2]
    c_out = wa.shape[0]
    oh, ow = out_sp
    th, tw = (oh + 1) // 2, (ow + 1) // 2  # 2x2 output tiles; the last row/column may be half
    tiles = th * tw
    dt = xa.dtype
    # the input padded channels-last, [B, 2 th + 2, 2 tw + 2, C], each run's images copied in the
    # run (`pad_channels_last`), with zero rows and columns below and right of the padding so that
    # every tile reads 4x4 (2 th + 2 >= OH + 2 = top + H + bottom)
    top, left = pads[0][0], pads[1][0]
    whole, nb, runs = _cl_runs(batch, 16 * tiles * (c_in + c_out) * dt.itemsize, _winograd_run_divisor())
    with dev.context():
        xa = np.ascontiguousarray(xa)
        padded_sp = (2 * th + 2, 2 * tw + 2)
        xpad = np.empty((batch,) + padded_sp + (c_in,), dtype=dt)  # filled run by run
        u = _winograd_weight(wa)  # [16, O, C]
        u_t = np.ascontiguousarray(u.transpose(0, 2, 1))  # [16, C, O]
        out = np.empty((batch, c_out, oh, ow), dtype=dt)
        bias_vec = ba if ba is not None else np.empty(0, dtype=dt)

        def buffers():
            """One thread's buffers: `tiled(m)` gives a run of m images' transformed input
            [16, m*tiles, C] and product [16, m*tiles, O] (views of buffers made once for the
            longest run), then the kernels' two scratch arrays."""
            v_buf = np.empty(16 * nb * tiles * c_in, dtype=dt)
            m_buf = np.empty(16 * nb * tiles * c_out, dtype=dt)

            def tiled(m):
                t = m * tiles
                return v_buf[: 16 * t * c_in].reshape(16, t, c_in), m_buf[: 16 * t * c_out].reshape(16, t, c_out)

            return tiled, np.empty((4, padded_sp[1] * c_in), dtype=dt), np.empty((12, c_out), dtype=dt)

        def forward(chunk):  # per run of images: its tiles' transforms, products, outputs, in cache
            tiled, rows, small = buffers()
            for bs in chunk:
                v, mm = tiled(bs.stop - bs.start)
                kw.pad_channels_last(xa[bs], top, left, xpad[bs])  # in the run: then in cache
                kw.winograd_input(xpad[bs], th, tw, v, rows)
                _threads.matmul(v, u_t, out=mm)
                kw.winograd_output(mm, bias_vec, out[bs], th, tw, small)

        _cl_run(whole, forward, runs)

    need_x = x._node is not None
    need_w = weight._node is not None
    need_b = bias is not None and bias._node is not None
    in_h, in_w = xa.shape[2:]
    if not need_w:
        xpad = None  # the weight gradient is the only user of the input

    def rule(g):
        with dev.context():
            g = np.ascontiguousarray(g, dtype=dt)
            gx = np.empty(xa.shape, dtype=dt) if need_x else None
            partial = [None] * len(runs)
            partial_b = [None] * len(runs)

            def backward(chunk):
                # per run of images: dM from the output gradient (and the bias's partial sum while
                # the run's gradient is in cache); the input's tiles again (cheaper than keeping
                # them) for a partial dU = dM^T V; dV = dM U into V's buffer, and its transform
                # added into the run's padded input gradient
                tiled, rows, small = buffers()
                gpad = np.empty((nb,) + padded_sp + (c_in,), dtype=dt) if need_x else None
                for i, bs in chunk:
                    m = bs.stop - bs.start
                    v, dm = tiled(m)
                    kw.winograd_output_grad(g[bs], th, tw, dm, small)
                    if need_b:
                        partial_b[i] = channel_sum(np, g[bs])
                    if need_w:
                        kw.winograd_input(xpad[bs], th, tw, v, rows)
                        partial[i] = _threads.matmul(dm.transpose(0, 2, 1), v)  # [16, O, C]
                    if need_x:
                        _threads.matmul(dm, u, out=v)  # dV
                        gp = gpad[:m]
                        gp[...] = 0
                        kw.winograd_input_grad(v, gp, th, tw, rows)
                        copy_into(gx[bs], np.moveaxis(gp[:, top:top + in_h, left:left + in_w], -1, 1))

            gw = gb = None
            ran = need_x or need_w  # the backward's runs run (and sum the bias's partials)
            if ran:
                _cl_run(whole, backward, list(enumerate(runs)))
            if need_w:
                gw = _winograd_weight_grad(_sum_in_order(partial, (16, c_out, c_in), dt))
            if need_b:
                gb = _sum_in_order(partial_b, (c_out,), dt) if ran else channel_sum(np, g)
        return (gx, gw) if bias is None else (gx, gw, gb)

    return record(out, dev, inputs, rule, op)


def _conv_cl(op, dev, x, weight, bias, inputs, kernel, stride, dilation, pads, out_sp):
    xa, wa = x._data, weight._data
    ba = bias._data if bias is not None else None
    n = len(kernel)
    batch, c_in = xa.shape[:2]
    c_out = wa.shape[0]
    ksize = int(np.prod(kernel))
    kc = ksize * c_in
    p = int(np.prod(out_sp))
    out_sp, kernel = tuple(out_sp), tuple(kernel)
    dt = xa.dtype
    whole, nb, runs = _cl_runs(batch, p * kc * dt.itemsize)
    with dev.context():
        xpad = _pad_cl(xa, pads)  # [B, *S', C]
        win = _windows_cl(xpad, kernel, stride, dilation, out_sp)  # [B, *out, *kernel, C], a view
        # the weight with its kernel axes before its input channels, as the columns: [O, K*C]
        w_t = np.ascontiguousarray(np.moveaxis(wa, 1, -1)).reshape(c_out, kc).T
        out = np.empty((batch, c_out, p), dtype=dt)
        bias_col = ba.reshape(c_out, 1) if ba is not None else None

        def forward(chunk):  # per run of images: its columns, product and NCHW output, in cache
            cols = np.empty((nb * p, kc), dtype=dt)
            res = np.empty((nb * p, c_out), dtype=dt)
            for bs in chunk:
                m = bs.stop - bs.start
                c = cols[: m * p]
                copy_into(c.reshape((m,) + out_sp + kernel + (c_in,)), win[bs])
                r = _threads.matmul(c, w_t, out=res[: m * p])
                src = r.reshape(m, p, c_out).swapaxes(1, 2)
                dst = out[bs]
                if bias_col is None:
                    copy_into(dst, src)
                else:
                    run_blocks(lambda i: np.add(src[i], bias_col, out=dst[i]), split(m, dst.nbytes))

        _cl_run(whole, forward, runs)
        out = out.reshape((batch, c_out) + out_sp)

    need_x = x._node is not None
    need_w = weight._node is not None
    need_b = bias is not None and bias._node is not None
    in_sp = xa.shape[2:]
    padded_sp = xpad.shape[1:-1]
    crop = tuple(slice(lo, lo + s) for s, (lo, _) in zip(in_sp, pads))
    windows = [sl for _, sl in window_slices(kernel, stride, dilation, out_sp)]
    if not need_w:
        del win  # the weight gradient is the only user of the input
    del xpad

    def rule(g):
        with dev.context():
            gx = gw = gb = None
            gdt = g.dtype
            # 2-d, float32, numba: one product g @ [O, K*C] for the run's column gradient, added
            # into the padded gradient by a compiled col2im in one pass (not K products and K
            # strided NumPy adds)
            kcol = _jit.kernels() if need_x and n == 2 and gdt == np.float32 else None
            if need_x:
                gx = np.empty(xa.shape, dtype=gdt)
                w_k = np.ascontiguousarray(np.moveaxis(wa.reshape(c_out, c_in, ksize), 2, 0))  # [K, O, C]
                w_all = np.ascontiguousarray(w_k.transpose(1, 0, 2).reshape(c_out, kc)) if kcol is not None else None
            partial = [None] * len(runs)

            def backward(chunk):
                # per run of images, everything in cache: the output gradient channels-last;
                # the columns again (cheaper than keeping them: they would be read back from
                # memory) for a partial weight gradient; the input gradient, one kernel
                # offset's product [m*P, O] @ [O, C] added to its window at a time
                gbuf = np.empty((nb * p, c_out), dtype=gdt)
                cols = np.empty((nb * p, kc), dtype=gdt) if need_w else None
                if not need_x:
                    prod = None
                elif kcol is None:  # one kernel offset's product at a time
                    prod = np.empty((nb * p, c_in), dtype=gdt)
                else:  # the column gradient: in the columns' buffer once the weight gradient has read it
                    prod = cols if need_w else np.empty((nb * p, kc), dtype=gdt)
                gpad = np.empty((nb,) + padded_sp + (c_in,), dtype=gdt) if need_x else None
                for i, bs in chunk:
                    m = bs.stop - bs.start
                    gm = gbuf[: m * p]
                    copy_into(gm.reshape((m,) + out_sp + (c_out,)), np.moveaxis(g[bs], 1, -1))
                    if need_w:
                        c = cols[: m * p]
                        copy_into(c.reshape((m,) + out_sp + kernel + (c_in,)), win[bs])
                        partial[i] = _threads.matmul(c.T, gm)  # [K*C, O]
                    if need_x:
                        gp = gpad[:m]
                        gp[...] = 0
                        pv = prod[: m * p]
                        if kcol is not None:
                            _threads.matmul(gm, w_all, out=pv)
                            kcol.col2im_add_2d(pv, gp, kernel, stride, dilation, out_sp)
                        else:
                            view = pv.reshape((m,) + out_sp + (c_in,))
                            for k, sl in enumerate(windows):
                                _threads.matmul(gm, w_k[k], out=pv)
                                gp[(slice(None),) + sl] += view
                        copy_into(gx[bs], np.moveaxis(gp[(slice(None),) + crop], -1, 1))

            if need_x or need_w:
                _cl_run(whole, backward, list(enumerate(runs)))
            if need_w:
                total = _sum_in_order(partial, (kc, c_out), gdt)
                gw = np.ascontiguousarray(np.moveaxis(total.reshape(kernel + (c_in, c_out)), (n + 1, n), (0, 1)))
            if need_b:
                gb = channel_sum(np, g)
        return (gx, gw) if bias is None else (gx, gw, gb)

    return record(out, dev, inputs, rule, op)


def transposed_product(xp) -> bool:
    """Whether the channel-major path forms its product transposed, cols^T @ w^T -> [G, B*P, M]:
    with several BLAS threads the long dimension B*P is then the product's rows, which OpenBLAS
    splits over its threads (the direct form, M = 64 rows by B*P = 7744 columns, was the slower
    at 2 threads on the benchmark's 64->64 layer: benchmarks/TUNING.md). On one thread the
    direct form and its copy of whole rows stay faster."""
    return xp is np and _threads.blas_threads() > 1


def convolve(op, n, dev, x, weight, bias, inputs, xa, groups, kernel, stride, dilation, pads, out_sp):
    """The convolution's output tensor (recorded with its backward) by the channels-last or the
    Winograd path, or None when neither applies (another array module, groups, a 1x1 kernel,
    fewer than CL_MIN_CHANNELS channels in or out): the caller's channel-major path runs."""
    c_in, c_out = xa.shape[1], weight.shape[0]
    if (dev.xp is not np or groups != 1 or min(c_in, c_out) < CL_MIN_CHANNELS
            or int(np.prod(kernel)) <= 1):
        return None
    if _winograd_fits(n, kernel, stride, dilation, xa.dtype):
        kw = _jit.kernels()
        if kw is not None:
            return _conv_winograd(op, dev, x, weight, bias, inputs, pads, out_sp, kw)
    return _conv_cl(op, dev, x, weight, bias, inputs, kernel, stride, dilation, pads, out_sp)
