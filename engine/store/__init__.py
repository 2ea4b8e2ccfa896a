"""Checkpoints: burnpack (.bpk) and safetensors files, records of modules, adapters.

`from engine.store import ModuleRecord, RecordError`; see `record.py`.
"""
from .adapters import Adapter, PyTorchAdapter
from .burnpack import Scalar, TensorEntry
from .errors import RecordError
from .record import ModuleRecord
from .remap import KeyRemapper

__all__ = ["Adapter", "KeyRemapper", "ModuleRecord", "PyTorchAdapter", "RecordError", "Scalar", "TensorEntry"]

# Module.into_record / into_record_group / load_record delegate to these
from .module_io import into_record, into_record_group, load_record  # noqa: E402

__all__ += ["into_record", "into_record_group", "load_record"]
