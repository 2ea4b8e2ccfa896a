"""Adapters between other frameworks' checkpoints and Ember's (Burn's) names and layouts.

An adapter can only decide what a tensor is by knowing the module it belongs to: a rank-2
`weight` is transposed for a `Linear` but not for an `Embedding`. So the translation happens
where that knowledge exists:

- loading: `module.load_record(record)` asks the record's adapter, for every parameter of the
  target module (its path, the class of the module that owns it, its rank), which stored names
  may hold it and how to turn the stored array into the parameter's layout;
- saving: `record.save(path, adapter=...)` uses the owning module's class that
  `module.into_record()` noted for each tensor.

`PyTorchAdapter` ("pytorch"), as Burn's PyTorchToBurn / BurnToPyTorch adapters: a `Linear`'s
rank-2 `weight` is transposed ([out, in] in PyTorch, [in, out] in Burn); a norm layer's
(`BatchNorm`, `LayerNorm`, `GroupNorm`, `RmsNorm`, `InstanceNorm`) `gamma`/`beta` are PyTorch's
`weight`/`bias`; `num_batches_tracked` (PyTorch's BatchNorm step counter) is dropped on reading
and written as 0 on saving so that PyTorch's strict `load_state_dict` accepts the file.

GPT-2's `Conv1D` layers are Linear layers that PyTorch stores as [in, out], Burn's layout
already: their weights are neither transposed on loading nor on saving. Which weights are
Conv1D is told by the path: by default GPT-2's names (`attn.c_attn.weight`, `attn.c_proj.weight`,
`mlp.c_fc.weight`, `mlp.c_proj.weight`, with any prefix); `PyTorchAdapter(conv1d=[regex, ...])`
names others (each searched in the path; `conv1d=()` for none, e.g. for GPTBigCode, whose
`c_attn` / `c_proj` / `c_fc` are ordinary nn.Linear layers).
"""
from __future__ import annotations

import re

import numpy as np

from .burnpack import TensorEntry
from .errors import RecordError

NORM_LAYERS = frozenset({"BatchNorm", "LayerNorm", "GroupNorm", "RmsNorm", "InstanceNorm"})
_TO_TORCH = {"gamma": "weight", "beta": "bias"}


def _split(path: str) -> tuple[str, str]:
    prefix, _, attr = path.rpartition(".")
    return prefix, attr


def _join(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix else attr


class Adapter:
    """Identity adapter; subclass to translate. See the module docstring."""

    name = "identity"

    def on_read(self, record) -> None:
        """Called once on a record just read from a file (may drop tensors)."""

    def sources(self, path: str, owner: str | None, rank: int):
        """Where the parameter `path` (owned by a module of class `owner`, of rank `rank`) may
        be stored: a list of (stored name, transform or None), most likely first."""
        return [(path, None)]

    def on_write(self, record) -> list[TensorEntry]:
        """The entries to write for `record`."""
        return record.entries()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _transpose(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array).T)


GPT2_CONV1D = (r"(^|\.)attn\.c_attn\.weight$", r"(^|\.)attn\.c_proj\.weight$",
               r"(^|\.)mlp\.c_fc\.weight$", r"(^|\.)mlp\.c_proj\.weight$")


class PyTorchAdapter(Adapter):
    name = "pytorch"

    def __init__(self, conv1d=GPT2_CONV1D):
        if isinstance(conv1d, str):
            conv1d = [conv1d]
        try:
            self.conv1d = tuple(re.compile(p) for p in conv1d)
        except (re.error, TypeError) as exc:
            raise RecordError(f"PyTorchAdapter(conv1d=...): a list of regular expressions expected: {exc}") from None

    def is_conv1d(self, path: str) -> bool:
        """Whether the parameter `path` belongs to a Conv1D layer (stored [in, out], not transposed)."""
        return any(p.search(path) for p in self.conv1d)

    def _transposed(self, owner, attr, rank, path) -> bool:
        return owner == "Linear" and attr == "weight" and rank == 2 and not self.is_conv1d(path)

    def __repr__(self) -> str:
        if tuple(p.pattern for p in self.conv1d) == GPT2_CONV1D:
            return "PyTorchAdapter()"
        return f"PyTorchAdapter(conv1d={[p.pattern for p in self.conv1d]!r})"

    def on_read(self, record) -> None:
        for name in list(record.names()):
            if _split(name)[1] == "num_batches_tracked":
                record._entries.pop(name)

    def sources(self, path, owner, rank):
        prefix, attr = _split(path)
        if self._transposed(owner, attr, rank, path):
            return [(path, _transpose)]
        if owner in NORM_LAYERS and attr in _TO_TORCH:
            return [(_join(prefix, _TO_TORCH[attr]), None), (path, None)]
        return [(path, None)]

    def on_write(self, record):
        out = []
        unknown = []
        norms = []
        for e in record.entries():
            prefix, attr = _split(e.name)
            owner = record.owner(e.name)
            if owner is None and attr == "weight" and len(e.shape) == 2 and not self.is_conv1d(e.name):
                unknown.append(e.name)
            if self._transposed(owner, attr, len(e.shape), e.name):
                if e.dtype == "QFloat":
                    raise RecordError(f"tensor {e.name!r} is quantized; the PyTorch adapter cannot transpose it")
                t = _transpose(e.array)
                out.append(TensorEntry(e.name, e.dtype, tuple(t.shape), t, e.param_id))
            elif owner in NORM_LAYERS and attr in _TO_TORCH:
                out.append(TensorEntry(_join(prefix, _TO_TORCH[attr]), e.dtype, e.shape, e.array, e.param_id))
            else:
                out.append(e)
            if owner == "BatchNorm" and prefix not in norms:
                norms.append(prefix)
        if unknown:
            raise RecordError(
                "the PyTorch adapter must know which rank-2 weights belong to a Linear (they are "
                f"transposed) but this record does not say for {unknown[:5]}: build it with "
                "module.into_record()"
            )
        names = {e.name for e in out}
        for prefix in norms:
            name = _join(prefix, "num_batches_tracked")
            if name not in names:
                out.append(TensorEntry(name, "I64", (), np.zeros((), dtype=np.int64)))
        return out


_ADAPTERS = {"pytorch": PyTorchAdapter, "identity": Adapter, "burn": Adapter}


def get_adapter(adapter) -> Adapter | None:
    """None, a name ("pytorch") or an Adapter instance -> an Adapter (or None)."""
    if adapter is None or isinstance(adapter, Adapter):
        return adapter
    if isinstance(adapter, str):
        try:
            return _ADAPTERS[adapter.lower()]()
        except KeyError:
            raise RecordError(f"unknown adapter {adapter!r}: expected one of {sorted(_ADAPTERS)}") from None
    raise RecordError(f"adapter must be a name or an Adapter, got {type(adapter).__name__}")
