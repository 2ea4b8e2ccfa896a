"""Gradients: what one backward pass produced, keyed by the leaf tensors' nodes."""
from __future__ import annotations


class Gradients:
    """The gradients of one backward pass. Read with `tensor.grad(grads)`."""

    __slots__ = ("_by_node",)

    def __init__(self):
        self._by_node: dict[int, tuple[object, object]] = {}

    def _put(self, node, array) -> None:
        # keep the node alive next to its gradient so its id stays unique
        self._by_node[id(node)] = (node, array)

    def of_node(self, node):
        """The gradient recorded for tape node `node`, or None."""
        entry = self._by_node.get(id(node))
        if entry is None or entry[0] is not node:
            return None
        return entry[1]

    def remove(self, node):
        entry = self._by_node.pop(id(node), None)
        return None if entry is None or entry[0] is not node else entry[1]

    def __len__(self) -> int:
        return len(self._by_node)

    def __repr__(self) -> str:
        return f"Gradients({len(self)} tensors)"
