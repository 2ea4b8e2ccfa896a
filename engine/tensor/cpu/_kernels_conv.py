"""The compiled convolution kernels (channels-last col2im, Winograd F(2x2, 3x3)): part of
`_kernels`, which imports them (both take their types from `_kernels_base`); the same rules
hold (one signature each, no allocation, the caller checks shapes)."""
from __future__ import annotations

import numpy as np
from numba import njit, types

from ._kernels_base import _ELEMENTWISE, _OPTS, F2, F3, R1, R2, R3, f32


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
