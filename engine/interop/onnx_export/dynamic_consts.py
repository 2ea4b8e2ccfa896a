"""Constants a forward makes at the size of its input (a causal mask, positions, zeros at the batch's
size): recognized from the traces at several sizes and computed in the graph from the run-time dims."""
from __future__ import annotations

import numpy as np

from .tracing import OnnxExportError


def _causal(value: np.ndarray) -> bool:
    """`value` is `[.., S, T]` bool, each `[S, T]` true where key `j` comes after query `i` with the
    last query aligned to the last key (`j - (T - S) > i`)."""
    if value.dtype != np.bool_ or value.ndim < 2:
        return False
    s, t = value.shape[-2:]
    want = np.arange(t)[None, :] - (t - s) > np.arange(s)[:, None]
    return bool(np.array_equal(value, np.broadcast_to(want, value.shape)))


def _windowed(value: np.ndarray, window: int | None) -> bool:
    """`value` is `[.., S, T]` bool, true where key `j` lies `window` or more positions before query
    `i` (`j - (T - S) <= i - window`): a sliding window's mask."""
    if window is None or value.dtype != np.bool_ or value.ndim < 2:
        return False
    s, t = value.shape[-2:]
    want = np.arange(t)[None, :] - (t - s) <= np.arange(s)[:, None] - window
    return bool(np.array_equal(value, np.broadcast_to(want, value.shape)))


def _key_offsets(g, s_form, t_form):
    """(rows `[S, 1]`, columns less the causal offset `[1, T]`) as run-time int64 ranges."""
    rows = g.node("Range", [g.const(np.int64(0)), scalar(g, s_form), g.const(np.int64(1))])
    cols = g.node("Range", [g.const(np.int64(0)), scalar(g, t_form), g.const(np.int64(1))])
    offset = g.node("Sub", [g.dim_value(t_form), g.dim_value(s_form)])
    return g.node("Unsqueeze", [rows, g.ints([1])]), g.node("Unsqueeze", [g.node("Sub", [cols, offset]), g.ints([0])])


def _arange_start(value: np.ndarray):
    """The first value of `value` when each of its rows `[.., N]` counts up by one from it, else None."""
    if value.dtype.kind not in "iu" or value.ndim < 1 or value.size == 0:
        return None
    first = int(value.reshape(-1)[0])
    row = np.arange(first, first + value.shape[-1], dtype=value.dtype)
    return first if np.array_equal(value, np.broadcast_to(row, value.shape)) else None


def scalar(g, form) -> str:
    return g.node("Squeeze", [g.dim_value(form), g.ints([0])])


def dynamic_constant(g, tid: int, value: np.ndarray, n: str) -> str:
    """The graph value of constant `tid` (named `n`) whose sizes or values differ between the
    traces: a causal mask or positions computed from the run-time dims, or one row of a constant
    whose rows are all the same expanded to the run-time size; anything else is refused."""
    forms = g.forms(tid)
    variants = g.variant_values(tid)
    saved = g.scope
    if _causal(value) and all(_causal(v) for v in variants):
        rows, cols = _key_offsets(g, forms[-2], forms[-1])
        out = g.node("Expand", [g.node("Greater", [cols, rows]), g.shape_value(forms)])
        g.scope = saved
        return out
    window = g.windows.get(g.scope)
    if _windowed(value, window) and all(_windowed(v, window) for v in variants):
        rows, cols = _key_offsets(g, forms[-2], forms[-1])
        far = g.node("LessOrEqual", [cols, g.node("Sub", [rows, g.const(np.int64(window))])])
        out = g.node("Expand", [far, g.shape_value(forms)])
        g.scope = saved
        return out
    start = _arange_start(value)
    starts = [_arange_start(v) for v in variants]
    if start is not None and None not in starts:
        first = g.form_of([start] + starts)
        size = forms[-1]
        begin = scalar(g, first)
        end = g.node("Add", [begin, scalar(g, size)])
        pos = g.node("Range", [begin, end, g.const(np.int64(1))])
        elem = g.onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        out = g.node("Expand", [g.node("Cast", [pos], to=int(elem)), g.shape_value(forms)])
        g.scope = saved
        return out
    axes = [i for i, (_, dl) in enumerate(forms) if any(dl)]
    row = value
    for ax in axes:
        row = np.take(row, [0], axis=ax)
    same = np.array_equal(np.broadcast_to(row, value.shape), value)
    for v in variants:
        r = v
        for ax in axes:
            r = np.take(r, [0], axis=ax)
        same = same and r.shape == row.shape and np.array_equal(r, row) and np.array_equal(
            np.broadcast_to(r, v.shape), v)
    if not axes or not same:
        raise OnnxExportError(
            f"a constant of dims {list(value.shape)} read in module '{g.scope or '(model)'}' depends on the "
            f"{' / '.join(g.syms)} size and is neither a causal or sliding-window mask, positions counting up, nor rows that are all "
            "the same; export with fixed sizes (dynamic_batch=False, dynamic_sequence=False)")
    g.inits.append(g.onnx.numpy_helper.from_array(np.ascontiguousarray(row), n))
    out = g.node("Expand", [n, g.shape_value(forms)])
    g.scope = saved
    return out
