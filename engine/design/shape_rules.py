"""The shape rule of the primitive `Op` node (`primitive.PrimitiveOp`): each ONNX-style op's output dims.

A layer of `engine.nn` declares its own rule next to its class (`engine.nn.spec`); this module holds the
one rule that belongs to the designer: the `Op` node's, for every op of `primitive.PRIMITIVE_OPS`. `op_shape`
gives a fold's dims from its operands' dims and settings (the ONNX import sizes a fold with it before
computing it).
"""
from __future__ import annotations



from ..shapes.dims import Dim, as_dim
from ..shapes.rules import RuleError, Shape, dims_text
from ..shapes.rules import Ctx, NP_DTYPE, float_input, same

__all__ = ["op_shape", "primitive_op_shape"]


_OP_KIND = {"float32": "float", "float64": "float", "float16": "float", "int64": "int", "int32": "int",
            "int8": "int", "uint8": "int", "bool": "bool"}


def _op_axis(axis: int, rank: int, op: str) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise RuleError(f"{op}: axis {axis} is out of range for a tensor of rank {rank}")
    return a


def _broadcast(op: str, shapes: list) -> tuple:
    n = max(s.rank for s in shapes)
    out = [as_dim(1)] * n
    padded = [(as_dim(1),) * (n - s.rank) + tuple(s.dims) for s in shapes]
    for i in range(n):
        d = None
        for p in padded:
            x = p[i]
            if x == 1:
                continue
            if d is None:
                d = x
            elif x != d:
                raise RuleError(f"{op}: the operands' dims {', '.join(dims_text(s.dims) for s in shapes)} do not "
                                f"broadcast (axis {i}: {d} and {x})")
        out[i] = d if d is not None else as_dim(1)
    return tuple(out)


def _const_int(d, what: str, op: str) -> int:
    d = as_dim(d)
    if not d.is_const():
        raise RuleError(f"{op}: {what} is the named axis {d}, where a fixed size is needed")
    return d.value()


def primitive_op_shape(m, ins, ctx):
    from .primitive import parse_operands, slice_length  # noqa: PLC0415

    op, a = m.op, m.attrs
    consts = m.constant_specs()
    ops = []
    for t in parse_operands(m.operands):
        if t is None:
            ops.append(None)
        elif t[0] == "in":
            ops.append(ins[t[1]])
        else:
            dtype, dims = consts[t[1]]
            ops.append(Shape(tuple(as_dim(d) for d in dims), _OP_KIND[dtype]))
    x = ops[0] if ops else None
    if x is None:
        raise RuleError(f"{op}: the first operand is missing")
    arity = {"Where": 3, "MatMul": 2, "Gather": 2, "Gemm": 2, "GatherElements": 2, "PRelu": 2, "ScatterND": 3, "GatherND": 2}
    arity.update({k: 2 for k in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual",
                                 "Greater", "GreaterOrEqual", "And", "Or", "Xor")})
    need = arity.get(op, 1)
    if len([o for o in ops[:need] if o is not None]) < need:
        raise RuleError(f"{op}: expected {need} operands, got {len([o for o in ops if o is not None])}")
    if op in ("Identity", "Neg", "Sqrt", "Reciprocal", "Exp", "Log", "Abs", "Erf", "Tanh", "Sigmoid", "Relu", "Sin",
              "Cos"):
        return same(x)
    if op in ("IsNaN",):
        return Shape(x.dims, "bool")
    if op == "Not":
        return same(x)
    if op in ("Max", "Min", "Sum", "Mean"):
        parts = [o for o in ops if o is not None]
        for o in parts[1:]:
            if o.dtype != x.dtype:
                raise RuleError(f"{op}: expected operands of one dtype, got {NP_DTYPE[x.dtype]} and "
                                f"{NP_DTYPE[o.dtype]}")
        if op == "Mean":
            float_input(op, x)
        return Shape(_broadcast(op, parts), x.dtype)
    if op == "Clip":
        for o in ops[1:3]:
            if o is not None and o.rank != 0 and not all(d == 1 for d in o.dims):
                raise RuleError(f"Clip: expected a scalar min / max, got dims {dims_text(o.dims)}")
        return same(x)
    if op == "Pad":
        from .primitive import OpError, pad_widths  # noqa: PLC0415

        try:
            widths = pad_widths(x.rank, a)
        except OpError as e:
            raise RuleError(str(e)) from None
        dims = []
        for k, (b, e) in enumerate(widths):
            if (a.get("mode") or "constant") == "reflect" and (b or e):
                size = _const_int(x.dims[k], f"axis {k} of {dims_text(x.dims)}", op)
                if max(b, e) >= size:
                    raise RuleError(f"Pad: reflect pads {b}, {e} must be smaller than axis {k} of {dims_text(x.dims)}")
            dims.append(x.dims[k] + (b + e) if b or e else x.dims[k])
        return Shape(tuple(dims), x.dtype)
    if op == "Tile":
        reps = a["shape"] or []
        if len(reps) != x.rank or any(r < 0 for r in reps):
            raise RuleError(f"Tile: expected {x.rank} repeats >= 0 for {dims_text(x.dims)}, got {list(reps)}")
        return Shape(tuple(d * r if r != 1 else d for d, r in zip(x.dims, reps)), x.dtype)
    if op == "GatherElements":
        idx = ops[1]
        k = _op_axis(a["axis"], x.rank, op)
        if idx.dtype != "int" or idx.rank != x.rank:
            raise RuleError(f"GatherElements: expected int indices of rank {x.rank}, got {NP_DTYPE[idx.dtype]} "
                            f"{dims_text(idx.dims)}")
        return Shape(tuple(idx.dims), x.dtype)
    if op in ("ArgMax", "ArgMin"):
        k = _op_axis(a["axis"], x.rank, op)
        dims = tuple(as_dim(1) if i == k else d for i, d in enumerate(x.dims)) if a["keepdims"] else \
            tuple(d for i, d in enumerate(x.dims) if i != k)
        return Shape(dims, "int")
    if op == "Einsum":
        from .primitive import OpError, einsum_sizes, parse_einsum  # noqa: PLC0415

        parts = [o for o in ops if o is not None]
        try:
            terms, out = parse_einsum(a.get("mode", ""))
            if len(terms) != len(parts):
                raise OpError(f"Einsum: {a.get('mode')!r} names {len(terms)} operand(s), the node has {len(parts)}")
            sizes = einsum_sizes(terms, [p.dims for p in parts], a.get("mode"))
        except OpError as e:
            raise RuleError(str(e)) from None
        float_input(op, x)
        return Shape(tuple(as_dim(sizes[c]) for c in out), x.dtype)
    if op == "Trilu":
        if x.rank < 2:
            raise RuleError(f"Trilu: expected a tensor of rank >= 2, got {dims_text(x.dims)}")
        return same(x)
    if op in ("Add", "Sub", "Mul", "Div", "Pow"):
        if op != "Pow" and ops[0].dtype != ops[1].dtype:
            raise RuleError(f"{op}: expected operands of one dtype, got {NP_DTYPE[ops[0].dtype]} and "
                            f"{NP_DTYPE[ops[1].dtype]} (dims {dims_text(ops[0].dims)} and {dims_text(ops[1].dims)})")
        return Shape(_broadcast(op, ops[:2]), ops[0].dtype)
    if op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"):
        return Shape(_broadcast(op, ops[:2]), "bool")
    if op == "Where":
        if ops[0].dtype != "bool":
            raise RuleError(f"Where: expected a bool condition, got {NP_DTYPE[ops[0].dtype]}")
        return Shape(_broadcast(op, ops[:3]), ops[1].dtype)
    if op == "Cast":
        return Shape(x.dims, _OP_KIND[a["to"]])
    if op in ("MatMul", "Gemm"):
        p, q = ops[0], ops[1]
        if p.rank == 0 or q.rank == 0:
            raise RuleError(f"{op}: expected operands of rank >= 1, got dims {dims_text(p.dims)} and {dims_text(q.dims)}")
        if op == "Gemm":
            if p.rank != 2 or q.rank != 2:
                raise RuleError(f"Gemm: expected two rank-2 operands, got dims {dims_text(p.dims)} and "
                                f"{dims_text(q.dims)}")
            pd = p.dims[::-1] if a["trans_a"] else p.dims
            qd = q.dims[::-1] if a["trans_b"] else q.dims
            p, q = Shape(pd, p.dtype), Shape(qd, q.dtype)
        pd = p.dims if p.rank > 1 else (as_dim(1),) + tuple(p.dims)
        qd = q.dims if q.rank > 1 else tuple(q.dims) + (as_dim(1),)
        if p.dtype != q.dtype:
            raise RuleError(f"{op}: expected operands of one dtype, got {NP_DTYPE[p.dtype]} and {NP_DTYPE[q.dtype]}")
        if pd[-1] != qd[-2]:
            raise RuleError(f"{op}: inner dimensions differ: dims {dims_text(p.dims)} @ {dims_text(q.dims)}")
        lead = _broadcast(op, [Shape(pd[:-2]), Shape(qd[:-2])]) if len(pd) > 2 or len(qd) > 2 else ()
        out = tuple(lead) + ((pd[-2],) if p.rank > 1 else ()) + ((qd[-1],) if q.rank > 1 else ())
        if op == "Gemm" and len(ops) > 2 and ops[2] is not None:
            _broadcast("Gemm", [Shape(out), ops[2]])
        return Shape(out, p.dtype)
    if op == "Transpose":
        perm = a["perm"] if a["perm"] is not None else list(range(x.rank))[::-1]
        if sorted(perm) != list(range(x.rank)):
            raise RuleError(f"Transpose: perm {perm} is not a permutation of the {x.rank} axes of "
                            f"{dims_text(x.dims)}")
        return Shape(tuple(x.dims[i] for i in perm), x.dtype)
    if op in ("Reshape", "Expand") and any(s <= -2 for s in (a["shape"] or [])):
        ref = ops[1] if len(ops) > 1 else None
        target = []
        for s in a["shape"]:
            if s <= -2:
                if ref is None or -s - 2 >= ref.rank:
                    raise RuleError(f"{op}: the shape code {s} names axis {-s - 2} of the reference operand, which "
                                    f"{'is absent' if ref is None else f'has dims {dims_text(ref.dims)}'}")
                target.append(ref.dims[-s - 2])
            else:
                target.append(s)
    else:
        target = list(a["shape"] or [])
    if op == "Reshape":
        shape = target
        if shape.count(-1) > 1 or any(isinstance(s, int) and s < -1 for s in shape):
            raise RuleError(f"Reshape: expected sizes >= 0 and at most one -1, got {shape}")
        out = []
        for i, s in enumerate(shape):
            if isinstance(s, int) and s == 0:
                if i >= x.rank:
                    raise RuleError(f"Reshape: 0 at axis {i} copies an axis the input {dims_text(x.dims)} lacks")
                out.append(as_dim(x.dims[i]))
            else:
                out.append(s)
        total = as_dim(1)
        for d in x.dims:
            total = total * d
        known = as_dim(1)
        for d in out:
            if not (isinstance(d, int) and d == -1):
                known = known * d
        if -1 in [d for d in out if isinstance(d, int)]:
            if known == 0:
                raise RuleError(f"Reshape: cannot infer -1 in {shape} from dims {dims_text(x.dims)}")
            q = _quotient(total, known)
            if q is None:
                raise RuleError(f"Reshape: cannot reshape {dims_text(x.dims)} into {shape}: no size for -1 makes "
                                f"the number of elements agree")
            out = [q if isinstance(d, int) and d == -1 else d for d in out]
        elif _product_dims(out) != total:
            raise RuleError(f"Reshape: cannot reshape {dims_text(x.dims)} into {shape}: the number of elements "
                            f"differs")
        return Shape(tuple(as_dim(d) for d in out), x.dtype)
    if op == "Unsqueeze":
        axes = a["axes"] or []
        rank = x.rank + len(axes)
        pos = sorted({_op_axis(v, rank, op) for v in axes})
        if len(pos) != len(axes):
            raise RuleError(f"Unsqueeze: axes {axes} repeat an axis")
        dims = list(x.dims)
        for p in pos:
            dims.insert(p, as_dim(1))
        return Shape(tuple(dims), x.dtype)
    if op == "Squeeze":
        axes = a["axes"]
        if axes is None:
            pos = [i for i, d in enumerate(x.dims) if d == 1]
        else:
            pos = sorted({_op_axis(v, x.rank, op) for v in axes})
            for p in pos:
                if x.dims[p] != 1:
                    raise RuleError(f"Squeeze: axis {p} of {dims_text(x.dims)} has size {x.dims[p]}, expected 1")
        return Shape(tuple(d for i, d in enumerate(x.dims) if i not in pos), x.dtype)
    if op == "Flatten":
        k = _op_axis(a["axis"], x.rank + 1, op)
        return Shape((_product_dims(x.dims[:k]), _product_dims(x.dims[k:])), x.dtype)
    if op == "Expand":
        shape = target
        return Shape(_broadcast(op, [x, Shape(tuple(as_dim(s) for s in shape))]), x.dtype)
    if op == "Concat":
        parts = [o for o in ops if o is not None]
        k = _op_axis(a["axis"], x.rank, op)
        total = as_dim(0)
        for i, t in enumerate(parts):
            if t.rank != x.rank or t.dtype != x.dtype or any(t.dims[j] != x.dims[j] for j in range(x.rank) if j != k):
                raise RuleError(f"Concat: operand {i} has dims {dims_text(t.dims)} ({NP_DTYPE[t.dtype]}), expected "
                                f"those of operand 0 {dims_text(x.dims)} ({NP_DTYPE[x.dtype]}) except on axis {k}")
            total = total + t.dims[k]
        return Shape(x.dims[:k] + (total,) + x.dims[k + 1:], x.dtype)
    if op == "Slice":
        starts, ends = a["starts"] or [], a["ends"] or []
        axes = a["axes"] if a["axes"] is not None else list(range(len(starts)))
        steps = a["steps"] if a["steps"] is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise RuleError(f"Slice: starts, ends, axes and steps differ in length ({len(starts)}, {len(ends)}, "
                            f"{len(axes)}, {len(steps)})")
        dims = list(x.dims)
        codes = list(a["shape"] or []) + [0] * len(ends)
        for s, e, ax, st, c in zip(starts, ends, axes, steps, codes):
            k = _op_axis(ax, x.rank, op)
            if st == 0:
                raise RuleError("Slice: a step of 0")
            if c <= -2:  # a run-time end: axis -2 - c of the reference, from 0 by 1 (the first that many)
                ref = ops[1] if len(ops) > 1 else None
                if ref is None or -c - 2 >= ref.rank or s != 0 or st != 1:
                    raise RuleError(f"Slice: the end code {c} names axis {-c - 2} of the reference operand "
                                    f"({'absent' if ref is None else dims_text(ref.dims)}); expected a slice from 0 "
                                    f"by 1")
                dims[k] = ref.dims[-c - 2]
                continue
            size = _const_int(dims[k], f"axis {k} of {dims_text(x.dims)}", op) if not (
                s == 0 and st == 1 and e >= 1 << 31) else None
            dims[k] = dims[k] if size is None else as_dim(slice_length(size, s, e, st))
        return Shape(tuple(dims), x.dtype)
    if op == "Range":  # the run-time form: 0 .. size of axis `axis` of the operand
        return Shape((x.dims[_op_axis(a["axis"], x.rank, op)],), _OP_KIND[a["to"]])
    if op == "GatherND":
        idx = ops[1]
        q = _const_int(idx.dims[-1], "the last axis of GatherND's indices", op) if idx.rank else 0
        if idx.dtype != "int" or not 1 <= q <= x.rank:
            raise RuleError(f"GatherND: expected int indices with a last axis of 1 to {x.rank}, got "
                            f"{dims_text(idx.dims)} ({NP_DTYPE[idx.dtype]})")
        return Shape(idx.dims[:-1] + x.dims[q:], x.dtype)
    if op == "Gather":
        idx = ops[1]
        if idx.dtype != "int":
            raise RuleError(f"Gather: expected int indices, got {NP_DTYPE[idx.dtype]}")
        k = _op_axis(a["axis"], x.rank, op)
        return Shape(x.dims[:k] + tuple(idx.dims) + x.dims[k + 1:], x.dtype)
    if op in ("Softmax", "LogSoftmax"):
        _op_axis(a["axis"], x.rank, op)
        float_input(op, x)
        return same(x)
    if op == "CumSum":
        _op_axis(a["axis"], x.rank, op)
        float_input(op, x)
        return same(x)
    if op == "TopK":
        k_axis = _op_axis(a["axis"], x.rank, op)
        k = int((a["shape"] or [0])[0])
        size = x.dims[k_axis]
        if as_dim(size).is_const() and not 0 <= k <= as_dim(size).value():
            raise RuleError(f"TopK: k {k} for axis {k_axis} of {dims_text(x.dims)}")
        dims = tuple(as_dim(k) if i == k_axis else d for i, d in enumerate(x.dims))
        return Shape(dims, "int" if (a.get("mode") or "").endswith("indices") else x.dtype)
    if op == "ScatterND":
        idx, upd = ops[1], ops[2]
        if idx.dtype != "int" or idx.rank < 1:
            raise RuleError(f"ScatterND: expected int indices of rank >= 1, got {NP_DTYPE[idx.dtype]} "
                            f"{dims_text(idx.dims)}")
        q = _const_int(idx.dims[-1], "the indices' last axis", op)
        if not 1 <= q <= x.rank:
            raise RuleError(f"ScatterND: indices {dims_text(idx.dims)} index {q} axes of {dims_text(x.dims)}")
        want = tuple(idx.dims[:-1]) + tuple(x.dims[q:])
        if upd.dtype != x.dtype or upd.rank != len(want) or any(u != w for u, w in zip(upd.dims, want)):
            raise RuleError(f"ScatterND: updates {dims_text(upd.dims)}, expected {dims_text(want)} of the data's dtype")
        return same(x)
    if op == "PRelu":
        if ops[1] is None or ops[1].dtype != x.dtype:
            raise RuleError("PRelu: expected a slope of the input's dtype")
        if _broadcast(op, [x, ops[1]]) != tuple(x.dims):
            raise RuleError(f"PRelu: the slope {dims_text(ops[1].dims)} does not broadcast to {dims_text(x.dims)}")
        return same(x)
    if op == "Shrink":
        float_input(op, x)
        return same(x)
    if op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceLogSumExp"):
        if op == "ReduceLogSumExp":
            float_input(op, x)
        axes = a["axes"]
        pos = set(range(x.rank)) if axes is None else {_op_axis(v, x.rank, op) for v in axes}
        if a["keepdims"]:
            return Shape(tuple(as_dim(1) if i in pos else d for i, d in enumerate(x.dims)), x.dtype)
        return Shape(tuple(d for i, d in enumerate(x.dims) if i not in pos), x.dtype)
    if op == "Shape":
        return Shape((as_dim(x.rank),), "int")
    raise RuleError(f"{op}: no shape rule")


class _OpSettings:
    """What the `PrimitiveOp` rule reads of an Op node's module, for `op_shape`."""

    def __init__(self, op: str, attrs: dict, operands: str):
        self.op, self.attrs, self.operands = op, attrs, operands

    @staticmethod
    def constant_specs() -> list:
        return []


def op_shape(op: str, attrs: dict, inputs: list) -> Shape:
    """The output of the primitive op `op` (ONNX semantics, `attrs` as `PrimitiveOp` holds them) on operands of
    these Shapes (None: an absent optional operand), by the `PrimitiveOp` rule: nothing is computed, so the
    ONNX importer sizes a constant fold with it before making the array."""
    tokens, shapes = [], []
    for t in inputs:
        tokens.append("" if t is None else f"in{len(shapes)}")
        if t is not None:
            shapes.append(Shape(tuple(as_dim(d) for d in t.dims), t.dtype))
    out = primitive_op_shape(_OpSettings(op, attrs, ",".join(tokens)), shapes, Ctx())
    return Shape(tuple(as_dim(d) for d in out.dims), out.dtype)


def _product_dims(dims):
    p = as_dim(1)
    for d in dims:
        p = p * as_dim(d)
    return p


def _quotient(total, known):
    """total / known when it is exact (a monomial divisor, or a constant one dividing every coefficient)."""
    known = as_dim(known)
    if known.is_const():
        k = known.value()
        return total // k if k and total.divisible_by(k) else None
    if len(known.terms) != 1:
        return None
    (km, kc), = known.terms.items()
    out = {}
    for mono, c in total.terms.items():
        rest = list(mono)
        for atom in km:
            if atom not in rest:
                return None
            rest.remove(atom)
        if c % kc:
            return None
        out[tuple(rest)] = c // kc

    return Dim(out)
