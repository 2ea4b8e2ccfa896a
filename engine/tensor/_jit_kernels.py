"""The numba kernels behind `engine.tensor.jit` (imported only through `jit.kernels()`).

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

f32 = np.float32
_ELEMENTWISE = {"contract"}
_SUMS = {"contract", "reassoc"}
_OPTS = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}

F1 = types.Array(types.float32, 1, "C")
F2 = types.Array(types.float32, 2, "C")
D1 = types.Array(types.float64, 1, "C")
R1 = types.Array(types.float32, 1, "C", readonly=True)  # inputs: read-only arrays match too (a
R2 = types.Array(types.float32, 2, "C", readonly=True)  # writable one converts to these types)


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
    latency per element: a [1024, 32000] row max took 43 ms instead of 8.7 (Intel Xeon, 1 thread)."""
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
    """`out = x Phi(x)`, `der = Phi(x) + x phi(x)`: the arithmetic of `engine.nn._ops._gelu_f32`
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
    worse, and a [1024, 32000] call took 44 ms instead of 27 (Intel Xeon, 1 thread). The exps
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
B2 = types.Array(types.boolean, 2, "C", readonly=True)
F3 = types.Array(types.float32, 3, "C")
R3 = types.Array(types.float32, 3, "C", readonly=True)


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


# ---------------------------------------------------------------------- channels-last col2im
F4 = types.Array(types.float32, 4, "C")
I2 = types.UniTuple(types.int64, 2)


@njit(types.void(R2, F4, I2, I2, I2, I2), fastmath=_ELEMENTWISE, **_OPTS)
def col2im_add_2d(cols, gpad, kernel, stride, dilation, out):
    """The 2-d convolution's input gradient from its column gradient: cols [m * OH * OW, KH * KW
    * C] (rows by image and output position, columns by kernel offset then channel) added into
    the channels-last padded gradient gpad [m, H', W', C] at `o * stride + k * dilation`."""
    m, c = gpad.shape[0], gpad.shape[3]
    kh, kw = kernel
    sy, sx = stride
    dy, dx = dilation
    oh, ow = out
    for b in range(m):
        for oy in range(oh):
            for ox in range(ow):
                row = cols[(b * oh + oy) * ow + ox]
                for ky in range(kh):
                    iy = oy * sy + ky * dy
                    for kx in range(kw):
                        dst = gpad[b, iy, ox * sx + kx * dx]
                        base = (ky * kw + kx) * c
                        for ch in range(c):
                            dst[ch] += row[base + ch]


# ---------------------------------------------------------------------- Winograd F(2x2, 3x3)
# The 3x3, stride-1 convolution by Lavin & Gray's minimal filtering: each 4x4 input tile d and
# each weight g [3, 3] are transformed, V = B^T d B and U = G g G^T (`ops_conv` makes U), the
# products summed over input channels are 16 matrix products M[xi] = V[xi] @ U[xi] (tiles by
# input channels, times input by output channels), and each tile's 2x2 output is A^T M A, with
#     B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
#     G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
#     A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
# The backward kernels are these transforms' adjoints (dM = A dY A^T, dd = B dV B^T), so the
# gradients are exactly those of the computation the forward made.
# Layout: the transformed arrays are [16, tiles, channels], xi = 4 i + j, tiles numbered image,
# tile row, tile column (each xi one matrix of the 16 products). Every loop that vectorizes runs
# over channels (or a whole channels-last row) with at most three loads and one store, so LLVM
# vectorizes it with a few overlap checks (a loop with 16 loads and 16 stores needs too many and
# stays scalar: 2.4x slower); intermediate rows go to a small scratch array the caller gives.
# Indices are unsigned, so numba adds no negative-index wraparound to them (with it, 4-5x slower).
R4 = types.Array(types.float32, 4, "C", readonly=True)
_u = np.uint64


@njit(inline="always")
def _dims4(a):
    """A 4-d array's sizes as unsigned ints."""
    return _u(a.shape[0]), _u(a.shape[1]), _u(a.shape[2]), _u(a.shape[3])


@njit(inline="always")
def _image_tiling(img, tiled, th, tw):
    """The geometry the input transform and its adjoint share, for a channels-last image array
    [m, H', W', C] and its tiles' array [16, tiles, C]: (m, H', C, th, tw, one image row's
    length W' C, one xi's matrix length tiles C), unsigned."""
    m, hp, wp, c = _dims4(img)
    return m, hp, c, _u(th), _u(tw), wp * c, _u(tiled.shape[1]) * c


@njit(inline="always")
def _tile_rows(b, hp, ti, rs):
    """Where the four channels-last image rows of image b's tile row ti start (rows of rs values)."""
    i0 = (b * hp + _u(2) * ti) * rs
    return i0, i0 + rs, i0 + _u(2) * rs, i0 + _u(3) * rs


@njit(inline="always")
def _tile_columns(r, rs, tj, c):
    """Where tile column tj's four columns of scratch row r start (rows of rs values, C a column)."""
    s0 = r * rs + _u(2) * tj * c
    return s0, s0 + c, s0 + _u(2) * c, s0 + _u(3) * c


@njit(types.void(R4, types.int64, types.int64, F4), **_OPTS)
def pad_channels_last(x, top, left, dst):
    """dst [m, H', W', C] = x [m, C, H, W] (NCHW) moved channels-last, image rows from row `top`
    and columns from column `left` of dst, zeros around them (H' >= top + H, W' >= left + W):
    the Winograd input's padded channels-last copy, one run of images at a time. The source is
    read in order, one channel's plane after another (with one image row of every channel at a
    time instead, the reads hop between C planes: 3x slower when x is not in cache); the writes
    stay within the image's [H', W', C], which is in cache."""
    m, c, h, w = _dims4(x)
    hp, wp = _u(dst.shape[1]), _u(dst.shape[2])
    t0, l0 = _u(top), _u(left)
    xf = x.reshape(x.size)
    df = dst.reshape(dst.size)
    plane = h * w
    rs = wp * c
    for b in range(m):
        base = b * hp * rs
        for y in range(hp):
            d = base + y * rs
            if y < t0 or y >= t0 + h:
                for k in range(rs):
                    df[d + k] = f32(0.0)
                continue
            for k in range(l0 * c):
                df[d + k] = f32(0.0)
            for k in range((l0 + w) * c, rs):
                df[d + k] = f32(0.0)
        for ch in range(c):
            s = (b * c + ch) * plane
            for y in range(h):
                e = base + (y + t0) * rs + l0 * c + ch
                r = s + y * w
                for xx in range(w):
                    df[e + xx * c] = xf[r + xx]


@njit(types.void(R4, types.int64, types.int64, F3, F2), fastmath=_ELEMENTWISE, **_OPTS)
def winograd_input(x, th, tw, v, scratch):
    """V = B^T d B for the tiles of a channels-last input x [m, H', W', C] (H' >= 2 th + 2,
    W' >= 2 tw + 2; tile (i, j) reads rows 2i..2i+3, columns 2j..2j+3) into v [16, m*th*tw, C].
    scratch: [4, W' * C]."""
    m, hp, c, nth, ntw, rs, sx = _image_tiling(x, v, th, tw)
    xf = x.reshape(x.size)
    vf = v.reshape(v.size)
    tf = scratch.reshape(scratch.size)
    two, three = _u(2), _u(3)
    for b in range(m):
        for ti in range(nth):
            # B^T d over the tile row's four input rows, whole rows at a time
            i0, i1, i2, i3 = _tile_rows(b, hp, ti, rs)
            for k in range(rs):
                tf[k] = xf[i0 + k] - xf[i2 + k]
            for k in range(rs):
                tf[rs + k] = xf[i1 + k] + xf[i2 + k]
            for k in range(rs):
                tf[two * rs + k] = xf[i2 + k] - xf[i1 + k]
            for k in range(rs):
                tf[three * rs + k] = xf[i1 + k] - xf[i3 + k]
            # (...) B across each tile's four columns
            for tj in range(ntw):
                t = ((b * nth + ti) * ntw + tj) * c
                for r in range(_u(4)):
                    s0, s1, s2, s3 = _tile_columns(r, rs, tj, c)
                    d = r * _u(4) * sx + t
                    for ch in range(c):
                        vf[d + ch] = tf[s0 + ch] - tf[s2 + ch]
                    d += sx
                    for ch in range(c):
                        vf[d + ch] = tf[s1 + ch] + tf[s2 + ch]
                    d += sx
                    for ch in range(c):
                        vf[d + ch] = tf[s2 + ch] - tf[s1 + ch]
                    d += sx
                    for ch in range(c):
                        vf[d + ch] = tf[s1 + ch] - tf[s3 + ch]


@njit(types.void(R3, R1, F4, types.int64, types.int64, F2), fastmath=_ELEMENTWISE, **_OPTS)
def winograd_output(mm, bias, out, th, tw, scratch):
    """Each tile's A^T M A (plus bias[o] when bias has the O entries; an empty bias adds none)
    from mm [16, m*th*tw, O] into out [m, O, OH, OW] (NCHW), the positions past OH / OW dropped.
    scratch: [12, O]."""
    m, o_n, oh, ow = _dims4(out)
    nth, ntw = _u(th), _u(tw)
    have_bias = bias.shape[0] == out.shape[1]
    mf = mm.reshape(mm.size)
    of = out.reshape(out.size)
    sf = scratch.reshape(scratch.size)
    sx = _u(mm.shape[1]) * o_n
    plane = oh * ow
    one, two = _u(1), _u(2)
    for b in range(m):
        for ti in range(nth):
            y = two * ti
            row2 = y + one < oh
            for tj in range(ntw):
                xx = two * tj
                col2 = xx + one < ow
                t = ((b * nth + ti) * ntw + tj) * o_n
                # each row's two sums (M A): scratch rows 2 i, 2 i + 1
                for i in range(_u(4)):
                    k0 = _u(4) * i * sx + t
                    k1 = k0 + sx
                    k2 = k1 + sx
                    k3 = k2 + sx
                    d = two * i * o_n
                    for o in range(o_n):
                        sf[d + o] = mf[k0 + o] + mf[k1 + o] + mf[k2 + o]
                    d += o_n
                    for o in range(o_n):
                        sf[d + o] = mf[k1 + o] - mf[k2 + o] - mf[k3 + o]
                # the rows' (A^T ...): scratch rows 8..11 = y00, y01, y10, y11
                e = _u(8) * o_n
                for o in range(o_n):
                    sf[e + o] = sf[o] + sf[two * o_n + o] + sf[_u(4) * o_n + o]
                for o in range(o_n):
                    sf[e + o_n + o] = sf[o_n + o] + sf[_u(3) * o_n + o] + sf[_u(5) * o_n + o]
                for o in range(o_n):
                    sf[e + two * o_n + o] = sf[two * o_n + o] - sf[_u(4) * o_n + o] - sf[_u(6) * o_n + o]
                for o in range(o_n):
                    sf[e + _u(3) * o_n + o] = sf[_u(3) * o_n + o] - sf[_u(5) * o_n + o] - sf[_u(7) * o_n + o]
                # scattered into NCHW
                dst = b * o_n * plane + y * ow + xx
                for o in range(o_n):
                    add = bias[o] if have_bias else f32(0.0)
                    dd = dst + o * plane
                    of[dd] = sf[e + o] + add
                    if col2:
                        of[dd + one] = sf[e + o_n + o] + add
                    if row2:
                        of[dd + ow] = sf[e + two * o_n + o] + add
                        if col2:
                            of[dd + ow + one] = sf[e + _u(3) * o_n + o] + add


@njit(types.void(R4, types.int64, types.int64, F3, F2), fastmath=_ELEMENTWISE, **_OPTS)
def winograd_output_grad(g, th, tw, dm, scratch):
    """dM = A dY A^T for each tile's 2x2 output gradient dY (zero past OH / OW) from g [m, O, OH,
    OW] (NCHW) into dm [16, m*th*tw, O]: the output transform's adjoint. scratch: [12, O]."""
    m, o_n, oh, ow = _dims4(g)
    nth, ntw = _u(th), _u(tw)
    gf = g.reshape(g.size)
    df = dm.reshape(dm.size)
    sf = scratch.reshape(scratch.size)
    sx = _u(dm.shape[1]) * o_n
    plane = oh * ow
    one, two, three = _u(1), _u(2), _u(3)
    for b in range(m):
        for ti in range(nth):
            y = two * ti
            row2 = y + one < oh
            # past the edge: read an element inside and weigh it 0
            dy = ow if row2 else _u(0)
            fy = f32(1.0) if row2 else f32(0.0)
            for tj in range(ntw):
                xx = two * tj
                col2 = xx + one < ow
                dx = one if col2 else _u(0)
                fx = f32(1.0) if col2 else f32(0.0)
                src = b * o_n * plane + y * ow + xx
                # gathered from NCHW: scratch rows 0..3 = y00, y01, y10, y11
                for o in range(o_n):
                    q = src + o * plane
                    sf[o] = gf[q]
                    sf[o_n + o] = gf[q + dx] * fx
                    sf[two * o_n + o] = gf[q + dy] * fy
                    sf[three * o_n + o] = gf[q + dy + dx] * (fx * fy)
                # each row's dY A^T, (y0, y0 + y1, y0 - y1, -y1): scratch rows 4..7 and 8..11
                for r in range(two):
                    a = two * r * o_n
                    e = (_u(4) + _u(4) * r) * o_n
                    for o in range(o_n):
                        sf[e + o] = sf[a + o]
                    for o in range(o_n):
                        sf[e + o_n + o] = sf[a + o] + sf[a + o_n + o]
                    for o in range(o_n):
                        sf[e + two * o_n + o] = sf[a + o] - sf[a + o_n + o]
                    for o in range(o_n):
                        sf[e + three * o_n + o] = -sf[a + o_n + o]
                # then A (...) across the rows: dM rows (u, u + w, u - w, -w)
                t = ((b * nth + ti) * ntw + tj) * o_n
                for j in range(_u(4)):
                    uo = (_u(4) + j) * o_n
                    wo = (_u(8) + j) * o_n
                    d = j * sx + t
                    for o in range(o_n):
                        df[d + o] = sf[uo + o]
                    d += _u(4) * sx
                    for o in range(o_n):
                        df[d + o] = sf[uo + o] + sf[wo + o]
                    d += _u(4) * sx
                    for o in range(o_n):
                        df[d + o] = sf[uo + o] - sf[wo + o]
                    d += _u(4) * sx
                    for o in range(o_n):
                        df[d + o] = -sf[wo + o]


@njit(types.void(R3, F4, types.int64, types.int64, F2), fastmath=_ELEMENTWISE, **_OPTS)
def winograd_input_grad(dv, gx, th, tw, scratch):
    """dd = B dV B^T for each tile from dv [16, m*th*tw, C], added into the channels-last input
    gradient gx [m, H', W', C] at the tile's 4x4 window: the input transform's adjoint, its two
    stages in reverse (each tile row's column stage summed into scratch [4, W' * C], then the
    rows added into gx; neighbouring windows overlap, so tiles are added in order)."""
    m, hp, c, nth, ntw, rs, sx = _image_tiling(gx, dv, th, tw)
    vf = dv.reshape(dv.size)
    gf = gx.reshape(gx.size)
    tf = scratch.reshape(scratch.size)
    two, three = _u(2), _u(3)
    for b in range(m):
        for ti in range(nth):
            for k in range(_u(4) * rs):
                tf[k] = f32(0.0)
            # the column stage's adjoint, (e0, e1 - e2 + e3, e1 + e2 - e0, -e3), for each row r
            for tj in range(ntw):
                t = ((b * nth + ti) * ntw + tj) * c
                for r in range(_u(4)):
                    s0, s1, s2, s3 = _tile_columns(r, rs, tj, c)
                    e0 = r * _u(4) * sx + t
                    e1 = e0 + sx
                    e2 = e1 + sx
                    e3 = e2 + sx
                    for ch in range(c):
                        tf[s0 + ch] += vf[e0 + ch]
                    for ch in range(c):
                        tf[s1 + ch] += vf[e1 + ch] - vf[e2 + ch] + vf[e3 + ch]
                    for ch in range(c):
                        tf[s2 + ch] += vf[e1 + ch] + vf[e2 + ch] - vf[e0 + ch]
                    for ch in range(c):
                        tf[s3 + ch] -= vf[e3 + ch]
            # the row stage's adjoint, the same combinations, into the four input rows
            i0, i1, i2, i3 = _tile_rows(b, hp, ti, rs)
            for k in range(rs):
                gf[i0 + k] += tf[k]
            for k in range(rs):
                gf[i1 + k] += tf[rs + k] - tf[two * rs + k] + tf[three * rs + k]
            for k in range(rs):
                gf[i2 + k] += tf[rs + k] + tf[two * rs + k] - tf[k]
            for k in range(rs):
                gf[i3 + k] -= tf[three * rs + k]


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
