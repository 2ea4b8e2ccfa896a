"""The recording side of autodiff.

Each operation on a tensor that takes part in a graph records one `Node`: the nodes of its
inputs (its parents) and a backward rule that maps the output's gradient to one gradient
per parent. A leaf that requires grad has a node without parents. `backward(root)` walks the
graph once in reverse topological order, hands each leaf's accumulated gradient to a
`Gradients`, and releases every interior node (its rule and the arrays the rule closed over),
so memory is returned as soon as the pass ends and a second pass fails loudly.
"""
from __future__ import annotations

import heapq
import itertools
import threading

from .gradients import Gradients

_next_seq = itertools.count().__next__  # thread-safe under the GIL (one C call)


class GraphReleasedError(RuntimeError):
    """backward() reached a node whose graph an earlier backward() already released."""


class Node:
    """One recorded operation (or a leaf that retains its gradient when `parents` is empty)."""

    __slots__ = ("parents", "rule", "op", "leaf", "released", "seq", "__weakref__")

    def __init__(self, parents, rule, op: str, leaf: bool = False):
        self.parents = parents  # tuple of Node | None, one per differentiable input
        self.rule = rule  # grad -> tuple of grads (one per parent, None where not needed)
        self.op = op
        self.leaf = leaf
        self.released = False
        # creation order: a node's parents exist before it, so every parent has a smaller seq
        # than each of its children (backward's processing order rests on this)
        self.seq = _next_seq()

    def __repr__(self) -> str:
        kind = "leaf" if self.leaf else self.op
        return f"<Node {kind}{' released' if self.released else ''}>"


class _State(threading.local):
    paused = False  # a class default: each thread starts recording, and the lookup stays cheap


_state = _State()


def is_recording() -> bool:
    """Whether operations on this thread record nodes now: False inside `no_recording()`.

    Ops call it for every result that could join a graph, so it stays one attribute read."""
    return not _state.paused


class no_recording:
    """Context manager: operations inside record nothing (like PyTorch's no_grad)."""

    def __enter__(self):
        self._prev = _state.paused
        _state.paused = True
        return self

    def __exit__(self, *exc):
        _state.paused = self._prev
        return False


def _released_message(node: Node) -> str:
    return (
        f"backward() reached the output of '{node.op}', whose graph was already released by an earlier "
        "backward(); compute the loss again (a graph is used by one backward pass)"
    )


def backward(root: Node, seed) -> Gradients:
    """Propagate `seed` (the gradient of the root's output) back to every leaf.

    Nodes run in decreasing creation order (a max-heap on `seq`): a node is created after its
    parents, so by the time it runs, every child that reaches it has added its gradient. Only
    nodes that some gradient reaches enter the heap; one walk both orders and runs them.

    A gradient reaching a node from several children is summed. The first sum allocates a
    fresh array that this pass owns; later contributions are added into it in place (never
    into an array a rule handed over, which may be shared by several parents or be a
    read-only broadcast view).
    """
    grads = Gradients()
    if root.released:
        raise GraphReleasedError(_released_message(root))
    if root.leaf:
        grads._put(root, seed)
        return grads
    pending = {root: seed}
    heap = [(-root.seq, root)]
    push, popmin = heapq.heappush, heapq.heappop
    owned: set[int] = set()  # ids of the accumulation arrays this pass allocated
    pop = pending.pop
    get = pending.get
    while heap:
        node = popmin(heap)[1]
        g = pop(node)
        if owned:
            owned.discard(id(g))  # handed on: a rule may pass it to several parents
        if node.leaf:
            grads._put(node, g)
            continue
        rule = node.rule
        if rule is None:  # released by an earlier pass
            raise GraphReleasedError(_released_message(node))
        for parent, pg in zip(node.parents, rule(g)):
            if parent is None or pg is None:
                continue
            prev = get(parent)
            if prev is None:
                pending[parent] = pg
                push(heap, (-parent.seq, parent))
            elif id(prev) in owned and prev.shape == pg.shape and prev.dtype == pg.dtype:
                prev += pg
            else:
                owned.discard(id(prev))
                acc = prev + pg
                if acc.ndim:  # a rank-0 sum may come back as an immutable scalar
                    owned.add(id(acc))
                pending[parent] = acc
        node.rule = None
        node.parents = None
        node.released = True
    return grads
