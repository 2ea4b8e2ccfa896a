"""How the module views present a module tree: which nodes the tree shows, and their type names.

The walk itself is the engine's (`engine.module.tree`: `FieldKind`, `children`, `find`,
`walk`), and so are the statistics the views show (`engine.module.summary.ModelStats`). This
file only holds the presentation choices the tree, inspector and dialogs share. Nothing here
calls `Param.val()`, so a lazy model stays unallocated.
"""
from __future__ import annotations

from typing import Any

from engine.module import ParamGroup
from engine.module.tree import FieldKind, children

# The nodes of the tree view; flags and constants are listed by the inspector instead.
TREE_KINDS = frozenset({FieldKind.MODULE, FieldKind.CONTAINER, FieldKind.PARAM, FieldKind.REPARAMETERIZATION})


def tree_children(value: Any) -> list[tuple[str, FieldKind, Any]]:
    """`(segment, kind, value)` of the children the tree view shows under a node."""
    return [c for c in children(value) if c[1] in TREE_KINDS]


def has_tree_children(value: Any) -> bool:
    return any(k in TREE_KINDS for _, k, _ in children(value))


def type_name(kind: FieldKind, value: Any) -> str:
    """The Type column: the class name, `Param float[4, 3]`, `Vec[2]`, `Tensor int[4]`."""
    if kind in (FieldKind.MODULE, FieldKind.REPARAMETERIZATION):
        return type(value).__name__
    if kind == FieldKind.PARAM:
        return f"Param {value.kind}{list(value.shape)}"
    if kind == FieldKind.CONTAINER:
        tag = "Tuple" if isinstance(value, tuple) else ("Map" if isinstance(value, dict) else "Vec")
        return f"{tag}[{len(value)}]"
    if kind == FieldKind.CONSTANT:
        return f"Tensor {value.kind}{list(value.shape)}"
    return type(value).__name__


def group_from_spec(spec: dict) -> ParamGroup:
    """The engine's ParamGroup for a group spec (see `ParamGroup.from_spec`)."""
    return ParamGroup.from_spec(spec)
