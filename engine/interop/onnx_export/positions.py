"""A language model's token positions read from its attention mask at run time.

transformers' `generate` numbers a left-padded row's positions from its first real token:
`cumsum(attention_mask) - 1`, 0 at the padding. A traced forward instead holds the positions of its
example (`past .. past + sequence`, the same for every row), so the exported language model
computes them from `attention_mask` in the graph and uses them wherever the trace read positions:
the rows of the rotary tables (Llama and the families built on it) and the indices of a learned
position embedding (GPT-2), for the prompt step and every cache step alike. A row without padding
gets the positions it had in the trace."""
from __future__ import annotations

import numpy as np

from .graph import Graph, host_array

# ops a position index may pass through between the constant the forward made and the embedding
_PASS = {"reshape", "unsqueeze", "expand", "cast", "identity", "flatten"}


def mask_positions(g: Graph) -> str:
    """int64 `[batch, sequence]`: the positions of the new tokens, `cumsum(mask) - 1` (0 where the
    mask is 0) over the whole mask, its last `sequence` columns (the past's come before them)."""
    if g.positions is not None:
        return g.positions
    saved, g.scope = g.scope, "positions"
    mask = g.name(g.trace.inputs[g.mask_input])
    m = g.node("Cast", [mask], to=int(g.onnx.TensorProto.INT64))
    f = g.node("Cast", [m], to=int(g.onnx.TensorProto.FLOAT))  # a float count: exact to 2 ** 24 positions
    summed = g.node("Cast", [g.node("CumSum", [f, g.const(np.int64(1))])], to=int(g.onnx.TensorProto.INT64))
    counted = g.node("Sub", [summed, g.const(np.int64(1))])
    real = g.node("Not", [g.node("Equal", [m, g.const(np.int64(0))])])
    out = g.node("Where", [real, counted, g.const(np.int64(0))])
    if "past_sequence" in g.syms:  # the new tokens' columns: Range(0, sequence) + past, gathered
        seq = g.node("Squeeze", [g.dim_value(g.forms(g.trace.inputs[0])[1]), g.ints([0])])
        past = g.node("Squeeze", [g.dim_value(_start_form(g)), g.ints([0])])
        cols = g.node("Add", [g.node("Range", [g.const(np.int64(0)), seq, g.const(np.int64(1))]), past])
        out = g.node("Gather", [out, cols], axis=1)
    g.scope = saved
    g.positions = out
    return out


def _start_form(g: Graph):
    """The form of the traced positions' first value: 0, or the past's length with the cache."""
    if "past_sequence" in g.syms:
        i, axis = g.symbols["past_sequence"]
        return g.form_of([g.trace.tensors[g.trace.inputs[i]].shape[axis]]
                         + [g.others[s].tensors[g.others[s].inputs[i]].shape[axis] for s in g.syms])
    return g.fixed(0)


def _counts_from(value: np.ndarray):
    if value.dtype.kind not in "iu" or value.size == 0:
        return None
    row = value.reshape(-1, value.shape[-1])
    first = int(row[0, 0])
    return first if np.array_equal(row, np.broadcast_to(np.arange(first, first + row.shape[1]), row.shape)) else None


def is_position_index(g: Graph, tid: int) -> bool:
    """`tid` (an embedding's indices) holds the traced positions: it comes, through reshapes, from a
    constant the forward made counting up from 0 (or the past's length) in every trace."""
    if g.mask_input is None:
        return False
    t = g.trace.tensors
    while t[tid].source == "op":
        o = g.trace.ops[t[tid].producer]
        if o.op not in _PASS or not o.inputs:
            return False
        tid = o.inputs[0]
    if t[tid].source != "const":
        return False
    values = [host_array(g.trace.values[tid])] + g.variant_values(tid)
    starts = [_counts_from(v) for v in values]
    return None not in starts and g.form_of(starts) == _start_form(g) and values[0].shape[-1] == \
        g.trace.tensors[g.trace.inputs[0]].shape[1]


def rotary_rows(g: Graph, x_id: int, starts: list, tables: tuple) -> tuple | None:
    """(cos, sin) of each row's own positions, `[batch, 1.., sequence, pairs, 1]`, gathered from the
    model's tables (`[rows, pairs, 1]` graph values), when the traced rows start at the positions'
    start (None otherwise: another rotary use)."""
    if g.mask_input is None or g.form_of(starts) != _start_form(g):
        return None
    forms = g.forms(x_id)
    seq_form = g.forms(g.trace.inputs[0])[1]
    batch_form = g.forms(g.trace.inputs[0])[0]
    if len(forms) < 3 or forms[0] != batch_form or forms[-2] != seq_form:
        g.fail(f"a rotary encoding of dims {[d for d, _ in forms]} whose first axis is not the batch and whose "
               f"second last is not the sequence: its positions cannot be read from the attention mask")
    pos = mask_positions(g)
    out = []
    for tab in tables:
        rows = g.node("Gather", [tab, pos], axis=0)  # [batch, sequence, pairs, 1]
        if len(forms) > 3:
            rows = g.node("Unsqueeze", [rows, g.ints(list(range(1, len(forms) - 2)))])
        out.append(rows)
    return tuple(out)
