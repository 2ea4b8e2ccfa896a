"""The numba kernels behind `engine.tensor.cpu.jit` (imported only through `jit.kernels()`).

Each function has one signature, compiled when this module is imported (or loaded from
numba's cache). All take C-contiguous float32 arrays whose shapes the caller has checked, and
write into arrays the caller made; none allocates. Loops are written so that LLVM vectorizes
them (no calls, no exceptions: `error_model="numpy"`); `fastmath` allows only contraction into
fused multiply-adds, and re-association where a kernel sums (its accumulators are float64).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ._kernels_base import _ELEMENTWISE, _OPTS, _SUMS, B2, D1, F1, F2, F3, R1, R2, R3, f32


@intrinsic
def _bits_as_float32(typingctx, v):
    """The int32 `v`'s bits read as a float32 (what `np.int32(v).view(np.float32)` gives)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _max_f32(typingctx, a, b):
    """max(a, b) of two float32s as LLVM's `maximum` (NaN when either is NaN, as np.max), with
    no preference between -0 and +0. A row's running max written with it is vectorized (8
    lanes); with Python's `max` (a compare and select) LLVM keeps a scalar chain, one compare's
    latency per element, several times slower (benchmarks/TUNING.md, `_max_f32`)."""
    sig = types.float32(types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
        fn = builder.module.declare_intrinsic("llvm.maximum", [ir.FloatType()], fnty)
        return builder.call(fn, args, fastmath=("nsz",))

    return sig, codegen


_LOG2E = f32(1.4426950408889634)
_LN2_HI = f32(0.693359375)  # ln 2 in two parts: n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = f32(-2.12194440e-4)
_EXP_MIN = f32(-87.33654)  # below, exp(x) < 2^-126: flushed to 0


@njit(inline="always", fastmath=_ELEMENTWISE, error_model="numpy")
def exp_nonpositive(x):
    """exp(x) of a float32 x <= 0 (NaN stays NaN, results below 2^-126 are 0): x = n ln 2 + r
    with |r| <= ln 2 / 2, exp(r) by Cephes' degree-6 polynomial (within ~1 ulp), times 2^n built
    from its exponent bits. No libm call, so the loops around it vectorize."""
    xc = max(x, _EXP_MIN)
    n = np.floor(xc * _LOG2E + f32(0.5))  # float32 (math.floor gives an int64: float64 arithmetic)
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = f32(1.9875691500e-4)
    p = p * r + f32(1.3981999507e-3)
    p = p * r + f32(8.3334519073e-3)
    p = p * r + f32(4.1665795894e-2)
    p = p * r + f32(1.6666665459e-1)
    p = p * r + f32(5.0000001201e-1)
    y = (p * r * r + r + f32(1.0)) * _bits_as_float32((np.int32(n) + np.int32(127)) << np.int32(23))
    if x < _EXP_MIN:
        y = f32(0.0)
    if x != x:
        y = x
    return y


@njit(types.void(R1, F1), fastmath=_ELEMENTWISE, **_OPTS)
def exp_nonpositive_array(x, out):
    """`out = exp(x)` for x <= 0 (the tests check `exp_nonpositive` through this)."""
    for i in range(x.size):
        out[i] = exp_nonpositive(x[i])


# ---------------------------------------------------------------------- SiLU
@njit(types.void(R1, F1, F1), fastmath=_ELEMENTWISE, **_OPTS)
def silu(x, out, der):
    """`out = x s(x)`, `der = s(x) (1 + x (1 - s(x)))` with s the sigmoid, in one pass: s from one
    `exp(-|x|)` (1 / (1 + e) where x >= 0, e / (1 + e) below: no overflow either side)."""
    for i in range(x.size):
        xi = x[i]
        e = exp_nonpositive(-abs(xi))
        d = f32(1.0) / (f32(1.0) + e)
        s = d if xi >= f32(0.0) else e * d
        out[i] = xi * s
        der[i] = s * (f32(1.0) + xi * (f32(1.0) - s))


# ---------------------------------------------------------------------- Gelu
@njit(types.void(R1, F1, F1, R1), fastmath=_ELEMENTWISE, **_OPTS)
def gelu(x, out, der, coef):
    """`out = x Phi(x)`, `der = Phi(x) + x phi(x)`: the arithmetic of `engine.tensor.cpu.activation._gelu_f32`
    in one pass, with its constants `coef` = (p, a1, ..., a5, the exponent's floor, 1/sqrt(2 pi))
    (Abramowitz & Stegun 7.1.26 folded: Phi(-|x|) = q(t) exp(-x^2 / 2), t = 1 / (1 + p |x|)).
    Where the exponent is under the floor (|x| > ~11) x phi(x) < 1e-25 counts as 0: x times the
    floor's exp grew with x (3494 at 1e30, inf at inf), and the derivative is Phi(x) alone."""
    p, a1, a2, a3, a4, a5, floor, inv_sqrt_2pi = (coef[0], coef[1], coef[2], coef[3], coef[4], coef[5],
                                                   coef[6], coef[7])
    for i in range(x.size):
        xi = x[i]
        z = f32(-0.5) * xi * xi
        e = exp_nonpositive(max(z, floor))  # exp(-x^2 / 2)
        t = f32(1.0) / (f32(1.0) + p * abs(xi))
        q = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t * e  # Phi(-|x|)
        ph = abs((f32(1.0) if xi >= f32(0.0) else f32(0.0)) - q)
        out[i] = xi * ph
        xt = f32(0.0) if z < floor else xi  # x phi(x) as 0 * e where the floor holds (the
        der[i] = ph + xt * e * inv_sqrt_2pi  # same contraction, and bits, as before elsewhere)


# ---------------------------------------------------------------------- layer norm over rows
@njit(types.void(R2, R1, R1, types.float64, F2, F2, F1), fastmath=_SUMS, **_OPTS)
def layer_norm(x, gamma, beta, eps, out, xhat, rstd):
    """Each row of x [R, P]: mean and biased variance (two passes, float64 sums), `xhat = (x -
    mean) * rstd`, `out = xhat * gamma + beta`. gamma / beta: [P], or empty for none."""
    rows, p = x.shape
    has_g, has_b = gamma.size > 0, beta.size > 0
    inv_p = 1.0 / p
    for r in range(rows):
        xr = x[r]
        s = 0.0
        for j in range(p):
            s += xr[j]
        mean = s * inv_p
        v = 0.0
        for j in range(p):
            d = xr[j] - mean
            v += d * d
        rs = f32(1.0 / math.sqrt(v * inv_p + eps))
        rstd[r] = rs
        m32 = f32(mean)
        hr, orow = xhat[r], out[r]
        for j in range(p):
            h = (xr[j] - m32) * rs
            hr[j] = h
            if has_g:
                h = h * gamma[j]
            if has_b:
                h = h + beta[j]
            orow[j] = h


@njit(types.void(R2, R2, R1, R1, F2, D1, D1), fastmath=_SUMS, **_OPTS)
def layer_norm_backward(g, xhat, rstd, gamma, gx, sum_g, sum_gxhat):
    """The backward of `layer_norm` over rows: `gx = rstd (gxh - mean(gxh) - xhat mean(gxh
    xhat))` with `gxh = g gamma` (gx: [R, P], or [0, P] when not wanted), and `sum_g += sum of
    g over the rows`, `sum_gxhat += sum of g xhat` (float64 [P] accumulators)."""
    rows, p = g.shape
    has_g = gamma.size > 0
    want_x = gx.shape[0] > 0
    inv_p = 1.0 / p
    for r in range(rows):
        gr, hr = g[r], xhat[r]
        for j in range(p):
            sum_g[j] += gr[j]
            sum_gxhat[j] += gr[j] * hr[j]
        if want_x:
            m1 = 0.0
            m2 = 0.0
            for j in range(p):
                a = gr[j] * gamma[j] if has_g else gr[j]
                m1 += a
                m2 += a * hr[j]
            c1, c2, rs = f32(m1 * inv_p), f32(m2 * inv_p), rstd[r]
            out = gx[r]
            for j in range(p):
                a = gr[j] * gamma[j] if has_g else gr[j]
                out[j] = (a - c1 - hr[j] * c2) * rs


@njit(types.void(R2, R1, types.float64, F2, F2, F1), fastmath=_SUMS, **_OPTS)
def rms_norm(x, gamma, eps, out, xhat, rstd):
    """Each row of x [R, P]: `rstd = 1 / sqrt(mean(x^2) + eps)` (a float64 sum), `xhat = x rstd`,
    `out = xhat * gamma` (gamma [P])."""
    rows, p = x.shape
    inv_p = 1.0 / p
    for r in range(rows):
        xr = x[r]
        v = 0.0
        for j in range(p):
            v += xr[j] * xr[j]
        rs = f32(1.0 / math.sqrt(v * inv_p + eps))
        rstd[r] = rs
        hr, orow = xhat[r], out[r]
        for j in range(p):
            h = xr[j] * rs
            hr[j] = h
            orow[j] = h * gamma[j]


@njit(types.void(R2, R2, R1, R1, F2, D1), fastmath=_SUMS, **_OPTS)
def rms_norm_backward(g, xhat, rstd, gamma, gx, sum_gxhat):
    """The backward of `rms_norm` over rows: `gx = rstd (gxh - xhat mean(gxh xhat))` with
    `gxh = g gamma` (gx: [R, P], or [0, P] when not wanted), and `sum_gxhat += sum of g xhat
    over the rows` (a float64 [P] accumulator: gamma's gradient)."""
    rows, p = g.shape
    want_x = gx.shape[0] > 0
    inv_p = 1.0 / p
    for r in range(rows):
        gr, hr = g[r], xhat[r]
        for j in range(p):
            sum_gxhat[j] += gr[j] * hr[j]
        if want_x:
            m2 = 0.0
            for j in range(p):
                m2 += gr[j] * gamma[j] * hr[j]
            c2, rs = f32(m2 * inv_p), rstd[r]
            out = gx[r]
            for j in range(p):
                out[j] = (gr[j] * gamma[j] - hr[j] * c2) * rs


# ---------------------------------------------------------------------- softmax rows
# _STORE_THEN_SUM: a loop that both stores into one array and sums into a scalar is vectorized
# by LLVM behind a run-time check that the arrays do not overlap, and where the output lies just
# past the end of the input (a few hundred bytes, as malloc often places them) the check fails
# and the scalar loop runs: the same numbers summed in another order, other last bits from one
# call to the next (a training step's gradients differed between two runs of one process). The
# kernels here store in one loop and sum in a second, read-only one, whose order is fixed.
_SUM_RUN = 512  # elements a float32 partial sum covers (in 8-lane vectors: 64 terms a lane)


@njit(types.void(R2, F2, F1, F1), fastmath=_SUMS, **_OPTS)
def shifted_exp_rows(x, e, m, s):
    """Each row of x [R, C]: `m = max`, `e = exp(x - m)`, `s = sum(e)` (float32 partial sums
    over runs of `_SUM_RUN`, added in float64: the float64 sum throughout cost 1.7x the time).
    The whole runs are loops of a fixed trip count, the row's remainder one loop after them:
    with the run's end computed per run (`min(lo + _SUM_RUN, c)`) LLVM vectorized the loop
    worse (benchmarks/TUNING.md, `shifted_exp_rows`). The exps
    are stored by one loop and summed by another (see `_STORE_THEN_SUM`)."""
    rows, c = x.shape
    whole = c // _SUM_RUN
    for r in range(rows):
        xr, er = x[r], e[r]
        mx = xr[0]
        for j in range(1, c):
            mx = _max_f32(mx, xr[j])
        tot = 0.0
        for b in range(whole):
            lo = b * _SUM_RUN
            for j in range(_SUM_RUN):
                er[lo + j] = exp_nonpositive(xr[lo + j] - mx)
            part = f32(0.0)  # float32 lanes over a run (vectorized), the runs summed in float64
            for j in range(_SUM_RUN):
                part += er[lo + j]
            tot += part
        for j in range(whole * _SUM_RUN, c):
            er[j] = exp_nonpositive(xr[j] - mx)
        part = f32(0.0)
        for j in range(whole * _SUM_RUN, c):
            part += er[j]
        m[r] = mx
        s[r] = f32(tot + part)


@njit(types.void(R2, R1, F2), fastmath=_ELEMENTWISE, **_OPTS)
def scale_rows(e, row, out):
    """`out = e * row[:, None]`."""
    rows, c = e.shape
    for r in range(rows):
        f, er, orow = row[r], e[r], out[r]
        for j in range(c):
            orow[j] = er[j] * f


# ---------------------------------------------------------------------- attention's softmax


@njit(types.void(F3, types.float32, B2, types.float32, types.boolean), fastmath=_SUMS, **_OPTS)
def attention_softmax(s, scale, masked, fill, quiet):
    """In place over the scores s [N, S1, S2] of N (batch, head) pairs: `v = s * scale`, or
    `fill` where `masked[i, j]` (one [S1, S2] mask for every pair, or [0, 0] for none), then
    each row's softmax (`quiet`: with an extra zero logit, Burn's quiet softmax)."""
    n, s1, s2 = s.shape
    has_mask = masked.shape[0] > 0
    for a in range(n):
        for i in range(s1):
            row = s[a, i]
            mx = f32(-np.inf)
            if has_mask:
                mrow = masked[i]
                for j in range(s2):
                    v = fill if mrow[j] else row[j] * scale
                    row[j] = v
                    mx = _max_f32(mx, v)
            else:
                for j in range(s2):
                    v = row[j] * scale
                    row[j] = v
                    mx = _max_f32(mx, v)
            if quiet:
                mx = max(mx, f32(0.0))
            tot = f32(0.0)
            for j in range(s2):
                e = exp_nonpositive(row[j] - mx)
                row[j] = e
                tot += e
            if quiet:
                tot += exp_nonpositive(-mx)
            for j in range(s2):
                row[j] = row[j] / tot


@njit(types.void(F3, R3, F2, types.boolean, B2), fastmath=_SUMS, **_OPTS)
def attention_softmax_backward(ds, w, d_rows, have_d, masked):
    """In place over ds [N, S1, S2], the gradient of the weights w: `ds = w * (ds - D)` with D
    each row's `sum(ds * w)` (or `d_rows` [N, S1] when `have_d`), 0 where `masked` ([S1, S2],
    or [0, 0] for none)."""
    n, s1, s2 = ds.shape
    has_mask = masked.shape[0] > 0
    for a in range(n):
        for i in range(s1):
            row, wr = ds[a, i], w[a, i]
            if have_d:
                dd = d_rows[a, i]
            else:
                acc = f32(0.0)
                for j in range(s2):
                    acc += row[j] * wr[j]
                dd = acc
            if has_mask:
                mrow = masked[i]
                for j in range(s2):
                    row[j] = f32(0.0) if mrow[j] else wr[j] * (row[j] - dd)
            else:
                for j in range(s2):
                    row[j] = wr[j] * (row[j] - dd)


# ---------------------------------------------------------------------- batch norm (per channel)
@njit(types.void(R3, R1, F3, F2), fastmath=_SUMS, **_OPTS)
def bn_centre(x, mean, xc, sq):
    """x [B, C, P]: `xc = x - mean[c]` and `sq[b, c] = sum over P of xc^2` (float64 sums; the
    store and the sum are two loops: `_STORE_THEN_SUM`)."""
    nb, c, p = x.shape
    for b in range(nb):
        for ch in range(c):
            xr, zr, m = x[b, ch], xc[b, ch], mean[ch]
            for j in range(p):
                zr[j] = xr[j] - m
            acc = 0.0
            for j in range(p):
                acc += zr[j] * zr[j]
            sq[b, ch] = f32(acc)


@njit(types.void(R3, R1, R1, F3), fastmath=_ELEMENTWISE, **_OPTS)
def bn_scale(xc, scale, shift, out):
    """`out = xc * scale[c] + shift[c]` (shift: [C], or empty for none)."""
    nb, c, p = xc.shape
    has_shift = shift.size > 0
    for b in range(nb):
        for ch in range(c):
            zr, orow, a = xc[b, ch], out[b, ch], scale[ch]
            if has_shift:
                t = shift[ch]
                for j in range(p):
                    orow[j] = zr[j] * a + t
            else:
                for j in range(p):
                    orow[j] = zr[j] * a


@njit(types.void(R3, R3, F2, F2), fastmath=_SUMS, **_OPTS)
def bn_reduce(g, xc, sums, dots):
    """`sums[b, c] = sum over P of g`, `dots[b, c] = sum of g * xc` (float64 sums)."""
    nb, c, p = g.shape
    for b in range(nb):
        for ch in range(c):
            gr, zr = g[b, ch], xc[b, ch]
            s1 = 0.0
            s2 = 0.0
            for j in range(p):
                s1 += gr[j]
                s2 += gr[j] * zr[j]
            sums[b, ch] = f32(s1)
            dots[b, ch] = f32(s2)


@njit(types.void(R3, R3, R1, R1, R1, F3), fastmath=_ELEMENTWISE, **_OPTS)
def bn_input_grad(g, xc, a, c1, c2, gx):
    """`gx = a[c] * g + c2[c] * xc + c1[c]`: batch norm's input gradient from per-channel terms."""
    nb, c, p = g.shape
    for b in range(nb):
        for ch in range(c):
            gr, zr, out = g[b, ch], xc[b, ch], gx[b, ch]
            ac, k1, k2 = a[ch], c1[ch], c2[ch]
            for j in range(p):
                out[j] = gr[j] * ac + zr[j] * k2 + k1


# ---------------------------------------------------------------------- relu's backward
@njit(types.void(R1, R1, F1), fastmath=_ELEMENTWISE, **_OPTS)
def relu_grad(g, o, out):
    """`out = g where o > 0, else 0` (NumPy: a bool pass over o, then a product)."""
    for i in range(g.size):
        out[i] = g[i] if o[i] > f32(0.0) else f32(0.0)


# ---------------------------------------------------------------------- Adam's update
@njit(types.void(R1, R1, F1, F1, F1, R1), **_OPTS)
def adam_update(param, grad, m, v, out, c):
    """One Adam step in one pass: `m`, `v` advanced in place, the new parameter into `out`, with
    `c` = (beta_1, 1 - beta_1, beta_2, 1 - beta_2, epsilon sqrt(1 - beta_2^t), -lr sqrt(1 -
    beta_2^t) / (1 - beta_1^t)) as float32. The same float32 operations in the same order as
    `engine.optim.adam`'s NumPy passes, with no contraction into fused multiply-adds, so the bits
    are those of the NumPy path."""
    b1, omb1, b2, omb2, eps, step = c[0], c[1], c[2], c[3], c[4], c[5]
    for i in range(param.size):
        g = grad[i]
        mi = m[i] * b1 + g * omb1
        vi = v[i] * b2 + (g * g) * omb2
        m[i] = mi
        v[i] = vi
        out[i] = (mi / (math.sqrt(vi) + eps)) * step + param[i]

# the convolution kernels live in their own file; importing them here compiles (or loads) them too
from ._kernels_conv import (  # noqa: E402,F401
    col2im_add_2d, pad_channels_last, winograd_input, winograd_input_grad, winograd_output, winograd_output_grad)
