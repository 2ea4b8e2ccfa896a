"""ModuleOptimizer: a per-tensor update rule applied to a whole module, as Burn's
`ModuleOptimizer` / `OptimizerAdaptor` does.

`model = optimizer.step(lr, model, grads)` maps the module (`module.map(mapper)`): every
float parameter whose id has a gradient in `grads` gets a new tensor (same id, same
trainability); every other parameter, a frozen one included, is returned untouched, the very
same object. Per-parameter state (momentum, moments, step counts) lives in the optimizer,
keyed by `ParamId`.

Update rules (`SimpleOptimizer`) work on arrays: `step(lr, param, grad, state, xp)` returns
the new parameter array and the state. They never write into `param` (a module clone may
share it) nor into `grad` (a backward rule may hand one array to several parameters, or a
read-only broadcast view); they update their own state arrays in place and allocate exactly
one fresh array, the new parameter value.

State records. `to_record()` gives an `OptimizerRecord`, saved as burnpack like Burn's: one
tensor per state array named `"<param id as decimal>.<field>"` (e.g.
`"1234.momentum.moment_1"`) carrying the parameter id, scalars `"<id>.<field>"` (step
counters) and `"<id>.__rank"`, and metadata `"<id>" -> parameter path`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..module.param import ParamId
from ..module.visitor import ModuleMapper
from ..tensor.raw import array, wrap


class SimpleOptimizer:
    """A per-tensor update rule. `state` is a dict: arrays and scalars under Burn's field
    paths; keys starting with `_` are scratch buffers, never saved."""

    def step(self, lr: float, param, grad, state: dict | None, xp):
        raise NotImplementedError


class OptimizerRecord:
    """An optimizer's state, as named tensors (with parameter ids), scalars and metadata."""

    def __init__(self, tensors=None, scalars=None, paths=None):
        self.tensors: list = tensors or []  # (name, np.ndarray, param_id int)
        self.scalars: dict = scalars or {}  # name -> (kind, value)
        self.paths: dict = paths or {}  # str(param id) -> module path

    def __len__(self) -> int:
        return len(self.tensors)

    def is_empty(self) -> bool:
        return not self.tensors

    def to_bytes(self) -> bytes:
        from ..store import burnpack as bp

        entries = [bp.TensorEntry.from_array(name, arr, pid) for name, arr, pid in self.tensors]
        scalars = {k: bp.Scalar(kind, v) for k, (kind, v) in self.scalars.items()}
        return bp.encode(entries, dict(self.paths), scalars)

    @staticmethod
    def from_bytes(data, where: str = "bytes") -> "OptimizerRecord":
        from ..store import burnpack as bp

        pack = bp.decode(data, where)
        tensors = [(e.name, np.array(e.values()), e.param_id) for e in pack.entries]
        scalars = {k: (s.kind, s.value) for k, s in pack.scalars.items()}
        return OptimizerRecord(tensors, scalars, dict(pack.metadata))

    def save(self, path) -> Path:
        p = Path(path)
        if not p.suffix:
            p = p.with_suffix(".bpk")
        from ..store.atomic import atomic_write  # noqa: PLC0415

        data = self.to_bytes()
        return atomic_write(p, lambda fp: fp.write(data))

    @staticmethod
    def load(path) -> "OptimizerRecord":
        p = Path(path)
        if not p.suffix and not p.exists():
            p = p.with_suffix(".bpk")
        return OptimizerRecord.from_bytes(p.read_bytes(), str(p))

    def __repr__(self) -> str:
        return f"OptimizerRecord({len(self.tensors)} tensors, {len(self.scalars)} scalars)"


class _ParamState:
    __slots__ = ("optim", "path", "state", "rank", "device")

    def __init__(self, optim, path, state, rank, device=None):
        self.optim = optim
        self.path = path
        self.state = state
        self.rank = rank
        self.device = device


class _StepMapper(ModuleMapper):
    __slots__ = ("opt", "lr", "grads", "stack")

    def __init__(self, opt: "ModuleOptimizer", lr: float, grads):
        self.opt = opt
        self.lr = lr
        self.grads = grads
        self.stack: list = []

    def enter_module(self, name, container_type) -> None:
        self.stack.append(name)

    def exit_module(self, name, container_type) -> None:
        self.stack.pop()

    def map_float(self, param):
        g = self.grads.remove(param.id)
        if g is None:
            return param
        opt = self.opt
        t = param.base()
        device = t.device
        xp = device.xp
        arr = array(t)
        garr = array(g)
        if g.device is not device:
            garr = device.asarray(g.numpy() if hasattr(g, "numpy") else garr)
        if garr.shape != arr.shape:
            raise ValueError(
                f"optimizer step: the gradient of parameter {'.'.join(self.stack)} (id {param.id}) has dims "
                f"{list(garr.shape)}, the parameter has {list(arr.shape)}"
            )
        if garr.dtype != arr.dtype:
            garr = garr.astype(arr.dtype)
        if opt.grad_clipping is not None:
            garr = opt.grad_clipping.clip_array(garr, xp)
        entry = opt.states.get(param.id)
        if entry is None:
            path = ".".join(self.stack)
            entry = _ParamState(opt._optimizer_for(param.id, path), path, None, arr.ndim, device)
            opt.states[param.id] = entry
        elif entry.device is not device and entry.state is not None:
            entry.state = _state_to(entry.state, device)
            entry.device = device
        with device.context():
            new, entry.state = entry.optim.step(self.lr, arr, garr, entry.state, xp)
        out = wrap(new, device, True)
        if t.is_require_grad():
            out = out.set_require_grad(True)
        return param.map(lambda _base: out)


def _state_to(state: dict, device) -> dict:
    out = {}
    for key, value in state.items():
        if hasattr(value, "shape") and not isinstance(value, (np.generic,)):
            host = value if isinstance(value, np.ndarray) else value.get()
            value = device.asarray(host)
        out[key] = value
    return out


class ModuleOptimizer:
    """Optimizes a module with a per-tensor rule (and per-group rules), keeping state by id."""

    def __init__(self, optim: SimpleOptimizer, grad_clipping=None):
        self.default = optim
        self.groups: list = []  # (ParamGroup, SimpleOptimizer)
        self.states: dict = {}  # ParamId -> _ParamState
        self.grad_clipping = grad_clipping

    # ------------------------------------------------------------------ configuration
    def with_grad_clipping(self, clipping) -> "ModuleOptimizer":
        if hasattr(clipping, "init") and not hasattr(clipping, "clip_array"):
            clipping = clipping.init()
        self.grad_clipping = clipping
        return self

    def has_gradient_clipping(self) -> bool:
        return self.grad_clipping is not None

    def with_group(self, group, optimizer) -> "ModuleOptimizer":
        """Optimize the parameters in `group` with another rule (a config, an optimizer or a
        rule); existing state of those parameters is dropped."""
        rule = optimizer
        if hasattr(rule, "init") and not isinstance(rule, (SimpleOptimizer, ModuleOptimizer)):
            rule = rule.init()
        if isinstance(rule, ModuleOptimizer):
            rule = rule.default
        self.groups.append((group, rule))
        self.states = {k: v for k, v in self.states.items() if not group.matches(k, v.path)}
        return self

    def _optimizer_for(self, pid, path) -> SimpleOptimizer:
        chosen = self.default
        for group, rule in self.groups:
            if group.matches(pid, path):
                chosen = rule
        return chosen

    # ------------------------------------------------------------------ stepping
    def step(self, lr, module, grads):
        """The module with every parameter that has a gradient updated; the rest untouched."""
        lr = float(lr)
        if grads.is_empty():
            return module
        return module.map(_StepMapper(self, lr, grads))

    def reset(self) -> None:
        self.states.clear()

    # ------------------------------------------------------------------ records
    def to_record(self) -> OptimizerRecord:
        tensors, scalars, paths = [], {}, {}
        for pid, entry in self.states.items():
            if entry.state is None:
                continue
            prefix = str(pid.val())
            scalars[f"{prefix}.__rank"] = ("UInt", int(entry.rank))
            if entry.path is not None:
                paths[prefix] = entry.path
            for key, value in entry.state.items():
                if key.startswith("_"):
                    continue
                name = f"{prefix}.{key}"
                if isinstance(value, (bool, np.bool_)):
                    scalars[name] = ("Bool", bool(value))
                elif isinstance(value, (int, np.integer)):
                    scalars[name] = ("UInt", int(value)) if value >= 0 else ("Int", int(value))
                elif isinstance(value, (float, np.floating)):
                    scalars[name] = ("Float", float(value))
                else:
                    host = value if isinstance(value, np.ndarray) else value.get()
                    tensors.append((name, np.array(host, copy=True), pid.val()))
        return OptimizerRecord(tensors, scalars, paths)

    def load_record(self, record: OptimizerRecord, device=None) -> "ModuleOptimizer":
        """Replace the state by the record's; state arrays go to `device` (default: the
        default device) and follow each parameter to its device on the next step."""
        from ..tensor.device import as_device

        dev = as_device(device)
        by_id: dict = {}
        for name, (kind, value) in record.scalars.items():
            head, _, key = name.partition(".")
            if not head.isdigit() or not key:
                continue
            by_id.setdefault(int(head), {})[key] = value
        for name, arr, pid in record.tensors:
            head, _, key = name.partition(".")
            if pid is None and head.isdigit():
                pid = int(head)
            if pid is None or not key:
                continue
            by_id.setdefault(int(pid), {})[key] = dev.asarray(np.array(arr, copy=True))
        states = {}
        for raw_id, fields in by_id.items():
            rank = fields.pop("__rank", None)
            pid = ParamId(raw_id)
            path = record.paths.get(str(raw_id))
            if rank is None:
                arrays = [v for v in fields.values() if hasattr(v, "shape")]
                rank = arrays[0].ndim if arrays else 0
            states[pid] = _ParamState(self._optimizer_for(pid, path), path, fields, int(rank), dev)
        self.states = states
        return self

    def to_bytes(self) -> bytes:
        return self.to_record().to_bytes()

    def from_bytes(self, data, device=None) -> "ModuleOptimizer":
        return self.load_record(OptimizerRecord.from_bytes(data), device)

    def save(self, path) -> Path:
        return self.to_record().save(path)

    def load(self, path, device=None) -> "ModuleOptimizer":
        return self.load_record(OptimizerRecord.load(path), device)

    def __repr__(self) -> str:
        return f"ModuleOptimizer({self.default!r}, {len(self.states)} parameter states)"
