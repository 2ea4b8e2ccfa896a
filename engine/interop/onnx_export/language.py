"""Language models as ONNX with dynamic batch and sequence axes, and the key/value-cache variant.

A model whose `forward(input_ids, attention_mask, cache)` takes a cache (Llama and the families
built on it, GPT-2) is traced at a base size and once more with each symbolic dim one larger
(`batch`, `sequence`, and with the cache `past_sequence`); every size, position, causal mask and
rotary row that differs between the traces is computed in the graph from the run-time dims
(`engine.interop.onnx_export.graph.Graph`). Inputs `input_ids` (int64 `[batch, sequence]`) and
`attention_mask` (int64 `[batch, sequence]`, with the cache `[batch, past_sequence + sequence]`,
1 for a real token); output `logits` `[batch, sequence, vocab]`. With the cache, inputs
`past_key_values.N.key` / `.value` (`[batch, kv_heads, past_sequence, head_dim]`, past_sequence
0 for the first step) and outputs `present.N.key` / `.value` (the past and the new positions).
The token positions (rotary rows, GPT-2's learned positions) are computed in the graph from
`attention_mask`, each row's real tokens counted (`onnx_export.positions`): a left-padded row gives
what it gives alone, as transformers' `generate` numbers it.
"""
from __future__ import annotations

import inspect

import numpy as np

from engine.nn import KVCache, RotaryEncoding
from engine.tensor import Tensor

from .tracing import OnnxExportError, trace_model

DEFAULT_MAX_LENGTH = 4096  # rows of the rotary tables written when max_length is not given


def is_language_model(model) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return {"input_ids", "attention_mask", "cache"} <= set(params)


def _n_layers(model) -> int:
    for name in ("layers", "h"):
        layers = getattr(model, name, None)
        if layers is not None:
            return len(layers)
    raise OnnxExportError(f"with_cache: {type(model).__name__} has no `layers` or `h` list of blocks to give caches to")


def rotary_tables(model, max_length: int | None) -> list:
    """The (cos, sin) tables `[rows, head_dim / 2]` of every rotary encoding in `model`."""
    tables = []
    for _, m in model.named_modules():
        if isinstance(m, RotaryEncoding):
            n = min(m.max_sequence_length, DEFAULT_MAX_LENGTH if max_length is None else int(max_length))
            cos, sin = m.frequencies(None, n)
            host = [np.asarray(a.get() if hasattr(a, "get") else a)[:n] for a in (cos, sin)]
            tables.append(tuple(host))
    return tables


def _ids_mask(example_input):
    """The example's (batch, sequence) and dtype of ids: an ids array or tensor, or (ids, mask)."""
    if example_input is None:
        return 2, 3
    ids = example_input[0] if isinstance(example_input, (list, tuple)) else example_input
    shape = tuple(ids.shape) if hasattr(ids, "shape") else np.asarray(ids).shape
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise OnnxExportError(f"export_onnx: a language model's example input is input_ids [batch, sequence], "
                              f"found dims {list(shape)}")
    return int(shape[0]), int(shape[1])


def _cache_layout(model, n_layers: int):
    """(kv_heads, head_dim, dtype) of the caches: one step run with empty caches."""
    caches = KVCache.layers(n_layers)
    model.forward(Tensor.from_data(np.zeros((1, 1), dtype=np.int64)), None, caches)
    k = caches[0].keys
    return k.shape[1], k.shape[3], k.dtype


def _inputs(b: int, s: int, past: int | None, layout, n_layers: int) -> list:
    rng = np.random.default_rng(0)
    ids = Tensor.from_data(rng.integers(0, 2, size=(b, s)).astype(np.int64))
    mask = Tensor.from_data(np.ones((b, s + (past or 0)), dtype=np.int64))
    if past is None:
        return [ids, mask]
    heads, dim, dtype = layout
    pasts = [Tensor.from_data(rng.standard_normal((b, heads, past, dim)).astype(np.float32)).cast(dtype)
             for _ in range(2 * n_layers)]
    return [ids, mask] + pasts


def _cache_call(n_layers: int):
    def call(model, ids, mask, *past):
        caches = [KVCache.holding(past[2 * i], past[2 * i + 1]) for i in range(n_layers)]
        out = [model.forward(ids, mask, caches)]
        for c in caches:
            out += [c.keys, c.values]
        return out
    return call


def trace_language_model(model, example_input=None, dynamic_batch: bool = True, dynamic_sequence: bool = True,
                         with_cache: bool = False, input_names=None, output_names=None, max_length=None) -> dict:
    """The traces and names `trace_to_onnx` takes for a language model (see the module docstring)."""
    b, s = _ids_mask(example_input)
    n = _n_layers(model) if with_cache else 0
    layout = _cache_layout(model, n) if with_cache else None
    past = 2 if with_cache else None
    names = ["input_ids", "attention_mask"] + [f"past_key_values.{i}.{kv}" for i in range(n) for kv in ("key", "value")]
    outs = ["logits"] + [f"present.{i}.{kv}" for i in range(n) for kv in ("key", "value")]
    if input_names is not None:
        if len(input_names) != len(names):
            raise OnnxExportError(f"input_names: {len(names)} inputs ({', '.join(names)}), {len(input_names)} names given")
        names = list(input_names)
    if output_names is not None:
        outs = list(output_names)
    call = _cache_call(n) if with_cache else None

    def trace(db=0, ds=0, dp=0):
        inputs = _inputs(b + db, s + ds, None if past is None else past + dp, layout, n)
        return trace_model(model, inputs, names=names, call=call)

    others, symbols = {}, {}
    if dynamic_batch:
        others["batch"], symbols["batch"] = trace(db=1), (0, 0)
    if dynamic_sequence:
        others["sequence"], symbols["sequence"] = trace(ds=1), (0, 1)
        if with_cache:
            others["past_sequence"], symbols["past_sequence"] = trace(dp=1), (2, 2)
    windows = {path: m.window for path, m in model.named_modules() if isinstance(getattr(m, "window", None), int)}
    return dict(trace=trace(), others=others, symbols=symbols, output_names=outs, windows=windows,
                tables=rotary_tables(model, max_length) if dynamic_sequence else [])
