"""ONNX import: an `.onnx` file as a design the designer opens, edits and builds, with its weights.

    from engine.design import build_model
    from engine.interop import import_onnx
    imported = import_onnx("model.onnx")
    model = build_model(imported.design).load_record(imported.record)
    print(imported.report.text())        # every ONNX node and what it became

The `onnx` package reads the protobuf and `onnx.checker` checks it (nothing here parses
protobuf by hand); opsets 13 and up of the default domain are read. Nodes map onto catalog layers
where one exists: Conv / ConvTranspose (1-3 d), Gemm and MatMul(+Add) with a constant weight ->
`Linear` (the weight transposed as Burn stores it, `alpha` / `beta` applied), BatchNormalization,
LayerNormalization, MaxPool / AveragePool / GlobalAveragePool, Relu, Sigmoid, Tanh, Gelu,
LeakyRelu, Elu, ..., Dropout, Gather of a constant table -> `Embedding`, Flatten / Reshape,
Concat and Add -> the structural nodes. Patterns that are one layer are fused: the Erf form of
GELU (Div, Erf, Add, Mul, Mul), the RMSNorm chain (Pow, ReduceMean, Add, Sqrt, Reciprocal or Div,
Mul, and the weight's Mul, as the dynamo exporter writes it) and SiLU (Sigmoid, Mul). Conv and
BatchNormalization stay two nodes with their weights. Everything else the engine can compute is
an `Op` node (`primitive.PrimitiveOp`) holding its attributes and constants (Split: one Slice Op
an output); subgraphs of constants (and `Shape` of a tensor of fixed dims) are folded at import.

Dynamic batch: an input dim with a `dim_param` is a named axis of the design's Input node. `Shape`
of a tensor whose dims vary is a run-time shape: its entries (sizes, or (tensor, axis) pairs) flow
through Gather / Slice / Unsqueeze / Squeeze / Concat / Cast / Identity symbolically, and a Reshape
or Expand target made of them becomes an Op node whose `shape` holds -2 - k for axis k of a
reference operand (or 0 / -1 for Reshape where that says the same). The Shape nodes are made as Op
nodes only where some node reads them as a tensor. As PyTorch's exporters write a dynamic sequence: Shape with
start / end, Reshape to [-1], Equal and Where on those entries (`expand(n, -1)`), Range(0, <a size>, 1) (an Op
`Range` counting along that axis), a Slice to a run-time end (its ends held as codes too), an Expand whose
target reads several tensors' sizes (one Expand a tensor), and a Reshape size that shape inference names as the
data's own axis (copied, 0) or a target whose sizes are all named axes of the data (read from the data). An
input axis named as a sum of other inputs' axes (`past_sequence + sequence`, a cache export's mask) is read as
that sum (`input_axes`), so Ember's own language-model exports import. GatherND is an Op node.

Bad input raises `OnnxImportError` naming the file, the node and what was expected: a protobuf
that does not parse, a model `onnx.checker` refuses, an opset outside 13..`MAX_OPSET`, an input
no node or initializer defines, a tensor whose data does not match its dims, external data
outside the file's folder, dims that do not fit a layer, and every op the engine cannot compute
listed at once with its node names (`error.report.unsupported`). Nothing is run from the file,
and every size is checked before an array is made: a tensor holds at most `MAX_ELEMENTS`; a folded
constant's dims come from its operands' dims and the op's settings (the `Op` node's shape rule) before it
is computed, and the fold is refused (the node listed as unsupported, with the size it would make and the
limit) when the value would pass `MAX_FOLD_ELEMENTS` elements, a product `MAX_FOLD_WORK` multiply-adds, or
all folded values together `MAX_FOLD_BYTES` (1 GiB, or twice the bytes of the file's own tensors where
that is more). A run-time shape holds at most `MAX_SHAPE_ENTRIES` entries.
"""
from __future__ import annotations

from pathlib import Path

from .common import (MAX_ELEMENTS, MAX_FILE_BYTES, MAX_FOLD_BYTES, MAX_FOLD_ELEMENTS, MAX_FOLD_WORK, MAX_NODES,
                     MAX_SHAPE_ENTRIES, MIN_OPSET, ImportedOnnx, ImportReport, OnnxImportError)
from .importer import Importer
from .reading import INFERENCE_SECONDS, check_model, check_opset, read_model, shown
from .registry import HANDLERS, handles

__all__ = ["import_onnx", "ImportedOnnx", "ImportReport", "OnnxImportError", "MIN_OPSET", "MAX_FOLD_ELEMENTS",
           "MAX_FOLD_BYTES", "MAX_FOLD_WORK", "MAX_ELEMENTS", "MAX_FILE_BYTES", "MAX_NODES", "MAX_SHAPE_ENTRIES",
           "INFERENCE_SECONDS", "HANDLERS", "handles"]


def import_onnx(path) -> ImportedOnnx:
    """The design, weights and report of an ONNX file (see this package's docstring)."""
    path = Path(path)
    model, data = read_model(path)
    where = shown(path)
    opset = check_opset(model, where)
    check_model(model, data, path, where)
    del data
    return Importer(model, path, where, opset).run()
