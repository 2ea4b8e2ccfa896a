"""Checkpoint export and import, as plain functions a worker thread can run (no Qt here).

Export: the whole model, the adapters only (the LoRA factors), or materialized (adapters folded
into plain weights); `.bpk`, or `.safetensors` written with the PyTorch adapter.
Import: strict first; with allow-partial, whatever fits is loaded and the report lists the
missing, unused and mismatched tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ADAPTER_REGEX = r"(^|\.)lora\.(a|b|magnitude)$"  # DoRA adds a magnitude per output column
EXPORT_KINDS = ("whole", "adapters", "materialized")


@dataclass
class LoadReport:
    path: str
    loaded: int = 0  # tensors taken from the record
    missing: list = field(default_factory=list)  # (path, expected shape)
    unused: list = field(default_factory=list)  # (path, found shape)
    mismatched: list = field(default_factory=list)  # (path, expected shape, found shape)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unused or self.mismatched)

    def lines(self) -> list[str]:
        out = []
        for p, s in self.missing:
            out.append(f"missing    {p}  expected {_shape(s)}")
        for p, s in self.unused:
            out.append(f"unused     {p}  found {_shape(s)}")
        for p, e, f in self.mismatched:
            out.append(f"mismatched {p}  expected {_shape(e)}, found {_shape(f)}")
        return out

    def summary(self) -> str:
        return (f"{self.loaded} tensors loaded, {len(self.missing)} missing, {len(self.unused)} unused, "
                f"{len(self.mismatched)} mismatched")


def _shape(s) -> str:
    return "?" if s is None else "[" + ", ".join(str(int(d)) for d in s) + "]"


def adapter_for(path: str | Path) -> str | None:
    return "pytorch" if str(path).lower().endswith(".safetensors") else None


def export(module: Any, path: str | Path, kind: str, progress: Callable[[float], None] | None = None) -> Path:
    """Write `module` as `kind` (whole | adapters | materialized) to `path`."""
    from engine.module import ParamGroup  # noqa: PLC0415

    if kind not in EXPORT_KINDS:
        raise ValueError(f"unknown export kind {kind!r}: expected one of {', '.join(EXPORT_KINDS)}")
    progress = progress or (lambda f: None)
    model = module.valid()
    if kind == "adapters":
        group = ParamGroup.from_regex(ADAPTER_REGEX)
        if not any(group.matches(p.id, name) for name, p in model.named_params()):
            raise ValueError("the model has no LoRA adapters to export: attach LoRA first, "
                             "or export the whole model")
        record = model.into_record_group(group)
    elif kind == "materialized":
        record = model.materialize().into_record()
    else:
        record = model.into_record()
    progress(0.5)
    written = record.save(path, adapter=adapter_for(path))
    progress(1.0)
    return Path(written)


def load(module: Any, path: str | Path, allow_partial: bool,
         progress: Callable[[float], None] | None = None) -> tuple[Any, LoadReport]:
    """Load the checkpoint at `path` into `module`; returns the new module and a report.

    Without `allow_partial` any missing, unused or mismatched tensor raises `RecordError` (listing
    them all) and nothing changes. With it, the tensors that fit are loaded and the rest reported.
    """
    from engine.store import ModuleRecord, RecordError  # noqa: PLC0415

    progress = progress or (lambda f: None)
    record = ModuleRecord.load(path, adapter=adapter_for(path))
    progress(0.4)
    report = LoadReport(str(path))
    try:
        new = module.load_record(record.allow_partial(False).allow_unused(False))
    except RecordError as e:
        if not allow_partial or e.mismatched or not (e.missing or e.unused):
            raise
        report.missing, report.unused = list(e.missing), list(e.unused)
        new = module.load_record(record.allow_partial(True).allow_unused(True))
    progress(1.0)
    report.loaded = len(record) - len(report.unused)
    return new, report
