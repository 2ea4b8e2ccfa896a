"""Tracing a module tree: one forward pass recorded op by op under module paths (`trace_model`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from engine.module import contracts
from engine.module.tree import FieldKind, walk
from engine.tensor import Tensor
from engine.tensor.trace import Trace, Tracer, TraceError, flat_tensors

from ...design import shape_check
from ...nn import spec as layer_spec
from ..export_common import ExportError


class OnnxExportError(ExportError):
    """The model cannot be written as ONNX: the message names the op and the module path."""


# ---- tracing a module tree ----------------------------------------------------------------------
def param_names(model, params: bool) -> dict[int, str]:
    names: dict[int, str] = {}
    for path, kind, value in walk(model):
        if kind is FieldKind.CONSTANT and isinstance(value, Tensor):
            names.setdefault(id(value), path)
        elif params and kind is FieldKind.PARAM and value.is_initialized() and value.reparameterization is None:
            names.setdefault(id(value.val()), path)
    return names


def _scope_path(tr: Tracer, paths: dict[int, str], module) -> str | None:
    """The path whose trace scope a call of `module` opens; None for a module outside the tree
    or one whose scope is already the innermost (a forward calling its own class's forward)."""
    path = paths.get(id(module))
    if path is None or (tr.scopes and tr.scopes[-1] == path):
        return None
    return path


def _scoped_call(tr: Tracer, path: str, module, args, kwargs, run):
    """`run()` inside the trace scope of `path`, then the call recorded as one module op."""
    tr.push_scope(path, type(module).__name__)
    first = len(tr.trace.ops)
    try:
        out = run()
    finally:
        tr.pop_scope()
    tr.module_call(path, type(module).__name__, list(args) + list(kwargs.values()), out, first)
    return out


class _ScopeRun:
    """The module-boundary hook: each module call of the tree opens the trace scope of its path."""

    def __init__(self, tracer: Tracer, paths: dict[int, str]):
        self.tracer = tracer
        self.paths = paths

    def call(self, module, original, args, kwargs):
        path = _scope_path(self.tracer, self.paths, module)
        if path is None:
            return original(module, *args, **kwargs)
        return _scoped_call(self.tracer, path, module, args, kwargs, lambda: original(module, *args, **kwargs))


def as_inputs(example_input) -> list:
    if isinstance(example_input, (list, tuple)):
        items = list(example_input)
    else:
        items = [example_input]
    return [Tensor.from_data(x) if isinstance(x, np.ndarray) else x for x in items]


def input_names(n: int) -> list[str]:
    return ["input"] if n == 1 else [f"input_{i}" for i in range(n)]


def trace_model(model, inputs, shape_only: bool = False, names=None, call=None) -> Trace:
    """The trace of `model.forward(*inputs)` (see the module docstring); `names`: the inputs'
    names (default `input` / `input_<i>`); `call(model, *inputs)`: what runs instead of the forward
    (its result is the traced output)."""
    inputs = as_inputs(inputs)
    names = list(names) if names is not None else input_names(len(inputs))
    modules = list(model.named_modules())
    paths: dict[int, str] = {}
    for path, m in modules:
        paths.setdefault(id(m), path)
    classes = {k for _, m in modules for k in type(m).__mro__ if "forward" in k.__dict__}
    if shape_only:
        return _trace_shape_only(model, inputs, modules, paths)
    for _, prm in model.named_params():
        if not prm.is_initialized():
            prm.base()  # the forward allocates it anyway; allocated first, it is traced by its path
    tracer = Tracer(param_names(model, params=True))
    run = _ScopeRun(tracer, paths)
    with contracts.forwards_through(classes, run), tracer:
        for t, name in zip(inputs, names):
            if isinstance(t, Tensor):
                tracer.input(t, name)
        tracer.push_scope("", type(model).__name__)
        try:
            out = model.forward(*inputs) if call is None else call(model, *inputs)
        finally:
            tracer.pop_scope()
        tracer.module_call("", type(model).__name__, inputs, out, 0)
        tracer.output(out)
    return tracer.trace


class _ShapeTraceRun(shape_check.ShapeRun):
    """The shape-only check's run with trace scopes, and each layer a shape rule stands for
    recorded as one `module` op."""

    tracer: Tracer
    error: BaseException | None = None

    def call(self, module, original, args, kwargs):
        tr = self.tracer
        path = _scope_path(tr, self.paths, module)
        if path is None:
            return original(module, *args, **kwargs)
        outermost = not tr.scopes
        try:
            out = _scoped_call(tr, path, module, args, kwargs,
                               lambda: super(_ShapeTraceRun, self).call(module, original, args, kwargs))
        except BaseException as e:
            if self.error is None:
                self.error = e
            raise
        if path == "" and outermost:
            self.root_output = out
        return out

    def forward(self, module, original, args, kwargs, node):
        name = type(module).__name__
        ruled = (layer_spec.has_rule(module) and name not in shape_check.MAIN_OUTPUT_ONLY) or (
            name == "MultiHeadAttention" and args and type(args[0]).__name__ == "MhaInput")
        out = super().forward(module, original, args, kwargs, node)
        if ruled:
            ins = shape_check.tensors_in(list(args) + list(kwargs.values()), [])
            self.tracer.record("module", ins, flat_tensors(out), {"type": name, "path": node.path})
        return out


def _trace_shape_only(model, inputs, modules, paths) -> Trace:
    stand_ins = [shape_check.stand_in(t.shape, t.kind, t.device) if isinstance(t, Tensor) else t for t in inputs]
    tracer = Tracer(param_names(model, params=False))

    class Run(_ShapeTraceRun):
        pass

    Run.tracer = tracer
    holder: dict[str, Any] = {}

    def run_class(*a, **k):
        r = Run(*a, **k)
        holder["run"] = r
        return r

    with tracer:
        for t, name in zip(stand_ins, input_names(len(stand_ins))):
            if isinstance(t, Tensor):
                tracer.input(t, name)
        result = contracts.check(model, stand_ins, {}, modules, run_class=run_class)
    if result.not_checked:
        raise TraceError(f"shape-only trace: {result.not_checked[0]}")
    if result.failure is not None or result.error:
        raise TraceError(f"shape-only trace failed at {result.failure.path if result.failure else 'the model'}: "
                         f"{result.error}")
    run = holder["run"]
    tracer.output(getattr(run, "root_output", None))
    return tracer.trace


# ---- the functions layers hold themselves: traced as one op each ---------------------------------
def _register_layer_functions() -> None:
    import importlib  # noqa: PLC0415

    conv = importlib.import_module("engine.nn.conv")
    embedding = importlib.import_module("engine.nn.embedding")
    from engine.tensor import trace as _trace  # noqa: PLC0415

    for klass in vars(conv).values():
        if isinstance(klass, type) and "_FN" in klass.__dict__:
            fn = klass.__dict__["_FN"]
            fn = getattr(fn, "__func__", fn)
            if fn is None:
                continue
            _trace.register_function(klass, "_FN", fn.__name__)
    _trace.register_functions(embedding, ["embedding"])
    _trace.register_functions(importlib.import_module("engine.nn.rnn"), ["cat", "stack"])  # imported by name


_register_layer_functions()
