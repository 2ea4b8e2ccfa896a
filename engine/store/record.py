"""`ModuleRecord`: a module's parameters as named tensors, saved and loaded as files.

    record = module.into_record()
    record.save("model")                       # writes model.bpk (burnpack)
    record = ModuleRecord.load("model.bpk")    # reads every tensor into memory, closes the file
    module = module.load_record(record)

    ModuleRecord.load("m.safetensors", adapter="pytorch")    # PyTorch names and layouts
    record.save("m.safetensors", adapter="pytorch")

Format by extension: `.safetensors` is safetensors, anything else burnpack (`.bpk` appended
when the path has none); loading also reads `torch.save` zip files (`pytorch_model.bin`, `.pt`,
`.pth`) through `torch_pickle`, which never runs their pickle. Loading checks the header first (every shape, size and offset against
the file's length), then reads each tensor with one read into a new array of its own (small
neighbours together), through `filesource.FileSource`. No file is memory-mapped: **a loaded
record never depends on the file afterwards**, so rewriting, truncating or deleting the file
changes nothing in the record or in a module that loaded it, and a file that changes while it
is being read raises `RecordError` ("the file changed since it was opened"), never a crash.
A module that loads the record gets its arrays (no copy) the first time; a second module
loading the same record gets copies, so two modules never share memory. Saving is atomic
(see `atomic.py`).

A record built by `into_record()` holds the module's own arrays (no copy) and, per tensor, the
kind of module that owns it (`Linear`, `BatchNorm`, ...) so that adapters can translate it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import burnpack, safetensors_io, torch_pickle
from .adapters import get_adapter
from .atomic import atomic_write
from .burnpack import Scalar, TensorEntry
from .errors import RecordError
from .filesource import FileSource

__all__ = ["ModuleRecord", "RecordError", "TensorEntry", "Scalar"]


_TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def _is_safetensors(path: Path) -> bool:
    return path.suffix.lower() == ".safetensors"


class ModuleRecord:
    """Named tensors in traversal order, plus user metadata (text to text) and typed scalars."""

    def __init__(self, entries=(), metadata=None, scalars=None, *, adapter=None):
        self._entries: dict[str, TensorEntry] = {}
        for e in entries:
            if e.name in self._entries:
                raise RecordError(f"duplicate tensor name {e.name!r} in a record")
            self._entries[e.name] = e
        self.metadata: dict[str, str] = dict(metadata or {})
        self.scalars: dict[str, Scalar] = {k: Scalar.of(v) for k, v in (scalars or {}).items()}
        self.adapter = get_adapter(adapter)
        self._partial = False
        self._unused = False
        self._owners: dict[str, str] = {}  # name -> owning module's class name (from into_record)
        self._claimed: set[str] = set()    # names whose arrays a module already took
        self.source: str | None = None     # the file it was loaded from (named in load errors)

    # ------------------------------------------------------------------ contents
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __getitem__(self, name) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in the record; it holds {list(self._entries)[:20]}") from None

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[TensorEntry]:
        return list(self._entries.values())

    def items(self):
        return self._entries.items()

    def get(self, name, default=None):
        return self._entries.get(name, default)

    def owner(self, name: str) -> str | None:
        """The class name of the module that owned tensor `name` when the record was built from
        a module, else None."""
        return self._owners.get(name)

    def set_owner(self, name: str, owner: str | None) -> None:
        if owner is None:
            self._owners.pop(name, None)
        else:
            self._owners[name] = owner

    def add(self, entry: TensorEntry, owner: str | None = None) -> None:
        if entry.name in self._entries:
            raise RecordError(f"duplicate tensor name {entry.name!r} in a record")
        self._entries[entry.name] = entry
        self.set_owner(entry.name, owner)

    def with_key_remapping(self, remapper) -> "ModuleRecord":
        """A record whose tensors are renamed by `remapper` (a `KeyRemapper` or a list of
        (pattern, replacement) pairs), as Burn's `with_key_remapping`. The arrays are shared, not
        copied; owners, metadata, scalars, the adapter and the loading options carry over."""
        from .remap import KeyRemapper  # noqa: PLC0415

        if not isinstance(remapper, KeyRemapper):
            remapper = KeyRemapper(remapper)
        names = remapper.mapping(self._entries)
        out = ModuleRecord(metadata=self.metadata)
        out.scalars = dict(self.scalars)
        for old, e in self._entries.items():
            new = names[old]
            out._entries[new] = e if new == old else TensorEntry(new, e.dtype, e.shape, e.array, e.param_id, e.scheme)
            if old in self._owners:
                out._owners[new] = self._owners[old]
        out.adapter, out._partial, out._unused, out.source = self.adapter, self._partial, self._unused, self.source
        return out

    def num_params(self) -> int:
        return sum(int(np.prod(e.shape)) for e in self._entries.values())

    def __repr__(self) -> str:
        return f"ModuleRecord({len(self._entries)} tensors, {self.num_params()} values)"

    # ------------------------------------------------------------------ loading options
    def allow_partial(self, flag: bool = True) -> "ModuleRecord":
        """Loading leaves parameters the record lacks as they are (instead of failing)."""
        self._partial = bool(flag)
        return self

    def allow_unused(self, flag: bool = True) -> "ModuleRecord":
        """Loading ignores tensors the module has no parameter for (instead of failing)."""
        self._unused = bool(flag)
        return self

    @property
    def partial_allowed(self) -> bool:
        return self._partial

    @property
    def unused_allowed(self) -> bool:
        return self._unused

    def claim(self, name: str) -> np.ndarray:
        """The entry's values for a module to keep: the array itself the first time, a copy
        after that (so two modules never share one buffer)."""
        e = self._entries[name]
        values = e.values()
        if name in self._claimed:
            return np.array(values, copy=True)
        self._claimed.add(name)
        return values

    # ------------------------------------------------------------------ bytes
    def to_bytes(self) -> bytes:
        """The record as a burnpack."""
        return burnpack.encode(self.entries(), self.metadata, self.scalars)

    @classmethod
    def from_bytes(cls, data, adapter=None) -> "ModuleRecord":
        """A record from burnpack bytes (copied once, so that arrays are writable)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise RecordError(f"from_bytes expects bytes, got {type(data).__name__}")
        adapter = get_adapter(adapter)
        contents = burnpack.decode(bytearray(data), where="bytes")
        return cls._from_contents(contents, adapter)

    @classmethod
    def _from_contents(cls, contents, adapter) -> "ModuleRecord":
        rec = cls(contents.entries, contents.metadata, contents.scalars)
        rec.adapter = get_adapter(adapter)
        if rec.adapter is not None:
            rec.adapter.on_read(rec)
        return rec

    # ------------------------------------------------------------------ files
    def save(self, path, adapter=None) -> Path:
        """Write the record atomically; returns the path written (`.bpk` appended when `path`
        has no extension). `.safetensors` paths are written as safetensors."""
        target = Path(os.fspath(path))
        if not target.suffix:
            target = target.with_name(target.name + ".bpk")
        entries, metadata = self.entries(), self.metadata
        ad = get_adapter(adapter)
        if ad is not None:
            entries = ad.on_write(self)
        if _is_safetensors(target):
            if self.scalars:
                raise RecordError(f"cannot save to {target}: safetensors has no place for the record's "
                                  f"scalars {sorted(self.scalars)}; save as .bpk instead")
            def write(fp):
                safetensors_io.write(fp, entries, metadata)
        else:
            def write(fp):
                burnpack.write(fp, entries, metadata, self.scalars)
        try:
            return atomic_write(target, write)
        except OSError as exc:
            raise RecordError(f"cannot save to {target}: {exc.strerror or exc}") from None

    @classmethod
    def load(cls, path, adapter=None) -> "ModuleRecord":
        """Read a burnpack (or, for `.safetensors`, a safetensors file; for a zip file or a
        `.bin` / `.pt` / `.pth` path, a `torch.save` state dict, read by `torch_pickle` without
        running its pickle) into memory.

        Every tensor is read into an array of its own and the file is closed before this
        returns: the record never depends on the file afterwards (see `filesource.py`)."""
        adapter = get_adapter(adapter)  # an unknown adapter fails before the file is read
        p = Path(os.fspath(path))
        if not p.exists() and not p.suffix and p.with_name(p.name + ".bpk").exists():
            p = p.with_name(p.name + ".bpk")
        where = str(p)
        fmt = safetensors_io if _is_safetensors(p) else burnpack
        with FileSource(p, where) as src:
            if src.size == 0:
                raise RecordError("the file is empty", where=where)
            first = src.read_bytes(0, 16)
            if fmt is burnpack and (torch_pickle.is_torch_zip(first) or (
                    p.suffix.lower() in _TORCH_SUFFIXES and first[:4] != burnpack.MAGIC_BYTES)):
                # a torch.save state dict (pytorch_model.bin, .pt): read without running its pickle
                contents = burnpack.Burnpack(torch_pickle.load_entries(src, where), {}, {})
                record = cls._from_contents(contents, adapter)
                record.source = where
                return record
            head = src.read_bytes(0, fmt.head_length(first, src.size, where))
            plan = fmt.plan(head, src.size, where)
            arrays = src.read_arrays(plan.spans())
        contents = burnpack.Burnpack(burnpack.entries(plan, arrays), plan.metadata, plan.scalars)
        record = cls._from_contents(contents, adapter)
        record.source = where
        return record
