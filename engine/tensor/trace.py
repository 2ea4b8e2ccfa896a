"""Op-level tracing: one forward pass recorded as a list of operations.

    from engine.tensor.trace import Tracer
    with Tracer() as tr:
        tr.input(x, "input")
        y = model.forward(x)
        tr.output(y)
    trace = tr.trace          # trace.ops: op name, input / output tensors, attributes, scope

Every tensor operation (a `Tensor` method, an operator, `cat` / `stack`, and the fused kernels
that `engine.nn._ops` registers with `register_functions`) is recorded once, with:

- `op`: its name (`add`, `matmul`, `reshape`, `getitem`, `linear`, `rms_norm`, ...);
- `inputs`: the ids of its tensor arguments (`input_names` says which argument each is:
  `self`, `other`, `weight`, `tensors.1`, `key.0`), `outputs`: the ids of the tensors it returned;
- `attrs`: every other argument as it was passed (dims, axes, shapes, slices, scalars, arrays);
- `scope` / `scopes`: the module path it ran in (innermost) and the stack of module paths,
  which whoever drives the trace sets with `push_scope` / `pop_scope` (`engine.design`'s
  `trace_model` does it at every module boundary).

`detach`, `inner`, `autodiff`, `require_grad`, `to_device` record no op: their result is the
traced tensor they were called on. An op that other ops implement is recorded once: what runs inside it is not recorded. A tensor
an op reads that is neither a traced input nor an op's output is a constant (`source` "const");
one named in `names` (the parameters' and constants' paths) keeps that name (`source` "param").

Off, tracing costs nothing: the recording wrappers are installed on `Tensor` (and on the
registered functions) when a `Tracer` is entered and removed when it exits, so the methods
called outside a trace are the plain ones (`is_active()` is the one global check). A trace
records the ops of the thread that entered it only; one trace at a time.
"""
from __future__ import annotations

import inspect
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from .tensor import Tensor, TensorError

__all__ = ["Tracer", "Trace", "TracedOp", "TracedTensor", "ModuleCall", "TraceError", "register_functions", "is_active",
           "hook_calls"]


class TraceError(TensorError):
    """Tracing was used wrongly (a second trace at once, an output that is not a tensor)."""


@dataclass
class TracedTensor:
    """A tensor the trace saw: `source` is "input", "param" (a named parameter or constant),
    "const" (an unnamed tensor an op read) or "op" (an op's output)."""

    id: int
    shape: tuple
    dtype: str
    source: str
    name: str | None = None
    producer: int | None = None  # index of the op that made it


@dataclass
class TracedOp:
    index: int
    op: str
    inputs: list
    input_names: list
    outputs: list
    attrs: dict
    scope: str = ""
    scopes: tuple = ()


@dataclass
class ModuleCall:
    """One module's forward in a trace: its path and type, the ids of the tensors it was given
    and returned, and the ops that ran inside it (`trace.ops[first:end]`)."""

    path: str
    type_name: str
    inputs: list
    outputs: list
    first: int
    end: int


@dataclass
class Trace:
    ops: list = field(default_factory=list)
    tensors: dict = field(default_factory=dict)  # id -> TracedTensor
    inputs: list = field(default_factory=list)  # ids of the traced inputs
    outputs: list = field(default_factory=list)  # ids of the traced outputs
    values: dict = field(default_factory=dict)  # id -> Tensor, for params and constants
    modules: list = field(default_factory=list)  # (path, type name) of every module call, in order
    calls: list = field(default_factory=list)  # ModuleCall of every module call, in the order they ended

    def op_names(self) -> list[str]:
        return [o.op for o in self.ops]

    def ops_in(self, scope: str) -> list[TracedOp]:
        """The ops that ran inside the module at path `scope` (or below it)."""
        return [o for o in self.ops if scope in o.scopes]

    def params(self) -> dict[str, TracedTensor]:
        return {t.name: t for t in self.tensors.values() if t.source == "param"}


# ---- registry of what is traced --------------------------------------------------------------
# Tensor attributes that are not operations (metadata, host access, autodiff state, creation from
# data: a created tensor an op reads is a constant)
_NOT_OPS = {
    "__array__", "__bool__", "__float__", "__hash__", "__init__", "__int__", "__len__", "__repr__",
    "_creation_dtype", "_wrap", "backward", "dims", "grad", "grad_remove", "is_autodiff", "is_require_grad",
    "is_tracked", "item", "numel", "numpy", "tolist", "from_data", "zeros", "ones", "full", "arange", "random",
    "tril_mask", "triu_mask", "diag_mask",
}
# the same values under another autodiff state: identity in a forward pass
_IDENTITY = {"autodiff", "inner", "detach", "require_grad", "set_require_grad", "to_device"}

_registered: list[tuple[Any, str, str]] = []  # (owner, attribute, op name) beside Tensor's own methods


def register_function(owner, name: str, op: str) -> None:
    """Trace `owner.<name>` as op `op` while a trace runs (as `register_functions`, one name)."""
    _registered.append((owner, name, op))


def register_functions(owner, names, prefix: str = "") -> None:
    """Trace `owner.<name>` for each of `names` (module-level functions, such as the fused kernels
    of `engine.nn._ops`) while a trace runs; recorded as op `prefix + name`. Costs nothing outside
    a trace: the attribute is replaced only while a `Tracer` is active."""
    for n in names:
        _registered.append((owner, n, prefix + n))


_active: "Tracer | None" = None
_lock = threading.Lock()
hook_calls = 0  # how many op calls the tracing wrappers have seen, ever (tests: 0 while off)


def is_active() -> bool:
    """Whether a trace is recording now (on some thread)."""
    return _active is not None


def _op_name(attr: str, fn) -> str:
    name = getattr(fn, "__name__", attr)
    if attr in _IDENTITY:
        return "identity"
    return name.strip("_") or attr


_SIGS: dict = {}


def _signature(fn):
    s = _SIGS.get(fn)
    if s is None:
        try:
            s = inspect.signature(fn)
        except (TypeError, ValueError):
            s = False
        _SIGS[fn] = s
    return s


def _wrapper(original, op: str):
    def traced(*args, **kwargs):
        global hook_calls
        hook_calls += 1
        tr = _active
        if tr is None or tr._depth or tr._thread != threading.get_ident():
            return original(*args, **kwargs)
        tr._depth += 1
        try:
            out = original(*args, **kwargs)
        finally:
            tr._depth -= 1
        tr._record_call(op, original, args, kwargs, out)
        return out

    traced.__wrapped__ = original
    traced.__name__ = getattr(original, "__name__", op)
    traced.__doc__ = getattr(original, "__doc__", None)
    return traced


def _tensor_targets():
    out = []
    for attr, value in list(vars(Tensor).items()):
        if attr in _NOT_OPS:
            continue
        static = isinstance(value, staticmethod)
        fn = value.__func__ if static else value
        if not inspect.isfunction(fn):
            continue
        out.append((Tensor, attr, value, fn, static))
    return out


class Tracer:
    """Context manager recording the ops of one forward pass into `self.trace`.

    `names` maps `id(tensor)` to a name (a parameter's path): such tensors are recorded with
    `source` "param" and that name."""

    def __init__(self, names: dict[int, str] | None = None):
        self.trace = Trace()
        self.names = dict(names or {})
        # id(tensor) -> (a weak reference to it, its traced tensor): an activation is not kept alive
        # by the trace, and an id that a freed tensor's successor reuses is told apart by the reference
        self._by_pyid: dict[int, tuple] = {}
        self._scopes: list[str] = []
        self._depth = 0
        self._thread = None
        self._saved: list = []

    # ---- lifecycle
    def __enter__(self) -> "Tracer":
        global _active
        with _lock:
            if _active is not None:
                raise TraceError("a trace is already recording; traces do not nest")
            self._thread = threading.get_ident()
            try:
                for owner, attr, value, fn, static in _tensor_targets():
                    w = _wrapper(fn, _op_name(attr, fn))
                    self._saved.append((owner, attr, value))
                    setattr(owner, attr, staticmethod(w) if static else w)
                for owner, attr, op in _registered:
                    value = inspect.getattr_static(owner, attr)
                    static = isinstance(value, staticmethod)
                    w = _wrapper(value.__func__ if static else value, op)
                    self._saved.append((owner, attr, value))
                    setattr(owner, attr, staticmethod(w) if static else w)
            except BaseException:
                self._restore()
                raise
            _active = self
        return self

    def _restore(self) -> None:
        for owner, attr, value in reversed(self._saved):
            setattr(owner, attr, value)
        self._saved.clear()

    def __exit__(self, *exc) -> bool:
        global _active
        with _lock:
            self._restore()
            _active = None
        return False

    # ---- scopes
    def push_scope(self, path: str, type_name: str = "") -> None:
        self._scopes.append(path)
        self.trace.modules.append((path, type_name))

    def pop_scope(self) -> None:
        self._scopes.pop()

    @property
    def scopes(self) -> list[str]:
        """The module paths entered and not yet left, outermost first (read it, do not change it)."""
        return self._scopes

    @property
    def scope(self) -> str:
        return self._scopes[-1] if self._scopes else ""

    def module_call(self, path: str, type_name: str, args, out, first: int) -> None:
        """Record that the module at `path` ran on the tensors in `args` and returned `out`, its
        ops starting at `trace.ops[first]` (the drivers of module scopes call it)."""
        ins = [self.tensor_id(t) for t in flat_tensors(list(args))]
        outs = [self.tensor_id(t) for t in flat_tensors(out)]
        self.trace.calls.append(ModuleCall(path, type_name, ins, outs, first, len(self.trace.ops)))

    # ---- tensors
    def _info(self, t: Tensor, source: str, name: str | None = None, producer: int | None = None) -> TracedTensor:
        info = TracedTensor(len(self.trace.tensors), tuple(int(d) for d in t.shape), str(t.dtype), source, name,
                            producer)
        self.trace.tensors[info.id] = info
        self._by_pyid[id(t)] = (weakref.ref(t), info)
        return info

    def tensor_id(self, t: Tensor) -> int:
        """The id of `t` in the trace; a tensor not seen yet is a parameter (when named) or a constant."""
        entry = self._by_pyid.get(id(t))
        info = entry[1] if entry is not None and entry[0]() is t else None
        if info is None:
            name = self.names.get(id(t))
            info = self._info(t, "param" if name is not None else "const", name)
            self.trace.values[info.id] = t
        return info.id

    def input(self, t: Tensor, name: str = "input") -> int:
        """Declare `t` a graph input."""
        info = self._info(t, "input", name)
        self.trace.inputs.append(info.id)
        return info.id

    def output(self, value) -> list[int]:
        """Declare the tensors in `value` (a tensor, or lists, tuples, dicts of them) graph outputs."""
        ids = [self.tensor_id(t) for t in flat_tensors(value)]
        if not ids:
            raise TraceError(f"the traced forward returned no tensor (got {type(value).__name__})")
        self.trace.outputs.extend(ids)
        return ids

    # ---- ops
    def record(self, op: str, inputs, outputs, attrs: dict | None = None, input_names=None) -> "TracedOp":
        """Record one op by hand (a module that a shape rule stands for, in a shape-only trace)."""
        ids = [None if t is None else self.tensor_id(t) for t in inputs]
        rec = TracedOp(len(self.trace.ops), op, ids, list(input_names or [f"input.{i}" for i in range(len(ids))]),
                       [], dict(attrs or {}), self.scope, tuple(self._scopes))
        for t in outputs:
            rec.outputs.append(self._info(t, "op", None, rec.index).id)
        self.trace.ops.append(rec)
        return rec

    def _record_call(self, op, fn, args, kwargs, out) -> None:
        sig = _signature(fn)
        inputs, names, attrs = [], [], {}
        if sig:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                bound = None
        else:
            bound = None
        items = bound.arguments.items() if bound is not None else (
            [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items()))
        for name, value in items:
            if isinstance(value, Tensor):
                inputs.append(value)
                names.append(name)
            elif isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
                kept = []
                for i, v in enumerate(value):
                    if isinstance(v, Tensor):
                        inputs.append(v)
                        names.append(f"{name}.{i}")
                        kept.append(("tensor", len(inputs) - 1))
                    else:
                        kept.append(v)
                attrs[name] = tuple(kept)
            else:
                attrs[name] = value
        outs = flat_tensors(out)
        if not outs:
            return  # a query (all(), any() as a bool): nothing flows on
        if op == "identity" and len(inputs) == 1 and len(outs) == 1:
            # the same values under another autodiff state or device: the same traced tensor
            info = self.trace.tensors[self.tensor_id(inputs[0])]
            self._by_pyid[id(outs[0])] = (weakref.ref(outs[0]), info)
            return
        self.record(op, inputs, outs, attrs, names)


def flat_tensors(value, depth: int = 0) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    out: list[Tensor] = []
    if depth > 4:
        return out
    if isinstance(value, (list, tuple)):
        for v in value:
            out.extend(flat_tensors(v, depth + 1))
    elif isinstance(value, dict):
        for v in value.values():
            out.extend(flat_tensors(v, depth + 1))
    elif hasattr(value, "__dataclass_fields__"):
        for k in value.__dataclass_fields__:
            out.extend(flat_tensors(getattr(value, k), depth + 1))
    return out


# the functions layers call by module attribute (`ops_conv.conv2d(...)`) and the package's joins
def _register_tensor_functions() -> None:
    import sys  # noqa: PLC0415

    from . import ops_conv, ops_interp, ops_join, ops_pool  # noqa: PLC0415

    register_functions(ops_conv, ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                                  "conv_transpose3d"])
    register_functions(ops_pool, ["max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
                                  "adaptive_avg_pool2d", "max_pool1d_with_indices", "max_pool2d_with_indices"])
    register_functions(ops_interp, ["interpolate"])
    register_functions(ops_join, ["cat", "stack"])
    package = sys.modules[__name__.rsplit(".", 1)[0]]
    register_functions(package, ["cat", "stack", "where"])


_register_tensor_functions()
