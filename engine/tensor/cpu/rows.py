"""The softmax cross entropy's CPU kernels: its passes over the logits (max, shifted exp, sum;
the backward's scale) a block of rows at a time over the kernel threads, compiled for float32
when numba is there.

`shifted_exp` returns None where the blocked passes do not pay (the loss then makes its whole-
array passes); `scale` takes any array module.
"""
from __future__ import annotations

import numpy as np

from . import jit as _jit
from .threads import min_blocks, run_blocks

__all__ = ["shifted_exp", "scale", "BLOCK_BYTES", "EXP_COST"]

# The softmax cross entropy's passes over the logits (max, shift, exp, sum; then the backward's
# scale) run a block of rows at a time, so that each block is read from memory once and stays in
# cache for the next pass, and the blocks are shared among the kernel threads. A block holds
# about this many bytes (a few rows of a 32k vocabulary: within a core's L2 cache). Every row is
# reduced by the same NumPy loop as a whole-array call would use: the bits do not change.
BLOCK_BYTES = 1 << 19


def _ce_min_blocks() -> int:
    """Below this many row blocks the cross entropy's streaming passes (the backward's scale)
    run in the calling thread."""
    return min_blocks(BLOCK_BYTES)


# The forward's max / shifted exp / sum costs far more per byte than a streaming pass (an exp
# per element), so the wake-up that PARALLEL_MIN_BYTES pays for with 4 MB of streaming pays for
# itself here with a few hundred KB. Counted as this many times a streaming pass (under the
# measured ratio, for CPUs with a faster exp): from 2 blocks (1 MB) with the default bar.
EXP_COST = 16


def _ce_exp_min_blocks() -> int:
    """Below this many row blocks the forward's shifted exp runs in the calling thread."""
    return min_blocks(BLOCK_BYTES, EXP_COST)


def _row_blocks(x2) -> list[slice]:
    n, row_bytes = x2.shape[0], max(1, x2.shape[1] * x2.itemsize)
    per = max(1, BLOCK_BYTES // row_bytes)
    return [slice(i, min(n, i + per)) for i in range(0, n, per)]


def _shifted_exp_rows(x2):
    """`m = max(x2, rows)`, `e = exp(x2 - m)`, `s = sum(e, rows)` (NumPy, C-contiguous x2) one
    block of rows at a time over the kernel threads."""
    n = x2.shape[0]
    m = np.empty((n, 1), dtype=x2.dtype)
    s = np.empty((n, 1), dtype=x2.dtype)
    e = np.empty_like(x2)
    k = _jit.kernels() if x2.dtype == np.float32 and x2.shape[1] else None
    if k is not None:  # max, shifted exp and sum in two passes over a row, not four
        m1, s1 = m.reshape(-1), s.reshape(-1)

        def compiled(b):
            k.shifted_exp_rows(x2[b], e[b], m1[b], s1[b])

        run_blocks(compiled, _row_blocks(x2), min_blocks=_ce_exp_min_blocks())
        return m, e, s

    def block(b):
        xb, eb = x2[b], e[b]
        np.max(xb, axis=1, keepdims=True, out=m[b])
        np.subtract(xb, m[b], out=eb)
        np.exp(eb, out=eb)
        np.sum(eb, axis=1, keepdims=True, out=s[b])

    blocks = _row_blocks(x2)
    run_blocks(block, blocks, min_blocks=_ce_exp_min_blocks())
    return m, e, s


def _scale_rows(e, row, xp):
    """`e * row` (row: one factor per row, [n, 1]) into a fresh array; NumPy in row blocks over
    the kernel threads when `e` is large."""
    k = _jit.kernels() if xp is np and e.dtype == np.float32 and e.flags.c_contiguous else None
    if k is None and (xp is not np or not e.flags.c_contiguous or e.nbytes < BLOCK_BYTES):
        return e * row
    out = np.empty_like(e)
    if k is not None:
        r1 = np.ascontiguousarray(row, dtype=np.float32).reshape(-1)

        def compiled(b):
            k.scale_rows(e[b], r1[b], out[b])

        run_blocks(compiled, _row_blocks(e), min_blocks=_ce_min_blocks())
        return out

    def block(b):
        np.multiply(e[b], row[b], out=out[b])

    run_blocks(block, _row_blocks(e), min_blocks=_ce_min_blocks())
    return out

def shifted_exp(x2):
    """`(m, e, s)`: `m = max(x2, rows)`, `e = exp(x2 - m)`, `s = sum(e, rows)`, each [n, 1] but e,
    for a C-contiguous 2-d NumPy `x2` of at least BLOCK_BYTES (or float32 with the compiled
    kernels), in row blocks over the kernel threads; None otherwise (the caller's whole-array
    passes give the same numbers: every row is reduced by the same loop)."""
    if not isinstance(x2, np.ndarray) or not x2.flags.c_contiguous or not (
            x2.nbytes >= BLOCK_BYTES or (x2.dtype == np.float32 and _jit.kernels() is not None)):
        return None
    return _shifted_exp_rows(x2)


def scale(e, row):
    """`e * row` (row: one factor per row, [n, 1]) into a fresh array, in row blocks over the
    kernel threads for a large NumPy `e`."""
    return _scale_rows(e, row, np if isinstance(e, np.ndarray) else None)
