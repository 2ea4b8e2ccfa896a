"""Parameter statistics: how many parameters train, in total and for every path of the tree.

`trainable_summary(module)` is the line users know from PEFT's `print_trainable_parameters`:

    trainable params: 2,048 || all params: 36,618 || trainable%: 5.5929

`ModelStats(module)` is one pass over the parameters that gives, for every tree path (module,
container, parameter, reparameterization; "" for the whole model), a `ParamStats`: element and
trainable counts, tensor counts (initialized ones among them), the devices, and how many
reparameterized parameters (LoRA) live below. The app's tree, inspector and status bar read it;
`trainable_counts` is its total.

Every parameter element counts once: a reparameterized parameter counts its base and the
parameters of its reparameterization (LoRA factors). A weight packed as NF4 (QLoRA) counts by
its logical element count, not by the bytes and scale constants it is packed into (those are
counted only on the packed storage's own nodes). A parameter is trainable when it is a float
parameter configured to train (`Param.is_active()`: kept across `valid()`). Nothing is
initialized.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .lora import NF4Weight
from .module import Module
from .param import Param
from .tree import _KIND_OF_TYPE, FieldKind, children, kind_of

__all__ = ["ModelStats", "ParamStats", "TrainableCounts", "param_trainable", "trainable_counts", "trainable_summary"]


@dataclass(frozen=True)
class TrainableCounts:
    """Parameter element counts: `trainable` of `total`."""

    trainable: int
    total: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def percent(self) -> float:
        """The trainable share in percent (0 for a module without parameters)."""
        return 100.0 * self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return f"trainable params: {self.trainable:,d} || all params: {self.total:,d} || trainable%: {self.percent:.4f}"


def param_trainable(p: Param) -> bool:
    """Whether a parameter counts as trainable: a float parameter configured to train."""
    return p.kind == "float" and p.is_active()


@dataclass
class ParamStats:
    """The parameters at and below one tree path."""

    numel: int = 0
    trainable: int = 0
    tensors: int = 0  # parameters (each a tensor), packed storage included on its own nodes
    initialized: int = 0  # of those, how many hold a value (the rest are lazy)
    floats: int = 0  # float tensors that can train (running state, such as BatchNorm's statistics, is not)
    trainable_floats: int = 0
    devices: list = field(default_factory=list)  # device names, in traversal order
    reparameterized: int = 0  # parameters below with a reparameterization (an adapter: LoRA, DoRA, QLoRA, ...)
    quantized: int = 0  # parameters below kept in stored quantized blocks (a GGUF weight, with or without LoRA)
    stored_bytes: int = 0  # the bytes those blocks take

    @property
    def counts(self) -> TrainableCounts:
        return TrainableCounts(self.trainable, self.numel)

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


_PARAM, _MODULE, _CONTAINER, _REPARAM = (FieldKind.PARAM, FieldKind.MODULE, FieldKind.CONTAINER,
                                         FieldKind.REPARAMETERIZATION)


def _children(value: Any):
    """`tree.children`, a module's fields read inline (the common node: one call less per child)."""
    if not isinstance(value, Module):
        return children(value)
    out = []
    for name, v in value.__dict__.items():
        if name[:1] == "_" or v is None:
            continue
        k = _KIND_OF_TYPE.get(type(v)) or kind_of(v)
        if k is not FieldKind.PLAIN and k is not FieldKind.NONE:
            out.append((name, k, v))
    return out


class ModelStats:
    """Per-path statistics of one module (or None), from one traversal of its parameters."""

    def __init__(self, module: Any):
        self.by_path: dict[str, ParamStats] = {}
        self._seen: dict = {}  # param id -> the path it is counted at (one held at several places counts once)
        self.shared: dict[str, str] = {}  # the other places of such a parameter -> the path it is counted at
        if module is not None:
            self._walk(module, "", [self._get("")])

    def _get(self, path: str) -> ParamStats:
        s = self.by_path.get(path)
        if s is None:
            s = self.by_path[path] = ParamStats()
        return s

    def _walk(self, value: Any, path: str, chain: list[ParamStats]) -> None:
        by_path = self.by_path
        for seg, kind, v in _children(value):
            if kind is not _PARAM and kind is not _MODULE and kind is not _CONTAINER and kind is not _REPARAM:
                continue  # flags and constants hold no parameters
            p = f"{path}.{seg}" if path else seg
            s = by_path.get(p)  # a path is met once: made here
            if s is None:
                s = by_path[p] = ParamStats()
            if kind is _PARAM:
                if v.id in self._seen:  # shared (a fused module's LoRA A): counted at its first path only
                    self.shared[p] = self._seen[v.id]
                    continue
                self._seen[v.id] = p
            if isinstance(v, NF4Weight) or getattr(type(v), "PACKED_STORAGE", False):
                # QLoRA's packed bytes (or a GGUF weight's blocks) stand for the base weight, which
                # is counted already: their numbers stay on their own nodes
                self._walk(v, p, [s])
                continue
            chain.append(s)
            if kind is _PARAM:
                self._add_param(v, chain)
                if v.reparameterization is not None:
                    r = v.reparameterization
                    stored = r if getattr(r, "TAKES_ADAPTER", False) else getattr(r, "gguf", None)
                    for st in chain:
                        if stored is not r:  # a stored quantized base alone is the weight, not an adapter
                            st.reparameterized += 1
                        if stored is not None and hasattr(stored, "nbytes"):
                            st.quantized += 1
                            st.stored_bytes += stored.nbytes()
                    self._walk(v, p, chain)
            else:
                self._walk(v, p, chain)
            chain.pop()

    @staticmethod
    def _add_param(p: Param, chain: list[ParamStats]) -> None:
        n = p.numel()
        trainable = param_trainable(p)
        # running state (BatchNorm's statistics) is saved and counted, never trained, never frozen: it
        # is no float tensor of the trainable state, or a block with it could never read "trainable"
        is_float = p.kind == "float" and not p.is_running_state()
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

    def get(self, path: str) -> ParamStats:
        """The statistics at `path` (empty ones for a path without parameters)."""
        return self.by_path.get(path) or ParamStats()

    @property
    def total(self) -> ParamStats:
        return self.get("")


def trainable_counts(module: Module) -> TrainableCounts:
    """The trainable and total parameter element counts of `module` (see this file's doc)."""
    if not isinstance(module, Module):
        raise TypeError(f"trainable_counts expects a Module, got {type(module).__name__}")
    return ModelStats(module).total.counts


def trainable_summary(module: Module) -> str:
    """`trainable params: … || all params: … || trainable%: …` for `module`."""
    return str(trainable_counts(module))
