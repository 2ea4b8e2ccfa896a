"""A trace as an ONNX model (`trace_to_onnx`) and `export_onnx` (a model or design, traced at two batch sizes)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.tensor import Tensor
from engine.tensor.trace import Trace

from .graph import Graph
from .ops import convert, value_info
from .language import is_language_model, trace_language_model
from .tracing import OnnxExportError, as_inputs, trace_model


def _aligned(a: Trace, b: Trace, leading_batch: bool) -> str | None:
    """Why two traces of one forward at two sizes cannot be read together (None: they can)."""
    if a.op_names() != b.op_names():
        return "it runs different ops at another size"
    if len(a.tensors) != len(b.tensors):
        return "it reads different tensors at another size"
    for tid, t in a.tensors.items():
        u = b.tensors[tid]
        if len(t.shape) != len(u.shape) or t.source != u.source:
            return f"a tensor of dims {list(t.shape)} has another rank or role at another size"
    if leading_batch:
        for tid in a.inputs:
            t, u = a.tensors[tid].shape, b.tensors[tid].shape
            if not t or u[0] != t[0] + 1 or t[1:] != u[1:]:
                return "its inputs do not share a leading batch axis"
    return None


# ops whose size arguments the converters take from the traced tensors' shapes (or follow at run time)
_SIZED = {"reshape", "flatten", "squeeze", "unsqueeze", "expand", "rotary", "getitem"}


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "shape") or hasattr(b, "shape"):
        try:
            return bool(np.array_equal(np.asarray(a.get() if hasattr(a, "get") else a),
                                       np.asarray(b.get() if hasattr(b, "get") else b)))
        except (TypeError, ValueError):
            return False
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def trace_to_onnx(trace: Trace, other: Trace | None = None, opset: int = 17, graph_name: str = "ember", *,
                  others: dict | None = None, symbols: dict | None = None, tables=None, windows=None,
                  output_names=None, mask_input: int | None = None):
    """The ONNX `ModelProto` of a trace (checked by `onnx.checker`). `other`, the same forward
    traced at batch + 1, makes the batch axis dynamic: every size that differs between the two
    traces is computed from the input's batch in the graph. `others` / `symbols` generalize it
    (`engine.interop.onnx_export.graph.Graph`): one trace per symbolic dim, each at that dim + 1;
    `tables`: the rotary (cos, sin) tables that run-time positions slice; `windows`: the sliding
    attention window of each module path that has one; `output_names`: the
    outputs' names (default `output` / `output_<k>`); `mask_input`: a language model's
    attention-mask input, from which the token positions are computed (`onnx_export.positions`)."""
    for name, o in ({"batch": other} if others is None and other is not None else (others or {})).items():
        why = _aligned(trace, o, leading_batch=others is None)
        if why is not None:
            flag = "dynamic_batch" if name == "batch" else "dynamic_sequence"
            raise OnnxExportError(f"{flag}: the model cannot be exported with a dynamic {name} ({why}); "
                                  f"export with {flag}=False")
    g = Graph(trace, other, others, symbols, tables, windows, mask_input)
    for o in trace.ops:
        g.scope, g.op = o.scope, o
        if o.op not in _SIZED and any(not _same(o.attrs, v.ops[o.index].attrs) for v in g.others.values()):
            g.fail("its arguments change with the input's size (export with fixed sizes: dynamic_batch=False, "
                   "dynamic_sequence=False)")
        results = convert(g, o)
        if len(results) != len(o.outputs):
            g.fail(f"{len(o.outputs)} outputs traced, {len(results)} written")
        for tid, n in zip(o.outputs, results):
            g.names[tid] = n
    inputs = [value_info(g, i, g.name(i)) for i in trace.inputs]
    outputs = []
    g.scope = ""
    if output_names is not None and len(output_names) != len(trace.outputs):
        raise OnnxExportError(f"output_names: {len(output_names)} names given for {len(trace.outputs)} outputs")
    for k, tid in enumerate(trace.outputs):
        name = output_names[k] if output_names is not None else "output" if len(trace.outputs) == 1 else f"output_{k}"
        g.nodes.append(g.h.make_node("Identity", [g.name(tid)], [name], name=f"{name}/Identity"))
        outputs.append(value_info(g, tid, name))
    nodes, inits = _used(g.nodes, g.inits, [o.name for o in outputs])
    made = {o for n in nodes for o in n.output}
    infos = [value_info(g, tid, n) for tid, n in g.names.items() if n in made and tid not in g.reshaped
             and g.dynamic(tid)] if g.syms else []  # the named dims of every run-time-sized value
    graph = g.h.make_graph(nodes, graph_name, inputs, outputs, initializer=inits, value_info=infos)
    model = g.h.make_model(graph, opset_imports=[g.h.make_opsetid("", int(opset))], producer_name="ember")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else model.ir_version)
    g.onnx.checker.check_model(model)
    return model


def _used(nodes: list, inits: list, outputs: list) -> tuple:
    """The nodes and initializers the outputs read (a constant a converter replaced, as the traced
    positions a language model now reads from its mask, leaves nodes nothing reads)."""
    need, kept = set(outputs), []
    for n in reversed(nodes):
        if any(o in need for o in n.output):
            kept.append(n)
            need.update(v for v in n.input if v)
    return kept[::-1], [t for t in inits if t.name in need]


def _one_more(x):
    """`x` with its first row repeated once more along the batch axis."""
    if not isinstance(x, Tensor) or x.rank == 0:
        raise OnnxExportError("dynamic_batch: every example input must be a tensor with a leading batch axis; "
                              "export with dynamic_batch=False")
    arr = x.numpy()
    return Tensor.from_data(np.concatenate([arr, arr[:1]], axis=0), device=x.device, dtype=x.dtype)


def _is_design(value) -> bool:
    return type(value).__name__ == "Design" and hasattr(value, "add_node")


def export_onnx(model_or_design, path, example_input=None, dynamic_batch: bool = True, opset: int = 17, *,
                dynamic_sequence: bool | None = None, with_cache: bool = False, input_names=None, output_names=None,
                max_length: int | None = None) -> Path:
    """Trace `model_or_design` on `example_input` (a tensor, an array, or a list of them) and
    write the ONNX model to `path` atomically; returns the path (see the module docstring).

    A language model (`forward(input_ids, attention_mask, cache)`: Llama and its families, GPT-2)
    is exported with `input_ids` / `attention_mask` in and `logits` out, dynamic batch and
    `dynamic_sequence` (default on) axes, and with `with_cache` the `past_key_values` / `present`
    tensors (`engine.interop.onnx_export.language`); `example_input` is then optional (its
    `input_ids` dims are the traced sizes). With `dynamic_sequence=False` a language model is traced on
    `input_ids` alone at the example's length (the form Ember's ONNX import reads back); `max_length`: the rotary table's rows (default 4096,
    at most the model's positions). `input_names` / `output_names` rename the graph's inputs and outputs."""
    from engine.module import Module  # noqa: PLC0415
    from engine.store.atomic import atomic_write  # noqa: PLC0415

    if _is_design(model_or_design):
        from ...design.build import build_model  # noqa: PLC0415

        model = build_model(model_or_design)
    elif isinstance(model_or_design, Module):
        model = model_or_design
    else:
        raise OnnxExportError(f"export_onnx expects a Module or a Design, got {type(model_or_design).__name__}")
    for _, prm in model.named_params():
        if not prm.is_initialized():
            prm.base()  # a lazy parameter is allocated as a forward would (in place, once)
    model = model.materialize().valid()  # a copy: adapters folded in, eval mode
    if is_language_model(model) and not (dynamic_sequence is False and not with_cache):
        if with_cache and dynamic_sequence is False:
            raise OnnxExportError("with_cache: the cache variant needs dynamic_sequence (the past grows each step)")
        parts = trace_language_model(model, example_input, dynamic_batch, dynamic_sequence is not False, with_cache,
                                     input_names, output_names, max_length)
        proto = trace_to_onnx(parts["trace"], None, opset, graph_name=type(model).__name__, others=parts["others"],
                              symbols=parts["symbols"], tables=parts["tables"], windows=parts["windows"],
                              output_names=parts["output_names"], mask_input=1)
    else:
        if is_language_model(model):  # a fixed sequence length: the forward of input_ids alone
            input_names = input_names or ["input_ids"]
            output_names = output_names or ["logits"]
        elif with_cache or dynamic_sequence:
            raise OnnxExportError(f"with_cache / dynamic_sequence are for language models (a forward taking input_ids, "
                                  f"attention_mask and a cache); {type(model).__name__} is not one")
        if example_input is None:
            raise OnnxExportError(f"export_onnx: {type(model).__name__} needs an example_input to trace")
        inputs = as_inputs(example_input)
        trace = trace_model(model, inputs, names=input_names)
        other = trace_model(model, [_one_more(x) for x in inputs], names=input_names) if dynamic_batch else None
        proto = trace_to_onnx(trace, other, opset, graph_name=type(model).__name__, output_names=output_names)
    data = proto.SerializeToString()
    return atomic_write(path, lambda fp: fp.write(data), error=OnnxExportError)
