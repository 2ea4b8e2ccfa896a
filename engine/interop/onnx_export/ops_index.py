"""Indexing and the rotary encoding as ONNX nodes, with bounds and tables that follow the run-time
sizes when the traces at several sizes differ (`getitem`, `rotary`)."""
from __future__ import annotations

import numpy as np

from .graph import Graph, np_dtype
from .positions import rotary_rows


def _parse(g: Graph, key, shape) -> tuple:
    """Per indexed axis (axis, start, end, step, whole axis, an int index) and the new axes of `x[key]`."""
    key = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, tuple) and k and k[0] == "tensor" for k in key):
        g.fail("indexing with a tensor")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - (len(key) - 1 - sum(k is None for k in key))) + key[i + 1:]
    items, new_axes = [], []
    axis = out_axis = 0
    for k in key:
        if k is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(k, (int, np.integer)):
            s = int(k) % shape[axis]
            items.append((axis, s, s + 1, 1, False, True))
        elif isinstance(k, slice):
            out_axis += 1
            s0, e0, st = k.indices(shape[axis])
            if st < 0:
                g.fail("a negative slice step")
            items.append((axis, s0, e0, st, (s0, e0, st) == (0, shape[axis], 1), False))
        else:
            g.fail(f"index {k!r}")
        axis += 1
    return items, new_axes


def getitem(g: Graph, o, x: str, x_id: int) -> str:
    shapes = [g.trace.tensors[x_id].shape] + [g.others[s].tensors[x_id].shape for s in g.syms]
    keys = [o.attrs["key"]] + [g.variant_op(o, k).attrs["key"] for k in range(len(g.syms))]
    parsed = [_parse(g, key, shape) for key, shape in zip(keys, shapes)]
    items0, new_axes = parsed[0]
    if any(len(p[0]) != len(items0) or p[1] != new_axes for p in parsed[1:]):
        g.fail("an index whose form changes with the input's size")
    starts, ends, axes, steps, squeeze = [], [], [], [], []
    for j, (axis, _, _, step, _, is_int) in enumerate(items0):
        per = [p[0][j] for p in parsed]
        if any(q[0] != axis or q[3] != step for q in per):
            g.fail("an index whose step or axis changes with the input's size")
        if not is_int and all(q[4] for q in per):
            continue  # the whole axis, at every size
        starts.append(g.form_of([q[1] for q in per]))
        ends.append(g.form_of([q[2] for q in per]))
        axes.append(axis)
        steps.append(step)
        if is_int:
            squeeze.append(axis)
    y = x
    if axes:
        y = g.node("Slice", [x, g.shape_value(starts), g.shape_value(ends), g.ints(axes), g.ints(steps)])
    if squeeze:
        y = g.node("Squeeze", [y, g.ints(squeeze)])
    if new_axes:
        y = g.node("Unsqueeze", [y, g.ints(new_axes)])
    if y is x:
        y = g.node("Identity", [x])
    return y


def _host(v) -> np.ndarray:
    return np.asarray(v.get() if hasattr(v, "get") else v)


def _table_start(table: np.ndarray, rows: np.ndarray):
    """Where `rows` are a run of `table`'s rows, or None."""
    if rows.ndim != 2 or rows.shape[1] != table.shape[1] or rows.shape[0] > table.shape[0]:
        return None
    if rows.shape[0] == 0:
        return 0
    for st in np.nonzero((table == rows[0]).all(axis=1))[0]:
        st = int(st)
        if st + rows.shape[0] <= table.shape[0] and np.array_equal(table[st:st + rows.shape[0]], rows):
            return st
    return None


def _rotary_tables(g: Graph, o, x_id: int):
    """The cos and sin graph values of a rotary op: the traced rows as constants when every trace
    has the same, else a slice of the model's full table from the run-time start and length."""
    dt = np_dtype(g.trace.tensors[x_id].dtype)
    cos, sin = _host(o.attrs["cos"]), _host(o.attrs["sin"])
    variants = [g.variant_op(o, k).attrs for k in range(len(g.syms))]
    if all(_host(v["cos"]).shape == cos.shape and np.array_equal(_host(v["cos"]), cos) and
           np.array_equal(_host(v["sin"]), sin) for v in variants):
        return g.const(cos.astype(dt)[..., None]), g.const(sin.astype(dt)[..., None])
    every = [(cos, sin)] + [(_host(v["cos"]), _host(v["sin"])) for v in variants]
    names = g.__dict__.setdefault("table_names", {})
    for k, (tc, ts) in enumerate(g.tables):
        starts = [_table_start(tc, c) for c, _ in every]
        if None in starts or any(_table_start(ts, s) != st for (_, s), st in zip(every, starts)):
            continue
        if k not in names:
            saved, g.scope = g.scope, ""
            names[k] = (g.const(tc.astype(dt)[..., None]), g.const(ts.astype(dt)[..., None]))
            g.scope = saved
        rows = rotary_rows(g, x_id, starts, names[k])
        if rows is not None:  # a language model: each row's positions from its attention mask
            return rows
        begin = g.dim_value(g.form_of(starts))
        end = g.node("Add", [begin, g.dim_value(g.forms(x_id)[-2])])
        return tuple(g.node("Slice", [tab, begin, end, g.ints([0])]) for tab in names[k])
    g.fail("its rotary table changes with the sequence length and is not a run of the model's table (a rope "
           "whose frequencies depend on the length, or positions beyond the exported max_length); export with "
           "dynamic_sequence=False or a larger max_length")


def rotary(g: Graph, o, x: str, x_id: int) -> str:
    forms = g.forms(x_id)
    half = forms[-1][0] // 2
    pair_forms = forms[:-1] + [g.fixed(half), g.fixed(2)]
    pairs = g.node("Reshape", [x, g.reshape_target(forms, pair_forms)])
    first = g.node("Slice", [pairs, g.ints([0]), g.ints([1]), g.ints([-1])])
    second = g.node("Slice", [pairs, g.ints([1]), g.ints([2]), g.ints([-1])])
    c, s = _rotary_tables(g, o, x_id)
    out0 = g.node("Sub", [g.node("Mul", [first, c]), g.node("Mul", [second, s])])
    out1 = g.node("Add", [g.node("Mul", [first, s]), g.node("Mul", [second, c])])
    joined = g.node("Concat", [out0, out1], axis=-1)
    return g.node("Reshape", [joined, g.reshape_target(pair_forms, forms)])
