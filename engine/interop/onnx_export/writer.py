"""A trace as an ONNX model (`trace_to_onnx`) and `export_onnx` (a model or design, traced at two batch sizes)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.tensor import Tensor
from engine.tensor.trace import Trace

from .graph import Graph
from .ops import convert, value_info
from .tracing import OnnxExportError, as_inputs, trace_model


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
    g = Graph(trace, other)
    for o in trace.ops:
        g.scope, g.op = o.scope, o
        results = convert(g, o)
        if len(results) != len(o.outputs):
            g.fail(f"{len(o.outputs)} outputs traced, {len(results)} written")
        for tid, n in zip(o.outputs, results):
            g.names[tid] = n
    inputs = [value_info(g, i, g.name(i)) for i in trace.inputs]
    outputs = []
    g.scope = ""
    for k, tid in enumerate(trace.outputs):
        name = "output" if len(trace.outputs) == 1 else f"output_{k}"
        g.nodes.append(g.h.make_node("Identity", [g.name(tid)], [name], name=f"{name}/Identity"))
        outputs.append(value_info(g, tid, name))
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


def _refuse_mixtures(model) -> None:
    """A mixture of experts chooses its experts per token on the host: a trace would fix the
    example's choice in the graph, so the export refuses it by name."""
    from engine.module.tree import FieldKind, walk  # noqa: PLC0415
    from engine.nn import SparseMoe  # noqa: PLC0415

    for path, kind, value in walk(model):
        if kind == FieldKind.MODULE and isinstance(value, SparseMoe):
            raise OnnxExportError(f"'{path}' is a mixture of experts (SparseMoe): its top-k choice of experts per "
                                  f"token is not exported to ONNX (a trace would fix the example's choice); "
                                  f"export a model without one")


def export_onnx(model_or_design, path, example_input, dynamic_batch: bool = True, opset: int = 17) -> Path:
    """Trace `model_or_design` on `example_input` (a tensor, an array, or a list of them) and
    write the ONNX model to `path` atomically; returns the path (see the module docstring)."""
    from engine.module import Module  # noqa: PLC0415
    from engine.store.atomic import atomic_write  # noqa: PLC0415

    if _is_design(model_or_design):
        from ...design.build import build_model  # noqa: PLC0415

        model = build_model(model_or_design)
    elif isinstance(model_or_design, Module):
        model = model_or_design
    else:
        raise OnnxExportError(f"export_onnx expects a Module or a Design, got {type(model_or_design).__name__}")
    _refuse_mixtures(model)
    for _, prm in model.named_params():
        if not prm.is_initialized():
            prm.base()  # a lazy parameter is allocated as a forward would (in place, once)
    model = model.materialize().valid()  # a copy: adapters folded in, eval mode
    inputs = as_inputs(example_input)
    trace = trace_model(model, inputs)
    other = trace_model(model, [_one_more(x) for x in inputs]) if dynamic_batch else None
    proto = trace_to_onnx(trace, other, opset, graph_name=type(model).__name__)
    data = proto.SerializeToString()
    return atomic_write(path, lambda fp: fp.write(data), error=OnnxExportError)
