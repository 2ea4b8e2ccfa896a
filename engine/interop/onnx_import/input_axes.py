"""Graph inputs whose axis is the sum of other inputs' named axes (a key/value-cache export's
`attention_mask` of `[batch, past_sequence + sequence]`, beside `past_key_values.N.key` of
`[batch, heads, past_sequence, head_dim]` and `input_ids` of `[batch, sequence]`).

The design's Input node names each axis on its own, so the mask's length would be a size no other
tensor has, and the attention scores' keys (the past joined to the new positions, `past_sequence +
sequence`) would not broadcast with it. Each such input is read through a Slice to its own length
whose end is the sum's size, taken at run time from one Range per named axis joined end to end:
the same tensor, its axis now the sum of the named axes. An input whose axis is longer than the sum is refused
when the model runs (the Slice is `exact`: it checks the axis is the sum), as onnxruntime
refuses it where it broadcasts; so is a shorter one."""
from __future__ import annotations

import re

_TERM = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")


def _terms(text) -> list | None:
    """The axis names of `a + b + ...` (None for anything else, a single name included)."""
    if not isinstance(text, str) or "+" not in text:
        return None
    parts = [p.strip() for p in text.split("+")]
    return parts if all(_TERM.match(p) for p in parts) else None


def relabel_sums(imp, graph_inputs) -> None:
    """Reads each graph input with an axis `a + b` (every term another input's named axis) through
    a Slice whose run-time end is that sum (see the module docstring)."""
    axes: dict = {}  # axis name -> (input value, axis), the first input that has it
    params = {}
    for v in graph_inputs:
        if v.name in imp.consts:
            continue
        dims = [d.dim_param if not d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        params[v.name] = dims
        for k, d in enumerate(dims):
            if d and _terms(d) is None:
                axes.setdefault(d, (v.name, k))
    for name, dims in params.items():
        for k, d in enumerate(dims):
            terms = _terms(d)
            if terms is None or any(t not in axes for t in terms):
                continue
            parts = []
            for t in terms:
                ref, axis = axes[t]
                parts.append(f"{name}#axis{k}#{t}")
                imp.add("Op", f"{name}_{t}", "Range", {"op": "Range", "inputs": 1, "operands": "in0", "axis": axis,
                                                       "to": "int64"}, [ref], parts[-1])
            joined = f"{name}#axis{k}"
            imp.add("Op", f"{name}_axis{k}", "Concat", {"op": "Concat", "inputs": len(parts), "constants": "",
                                                        "operands": ",".join(f"in{j}" for j in range(len(parts))),
                                                        "axis": 0}, parts, joined)
            imp.add("Op", f"{name}_as_sum", "Slice", {"op": "Slice", "inputs": 2, "operands": "in0,in1",
                                                      "constants": "", "starts": [0], "ends": [0], "axes": [k],
                                                      "steps": [1], "shape": [-2], "mode": "exact"},
                    [name, joined], name)
