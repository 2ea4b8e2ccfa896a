"""Counting a step's work without timing it: the ops of the graph that leads to a tensor."""
from __future__ import annotations

import collections

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
