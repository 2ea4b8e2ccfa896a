"""Each traced op as ONNX nodes: one dispatch on the op name (`convert`)."""
from __future__ import annotations

import math

import numpy as np

from .graph import Graph, axes_of, np_dtype, pad_pairs, shape_arg, tuple_of
from .ops_index import getitem, rotary
from .positions import is_position_index, mask_positions


_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "neg": "Neg", "abs": "Abs", "erf": "Erf", "sin": "Sin", "cos": "Cos", "recip": "Reciprocal",
          "identity": "Identity", "dropout": "Identity", "sign": "Sign", "bool_not": "Not", "softsign": "Softsign",
          "is_nan": "IsNaN"}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "matmul": "MatMul", "pow": "Pow",
           "maximum": "Max", "minimum": "Min", "equal": "Equal", "greater": "Greater", "lower": "Less",
           "greater_equal": "GreaterOrEqual", "lower_equal": "LessOrEqual", "bool_and": "And", "bool_or": "Or"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd",
           "sum_dim": "ReduceSum", "mean_dim": "ReduceMean", "max_dim": "ReduceMax", "min_dim": "ReduceMin"}


def _reduce(g: Graph, kind: str, x: str, axes: list[int], keep: bool) -> str:
    if kind == "ReduceSum":  # axes an input from opset 13
        return g.node(kind, [x, g.ints(axes)], keepdims=int(keep))
    return g.node(kind, [x], axes=axes, keepdims=int(keep))


def convert(g: Graph, o) -> list[str]:  # noqa: C901 - one dispatch on the op name
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
        to = onnx.helper.np_dtype_to_tensor_dtype(np_dtype(t[o.outputs[0]].dtype))
        return [g.node("Cast", [x], to=int(to))]
    if op == "linear":
        y = g.node("MatMul", [x, g.name(ins["weight"])])
        if "bias" in ins:
            y = g.node("Add", [y, g.name(ins["bias"])])
        return [y]
    if op == "embedding":
        idx = ins["indices"]
        if is_position_index(g, idx):  # each row's own positions: [batch, ...] where the trace had [1, ...]
            g.reshaped.add(o.outputs[0])
            return [g.node("Gather", [g.name(ins["weight"]), mask_positions(g)], axis=0)]
        return [g.node("Gather", [g.name(ins["weight"]), g.name(idx)], axis=0)]
    if op == "rms_norm":
        ms = _reduce(g, "ReduceMean", g.node("Mul", [x, x]), [len(t[x_id].shape) - 1], True)
        r = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [ms, g.scalar(a["eps"], x_id)])])])
        return [g.node("Mul", [g.node("Mul", [x, r]), g.name(ins["gamma"])])]
    if op == "normalize":
        if a.get("stats") is not None:
            g.fail("batch statistics are asked for (a training-mode batch norm); export the model in valid() mode")
        rank = len(t[x_id].shape)
        axes = axes_of(a["axes"], rank)
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
        return [rotary(g, o, x, x_id)]
    if op in ("reshape", "flatten", "squeeze", "unsqueeze") and not (op == "unsqueeze" and len(out_shape) == 0):
        if op == "unsqueeze":
            return [g.node("Unsqueeze", [x, g.ints([int(a.get("dim", 0)) % len(out_shape)])])]
        return [g.node("Reshape", [x, g.reshape_target(g.forms(x_id), g.forms(o.outputs[0]))])]
    if op == "expand":
        return [g.node("Expand", [x, g.expand_target(g.forms(x_id), g.forms(o.outputs[0]))])]
    if op in ("swap_dims", "transpose", "permute"):
        rank = len(t[x_id].shape)
        perm = list(range(rank))
        if op == "swap_dims":
            d1, d2 = int(a["dim1"]) % rank, int(a["dim2"]) % rank
            perm[d1], perm[d2] = perm[d2], perm[d1]
        elif op == "transpose":
            perm[-1], perm[-2] = perm[-2], perm[-1]
        else:
            perm = [int(d) % rank for d in shape_arg(a["axes"])]
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
        axes = list(range(rank)) if dim is None else axes_of(dim, rank)
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
        val = g.onnx.numpy_helper.from_array(np.asarray([value], dtype=np_dtype(t[x_id].dtype)))
        return [g.node("ConstantOfShape", [g.node("Shape", [x])], value=val)]
    if op == "narrow":
        d = int(a["dim"]) % len(t[x_id].shape)
        s = int(a["start"])
        return [g.node("Slice", [x, g.ints([s]), g.ints([s + int(a["length"])]), g.ints([d])])]
    if op == "getitem":
        return [getitem(g, o, x, x_id)]
    if op in ("conv1d", "conv2d", "conv3d"):
        n = int(op[4])
        w = ins["weight"]
        kernel = t[w].shape[2:]
        if isinstance(a.get("padding"), str):
            mode = a["padding"].lower()
            if mode == "valid":
                pads = [(0, 0)] * n
            else:  # "same" (stride 1)
                dil = tuple_of(a.get("dilation", 1), n)
                pads = [((k - 1) * d // 2, (k - 1) * d - (k - 1) * d // 2) for k, d in zip(kernel, dil)]
        else:
            pads = pad_pairs(a.get("padding", 0), n)
        inputs = [x, g.name(w)] + ([g.name(ins["bias"])] if "bias" in ins else [])
        return [g.node("Conv", inputs, kernel_shape=list(kernel), strides=tuple_of(a.get("stride", 1), n),
                       dilations=tuple_of(a.get("dilation", 1), n), group=int(a.get("groups", 1)),
                       pads=[p[0] for p in pads] + [p[1] for p in pads])]
    if op in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"):
        n = int(op[-2])
        kernel = tuple_of(a["kernel_size"], n)
        stride = kernel if a.get("stride") is None else tuple_of(a["stride"], n)
        pads = pad_pairs(a.get("padding", 0), n)
        common = dict(kernel_shape=kernel, strides=stride, pads=[p[0] for p in pads] + [p[1] for p in pads],
                      ceil_mode=int(bool(a.get("ceil_mode", False))))
        if op.startswith("max"):
            return [g.node("MaxPool", [x], dilations=tuple_of(a.get("dilation", 1), n), **common)]
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
        dims = axes_of(a["dims"], rank)
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
        classes = g.const(np.arange(int(a["num_classes"]), dtype=np_dtype(t[x_id].dtype)))
        hit = g.node("Equal", [g.node("Unsqueeze", [x, g.ints([-1])]), classes])
        to = g.onnx.helper.np_dtype_to_tensor_dtype(np_dtype(t[o.outputs[0]].dtype))
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
        return [g.node("ReduceLogSumExp", [x], axes=axes_of(a["dim"], rank), keepdims=int(bool(a.get("keepdim", False))))]
    if op == "module":
        g.fail(f"a shape-only trace ({a.get('type')} was not run); trace the model with allocated parameters")
    g.fail("no converter for this op")


def value_info(g: Graph, tid: int, name: str):
    t = g.trace.tensors[tid]
    dims = [g.dim_name(f, f"{name}_dim{i}") for i, f in enumerate(g.forms(tid))]
    elem = g.onnx.helper.np_dtype_to_tensor_dtype(np_dtype(t.dtype))
    return g.onnx.helper.make_tensor_value_info(name, elem, dims)
