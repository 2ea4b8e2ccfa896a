"""ONNX import: an `.onnx` file as a design the designer opens, edits and builds, with its weights.

    from engine.design import build_model, import_onnx
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
nodes only where some node reads them as a tensor.

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

import faulthandler
import math
import os
import re
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..store.burnpack import TensorEntry
from ..store.record import ModuleRecord
from .catalog import snake_name
from .fields import is_axis_name
from .graph import Design, DesignError, check_node_name
from .layout import auto_layout
from .primitive import FOLD_ONLY_OPS, PRIMITIVE_OPS, OpError, constants_text, einsum_sizes, fold, parse_einsum
from .shape_rules import RuleError, Shape, op_shape
from .shapes import analyze

__all__ = ["import_onnx", "ImportedOnnx", "ImportReport", "OnnxImportError", "MIN_OPSET", "MAX_OPSET",
           "MAX_FOLD_ELEMENTS", "MAX_FOLD_BYTES", "MAX_FOLD_WORK"]

MIN_OPSET = 13
MAX_FILE_BYTES = 2 << 30  # protobuf's own limit for one message
MAX_NODES = 10_000  # a design's limit (design_schema.MAX_NODES)
MAX_ELEMENTS = 1 << 31  # elements in one tensor
MAX_FOLD_ELEMENTS = 1 << 24  # elements a folded constant (or a fold's scratch array) may have
MAX_FOLD_BYTES = 1 << 30  # bytes the folded constants may hold together (or twice the file's own tensors, if more)
MAX_FOLD_WORK = 1 << 32  # multiply-adds one folded product (MatMul, Gemm, Einsum, CumSum) may take
MAX_SHAPE_ENTRIES = 1024  # entries of a run-time shape (as a shape's or a Slice's constant values: _ints)
_INT_BOUND = 1 << 40  # Slice bounds beyond this mean "to the end"


def _max_opset() -> int:
    import onnx  # noqa: PLC0415

    return int(onnx.defs.onnx_opset_version())


MAX_OPSET = None  # set on first import (the installed onnx's newest opset)


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
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
           10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
_KIND_OF_ELEM = {1: "float", 10: "float", 11: "float", 2: "int", 3: "int", 5: "int", 6: "int", 7: "int",
                 12: "int", 13: "int", 9: "bool"}
_TO = {1: "float32", 10: "float32", 11: "float32", 2: "int64", 3: "int64", 5: "int64", 6: "int64", 7: "int64",
       12: "int64", 13: "int64", 9: "bool"}


def _shown(path: Path) -> str:
    s = str(path)
    return s if len(s) <= 200 else s[:100] + "…" + s[-60:]


def _read_model(path: Path):
    import onnx  # noqa: PLC0415
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    where = _shown(path)
    try:
        if not path.is_file():
            raise OnnxImportError(f"{where}: no such ONNX file" if not path.exists()
                                  else f"{where}: not an ONNX file (expected a regular file)")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise OnnxImportError(f"{where}: not an ONNX file this importer reads (expected at most 2 GiB of "
                                  f"protobuf, found {size / (1 << 30):.1f} GiB)")
        data = path.read_bytes()
    except OSError as e:
        raise OnnxImportError(f"{where}: cannot read it: {e.strerror or e}") from None
    if not data:
        raise OnnxImportError(f"{where}: not an ONNX model (the file is empty)")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, TypeError, RuntimeError, UnicodeDecodeError) as e:
        raise OnnxImportError(f"{where}: not an ONNX model (expected an ONNX ModelProto; the protobuf does not "
                              f"parse: {str(e)[:200] or type(e).__name__})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise OnnxImportError(f"{where}: not an ONNX model (expected a ModelProto with a graph, found none)")
    return model, data


def _check_opset(model, where: str) -> int:
    global MAX_OPSET
    if MAX_OPSET is None:
        MAX_OPSET = _max_opset()
    version = None
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            version = int(imp.version)
    if version is None:
        raise OnnxImportError(f"{where}: the model imports no opset of the default ONNX domain (expected opset "
                              f"{MIN_OPSET} to {MAX_OPSET})")
    if not MIN_OPSET <= version <= MAX_OPSET:
        hint = (" (re-export it with a newer opset, e.g. torch.onnx.export(..., opset_version=17))"
                if version < MIN_OPSET else " (update the onnx package to read it)")
        raise OnnxImportError(f"{where}: opset {version} is outside the range this importer reads (expected "
                              f"{MIN_OPSET} to {MAX_OPSET}){hint}")
    return version


def _check(model, data: bytes, path: Path, where: str) -> None:
    import onnx  # noqa: PLC0415

    external = any(t.data_location == 1 for t in model.graph.initializer)
    try:
        # with external data the checker needs the file's path: it checks the data lies in the model's folder;
        # else the bytes read (the ModelProto would be serialized again)
        onnx.checker.check_model(str(path) if external else data)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no reason given"
        raise OnnxImportError(f"{where}: the model fails onnx.checker: {first[:300]}") from None
    except UnicodeDecodeError as e:
        raise OnnxImportError(f"{where}: the model fails onnx.checker: a name or text in it is not valid UTF-8 "
                              f"({e.reason} at byte {e.start})") from None


def _tensor_array(t, where: str, folder: Path, what: str) -> np.ndarray:
    """The array of a TensorProto, with every size checked before it is trusted."""
    from onnx import numpy_helper  # noqa: PLC0415

    name = t.name or what
    if t.data_type not in _DTYPES:
        raise OnnxImportError(f"{where}: tensor {name!r}: data type {t.data_type} is not one the engine holds "
                              f"(expected float, double, float16, an int type or bool)")
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{where}: tensor {name!r}: negative dims {dims}")
    n = math.prod(dims)
    if n > MAX_ELEMENTS:
        raise OnnxImportError(f"{where}: tensor {name!r}: dims {dims} make {n:,} elements (at most "
                              f"{MAX_ELEMENTS:,} in one tensor)")
    dtype = np.dtype(_DTYPES[t.data_type])
    if t.data_location == 1:  # EXTERNAL
        return _external(t, where, folder, dims, dtype, name)
    if t.HasField("raw_data"):
        if len(t.raw_data) != n * dtype.itemsize:
            raise OnnxImportError(f"{where}: tensor {name!r}: dims {dims} ({dtype.name}) need "
                                  f"{n * dtype.itemsize:,} bytes of data, found {len(t.raw_data):,}")
    else:
        field_of = {np.float32: "float_data", np.float64: "double_data", np.int64: "int64_data",
                    np.uint64: "uint64_data", np.uint32: "uint64_data"}
        fname = field_of.get(dtype.type, "int32_data")
        have = len(getattr(t, fname))
        if have != n:
            raise OnnxImportError(f"{where}: tensor {name!r}: dims {dims} need {n:,} values, found {have:,} "
                                  f"(in {fname})")
    try:
        arr = numpy_helper.to_array(t)
    except (ValueError, TypeError) as e:
        raise OnnxImportError(f"{where}: tensor {name!r}: its data cannot be read: {e}") from None
    return _normalize(np.asarray(arr).reshape(dims))


def _normalize(arr: np.ndarray) -> np.ndarray:
    """float -> float32, ints -> int64, bool stays: the dtypes the engine computes with."""
    k = arr.dtype.kind
    if k == "f" and arr.dtype != np.float32:
        return arr.astype(np.float32)
    if k in "iu" and arr.dtype != np.int64:
        return arr.astype(np.int64)
    return arr


def _external(t, where: str, folder: Path, dims, dtype, name: str) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    n = math.prod(dims)
    need = n * dtype.itemsize
    if not loc or os.path.isabs(loc) or "\x00" in loc:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data location {loc[:80]!r} refused (expected a "
                              f"file name relative to the model's folder)")
    base = folder.resolve()
    target = (base / loc).resolve()
    try:
        target.relative_to(base)
    except ValueError:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data {loc[:80]!r} lies outside the model's "
                              f"folder {base} (refused)") from None
    if not target.is_file():
        raise OnnxImportError(f"{where}: tensor {name!r}: external data file {loc[:80]!r} not found next to the "
                              f"model")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info.get("length", str(need)))
    except ValueError:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data offset / length must be integers, found "
                              f"{info.get('offset')!r} / {info.get('length')!r}") from None
    size = target.stat().st_size
    if offset < 0 or length != need or offset + length > size:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data at offset {offset} of length {length} "
                              f"(expected {need} bytes for dims {dims} {dtype.name}) does not fit {loc!r} "
                              f"({size} bytes)")
    with open(target, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    return _normalize(np.frombuffer(raw, dtype=dtype).reshape(dims).copy())


# ---------------------------------------------------------------------------------- the import
def import_onnx(path) -> ImportedOnnx:
    """The design, weights and report of an ONNX file (see this file's docstring)."""
    path = Path(path)
    model, data = _read_model(path)
    where = _shown(path)
    opset = _check_opset(model, where)
    _check(model, data, path, where)
    del data
    return _Importer(model, path, where, opset).run()


def _light(model):
    """The model for shape inference: initializers of more than 4,096 elements become typed graph inputs
    (their dims are all the inference reads; small ones, such as a Reshape's shape, keep their values)."""
    from onnx import ModelProto, helper  # noqa: PLC0415

    graph = model.graph
    if not any(math.prod(t.dims) > 4096 for t in graph.initializer):
        return model
    light = ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    g = light.graph
    g.node.extend(graph.node)
    g.input.extend(graph.input)
    g.output.extend(graph.output)
    g.value_info.extend(graph.value_info)
    declared = {v.name for v in graph.input}
    for t in graph.initializer:
        if math.prod(t.dims) > 4096:
            if t.name not in declared:
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return light


INFERENCE_SECONDS = 120  # onnx's shape inference of a 10k-node graph takes about a second


def _infer_shapes(light):
    """onnx's shape inference of `light` (None where it fails). It is C++ that a hostile graph can make abort
    the process (a negative size reaching Slice's std::clamp assertion: onnx built with assertions) or loop,
    so where the system forks it runs in a child process that sends the result back through a pipe: a crash
    or `INFERENCE_SECONDS` without an answer is a failed inference, not a lost process."""
    import onnx  # noqa: PLC0415

    if not hasattr(os, "fork"):
        try:
            return onnx.shape_inference.infer_shapes(light, strict_mode=False)
        except Exception:  # noqa: BLE001 - a hint only
            return None
    data = light.SerializeToString()
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: infer, write, exit without running the parent's cleanups
        code = 1
        try:
            os.close(r)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # an assertion's message is the parent's to give
            faulthandler.disable()  # nor a traceback of the crash (pytest's goes to a copy of stderr)
            out = memoryview(onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(data),
                                                               strict_mode=False).SerializeToString())
            while out:
                out = out[os.write(w, out):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks, done = [], False
    deadline = time.monotonic() + INFERENCE_SECONDS
    try:
        while not done and time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(r, 1 << 20) if ready else b""
            chunks.append(chunk)
            done = ready and not chunk
    finally:
        os.close(r)
        if not done:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if not done or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        return onnx.ModelProto.FromString(b"".join(chunks))
    except Exception:  # noqa: BLE001 - a hint only
        return None


def _attrs(node) -> dict:
    from onnx import helper  # noqa: PLC0415

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


_SAFE = re.compile(r"[^0-9A-Za-z_]+")
_KIND_OF_DTYPE = {"f": "float", "i": "int", "u": "int", "b": "bool"}
_EINSUM_TEXT = re.compile(rb"^[A-Za-z,. ]*(->[A-Za-z. ]*)?$")


def _dims_text(dims) -> str:
    text = "[" + ", ".join(str(d) for d in dims) + "]"
    return text if len(text) <= 120 else text[:100] + ", ...]"


def _bytes_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} bytes"


def _fold_work(op: str, attrs: dict, operands: list, dims: list) -> tuple:
    """(elements of the largest scratch array, multiply-adds) a fold takes beyond making its output, where the
    engine's implementation takes more than a pass over its operands: products and CumSum's triangle."""
    out = math.prod(dims)
    if op in ("MatMul", "Gemm"):
        a = operands[0]
        inner = a.shape[-1] if a.ndim else 1
        if op == "Gemm" and attrs.get("trans_a") and a.ndim == 2:
            inner = a.shape[0]
        return 0, out * int(inner)
    if op == "Einsum":
        parts = [a for a in operands if a is not None]
        terms, letters = parse_einsum(attrs.get("mode", ""))
        sizes = einsum_sizes(terms, [a.shape for a in parts], attrs.get("mode"))
        # each operand summed over the letters only it has (an empty one's sum is as large as its other axes)
        scratch = max(math.prod(int(sizes[c]) for c in t if c in letters or sum(c in u for u in terms) > 1)
                      for t in terms)
        if len(terms) == 2:  # the product runs over the output's letters and the ones both operands share
            letters = set(letters) | (set(terms[0]) & set(terms[1]))
        return scratch, math.prod(int(sizes[c]) for c in set(letters))
    if op.startswith("Reduce"):  # one axis at a time: reducing an empty axis makes the others' product
        dims_now = list(operands[0].shape)
        rank = len(dims_now)
        axes = range(rank) if attrs.get("axes") is None else {a + rank if a < 0 else a for a in attrs["axes"]}
        scratch = 0
        for a in sorted(axes, reverse=True):
            dims_now[a] = 1
            scratch = max(scratch, math.prod(dims_now))
        return scratch, 0
    if op == "ScatterND":  # a mask of the rows the indices can name
        data, idx = operands[0], operands[1]
        q = int(idx.shape[-1]) if idx.ndim else 0
        return math.prod(data.shape[:q]), 0
    if op == "CumSum":  # a product with an n x n triangle along the axis
        x = operands[0]
        axis = int(attrs["axis"])
        n = int(x.shape[axis + x.ndim if axis < 0 else axis]) if x.ndim else 1
        return n * n, out * n
    return 0, 0


class _Unsupported(Exception):
    """This node (with these settings) cannot be imported: `why` is listed in the report."""

    def __init__(self, why: str = ""):
        super().__init__(why)
        self.why = why


_LAYER_ACTIVATIONS = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Softsign": "Softsign",
                      "HardSwish": "HardSwish", "Mish": "Mish"}


class _Importer:
    def __init__(self, model, path: Path, where: str, opset: int):
        self.model = model
        self.g = model.graph
        self.path = path
        self.where = where
        self.folder = path.parent
        self.report = ImportReport(path=where, opset=opset, producer=(model.producer_name or "")[:60])
        self.design = Design("Model")
        self.entries: list = []
        self.consts: dict = {}
        self.src: dict = {}  # value name -> (design node, port)
        self.origin: dict = {}  # design node -> onnx node name
        self.info: dict = {}  # value name -> (elem_type, dims or None)
        self.done: set = set()
        self.sym: dict = {}  # value -> (entries, rank): a run-time shape, each entry an int or (value, axis)
        self.deferred: dict = {}  # value -> node index: made as Op nodes only when a consumer needs the tensor
        self.file_bytes = 0  # the bytes of the file's own tensors (initializers, Constant nodes)
        self.folded_bytes = 0  # the bytes of the constants folded so far

    # ------------------------------------------------------------------ helpers
    def fail(self, message: str):
        raise OnnxImportError(f"{self.where}: {message}", self.report)

    def node_name(self, i: int, node) -> str:
        return node.name or f"#{i} ({node.op_type})"

    def dims_of(self, value: str):
        if value in self.consts:
            return list(self.consts[value].shape)
        got = self.info.get(value)
        return None if got is None else got[1]

    def design_name(self, onnx_name: str, op: str) -> str:
        stem = onnx_name if isinstance(onnx_name, str) else bytes(onnx_name).decode("utf-8", "replace")
        if stem.startswith("node_"):
            stem = stem[5:]
        stem = _SAFE.sub("_", stem).strip("_").lower()
        if not stem or not stem[0].isalpha():
            stem = f"{op.lower()}_{stem}" if stem else op.lower()
        stem = stem[:60]
        try:
            check_node_name(stem)
        except DesignError:
            stem = f"n_{stem}"
        return self.design.unique_name(stem)

    def add(self, kind: str, onnx_name: str, op: str, config: dict, inputs: list, output: str | None,
            params: dict | None = None, ports: list | None = None) -> str:
        name = self.design_name(onnx_name, op)
        try:
            self.design.add_node(kind, name, config)
        except DesignError as e:
            raise _Unsupported(f"its settings do not make a {kind}: {e}") from None
        ports = ports or list(self.design.input_ports(name))
        for value, port in zip(inputs, ports):
            s = self.src.get(value)
            if s is None:
                self.fail(f"node {onnx_name!r} ({op}): input {value!r} is not defined before it (expected a graph "
                          f"input, an initializer or an earlier node's output)")
            self.design.connect(s[0], s[1], name, port)
        for fname, arr in (params or {}).items():
            arr = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
            self.entries.append(TensorEntry.from_array(f"{name}.{fname}", arr))
        if output is not None:
            self.src[output] = (name, "output")
        self.origin[name] = onnx_name
        self.report.kinds[name] = kind
        return name

    def const(self, value: str, onnx_name: str, what: str) -> np.ndarray:
        if value not in self.consts:
            raise _Unsupported(f"its {what} ({value!r}) is computed at run time; the importer needs it constant")
        return self.consts[value]

    def consumers(self, value: str) -> list:
        return self._consumers.get(value, [])

    def single(self, value: str):
        """The index of the one node reading `value` (None when several, none, or a graph output)."""
        c = self.consumers(value)
        if len(c) != 1 or value in self.outputs:
            return None
        return c[0]

    def scalar(self, value: str):
        a = self.consts.get(value)
        if a is None or a.size != 1:
            return None
        return float(a.reshape(()))

    # ------------------------------------------------------------------ run
    def run(self) -> ImportedOnnx:
        g = self.g
        if len(g.node) > MAX_NODES:
            self.fail(f"{len(g.node):,} nodes; a design holds at most {MAX_NODES:,}")
        self._before_inference()
        self._shape_info()
        for t in g.initializer:
            self.consts[t.name] = _tensor_array(t, self.where, self.folder, "initializer")
            self.file_bytes += self.consts[t.name].nbytes
        self.outputs = {o.name for o in g.output}
        self._consumers: dict = {}
        for i, n in enumerate(g.node):
            for v in n.input:
                if v:
                    self._consumers.setdefault(v, []).append(i)
        self._inputs()
        self._defined_check()
        for i, n in enumerate(g.node):  # the Constant nodes first: the patterns below read their values
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
                try:
                    self._fold(n, self.node_name(i, n))
                except _Unsupported:
                    continue
                self.done.add(i)
        self.fusions = self._find_fusions()
        for i, node in enumerate(g.node):
            if i in self.done:
                continue
            name = self.node_name(i, node)
            try:
                self._node(i, node, name)
            except _Unsupported as e:
                key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
                label = name if not e.why else f"{name}: {e.why}"
                self.report.unsupported.setdefault(key, []).append(label)
                self.report.mapping[name] = "unsupported" + (f": {e.why}" if e.why else "")
                for o in node.output:
                    self.src.setdefault(o, None)
        if self.report.unsupported:
            n = sum(len(v) for v in self.report.unsupported.values())
            self.fail(f"{n} node(s) the engine cannot import: {self.report.unsupported_text()}")
        self._outputs()
        analysis = analyze(self.design)
        if not analysis.ok:
            msgs = []
            for n, m in analysis.errors().items():
                msgs.append(f"node {self.origin.get(n, n)!r} (imported as {n}, {self.design.kind(n)}): {m}")
            msgs = msgs or analysis.messages()
            self.report.problems.extend(msgs)
            self.fail("the graph's dims do not fit: " + "; ".join(msgs[:10]))
        self._check_declared(analysis)
        auto_layout(self.design)
        return ImportedOnnx(self.design, ModuleRecord(self.entries), self.report)

    def _before_inference(self):
        """What onnx's shape inference does not survive: an Einsum equation with a character other than letters,
        ',', '.', '->' and spaces makes it loop for ever (onnx 1.x, two rank-2 operands: 'i;j->ij')."""
        for i, n in enumerate(self.g.node):
            if n.op_type == "Einsum" and n.domain in ("", "ai.onnx"):
                eq = _attrs(n).get("equation", b"")
                eq = eq if isinstance(eq, bytes) else str(eq).encode("utf-8", "replace")
                if not _EINSUM_TEXT.match(eq):
                    self.fail(f"node {self.node_name(i, n)!r} (Einsum): equation {eq[:80]!r} holds characters other "
                              f"than letters, ',', '...', '->' and spaces (expected an equation such as 'bij,bjk->bik')")

    def _shape_info(self):
        inferred = _infer_shapes(_light(self.model))
        if inferred is not None:
            values = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
        else:  # shape inference is a hint only; the design's own analysis decides
            values = list(self.g.value_info) + list(self.g.output) + list(self.g.input)
        for v in values:
            tt = v.type.tensor_type
            if not v.type.HasField("tensor_type"):
                continue
            dims = None
            if tt.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
            self.info[v.name] = (tt.elem_type, dims)

    def _inputs(self):
        names = set()
        for v in self.g.input:
            if v.name in self.consts:
                continue
            if not v.type.HasField("tensor_type"):
                self.fail(f"graph input {v.name!r}: expected a tensor, found another type")
            tt = v.type.tensor_type
            kind = _KIND_OF_ELEM.get(tt.elem_type)
            if kind is None:
                self.fail(f"graph input {v.name!r}: element type {tt.elem_type} is not one the engine computes with")
            dims = []
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_value"):
                    self.fail(f"graph input {v.name!r}: axis {i} has size {d.dim_value} (expected a size >= 1 or a "
                              f"named axis)")
                else:
                    p = _SAFE.sub("_", d.dim_param or "").strip("_")
                    dims.append(p if p and is_axis_name(p) else f"{_SAFE.sub('_', v.name)}_d{i}")
            if not dims:
                self.fail(f"graph input {v.name!r}: a scalar input (expected at least one axis)")
            name = self.design_name(v.name, "input")
            self.design.add_node("Input", name, {"shape": dims, "dtype": kind})
            self.src[v.name] = (name, "output")
            names.add(name)
        if not names:
            self.fail("the graph has no inputs (expected at least one tensor input that is not an initializer)")

    def _defined_check(self):
        defined = set(self.consts) | set(self.src)
        missing = []
        for i, n in enumerate(self.g.node):
            for v in n.input:
                if v and v not in defined:
                    missing.append(f"node {self.node_name(i, n)!r} ({n.op_type}) reads {v!r}")
            defined.update(o for o in n.output if o)
        for o in self.g.output:
            if o.name not in defined:
                missing.append(f"graph output {o.name!r}")
        if missing:
            self.fail("missing initializer or input: " + "; ".join(missing[:10]) +
                      " — expected a graph input, an initializer or an earlier node's output of that name")

    def _outputs(self):
        for o in self.g.output:
            s = self.src.get(o.name)
            if s is None:
                if o.name in self.consts:
                    self.fail(f"graph output {o.name!r} is a constant (expected a tensor computed from the inputs)")
                self.fail(f"graph output {o.name!r} is not produced by any node")
            name = self.design_name(o.name, "output")
            self.design.add_node("Output", name)
            self.design.connect(s[0], s[1], name, "input")

    def _check_declared(self, analysis):
        shapes = analysis.output_shapes()
        reading: dict = {}  # (design node, port) -> the first Output node reading it
        for n in self.design.outputs():
            reading.setdefault(self.design.source_of(n, "input"), n)
        for o in self.g.output:
            got = self.info.get(o.name)
            out = reading.get(self.src.get(o.name))
            if not got or not got[1] or out is None or out not in shapes:
                continue
            t = shapes[out]
            declared = got[1]
            if len(declared) != t.rank or any(isinstance(d, int) and d > 0 and s.is_const() and s.value() != d
                                              for d, s in zip(declared, t.sym)):
                self.fail(f"graph output {o.name!r}: the file declares dims {declared}, the imported graph computes "
                          f"{t.text()}")

    # ------------------------------------------------------------------ fusions
    def _producer(self):
        if not hasattr(self, "_prod"):
            self._prod = {o: i for i, n in enumerate(self.g.node) for o in n.output if o}
        return self._prod

    def _other(self, node, value):
        """The operand of a two-input node that is not `value` (None when both or neither are)."""
        a, b = (list(node.input) + ["", ""])[:2]
        if a == value and b != value:
            return b
        if b == value and a != value:
            return a
        return None

    def _find_fusions(self) -> dict:
        """{anchor node index: (kind, config, input value, output value, params, [indices])}."""
        out = {}
        nodes = self.g.node
        for i, n in enumerate(nodes):
            if n.op_type == "Erf":
                got = self._gelu(i)
            elif n.op_type == "Pow":
                got = self._rms(i)
            elif n.op_type == "Sigmoid":
                got = self._silu(i)
            else:
                continue
            if got is None:
                continue
            members = got[-1]
            if any(m in self.done for m in members):
                continue
            anchor = max(members)
            out[anchor] = got
            self.done.update(m for m in members if m != anchor)
        return out

    def _gelu(self, i):
        nodes, prod = self.g.node, self._producer()
        erf = nodes[i]
        p = prod.get(erf.input[0])
        if p is None:
            return None
        d = nodes[p]
        if d.op_type == "Div" and abs((self.scalar(d.input[1]) or 0) - math.sqrt(2)) < 1e-3:
            x = d.input[0]
        elif d.op_type == "Mul" and self.scalar(d.input[1]) is not None and \
                abs(self.scalar(d.input[1]) - 1 / math.sqrt(2)) < 1e-3:
            x = d.input[0]
        else:
            return None
        if self.single(d.output[0]) != i:
            return None
        a = self.single(erf.output[0])
        if a is None or nodes[a].op_type != "Add" or abs((self.scalar(self._other(nodes[a], erf.output[0]) or "")
                                                          or 0) - 1.0) > 1e-6:
            return None
        m1 = self.single(nodes[a].output[0])
        if m1 is None or nodes[m1].op_type != "Mul":
            return None
        other = self._other(nodes[m1], nodes[a].output[0])
        if other == x:
            m2 = self.single(nodes[m1].output[0])
            if m2 is None or nodes[m2].op_type != "Mul" or \
                    abs((self.scalar(self._other(nodes[m2], nodes[m1].output[0]) or "") or 0) - 0.5) > 1e-6:
                return None
            return ("Gelu", {}, x, nodes[m2].output[0], {}, [p, i, a, m1, m2])
        h = prod.get(other)
        if h is not None and nodes[h].op_type == "Mul" and self.single(other) == m1 and \
                self._other(nodes[h], x) is not None and \
                abs((self.scalar(self._other(nodes[h], x)) or 0) - 0.5) < 1e-6:
            return ("Gelu", {}, x, nodes[m1].output[0], {}, [h, p, i, a, m1])
        return None

    def _rms(self, i):
        nodes, prod = self.g.node, self._producer()
        pw = nodes[i]
        x = pw.input[0]
        if self.scalar(pw.input[1]) != 2.0 or x in self.consts:
            return None
        dims = self.dims_of(x)
        r = self.single(pw.output[0])
        if r is None or nodes[r].op_type != "ReduceMean":
            return None
        rm = nodes[r]
        at = _attrs(rm)
        axes = at.get("axes")
        if axes is None and len(rm.input) > 1 and rm.input[1]:
            axes = self.consts.get(rm.input[1])
            axes = None if axes is None else [int(v) for v in axes.reshape(-1)]
        if axes is None or len(axes) != 1 or not at.get("keepdims", 1):
            return None
        if axes[0] != -1 and not (dims and axes[0] == len(dims) - 1):
            return None
        a = self.single(rm.output[0])
        if a is None or nodes[a].op_type != "Add":
            return None
        eps = self.scalar(self._other(nodes[a], rm.output[0]) or "")
        if eps is None:
            return None
        s = self.single(nodes[a].output[0])
        if s is None or nodes[s].op_type != "Sqrt":
            return None
        nx_ = self.single(nodes[s].output[0])
        if nx_ is None:
            return None
        members = [i, r, a, s]
        nn_ = nodes[nx_]
        if nn_.op_type == "Reciprocal":
            m = self.single(nn_.output[0])
            if m is None or nodes[m].op_type != "Mul" or self._other(nodes[m], nn_.output[0]) != x:
                return None
            members += [nx_, m]
        elif nn_.op_type == "Div" and list(nn_.input[:2]) == [x, nodes[s].output[0]]:
            m = nx_
            members.append(m)
        elif nn_.op_type == "Div" and self.scalar(nn_.input[0]) == 1.0:
            m = self.single(nn_.output[0])
            if m is None or nodes[m].op_type != "Mul" or self._other(nodes[m], nn_.output[0]) != x:
                return None
            members += [nx_, m]
        else:
            return None
        out = nodes[m].output[0]
        gamma = None
        w = self.single(out)
        if w is not None and nodes[w].op_type == "Mul":
            g = self._other(nodes[w], out)
            if g in self.consts and self.consts[g].ndim == 1 and self.consts[g].dtype == np.float32:
                gamma = self.consts[g]
                members.append(w)
                out = nodes[w].output[0]
        if gamma is None:  # made from the declared dims: a size a file claims, so bounded as a folded constant
            if not dims or not isinstance(dims[-1], int) or not 0 < dims[-1] <= MAX_FOLD_ELEMENTS:
                return None
            gamma = np.ones((dims[-1],), np.float32)
        if dims and isinstance(dims[-1], int) and dims[-1] != gamma.shape[0]:
            return None
        return ("RmsNorm", {"d_model": int(gamma.shape[0]), "epsilon": float(eps)}, x, out, {"gamma": gamma}, members)

    def _silu(self, i):
        nodes = self.g.node
        sg = nodes[i]
        x = sg.input[0]
        m = self.single(sg.output[0])
        if m is None or nodes[m].op_type != "Mul" or self._other(nodes[m], sg.output[0]) != x:
            return None
        return ("SiLU", {}, x, nodes[m].output[0], {}, [i, m])

    # ------------------------------------------------------------------ one node
    def _node(self, i: int, node, name: str):
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise _Unsupported(f"an op of the domain {node.domain!r}")
        if i in self.fusions:
            kind, config, x, out, params, members = self.fusions[i]
            if x in self.src and self.src[x] is None:
                for nm in [self.node_name(m, self.g.node[m]) for m in sorted(members)]:
                    self.report.mapping[nm] = "not imported: it reads the output of an unsupported node"
                self.src.setdefault(out, None)
                return
            if x not in self.src:
                raise _Unsupported("its input is not a tensor computed from the graph's inputs")
            made = self.add(kind, snake_name(kind), kind, config, [x], out, params)
            self.origin[made] = name
            names = [self.node_name(m, self.g.node[m]) for m in sorted(members)]
            for nm in names:
                self.report.mapping[nm] = f"fused into {made} ({kind})"
            self.report.fused.append((made, kind, names))
            return
        ins = list(node.input)
        known = op in PRIMITIVE_OPS or op in FOLD_ONLY_OPS or op in ("Identity", "Shape", "Constant", "Dropout") \
            or hasattr(self, f"_op_{op}")
        if not known:
            raise _Unsupported()
        runtime = [v for v in ins if v and v not in self.consts]
        if any(v in self.sym for v in runtime) and self._symbolic(i, node, name):
            return
        for v in runtime:
            if v in self.deferred and v not in self._attr_inputs(node):
                self._materialize(v)
        if any(self.src.get(v, 0) is None for v in runtime):
            self.report.mapping[name] = "not imported: it reads the output of an unsupported node"
            for o in node.output:
                self.src.setdefault(o, None)
            return
        if op in ("Constant",) or (not runtime and (op in PRIMITIVE_OPS or op in FOLD_ONLY_OPS)):
            self._fold(node, name)
            return
        if op == "Shape":
            dims = self.dims_of(ins[0])
            at = _attrs(node)
            if dims and all(isinstance(d, int) and d > 0 for d in dims):
                arr = np.asarray(dims, np.int64)[slice(at.get("start", 0), at.get("end"))]
                self.consts[node.output[0]] = arr
                self.report.mapping[name] = "folded into a constant (the input's dims are fixed)"
                return
            if dims is not None and ins[0] in self.src and self.src[ins[0]] is not None:
                entries = [d if isinstance(d, int) and d > 0 else (ins[0], k) for k, d in enumerate(dims)]
                self.sym[node.output[0]] = (entries[slice(at.get("start", 0), at.get("end"))], 1)
                self.deferred[node.output[0]] = i
                self.report.mapping[name] = "a run-time shape (its named axes flow into the ops reading it)"
                return
            if "start" in at or "end" in at:
                raise _Unsupported("Shape with start / end of a tensor whose dims vary")
        if op == "Identity" or (op == "Dropout" and len(node.output) > 1 and node.output[1] in self._consumers):
            if op == "Dropout":
                raise _Unsupported("its mask output is used")
            self.src[node.output[0]] = self.src[ins[0]]
            self.report.mapping[name] = "passes its input through (no node)"
            return
        handler = getattr(self, f"_op_{op}", None)
        if handler is not None:
            made = handler(node, name)
            if made is not None:
                self.report.mapping.setdefault(name, f"{made} ({self.design.kind(made)})")
                return
        if op in PRIMITIVE_OPS:
            made = self._primitive(node, name)
            self.report.mapping[name] = f"{made} (Op {op})"
            return
        if op in FOLD_ONLY_OPS:
            raise _Unsupported("its inputs are computed at run time (the output's dims would be a run-time value)")
        raise _Unsupported()

    # ------------------------------------------------------------------ run-time shapes
    def _sym_of(self, v: str):
        """(entries, rank) of a run-time shape or of a small int constant (None for anything else)."""
        if v in self.sym:
            return self.sym[v]
        a = self.consts.get(v)
        if a is not None and a.dtype.kind in "iu" and a.ndim <= 1 and a.size <= 1024:
            return [int(x) for x in a.reshape(-1)], a.ndim
        return None

    def _symbolic(self, i: int, node, name: str) -> bool:
        """Evaluates Gather / Slice / Concat / Unsqueeze / Squeeze / Cast / Identity of a run-time shape on its
        entries (the named axes flow through); False where the op is not one of those forms."""
        op, ins, at = node.op_type, list(node.input), _attrs(node)
        got = self._sym_of(ins[0]) if ins and ins[0] else None
        out = None
        if op in ("Identity", "Cast") and got is not None and (op == "Identity" or _TO.get(int(at.get("to", 1)))
                                                               == "int64"):
            out = got
        elif op == "Gather" and got is not None and got[1] == 1 and int(at.get("axis", 0)) == 0:
            idx = self.consts.get(ins[1])
            if idx is not None and idx.dtype.kind in "iu" and idx.ndim <= 1 and idx.size <= MAX_SHAPE_ENTRIES and \
                    all(-len(got[0]) <= int(k) < len(got[0]) for k in idx.reshape(-1)):
                out = ([got[0][int(k)] for k in idx.reshape(-1)], idx.ndim)
        elif op == "Slice" and got is not None and got[1] == 1:
            try:
                b = [self._ints(node, k, w) for k, w in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps"))]
            except _Unsupported:
                return False
            if b[0] is not None and b[1] is not None and len(b[0]) == 1 and (b[2] is None or b[2] in ([0], [-1])):
                step = (b[3] or [1])[0]
                if step != 0:
                    out = (got[0][slice(b[0][0], b[1][0], step)], 1)
        elif op == "Concat" and int(at.get("axis", 0)) in (0, -1):
            parts = [self._sym_of(v) for v in ins if v]
            if all(p is not None and p[1] == 1 for p in parts) and sum(len(p[0]) for p in parts) <= MAX_SHAPE_ENTRIES:
                out = ([e for p in parts for e in p[0]], 1)
        elif op == "Unsqueeze" and got is not None and got[1] == 0:
            axes = [int(v) for v in at["axes"]] if "axes" in at else self._ints(node, 1, "axes")
            if axes in ([0], [-1]):
                out = (got[0], 1)
        elif op == "Squeeze" and got is not None and got[1] == 1 and len(got[0]) == 1:
            out = (got[0], 0)
        if out is None:
            return False
        entries, rank = out
        if all(isinstance(e, int) for e in entries):
            arr = np.asarray(entries, np.int64)
            self.consts[node.output[0]] = arr.reshape(()) if rank == 0 else arr
            self.report.mapping[name] = "folded into a constant (the run-time sizes it reads are not used)"
        else:
            self.sym[node.output[0]] = out
            self.deferred[node.output[0]] = i
            self.report.mapping[name] = "a run-time shape (its named axes flow into the ops reading it)"
        return True

    def _materialize(self, v: str):
        """The Op nodes of a run-time shape a consumer reads as a tensor (not only as a target shape)."""
        made, todo = [], [v]
        while todo:  # the deferred nodes it reads, however deep the chain (no recursion)
            u = todo.pop()
            if u in self.deferred:
                i = self.deferred.pop(u)
                made.append(i)
                todo.extend(w for w in self.g.node[i].input if w in self.deferred)
        for i in sorted(made):  # the file's order: every node after the ones it reads
            node = self.g.node[i]
            name = self.node_name(i, node)
            self.report.mapping[name] = f"{self._primitive(node, name)} (Op {node.op_type})"

    def _runtime_target(self, node, pos: int):
        """A run-time Reshape / Expand target as (shape with codes, reference value) (see primitive.py)."""
        entries, rank = self.sym[node.input[pos]]
        if rank != 1:
            raise _Unsupported("its target shape is not a 1-d list of sizes")
        refs = {e[0] for e in entries if not isinstance(e, int)}
        data = node.input[0]
        if node.op_type == "Reshape":
            free = [k for k, e in enumerate(entries) if not isinstance(e, int) and e != (data, k)]
            if len(free) <= 1 and -1 not in entries or not free:
                return [e if isinstance(e, int) else (0 if e == (data, k) else -1)
                        for k, e in enumerate(entries)], None
        if len(refs) != 1:
            raise _Unsupported(f"its target shape reads the sizes of {len(refs)} tensors (expected one)")
        ref = refs.pop()
        if ref in self.deferred:
            self._materialize(ref)
        if self.src.get(ref) is None:
            raise _Unsupported(f"its target shape reads the sizes of {ref!r}, which is not imported")
        return [e if isinstance(e, int) else -2 - e[1] for e in entries], ref

    def _fold(self, node, name: str):
        at = _attrs(node)
        op = node.op_type
        if op == "Constant":
            if "value" not in at:
                raise _Unsupported("a Constant without a tensor 'value'")
            t = [a for a in node.attribute if a.name == "value"][0].t
            self.consts[node.output[0]] = _tensor_array(t, self.where, self.folder, node.output[0])
            self.file_bytes += self.consts[node.output[0]].nbytes
            self.report.mapping[name] = "a constant"
            return
        arrays = [self.consts[v] if v else None for v in node.input]
        if not arrays or arrays[0] is None:
            self.fail(f"node {name!r} ({op}): its first input is missing (expected a tensor)")
        attrs = self._op_attrs(node, at, fold=True)
        if op == "ConstantOfShape" and "value" in at:
            attrs["value"] = _tensor_array(at["value"], self.where, self.folder, "value")
        operands = [a for a, v in zip(arrays, node.input) if v not in self._attr_inputs(node)]
        outputs = [(node.output[0], attrs)]
        if op == "TopK":  # values and indices, each where it is read
            outputs = [(o, {**attrs, "mode": attrs["mode"] + what}) for o, what in zip(node.output, ("values", "indices"))
                       if o and (o in self._consumers or o in self.outputs)]
        for value, settings in outputs:
            nbytes = self._fold_size(name, op, settings, operands)
            try:
                out = fold(op, settings, operands)
            except (OpError, ValueError, TypeError, IndexError) as e:
                self.fail(f"node {name!r} ({op}): its constant operands do not fit: {e}")
            out = _normalize(np.asarray(out))
            self.consts[value] = out
            self.folded_bytes += max(out.size * out.itemsize, nbytes)
        self.report.mapping[name] = "folded into a constant"

    def _fold_size(self, name: str, op: str, attrs: dict, operands: list) -> int:
        """The bytes a fold will make, from its operands' dims and the op's settings (nothing is computed):
        `_Unsupported` saying the size and the limit when the value, a scratch array or the product's work
        passes `MAX_FOLD_ELEMENTS` / `MAX_FOLD_WORK`, or the folded values together `MAX_FOLD_BYTES` (or
        twice the file's own tensors where that is more)."""
        itemsize = {"float": 4, "int": 8, "bool": 1}
        scratch, work = 0, 0
        if op == "ConstantOfShape":
            if operands[0].dtype.kind not in "iu" or operands[0].ndim > 1 or operands[0].size > MAX_SHAPE_ENTRIES:
                raise _Unsupported(f"a shape of {operands[0].dtype} dims {list(operands[0].shape)} (expected at most "
                                   f"{MAX_SHAPE_ENTRIES} integer sizes)")
            dims = [int(v) for v in operands[0].reshape(-1)]
            if any(d < 0 for d in dims):
                raise _Unsupported(f"a negative size in its shape {_dims_text(dims)}")
            value = attrs.get("value")
            kind = _KIND_OF_DTYPE.get(np.dtype(np.float32 if value is None else value.dtype).kind, "int")
        elif op == "Range":
            if len(operands) != 3 or any(a is None or a.size != 1 for a in operands):
                raise _Unsupported("a Range of other than three scalars (start, limit, delta)")
            s, lim, d = (float(a.reshape(())) for a in operands)
            n = (lim - s) / d if d else math.nan
            if math.isnan(n):
                raise _Unsupported(f"Range({s}, {lim}, {d}): expected finite scalars and a delta other than 0")
            if n > MAX_FOLD_ELEMENTS:
                raise _Unsupported(f"Range({s}, {lim}, {d}) would make {n:,.0f} elements (at most "
                                   f"{MAX_FOLD_ELEMENTS:,} in a folded constant)")
            dims = [max(math.ceil(n), 0)]
            kind = _KIND_OF_DTYPE.get(operands[0].dtype.kind, "int")
        else:
            try:
                shapes = [None if a is None else Shape(a.shape, _KIND_OF_DTYPE.get(a.dtype.kind, "int"))
                          for a in operands]
                out = op_shape(op, attrs, shapes)
                dims = [d.value() for d in out.dims]
                kind = out.dtype
                scratch, work = _fold_work(op, attrs, operands, dims)
            except (RuleError, OpError, ValueError, TypeError, IndexError, KeyError) as e:
                self.fail(f"node {name!r} ({op}): its constant operands do not fit: {e}")
        n = math.prod(dims)
        nbytes = n * itemsize[kind]
        if n > MAX_FOLD_ELEMENTS:
            raise _Unsupported(f"folding it would make dims {_dims_text(dims)}: {n:,} elements ({_bytes_text(nbytes)}"
                               f"); at most {MAX_FOLD_ELEMENTS:,} elements in a folded constant")
        axis = max([int(d) for a in operands if a is not None for d in a.shape] + list(dims) + [0])
        if axis > MAX_FOLD_ELEMENTS:  # empty arrays too: NumPy makes index arrays along an axis (TopK's gather)
            raise _Unsupported(f"folding it would take an axis of {axis:,} (operands of dims "
                               f"{', '.join(_dims_text(a.shape) for a in operands if a is not None)[:200]}, result "
                               f"{_dims_text(dims)}); at most {MAX_FOLD_ELEMENTS:,} in a folded constant")
        if scratch > MAX_FOLD_ELEMENTS:
            raise _Unsupported(f"folding it would need a scratch array of {scratch:,} elements (at most "
                               f"{MAX_FOLD_ELEMENTS:,})")
        if work > MAX_FOLD_WORK:
            raise _Unsupported(f"folding it would take {work:,} multiply-adds (at most {MAX_FOLD_WORK:,} for a "
                               f"folded product)")
        budget = max(MAX_FOLD_BYTES, 2 * self.file_bytes)
        if self.folded_bytes + nbytes > budget:
            raise _Unsupported(f"folding it would make {_bytes_text(nbytes)} more, {_bytes_text(self.folded_bytes)} "
                               f"of constants being folded already (at most {_bytes_text(budget)} in all: "
                               f"{_bytes_text(MAX_FOLD_BYTES)}, or twice the file's own tensors)")
        return nbytes

    def _attr_inputs(self, node) -> set:
        """The inputs this op reads as settings (a Reshape's shape, a Slice's starts...)."""
        pos = {"Reshape": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4),
               "Pad": (1, 2, 3), "Tile": (1,), "Trilu": (1,), "TopK": (1,), "CumSum": (1,),
               "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
               "ReduceLogSumExp": (1,)}.get(node.op_type, ())
        return {node.input[p] for p in pos if p < len(node.input) and node.input[p]}

    def _ints(self, node, pos: int, what: str):
        if pos >= len(node.input) or not node.input[pos]:
            return None
        a = self.const(node.input[pos], node.name, what)
        if a.dtype.kind not in "iu":
            raise _Unsupported(f"its {what} must be integers, found {a.dtype}")
        if a.size > 1024:
            raise _Unsupported(f"its {what} has {a.size} values (at most 1024)")
        return [int(max(min(v, _INT_BOUND), -_INT_BOUND)) for v in a.reshape(-1)]

    def _op_attrs(self, node, at: dict, fold: bool = False) -> dict:
        op = node.op_type
        attrs = {"axis": 0, "axes": None, "perm": None, "keepdims": True, "starts": None, "ends": None, "steps": None,
                 "shape": None, "alpha": 1.0, "beta": 1.0, "to": "float32", "trans_a": False, "trans_b": False,
                 "mode": ""}
        if op in ("ArgMax", "ArgMin"):
            if at.get("select_last_index", 0):
                raise _Unsupported("select_last_index=1 (the first index of ties is computed)")
            attrs["keepdims"] = bool(at.get("keepdims", 1))
        if op in ("Concat", "Gather", "Flatten", "GatherElements", "ArgMax", "ArgMin"):
            attrs["axis"] = int(at.get("axis", 1 if op == "Flatten" else 0))
        if op in ("Softmax", "LogSoftmax"):
            attrs["axis"] = int(at.get("axis", -1))
        if op == "Transpose" and "perm" in at:
            attrs["perm"] = [int(v) for v in at["perm"]]
        if op in ("Reshape", "Expand") and len(node.input) > 1 and node.input[1] in self.sym:
            attrs["shape"], attrs["_ref"] = self._runtime_target(node, 1)
        elif op == "Reshape":
            attrs["shape"] = self._ints(node, 1, "target shape")
            if attrs["shape"] is None:
                raise _Unsupported("a Reshape without a shape")
            if at.get("allowzero", 0) and 0 in attrs["shape"]:
                raise _Unsupported("a Reshape to an empty axis (allowzero with 0)")
        if op in ("Unsqueeze", "Squeeze"):
            attrs["axes"] = self._ints(node, 1, "axes") if "axes" not in at else [int(v) for v in at["axes"]]
            if op == "Unsqueeze" and attrs["axes"] is None:
                raise _Unsupported("an Unsqueeze without axes")
        if op == "Expand" and "_ref" not in attrs:
            attrs["shape"] = self._ints(node, 1, "target shape")
            if attrs["shape"] is None or any(s < 0 for s in attrs["shape"]):
                raise _Unsupported("an Expand without a shape of sizes >= 0")
        if op == "Slice":
            attrs["starts"] = self._ints(node, 1, "starts")
            attrs["ends"] = self._ints(node, 2, "ends")
            attrs["axes"] = self._ints(node, 3, "axes")
            attrs["steps"] = self._ints(node, 4, "steps")
            if attrs["starts"] is None or attrs["ends"] is None:
                raise _Unsupported("a Slice without starts and ends")
            n = len(attrs["starts"])
            if len(attrs["ends"]) != n or (attrs["axes"] is not None and len(attrs["axes"]) != n) or \
                    (attrs["steps"] is not None and len(attrs["steps"]) != n):
                raise _Unsupported("starts, ends, axes and steps of different lengths")
            if attrs["steps"] is not None and 0 in attrs["steps"]:
                raise _Unsupported("a Slice step of 0")
        if op.startswith("Reduce"):
            axes = [int(v) for v in at["axes"]] if "axes" in at else self._ints(node, 1, "axes")
            if not axes:
                axes = [] if at.get("noop_with_empty_axes", 0) else None
            attrs["axes"] = axes
            attrs["keepdims"] = bool(at.get("keepdims", 1))
        if op == "Cast":
            to = int(at.get("to", 1))
            if to not in _TO:
                raise _Unsupported(f"a Cast to the element type {to}")
            attrs["to"] = _TO[to]
        if op == "Pad":
            pads = self._ints(node, 1, "pads")
            mode = at.get("mode", b"constant")
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            if mode not in ("constant", "reflect", "edge"):
                raise _Unsupported(f"mode {mode!r} (constant, reflect and edge are imported)")
            if pads is None or len(pads) % 2:
                raise _Unsupported("a Pad without an even number of pads")
            if any(p < 0 for p in pads):
                raise _Unsupported(f"negative pads {pads} (cropping)")
            n = len(pads) // 2
            attrs.update(starts=pads[:n], ends=pads[n:], mode=mode, axes=self._ints(node, 3, "axes"))
            if len(node.input) > 2 and node.input[2]:
                v = self.scalar(node.input[2]) if node.input[2] in self.consts else None
                if v is None:
                    raise _Unsupported("its constant_value is computed at run time or is not a scalar")
                attrs["alpha"] = v
        if op == "ScatterND":
            red = at.get("reduction", b"none")
            red = red.decode() if isinstance(red, bytes) else str(red)
            if red not in ("none", "add"):
                raise _Unsupported(f"reduction {red!r} (none and add are imported)")
            attrs["mode"] = "" if red == "none" else red
        if op == "CumSum":
            ax = self._ints(node, 1, "axis")
            if ax is None or len(ax) != 1:
                raise _Unsupported("its axis is not one constant")
            attrs.update(axis=ax[0], trans_a=bool(at.get("exclusive", 0)), trans_b=bool(at.get("reverse", 0)))
        if op == "Shrink":
            attrs.update(alpha=float(at.get("lambd", 0.5)), beta=float(at.get("bias", 0.0)))
        if op == "Einsum":
            from .primitive import parse_einsum  # noqa: PLC0415

            eq = at.get("equation", b"")
            eq = eq.decode() if isinstance(eq, bytes) else str(eq)
            try:
                parse_einsum(eq)
            except OpError as e:
                raise _Unsupported(str(e)) from None
            attrs["mode"] = eq.replace(" ", "")
        if op == "Tile":
            attrs["shape"] = self._ints(node, 1, "repeats")
            if attrs["shape"] is None:
                raise _Unsupported("a Tile without repeats")
        if op == "TopK":  # folded here (else one Op node an output, _op_TopK): k, the axis, which end
            k = self._ints(node, 1, "k")
            if k is None or len(k) != 1 or k[0] < 0:
                raise _Unsupported("a k that is not one constant >= 0")
            attrs.update(shape=k, axis=int(at.get("axis", -1)), mode="" if at.get("largest", 1) else "smallest_")
        if op == "Trilu":
            k = self._ints(node, 1, "k")
            attrs["axis"] = 0 if not k else k[0]
            attrs["mode"] = "upper" if at.get("upper", 1) else "lower"
        if op == "Gemm":
            attrs.update(alpha=float(at.get("alpha", 1.0)), beta=float(at.get("beta", 1.0)),
                         trans_a=bool(at.get("transA", 0)), trans_b=bool(at.get("transB", 0)))
        return attrs

    def _primitive(self, node, name: str) -> str:
        op = node.op_type
        at = _attrs(node)
        attrs = self._op_attrs(node, at)
        if op.startswith("Reduce") and attrs["axes"] == []:
            attrs["axes"] = None
            op_ = "Identity"
        else:
            op_ = op
        skip = self._attr_inputs(node)
        operands, inputs, consts = [], [], []
        for v in node.input:
            if v in skip:
                continue
            if not v:
                operands.append("")
            elif v in self.consts:
                operands.append(f"c{len(consts)}")
                consts.append(self.consts[v])
            else:
                operands.append(f"in{len(inputs)}")
                inputs.append(v)
        while operands and operands[-1] == "":
            operands.pop()
        ref = attrs.pop("_ref", None)
        if ref is not None:
            operands.append(f"in{len(inputs)}")
            inputs.append(ref)
        if len(consts) > 64:
            raise _Unsupported("more than 64 constant operands")
        config = {k: v for k, v in attrs.items() if v is not None and not (k == "mode" and v == "")}
        config.update(op=op_, inputs=len(inputs), operands=",".join(operands), constants=constants_text(consts))
        return self.add("Op", name, op, config, inputs, node.output[0],
                        {f"c{k}": a for k, a in enumerate(consts)})

    # ------------------------------------------------------------------ layers
    def _one_output(self, node):
        for o in list(node.output)[1:]:
            if o and (o in self._consumers or o in self.outputs):
                raise _Unsupported(f"its extra output {o!r} is used")

    def _padding(self, at: dict, n: int, kernel, strides, dilations):
        auto = at.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        if auto == "VALID":
            return "Valid"
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            if all(s == 1 for s in strides) and all(((k - 1) * d) % 2 == 0 for k, d in zip(kernel, dilations)):
                half = [((k - 1) * d) // 2 for k, d in zip(kernel, dilations)]
                return half + half
            raise _Unsupported(f"auto_pad {auto} with strides {list(strides)} (its padding depends on the input size)")
        pads = [int(p) for p in at.get("pads", [0] * (2 * n))]
        if len(pads) != 2 * n or any(p < 0 for p in pads):
            raise _Unsupported(f"pads {pads} (expected {2 * n} values >= 0)")
        return "Valid" if not any(pads) else pads

    def _op_Conv(self, node, name):
        self._one_output(node)
        at = _attrs(node)
        w = self.const(node.input[1], name, "weight")
        b = self.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if len(node.input) > 2 and node.input[2] and b is None:
            raise _Unsupported("its bias is computed at run time")
        n = w.ndim - 2
        if n not in (1, 2, 3):
            raise _Unsupported(f"a weight of dims {list(w.shape)} (expected a 1-, 2- or 3-d convolution)")
        groups = int(at.get("group", 1))
        kernel = [int(k) for k in w.shape[2:]]
        if "kernel_shape" in at and [int(k) for k in at["kernel_shape"]] != kernel:
            raise _Unsupported(f"kernel_shape {list(at['kernel_shape'])} differs from the weight's {kernel}")
        strides = [int(s) for s in at.get("strides", [1] * n)]
        dil = [int(d) for d in at.get("dilations", [1] * n)]
        if len(strides) != n or len(dil) != n or min(strides + dil) < 1:
            raise _Unsupported(f"strides {strides} / dilations {dil} (expected {n} values >= 1)")
        padding = self._padding(at, n, kernel, strides, dil)
        c_in, c_out = int(w.shape[1]) * groups, int(w.shape[0])
        if b is not None and b.shape != (c_out,):
            raise _Unsupported(f"a bias of dims {list(b.shape)} (expected [{c_out}])")
        if n == 1:
            cfg = {"channels_in": c_in, "channels_out": c_out, "kernel_size": kernel[0], "stride": strides[0],
                   "dilation": dil[0], "groups": groups, "padding": padding, "bias": b is not None}
        else:
            cfg = {"channels": [c_in, c_out], "kernel_size": kernel, "stride": strides, "dilation": dil,
                   "groups": groups, "padding": padding, "bias": b is not None}
        params = {"weight": w} if b is None else {"weight": w, "bias": b}
        return self.add(f"Conv{n}d", name, "Conv", cfg, [node.input[0]], node.output[0], params)

    def _op_ConvTranspose(self, node, name):
        at = _attrs(node)
        w = self.const(node.input[1], name, "weight")
        b = self.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        n = w.ndim - 2
        if n not in (1, 2, 3):
            raise _Unsupported(f"a weight of dims {list(w.shape)}")
        if "output_shape" in at:
            raise _Unsupported("output_shape (the padding would depend on the input size)")
        auto = at.get("auto_pad", b"NOTSET")
        if (auto.decode() if isinstance(auto, bytes) else auto) not in ("NOTSET", "VALID"):
            raise _Unsupported(f"auto_pad {auto}")
        groups = int(at.get("group", 1))
        kernel = [int(k) for k in w.shape[2:]]
        strides = [int(s) for s in at.get("strides", [1] * n)]
        dil = [int(d) for d in at.get("dilations", [1] * n)]
        pads = [int(p) for p in at.get("pads", [0] * (2 * n))]
        out_pad = [int(p) for p in at.get("output_padding", [0] * n)]
        if len(pads) != 2 * n or pads[:n] != pads[n:]:
            raise _Unsupported(f"asymmetric pads {pads}")
        cfg = {"channels": [int(w.shape[0]), int(w.shape[1]) * groups], "groups": groups, "bias": b is not None}
        if n == 1:
            cfg.update(kernel_size=kernel[0], stride=strides[0], dilation=dil[0], padding=pads[0],
                       padding_out=out_pad[0])
        else:
            cfg.update(kernel_size=kernel, stride=strides, dilation=dil, padding=pads[:n], padding_out=out_pad)
        params = {"weight": w} if b is None else {"weight": w, "bias": b}
        return self.add(f"ConvTranspose{n}d", name, "ConvTranspose", cfg, [node.input[0]], node.output[0], params)

    def _op_BatchNormalization(self, node, name):
        self._one_output(node)
        at = _attrs(node)
        if at.get("training_mode", 0):
            raise _Unsupported("training_mode=1 (batch statistics in the graph)")
        scale, bias, mean, var = (self.const(v, name, w) for v, w in
                                  zip(node.input[1:5], ("scale", "bias", "mean", "variance")))
        c = scale.shape[0] if scale.ndim == 1 else -1
        if any(a.shape != (c,) for a in (scale, bias, mean, var)):
            raise _Unsupported(f"scale / bias / mean / variance of dims {[list(a.shape) for a in (scale, bias, mean, var)]}"
                               f" (expected four [channels])")
        cfg = {"num_features": int(c), "epsilon": float(at.get("epsilon", 1e-5)),
               "momentum": float(1.0 - at.get("momentum", 0.9))}
        return self.add("BatchNorm", name, "BatchNormalization", cfg, [node.input[0]], node.output[0],
                        {"gamma": scale, "beta": bias, "running_mean": mean, "running_var": var})

    def _op_LayerNormalization(self, node, name):
        self._one_output(node)
        at = _attrs(node)
        dims = self.dims_of(node.input[0])
        axis = int(at.get("axis", -1))
        if axis != -1 and not (dims and axis == len(dims) - 1):
            raise _Unsupported(f"axis {axis} (Ember's LayerNorm normalizes the last axis)")
        scale = self.const(node.input[1], name, "scale")
        b = self.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale.ndim != 1 or (b is not None and b.shape != scale.shape):
            raise _Unsupported(f"scale / bias of dims {list(scale.shape)} / {None if b is None else list(b.shape)}")
        cfg = {"d_model": int(scale.shape[0]), "epsilon": float(at.get("epsilon", 1e-5)), "bias": b is not None}
        params = {"gamma": scale} if b is None else {"gamma": scale, "beta": b}
        return self.add("LayerNorm", name, "LayerNormalization", cfg, [node.input[0]], node.output[0], params)

    def _op_Gemm(self, node, name):
        at = _attrs(node)
        a, b = node.input[0], node.input[1]
        c = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if at.get("transA", 0) or b not in self.consts or a in self.consts or (c is not None and c not in self.consts):
            return None  # an Op Gemm
        w = self.consts[b]
        if w.ndim != 2 or w.dtype != np.float32:
            return None
        alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
        w = (w.T if at.get("transB", 0) else w) * np.float32(alpha)
        d_in, d_out = w.shape
        params = {"weight": np.ascontiguousarray(w, dtype=np.float32)}
        if c is not None:
            cv = self.consts[c]
            if cv.size == 1:
                cv = np.full((d_out,), float(cv.reshape(())), np.float32)
            elif cv.shape in ((d_out,), (1, d_out)):
                cv = cv.reshape(d_out)
            else:
                return None
            params["bias"] = (cv * np.float32(beta)).astype(np.float32)
        return self.add("Linear", name, "Gemm", {"d_input": int(d_in), "d_output": int(d_out), "bias": c is not None},
                        [a], node.output[0], params)

    def _op_MatMul(self, node, name):
        a, b = node.input[0], node.input[1]
        if b not in self.consts or a in self.consts:
            return None
        w = self.consts[b]
        if w.ndim != 2 or w.dtype != np.float32:
            return None
        d_in, d_out = w.shape
        out, params = node.output[0], {"weight": w}
        nxt = self.single(out)
        if nxt is not None and self.g.node[nxt].op_type == "Add" and nxt not in self.done and nxt not in self.fusions:
            add = self.g.node[nxt]
            bias = self._other(add, out)
            bv = self.consts.get(bias) if bias else None
            if bv is not None and bv.dtype == np.float32 and bv.shape in ((d_out,), (1, d_out)):
                params["bias"] = bv.reshape(d_out)
                self.done.add(nxt)
                out = add.output[0]
        made = self.add("Linear", name, "MatMul", {"d_input": int(d_in), "d_output": int(d_out),
                                                   "bias": "bias" in params}, [a], out, params)
        if "bias" in params:
            self.report.mapping[self.node_name(nxt, self.g.node[nxt])] = f"fused into {made} (Linear)"
            self.report.fused.append((made, "Linear", [name, self.node_name(nxt, self.g.node[nxt])]))
        return made

    def _op_Gather(self, node, name):
        data, idx = node.input[0], node.input[1]
        at = _attrs(node)
        if data in self.consts and idx not in self.consts and int(at.get("axis", 0)) == 0:
            table = self.consts[data]
            dims = self.dims_of(idx)
            if table.ndim == 2 and table.dtype == np.float32 and dims is not None and len(dims) == 2:
                return self.add("Embedding", name, "Gather", {"n_embedding": int(table.shape[0]),
                                                              "d_model": int(table.shape[1])}, [idx], node.output[0],
                                {"weight": table})
        return None

    def _pool_common(self, node, name, kind: str):
        self._one_output(node)
        at = _attrs(node)
        kernel = [int(k) for k in at.get("kernel_shape", [])]
        n = len(kernel)
        if n not in (1, 2):
            raise _Unsupported(f"a kernel of {n} dims (1 or 2 are imported)")
        strides = [int(s) for s in at.get("strides", [1] * n)]
        dil = [int(d) for d in at.get("dilations", [1] * n)]
        if len(strides) != n or len(dil) != n or min(kernel + strides + dil) < 1:
            raise _Unsupported(f"kernel {kernel}, strides {strides}, dilations {dil}")
        padding = self._padding(at, n, kernel, strides, dil)
        ceil = bool(at.get("ceil_mode", 0))
        return at, kernel, strides, dil, padding, ceil, n

    def _op_MaxPool(self, node, name):
        at, kernel, strides, dil, padding, ceil, n = self._pool_common(node, name, "MaxPool")
        if at.get("storage_order", 0):
            raise _Unsupported("storage_order 1")
        if n == 1:
            cfg = {"kernel_size": kernel[0], "stride": strides[0], "padding": padding, "dilation": dil[0],
                   "ceil_mode": ceil}
        else:
            cfg = {"kernel_size": kernel, "strides": strides, "padding": padding, "dilation": dil, "ceil_mode": ceil}
        return self.add(f"MaxPool{n}d", name, "MaxPool", cfg, [node.input[0]], node.output[0])

    def _op_AveragePool(self, node, name):
        at, kernel, strides, dil, padding, ceil, n = self._pool_common(node, name, "AveragePool")
        if any(d != 1 for d in dil):
            raise _Unsupported(f"dilations {dil}")
        inc = bool(at.get("count_include_pad", 0))
        if n == 1:
            cfg = {"kernel_size": kernel[0], "stride": strides[0], "padding": padding, "count_include_pad": inc,
                   "ceil_mode": ceil}
        else:
            cfg = {"kernel_size": kernel, "strides": strides, "padding": padding, "count_include_pad": inc,
                   "ceil_mode": ceil}
        return self.add(f"AvgPool{n}d", name, "AveragePool", cfg, [node.input[0]], node.output[0])

    def _op_GlobalAveragePool(self, node, name):
        dims = self.dims_of(node.input[0])
        if dims is None or len(dims) not in (3, 4):
            raise _Unsupported(f"an input of dims {dims} (expected rank 3 or 4)")
        if len(dims) == 4:
            return self.add("AdaptiveAvgPool2d", name, "GlobalAveragePool", {"output_size": [1, 1]},
                            [node.input[0]], node.output[0])
        return self.add("AdaptiveAvgPool1d", name, "GlobalAveragePool", {"output_size": 1}, [node.input[0]],
                        node.output[0])

    def _activation(self, node, name, kind, cfg=None):
        return self.add(kind, name, node.op_type, cfg or {}, [node.input[0]], node.output[0])

    def _op_Relu(self, node, name):
        return self._activation(node, name, "Relu")

    def _op_Sigmoid(self, node, name):
        return self._activation(node, name, "Sigmoid")

    def _op_Tanh(self, node, name):
        return self._activation(node, name, "Tanh")

    def _op_Softsign(self, node, name):
        return self._activation(node, name, "Softsign")

    def _op_HardSwish(self, node, name):
        return self._activation(node, name, "HardSwish")

    def _op_Mish(self, node, name):
        return self._activation(node, name, "Mish")

    def _op_Gelu(self, node, name):
        approx = _attrs(node).get("approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else approx
        if approx != "none":
            raise _Unsupported(f"approximate={approx!r} (the exact form is imported)")
        return self._activation(node, name, "Gelu")

    def _op_LeakyRelu(self, node, name):
        return self._activation(node, name, "LeakyRelu", {"negative_slope": float(_attrs(node).get("alpha", 0.01))})

    def _op_Elu(self, node, name):
        return self._activation(node, name, "Elu", {"alpha": float(_attrs(node).get("alpha", 1.0))})

    def _op_Celu(self, node, name):
        return self._activation(node, name, "Celu", {"alpha": float(_attrs(node).get("alpha", 1.0))})

    def _op_HardSigmoid(self, node, name):
        at = _attrs(node)
        return self._activation(node, name, "HardSigmoid", {"alpha": float(at.get("alpha", 0.2)),
                                                            "beta": float(at.get("beta", 0.5))})

    def _op_Softplus(self, node, name):
        return self._activation(node, name, "Softplus")

    def _op_Dropout(self, node, name):
        ratio = 0.5
        if len(node.input) > 1 and node.input[1]:
            r = self.scalar(node.input[1])
            if r is None:
                raise _Unsupported("its ratio is computed at run time")
            ratio = r
        if not 0.0 <= ratio < 1.0:
            raise _Unsupported(f"ratio {ratio} (expected 0 <= ratio < 1)")
        return self.add("Dropout", name, "Dropout", {"prob": float(ratio)}, [node.input[0]], node.output[0])

    def _op_Flatten(self, node, name):
        if int(_attrs(node).get("axis", 1)) != 1:
            return None
        dims = self.dims_of(node.input[0])
        if dims is None or len(dims) < 2:
            return None
        return self.add("Flatten", name, "Flatten", {"start_dim": 1, "end_dim": -1}, [node.input[0]], node.output[0])

    def _op_TopK(self, node, name):
        """TopK -> one Op node an output used (values, indices), k constant."""
        at = _attrs(node)
        k = self._ints(node, 1, "k")
        if k is None or len(k) != 1 or k[0] < 0:
            raise _Unsupported("a k that is not one constant >= 0")
        prefix = "" if at.get("largest", 1) else "smallest_"
        made = None
        for out, what in zip(node.output, ("values", "indices")):
            if out and (out in self._consumers or out in self.outputs):
                config = {"op": "TopK", "inputs": 1, "operands": "in0", "constants": "", "axis": int(at.get("axis", -1)),
                          "shape": [k[0]], "mode": prefix + what}
                made = self.add("Op", f"{name}_{what}", "TopK", config, [node.input[0]], out)
        return made

    def _op_Split(self, node, name):
        """Split -> one Slice Op node an output (the parts' sizes from `split` or `num_outputs`)."""
        x, at = node.input[0], _attrs(node)
        dims = self.dims_of(x)
        if dims is None:
            raise _Unsupported("its input's rank is not known")
        axis = int(at.get("axis", 0))
        k = axis + len(dims) if axis < 0 else axis
        if not 0 <= k < len(dims):
            raise _Unsupported(f"axis {axis} is out of range for dims {dims}")
        sizes = self._ints(node, 1, "split")
        if sizes is None:
            size = dims[k]
            n = int(at.get("num_outputs", len(node.output)))
            if not isinstance(size, int):
                raise _Unsupported(f"an even split of the named axis {size} (the parts' sizes are needed)")
            if n < 1 or n != len(node.output):
                raise _Unsupported(f"num_outputs {n} for {len(node.output)} outputs")
            part = -(-size // n)
            sizes = [min(part, max(size - part * j, 0)) for j in range(n)]
        if len(sizes) != len(node.output) or any(v < 0 for v in sizes):
            raise _Unsupported(f"split sizes {sizes} for {len(node.output)} outputs")
        if isinstance(dims[k], int) and sum(sizes) != dims[k]:
            raise _Unsupported(f"split sizes {sizes} do not add up to axis {k} of dims {dims}")
        made, start = None, 0
        for j, (out, size) in enumerate(zip(node.output, sizes)):
            if out and (out in self._consumers or out in self.outputs):
                config = {"op": "Slice", "inputs": 1, "operands": "in0", "constants": "", "starts": [start],
                          "ends": [start + size], "axes": [k], "steps": [1]}
                made = self.add("Op", f"{name}_{j}", "Split", config, [x], out)
            start += size
        return made

    def _op_Reshape(self, node, name):
        if len(node.input) > 1 and node.input[1] in self.sym:
            return None
        shape = self._ints(node, 1, "target shape")
        if shape is None or not shape or any(s == 0 or s < -1 for s in shape) or shape.count(-1) > 1:
            return None
        return self.add("Reshape", name, "Reshape", {"shape": shape}, [node.input[0]], node.output[0])

    def _op_Concat(self, node, name):
        ins = [v for v in node.input if v]
        if len(ins) < 2 or any(v in self.consts for v in ins):
            return None
        return self.add("Concat", name, "Concat", {"dim": int(_attrs(node).get("axis", 0)), "inputs": len(ins)},
                        ins, node.output[0])

    def _op_Add(self, node, name):
        a, b = node.input[0], node.input[1]
        if a in self.consts or b in self.consts:
            return None
        da, db = self.info.get(a), self.info.get(b)
        if not da or not db or da[1] is None or da[1] != db[1] or da[0] != db[0] or any(d is None for d in da[1]):
            return None
        return self.add("Add", name, "Add", {"inputs": 2}, [a, b], node.output[0])
