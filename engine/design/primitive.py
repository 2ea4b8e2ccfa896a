"""The primitive-op node kind (`Op`): one ONNX-style tensor operation run through engine Tensor ops.

A design imported from ONNX maps nodes onto catalog layers where one exists (Conv, Gemm, norms,
pooling, activations); everything else the engine can compute becomes an `Op` node: its `op`
(`MatMul`, `Transpose`, `Gather`, `Slice`, `Where`, ...), its attributes as node fields (`axis`,
`axes`, `perm`, `starts` / `ends` / `steps`, `shape`, `keepdims`, `alpha`, `beta`, `to`,
`trans_a` / `trans_b`, `mode`: Pad's `constant` / `reflect` / `edge`, Trilu's `upper` / `lower`, Slice's `exact` (each sliced axis must
already be its end: a check);
Einsum's equation; Pad's pads before and after each axis are `starts` / `ends`, its constant value `alpha`; Tile's
repeats are `shape`; Trilu's diagonal is `axis`), and how its operands are fed: `operands` names each operand in order,
`inN` for the node's N-th input port, `cK` for its K-th constant, empty for an absent optional
operand (`"in0,c0,in1"` for `Where(cond, <constant>, y)`). A run-time target of `Expand` or
`Reshape` (one a dynamic batch computes through Shape, Gather, Concat) is held as `shape` with a
code for each run-time size: -2 - k is the size of axis k of the op's second operand, the
reference tensor (`shape=[-2, 1, 32]`, operands `"c0,in0"`: the constant expanded to the input's
batch). A Slice's run-time ends are held the same way in `shape` (one code an entry of `ends`; 0 keeps
that entry of `ends`), its second operand the reference; `Range` with one operand is 0, 1, ... up to the
size of axis `axis` of that operand (the sequence positions of a dynamic axis), of the dtype `to`;
`GatherND` reads the leading axes of its data at each row of its last index axis. The constants are held by the node's
module as parameters `c0`, `c1`, ... that never train (saved in the model's record like any
weight); `constants` gives their dtypes and shapes (`"float32[1,1,6,8];int64[]"`), so the node is
made lazily and its shape rule (`shape_rules.primitive_op_shape`, declared below) reads only shapes.

`run_op(op, attrs, operands)` is the one implementation of each op, used by the module's forward
and by the ONNX importer to fold constant subgraphs.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..module import Module, Param
from ..tensor import Tensor, cat
from ..tensor import ops_elementwise as _elementwise
from ..nn.spec import declare

__all__ = ["PrimitiveOp", "PRIMITIVE_OPS", "FOLD_ONLY_OPS", "PAD_MODES", "run_op", "parse_operands", "parse_constants",
           "constants_text", "OpError", "DTYPES"]

# the ops an Op node runs (ONNX names, ONNX semantics)
PRIMITIVE_OPS = (
    "Identity", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Neg", "Sqrt", "Reciprocal", "Exp", "Log", "Abs",
    "Erf", "Tanh", "Sigmoid", "Relu", "Sin", "Cos", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
    "And", "Or", "Not", "Xor", "IsNaN", "Where", "Cast", "MatMul", "Gemm", "Transpose", "Reshape", "Unsqueeze",
    "Squeeze", "Flatten", "Expand", "Concat", "Slice", "Gather", "Softmax", "LogSoftmax", "ReduceMean",
    "ReduceSum", "ReduceMax", "ReduceMin", "Shape", "Clip", "Pad", "Tile", "Trilu", "Sum", "Mean", "Einsum",
    "GatherElements", "ArgMax", "ArgMin", "PRelu", "Shrink", "ReduceLogSumExp",
    "ScatterND", "TopK", "CumSum", "GatherND", "Range",
)
TOPK_MODES = ("values", "indices", "smallest_values", "smallest_indices")
PAD_MODES = ("constant", "reflect", "edge")
# ops the importer evaluates on constants only (their output's shape is a run-time value)
FOLD_ONLY_OPS = ("Constant", "ConstantOfShape", "Range")
DTYPES = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")
_KIND = {"float32": "float", "float64": "float", "float16": "float", "int64": "int", "int32": "int", "int8": "int",
         "uint8": "int", "bool": "bool"}
MAX_CONSTANTS = 64


class OpError(ValueError):
    """An Op node's settings or operands that do not fit the op."""


_OPERAND = re.compile(r"^(in|c)(\d{1,4})$")
_CONST = re.compile(r"^(float32|float64|float16|int64|int32|int8|uint8|bool)\[((?:\d{1,12}(?:,\d{1,12})*)?)\]$")


def parse_operands(text: str) -> list:
    """`"in0,c0,"` -> [("in", 0), ("c", 0), None]; OpError names a token that is not one."""
    if not isinstance(text, str):
        raise OpError(f"operands: expected text such as 'in0,c0', got {text!r}")
    if text.strip() == "":
        return []
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if tok == "":
            out.append(None)
            continue
        m = _OPERAND.match(tok)
        if not m:
            raise OpError(f"operands: expected inN (an input port), cK (a constant) or nothing, got {tok!r} "
                          f"in {text!r}")
        out.append((m.group(1), int(m.group(2))))
    return out


def parse_constants(text: str) -> list:
    """`"float32[2,3];int64[]"` -> [("float32", (2, 3)), ("int64", ())]."""
    if not isinstance(text, str):
        raise OpError(f"constants: expected text such as 'float32[2,3]', got {text!r}")
    if text.strip() == "":
        return []
    out = []
    for tok in text.split(";"):
        m = _CONST.match(tok.strip())
        if not m:
            raise OpError(f"constants: expected dtype[dims] such as float32[2,3] (dtypes {', '.join(DTYPES)}), "
                          f"got {tok.strip()[:60]!r}")
        dims = tuple(int(d) for d in m.group(2).split(",")) if m.group(2) else ()
        out.append((m.group(1), dims))
    if len(out) > MAX_CONSTANTS:
        raise OpError(f"constants: at most {MAX_CONSTANTS} constants a node, got {len(out)}")
    return out


def constants_text(arrays) -> str:
    return ";".join(f"{np.asarray(a).dtype.name}[{','.join(str(d) for d in np.shape(a))}]" for a in arrays)


def _zeros_init(dtype: str, dims: tuple):
    def init(device, require_grad):
        return Tensor.from_data(np.zeros(dims, dtype=dtype), device)
    return init


def check_op_settings(op: str, mode, starts, ends) -> None:
    """The settings some ops need: Pad's `mode` and pads (`starts` before, `ends` after each axis), Trilu's
    `mode` (`upper` or `lower`)."""
    mode = mode or ""
    if op == "Pad":
        if mode not in ("",) + PAD_MODES:
            raise OpError(f"mode: expected one of {', '.join(PAD_MODES)} for Pad, got {mode!r}")
        if starts is None or ends is None or len(starts) != len(ends) or any(int(v) < 0 for v in list(starts) + list(ends)):
            raise OpError(f"Pad: expected pads before (starts) and after (ends) each axis, of one length and >= 0, "
                          f"got starts {starts} and ends {ends}")
    if op == "Einsum":
        parse_einsum(mode)
    if op == "TopK" and mode not in ("",) + TOPK_MODES:
        raise OpError(f"mode: expected one of {', '.join(TOPK_MODES)} for TopK, got {mode!r}")
    if op == "ScatterND" and mode not in ("", "none", "add"):
        raise OpError(f"mode: expected 'none' or 'add' for ScatterND, got {mode!r}")
    if op == "Slice" and mode not in ("", "exact"):
        raise OpError(f"mode: expected 'exact' or none for Slice, got {mode!r}")
    if op == "Trilu" and mode not in ("", "upper", "lower"):
        raise OpError(f"mode: expected 'upper' or 'lower' for Trilu, got {mode!r}")


class PrimitiveOp(Module):
    """One tensor operation with its attributes and constants (see this file's docstring)."""

    def __init__(self, op: str = "Identity", inputs: int = 1, operands: str = "in0", constants: str = "",
                 axis: int = 0, axes=None, perm=None, keepdims: bool = True, starts=None, ends=None, steps=None,
                 shape=None, alpha: float = 1.0, beta: float = 1.0, to: str = "float32", trans_a: bool = False,
                 trans_b: bool = False, mode: str = "", device=None):
        if op not in PRIMITIVE_OPS:
            raise OpError(f"op: expected one of {', '.join(PRIMITIVE_OPS)}, got {op!r}")
        specs = parse_constants(constants)
        toks = parse_operands(operands)
        for t in toks:
            if t is not None and t[0] == "in" and t[1] >= inputs:
                raise OpError(f"operands: in{t[1]} names an input port, but the node has {inputs} (in0..in"
                              f"{inputs - 1})")
            if t is not None and t[0] == "c" and t[1] >= len(specs):
                raise OpError(f"operands: c{t[1]} names a constant, but the node holds {len(specs)}")
        if to not in DTYPES:
            raise OpError(f"to: expected one of {', '.join(DTYPES)}, got {to!r}")
        check_op_settings(op, mode, starts, ends)
        self.op = op
        self.inputs = int(inputs)
        self.operands = operands
        self.constants = constants
        self.attrs = {"axis": axis, "axes": None if axes is None else list(axes),
                      "perm": None if perm is None else list(perm), "keepdims": bool(keepdims),
                      "starts": None if starts is None else list(starts), "ends": None if ends is None else list(ends),
                      "steps": None if steps is None else list(steps), "shape": None if shape is None else list(shape),
                      "alpha": float(alpha), "beta": float(beta), "to": to, "trans_a": bool(trans_a),
                      "trans_b": bool(trans_b), "mode": str(mode or "")}
        for i, (dtype, dims) in enumerate(specs):
            setattr(self, f"c{i}", Param.uninitialized(_zeros_init(dtype, dims), device, require_grad=False,
                                                       shape=dims, kind=_KIND[dtype]))

    def constant_specs(self) -> list:
        return parse_constants(self.constants)

    def forward(self, *xs):
        ops = []
        for t in parse_operands(self.operands):
            if t is None:
                ops.append(None)
            elif t[0] == "in":
                ops.append(xs[t[1]])
            else:
                ops.append(getattr(self, f"c{t[1]}").val())
        return run_op(self.op, self.attrs, ops)


# ---------------------------------------------------------------------------------- the ops
def _wrap_np(arr, like: Tensor) -> Tensor:
    return Tensor.from_data(np.asarray(arr), like.device)


def _axis_of(axis: int, rank: int, op: str) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise OpError(f"{op}: axis {axis} is out of range for a tensor of rank {rank}")
    return a


def broadcast_shapes(a: tuple, b: tuple, op: str) -> tuple:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise OpError(f"{op}: dims {list(a)} and {list(b)} do not broadcast")
    return tuple(out)


def _reshape_target(shape: list, src: tuple, op: str = "Reshape") -> tuple:
    out = [src[i] if s == 0 and i < len(src) else s for i, s in enumerate(shape)]
    return tuple(out)


def resolve_shape(shape: list, ref_shape) -> list:
    """`shape` with each code -2 - k replaced by axis k of the reference (`ref_shape`; None: no reference)."""
    out = []
    for s in shape:
        if s <= -2:
            k = -s - 2
            if ref_shape is None or k >= len(ref_shape):
                raise OpError(f"shape {list(shape)}: the code {s} names axis {k} of the reference operand, which "
                              f"{'is absent' if ref_shape is None else f'has rank {len(ref_shape)}'}")
            out.append(ref_shape[k])
        else:
            out.append(s)
    return out


def _int_div(a: Tensor, b: Tensor) -> Tensor:
    x, y = a.numpy(), b.numpy()
    return _wrap_np(np.trunc(x / y).astype(np.result_type(x, y)), a)


_BINARY = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Pow": lambda a, b: a ** b,
    "Max": lambda a, b: a.maximum(b), "Min": lambda a, b: a.minimum(b),
    "Equal": lambda a, b: a.equal(b), "Less": lambda a, b: a.lower(b), "LessOrEqual": lambda a, b: a.lower_equal(b),
    "Greater": lambda a, b: a.greater(b), "GreaterOrEqual": lambda a, b: a.greater_equal(b),
    "And": lambda a, b: a.bool_and(b), "Or": lambda a, b: a.bool_or(b),
    "Xor": lambda a, b: a.not_equal(b),
}
_UNARY = {
    "Identity": lambda x: x, "Neg": lambda x: -x, "Sqrt": lambda x: x.sqrt(), "Reciprocal": lambda x: x.recip(),
    "Exp": lambda x: x.exp(), "Log": lambda x: x.log(), "Abs": lambda x: x.abs(), "Erf": lambda x: x.erf(),
    "Tanh": lambda x: x.tanh(), "Sigmoid": lambda x: x.sigmoid(), "Relu": lambda x: x.relu(),
    "Sin": lambda x: x.sin(), "Cos": lambda x: x.cos(), "IsNaN": lambda x: x.is_nan(), "Not": lambda x: x.bool_not(),
}


def _same_dtype(a: Tensor, b: Tensor, op: str):
    if a.dtype != b.dtype:
        raise OpError(f"{op}: expected operands of one dtype, got {a.dtype} and {b.dtype}")


def run_op(op: str, attrs: dict, ops: list) -> Tensor:
    """The result of one op on engine tensors (ONNX semantics; see PRIMITIVE_OPS)."""
    x = ops[0] if ops else None
    if op in _UNARY:
        return _UNARY[op](x)
    if op in ("Max", "Min") and len([t for t in ops if t is not None]) != 2:
        parts = [t for t in ops if t is not None]
        y = parts[0]
        for t in parts[1:]:
            _same_dtype(y, t, op)
            y = _BINARY[op](y, t)
        return y
    if op in _BINARY:
        a, b = ops[0], ops[1]
        if op != "Pow":
            _same_dtype(a, b, op)
        return _BINARY[op](a, b)
    if op == "Div":
        a, b = ops
        _same_dtype(a, b, op)
        if a.kind == "int":
            return _int_div(a, b)
        return a / b
    if op == "Where":
        c, a, b = ops
        return _elementwise.where(c, a, b)
    if op == "Cast":
        return x.cast(attrs["to"])
    if op == "MatMul":
        a, b = ops
        if a.rank == 1 and b.rank == 1:
            return (a.unsqueeze(0).matmul(b.unsqueeze(1))).reshape(())
        if a.rank == 1:
            return a.unsqueeze(0).matmul(b).squeeze(-2)
        if b.rank == 1:
            return a.matmul(b.unsqueeze(1)).squeeze(-1)
        return a.matmul(b)
    if op == "Gemm":
        a, b = ops[0], ops[1]
        c = ops[2] if len(ops) > 2 else None
        if attrs["trans_a"]:
            a = a.transpose()
        if attrs["trans_b"]:
            b = b.transpose()
        y = a.matmul(b)
        if attrs["alpha"] != 1.0:
            y = y * attrs["alpha"]
        if c is not None:
            y = y + (c * attrs["beta"] if attrs["beta"] != 1.0 else c)
        return y
    if op == "Transpose":
        perm = attrs["perm"] if attrs["perm"] is not None else list(range(x.rank))[::-1]
        return x.permute(perm)
    if op == "Reshape":
        shape = resolve_shape(attrs["shape"], tuple(ops[1].shape) if len(ops) > 1 and ops[1] is not None else None)
        return x.reshape(_reshape_target(shape, tuple(x.shape)))
    if op == "Unsqueeze":
        rank = x.rank + len(attrs["axes"])
        axes = sorted(_axis_of(a, rank, op) for a in attrs["axes"])
        for a in axes:
            x = x.unsqueeze(a)
        return x
    if op == "Squeeze":
        axes = attrs["axes"]
        if axes is None:
            axes = [i for i, s in enumerate(x.shape) if s == 1]
        axes = sorted((_axis_of(a, x.rank, op) for a in axes), reverse=True)
        for a in axes:
            x = x.squeeze(a)
        return x
    if op == "Flatten":
        a = _axis_of(attrs["axis"], x.rank + 1, op)
        lead = int(np.prod(x.shape[:a], dtype=np.int64))
        return x.reshape((lead, -1 if lead else 0))
    if op == "Expand":
        shape = resolve_shape(attrs["shape"], tuple(ops[1].shape) if len(ops) > 1 and ops[1] is not None else None)
        target = broadcast_shapes(tuple(x.shape), tuple(shape), op)
        while x.rank < len(target):
            x = x.unsqueeze(0)
        return x if tuple(x.shape) == target else x.expand(target)
    if op == "Concat":
        parts = [t for t in ops if t is not None]
        return cat(parts, _axis_of(attrs["axis"], parts[0].rank, op))
    if op == "Slice":
        if attrs.get("shape") and len(ops) > 1 and ops[1] is not None:
            attrs = dict(attrs, ends=slice_ends(attrs, tuple(ops[1].shape)))
        if attrs.get("mode") == "exact":  # a check that each sliced axis already has its run-time end as size
            _check_exact_slice(x.shape, attrs)
        return x[slice_key(x.shape, attrs)]
    if op == "Range":  # the run-time form (the constant one is folded: `fold`)
        n = _axis_of(attrs["axis"], x.rank, op)
        return Tensor.from_data(np.arange(x.shape[n]).astype(attrs["to"]), x.device)
    if op == "GatherND":
        return _gather_nd(x, ops[1])
    if op == "Gather":
        idx = ops[1]
        a = _axis_of(attrs["axis"], x.rank, op)
        n = x.shape[a]
        flat = np.asarray(idx.numpy(), dtype=np.int64).reshape(-1)
        if flat.size and (flat.min() < -n or flat.max() >= n):
            raise OpError(f"Gather: index out of range for axis {a} of size {n}")
        flat = np.where(flat < 0, flat + n, flat)
        out = x.select(a, Tensor.from_data(flat, x.device))
        return out.reshape(tuple(x.shape[:a]) + tuple(idx.shape) + tuple(x.shape[a + 1:]))
    if op == "Softmax":
        return x.softmax(_axis_of(attrs["axis"], x.rank, op))
    if op == "LogSoftmax":
        return x.log_softmax(_axis_of(attrs["axis"], x.rank, op))
    if op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        axes = attrs["axes"]
        axes = list(range(x.rank)) if axes is None else sorted({_axis_of(a, x.rank, op) for a in axes})
        fn = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}[op]
        for a in sorted(axes, reverse=True):
            x = getattr(x, fn)(a, keepdim=True)
        if not attrs["keepdims"]:
            for a in sorted(axes, reverse=True):
                x = x.squeeze(a)
        return x
    if op == "Shape":
        return Tensor.from_data(np.asarray(x.shape, dtype=np.int64), x.device)
    if op == "Clip":
        lo = ops[1] if len(ops) > 1 else None
        hi = ops[2] if len(ops) > 2 else None
        if lo is not None:
            x = x.maximum(lo.cast(x.dtype) if lo.dtype != x.dtype else lo)
        if hi is not None:
            x = x.minimum(hi.cast(x.dtype) if hi.dtype != x.dtype else hi)
        return x
    if op in ("Sum", "Mean"):
        parts = [t for t in ops if t is not None]
        y = parts[0]
        for t in parts[1:]:
            _same_dtype(y, t, op)
            y = y + t
        return y / float(len(parts)) if op == "Mean" else y
    if op == "Pad":
        return _pad(x, attrs)
    if op == "GatherElements":
        idx = ops[1]
        a = _axis_of(attrs["axis"], x.rank, op)
        if idx.rank != x.rank:
            raise OpError(f"GatherElements: indices of dims {list(idx.shape)} for data of dims {list(x.shape)} "
                          f"(expected the same rank)")
        n = x.shape[a]
        raw = np.asarray(idx.numpy(), dtype=np.int64)
        if raw.size and (raw.min() < -n or raw.max() >= n):
            raise OpError(f"GatherElements: index out of range for axis {a} of size {n}")
        return x.gather(a, Tensor.from_data(np.where(raw < 0, raw + n, raw), x.device))
    if op == "TopK":
        return _top_k(x, attrs)
    if op == "CumSum":  # along `axis`: a product with a triangle of ones (exclusive: trans_a, reverse: trans_b)
        if x.kind != "float":
            raise OpError(f"CumSum: expected a float tensor, got {x.dtype}")
        a = _axis_of(attrs["axis"], x.rank, op)
        n = x.shape[a]
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        keep = (i > j if attrs["trans_a"] else i >= j) if attrs["trans_b"] else (i < j if attrs["trans_a"] else i <= j)
        tri = Tensor.from_data(keep.astype(np.float32), x.device)
        tri = tri if tri.dtype == x.dtype else tri.cast(x.dtype)
        perm = [d for d in range(x.rank) if d != a] + [a]
        back = [perm.index(d) for d in range(x.rank)]
        return x.permute(perm).matmul(tri).permute(back)
    if op == "ScatterND":
        return _scatter_nd(x, ops[1], ops[2], attrs.get("mode") or "none")
    if op == "PRelu":
        slope = ops[1]
        _same_dtype(x, slope, op)
        return _elementwise.where(x.lower(0.0), x * slope, x)
    if op == "Shrink":  # lambd: alpha, bias: beta
        lam, bias = float(attrs["alpha"]), float(attrs["beta"])
        return _elementwise.where(x.greater(lam), x - bias, _elementwise.where(x.lower(-lam), x + bias, x * 0.0))
    if op == "ReduceLogSumExp":
        axes = attrs["axes"]
        axes = list(range(x.rank)) if axes is None else sorted({_axis_of(a, x.rank, op) for a in axes})
        for a in sorted(axes, reverse=True):
            x = x.logsumexp(a, keepdim=True)
        if not attrs["keepdims"]:
            for a in sorted(axes, reverse=True):
                x = x.squeeze(a)
        return x
    if op in ("ArgMax", "ArgMin"):
        a = _axis_of(attrs["axis"], x.rank, op)
        y = (x.argmax if op == "ArgMax" else x.argmin)(a, keepdim=True)
        return y if attrs["keepdims"] else y.squeeze(a)
    if op == "Einsum":
        return _einsum(attrs.get("mode", ""), [t for t in ops if t is not None])
    if op == "Tile":
        reps = attrs["shape"] or []
        if len(reps) != x.rank or any(r < 0 for r in reps):
            raise OpError(f"Tile: expected {x.rank} repeats >= 0 for dims {list(x.shape)}, got {reps}")
        return x.repeat(list(reps))
    if op == "Trilu":
        k = int(attrs["axis"])
        if x.rank < 2:
            raise OpError(f"Trilu: expected a tensor of rank >= 2, got dims {list(x.shape)}")
        return x.triu(k) if attrs.get("mode") == "upper" else x.tril(k)
    raise OpError(f"the engine has no implementation of the op {op!r}")


_EINSUM = re.compile(r"^([a-zA-Z]*)(?:,([a-zA-Z]*))?->([a-zA-Z]*)$")


def parse_einsum(equation) -> tuple:
    """`"bij,bjk->bik"` -> (["bij", "bjk"], "bik"): one or two operands, an explicit output, each letter at most
    once an operand (no ellipsis, no diagonals), every output letter from an operand."""
    eq = str(equation or "").replace(" ", "")
    m = _EINSUM.match(eq)
    if not m:
        raise OpError(f"Einsum: expected an equation such as 'bij,bjk->bik' (one or two operands of letters, an "
                      f"explicit '->' output, no '...'), got {str(equation)[:80]!r}")
    ins = [m.group(1)] + ([m.group(2)] if m.group(2) is not None else [])
    out = m.group(3)
    for t in ins + [out]:
        if len(set(t)) != len(t):
            raise OpError(f"Einsum: the letter(s) of {t!r} repeat (diagonals are not computed) in {eq!r}")
    if set(out) - set("".join(ins)):
        raise OpError(f"Einsum: output letters {''.join(sorted(set(out) - set(''.join(ins))))} of {eq!r} are in no "
                      f"operand")
    return ins, out


def einsum_sizes(terms, shapes, equation) -> dict:
    """{letter: size} of the operands (sizes compared with ==; 1 broadcasts against a size)."""
    sizes: dict = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            raise OpError(f"Einsum: operand {term!r} of {equation!r} has {len(term)} letters but {len(shape)} axes")
        for c, d in zip(term, shape):
            if c not in sizes or sizes[c] == 1:
                sizes[c] = d
            elif d != 1 and d != sizes[c]:
                raise OpError(f"Einsum: the letter {c!r} of {equation!r} has sizes {sizes[c]} and {d}")
    return sizes


def _einsum(equation: str, xs: list) -> Tensor:
    terms, out = parse_einsum(equation)
    sizes = einsum_sizes(terms, [tuple(x.shape) for x in xs], equation)
    ops = []
    for k, (term, x) in enumerate(zip(terms, xs)):  # letters only this operand has and the output lacks: summed
        others = "".join(t for j, t in enumerate(terms) if j != k) + out
        gone = [i for i, c in enumerate(term) if c not in others]
        for i in sorted(gone, reverse=True):
            x = x.sum(i, keepdim=True).squeeze(i)
        ops.append((x, "".join(c for c in term if c in others)))
    if len(ops) == 1:
        x, term = ops[0]
        return x.permute([term.index(c) for c in out]) if term != out else x
    (a, ta), (b, tb) = ops
    batch = [c for c in out if c in ta and c in tb]
    contr = [c for c in ta if c in tb and c not in out]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    a = a.permute([ta.index(c) for c in batch + fa + contr])
    b = b.permute([tb.index(c) for c in batch + contr + fb])
    bs = [a.shape[i] if a.shape[i] != 1 else b.shape[i] for i in range(len(batch))]
    size = {c: sizes[c] for c in sizes}
    na, nb, nc = (int(np.prod([size[c] for c in g], dtype=np.int64)) for g in (fa, fb, contr))
    a = a.reshape(tuple(a.shape[:len(batch)]) + (na, nc))
    b = b.reshape(tuple(b.shape[:len(batch)]) + (nc, nb))
    y = a.matmul(b).reshape(tuple(bs) + tuple(size[c] for c in fa) + tuple(size[c] for c in fb))
    have = batch + fa + fb
    return y.permute([have.index(c) for c in out]) if have != list(out) else y


def _top_k(x: Tensor, attrs) -> Tensor:
    """One output of ONNX TopK (sorted; ties: the lower index first): `mode` values / indices, smallest_... for
    largest=0; k is `shape[0]`, the axis `axis`."""
    mode = attrs.get("mode") or "values"
    a = _axis_of(attrs["axis"], x.rank, "TopK")
    k = int((attrs["shape"] or [0])[0])
    if not 0 <= k <= x.shape[a]:
        raise OpError(f"TopK: k {k} for axis {a} of size {x.shape[a]}")
    raw = x.numpy()
    order = np.argsort(raw if mode.startswith("smallest") else -raw, axis=a, kind="stable")
    idx = np.take(order, np.arange(k), axis=a).astype(np.int64)
    it = Tensor.from_data(idx, x.device)
    return it if mode.endswith("indices") else x.gather(a, it)


def _scatter_nd(data: Tensor, indices: Tensor, updates: Tensor, reduction: str) -> Tensor:
    """ONNX ScatterND (`reduction` none or add): the rows that `indices` names (its last axis indexes the
    leading q axes of `data`) replaced by (or added to) `updates`."""
    idx = np.asarray(indices.numpy(), dtype=np.int64)
    shape = tuple(data.shape)
    q = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= q <= len(shape):
        raise OpError(f"ScatterND: indices of dims {list(idx.shape)} for data of dims {list(shape)} (expected a last "
                      f"axis of 1 to {len(shape)})")
    want = tuple(idx.shape[:-1]) + shape[q:]
    if tuple(updates.shape) != want:
        raise OpError(f"ScatterND: updates of dims {list(updates.shape)}, expected {list(want)}")
    lead = shape[:q]
    flat = idx.reshape(-1, q)
    for k, n in enumerate(lead):
        col = flat[:, k]
        if col.size and (col.min() < -n or col.max() >= n):
            raise OpError(f"ScatterND: index out of range for axis {k} of size {n}")
        flat[:, k] = np.where(col < 0, col + n, col)
    rows = np.ravel_multi_index(tuple(flat.T), lead) if flat.size else np.zeros((0,), np.int64)
    p = int(np.prod(lead, dtype=np.int64))
    rest = shape[q:]
    d2 = data.reshape((p,) + rest)
    u2 = updates.reshape((len(rows),) + rest)
    r = Tensor.from_data(rows.astype(np.int64), data.device)
    if reduction == "add":
        return d2.select_assign(0, r, u2).reshape(shape)
    if len(np.unique(rows)) != len(rows):
        raise OpError("ScatterND: indices repeat a row (reduction none needs each row once)")
    mask = np.zeros((p,) + (1,) * len(rest), dtype=bool)
    mask[rows] = True
    placed = d2.zeros_like().select_assign(0, r, u2)
    return _elementwise.where(Tensor.from_data(mask, data.device), placed, d2).reshape(shape)


def _gather_nd(data: Tensor, indices: Tensor) -> Tensor:
    """ONNX GatherND (batch_dims 0): the slices of `data` at the leading axes each row of `indices` names."""
    idx = np.asarray(indices.numpy(), dtype=np.int64)
    shape = tuple(data.shape)
    q = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= q <= len(shape):
        raise OpError(f"GatherND: indices of dims {list(idx.shape)} for data of dims {list(shape)} (expected a last "
                      f"axis of 1 to {len(shape)})")
    flat = idx.reshape(-1, q).copy()
    for k, n in enumerate(shape[:q]):
        col = flat[:, k]
        if col.size and (col.min() < -n or col.max() >= n):
            raise OpError(f"GatherND: index out of range for axis {k} of size {n}")
        flat[:, k] = np.where(col < 0, col + n, col)
    rows = np.ravel_multi_index(tuple(flat.T), shape[:q]) if flat.size else np.zeros((0,), np.int64)
    p = int(np.prod(shape[:q], dtype=np.int64))
    out = data.reshape((p,) + shape[q:]).select(0, Tensor.from_data(rows.astype(np.int64), data.device))
    return out.reshape(tuple(idx.shape[:-1]) + shape[q:])


def slice_ends(attrs, ref_shape) -> list:
    """A Slice's `ends` with each run-time entry (code -2 - k in `shape`) replaced by axis k of the reference."""
    codes = list(attrs["shape"]) + [0] * len(attrs["ends"])
    return [e if c == 0 else resolve_shape([c], ref_shape)[0] for e, c in zip(attrs["ends"], codes)]


def _check_exact_slice(shape, attrs) -> None:
    axes = attrs["axes"] if attrs["axes"] is not None else list(range(len(attrs["ends"])))
    for a, e in zip(axes, attrs["ends"]):
        k = _axis_of(a, len(shape), "Slice")
        if shape[k] != e:
            raise OpError(f"Slice (exact): axis {k} of dims {list(shape)} must be {e}, found {shape[k]}")


def pad_widths(rank: int, attrs) -> list:
    """[(before, after)] for each axis of a Pad (`starts`/`ends` for the listed `axes`, all axes when none)."""
    starts, ends = list(attrs["starts"] or []), list(attrs["ends"] or [])
    axes = attrs["axes"] if attrs["axes"] is not None else list(range(len(starts)))
    if len(axes) != len(starts) or len(starts) != len(ends):
        raise OpError(f"Pad: {len(starts)} pads before, {len(ends)} after and {len(axes)} axes (expected one length)")
    widths = [(0, 0)] * rank
    for a, b, e in zip(axes, starts, ends):
        widths[_axis_of(a, rank, "Pad")] = (int(b), int(e))
    return widths


def _pad(x: Tensor, attrs) -> Tensor:
    widths = pad_widths(x.rank, attrs)
    mode = attrs.get("mode") or "constant"
    flat = []
    for b, e in reversed(widths):  # the engine's pad: pairs from the last axis back
        flat += [b, e]
    while flat[-2:] == [0, 0] and len(flat) > 2:
        flat = flat[:-2]
    if mode == "reflect":
        for k, (b, e) in enumerate(widths):
            if max(b, e) >= x.shape[k] and (b or e):
                raise OpError(f"Pad: reflect pads {b}, {e} must be smaller than axis {k} of dims {list(x.shape)}")
    return x.pad(flat, mode={"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode],
                 value=float(attrs["alpha"]) if mode == "constant" else 0.0)


def slice_key(shape, attrs) -> tuple:
    rank = len(shape)
    starts, ends = attrs["starts"], attrs["ends"]
    axes = attrs["axes"] if attrs["axes"] is not None else list(range(len(starts)))
    steps = attrs["steps"] if attrs["steps"] is not None else [1] * len(starts)
    key = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise OpError("Slice: a step of 0")
        key[_axis_of(a, rank, "Slice")] = slice(int(s), int(e), int(st))
    return tuple(key)


def slice_length(size: int, start: int, end: int, step: int) -> int:
    return len(range(*slice(start, end, step).indices(size)))


def fold(op: str, attrs: dict, arrays: list) -> np.ndarray:
    """`run_op` on NumPy constants (the importer's constant folding), and the fold-only ops."""
    if op == "ConstantOfShape":
        shape = [int(v) for v in np.asarray(arrays[0]).reshape(-1)]
        value = attrs.get("value")
        value = np.zeros((1,), np.float32) if value is None else np.asarray(value).reshape(-1)
        return np.full(shape, value[0], dtype=value.dtype)
    if op == "Range":
        start, limit, delta = (np.asarray(a).reshape(()) for a in arrays)
        if delta == 0:
            raise OpError("Range: a delta of 0")
        n = max(int(math.ceil((limit - start) / delta)), 0)
        return (start + np.arange(n, dtype=np.result_type(start, limit, delta)) * delta).astype(start.dtype)
    ts = [None if a is None else Tensor.from_data(np.asarray(a)) for a in arrays]
    return np.asarray(run_op(op, attrs, ts).numpy())


def _shape(m, ins, ctx):  # the Op node's rule, one per op (shape_rules.py)
    from .shape_rules import primitive_op_shape  # noqa: PLC0415 - shape_rules reads this module's op tables

    return primitive_op_shape(m, ins, ctx)


declare(PrimitiveOp, shape=_shape)
