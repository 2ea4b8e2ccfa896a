"""Products with weights kept in llama.cpp's blocks (GGUF): the CPU kernels `engine.models`'
`GGUFWeight` multiplies by, so that generation never unpacks a whole weight to float32.

A weight is `blocks`, uint8 `[rows, bytes per row]`, of a ggml type (`gguf.quants`' layouts);
its values are `[rows, k]`. The functions return None where there is no kernel (another type,
the compiled kernels off, a CuPy array): the caller then dequantizes with `gguf` and multiplies.

- `rows_product(x2, blocks, qtype, k)`: `x2 @ values.T` (`[m, k]` -> `[m, rows]`), a Linear's
  forward over its `[out, in]` rows and the tied head. For a few activation rows (generation)
  the 32-value types (Q8_0, Q4_0, Q4_1) dot each block's integers with the activations and scale
  the sum once per block, the K-quants decode each weight row into a scratch row in the L1 cache
  and dot it there; blocks of rows over the kernel threads; for many rows (a prompt, a training batch)
  `values` is decoded a tile of rows at a time and multiplied by BLAS.
- `product(x2, blocks, qtype, k)`: `x2 @ values` (`[m, rows]` -> `[m, k]`), the gradient of a
  Linear's input, a tile at a time.
- `dequantize(blocks, qtype, k, rows=None)`: the values (of `rows`, an int array, when given),
  bit for bit `gguf.quants.dequantize`'s.

Each output row is computed by one thread with the same code whichever thread it is, and the
tiles' products are summed in a fixed order: the bits do not depend on the thread count.
"""
from __future__ import annotations

import numpy as np

from . import jit as _jit
from .threads import matmul, min_blocks, num_threads, run_chunks

__all__ = ["kquant_kernels", "CODES", "supported", "rows_product", "product", "dequantize",
           "ROW_BLOCK", "DOT_COST", "MANY_ROWS", "TILE_BYTES"]

# the ggml types with a kernel and their codes in `_kernels_quant`
CODES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q6_K": 4}
_BLOCK = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q6_K": (256, 210)}

# Generation's products run a block of this many weight rows at a time over the kernel threads.
ROW_BLOCK = 64
# Decoding a block's values and dotting them costs far more per byte of blocks than a streaming
# pass (a dozen operations per 4-bit value), so the blocks go to the threads from a fraction of
# PARALLEL_MIN_BYTES of weight: counted as this many times a streaming pass.
DOT_COST = 16
# From this many activation rows on, a product decodes tiles of the weight and lets BLAS multiply
# them (the decode is then shared by all the rows); under it each row is dotted in the L1 cache.
MANY_ROWS = 8
# A tile holds about this many bytes of decoded float32 values (a few hundred rows of a 2k
# weight): within the L2 cache, while BLAS's product over it is still large.
TILE_BYTES = 1 << 20

_lut = _lut_bits = None
_mod = None
_failed = False


def _kernels():
    """`_kernels_quant`, or None when the compiled kernels are off or failed to build."""
    global _mod, _failed, _lut, _lut_bits
    if _mod is not None or _failed:
        return _mod
    if _jit.kernels() is None:
        return None
    try:
        from . import _kernels_quant  # noqa: PLC0415 - compiled (or loaded) on first use
    except Exception:  # noqa: BLE001 - a compile failure: the callers dequantize with gguf instead
        _failed = True
        return None
    _lut = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    _lut_bits = _lut.view(np.uint32)
    _mod = _kernels_quant
    return _mod


_kquant = None
_kquant_failed = False


def kquant_kernels():
    """The K-quant writer's compiled scale searches (`_kernels_kquant`: `fit_min_scale`, `fit_scale`,
    bit for bit `engine.models.gguf_kquants`' NumPy twins), or None when the compiled kernels are off
    (`EMBER_JIT=0`, `jit.set_enabled(False)`), numba is missing, or these failed to build."""
    global _kquant, _kquant_failed
    if _jit.kernels() is None or _kquant_failed:
        return None
    if _kquant is None:
        try:
            from . import _kernels_kquant  # noqa: PLC0415 - compiled (or loaded) on first use
        except Exception:  # noqa: BLE001 - a compile failure: the writer's NumPy path instead
            _kquant_failed = True
            return None
        _kquant = _kernels_kquant
    return _kquant


def supported(blocks, qtype: str, k: int) -> bool:
    """Whether the kernels take this weight: a kernel for `qtype`, NumPy uint8 blocks whose rows
    hold `k` values, and the compiled kernels on."""
    if qtype not in CODES or not isinstance(blocks, np.ndarray) or blocks.ndim != 2 or blocks.dtype != np.uint8:
        return False
    per, nbytes = _BLOCK[qtype]
    if k % per or blocks.shape[1] != k // per * nbytes:
        return False
    return _jit.enabled() and _kernels() is not None


def _tiles(rows: int, k: int) -> list[slice]:
    per = max(1, TILE_BYTES // (4 * max(1, k)))
    return [slice(i, min(rows, i + per)) for i in range(0, rows, per)]


def _decode_tile(kq, code, blocks, k, s: slice):
    out = np.empty((s.stop - s.start, k), dtype=np.float32)
    kq.decode_rows(code, blocks, _lut, out, s.start)
    return out


def rows_product(x2, blocks, qtype: str, k: int):
    """`x2 @ values.T` as float32 `[m, rows]` (x2: `[m, k]`), or None (see this file's doc)."""
    if not (isinstance(x2, np.ndarray) and x2.ndim == 2 and x2.shape[1] == k and supported(blocks, qtype, k)):
        return None
    kq, code = _kernels(), CODES[qtype]
    blocks = np.ascontiguousarray(blocks)
    x2 = np.ascontiguousarray(x2, dtype=np.float32)
    m, rows = x2.shape[0], blocks.shape[0]
    out = np.empty((m, rows), dtype=np.float32)
    if m >= MANY_ROWS:
        for s in _tiles(rows, k):
            out[:, s] = matmul(x2, _decode_tile(kq, code, blocks, k, s).T)
        return out
    row_blocks = [(i, min(rows, i + ROW_BLOCK)) for i in range(0, rows, ROW_BLOCK)]
    least = min_blocks(ROW_BLOCK * blocks.shape[1], DOT_COST)
    if num_threads() < 2 or len(row_blocks) < least:
        row_blocks = [(0, rows)]  # one call: a kernel call's dispatch costs microseconds

    dots = _fused_dots(kq, qtype, x2, blocks)
    def chunk(parts):
        scratch = np.empty(k, dtype=np.float32)
        spread = np.zeros(blocks.shape[1], dtype=np.float32)
        for n0, n1 in parts:
            if dots is not None:
                dots(n0, n1, spread, spread.view(np.uint64), out)
            else:
                kq.rows_product(code, x2, blocks, _lut, out, n0, n1, scratch)

    run_chunks(chunk, row_blocks, min_blocks=least)
    return out


def _as_row_bytes(values, size: int):
    """`values` `[m, blocks, per]` laid out as a row's bytes (`[m, blocks * size]`): each block's
    `per` values at its last `per` bytes, zero under its scales."""
    m, nb, per = values.shape
    out = np.zeros((m, nb, size), dtype=np.float32)
    out[:, :, size - per:] = values
    return out.reshape(m, -1)


def _fused_dots(kq, qtype: str, x2, blocks):
    """`dots(n0, n1, spread, pairs, out)` for the 32-value types (`_kernels_quant`'s fused dots), else None."""
    m, k = x2.shape
    if qtype == "Q8_0":
        xexp, signed = _as_row_bytes(x2.reshape(m, k // 32, 32), 34), blocks.view(np.int8)

        def dots_q8(n0, n1, spread, pairs, out):
            kq.dots_q8_0(xexp, blocks, signed, _lut, _lut_bits, out, n0, n1, spread, pairs)
        return dots_q8
    if qtype not in ("Q4_0", "Q4_1"):
        return None
    size = 18 if qtype == "Q4_0" else 20
    halves = x2.reshape(m, k // 32, 2, 16)  # a byte's low nibble is value j, its high one j + 16
    xlo, xhi = _as_row_bytes(halves[:, :, 0, :], size), _as_row_bytes(halves[:, :, 1, :], size)
    xsum = np.ascontiguousarray(x2.reshape(m, k // 32, 32).sum(axis=2, dtype=np.float32))
    code = CODES[qtype]

    def dots_nib(n0, n1, spread, pairs, out):
        kq.dots_nibbles(code, xlo, xhi, xsum, blocks, _lut, _lut_bits, out, n0, n1, spread, pairs)
    return dots_nib


def product(x2, blocks, qtype: str, k: int):
    """`x2 @ values` as float32 `[m, k]` (x2: `[m, rows]`), or None (see this file's doc)."""
    if not (isinstance(x2, np.ndarray) and x2.ndim == 2 and x2.shape[1] == blocks.shape[0]
            and supported(blocks, qtype, k)):
        return None
    kq, code = _kernels(), CODES[qtype]
    blocks = np.ascontiguousarray(blocks)
    x2 = np.asarray(x2, dtype=np.float32)
    out = np.zeros((x2.shape[0], k), dtype=np.float32)
    for s in _tiles(blocks.shape[0], k):
        out += matmul(np.ascontiguousarray(x2[:, s]), _decode_tile(kq, code, blocks, k, s))
    return out


def dequantize(blocks, qtype: str, k: int, rows=None):
    """The float32 values `[rows, k]` (or of the rows `rows`, an int array), or None."""
    if not supported(blocks, qtype, k):
        return None
    kq, code = _kernels(), CODES[qtype]
    blocks = np.ascontiguousarray(blocks)
    if rows is None:
        return _decode_tile(kq, code, blocks, k, slice(0, blocks.shape[0]))
    idx = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= blocks.shape[0]):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise IndexError(f"quant.dequantize: row {bad} is out of range for {blocks.shape[0]} rows")
    out = np.empty((idx.size, k), dtype=np.float32)
    kq.gather_rows(code, blocks, _lut, idx, out)
    return out
