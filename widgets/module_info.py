"""What the views need to know about a module, read without initializing anything.

`children(value)` lists the nodes under a module, a container, or a reparameterized parameter,
one level at a time (the tree creates them on demand). `ModelStats` is one pass over the
parameters that gives, for every path, the parameter count, the trainable count, the devices
and whether a reparameterization (LoRA) lives below. Nothing here calls `Param.val()`, so a
lazy model stays unallocated.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine import Tensor
from engine.module import Flag, Module, Param, ParamGroup
from engine.module.lora import NF4Weight
from engine.module.module import reparameterization_name
from engine.module.summary import TrainableCounts

MODULE, CONTAINER, PARAM, REPARAM, CONST, FLAG = "module", "container", "param", "reparam", "const", "flag"


def kind_of(value: Any) -> str | None:
    if isinstance(value, Module):
        return MODULE
    if isinstance(value, Param):
        return PARAM
    if isinstance(value, Tensor):
        return CONST
    if isinstance(value, Flag):
        return FLAG
    if isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return CONTAINER if any(kind_of(v) is not None for v in items) else None
    return None


def children(value: Any, *, with_leaves: bool = False) -> list[tuple[str, str, Any]]:
    """`(segment, kind, value)` of the tree children of a node.

    Modules, containers and parameters are tree nodes; constants and flags only when
    `with_leaves` (the inspector lists them).
    """
    if isinstance(value, Module):
        items = value.named_children()
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, Param) and value.reparameterization is not None:
        r = value.reparameterization
        return [(reparameterization_name(r), REPARAM, r)]
    else:
        return []
    out = []
    for seg, v in items:
        k = kind_of(v)
        if k is None or (k in (CONST, FLAG) and not with_leaves):
            continue
        out.append((seg, k, v))
    return out


def has_children(value: Any) -> bool:
    if isinstance(value, Param):
        return value.reparameterization is not None
    return bool(children(value))


def join(path: str, seg: str) -> str:
    return f"{path}.{seg}" if path else seg


def type_name(kind: str, value: Any) -> str:
    if kind in (MODULE, REPARAM):
        return type(value).__name__
    if kind == PARAM:
        return f"Param {value.kind}{list(value.shape)}"
    if kind == CONTAINER:
        tag = "Tuple" if isinstance(value, tuple) else ("Map" if isinstance(value, dict) else "Vec")
        return f"{tag}[{len(value)}]"
    if kind == CONST:
        return f"Tensor {value.kind}{list(value.shape)}"
    return type(value).__name__


def is_packed_storage(value: Any) -> bool:
    """The packed NF4 storage of a QLoRA base: its parameters are bytes standing for the base."""
    return isinstance(value, NF4Weight)


def param_trainable(p: Param) -> bool:
    """Configured to train (the engine's summary counts the same: `Param.is_active()`)."""
    return p.kind == "float" and p.is_active()


@dataclass
class Stats:
    numel: int = 0
    trainable: int = 0
    tensors: int = 0  # parameters (each a tensor), packed storage included on its own nodes
    initialized: int = 0  # of those, how many hold a value (the rest are lazy)
    floats: int = 0  # float tensors
    trainable_floats: int = 0
    devices: list = field(default_factory=list)
    reparameterized: int = 0  # parameters below with a reparameterization

    @property
    def state(self) -> str:
        """'trainable', 'frozen', 'partly' or '' (no float parameter below)."""
        if self.floats == 0:
            return ""
        if self.trainable_floats == self.floats:
            return "trainable"
        if self.trainable_floats == 0:
            return "frozen"
        return "partly"


class ModelStats:
    """Per-path statistics of one module value, from one traversal of its parameters."""

    def __init__(self, module: Any):
        self.by_path: dict[str, Stats] = {}
        if module is not None:
            self._walk(module, "", [self._get("")])

    def _get(self, path: str) -> Stats:
        s = self.by_path.get(path)
        if s is None:
            s = self.by_path[path] = Stats()
        return s

    def _walk(self, value: Any, path: str, chain: list[Stats]) -> None:
        for seg, kind, v in children(value):
            p = join(path, seg)
            s = self._get(p)
            if is_packed_storage(v):
                # QLoRA's packed bytes stand for the base weight, which is counted already:
                # their numbers stay on their own nodes (as the engine's summary counts them)
                self._walk(v, p, [s])
                continue
            chain.append(s)
            if kind == PARAM:
                self._add_param(v, chain)
                if v.reparameterization is not None:
                    for st in chain:
                        st.reparameterized += 1
                    self._walk(v, p, chain)
            else:
                self._walk(v, p, chain)
            chain.pop()

    @staticmethod
    def _add_param(p: Param, chain: list[Stats]) -> None:
        n = p.numel()
        trainable = param_trainable(p)
        is_float = p.kind == "float"
        dev = str(p.lazy_device())
        init = p.is_initialized()
        for s in chain:
            s.tensors += 1
            s.initialized += init
            s.numel += n
            if is_float:
                s.floats += 1
                if trainable:
                    s.trainable += n
                    s.trainable_floats += 1
            if dev not in s.devices:
                s.devices.append(dev)

    def get(self, path: str) -> Stats:
        return self.by_path.get(path) or Stats()

    @property
    def total(self) -> Stats:
        return self.get("")


def trainable_summary(stats: Stats) -> str:
    """PEFT's line, `trainable params: 2,048 || all params: 36,618 || trainable%: 5.5929`, from the
    counts of one stats pass (the engine's own formatting)."""
    return str(TrainableCounts(stats.trainable, stats.numel))


def get_path(module: Any, path: str) -> tuple[str, Any] | None:
    """The (kind, value) at a tree path, following reparameterizations; None if absent."""
    if module is None:
        return None
    kind, value = MODULE, module
    if not path:
        return kind, value
    for seg in path.split("."):
        for s, k, v in children(value, with_leaves=True):
            if s == seg:
                kind, value = k, v
                break
        else:
            return None
    return kind, value


def iter_params_below(module: Any, path: str):
    """`(path, param)` for every parameter at or below `path` in traversal order, reparameterization
    parameters included (a generator: take what you show)."""
    found = get_path(module, path)
    if found is None:
        return
    stack = [(path, found[1])]
    while stack:
        p, v = stack.pop()
        if isinstance(v, Param):
            yield p, v
        stack.extend((join(p, seg), c) for seg, _k, c in reversed(children(v)))


def named_params_below(module: Any, path: str) -> list[tuple[str, Param]]:
    return list(iter_params_below(module, path))


def constants_below(value: Any, path: str) -> list[tuple[str, Tensor]]:
    """`(path, tensor)` for the constant tensors directly held by a module (or container)."""
    return [(join(path, seg), v) for seg, k, v in children(value, with_leaves=True) if k == CONST]


GROUP_KINDS = ("all", "regex", "path", "paths", "predicate")


def group_from_spec(spec: dict) -> ParamGroup:
    """The engine's ParamGroup for a group spec: `{"kind": "regex", "pattern": "^enc\\."}`,
    `{"kind": "path", "path": "fc1.weight"}`, `{"kind": "paths", "paths": [...]}`,
    `{"kind": "predicate", "text": "attn"}` or `{"kind": "all"}`. A bad regex raises
    `ParamGroupError` with the regex module's message."""
    kind = spec.get("kind")
    if kind == "all":
        return ParamGroup.all()
    if kind == "regex":
        return ParamGroup.from_regex(spec["pattern"])
    if kind == "path":
        return ParamGroup.from_path(spec["path"])
    if kind == "paths":
        return ParamGroup.from_paths(spec["paths"])
    if kind == "predicate":
        return ParamGroup.from_predicate(spec["text"])
    raise ValueError(f"unknown parameter group kind {kind!r}: expected one of {', '.join(GROUP_KINDS)}")


def group_matches(module: Any, group: ParamGroup) -> list[tuple[str, Param]]:
    """The parameters of `module` (adapter factors included) that `group` selects."""
    return [(path, p) for path, p in module.named_params() if group.matches(p.id, path)]
