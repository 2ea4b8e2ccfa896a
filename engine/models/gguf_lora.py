"""`save_gguf_lora`: a model's LoRA adapters as a GGUF LoRA adapter llama.cpp applies over the base
GGUF file (`llama-cli -m base.gguf --lora adapter.gguf`, `Llama(base, lora_path=adapter)`); the
Ollama Modelfile that goes with it is `ollama.write_modelfile`.

The file is what llama.cpp's `convert_lora_to_gguf.py` writes and its adapter loader reads:
`general.type = "adapter"`, the base's `general.architecture`, `adapter.type = "lora"`,
`adapter.lora.alpha`, and for each adapted matrix `<base tensor>.lora_a` (NumPy `[r, n_in]`) and
`<base tensor>.lora_b` (`[n_out, r]`), float32. llama.cpp adds `alpha / r * (B @ A) x` to each
adapted matrix's output (r: that adapter's rank), so:

- Ember's factors (`a` `[n_in, r]`, `b` `[r, n_out]`, the value `W + scale * a @ b` in Ember's
  `[n_in, n_out]`) are written `A = a.T`, `B = b.T` in the base tensor's row order: a "llama"
  file's q/k rows are llama.cpp's interleaved rotary pairs, Ember's own order, so they are as they
  are; a "qwen2" file keeps Hugging Face's order, so B's q/k rows are permuted back to it (the
  weight map's rules inverted);
- one `alpha` holds for the whole file: it is `scale * r` of the first adapter (for rsLoRA,
  whose scale is `alpha / sqrt(r)`, that is `alpha * sqrt(r)`), and an adapter of another scale or
  rank has `scale * r / alpha` folded into its B, so every adapter's change is exactly Ember's;
- what llama.cpp cannot apply is refused before anything is written, naming it: DoRA's
  magnitudes, a LoRA on the token embedding or the output head, a parameter trained outside the
  adapters (an embedding, a norm);
- the adapter is checked against the base GGUF as llama.cpp's loader checks it: the same
  architecture, every `<name>` a tensor of the base, of dims `[n_out, n_in]` matching the factors.

The adapter's base is the GGUF file the model was opened from, or `base` when given (a model
opened from a Hugging Face folder of the same weights can target that folder's GGUF conversion).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from ..module.lora import DoraAdapter, LoraAdapter
from ..module.reparam import adapters_of, iter_param_slots
from ..store.errors import RecordError
from ..store.gguf_file import open_gguf
from ..tensor.raw import array
from .gguf_export import Planned, gguf_architecture, write_gguf_file
from .gguf_model import gguf_weight_map
from .hf_folder import PretrainedError
from .mapping import Rule
from .moe import ExpertPart

__all__ = ["check_gguf_lora", "gguf_lora_tensors", "save_gguf_lora"]

_NOT_ADAPTABLE = {"token_embd.weight": "the token embedding", "output.weight": "the output head"}


def _np(p) -> np.ndarray:
    return np.asarray(array(p.val()), dtype=np.float32)


def gguf_lora_tensors(model) -> tuple[str, float, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(llama.cpp architecture, alpha, {base tensor name: (A [r, n_in], B [n_out, r])}) of `model`'s
    adapters in llama.cpp's layout (see this file's doc); a PretrainedError for what llama.cpp
    cannot apply."""
    arch, info = gguf_architecture(model)
    adapters = adapters_of(model)
    if not adapters:
        raise PretrainedError(f"this {type(model).__name__} has no LoRA adapters to export: attach them with "
                              f"Model > LoRA first")
    inner = tuple(f"{path}." for path in adapters)
    for path, p in iter_param_slots(model):
        if p.reparameterization is None and not path.startswith(inner) and p.lazy_is_require_grad():
            raise PretrainedError(f"'{path}' is trainable outside the LoRA adapters: a GGUF LoRA adapter holds the "
                                  f"adapters' factors only, so llama.cpp would not apply its training; freeze it, or "
                                  f"export the merged model (File > Export > GGUF)")
    wmap = gguf_weight_map(arch, info.config)
    planned = []
    for path, r in adapters.items():
        if isinstance(r, DoraAdapter):
            raise PretrainedError(f"'{path}' carries a DoRA adapter: llama.cpp applies LoRA factors only, not DoRA's "
                                  f"magnitudes; export the merged model (File > Export > GGUF) instead")
        if not isinstance(r, LoraAdapter):
            raise PretrainedError(f"'{path}' carries a {type(r).__name__}: a GGUF LoRA adapter holds LoRA factors only")
        hit = wmap.find(path)
        if hit is None:
            raise PretrainedError(f"'{path}' has no tensor in llama.cpp's {arch} model to adapt")
        rule, name = hit
        if name in _NOT_ADAPTABLE:
            raise PretrainedError(f"'{path}' ({name}, {_NOT_ADAPTABLE[name]}) carries a LoRA: Ember does not export a "
                                  f"LoRA of {_NOT_ADAPTABLE[name]} for llama.cpp; leave it out of the LoRA group, or "
                                  f"export the merged model")
        planned.append((name, rule, r, path))
    first = planned[0][2]
    alpha = float(first.scale * first.a.shape[1])
    if not alpha > 0:
        raise PretrainedError(f"the adapters' scale is {first.scale!r}: llama.cpp reads alpha 0 as 'no scaling'")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    fused: dict[str, list] = {}  # a fused tensor's name -> its adapted parts (Phi-3's attn_qkv, ffn_up)
    for name, rule, r, path in planned:
        a, b = _np(r.a), _np(r.b)  # [n_in, r], [r, n_out]
        fold = np.float32(r.scale * a.shape[1] / alpha)
        b = b * fold if fold != 1 else b
        if rule.transforms and isinstance(rule.transforms[0], ExpertPart):
            raise PretrainedError(f"'{path}' (one expert of {name}) carries a LoRA: Ember does not write a "
                                  f"GGUF LoRA of the stacked experts; export the merged model (File > Export > GGUF)")
        if rule.split is not None:
            fused.setdefault(name, []).append((rule, a, b))
            continue
        B = rule.save(b)  # [n_out, r] in the base tensor's row order
        out[name] = (np.ascontiguousarray(a.T), np.ascontiguousarray(B, dtype=np.float32))
    for name, parts in fused.items():
        out[name] = _fused_factors(parts)
    return arch, alpha, out


def _fused_factors(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """One LoRA over a fused tensor equal to its parts' LoRAs: their ranks stacked (A `[sum r, n_in]`)
    and B block-diagonal over the parts' rows (`[n_out, sum r]`, zero for a part without an adapter),
    each block times `sum r / r` (llama.cpp scales a tensor's LoRA by alpha over that tensor's rank)."""
    split = parts[0][0].split
    by_index = {rule.split.index: (rule, a, Rule(rule.hf, rule.ember, rule.transforms[1:]).save(b))
                for rule, a, b in parts}  # each part's B [part rows, r] in the base tensor's row order
    sizes = split.sizes or (next(iter(by_index.values()))[2].shape[0],) * split.parts
    ranks = [by_index[i][1].shape[1] if i in by_index else 0 for i in range(split.parts)]
    n_in = parts[0][1].shape[0]
    A = np.zeros((sum(ranks), n_in), dtype=np.float32)
    B = np.zeros((sum(int(n) for n in sizes), sum(ranks)), dtype=np.float32)
    row, col = 0, 0
    for i in range(split.parts):
        if i in by_index:
            _, a, b = by_index[i]
            A[col:col + ranks[i]] = a.T
            B[row:row + int(sizes[i]), col:col + ranks[i]] = b * np.float32(sum(ranks) / ranks[i])
        row, col = row + int(sizes[i]), col + ranks[i]
    return A, B


def check_gguf_lora(arch: str, tensors: dict, base) -> None:
    """Check an adapter against the base GGUF file as llama.cpp's loader does (architecture, names,
    dims); a PretrainedError naming the first mismatch."""
    try:
        file = open_gguf(base)
    except RecordError as exc:
        raise PretrainedError(f"the base GGUF cannot be read: {exc.reason}", where=exc.where) from None
    with file:
        where = str(file.path)
        if file.architecture != arch:
            raise PretrainedError(f"the adapter is for a {arch!r} model, the base GGUF is {file.architecture!r}",
                                  where=where)
        for name, (A, B) in tensors.items():
            t = file.tensors.get(name)
            if t is None:
                raise PretrainedError(f"the base has no tensor {name!r} for the adapter's {name}.lora_a / .lora_b",
                                      where=where)
            if len(t.shape) != 2 or t.shape != (B.shape[0], A.shape[1]):
                raise PretrainedError(f"tensor {name!r} has dims {list(t.shape)}; the adapter's factors "
                                      f"[{B.shape[0]}, r] x [r, {A.shape[1]}] need [{B.shape[0]}, {A.shape[1]}]",
                                      where=where)


def save_gguf_lora(model, path, *, base=None, check: Callable[[], None] | None = None) -> Path:
    """Write `model`'s LoRA adapters as a GGUF LoRA adapter at `path` (see this file's doc), checked
    against `base` (default: the GGUF file the model was opened from) first. Returns the path."""
    arch, alpha, tensors = gguf_lora_tensors(model)
    if base is None:
        _, info = gguf_architecture(model)
        base = info.gguf
    if base is not None:
        check_gguf_lora(arch, tensors, base)

    def metadata(writer) -> None:
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)

    plan = []
    for name, (A, B) in tensors.items():
        for suffix, value in ((".lora_a", A), (".lora_b", B)):
            plan.append(Planned(name + suffix, "F32", tuple(value.shape), value.nbytes, lambda v=value: v))
    return write_gguf_file(Path(os.fspath(path)), arch, metadata, plan, check)
