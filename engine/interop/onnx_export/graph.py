"""The ONNX graph the converters write into (nodes, initializers, value names) and their small helpers."""
from __future__ import annotations


import numpy as np

from engine.tensor import Tensor, raw
from engine.tensor.trace import Trace

from .tracing import OnnxExportError
from .dynamic_consts import dynamic_constant


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
    """What the converters write into: nodes, initializers, value names.

    `others` maps each symbolic dim (`batch`, `sequence`, `past_sequence`) to the same forward
    traced with that dim one larger; `symbols` maps it to (input index, axis) where the graph reads
    its run-time value. A size is then `c + sum(delta_k * dim_k)`, its deltas from the traces (a
    form `(size, deltas)`), and is computed in the graph when a delta is not 0."""

    def __init__(self, trace: Trace, other: Trace | None = None, others: dict | None = None,
                 symbols: dict | None = None, tables=None, windows=None, mask_input: int | None = None):
        self.onnx = onnx_module()
        self.h = self.onnx.helper
        self.trace = trace
        if others is None:
            others = {} if other is None else {"batch": other}
            symbols = {} if other is None else {"batch": (0, 0)}
        self.others: dict = dict(others)
        self.symbols: dict = dict(symbols or {})
        self.syms = list(self.others)
        self.base = {s: trace.tensors[trace.inputs[self.symbols[s][0]]].shape[self.symbols[s][1]] for s in self.syms}
        self.tables = list(tables or [])  # (cos, sin) rotary tables to slice by run-time positions
        self.windows = dict(windows or {})  # module path -> its sliding attention window
        self.mask_input = mask_input  # a language model's attention_mask input: positions read from it
        self.positions: str | None = None  # their graph value, once made (onnx_export.positions)
        self.reshaped: set = set()  # values whose run-time dims are not the traced ones (no value_info)
        self.nodes: list = []
        self.inits: list = []
        self.names: dict[int, str] = {}
        self.counts: dict[str, int] = {}
        self.consts = 0
        self._sym_values: dict = {}
        self.scope = ""
        self.op = None

    # forms: a size with how it grows with each symbolic dim
    def forms(self, tid: int) -> list:
        base = self.trace.tensors[tid].shape
        vs = [self.others[s].tensors[tid].shape for s in self.syms]
        return [(d, tuple(v[k] - d for v in vs)) for k, d in enumerate(base)]

    def form_of(self, values) -> tuple:
        """The form of a size given in the base trace and each variant (in `self.syms`' order)."""
        d = int(values[0])
        return d, tuple(int(v) - d for v in values[1:])

    def fixed(self, d: int) -> tuple:
        return int(d), (0,) * len(self.syms)

    def dynamic(self, tid: int) -> bool:
        return any(any(dl) for _, dl in self.forms(tid))

    def variant_op(self, o, k: int):
        return self.others[self.syms[k]].ops[o.index]

    def sym_value(self, s: str) -> str:
        return self.input_size(*self.symbols[s])

    def input_size(self, i: int, axis: int) -> str:
        """A 1-element int64 tensor: axis `axis` of input `i` at run time (one Shape and Slice each)."""
        v = self._sym_values.get((i, axis))
        if v is None:
            saved, self.scope = self.scope, ""
            v = self.node("Slice", [self.node("Shape", [self.name(self.trace.inputs[i])]), self.ints([axis]),
                                    self.ints([axis + 1])])
            self.scope = saved
            self._sym_values[(i, axis)] = v
        return v

    def dim_value(self, form) -> str:
        """A 1-element int64 tensor: the size of `form` at run time (an input's axis of that form read
        directly, as `past_sequence + sequence` is the attention mask's length, else computed)."""
        d, deltas = form
        if not any(deltas):
            return self.ints([d])
        axis = self._input_axis(form)
        if axis is not None:
            return axis
        c = d - sum(dl * self.base[s] for dl, s in zip(deltas, self.syms))
        v = None
        for dl, s in zip(deltas, self.syms):
            if not dl:
                continue
            term = self.sym_value(s) if dl == 1 else self.node("Mul", [self.sym_value(s), self.ints([dl])])
            v = term if v is None else self.node("Add", [v, term])
        return v if not c else self.node("Add", [v, self.ints([c])])

    def _input_axis(self, form):
        """The run-time size of the first input axis whose form is `form` (None when no input has one)."""
        for i, tid in enumerate(self.trace.inputs):
            for k, f in enumerate(self.forms(tid)):
                if f == form:
                    return self.input_size(i, k)
        return None

    def dim_name(self, form, fallback: str):
        d, deltas = form
        if not any(deltas):
            return d
        c = d - sum(dl * self.base[s] for dl, s in zip(deltas, self.syms))
        order = ("batch", "past_sequence", "sequence")  # the past before the new positions, as they are joined
        pairs = sorted(zip(deltas, self.syms), key=lambda p: order.index(p[1]) if p[1] in order else len(order))
        terms = [s if dl == 1 else f"{dl}*{s}" for dl, s in pairs if dl]
        if c:
            terms.append(str(c))
        return " + ".join(terms) if all(dl >= 0 for dl in deltas) else fallback

    def reshape_target(self, in_forms, out_forms) -> str:
        """A Reshape's target: constant where it can be (0 copies an input size that varies,
        -1 infers the one other such size), else computed from the symbolic dims."""
        target, infer = [], 0
        for k, f in enumerate(out_forms):
            if not any(f[1]):
                target.append(f[0])
            elif k < len(in_forms) and in_forms[k] == f:
                target.append(0)
            else:
                target.append(-1)
                infer += 1
        past = self.syms.index("past_sequence") if "past_sequence" in self.syms else None
        if infer > 1 or any(f[0] == 0 or (past is not None and f[1][past]) for f in out_forms):  # -1 fails on 0 sizes
            return self.shape_value(out_forms)
        return self.ints(target)

    def expand_target(self, in_forms, out_forms) -> str:
        """An Expand's target: 1 on the varying axes the input already has at full size."""
        lead = len(out_forms) - len(in_forms)
        target = []
        for k, f in enumerate(out_forms):
            j = k - lead
            if not any(f[1]):
                target.append(f[0])
            elif j >= 0 and in_forms[j] == f:
                target.append(1)
            else:
                return self.shape_value(out_forms)
        return self.ints(target)

    def shape_value(self, forms) -> str:
        """An int64 shape tensor of `forms`: constant where no size varies."""
        if not any(any(dl) for _, dl in forms):
            return self.ints([d for d, _ in forms])
        return self.node("Concat", [self.dim_value(f) for f in forms], axis=0)

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
                if t.source == "const" and self._varies(tid, value):
                    n = dynamic_constant(self, tid, value, n)
                else:
                    self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(value), n))
            self.names[tid] = n
        return n

    def variant_values(self, tid: int) -> list:
        return [host_array(self.others[s].values[tid]) for s in self.syms]

    def _varies(self, tid: int, value) -> bool:
        """A constant the forward made at another size or with other values in another trace."""
        for v in self.variant_values(tid):
            if v.shape != value.shape or not np.array_equal(v, value):
                return True
        return False

    def const(self, array, dtype=None) -> str:
        arr = np.asarray(array, dtype=dtype)
        self.consts += 1
        n = f"{self.scope}/const_{self.consts}" if self.scope else f"const_{self.consts}"
        held = np.ascontiguousarray(arr).reshape(arr.shape)  # a 0-d constant stays 0-d (CumSum's axis)
        self.inits.append(self.onnx.numpy_helper.from_array(held, n))
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
