"""The ONNX graph the converters write into (nodes, initializers, value names) and their small helpers."""
from __future__ import annotations


import numpy as np

from engine.tensor import Tensor, raw
from engine.tensor.trace import Trace

from .tracing import OnnxExportError


# ---- ONNX ------------------------------------------------------------------------------------------
def onnx_module():
    try:
        import onnx  # noqa: PLC0415
        from onnx import helper, numpy_helper  # noqa: PLC0415,F401
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise OnnxExportError("export_onnx needs the onnx package (pip install onnx)") from None
    return onnx


_NP_OF = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
          "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def host_array(t: Tensor) -> np.ndarray:
    """The values of `t` as a NumPy array: the array itself on the CPU (no copy), a copy from a GPU."""
    arr = raw.array(t)
    return arr if isinstance(arr, np.ndarray) else t.numpy()


def np_dtype(name: str):
    return np.dtype(_NP_OF.get(name, np.float32))


class Graph:
    """What the converters write into: nodes, initializers, value names."""

    def __init__(self, trace: Trace, other: Trace | None = None):
        self.onnx = onnx_module()
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
                value = host_array(self.trace.values[tid])
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
        return self.const(np.asarray(value, dtype=np_dtype(self.trace.tensors[like_tid].dtype)))

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


def axes_of(dim, rank: int) -> list[int]:
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return [int(d) % rank for d in dims]


def shape_arg(v) -> tuple:
    if len(v) == 1 and isinstance(v[0], (list, tuple)):
        v = v[0]
    return tuple(int(d) for d in v)


def pad_pairs(padding, n: int):
    if isinstance(padding, int):
        return [(padding, padding)] * n
    out = []
    for p in padding:
        out.append((int(p), int(p)) if isinstance(p, (int, np.integer)) else (int(p[0]), int(p[1])))
    return out


def tuple_of(v, n: int):
    return [int(v)] * n if isinstance(v, (int, np.integer)) else [int(x) for x in v]
