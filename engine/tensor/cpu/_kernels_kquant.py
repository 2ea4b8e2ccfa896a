"""The numba kernels behind `engine.models.gguf_kquants`' scale searches (imported only through
`quant.kquant_kernels()`, after `jit.kernels()` said the compiled kernels run).

Each is its NumPy twin in `engine.models.gguf_kquants` (`_fit_min_scale_numpy`, `_fit_scale_numpy`) one sub-block
at a time, with the same float32 / float64 operations in the same order: the float32 sums by halves
(`_tree_sum`), the float64 error expanded as the twin writes it, no fastmath (no re-association, no
fused multiply-adds), so that the blocks written are bit for bit the NumPy path's
(tests/engine/models/test_gguf_kquants.py compares them). The float64 sums of each sub-block's
weights (sum w, sum w x, sum w x^2) come in from NumPy, computed there as the twin computes them.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types

f32 = np.float32
_OPTS = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}
R2 = types.Array(types.float32, 2, "C", readonly=True)
D1 = types.Array(types.float64, 1, "C", readonly=True)
F1 = types.Array(types.float32, 1, "C")


@njit(types.float32(types.float32[::1], types.int64), **_OPTS)
def _halves(t, n):
    """t[:n] (n a power of two) summed by halves, in place: `_tree_sum`'s order."""
    h = n // 2
    while h >= 1:
        for j in range(h):
            t[j] = t[j] + t[j + h]
        h //= 2
    return t[0]


@njit(types.float64(types.float64, types.float64, types.float64, types.float64, types.float64,
                    types.float64, types.float64, types.float64), **_OPTS)
def _error(s, m, sl, sl2, sxl, sum_w, sum_x, sum_x2):
    return s * s * sl2 + 2 * s * m * sl - 2 * s * sxl + m * m * sum_w - 2 * m * sum_x + sum_x2


@njit(types.void(R2, R2, D1, D1, D1, types.int64, types.float32, types.float32, types.int64, F1, F1), **_OPTS)
def fit_min_scale(x, w, sum_w, sum_x, sum_x2, nmax, rmin, rdelta, nstep, scale_out, min_out):
    """`_fit_min_scale_numpy` row by row: each row's scale and -min into `scale_out`, `min_out`."""
    n, k = x.shape
    shifted = np.empty(k, f32)
    a = np.empty(k, f32)
    b = np.empty(k, f32)
    c = np.empty(k, f32)
    top = f32(nmax)
    for r in range(n):
        lo = x[r, 0]
        hi = x[r, 0]
        for j in range(1, k):
            v = x[r, j]
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        if lo > f32(0):
            lo = f32(0)
        span = hi - lo
        flat = span <= f32(0)
        if flat:
            span = f32(1)
        for j in range(k):
            shifted[j] = x[r, j] - lo
        sw, sx, sx2 = sum_w[r], sum_x[r], sum_x2[r]
        iscale = top / span
        scale = np.float64(f32(1) / iscale)
        mn = np.float64(lo)
        best = 0.0
        for step in range(-1, nstep + 1):  # -1: the first grid (nmax / span) as it is, unrefined
            if step >= 0:
                iscale = (rmin + rdelta * f32(step) + top) / span
            for j in range(k):
                q = f32(np.rint(f32(iscale * shifted[j])))
                q = f32(0) if q < f32(0) else q
                q = top if q > top else q
                wq = w[r, j] * q
                a[j] = wq
                b[j] = wq * x[r, j]
                c[j] = wq * q
            sl = np.float64(_halves(a, k))
            sxl = np.float64(_halves(b, k))
            sl2 = np.float64(_halves(c, k))
            if step < 0:
                best = _error(scale, mn, sl, sl2, sxl, sw, sx, sx2)
                continue
            det = sw * sl2 - sl * sl
            s = (sw * sxl - sx * sl) / det
            m = (sl2 * sx - sl * sxl) / det
            if m > 0:
                s = sxl / sl2
                m = 0.0
            e = _error(s, m, sl, sl2, sxl, sw, sx, sx2)
            if det > 0 and e < best:
                best = e
                scale = s
                mn = m
        if flat:
            scale_out[r] = f32(0)
            min_out[r] = -lo
        else:
            scale_out[r] = f32(scale)
            min_out[r] = -f32(mn)


@njit(types.void(R2, types.int64, F1), **_OPTS)
def fit_scale(x, nmax, scale_out):
    """`_fit_scale_numpy` row by row: each row's scale into `scale_out`."""
    n, k = x.shape
    b = np.empty(k, f32)
    c = np.empty(k, f32)
    lo_q, hi_q = f32(-nmax), f32(nmax - 1)
    for r in range(n):
        at = 0
        big = abs(x[r, 0])
        for j in range(1, k):
            if abs(x[r, j]) > big:
                big = abs(x[r, j])
                at = j
        top = x[r, at]
        tiny = abs(top) < f32(1e-15)
        if tiny:
            top = f32(1)
        scale = f32(0)
        best = f32(0)
        for step in range(-10, 10):  # -10: the first grid (-nmax / top); then -9..-1, 1..9
            if step == 0:
                continue
            if step == -10:
                iscale = f32(-nmax) / top
            else:
                iscale = -(f32(nmax) + f32(0.1) * f32(step)) / top
            for j in range(k):
                v = x[r, j]
                q = f32(np.rint(f32(iscale * v)))
                q = lo_q if q < lo_q else q
                q = hi_q if q > hi_q else q
                wq = (v * v) * q
                b[j] = wq * v
                c[j] = wq * q
            sxl = _halves(b, k)
            sl2 = _halves(c, k)
            if step == -10:
                scale = sxl / sl2 if sl2 > f32(0) else f32(0)
                best = scale * sxl
            elif sl2 > f32(0) and sxl * sxl > best * sl2:
                scale = sxl / sl2
                best = scale * sxl
        scale_out[r] = f32(0) if tiny else scale
