"""The normalizations' CPU kernels: the reductions as matrix-vector products, batch norm a block
of images at a time over the kernel threads, and the compiled layer / RMS norms over rows.

The layers (`engine.nn`'s normalize and rms_norm) keep the autodiff: these functions take and
give arrays. `reduction_plan`, `sum_keep` and `dot_keep` work on any array module (CuPy's
arrays take the plain reduction); the others are for NumPy arrays only, and `layer_norm` /
`rms_norm` return None where they do not apply (the layer then runs its generic code).
"""
from __future__ import annotations

import numpy as np

from . import jit as _jit
from .threads import min_blocks, run_blocks, run_chunks

__all__ = ["reduction_plan", "keep_shape", "sum_keep", "dot_keep", "batch_norm_forward", "batch_norm_backward",
           "strip_ones", "layer_norm", "rms_norm", "BN_BLOCK_BYTES", "ROW_BLOCK"]


def reduction_plan(shape, axes):
    """How to reduce `axes` of an array of `shape` with matrix-vector products.

    ("rows", R, P): the axes are the trailing ones, each of R rows sums P contiguous values;
    ("bn", B, C, P): all axes but 1 (batch norm's per-channel statistics); None: neither.
    """
    nd = len(shape)
    ax = tuple(sorted(a % nd for a in axes))
    if ax == tuple(range(nd - len(ax), nd)) and len(ax) < nd:
        return ("rows", int(np.prod(shape[: nd - len(ax)])), int(np.prod(shape[nd - len(ax):])))
    if nd >= 2 and ax == (0,) + tuple(range(2, nd)):
        return ("bn", shape[0], shape[1], int(np.prod(shape[2:])))
    return None


def keep_shape(shape, axes):
    nd = len(shape)
    red = {a % nd for a in axes}
    return tuple(1 if i in red else n for i, n in enumerate(shape))


def sum_keep(a, axes, plan):
    """`a.sum(axes, keepdims=True)`; on NumPy as one BLAS matrix-vector product per call
    (several times faster than NumPy's reduction over non-trailing axes)."""
    if plan is None or not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        return a.sum(axis=axes, keepdims=True)
    keep = keep_shape(a.shape, axes)
    if plan[0] == "rows":
        _, r, p = plan
        return (a.reshape(r, p) @ np.ones(p, dtype=a.dtype)).reshape(keep)
    _, b, c, p = plan
    return (a.reshape(b * c, p) @ np.ones(p, dtype=a.dtype)).reshape(b, c).sum(axis=0).reshape(keep)


def dot_keep(a, b_, axes, plan):
    """`(a * b_).sum(axes, keepdims=True)` without the full-size product on NumPy."""
    if (plan is None or not isinstance(a, np.ndarray) or not a.flags.c_contiguous
            or not b_.flags.c_contiguous or a.shape != b_.shape):
        return (a * b_).sum(axis=axes, keepdims=True)
    keep = keep_shape(a.shape, axes)
    if plan[0] == "rows":
        _, r, p = plan
        return np.vecdot(a.reshape(r, p), b_.reshape(r, p)).reshape(keep)
    _, b, c, p = plan
    return np.vecdot(a.reshape(b * c, p), b_.reshape(b * c, p)).reshape(b, c).sum(axis=0).reshape(keep)


# bytes of one block of images for the blocked batch norm passes (about half an L2 cache):
# the passes over a block find it in cache instead of streaming the whole tensor each time
BN_BLOCK_BYTES = 1 << 19


def _bn_blocks(b, c, p, itemsize):
    step = max(1, BN_BLOCK_BYTES // max(c * p * itemsize, 1))
    return [slice(lo, min(lo + step, b)) for lo in range(0, b, step)]


def batch_norm_forward(xd, axes, plan, inv_n, eps, gd, bd):
    """Batch statistics and `xc * (gamma * rstd) + beta` of a C-contiguous NumPy `[B, C, ...]`,
    a block of images at a time. Returns mean, var, rstd (reduced axes kept), the output and
    the centred input xc."""
    _, b, c, p = plan
    keep = keep_shape(xd.shape, axes)
    mean = sum_keep(xd, axes, plan)
    mean *= inv_n
    x3, m3 = xd.reshape(b, c, p), mean.reshape(1, c, 1)
    xc = np.empty_like(xd)
    xc3 = xc.reshape(b, c, p)
    sq = np.empty((b, c), dtype=xd.dtype)
    blocks = _bn_blocks(b, c, p, xd.itemsize)

    k = _jit.kernels() if xd.dtype == np.float32 else None
    if k is not None:  # one pass a block: the centred input and its squares' sums
        m1 = np.ascontiguousarray(mean, dtype=np.float32).reshape(-1)

        def centre(s):
            k.bn_centre(x3[s], m1, xc3[s], sq[s])
    else:
        def centre(s):
            np.subtract(x3[s], m3, out=xc3[s])
            sq[s] = np.vecdot(xc3[s], xc3[s])

    run_blocks(centre, blocks)
    var = sq.sum(axis=0).reshape(keep)
    var *= inv_n
    rstd = (1.0 / np.sqrt(var + eps)).astype(xd.dtype, copy=False)
    scale3 = (gd * rstd).astype(xd.dtype, copy=False).reshape(1, c, 1)
    shift3 = bd.reshape(1, c, 1) if bd is not None else None
    out = np.empty_like(xd)
    o3 = out.reshape(b, c, p)

    if k is not None:
        scale1 = np.ascontiguousarray(scale3, dtype=np.float32).reshape(-1)
        shift1 = (np.ascontiguousarray(shift3, dtype=np.float32).reshape(-1) if shift3 is not None
                  else np.empty(0, np.float32))

        def scale(s):
            k.bn_scale(xc3[s], scale1, shift1, o3[s])
    else:
        def scale(s):
            np.multiply(xc3[s], scale3, out=o3[s])
            if shift3 is not None:
                o3[s] += shift3

    run_blocks(scale, blocks)
    return mean, var, rstd, out, xc


def batch_norm_backward(g, xc, plan, axes, inv_n, gd, rstd, need_x):
    """`batch_norm_forward`'s backward, a block of images at a time: the input gradient
    `a * g + c1 + c2 * xc` (None unless `need_x`), sum(g) and sum(g * xhat) (reduced axes kept)."""
    _, b, c, p = plan
    keep = keep_shape(xc.shape, axes)
    g = np.ascontiguousarray(g)
    g3, z3 = g.reshape(b, c, p), xc.reshape(b, c, p)
    ones = np.ones(p, dtype=g.dtype)
    sums = np.empty((b, c), dtype=g.dtype)
    dots = np.empty((b, c), dtype=g.dtype)
    blocks = _bn_blocks(b, c, p, g.itemsize)

    k = _jit.kernels() if g.dtype == np.float32 and xc.dtype == np.float32 else None

    def reduce(s):  # NumPy's own loops: BLAS called from two threads at once takes turns
        if k is not None:  # g and xc read once
            k.bn_reduce(g3[s], z3[s], sums[s], dots[s])
            return
        sums[s] = np.vecdot(g3[s], ones)
        dots[s] = np.vecdot(g3[s], z3[s])

    run_blocks(reduce, blocks)
    sg = sums.sum(axis=0).reshape(keep)
    sgx = dots.sum(axis=0).reshape(keep) * rstd  # sum(g * xhat)
    if not need_x:
        return None, sg, sgx
    a = gd * rstd
    a3 = a.astype(g.dtype, copy=False).reshape(1, c, 1)
    c1 = ((a * sg) * -inv_n).astype(g.dtype, copy=False).reshape(1, c, 1)
    c2 = ((a * sgx * rstd) * -inv_n).astype(g.dtype, copy=False).reshape(1, c, 1)
    gx = np.empty_like(g)
    gx3 = gx.reshape(b, c, p)

    if k is not None:  # one pass a block instead of four
        a1, k1, k2 = (np.ascontiguousarray(v, dtype=np.float32).reshape(-1) for v in (a3, c1, c2))

        def compiled(chunk):
            for s in chunk:
                k.bn_input_grad(g3[s], z3[s], a1, k1, k2, gx3[s])

        run_chunks(compiled, blocks)
        return gx, sg, sgx

    longest = max(s.stop - s.start for s in blocks)

    def input_grad(chunk):  # the blocks one thread takes, with its own block-sized scratch
        tmp = np.empty((longest, c, p), dtype=g.dtype)
        for s in chunk:
            out = gx3[s]
            t = tmp[: out.shape[0]]
            np.multiply(g3[s], a3, out=out)
            np.multiply(z3[s], c2, out=t)
            out += t
            out += c1

    run_chunks(input_grad, blocks)
    return gx, sg, sgx


# elements of one block of rows in the compiled layer / RMS norms: a block stays in a core's L2
# cache between the statistics and the output
ROW_BLOCK = 1 << 15


def strip_ones(shape) -> tuple:
    """`shape` without its leading 1s."""
    dims = tuple(shape)
    while dims and dims[0] == 1:
        dims = dims[1:]
    return dims


def _per_row_affine(a, row_shape) -> np.ndarray | None:
    """gamma / beta (an array, or None) as one float32 value per element of a row (empty for
    None), or None when it does not vary over the normalized trailing axes alone (then the
    compiled norms do not apply)."""
    if a is None:
        return np.empty(0, np.float32)
    if a.dtype != np.float32 or strip_ones(a.shape) != strip_ones(row_shape):
        return None
    return np.ascontiguousarray(a).reshape(-1)


def _row_norm_buffers(r: int, p: int):
    """The compiled layer / RMS norms' outputs for r rows of p: `out`, `xhat` [r, p], `rstd` [r],
    the row blocks (about `ROW_BLOCK` elements each) and how many of them go to the threads."""
    out, xhat = np.empty((r, p), np.float32), np.empty((r, p), np.float32)
    per = max(1, ROW_BLOCK // p)
    blocks = [slice(lo, min(lo + per, r)) for lo in range(0, r, per)]
    return out, xhat, np.empty(r, np.float32), blocks, min_blocks(per * p * 4)


def layer_norm(xd, r: int, p: int, row_shape, gamma, beta, eps: float):
    """Layer norm of the float32 NumPy array `xd` as r rows of p (its trailing axes, of shape
    `row_shape`) with the compiled kernels: one pass for the statistics and output, one for the
    whole backward. `gamma`, `beta`: arrays or None. Returns `(out, backward)`, out of xd's
    shape and `backward(g, need_x) -> (gx [r, p] or None, sum(g) [p], sum(g * xhat) [p])` (the
    sums in float64), or None when the kernels do not apply (another dtype, array module or
    layout, no numba, gamma / beta over other axes)."""
    if (not isinstance(xd, np.ndarray) or xd.dtype != np.float32 or not xd.flags.c_contiguous
            or r == 0 or p == 0):
        return None
    k = _jit.kernels()
    if k is None:
        return None
    gd, bd = _per_row_affine(gamma, row_shape), _per_row_affine(beta, row_shape)
    if gd is None or bd is None:
        return None
    x2 = xd.reshape(r, p)
    out, xhat, rstd, blocks, least = _row_norm_buffers(r, p)
    e = float(eps)

    def forward(run):
        for b in run:
            k.layer_norm(x2[b], gd, bd, e, out[b], xhat[b], rstd[b])

    run_chunks(forward, blocks, min_blocks=least)

    def backward(g, need_x):
        g2 = np.ascontiguousarray(g, dtype=np.float32).reshape(r, p)
        gx = np.empty_like(g2) if need_x else np.empty((0, p), np.float32)
        sums = np.zeros((len(blocks), 2, p), np.float64)  # per block: fixed bits whoever runs it

        def run_backward(run):
            for i in run:
                b = blocks[i]
                k.layer_norm_backward(g2[b], xhat[b], rstd[b], gd, gx[b] if need_x else gx, sums[i, 0], sums[i, 1])

        run_chunks(run_backward, range(len(blocks)), min_blocks=least)
        total = sums.sum(axis=0)
        return (gx if need_x else None), total[0], total[1]

    return out.reshape(xd.shape), backward


def rms_norm(xd, gamma, eps: float):
    """RMS norm over the last axis of the float32 NumPy array `xd` with the compiled kernels (as
    `layer_norm`). Returns `(out, backward)`, `backward(g, need_x) -> (gx [r, p] or None,
    sum(g * xhat) [p] in float64)`, or None when they do not apply (another dtype, array module
    or layout, no numba, a gamma not of the last axis's size)."""
    if (not isinstance(xd, np.ndarray) or xd.dtype != np.float32 or not xd.flags.c_contiguous
            or xd.ndim == 0 or xd.size == 0):
        return None
    k = _jit.kernels()
    if k is None:
        return None
    p = xd.shape[-1]
    gd = _per_row_affine(gamma, (p,))
    if gd is None:
        return None
    r = xd.size // p
    x2 = xd.reshape(r, p)
    out, xhat, rstd, blocks, least = _row_norm_buffers(r, p)
    e = float(eps)

    def forward(run):
        for b in run:
            k.rms_norm(x2[b], gd, e, out[b], xhat[b], rstd[b])

    run_chunks(forward, blocks, min_blocks=least)

    def backward(g, need_x):
        g2 = np.ascontiguousarray(g, dtype=np.float32).reshape(r, p)
        gx = np.empty_like(g2) if need_x else np.empty((0, p), np.float32)
        sums = np.zeros((len(blocks), p), np.float64)  # per block: fixed bits whoever runs it

        def run_backward(run):
            for i in run:
                b = blocks[i]
                k.rms_norm_backward(g2[b], xhat[b], rstd[b], gd, gx[b] if need_x else gx, sums[i])

        run_chunks(run_backward, range(len(blocks)), min_blocks=least)
        return (gx if need_x else None), sums.sum(axis=0)

    return out.reshape(xd.shape), backward
