"""The recording side of autodiff.

Each operation on a tensor that takes part in a graph records one `Node`: the nodes of its
inputs (its parents) and a backward rule that maps the output's gradient to one gradient
per parent. A leaf that requires grad has a node without parents. `backward(root)` walks the
graph once in reverse topological order, hands each leaf's accumulated gradient to a
`Gradients`, and releases every interior node (its rule and the arrays the rule closed over),
so memory is returned as soon as the pass ends and a second pass fails loudly.
"""
from __future__ import annotations

import threading

from .gradients import Gradients


class GraphReleasedError(RuntimeError):
    """backward() reached a node whose graph an earlier backward() already released."""


class Node:
    """One recorded operation (or a leaf that retains its gradient when `parents` is empty)."""

    __slots__ = ("parents", "rule", "op", "leaf", "released", "__weakref__")

    def __init__(self, parents, rule, op: str, leaf: bool = False):
        self.parents = parents  # tuple of Node | None, one per differentiable input
        self.rule = rule  # grad -> tuple of grads (one per parent, None where not needed)
        self.op = op
        self.leaf = leaf
        self.released = False

    def __repr__(self) -> str:
        kind = "leaf" if self.leaf else self.op
        return f"<Node {kind}{' released' if self.released else ''}>"


class _State(threading.local):
    paused = False  # a class default: each thread starts recording, and the lookup stays cheap


_state = _State()


def is_recording() -> bool:
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


def _topological(root: Node) -> list[Node]:
    """Nodes reachable from root, each after all of its parents (iterative DFS).

    Nodes are hashed by identity (Node defines no __eq__), so they key the `seen` set
    directly; leaves have no parents and go straight into the order.
    """
    if root.released:
        raise GraphReleasedError(_released_message(root))
    order: list[Node] = []
    append = order.append
    seen = {root}
    add = seen.add
    stack = [(root, iter(root.parents))]
    push = stack.append
    while stack:
        node, it = stack[-1]
        for parent in it:
            if parent is None or parent in seen:
                continue
            if parent.released:
                raise GraphReleasedError(_released_message(parent))
            add(parent)
            if parent.leaf:
                append(parent)
                continue
            push((parent, iter(parent.parents)))
            break
        else:
            stack.pop()
            append(node)
    return order


def _released_message(node: Node) -> str:
    return (
        f"backward() reached the output of '{node.op}', whose graph was already released by an earlier "
        "backward(); compute the loss again (a graph is used by one backward pass)"
    )


def backward(root: Node, seed) -> Gradients:
    """Propagate `seed` (the gradient of the root's output) back to every leaf.

    A gradient reaching a node from several children is summed. The first sum allocates a
    fresh array that this pass owns; later contributions are added into it in place (never
    into an array a rule handed over, which may be shared by several parents or be a
    read-only broadcast view).
    """
    grads = Gradients()
    if root.leaf:
        grads._put(root, seed)
        return grads
    order = _topological(root)
    pending = {root: seed}
    owned: set[int] = set()  # ids of the accumulation arrays this pass allocated
    pop = pending.pop
    for node in reversed(order):
        g = pop(node, None)
        if owned and g is not None:
            owned.discard(id(g))  # handed on: a rule may pass it to several parents
        if node.leaf:
            if g is not None:
                grads._put(node, g)
            continue
        if g is not None:
            parent_grads = node.rule(g)
            for parent, pg in zip(node.parents, parent_grads):
                if parent is None or pg is None:
                    continue
                prev = pending.get(parent)
                if prev is None:
                    pending[parent] = pg
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
