"""Records of modules: `module.into_record()`, `module.into_record_group(group)` and
`module.load_record(record)` (the Module methods delegate here).

Building a record visits the parameters in traversal order; each becomes a `TensorEntry` named
by its path, holding the parameter's own array (no copy on the CPU), its dtype and its
`ParamId`, and the record notes the class of the module that owns it (for adapters). A
reparameterized parameter contributes its base at its path and the reparameterization's
parameters below it (`weight.lora.a`). `into_record_group` reads only the parameters the group
matches: the others are never initialized.

Loading plans everything before changing anything: for every parameter of the module it finds
the stored tensor (through the record's adapter, which may look under another name and
transpose), then checks shapes and kinds. Missing, unused and mismatched tensors are all
reported in one `RecordError` (subject to `allow_partial` / `allow_unused`; a partial load
that would match no tensor at all is refused: it names the file, a few of the paths the module
expects and a few the record holds), and the receiver is never changed: the result is a new module. Each loaded parameter gets the stored id (a fresh
one when the file has none), keeps its device (a lazy parameter: the device it would have been
initialized on), its configured trainability and autodiff association, and its float dtype (the
stored values are cast to it; a lazy float parameter takes its device's default float dtype).
A lazy parameter is filled from the record without running its initializer.
"""
from __future__ import annotations

import numpy as np

from ..module import ModuleMapper, ModuleVisitor, Param, ParamId
from ..tensor import Tensor, raw
from .burnpack import TensorEntry, dtype_for_array
from .errors import RecordError
from .record import ModuleRecord

__all__ = ["into_record", "into_record_group", "load_record"]

_KIND_OF_DTYPE = {
    "F64": "float", "F32": "float", "Flex32": "float", "F16": "float", "BF16": "float",
    "I64": "int", "I32": "int", "I16": "int", "I8": "int",
    "U64": "int", "U32": "int", "U16": "int", "U8": "int",
    "Bool(Native)": "bool", "Bool(U8)": "bool", "Bool(U32)": "bool",
}


def _owner(container_type: str | None) -> str | None:
    if container_type and container_type.startswith("Struct:"):
        return container_type[len("Struct:"):]
    return None


class _PathTracker:
    """enter/exit bookkeeping shared by the visitor and the mapper below."""

    def __init__(self):
        self.names: list[str] = []
        self.types: list[str] = []

    def enter_module(self, name, container_type):
        self.names.append(name)
        self.types.append(container_type)

    def exit_module(self, name, container_type):
        self.names.pop()
        self.types.pop()

    def here(self) -> tuple[str, str | None]:
        return ".".join(self.names), _owner(self.types[-1] if self.types else None)


class _Params(_PathTracker, ModuleVisitor):
    """(path, owner class, param) for every parameter, in traversal order."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, str | None, Param]] = []

    def _add(self, param):
        path, owner = self.here()
        self.found.append((path, owner, param))

    visit_float = visit_int = visit_bool = _add


def _host_array(t: Tensor) -> np.ndarray:
    data = raw.array(t)
    if isinstance(data, np.ndarray):
        return data  # no copy: tensors are never changed in place
    return data.get()  # CuPy


def _collect(module, group=None) -> ModuleRecord:
    v = _Params()
    module.visit(v)
    record = ModuleRecord()
    for path, owner, param in v.found:
        if group is not None and not group.matches(param.id, path):
            continue  # never materialized
        arr = _host_array(param.val())
        entry = TensorEntry(path, dtype_for_array(arr), tuple(int(d) for d in arr.shape), arr, int(param.id))
        record.add(entry, owner)
    return record


def into_record(module) -> ModuleRecord:
    """Every parameter of `module` as a record (initializing lazy parameters)."""
    return _collect(module)


def into_record_group(module, group) -> ModuleRecord:
    """The parameters `group` matches; the others are not touched (a lazy one stays lazy)."""
    from ..module import ParamGroup

    if not isinstance(group, ParamGroup):
        raise TypeError(f"into_record_group expects a ParamGroup, got {type(group).__name__}")
    return _collect(module, group)


# ---------------------------------------------------------------------------------- loading
def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _plan(module, record: ModuleRecord):
    v = _Params()
    module.visit(v)
    adapter = record.adapter
    plan: dict[str, tuple] = {}
    used: set[str] = set()
    missing, mismatched, other = [], [], []
    for path, owner, param in v.found:
        expected = tuple(param.shape)
        sources = adapter.sources(path, owner, len(expected)) if adapter is not None else [(path, None)]
        hit = next(((name, fn) for name, fn in sources if name in record), None)
        if hit is None:
            missing.append((path, expected))
            continue
        name, transform = hit
        used.add(name)
        entry = record[name]
        found = tuple(reversed(entry.shape)) if transform is not None and len(entry.shape) == 2 else entry.shape
        if found != expected:
            label = path if name == path else f"{path} (stored as {name}{', transposed' if transform else ''})"
            mismatched.append((label, expected, found))
            continue
        kind = _KIND_OF_DTYPE.get(entry.dtype)
        if kind is None:
            other.append(f"unsupported {path}: stored as {entry.dtype}, which cannot be loaded into a parameter")
            continue
        if kind != param.kind and not (kind == "int" and param.kind == "float"):
            other.append(f"kind      {path}: a {param.kind} parameter, stored as {entry.dtype} ({kind})")
            continue
        plan[path] = (name, transform, param)
    unused = [] if record.unused_allowed else [(n, record[n].shape) for n in record if n not in used]
    if record.partial_allowed and v.found and not plan and not (mismatched or other):
        raise _matched_nothing(module, record, v.found, missing)
    if record.partial_allowed:
        missing = []
    if missing or unused or mismatched or other:
        raise RecordError.for_load(type(module).__name__, missing, unused, mismatched, other)
    return plan


def _examples(items, n: int = 3) -> str:
    shown = ", ".join(f"{name} {_fmt(shape)}" for name, shape in items[:n])
    return shown + (f", … ({len(items) - n} more)" if len(items) > n else "")


def _matched_nothing(module, record: ModuleRecord, found, missing) -> RecordError:
    """A partial load that would load nothing: the error says what the module expects and what
    the record holds (a few paths of each), and names the file the record came from."""
    expects = [(path, tuple(param.shape)) for path, _owner, param in found]
    holds = [(name, record[name].shape) for name in record]
    adapter = record.adapter
    looked = f" (read through the {type(adapter).__name__})" if adapter is not None else ""
    text = (f"no tensor of the record fits {type(module).__name__}, so a partial load would load nothing: "
            f"the model expects {len(expects)} parameter(s) such as {_examples(expects)}; the record{looked} "
            + (f"holds {len(holds)} tensor(s) such as {_examples(holds)}" if holds else "holds no tensors"))
    err = RecordError(text, where=getattr(record, "source", None), missing=missing,
                      unused=[(n, record[n].shape) for n in record])
    err.matched_nothing = True
    return err


def _target_dtype(param: Param, values: np.ndarray):
    if param.kind != "float":
        return None  # ints and bools keep the stored width
    if param.is_initialized():
        return param.base().dtype  # already a value: base() runs no initializer
    return param.lazy_device().default_float_dtype


def _loaded_param(param: Param, values: np.ndarray, param_id) -> Param:
    device = param.lazy_device()
    dtype = _target_dtype(param, values)
    t = Tensor.from_data(values, device=device, dtype=dtype)
    active = param.is_active()
    if param.is_autodiff():
        t = t.autodiff()
        if active and t.kind == "float":
            t = t.set_require_grad(True)
    pid = ParamId() if param_id is None else ParamId(param_id)
    return Param.initialized(t, id=pid, active=active)


class _Loader(_PathTracker, ModuleMapper):
    def __init__(self, record: ModuleRecord, plan):
        super().__init__()
        self.record = record
        self.plan = plan

    def _map(self, param):
        path, _ = self.here()
        item = self.plan.get(path)
        if item is None:
            return param
        name, transform, _ = item
        values = self.record.claim(name)
        if transform is not None:
            values = transform(values)
        return _loaded_param(param, values, self.record[name].param_id)

    map_float = map_int = map_bool = _map


def load_record(module, record) -> object:
    """A new module holding the record's values (the receiver is unchanged)."""
    if not isinstance(record, ModuleRecord):
        raise TypeError(f"load_record expects a ModuleRecord, got {type(record).__name__}")
    plan = _plan(module, record)
    return module.map(_Loader(record, plan))
