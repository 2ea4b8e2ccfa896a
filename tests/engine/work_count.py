"""Counting a step's work without timing it: the ops of the graph that leads to a tensor, and
the bytes a step holds and peaks at."""
from __future__ import annotations

import collections
import gc
import tracemalloc

from engine import Tensor


def graph_ops(t: Tensor) -> collections.Counter:
    """Op name -> count over the graph that leads to `t` (leaves counted as 'leaf')."""
    seen, stack, ops = set(), [t._node], collections.Counter()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        ops["leaf" if node.leaf else node.op] += 1
        stack.extend(node.parents or ())
    return ops


def step_memory(forward, backward, between=None):
    """`(between(out) or None, held, peak)` for one step after a warm-up step: `out = forward()`,
    then `backward(out)`. `held`: the bytes still allocated once the forward has returned (what
    its graph keeps for the backward); `peak`: the most allocated during forward and backward,
    both counted from before the forward (tracemalloc sees NumPy's allocations)."""
    backward(forward())  # warm-up: lazy parameters, caches, thread pools
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = forward()
        held = tracemalloc.get_traced_memory()[0] - base
        seen = between(out) if between is not None else None
        backward(out)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return seen, held, peak
