"""Writing llama.cpp's K-quants (Q4_K, Q5_K, Q6_K), which the `gguf` package reads but cannot write,
and the mixes users name them by ("Q4_K_M", "Q5_K_M", "Q6_K": llama.cpp's `llama_tensor_get_type`).

The layouts (`gguf.quants`, ggml's `block_q*_K`), each a super-block of 256 values:
- Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes of eight 6-bit scales and eight 6-bit mins, 128 bytes
  of 4-bit values; value = d * scale * q - dmin * min over each 32 values.
- Q5_K, 176 bytes: as Q4_K with a fifth bit per value (32 bytes of high bits before the nibbles).
- Q6_K, 210 bytes: 128 bytes of low nibbles, 64 of high bit pairs, sixteen int8 scales, f16 d;
  value = d * scale * (q - 32) over each 16 values.

The method is llama.cpp's (no importance matrix): for Q4_K/Q5_K each 32 values' scale and min are
fitted by weighted least squares over a sweep of candidate scales (weights |x| + rms of the
super-block), then the scales and mins are themselves quantized to 6 bits against the super-block's
largest; for Q6_K each 16 values' scale is the best of a sweep of 19 (weighted by x^2), quantized to
int8 against the largest. The searches (the time) compiled when the engine's kernels run
(`cpu.quant.kquant_kernels()`), else vectorised NumPy over the sub-blocks, with the same bits (their
float32 sums by halves, `_tree_sum`); a slab of 512 super-blocks at a time, the slabs over the
engine's kernel threads (`cpu.run_chunks`), `check()` before each. Bit-identity with llama.cpp is not
the aim; its error is (tests/engine/models/test_gguf_kquants.py).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..tensor import cpu
from ..tensor.cpu import quant

__all__ = ["KQUANT_TYPES", "MIXES", "quantize_k", "mix_type", "is_router"]

KQUANT_TYPES = ("Q4_K", "Q5_K", "Q6_K")
QK_K = 256
_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
# a mix's name -> (its default type, llama.cpp's file type name)
MIXES = {"Q4_K_M": ("Q4_K", "MOSTLY_Q4_K_M"), "Q5_K_M": ("Q5_K", "MOSTLY_Q5_K_M"), "Q6_K": ("Q6_K", "MOSTLY_Q6_K")}
# llama.cpp's fallback for a tensor whose rows are not a multiple of 256 values
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_SLAB = 512  # super-blocks quantized at a time: the sweep's arrays stay near the L2 cache (faster than 4096)


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16)


def _tree_sum(a: np.ndarray) -> np.ndarray:
    """Each row of `a` ([n, 2^k] float32) summed in float32 by halves (a[:, :h] + a[:, h:], h = 16, 8,
    ..., 1): an order of the additions the compiled kernels (`_kquant_jit`) repeat bit for bit."""
    while a.shape[1] > 1:
        h = a.shape[1] // 2
        a = a[:, :h] + a[:, h:]
    return a[:, 0]


def _compiled():
    """The compiled searches (`cpu.quant.kquant_kernels()`), or None: the NumPy path then."""
    return quant.kquant_kernels()


def _weighted_sums(x: np.ndarray, w: np.ndarray):
    wx = w * x
    return w.sum(axis=1, dtype=np.float64), wx.sum(axis=1, dtype=np.float64), (wx * x).sum(axis=1, dtype=np.float64)


def _fit_min_scale(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Each row of `x` ([n, 32]) as scale * L - min, L in 0..nmax: the (scale, min >= 0) with the least
    `w`-weighted squared error over a sweep of nstep + 1 candidate grids, each refined by least squares.
    The error of a fit is computed from the weighted sums (in float64), not value by value. The compiled
    kernel when there is one, else NumPy: the same bits."""
    jit = _compiled()
    if jit is None:
        return _fit_min_scale_numpy(x, w, nmax, rmin, rdelta, nstep)
    scale, mins = np.empty(x.shape[0], np.float32), np.empty(x.shape[0], np.float32)
    jit.fit_min_scale(x, w, *_weighted_sums(x, w), nmax, np.float32(rmin), np.float32(rdelta), nstep, scale, mins)
    return scale, mins


def _fit_min_scale_numpy(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    f = np.float32
    lo = np.minimum(x.min(axis=1), f(0))
    span = x.max(axis=1) - lo
    flat = span <= 0
    span = np.where(flat, f(1), span)
    shifted = x - lo[:, None]
    sum_w, sum_x, sum_x2 = _weighted_sums(x, w)
    q = np.empty_like(x)
    wq = np.empty_like(x)

    def sums(iscale):
        np.multiply(iscale[:, None], shifted, out=q)
        np.rint(q, out=q)
        np.clip(q, 0, nmax, out=q)
        np.multiply(w, q, out=wq)
        sl = _tree_sum(wq).astype(np.float64)  # float32 sums of 32 terms, combined in float64
        sxl = _tree_sum(wq * x).astype(np.float64)
        sl2 = _tree_sum(wq * q).astype(np.float64)
        return sl, sl2, sxl

    def error(s, m, sl, sl2, sxl):  # sum w (s q + m - x)^2, expanded
        return s * s * sl2 + 2 * s * m * sl - 2 * s * sxl + m * m * sum_w - 2 * m * sum_x + sum_x2

    iscale = (f(nmax) / span).astype(f)
    scale = (f(1) / iscale).astype(np.float64)
    mn = lo.astype(np.float64)
    best = error(scale, mn, *sums(iscale))
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in range(nstep + 1):
            sl, sl2, sxl = sums(((f(rmin) + f(rdelta) * f(step) + f(nmax)) / span).astype(f))
            det = sum_w * sl2 - sl * sl
            s = (sum_w * sxl - sum_x * sl) / det
            m = (sl2 * sum_x - sl * sxl) / det
            positive = m > 0
            s = np.where(positive, sxl / sl2, s)
            m = np.where(positive, 0.0, m)
            e = error(s, m, sl, sl2, sxl)
            better = (det > 0) & (e < best)
            best = np.where(better, e, best)
            scale = np.where(better, s, scale)
            mn = np.where(better, m, mn)
    scale = np.where(flat, 0.0, scale).astype(f)
    mn = np.where(flat, lo, mn).astype(f)
    return scale, -mn


def _six_bits(values: np.ndarray):
    """[n, 8] non-negative values as (f16 step, 6-bit integers) against each row's largest."""
    top = values.max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(top > 0, np.float32(63) / top, np.float32(0)).astype(np.float32)
    ints = np.minimum(np.rint(inv[:, None] * values), 63).astype(np.uint8)
    return _f16(top / np.float32(63)), ints


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins per row into ggml's 12 bytes (`get_scale_min_k4` inverted)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return out


def _q45_k(x: np.ndarray, bits: int) -> np.ndarray:
    """[n, 256] float32 -> [n, 144 or 176] uint8 Q4_K / Q5_K blocks."""
    n = x.shape[0]
    nmax = (1 << bits) - 1
    sub = x.reshape(n * 8, 32)
    rms = np.sqrt((x * x).mean(axis=1, dtype=np.float32)).astype(np.float32)
    w = np.repeat(rms, 8)[:, None] + np.abs(sub)
    rmin, nstep = (-1.0, 20) if bits == 4 else (-0.5, 15)
    scale, mins = _fit_min_scale(sub, w, nmax, rmin, 0.1, nstep)
    d, sc = _six_bits(scale.reshape(n, 8))
    dmin, mn = _six_bits(mins.reshape(n, 8))
    step = d.astype(np.float32)[:, None] * sc  # [n, 8]
    offset = dmin.astype(np.float32)[:, None] * mn
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((x.reshape(n, 8, 32) + offset[:, :, None]) / step[:, :, None])
    q = np.where(step[:, :, None] == 0, 0, np.clip(q, 0, nmax)).astype(np.uint8)  # [n, 8, 32]
    low = q & 15
    nibbles = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(n, 128)  # sub-blocks 2c, 2c+1 share 32 bytes
    head = np.concatenate([d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8),
                           _pack_scales(sc, mn)], axis=1)
    if bits == 4:
        return np.concatenate([head, nibbles], axis=1)
    high = (q >> 4).astype(np.uint8)  # [n, 8, 32]: bit j of byte l is sub-block j's value l
    qh = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    return np.concatenate([head, qh, nibbles], axis=1)


def _fit_scale(x: np.ndarray, nmax: int) -> np.ndarray:
    """Each row of `x` ([n, 16]) as scale * L, L in -nmax..nmax-1: the best (x^2-weighted) of 19 grids
    (the compiled kernel when there is one, else NumPy: the same bits)."""
    jit = _compiled()
    if jit is None:
        return _fit_scale_numpy(x, nmax)
    scale = np.empty(x.shape[0], np.float32)
    jit.fit_scale(x, nmax, scale)
    return scale


def _fit_scale_numpy(x: np.ndarray, nmax: int) -> np.ndarray:
    f = np.float32
    at = np.abs(x).argmax(axis=1)
    top = np.take_along_axis(x, at[:, None], axis=1)[:, 0]
    tiny = np.abs(top) < f(1e-15)
    top = np.where(tiny, f(1), top)
    w = x * x
    q = np.empty_like(x)
    wq = np.empty_like(x)

    def fit(iscale):
        np.multiply(iscale[:, None], x, out=q)
        np.rint(q, out=q)
        np.clip(q, -nmax, nmax - 1, out=q)
        np.multiply(w, q, out=wq)
        return _tree_sum(wq * x), _tree_sum(wq * q)

    sxl, sl2 = fit(f(-nmax) / top)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sl2 > 0, sxl / sl2, f(0))
        best = scale * sxl
        for step in (*range(-9, 0), *range(1, 10)):
            sxl, sl2 = fit((-(f(nmax) + f(0.1) * f(step)) / top).astype(f))
            better = (sl2 > 0) & (sxl * sxl > best * sl2)
            scale = np.where(better, sxl / sl2, scale)
            best = np.where(better, scale * sxl, best)
    return np.where(tiny, f(0), scale).astype(f)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """[n, 256] float32 -> [n, 210] uint8 Q6_K blocks."""
    n = x.shape[0]
    scale = _fit_scale(x.reshape(n * 16, 16), 32).reshape(n, 16)
    at = np.abs(scale).argmax(axis=1)
    top = np.take_along_axis(scale, at[:, None], axis=1)[:, 0]
    zero = np.abs(top) < np.float32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-128) / top).astype(np.float32)
        d = _f16(np.where(zero, np.float32(0), np.float32(1) / iscale))
    sc = np.minimum(np.rint(iscale[:, None] * scale), 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(x.reshape(n, 16, 16) / step[:, :, None])
    q = (np.where(step[:, :, None] == 0, 0, np.clip(q, -32, 31)) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    low, high = q & 15, q >> 4  # [n, half, quarter, 32]: value 128 h + 32 r + l
    ql = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(n, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(n, 1).view(np.uint8)], axis=1)


def quantize_k(values: np.ndarray, qtype: str, check: Callable[[], None] | None = None) -> np.ndarray:
    """`values` (float32, last axis a multiple of 256) as `qtype` blocks: uint8 of shape
    `values.shape[:-1] + (bytes per row,)`, as `gguf.quants.quantize` returns for its types.
    `check()` is called before each slab of super-blocks (a few hundredths of a second of work;
    it raises to cancel, and the exception is raised here once the threads stop)."""
    if qtype not in KQUANT_TYPES:
        raise ValueError(f"quantize_k: qtype must be one of {', '.join(KQUANT_TYPES)}, got {qtype!r}")
    values = np.asarray(values, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] % QK_K:
        raise ValueError(f"quantize_k: {qtype} needs rows of a multiple of {QK_K} values, got shape {values.shape}")
    flat = np.ascontiguousarray(values).reshape(-1, QK_K)
    out = np.empty((flat.shape[0], _BYTES[qtype]), dtype=np.uint8)

    def chunk(slabs) -> None:  # each super-block on its own: the bits do not depend on the threads
        for part in slabs:
            if check is not None:
                check()
            out[part] = _q6_k(flat[part]) if qtype == "Q6_K" else _q45_k(flat[part], 4 if qtype == "Q4_K" else 5)
    cpu.run_chunks(chunk, [slice(i, i + _SLAB) for i in range(0, flat.shape[0], _SLAB)])
    return out.reshape(*values.shape[:-1], values.shape[-1] // QK_K * _BYTES[qtype])


def is_router(name: str) -> bool:
    """Whether GGUF tensor `name` is a mixture's router (or Qwen2-MoE's shared-expert gate), which
    llama.cpp's quantizer keeps F32 whatever the file type."""
    return "ffn_gate_inp" in name


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def mix_type(mix: str, name: str, row: int, *, n_layers: int, n_experts: int, has_output: bool,
             v_index: int | None = None, n_v: int = 0) -> str:
    """The type llama.cpp's quantizer gives tensor `name` (a matrix of rows of `row` values) in the
    mix `mix`: a router (ffn_gate_inp) F32; the output (or the tied token embedding) Q6_K; in Q4_K_M
    and Q5_K_M attn_v (and Phi-3's fused attn_qkv, an attn_v to llama.cpp's quantizer) and ffn_down
    Q6_K in the layers `_more_bits` picks; the 8-expert models' attn_k / attn_v Q8_0 and attn_output
    Q5_K; the rest the mix's type. `v_index`: this attn_v's place among the `n_v` attention-value
    tensors. A type whose block does not divide the row falls back as llama.cpp's does (Q4_K ->
    Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16)."""
    want = MIXES[mix][0]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    if is_router(name):
        return "F32"  # a mixture's router: llama.cpp's quantizer leaves it as it is
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        return "Q8_0" if row % QK_K else "Q6_K"
    if name == "token_embd.weight":
        pass
    elif "attn_v.weight" in name or "attn_qkv.weight" in name:  # a fused qkv counts as attention values
        if mix in ("Q4_K_M", "Q5_K_M") and v_index is not None and _more_bits(v_index, n_v):
            want = "Q6_K"
        if n_experts == 8:
            want = "Q8_0"
    elif "attn_k.weight" in name:
        if n_experts == 8:
            want = "Q8_0"
    elif "ffn_down" in name:
        if mix in ("Q4_K_M", "Q5_K_M") and _more_bits(layer, n_layers):
            want = "Q6_K"
    elif "attn_output.weight" in name:
        if n_experts == 8 and mix == "Q4_K_M":
            want = "Q5_K"
    if want in KQUANT_TYPES and row % QK_K:
        want = _FALLBACK[want]
    if want != "F16" and row % 32:
        want = "F16"
    return want
