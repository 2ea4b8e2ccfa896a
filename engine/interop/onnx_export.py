"""ONNX export by tracing, and the traced graph of any model.

- `trace_model(model, inputs, shape_only=False)`: one forward pass of `model` recorded op by op
  (`engine.tensor.trace`), each op under the module path it ran in, parameters and constants
  named by their paths; `trace.calls` lists every module call with the tensors it took and
  returned (the module-level graph, with a shape on every edge) and the range of its ops. `shape_only=True` runs no layer kernel and allocates no parameter: a
  built-in layer is one op (`module`, its type in `attrs["type"]`) whose output dims its shape
  rule gives (`engine.design.shape_check`); the glue between layers runs on zero-stride
  stand-ins. That is the graph of a lazy 7 B model in well under a second.
- `export_onnx(model_or_design, path, example_input, dynamic_batch=True, opset=17)`: a Design is
  built first; a model with LoRA / QLoRA adapters is exported materialized (on a copy, in
  `valid()` mode). Initializers are named by parameter path, node names carry the module path
  (`layers.0.self_attn/MatMul_3`); the model is checked with `onnx.checker` and written
  atomically. An op with no ONNX form raises `OnnxExportError` naming the op and the module path.
  With `dynamic_batch`, axis 0 of the inputs and outputs is `batch`: the forward is traced twice,
  at the example's batch B and at B + 1, and every size that differs between the two traces (a
  reshape's target, an expanded class token, zeros made at the batch's size) is computed from the
  input's batch in the graph, so a batch size that equals another size is still told apart. A
  model that runs different ops at another batch size, or makes a constant whose rows differ with
  the batch, is refused with a message saying so (export it with `dynamic_batch=False`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from engine.module import contracts
from engine.module.tree import FieldKind, walk
from engine.tensor import Tensor, raw
from engine.tensor.trace import Trace, Tracer, TraceError, _flat_tensors

from ..design import shape_check
from ..nn import spec as layer_spec
from .export_common import ExportError

__all__ = ["export_onnx", "trace_model", "OnnxExportError"]


class OnnxExportError(ExportError):
    """The model cannot be written as ONNX: the message names the op and the module path."""


# ---- tracing a module tree ----------------------------------------------------------------------
def _names(model, params: bool) -> dict[int, str]:
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
    if path is None or (tr._scopes and tr._scopes[-1] == path):
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


def _as_inputs(example_input) -> list:
    if isinstance(example_input, (list, tuple)):
        items = list(example_input)
    else:
        items = [example_input]
    return [Tensor.from_data(x) if isinstance(x, np.ndarray) else x for x in items]


def _input_names(n: int) -> list[str]:
    return ["input"] if n == 1 else [f"input_{i}" for i in range(n)]


def trace_model(model, inputs, shape_only: bool = False) -> Trace:
    """The trace of `model.forward(*inputs)` (see the module docstring)."""
    inputs = _as_inputs(inputs)
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
    tracer = Tracer(_names(model, params=True))
    run = _ScopeRun(tracer, paths)
    contracts._Patcher.install(classes)
    prev = getattr(contracts._Patcher._local, "ctx", None)
    contracts._Patcher._local.ctx = run
    try:
        with tracer:
            for t, name in zip(inputs, _input_names(len(inputs))):
                if isinstance(t, Tensor):
                    tracer.input(t, name)
            tracer.push_scope("", type(model).__name__)
            try:
                out = model.forward(*inputs)
            finally:
                tracer.pop_scope()
            tracer.module_call("", type(model).__name__, inputs, out, 0)
            tracer.output(out)
    finally:
        contracts._Patcher._local.ctx = prev
        contracts._Patcher.uninstall(classes)
    return tracer.trace


class _ShapeTraceRun(shape_check._ShapeRun):
    """The shape-only check's run with trace scopes, and each layer a shape rule stands for
    recorded as one `module` op."""

    tracer: Tracer
    error: BaseException | None = None

    def call(self, module, original, args, kwargs):
        tr = self.tracer
        path = _scope_path(tr, self.paths, module)
        if path is None:
            return original(module, *args, **kwargs)
        outermost = not tr._scopes
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
        ruled = (layer_spec.has_rule(module) and name not in shape_check._MAIN_OUTPUT_ONLY) or (
            name == "MultiHeadAttention" and args and type(args[0]).__name__ == "MhaInput")
        out = super().forward(module, original, args, kwargs, node)
        if ruled:
            ins = shape_check._tensors(list(args) + list(kwargs.values()), [])
            self.tracer.record("module", ins, _flat_tensors(out), {"type": name, "path": node.path})
        return out


def _trace_shape_only(model, inputs, modules, paths) -> Trace:
    stand_ins = [shape_check._stand_in(t.shape, t.kind, t.device) if isinstance(t, Tensor) else t for t in inputs]
    tracer = Tracer(_names(model, params=False))

    class Run(_ShapeTraceRun):
        pass

    Run.tracer = tracer
    holder: dict[str, Any] = {}

    def run_class(*a, **k):
        r = Run(*a, **k)
        holder["run"] = r
        return r

    with tracer:
        for t, name in zip(stand_ins, _input_names(len(stand_ins))):
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
            _trace.register_functions(klass, ["_FN"])
            _trace._registered[-1] = (klass, "_FN", fn.__name__)
    _trace.register_functions(embedding, ["embedding"])
    _trace.register_functions(importlib.import_module("engine.nn.rnn"), ["cat", "stack"])  # imported by name


_register_layer_functions()


# ---- ONNX ------------------------------------------------------------------------------------------
def _onnx():
    try:
        import onnx  # noqa: PLC0415
        from onnx import helper, numpy_helper  # noqa: PLC0415,F401
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise OnnxExportError("export_onnx needs the onnx package (pip install onnx)") from None
    return onnx


_NP_OF = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
          "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def _host(t: Tensor) -> np.ndarray:
    """The values of `t` as a NumPy array: the array itself on the CPU (no copy), a copy from a GPU."""
    arr = raw.array(t)
    return arr if isinstance(arr, np.ndarray) else t.numpy()


def _np_dtype(name: str):
    return np.dtype(_NP_OF.get(name, np.float32))


class _Graph:
    """What the converters write into: nodes, initializers, value names."""

    def __init__(self, trace: Trace, other: Trace | None = None):
        self.onnx = _onnx()
        self.h = self.onnx.helper
        self.trace = trace
        self.other = other  # the same forward traced at batch + 1: what differs depends on the batch
        self.nodes: list = []
        self.inits: list = []
        self.names: dict[int, str] = {}
        self.counts: dict[str, int] = {}
        self.consts = 0
        self.batch = trace.tensors[trace.inputs[0]].shape[0] if other is not None else None
        self._batch_value = None
        self.scope = ""
        self.op = None

    def shape2(self, tid: int):
        """The tensor's shape in the batch + 1 trace (its own shape without one)."""
        if self.other is None:
            return self.trace.tensors[tid].shape
        return self.other.tensors[tid].shape

    def batched(self, tid: int) -> bool:
        return self.trace.tensors[tid].shape != self.shape2(tid)

    def reshape_target(self, in_shapes, out_shapes) -> str:
        """A Reshape's target: constant where it can be (0 copies an input size that depends on
        the batch, -1 infers the one other such size), else computed from the batch."""
        (i1, i2), (o1, o2) = in_shapes, out_shapes
        target, infer = [], 0
        for k, (d1, d2) in enumerate(zip(o1, o2)):
            if d1 == d2:
                target.append(d1)
            elif k < len(i1) and (i1[k], i2[k]) == (d1, d2):
                target.append(0)
            else:
                target.append(-1)
                infer += 1
        if infer > 1 or any(d == 0 for d in o1):
            return self.shape_value(o1, o2)
        return self.ints(target)

    def expand_target(self, in_shapes, out_shapes) -> str:
        """An Expand's target: 1 on the batch-dependent axes the input already has at full size."""
        (i1, i2), (o1, o2) = in_shapes, out_shapes
        lead = len(o1) - len(i1)
        target = []
        for k, (d1, d2) in enumerate(zip(o1, o2)):
            j = k - lead
            if d1 == d2:
                target.append(d1)
            elif j >= 0 and (i1[j], i2[j]) == (d1, d2):
                target.append(1)
            else:
                return self.shape_value(o1, o2)
        return self.ints(target)

    def shape_value(self, shape, shape2) -> str:
        """An int64 shape tensor: `shape` where it does not depend on the batch, and `a * batch + c`
        (from the two traces) on the axes that do."""
        if tuple(shape) == tuple(shape2):
            return self.ints(shape)
        if self._batch_value is None:
            first = self.name(self.trace.inputs[0])
            saved, self.scope = self.scope, ""
            self._batch_value = self.node("Slice", [self.node("Shape", [first]), self.ints([0]), self.ints([1])])
            self.scope = saved
        pieces = []
        for d1, d2 in zip(shape, shape2):
            if d1 == d2:
                pieces.append(self.ints([d1]))
                continue
            a = d2 - d1
            c = d1 - a * self.batch
            v = self._batch_value
            if a != 1:
                v = self.node("Mul", [v, self.ints([a])])
            if c:
                v = self.node("Add", [v, self.ints([c])])
            pieces.append(v)
        return self.node("Concat", pieces, axis=0)

    # names
    def name(self, tid: int) -> str:
        n = self.names.get(tid)
        if n is None:
            t = self.trace.tensors[tid]
            if t.source == "input" or t.source == "param":
                n = t.name
            elif t.source == "const":
                n = f"constant.t{tid}"
            else:
                n = f"t{tid}"
            if t.source in ("param", "const"):
                value = _host(self.trace.values[tid])
                if t.source == "const" and self.batched(tid):
                    n = self._batch_constant(tid, value, n)
                else:
                    self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(value), n))
            self.names[tid] = n
        return n

    def _batch_constant(self, tid: int, value, n: str) -> str:
        """A constant the forward made at the batch's size (zeros for token types, a state): one
        row, expanded to the batch, when every row is the same."""
        shape, shape2 = self.trace.tensors[tid].shape, self.shape2(tid)
        axes = [i for i, (a, b) in enumerate(zip(shape, shape2)) if a != b]
        row = value
        for ax in axes:
            row = np.take(row, [0], axis=ax)
        if not np.array_equal(np.broadcast_to(row, value.shape), value):
            raise OnnxExportError(
                f"a constant of dims {list(shape)} read in module '{self.scope or '(model)'}' depends on the batch "
                "and its rows differ; export with dynamic_batch=False")
        self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(row), n))
        saved = self.scope
        out = self.node("Expand", [n, self.shape_value(shape, shape2)])
        self.scope = saved
        return out

    def const(self, array, dtype=None) -> str:
        arr = np.asarray(array, dtype=dtype)
        self.consts += 1
        n = f"{self.scope}/const_{self.consts}" if self.scope else f"const_{self.consts}"
        self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(arr), n))
        return n

    def ints(self, values) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def scalar(self, value, like_tid: int) -> str:
        return self.const(np.asarray(value, dtype=_np_dtype(self.trace.tensors[like_tid].dtype)))

    def node(self, op_type: str, inputs, outputs=None, **attrs) -> str:
        k = self.counts.get(self.scope, 0)
        self.counts[self.scope] = k + 1
        nm = f"{self.scope}/{op_type}_{k}" if self.scope else f"{op_type}_{k}"
        if outputs is None:
            outputs = [nm + ":0"]
        self.nodes.append(self.h.make_node(op_type, list(inputs), list(outputs), name=nm, **attrs))
        return outputs[0]

    def fail(self, why: str):
        o = self.op
        raise OnnxExportError(f"op '{o.op}' in module '{o.scope or '(model)'}' has no ONNX form: {why}")


def _axes(dim, rank: int) -> list[int]:
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return [int(d) % rank for d in dims]


def _shape_arg(v) -> tuple:
    if len(v) == 1 and isinstance(v[0], (list, tuple)):
        v = v[0]
    return tuple(int(d) for d in v)


def _pairs(padding, n: int):
    if isinstance(padding, int):
        return [(padding, padding)] * n
    out = []
    for p in padding:
        out.append((int(p), int(p)) if isinstance(p, (int, np.integer)) else (int(p[0]), int(p[1])))
    return out


def _tuple(v, n: int):
    return [int(v)] * n if isinstance(v, (int, np.integer)) else [int(x) for x in v]


_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "neg": "Neg", "abs": "Abs", "erf": "Erf", "sin": "Sin", "cos": "Cos", "recip": "Reciprocal",
          "identity": "Identity", "dropout": "Identity", "sign": "Sign", "bool_not": "Not", "softsign": "Softsign",
          "is_nan": "IsNaN"}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "matmul": "MatMul", "pow": "Pow",
           "maximum": "Max", "minimum": "Min", "equal": "Equal", "greater": "Greater", "lower": "Less",
           "greater_equal": "GreaterOrEqual", "lower_equal": "LessOrEqual", "bool_and": "And", "bool_or": "Or"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd",
           "sum_dim": "ReduceSum", "mean_dim": "ReduceMean", "max_dim": "ReduceMax", "min_dim": "ReduceMin"}


def _reduce(g: _Graph, kind: str, x: str, axes: list[int], keep: bool) -> str:
    if kind == "ReduceSum":  # axes an input from opset 13
        return g.node(kind, [x, g.ints(axes)], keepdims=int(keep))
    return g.node(kind, [x], axes=axes, keepdims=int(keep))


def _convert(g: _Graph, o) -> list[str]:  # noqa: C901 - one dispatch on the op name
    t = g.trace.tensors
    ins = dict(zip(o.input_names, o.inputs))
    a = o.attrs
    x_id = o.inputs[0] if o.inputs else None
    x = g.name(x_id) if x_id is not None else None
    out_shape = t[o.outputs[0]].shape
    op = o.op
    if op in _UNARY:
        return [g.node(_UNARY[op], [x])]
    if op in _BINARY or op in ("rsub", "rdiv"):
        other = ins.get("other")
        y = g.name(other) if other is not None else g.scalar(a.get("other"), x_id)
        if op == "rsub":
            return [g.node("Sub", [y, x])]
        if op == "rdiv":
            return [g.node("Div", [y, x])]
        if op == "pow" and other is None:
            y = g.scalar(a.get("other"), x_id)
        return [g.node(_BINARY[op], [x, y])]
    if op == "not_equal":
        y = g.name(ins["other"]) if "other" in ins else g.scalar(a.get("other"), x_id)
        return [g.node("Not", [g.node("Equal", [x, y])])]
    if op == "powf":
        return [g.node("Pow", [x, g.scalar(a["exponent"], x_id)])]
    if op == "square":
        return [g.node("Mul", [x, x])]
    if op == "rsqrt":
        return [g.node("Reciprocal", [g.node("Sqrt", [x])])]
    if op == "log1p":
        return [g.node("Log", [g.node("Add", [x, g.scalar(1.0, x_id)])])]
    if op == "silu":
        return [g.node("Mul", [x, g.node("Sigmoid", [x])])]
    if op == "gelu":  # exact: x / 2 * (1 + erf(x / sqrt 2))
        e = g.node("Erf", [g.node("Mul", [x, g.scalar(1.0 / math.sqrt(2.0), x_id)])])
        return [g.node("Mul", [g.node("Mul", [x, g.scalar(0.5, x_id)]), g.node("Add", [e, g.scalar(1.0, x_id)])])]
    if op == "leaky_relu":
        return [g.node("LeakyRelu", [x], alpha=float(a["negative_slope"]))]
    if op == "elu":
        return [g.node("Elu", [x], alpha=float(a["alpha"]))]
    if op == "selu":
        return [g.node("Selu", [x])]
    if op == "relu6":
        return [g.node("Clip", [x, g.scalar(0.0, x_id), g.scalar(6.0, x_id)])]
    if op == "hardtanh":
        return [g.node("Clip", [x, g.scalar(a["min_val"], x_id), g.scalar(a["max_val"], x_id)])]
    if op in ("clamp", "clamp_min", "clamp_max"):
        lo = a.get("min") if op != "clamp_max" else None
        hi = a.get("max") if op != "clamp_min" else None
        return [g.node("Clip", [x, "" if lo is None else g.scalar(lo, x_id), "" if hi is None else g.scalar(hi, x_id)])]
    if op == "celu":
        return [g.node("Celu", [x], alpha=float(a["alpha"]))]
    if op == "hard_swish":
        return [g.node("HardSwish", [x])]
    if op == "mish":  # Mish is opset 18: x * tanh(softplus(x))
        return [g.node("Mul", [x, g.node("Tanh", [g.node("Softplus", [x])])])]
    if op == "log_sigmoid":
        return [g.node("Neg", [g.node("Softplus", [g.node("Neg", [x])])])]
    if op == "hard_shrink":
        lam = g.scalar(a["lambd"], x_id)
        return [g.node("Where", [g.node("Greater", [g.node("Abs", [x]), lam]), x, g.scalar(0.0, x_id)])]
    if op == "soft_shrink":
        return [g.node("Shrink", [x], lambd=float(a["lambd"]), bias=float(a["bias"]))]
    if op == "tanhshrink":
        return [g.node("Sub", [x, g.node("Tanh", [x])])]
    if op == "prelu":
        rank = len(t[x_id].shape)
        n = t[ins["alpha"]].shape[0]
        slope = g.node("Reshape", [g.name(ins["alpha"]), g.ints([n] + [1] * (rank - 2))]) if rank >= 2 else \
            g.name(ins["alpha"])
        return [g.node("PRelu", [x, slope])]
    if op == "hard_sigmoid":
        return [g.node("HardSigmoid", [x], alpha=float(a["alpha"]), beta=float(a["beta"]))]
    if op == "softplus":
        beta = float(a["beta"])
        if beta == 1.0:
            return [g.node("Softplus", [x])]
        sp = g.node("Softplus", [g.node("Mul", [x, g.scalar(beta, x_id)])])
        return [g.node("Div", [sp, g.scalar(beta, x_id)])]
    if op == "cast":
        onnx = g.onnx
        to = onnx.helper.np_dtype_to_tensor_dtype(_np_dtype(t[o.outputs[0]].dtype))
        return [g.node("Cast", [x], to=int(to))]
    if op == "linear":
        y = g.node("MatMul", [x, g.name(ins["weight"])])
        if "bias" in ins:
            y = g.node("Add", [y, g.name(ins["bias"])])
        return [y]
    if op == "embedding":
        return [g.node("Gather", [g.name(ins["weight"]), g.name(ins["indices"])], axis=0)]
    if op == "rms_norm":
        ms = _reduce(g, "ReduceMean", g.node("Mul", [x, x]), [len(t[x_id].shape) - 1], True)
        r = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [ms, g.scalar(a["eps"], x_id)])])])
        return [g.node("Mul", [g.node("Mul", [x, r]), g.name(ins["gamma"])])]
    if op == "normalize":
        if a.get("stats") is not None:
            g.fail("batch statistics are asked for (a training-mode batch norm); export the model in valid() mode")
        rank = len(t[x_id].shape)
        axes = _axes(a["axes"], rank)
        mean = _reduce(g, "ReduceMean", x, axes, True)
        xc = g.node("Sub", [x, mean])
        var = _reduce(g, "ReduceMean", g.node("Mul", [xc, xc]), axes, True)
        y = g.node("Div", [xc, g.node("Sqrt", [g.node("Add", [var, g.scalar(a["eps"], x_id)])])])
        for key, kind in (("gamma", "Mul"), ("beta", "Add")):
            if key in ins:
                p = g.name(ins[key])
                if a.get("affine_shape") is not None and tuple(a["affine_shape"]) != t[ins[key]].shape:
                    p = g.node("Reshape", [p, g.ints(a["affine_shape"])])
                y = g.node(kind, [y, p])
        return [y]
    if op == "rotary":
        shape = t[x_id].shape
        half = shape[-1] // 2
        shape2 = g.shape2(x_id)
        pairs = g.node("Reshape", [x, g.reshape_target((shape, shape2), (shape[:-1] + (half, 2), shape2[:-1] + (half, 2)))])
        first = g.node("Slice", [pairs, g.ints([0]), g.ints([1]), g.ints([-1])])
        second = g.node("Slice", [pairs, g.ints([1]), g.ints([2]), g.ints([-1])])
        dt = _np_dtype(t[x_id].dtype)
        c = g.const(np.asarray(a["cos"].get() if hasattr(a["cos"], "get") else a["cos"], dtype=dt)[..., None])
        s = g.const(np.asarray(a["sin"].get() if hasattr(a["sin"], "get") else a["sin"], dtype=dt)[..., None])
        out0 = g.node("Sub", [g.node("Mul", [first, c]), g.node("Mul", [second, s])])
        out1 = g.node("Add", [g.node("Mul", [first, s]), g.node("Mul", [second, c])])
        joined = g.node("Concat", [out0, out1], axis=-1)
        return [g.node("Reshape", [joined, g.reshape_target((shape[:-1] + (half, 2), shape2[:-1] + (half, 2)),
                                                            (shape, shape2))])]
    if op in ("reshape", "flatten", "squeeze", "unsqueeze") and not (op == "unsqueeze" and len(out_shape) == 0):
        if op == "unsqueeze":
            return [g.node("Unsqueeze", [x, g.ints([int(a.get("dim", 0)) % len(out_shape)])])]
        return [g.node("Reshape", [x, g.reshape_target((t[x_id].shape, g.shape2(x_id)),
                                                       (out_shape, g.shape2(o.outputs[0])))])]
    if op == "expand":
        return [g.node("Expand", [x, g.expand_target((t[x_id].shape, g.shape2(x_id)),
                                                     (out_shape, g.shape2(o.outputs[0])))])]
    if op in ("swap_dims", "transpose", "permute"):
        rank = len(t[x_id].shape)
        perm = list(range(rank))
        if op == "swap_dims":
            d1, d2 = int(a["dim1"]) % rank, int(a["dim2"]) % rank
            perm[d1], perm[d2] = perm[d2], perm[d1]
        elif op == "transpose":
            perm[-1], perm[-2] = perm[-2], perm[-1]
        else:
            perm = [int(d) % rank for d in _shape_arg(a["axes"])]
        return [g.node("Transpose", [x], perm=perm)]
    if op in ("softmax", "log_softmax"):
        axis = int(a["dim"]) % len(t[x_id].shape)
        return [g.node("Softmax" if op == "softmax" else "LogSoftmax", [x], axis=axis)]
    if op == "mask_fill":
        return [g.node("Where", [g.name(ins["mask"]), g.scalar(a["value"], x_id), x])]
    if op == "mask_where":
        return [g.node("Where", [g.name(ins["mask"]), g.name(ins["other"]), x])]
    if op == "where" and "self" in ins:  # the method: values of `other` where `mask`, else self
        other = g.name(ins["other"]) if "other" in ins else g.scalar(a["other"], x_id)
        return [g.node("Where", [g.name(ins["mask"]), other, g.name(ins["self"])])]
    if op == "where" and "mask" in ins:
        va = g.name(ins["a"]) if "a" in ins else None
        vb = g.name(ins["b"]) if "b" in ins else None
        ref = ins.get("a", ins.get("b"))
        va = va or g.scalar(a["a"], ref)
        vb = vb or g.scalar(a["b"], ref)
        return [g.node("Where", [g.name(ins["mask"]), va, vb])]
    if op in _REDUCE:
        rank = len(t[x_id].shape)
        dim = a.get("dim")
        axes = list(range(rank)) if dim is None else _axes(dim, rank)
        keep = True if op.endswith("_dim") else bool(a.get("keepdim", False))
        return [_reduce(g, _REDUCE[op], x, axes, keep)]
    if op == "cat":
        names = [g.name(i) for i in o.inputs]
        rank = len(t[o.inputs[0]].shape)
        return [g.node("Concat", names, axis=int(a.get("dim", 0)) % rank)]
    if op == "stack":
        rank = len(out_shape)
        axis = int(a.get("dim", 0)) % rank
        names = [g.node("Unsqueeze", [g.name(i), g.ints([axis])]) for i in o.inputs]
        return [g.node("Concat", names, axis=axis)]
    if op in ("zeros_like", "ones_like", "full_like"):
        value = {"zeros_like": 0, "ones_like": 1}.get(op, a.get("value"))
        val = g.onnx.numpy_helper.from_array(np.asarray([value], dtype=_np_dtype(t[x_id].dtype)))
        return [g.node("ConstantOfShape", [g.node("Shape", [x])], value=val)]
    if op == "narrow":
        d = int(a["dim"]) % len(t[x_id].shape)
        s = int(a["start"])
        return [g.node("Slice", [x, g.ints([s]), g.ints([s + int(a["length"])]), g.ints([d])])]
    if op == "getitem":
        return [_getitem(g, o, x, x_id, a["key"])]
    if op in ("conv1d", "conv2d", "conv3d"):
        n = int(op[4])
        w = ins["weight"]
        kernel = t[w].shape[2:]
        if isinstance(a.get("padding"), str):
            mode = a["padding"].lower()
            if mode == "valid":
                pads = [(0, 0)] * n
            else:  # "same" (stride 1)
                dil = _tuple(a.get("dilation", 1), n)
                pads = [((k - 1) * d // 2, (k - 1) * d - (k - 1) * d // 2) for k, d in zip(kernel, dil)]
        else:
            pads = _pairs(a.get("padding", 0), n)
        inputs = [x, g.name(w)] + ([g.name(ins["bias"])] if "bias" in ins else [])
        return [g.node("Conv", inputs, kernel_shape=list(kernel), strides=_tuple(a.get("stride", 1), n),
                       dilations=_tuple(a.get("dilation", 1), n), group=int(a.get("groups", 1)),
                       pads=[p[0] for p in pads] + [p[1] for p in pads])]
    if op in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"):
        n = int(op[-2])
        kernel = _tuple(a["kernel_size"], n)
        stride = kernel if a.get("stride") is None else _tuple(a["stride"], n)
        pads = _pairs(a.get("padding", 0), n)
        common = dict(kernel_shape=kernel, strides=stride, pads=[p[0] for p in pads] + [p[1] for p in pads],
                      ceil_mode=int(bool(a.get("ceil_mode", False))))
        if op.startswith("max"):
            return [g.node("MaxPool", [x], dilations=_tuple(a.get("dilation", 1), n), **common)]
        return [g.node("AveragePool", [x], count_include_pad=int(bool(a.get("count_include_pad", True))), **common)]
    if op in ("adaptive_avg_pool1d", "adaptive_avg_pool2d"):
        in_sp = t[x_id].shape[2:]
        out_sp = out_shape[2:]
        if all(s == 1 for s in out_sp):
            return [g.node("GlobalAveragePool", [x])]
        if all(i % s == 0 for i, s in zip(in_sp, out_sp)):
            k = [i // s for i, s in zip(in_sp, out_sp)]
            return [g.node("AveragePool", [x], kernel_shape=k, strides=k)]
        g.fail(f"adaptive pooling from {list(in_sp)} to {list(out_sp)} has windows of different sizes")
    if op == "flip":
        rank = len(t[x_id].shape)
        dims = _axes(a["dims"], rank)
        n = len(dims)
        return [g.node("Slice", [x, g.ints([-1] * n), g.ints([-(1 << 62)] * n), g.ints(dims), g.ints([-1] * n)])]
    if op == "pad":
        mode, value = a.get("mode", "constant"), a.get("value", 0.0)
        if not isinstance(mode, str):
            mode, value = "constant", mode
        onnx_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "edge": "edge"}.get(mode)
        if onnx_mode is None:
            g.fail(f"pad mode {mode!r}")
        rank = len(t[x_id].shape)
        flat = [int(p) for p in a["pads"]]
        before, after = [0] * rank, [0] * rank
        for k in range(len(flat) // 2):  # pairs from the last axis back
            before[rank - 1 - k], after[rank - 1 - k] = flat[2 * k], flat[2 * k + 1]
        inputs = [x, g.ints(before + after)]
        if onnx_mode == "constant":
            inputs.append(g.scalar(value, x_id))
        return [g.node("Pad", inputs, mode=onnx_mode)]
    if op in ("tril", "triu"):
        k = g.const(np.asarray(int(a.get("diagonal", 0)), np.int64))
        return [g.node("Trilu", [x, k], upper=int(op == "triu"))]
    if op == "gather":
        return [g.node("GatherElements", [x, g.name(ins["indices"])], axis=int(a["dim"]) % len(t[x_id].shape))]
    if op in ("select", "index_select"):
        axis = int(a["dim"]) % len(t[x_id].shape)
        idx = g.name(ins["indices"]) if "indices" in ins else g.ints([int(v) for v in np.ravel(a["indices"])])
        return [g.node("Gather", [x, idx], axis=axis)]
    if op == "one_hot":
        # Equal(x[..., None], [0, 1, ..., n - 1]) cast: the same values as OneHot, in ops every runtime reads
        classes = g.const(np.arange(int(a["num_classes"]), dtype=_np_dtype(t[x_id].dtype)))
        hit = g.node("Equal", [g.node("Unsqueeze", [x, g.ints([-1])]), classes])
        to = g.onnx.helper.np_dtype_to_tensor_dtype(_np_dtype(t[o.outputs[0]].dtype))
        return [g.node("Cast", [hit], to=int(to))]
    if op == "repeat":
        rank = len(t[x_id].shape)
        sizes = [int(v) for v in (a["sizes"] if isinstance(a["sizes"], (list, tuple)) else [a["sizes"]])]
        sizes = (sizes + [1] * rank)[:rank]
        return [g.node("Tile", [x, g.ints(sizes)])]
    if op == "repeat_dim":
        rank = len(t[x_id].shape)
        sizes = [1] * rank
        sizes[int(a["dim"]) % rank] = int(a["times"])
        return [g.node("Tile", [x, g.ints(sizes)])]
    if op in ("argmax", "argmin"):
        rank = len(t[x_id].shape)
        kind = "ArgMax" if op == "argmax" else "ArgMin"
        if a.get("dim") is None:
            flat = g.node("Reshape", [x, g.ints([-1])])
            y = g.node(kind, [flat], axis=0, keepdims=0)
            return [g.node("Reshape", [y, g.ints(list(out_shape))])] if out_shape else [y]
        return [g.node(kind, [x], axis=int(a["dim"]) % rank, keepdims=int(bool(a.get("keepdim", False))))]
    if op == "logsumexp":
        rank = len(t[x_id].shape)
        return [g.node("ReduceLogSumExp", [x], axes=_axes(a["dim"], rank), keepdims=int(bool(a.get("keepdim", False))))]
    if op == "module":
        g.fail(f"a shape-only trace ({a.get('type')} was not run); trace the model with allocated parameters")
    g.fail("no converter for this op")


def _getitem(g: _Graph, o, x: str, x_id: int, key) -> str:
    shape = g.trace.tensors[x_id].shape
    key = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, tuple) and k and k[0] == "tensor" for k in key):
        g.fail("indexing with a tensor")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - (len(key) - 1 - sum(k is None for k in key))) + key[i + 1:]
    starts, ends, axes, steps, squeeze = [], [], [], [], []
    axis = 0
    new_axes, out_axis = [], 0  # None: a new axis at that place of the result
    for k in key:
        if k is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(k, slice):
            out_axis += 1
        if isinstance(k, (int, np.integer)):
            s = int(k) % shape[axis]
            starts.append(s), ends.append(s + 1), axes.append(axis), steps.append(1)
            squeeze.append(axis)
        elif isinstance(k, slice):
            s0, e0, st = k.indices(shape[axis])
            if (s0, e0, st) != (0, shape[axis], 1):
                if st < 0:
                    g.fail("a negative slice step")
                starts.append(s0), ends.append(e0), axes.append(axis), steps.append(st)
        else:
            g.fail(f"index {k!r}")
        axis += 1
    y = x
    if axes:
        y = g.node("Slice", [x, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps)])
    if squeeze:
        y = g.node("Squeeze", [y, g.ints(squeeze)])
    if new_axes:
        y = g.node("Unsqueeze", [y, g.ints(new_axes)])
    if y is x:
        y = g.node("Identity", [x])
    return y


def _value_info(g: _Graph, tid: int, name: str):
    t = g.trace.tensors[tid]
    dims = [d1 if d1 == d2 else ("batch" if (d1, d2) == (g.batch, g.batch + 1) else f"{name}_dim{i}")
            for i, (d1, d2) in enumerate(zip(t.shape, g.shape2(tid)))]
    elem = g.onnx.helper.np_dtype_to_tensor_dtype(_np_dtype(t.dtype))
    return g.onnx.helper.make_tensor_value_info(name, elem, dims)


def _aligned(a: Trace, b: Trace) -> str | None:
    """Why two traces of one forward at batch sizes B and B + 1 cannot be read together (None: they can)."""
    if a.op_names() != b.op_names():
        return "it runs different ops at another batch size"
    if len(a.tensors) != len(b.tensors):
        return "it reads different tensors at another batch size"
    for tid, t in a.tensors.items():
        u = b.tensors[tid]
        if len(t.shape) != len(u.shape) or t.source != u.source:
            return f"a tensor of dims {list(t.shape)} has another rank or role at another batch size"
    for tid in a.inputs:
        t, u = a.tensors[tid].shape, b.tensors[tid].shape
        if not t or u[0] != t[0] + 1 or t[1:] != u[1:]:
            return "its inputs do not share a leading batch axis"
    return None


def trace_to_onnx(trace: Trace, other: Trace | None = None, opset: int = 17, graph_name: str = "ember"):
    """The ONNX `ModelProto` of a trace (checked by `onnx.checker`). `other`, the same forward
    traced at batch + 1, makes the batch axis dynamic: every size that differs between the two
    traces is computed from the input's batch in the graph."""
    if other is not None:
        why = _aligned(trace, other)
        if why is not None:
            raise OnnxExportError(f"dynamic_batch: the model cannot be exported with a dynamic batch ({why}); "
                                  "export with dynamic_batch=False")
    g = _Graph(trace, other)
    for o in trace.ops:
        g.scope, g.op = o.scope, o
        results = _convert(g, o)
        if len(results) != len(o.outputs):
            g.fail(f"{len(o.outputs)} outputs traced, {len(results)} written")
        for tid, n in zip(o.outputs, results):
            g.names[tid] = n
    inputs = [_value_info(g, i, g.name(i)) for i in trace.inputs]
    outputs = []
    g.scope = ""
    for k, tid in enumerate(trace.outputs):
        name = "output" if len(trace.outputs) == 1 else f"output_{k}"
        g.nodes.append(g.h.make_node("Identity", [g.name(tid)], [name], name=f"{name}/Identity"))
        outputs.append(_value_info(g, tid, name))
    graph = g.h.make_graph(g.nodes, graph_name, inputs, outputs, initializer=g.inits)
    model = g.h.make_model(graph, opset_imports=[g.h.make_opsetid("", int(opset))], producer_name="ember")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else model.ir_version)
    g.onnx.checker.check_model(model)
    return model


def _one_more(x):
    """`x` with its first row repeated once more along the batch axis."""
    if not isinstance(x, Tensor) or x.rank == 0:
        raise OnnxExportError("dynamic_batch: every example input must be a tensor with a leading batch axis; "
                              "export with dynamic_batch=False")
    arr = x.numpy()
    return Tensor.from_data(np.concatenate([arr, arr[:1]], axis=0), device=x.device, dtype=x.dtype)


def _is_design(value) -> bool:
    return type(value).__name__ == "Design" and hasattr(value, "add_node")


def export_onnx(model_or_design, path, example_input, dynamic_batch: bool = True, opset: int = 17) -> Path:
    """Trace `model_or_design` on `example_input` (a tensor, an array, or a list of them) and
    write the ONNX model to `path` atomically; returns the path (see the module docstring)."""
    from engine.module import Module  # noqa: PLC0415
    from engine.store.atomic import atomic_write  # noqa: PLC0415

    if _is_design(model_or_design):
        from ..design.build import build_model  # noqa: PLC0415

        model = build_model(model_or_design)
    elif isinstance(model_or_design, Module):
        model = model_or_design
    else:
        raise OnnxExportError(f"export_onnx expects a Module or a Design, got {type(model_or_design).__name__}")
    for _, prm in model.named_params():
        if not prm.is_initialized():
            prm.base()  # a lazy parameter is allocated as a forward would (in place, once)
    model = model.materialize().valid()  # a copy: adapters folded in, eval mode
    inputs = _as_inputs(example_input)
    trace = trace_model(model, inputs)
    other = trace_model(model, [_one_more(x) for x in inputs]) if dynamic_batch else None
    proto = trace_to_onnx(trace, other, opset, graph_name=type(model).__name__)
    data = proto.SerializeToString()
    return atomic_write(path, lambda fp: fp.write(data), error=OnnxExportError)
