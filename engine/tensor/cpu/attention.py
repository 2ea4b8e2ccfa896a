"""How attention's NumPy kernel (`engine.nn`'s scaled_dot_product_attention) shares its work:
the blocks of batch entries / kv heads it computes at a time, and whether they go to the
kernel threads. The kernel itself (the products, the softmax, the masks, the backward) stays
with the layer; it asks here and never reads a threshold.
"""
from __future__ import annotations

import numpy as np

from . import threads as _threads

__all__ = ["blocks", "plan", "BLOCK_BYTES", "THREADED_MIN_WORK"]

# scores bytes per block: a block's scores, the backward's dW and the products' operands stay
# within a core's L2 cache
BLOCK_BYTES = 1 << 18
# The blocks go to the kernel threads when the scores fill PARALLEL_MIN_BYTES (the size at which
# a streaming pass pays for a worker's wake-up) or when the products make this many multiply-adds
# (the scores times d + dv in the forward, twice that in the backward): each score costs a row of
# products, not one pass (benchmarks/TUNING.md).
THREADED_MIN_WORK = 1 << 22


def blocks(b: int, hk: int, unit_bytes: int, xp) -> list[tuple[slice, slice]]:
    """(batch slice, kv-head slice) blocks of about `BLOCK_BYTES` of scores each, `unit_bytes`
    the scores of one kv head of one batch entry; one block on another array module than NumPy."""
    if xp is not np:
        return [(slice(0, b), slice(0, hk))]
    entry = unit_bytes * hk
    if entry >= BLOCK_BYTES and hk > 1:  # one batch entry is large: split it over its kv heads
        per = max(1, BLOCK_BYTES // max(1, unit_bytes))
        return [(slice(i, i + 1), slice(j, min(hk, j + per))) for i in range(b) for j in range(0, hk, per)]
    per = max(1, BLOCK_BYTES // max(1, entry))
    return [(slice(i, min(b, i + per)), slice(0, hk)) for i in range(0, b, per)]


def plan(count: int, scores_bytes: int, work: int, xp) -> tuple[bool, bool]:
    """`(threaded, phased)` for `count` blocks over `scores_bytes` of scores whose products make
    `work` multiply-adds: threaded, the blocks go to the kernel threads (each making its own
    products, `run_chunks(..., own_products=True)`); phased, BLAS's thread count cannot be held
    at one, so the products run whole (threaded by BLAS) and only the passes between them go to
    the kernel threads, a block each."""
    threaded = xp is np and _threads.num_threads() > 1 and count > 1 and (
        scores_bytes >= _threads.PARALLEL_MIN_BYTES or work >= THREADED_MIN_WORK)
    phased = threaded and _threads.blas_threads() > 1 and not _threads.one_blas_thread_possible()
    return threaded, phased
