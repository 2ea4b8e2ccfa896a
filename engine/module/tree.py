"""The module tree: what kind each field is, and the children of a node. The one way to walk it.

A module's public attributes are its fields. `kind_of(value)` says what a field is, and the
rest of the engine (transitions, visitors and mappers, display, reparameterization, records,
statistics) and the app's tree views decide what to do with a value from its kind alone:

    FieldKind.MODULE              a Module: its fields are children
    FieldKind.PARAM               a Param: a leaf, or the parent of its reparameterization
    FieldKind.FLAG                a Flag (training behaviour owned by the module)
    FieldKind.CONSTANT            a Tensor that is not a Param: recreated with the module
    FieldKind.CONTAINER           a list, tuple or dict holding at least one of the above
    FieldKind.REPARAMETERIZATION  the module attached to a reparameterized Param
                                  (only as a child of that Param; by itself it is a MODULE)
    FieldKind.NONE                None: an absent optional child, skipped
    FieldKind.PLAIN               anything else: copied as it is, never traversed

`children(node)` yields `(name, kind, value)` for the traversed children of a module, a
container or a reparameterized parameter, one level down; `walk(node)` yields
`(path, kind, value)` for every node below, depth first in field order, with the paths the
burnpack format stores (`blocks.0.attn.weight`, `fc.weight.lora.a`):

    from engine.module import Module, Param
    from engine.module.tree import FieldKind, children, walk
    from engine.tensor import Tensor

    class Block(Module):
        def __init__(self):
            self.weight = Param(Tensor.ones([2, 2]))
            self.size = 2                         # plain: not a child

    class Net(Module):
        def __init__(self):
            self.blocks = [Block(), Block()]

    net = Net()
    assert [(n, k) for n, k, _ in children(net)] == [("blocks", FieldKind.CONTAINER)]
    assert [p for p, k, _ in walk(net) if k is FieldKind.PARAM] == ["blocks.0.weight", "blocks.1.weight"]

Nothing here reads a parameter's value, so a lazy model stays unallocated.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterator

from ..tensor import Tensor
from .flag import Flag
from .param import Param

__all__ = [
    "FieldKind",
    "ModuleBase",
    "children",
    "container_type",
    "fields",
    "find",
    "join",
    "kind_of",
    "params",
    "reparameterization_name",
    "walk",
]


class FieldKind(str, enum.Enum):
    """What a field (or a container element) is; see this file's docstring."""

    PLAIN = "plain"
    NONE = "none"
    MODULE = "module"
    PARAM = "param"
    FLAG = "flag"
    CONSTANT = "constant"
    CONTAINER = "container"
    REPARAMETERIZATION = "reparameterization"

    def __str__(self) -> str:
        return self.value


class ModuleBase:
    """The base class of `engine.module.Module`: the tree treats the public attributes of its
    instances as fields. It lives here so that this file (and display) can recognise modules
    without importing module.py, which is built on this file."""

    __slots__ = ()


_PLAIN, _NONE = FieldKind.PLAIN, FieldKind.NONE
_MODULE, _PARAM, _FLAG, _CONSTANT = FieldKind.MODULE, FieldKind.PARAM, FieldKind.FLAG, FieldKind.CONSTANT
_CONTAINER, _REPARAM = FieldKind.CONTAINER, FieldKind.REPARAMETERIZATION

_KIND_OF_TYPE: dict[type, FieldKind] = {}  # classes whose kind does not depend on the value's content


def kind_of(value) -> FieldKind:
    """The kind of a field value (never REPARAMETERIZATION: that is a position, see `children`)."""
    k = _KIND_OF_TYPE.get(type(value))
    if k is not None:
        return k
    t = type(value)
    if isinstance(value, ModuleBase):
        k = _MODULE
    elif isinstance(value, Param):
        k = _PARAM
    elif isinstance(value, Tensor):
        k = _CONSTANT
    elif value is None:
        k = _NONE
    elif isinstance(value, Flag):
        k = _FLAG
    elif isinstance(value, (list, tuple)):
        return _CONTAINER if _any_traversed(value) else _PLAIN
    elif isinstance(value, dict):
        return _CONTAINER if _any_traversed(value.values()) else _PLAIN
    elif isinstance(value, (int, float, complex, str, bytes)):
        k = _PLAIN
    else:
        return _PLAIN  # other objects: not cached (a class may later gain a Module base)
    _KIND_OF_TYPE[t] = k
    return k


def _any_traversed(items) -> bool:
    for x in items:
        k = kind_of(x)
        if k is not _PLAIN and k is not _NONE:
            return True
    return False


def reparameterization_name(r) -> str:
    """The path segment of a reparameterization module (its `NAME`, e.g. "lora")."""
    name = getattr(r, "NAME", None)
    return name if isinstance(name, str) and name else type(r).__name__.lower()


def container_type(node) -> str:
    """What visitors and mappers are told they enter below `node`: `"Struct:<ClassName>"` for a
    module's field, `"Vec"` / `"Tuple"` / `"Map"` for a list / tuple / dict element and
    `"Reparameterization"` below a parameter."""
    if isinstance(node, ModuleBase):
        return "Struct:" + type(node).__name__
    if isinstance(node, Param):
        return "Reparameterization"
    if isinstance(node, tuple):
        return "Tuple"
    if isinstance(node, dict):
        return "Map"
    return "Vec"


def fields(module) -> Iterator[tuple[str, FieldKind, object]]:
    """`(name, kind, value)` for every public field of a module, plain ones and None included,
    in the order they were first assigned."""
    for name, v in list(module.__dict__.items()):
        if name[:1] != "_":
            yield name, kind_of(v), v


def children(node) -> Iterator[tuple[str, FieldKind, object]]:
    """`(name, kind, value)` for the traversed children of a module, a list / tuple / dict, or a
    reparameterized parameter (its reparameterization, named by `reparameterization_name`).
    Plain values and None are skipped; any other node has no children."""
    if isinstance(node, ModuleBase):
        items = list(node.__dict__.items())
    elif isinstance(node, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(node)]
    elif isinstance(node, dict):
        items = [(str(k), v) for k, v in node.items()]
    elif isinstance(node, Param):
        r = node.reparameterization
        if r is not None:
            yield reparameterization_name(r), _REPARAM, r
        return
    else:
        return
    for name, v in items:
        if name[:1] == "_":
            continue
        k = kind_of(v)
        if k is not _PLAIN and k is not _NONE:
            yield name, k, v


def join(path: str, name: str) -> str:
    """`path.name`, or `name` at the root (path "")."""
    return f"{path}.{name}" if path else name


def walk(node, path: str = "", prune: Callable[[object], bool] | None = None
         ) -> Iterator[tuple[str, FieldKind, object]]:
    """`(path, kind, value)` for every node below `node` (not `node` itself), depth first in
    field order, each before its children. `path` prefixes the paths; `prune(value) -> True`
    leaves a node and everything below it out."""
    stack = [(join(path, n), k, v) for n, k, v in children(node)]
    stack.reverse()
    kind_of_type = _KIND_OF_TYPE.get
    while stack:
        p, k, v = stack.pop()
        if prune is not None and prune(v):
            continue
        yield p, k, v
        if k is _MODULE or (k is _REPARAM and isinstance(v, ModuleBase)):  # `children` inline for the common node, a module
            kids = []
            for n, x in v.__dict__.items():
                if n[:1] == "_" or x is None:
                    continue
                k2 = kind_of_type(type(x))
                if k2 is None:
                    k2 = kind_of(x)
                if k2 is not _PLAIN and k2 is not _NONE:
                    kids.append((p + "." + n, k2, x))
        elif k is _PARAM:
            r = v.reparameterization
            if r is not None:
                stack.append((p + "." + reparameterization_name(r), _REPARAM, r))
            continue
        else:
            kids = [(join(p, n), k2, v2) for n, k2, v2 in children(v)]
        kids.reverse()
        stack.extend(kids)


def params(node, path: str = "", prune: Callable[[object], bool] | None = None
           ) -> Iterator[tuple[str, Param]]:
    """`(path, param)` for `node` itself when it is a Param and for every Param below it, in
    traversal order, each as stored (its reparameterization attached) and followed by the
    parameters of that reparameterization. `path` and `prune` are those of `walk`. A parameter held
    at several places (tied: the same id, as the A factor the parts of a fused module share) is
    yielded once, at its first path."""
    seen = set()
    if isinstance(node, Param):
        seen.add(node.id)
        yield path, node
    for p, k, v in walk(node, path, prune):
        if k is _PARAM and v.id not in seen:
            seen.add(v.id)
            yield p, v


def find(node, path: str) -> tuple[FieldKind, object] | None:
    """`(kind, value)` at `path` below `node` (`(MODULE, node)` for ""), following
    reparameterizations; None when there is no such child."""
    kind, value = kind_of(node), node
    if not path:
        return kind, value
    for seg in path.split("."):
        for name, k, v in children(value):
            if name == seg:
                kind, value = k, v
                break
        else:
            return None
    return kind, value
