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


_state = threading.local()


def is_recording() -> bool:
    return not getattr(_state, "paused", False)


class no_recording:
    """Context manager: operations inside record nothing (like PyTorch's no_grad)."""

    def __enter__(self):
        self._prev = getattr(_state, "paused", False)
        _state.paused = True
        return self

    def __exit__(self, *exc):
        _state.paused = self._prev
        return False


def _topological(root: Node) -> list[Node]:
    """Nodes reachable from root, each after all of its parents (iterative DFS)."""
    order: list[Node] = []
    seen = {id(root)}
    stack = [(root, iter(root.parents or ()))]
    if root.released:
        raise GraphReleasedError(_released_message(root))
    while stack:
        node, it = stack[-1]
        for parent in it:
            if parent is None or id(parent) in seen:
                continue
            if parent.released:
                raise GraphReleasedError(_released_message(parent))
            seen.add(id(parent))
            stack.append((parent, iter(parent.parents or ())))
            break
        else:
            stack.pop()
            order.append(node)
    return order


def _released_message(node: Node) -> str:
    return (
        f"backward() reached the output of '{node.op}', whose graph was already released by an earlier "
        "backward(); compute the loss again (a graph is used by one backward pass)"
    )


def backward(root: Node, seed) -> Gradients:
    """Propagate `seed` (the gradient of the root's output) back to every leaf."""
    grads = Gradients()
    if root.leaf:
        grads._put(root, seed)
        return grads
    order = _topological(root)
    pending = {id(root): seed}
    for node in reversed(order):
        g = pending.pop(id(node), None)
        if node.leaf:
            if g is not None:
                grads._put(node, g)
            continue
        if g is not None:
            parent_grads = node.rule(g)
            for parent, pg in zip(node.parents, parent_grads):
                if parent is None or pg is None:
                    continue
                key = id(parent)
                prev = pending.get(key)
                pending[key] = pg if prev is None else prev + pg
        node.rule = None
        node.parents = None
        node.released = True
    return grads
