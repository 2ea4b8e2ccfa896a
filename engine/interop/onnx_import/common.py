"""What the ONNX import's parts share: its limits, its error and report, the reason a node is not imported."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ...design.graph import Design
from ...store.record import ModuleRecord

MIN_OPSET = 13
MAX_FILE_BYTES = 2 << 30  # protobuf's own limit for one message
MAX_NODES = 10_000  # a design's limit (design_schema.MAX_NODES)
MAX_ELEMENTS = 1 << 31  # elements in one tensor
MAX_FOLD_ELEMENTS = 1 << 24  # elements a folded constant (or a fold's scratch array) may have
MAX_FOLD_BYTES = 1 << 30  # bytes the folded constants may hold together (or twice the file's own tensors, if more)
MAX_FOLD_WORK = 1 << 32  # multiply-adds one folded product (MatMul, Gemm, Einsum, CumSum) may take
MAX_SHAPE_ENTRIES = 1024  # entries of a run-time shape (as a shape's or a Slice's constant values: _ints)
INT_BOUND = 1 << 40  # Slice bounds beyond this mean "to the end"


def max_opset() -> int:
    import onnx  # noqa: PLC0415

    return int(onnx.defs.onnx_opset_version())


class OnnxImportError(ValueError):
    """An ONNX file that cannot be imported; `report` holds what was found (when the graph was read)."""

    def __init__(self, message: str, report: "ImportReport | None" = None):
        super().__init__(message)
        self.report = report


@dataclass
class ImportReport:
    """What each ONNX node became. `mapping`: ONNX node name -> text (`conv1 (Conv2d)`, `fused into
    gelu1 (Gelu)`, `folded into a constant`); `unsupported`: op -> the names of its nodes (with why,
    where the op is known but these settings are not); `problems`: other errors found."""

    path: str = ""
    opset: int = 0
    producer: str = ""
    mapping: dict = field(default_factory=dict)
    kinds: dict = field(default_factory=dict)  # design node -> kind
    unsupported: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    fused: list = field(default_factory=list)  # (design node, kind, [onnx nodes])

    @property
    def ok(self) -> bool:
        return not self.unsupported and not self.problems

    def counts(self) -> dict:
        """{design kind: number of nodes} of the imported design."""
        out: dict = {}
        for k in self.kinds.values():
            out[k] = out.get(k, 0) + 1
        return out

    def unsupported_text(self) -> str:
        return "; ".join(f"{op} ({', '.join(names[:20])}{', ...' if len(names) > 20 else ''})"
                         for op, names in sorted(self.unsupported.items()))

    def text(self) -> str:
        lines = [f"{self.path}: opset {self.opset}, {len(self.mapping)} ONNX node(s) -> {len(self.kinds)} design "
                 f"node(s)" + (f" (made by {self.producer})" if self.producer else "")]
        for name, what in self.mapping.items():
            lines.append(f"  {name}: {what}")
        if self.unsupported:
            lines.append("unsupported: " + self.unsupported_text())
        for p in self.problems:
            lines.append("problem: " + p)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


@dataclass
class ImportedOnnx:
    """`design` (a Design), `record` (its weights: `build_model(design).load_record(record)`), `report`."""

    design: Design
    record: ModuleRecord
    report: ImportReport


# ---------------------------------------------------------------------------------- reading the file
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
           10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
KIND_OF_ELEM = {1: "float", 10: "float", 11: "float", 2: "int", 3: "int", 5: "int", 6: "int", 7: "int",
                 12: "int", 13: "int", 9: "bool"}
TO_DTYPE = {1: "float32", 10: "float32", 11: "float32", 2: "int64", 3: "int64", 5: "int64", 6: "int64", 7: "int64",
       12: "int64", 13: "int64", 9: "bool"}


def node_attrs(node) -> dict:
    from onnx import helper  # noqa: PLC0415

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


UNSAFE_NAME = re.compile(r"[^0-9A-Za-z_]+")
KIND_OF_DTYPE = {"f": "float", "i": "int", "u": "int", "b": "bool"}
EINSUM_TEXT = re.compile(rb"^[A-Za-z,. ]*(->[A-Za-z. ]*)?$")


def dims_text(dims) -> str:
    text = "[" + ", ".join(str(d) for d in dims) + "]"
    return text if len(text) <= 120 else text[:100] + ", ...]"


def bytes_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} bytes"


class Unsupported(Exception):
    """This node (with these settings) cannot be imported: `why` is listed in the report."""

    def __init__(self, why: str = ""):
        super().__init__(why)
        self.why = why


LAYER_ACTIVATIONS = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Softsign": "Softsign",
                      "HardSwish": "HardSwish", "Mish": "Mish"}
