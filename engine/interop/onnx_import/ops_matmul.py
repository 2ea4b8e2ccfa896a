"""Products and lookups: Gemm and MatMul with a constant weight (Linear), Gather of a constant table (Embedding)."""
from __future__ import annotations


import numpy as np


from .registry import handles
from .common import node_attrs


@handles("Gemm")
def gemm(imp, node, name):
    at = node_attrs(node)
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if at.get("transA", 0) or b not in imp.consts or a in imp.consts or (c is not None and c not in imp.consts):
        return None  # an Op Gemm
    w = imp.consts[b]
    if w.ndim != 2 or w.dtype != np.float32:
        return None
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    w = (w.T if at.get("transB", 0) else w) * np.float32(alpha)
    d_in, d_out = w.shape
    params = {"weight": np.ascontiguousarray(w, dtype=np.float32)}
    if c is not None:
        cv = imp.consts[c]
        if cv.size == 1:
            cv = np.full((d_out,), float(cv.reshape(())), np.float32)
        elif cv.shape in ((d_out,), (1, d_out)):
            cv = cv.reshape(d_out)
        else:
            return None
        params["bias"] = (cv * np.float32(beta)).astype(np.float32)
    return imp.add("Linear", name, "Gemm", {"d_input": int(d_in), "d_output": int(d_out), "bias": c is not None},
                    [a], node.output[0], params)


@handles("MatMul")
def mat_mul(imp, node, name):
    a, b = node.input[0], node.input[1]
    if b not in imp.consts or a in imp.consts:
        return None
    w = imp.consts[b]
    if w.ndim != 2 or w.dtype != np.float32:
        return None
    d_in, d_out = w.shape
    out, params = node.output[0], {"weight": w}
    nxt = imp.single(out)
    if nxt is not None and imp.g.node[nxt].op_type == "Add" and nxt not in imp.done and nxt not in imp.fusions:
        add = imp.g.node[nxt]
        bias = imp.other_input(add, out)
        bv = imp.consts.get(bias) if bias else None
        if bv is not None and bv.dtype == np.float32 and bv.shape in ((d_out,), (1, d_out)):
            params["bias"] = bv.reshape(d_out)
            imp.done.add(nxt)
            out = add.output[0]
    made = imp.add("Linear", name, "MatMul", {"d_input": int(d_in), "d_output": int(d_out),
                                               "bias": "bias" in params}, [a], out, params)
    if "bias" in params:
        imp.report.mapping[imp.node_name(nxt, imp.g.node[nxt])] = f"fused into {made} (Linear)"
        imp.report.fused.append((made, "Linear", [name, imp.node_name(nxt, imp.g.node[nxt])]))
    return made


@handles("Gather")
def gather(imp, node, name):
    data, idx = node.input[0], node.input[1]
    at = node_attrs(node)
    if data in imp.consts and idx not in imp.consts and int(at.get("axis", 0)) == 0:
        table = imp.consts[data]
        dims = imp.dims_of(idx)
        if table.ndim == 2 and table.dtype == np.float32 and dims is not None and len(dims) == 2:
            return imp.add("Embedding", name, "Gather", {"n_embedding": int(table.shape[0]),
                                                          "d_model": int(table.shape[1])}, [idx], node.output[0],
                            {"weight": table})
    return None
