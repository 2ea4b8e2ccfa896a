"""The numba kernels behind `engine.tensor.cpu.quant`: products with weights kept in llama.cpp's
blocks (imported only through `quant`, after `jit.kernels()` said the compiled kernels run).

A weight is `[rows, bytes per row]` uint8, each row its blocks in the file's order (the layouts
of `gguf.quants`, which are ggml's): Q8_0 (32 values: f16 d, 32 int8), Q4_0 (32: f16 d, 16 bytes
of nibbles, values d (q - 8)), Q4_1 (32: f16 d, f16 m, 16 bytes, d q + m), Q4_K (256: f16 d,
f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; eight sub-blocks of 32 with
(d sc) q - (dmin m)) and Q6_K (256: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8
scales, f16 d; (d sc) (q - 32) over sixteen sub-blocks of 16). The float16 scales are read
through a table of all 65536 float16 values as float32 (what llama.cpp does too).

`decode_row` writes one row's float32 values with the arithmetic of `gguf.quants` in its order
(no fused multiply-adds: this function is compiled without fastmath), so a decoded row is bit
for bit the reference's. The products decode a row into a scratch row that stays in the L1 cache
and take its dot products with the activations there, accumulated in float32 by several lanes
(fastmath: re-association and contraction): the rounding of a float32 product, not its bits.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types

from ._kernels_base import _OPTS, _SUMS, F1, F2, R1, R2, f32

U1 = types.Array(types.uint8, 1, "C", readonly=True)
U2 = types.Array(types.uint8, 2, "C", readonly=True)
I1 = types.Array(types.int64, 1, "C", readonly=True)

# the type codes the door passes (engine.tensor.cpu.quant.CODES)
Q8_0, Q4_0, Q4_1, Q4_K, Q6_K = 0, 1, 2, 3, 4


@njit(types.float32(U1, R1, types.int64), **_OPTS)
def _f16(row, lut, at):
    return lut[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@njit(types.void(U1, R1, F1, types.int64), **_OPTS)
def _row_q8_0(row, lut, out, k):
    for b in range(k // 32):
        o = b * 34
        d = _f16(row, lut, o)
        for j in range(32):
            out[b * 32 + j] = f32(np.int8(row[o + 2 + j])) * d


@njit(types.void(U1, R1, F1, types.int64), **_OPTS)
def _row_q4_0(row, lut, out, k):
    for b in range(k // 32):
        o = b * 18
        d = _f16(row, lut, o)
        for j in range(16):
            q = np.int32(row[o + 2 + j])
            out[b * 32 + j] = d * f32((q & 15) - 8)
            out[b * 32 + 16 + j] = d * f32((q >> 4) - 8)


@njit(types.void(U1, R1, F1, types.int64), **_OPTS)
def _row_q4_1(row, lut, out, k):
    for b in range(k // 32):
        o = b * 20
        d = _f16(row, lut, o)
        m = _f16(row, lut, o + 2)
        for j in range(16):
            q = np.int32(row[o + 4 + j])
            out[b * 32 + j] = d * f32(q & 15) + m
            out[b * 32 + 16 + j] = d * f32(q >> 4) + m


@njit(types.void(U1, R1, F1, types.int64), **_OPTS)
def _row_q4_k(row, lut, out, k):
    for b in range(k // 256):
        o = b * 144
        d = _f16(row, lut, o)
        dmin = _f16(row, lut, o + 2)
        s = o + 4
        for j in range(8):
            if j < 4:
                sc = np.int32(row[s + j]) & 63
                mn = np.int32(row[s + 4 + j]) & 63
            else:
                sc = (np.int32(row[s + 4 + j]) & 15) | ((np.int32(row[s + j - 4]) >> 2) & 48)
                mn = (np.int32(row[s + 4 + j]) >> 4) | ((np.int32(row[s + j]) >> 2) & 48)
            dj = d * f32(sc)
            mj = dmin * f32(mn)
            q0 = o + 16 + (j // 2) * 32
            shift = 4 * (j % 2)
            base = b * 256 + j * 32
            for i in range(32):
                out[base + i] = dj * f32((np.int32(row[q0 + i]) >> shift) & 15) - mj


@njit(types.void(U1, R1, F1, types.int64), **_OPTS)
def _row_q6_k(row, lut, out, k):
    for b in range(k // 256):
        o = b * 210
        d = _f16(row, lut, o + 208)
        for h in range(2):
            for t in range(4):  # 32 values: low nibbles at (t % 2), high pairs at bits 2t
                ql0 = o + h * 64 + (t % 2) * 32
                lshift = 4 * (t // 2)
                qh0 = o + 128 + h * 32
                hshift = 2 * t
                for half in range(2):  # two sub-blocks of 16, each its own scale
                    sub = h * 8 + t * 2 + half
                    ds = d * f32(np.int8(row[o + 192 + sub]))
                    base = b * 256 + h * 128 + t * 32 + half * 16
                    for i in range(16):
                        li = half * 16 + i
                        q = ((np.int32(row[ql0 + li]) >> lshift) & 15) | (((np.int32(row[qh0 + li]) >> hshift) & 3) << 4)
                        out[base + i] = ds * f32(q - 32)


@njit(types.void(types.int64, U1, R1, F1), **_OPTS)
def decode_row(code, row, lut, out):
    """One row's float32 values into `out` (its length: the values per row)."""
    k = out.size
    if code == Q8_0:
        _row_q8_0(row, lut, out, k)
    elif code == Q4_0:
        _row_q4_0(row, lut, out, k)
    elif code == Q4_1:
        _row_q4_1(row, lut, out, k)
    elif code == Q4_K:
        _row_q4_k(row, lut, out, k)
    else:
        _row_q6_k(row, lut, out, k)


@njit(types.float32(R1, F1), fastmath=_SUMS, **_OPTS)
def _dot(x, w):
    s = f32(0.0)
    for i in range(x.size):
        s += x[i] * w[i]
    return s


@njit(types.void(types.int64, R2, U2, R1, F2, types.int64, types.int64, F1), **_OPTS)
def rows_product(code, x, blocks, lut, out, n0, n1, scratch):
    """`out[:, n] = x @ row n's values` for the rows n0..n1 of `blocks` (x: [M, K], out: [M, N],
    scratch: K floats of this thread's)."""
    for n in range(n0, n1):
        decode_row(code, blocks[n], lut, scratch)
        for m in range(x.shape[0]):
            out[m, n] = _dot(x[m], scratch)


@njit(types.void(types.int64, U2, R1, F2, types.int64), **_OPTS)
def decode_rows(code, blocks, lut, out, n0):
    """`out[i] = the values of row n0 + i` for every row of `out`."""
    for i in range(out.shape[0]):
        decode_row(code, blocks[n0 + i], lut, out[i])


@njit(types.void(types.int64, U2, R1, I1, F2), **_OPTS)
def gather_rows(code, blocks, lut, idx, out):
    """`out[i] = the values of row idx[i]` (an embedding's lookup)."""
    for i in range(idx.size):
        decode_row(code, blocks[idx[i]], lut, out[i])


# ---------------------------------------------------------------------- fused dots (few rows)
# For the 32-value types the activations come laid out as a row's bytes (`xlo[r, p]`, `xhi[r, p]`:
# the activation that byte p's low / high nibble multiplies, 0 under the block's scales), so that
# the dot runs as one long loop over the row's bytes that LLVM vectorizes, the block's scale d
# spread over its bytes (`dexp`, zero under the scales) and Q4_1's offsets (Q4_0's -8 d) added per
# block from `xsum[r, b]`, the activations' sum over block b. Nibbles are taken apart in float32
# (v - 16 floor(v / 16), exact): numba's integer arithmetic on bytes widens to int64, whose
# conversions to float do not vectorize. The value is d q (+ m) summed as x (d q + m): equal to
# the decoded row's dot up to float32 rounding.
_INV16 = f32(0.0625)


W1 = types.Array(types.uint64, 1, "C")
B1 = types.Array(types.uint32, 1, "C", readonly=True)


@njit(types.void(types.int64, R2, R2, R2, U2, R1, B1, F2, types.int64, types.int64, F1, W1), fastmath=_SUMS, **_OPTS)
def dots_nibbles(code, xlo, xhi, xsum, blocks, lut, lut_bits, out, n0, n1, dexp, pairs):
    """`out[:, n] = x @ row n` for n in n0..n1, Q4_0 (code 1) or Q4_1 (code 2); `dexp`: a scratch
    row of the row's byte count, zero on entry, `pairs` the same memory as uint64 (the scale is
    spread two floats a store: LLVM writes the short loop as scalar stores, one a cycle);
    `lut_bits`: `lut`'s bits."""
    m, rb = xlo.shape
    size = 18 if code == Q4_0 else 20
    head = size - 16
    nb = rb // size
    acc = np.zeros(m, dtype=np.float32)
    for n in range(n0, n1):
        row = blocks[n]
        acc[:] = f32(0.0)
        for b in range(nb):
            o = np.uint64(b * size)
            at = np.uint64(row[o]) | (np.uint64(row[o + np.uint64(1)]) << np.uint64(8))
            d = lut[at]
            if code == Q4_0:
                mn = f32(-8.0) * d
            else:
                mn = lut[np.uint64(row[o + np.uint64(2)]) | (np.uint64(row[o + np.uint64(3)]) << np.uint64(8))]
            for r in range(m):
                acc[r] += mn * xsum[r, b]
            bits = np.uint64(lut_bits[at])
            pair = bits | (bits << np.uint64(32))
            first = (o + np.uint64(head)) >> np.uint64(1)
            for j in range(np.uint64(8)):
                pairs[first + j] = pair
        for r in range(m):
            lo_x, hi_x = xlo[r], xhi[r]
            s = f32(0.0)
            for p in range(rb):
                vf = f32(row[p])
                hi = np.floor(vf * _INV16)
                s += dexp[p] * (lo_x[p] * (vf - f32(16.0) * hi) + hi_x[p] * hi)
            out[r, n] = acc[r] + s


I2 = types.Array(types.int8, 2, "C", readonly=True)


@njit(types.void(R2, U2, I2, R1, B1, F2, types.int64, types.int64, F1, W1), fastmath=_SUMS, **_OPTS)
def dots_q8_0(xexp, blocks, signed, lut, lut_bits, out, n0, n1, dexp, pairs):
    """`out[:, n] = x @ row n` for n in n0..n1, Q8_0: `xexp` the activations laid out as the row's
    bytes (0 under the scales), `signed` the blocks read as int8, `dexp` as `dots_nibbles`'."""
    m, rb = xexp.shape
    nb = rb // 34
    for n in range(n0, n1):
        row, srow = blocks[n], signed[n]
        for b in range(nb):
            o = np.uint64(b * 34)
            bits = np.uint64(lut_bits[np.uint64(row[o]) | (np.uint64(row[o + np.uint64(1)]) << np.uint64(8))])
            pair = bits | (bits << np.uint64(32))
            first = (o + np.uint64(2)) >> np.uint64(1)
            for j in range(np.uint64(16)):
                pairs[first + j] = pair
        for r in range(m):
            xr = xexp[r]
            s = f32(0.0)
            for p in range(rb):
                s += dexp[p] * (xr[p] * f32(srow[p]))
            out[r, n] = s
