"""Text generation for the causal language models of `engine.models` (the Llama family, GPT-2).

    result = generate(model, tokenizer, "once upon a time", max_new_tokens=32, temperature=0)
    result.text          # the new text; result.ids: the new token ids

`generate` feeds the prompt once, then one token a step, with a key/value cache per layer
(`nn.KVCache`): each step computes the new position only and attends to the cached keys and
values of the earlier ones (a sliding-window layer's cache keeps only its window, so its memory stays
bounded however many tokens are made). It runs on the model's `valid()` form with nothing recorded, so it
needs no autodiff and can run on a worker thread (recording is per thread); LoRA and DoRA
adapters are folded into their weights once per call (the model itself is unchanged).

Choosing a token follows transformers' `generate`: `temperature` 0 is greedy (the first largest
logit); otherwise the logits are divided by `temperature`, `top_k` keeps the k largest (ties with
the k-th kept), `top_p` keeps the smallest set of most likely tokens whose probability reaches
`top_p` (a token goes when the tokens above it already hold `top_p`), and a token is drawn from the
rest with a NumPy generator seeded by `seed` (the same seed, the same tokens).

`repetition_penalty` (transformers' `RepetitionPenaltyLogitsProcessor`, before the temperature and in
greedy choice too) divides the positive logits and multiplies the negative ones of every token already
in the row, prompt included, by the penalty.

A row stops at a stop token or after `max_new_tokens`, the stop token kept as the row's last new
token as transformers keeps it. The stop tokens are the model's eos as transformers defines them
(`generation_config`: the folder's generation_config.json `eos_token_id`, an int or a list, else
config.json's; `eos_token_id=` replaces them), the tokenizer's eos only when the model names none,
and any ids or strings in `stop`; a stop string that is not one token stops the row once the new text
contains it. `stream(...)` gives the tokens as they come (for a panel that shows them) and
`cancel` (a callable returning true, or a `threading.Event`) ends the generation between steps.

A list of prompts is one left-padded batch with an attention mask; each row gives what it gives
alone (its positions count its real tokens, as transformers numbers them).
"""
from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..autodiff.tape import no_recording
from ..module import memory
from ..module.tree import params as tree_params
from ..tensor import Tensor
from ..tensor import raw as _raw
from ..tensor import cpu

__all__ = ["generate", "stream", "GenerationResult", "GenerationStream", "GeneratedToken", "warp_logits",
           "GenerationError", "estimate_generation", "generation_config", "generation_defaults", "penalize_repetition"]


class GenerationError(ValueError):
    """Generation settings or a prompt that cannot be used (what was expected, what was found)."""


@dataclass(frozen=True)
class GeneratedToken:
    """One new token of one row: its `id`, the `text` it adds to the row's decoded text (may be
    empty while a multi-byte character is incomplete; "" without a tokenizer), the `step` (0 for
    the first new token) and the batch `row`."""

    row: int
    step: int
    id: int
    text: str


@dataclass
class GenerationResult:
    """What `generate` made: per row the new token `ids` (a stop token included), the decoded
    new `texts` (special tokens skipped; None without a tokenizer), the `prompt_ids` (without
    padding) and why the row ended (`finish_reasons`: "stop", "length" or "cancelled").
    `text` and `token_ids` are the single row's values for a single prompt (the lists for a
    batch). `new_tokens` counts the tokens made, `seconds` the time taken."""

    ids: list[list[int]]
    texts: list[str | None]
    prompt_ids: list[list[int]]
    finish_reasons: list[str]
    batched: bool = False
    new_tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float = field(init=False, default=0.0)

    def __post_init__(self):
        self.tokens_per_second = self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def text(self):
        return self.texts if self.batched else self.texts[0]

    @property
    def token_ids(self):
        return self.ids if self.batched else self.ids[0]

    @property
    def cancelled(self) -> bool:
        return "cancelled" in self.finish_reasons


# ---------------------------------------------------------------------------------- token choice
def warp_logits(logits, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """The logits a token is drawn from (float64, `[..., vocab]`): divided by `temperature`, then
    every token outside the `top_k` largest (ties with the k-th kept) and outside the `top_p`
    nucleus set to -inf, in that order, as transformers' `TemperatureLogitsWarper`,
    `TopKLogitsWarper` and `TopPLogitsWarper` do (at least one token always stays)."""
    x = np.array(logits, dtype=np.float64)
    if temperature is not None and temperature != 1.0:
        x = x / float(temperature)
    vocab = x.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = np.partition(x, vocab - top_k, axis=-1)[..., vocab - top_k:vocab - top_k + 1]
        x = np.where(x < kth, -np.inf, x)
    if top_p is not None and top_p < 1.0:
        # transformers' formulation: ascending order, a token goes while the cumulative probability up
        # to it is at most 1 - top_p (the tokens above it hold top_p), the most likely one always stays
        order = np.argsort(x, axis=-1, kind="stable")
        srt = np.take_along_axis(x, order, axis=-1)
        p = np.exp(srt - srt[..., -1:])
        p /= p.sum(axis=-1, keepdims=True)
        drop_sorted = np.cumsum(p, axis=-1) <= 1.0 - top_p
        drop_sorted[..., -1] = False
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        x = np.where(drop, -np.inf, x)
    return x


def penalize_repetition(logits, rows, penalty: float) -> np.ndarray:
    """`logits` `[batch, vocab]` (float64) with each row's logits of the tokens in `rows[i]` (its
    prompt and new tokens so far; each token once, however often it came) divided by `penalty` where
    positive and multiplied by it where negative, as transformers' `RepetitionPenaltyLogitsProcessor`."""
    x = np.array(logits, dtype=np.float64)
    if penalty == 1.0:
        return x
    for i, row in enumerate(rows):
        seen = np.unique(np.asarray(row, dtype=np.int64))
        v = x[i, seen]
        x[i, seen] = np.where(v < 0, v * penalty, v / penalty)
    return x


def _draw(logits_row: np.ndarray, rng) -> int:
    p = np.exp(logits_row - logits_row.max())
    c = np.cumsum(p)
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    return min(i, len(c) - 1)


# ---------------------------------------------------------------------------------- model facts
# generation_config.json's sampling settings a panel takes as its defaults: (key, expected types)
SAMPLING_KEYS = {"do_sample": (bool,), "temperature": (int, float), "top_k": (int,), "top_p": (int, float),
                 "repetition_penalty": (int, float), "max_new_tokens": (int,)}


def _token_ids(value, key: str, where: str) -> list[int]:
    """An `eos_token_id` / `pad_token_id` value (None, an int or a list of ints) as a list."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items):
        raise GenerationError(f"{where}: expected '{key}' to be a token id (an int >= 0) or a list of them, found "
                              f"{value!r}")
    return list(items)


def generation_config(model) -> dict:
    """The model's own generation settings, as transformers' `model.generation_config` holds them
    after `from_pretrained`: the folder's generation_config.json when it has one (then config.json's
    special tokens are not looked at), else config.json's `eos_token_id` / `pad_token_id`
    (`GenerationConfig.from_model_config`); a model made in code gives its config's. Returns
    `{"eos_token_id": [ids], "pad_token_id": id or None}` plus the keys of `SAMPLING_KEYS` the
    file holds. A value of the wrong type is a GenerationError naming the file."""
    from .pretrained import pretrained_info  # noqa: PLC0415

    info = pretrained_info(model)
    folder = info.folder if info is not None else None
    if info is not None and info.generation_config is not None:
        doc, where = info.generation_config, str(folder / "generation_config.json") if folder else "generation_config"
    elif info is not None:
        doc, where = info.raw_config, str(folder / "config.json") if folder else "config.json"
    else:
        cfg = getattr(model, "config", None)
        doc = {k: getattr(cfg, k, None) for k in ("eos_token_id", "pad_token_id")}
        where = f"the {type(model).__name__}'s config"
    out = {"eos_token_id": _token_ids(doc.get("eos_token_id"), "eos_token_id", where)}
    pad = _token_ids(doc.get("pad_token_id"), "pad_token_id", where)
    if len(pad) > 1:
        raise GenerationError(f"{where}: expected 'pad_token_id' to be one token id, found {pad!r}")
    out["pad_token_id"] = pad[0] if pad else None
    if info is not None and info.generation_config is not None:
        for key, types in SAMPLING_KEYS.items():
            value = doc.get(key)
            if value is None:
                continue
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                raise GenerationError(f"{where}: expected '{key}' to be {' or '.join(t.__name__ for t in types)}, "
                                      f"found {value!r}")
            out[key] = value
    return out


def generation_defaults(model) -> dict:
    """The sampling settings the model's generation_config.json gives, in `generate`'s terms (what a
    panel starts from): `do_sample` false (transformers' default) is greedy (`temperature` 0); true
    takes its `temperature`, `top_k` and `top_p` with transformers' defaults for those it lacks (1.0,
    50, 1.0; `top_k` 0 is off); `repetition_penalty` and `max_new_tokens` as given. {} for a model
    whose folder has no generation_config.json."""
    from .pretrained import pretrained_info  # noqa: PLC0415

    info = pretrained_info(model)
    if info is None or info.generation_config is None:
        return {}
    own = generation_config(model)
    out = {}
    if own.get("do_sample", False):
        out.update(temperature=float(own.get("temperature", 1.0)), top_k=int(own.get("top_k", 50)),
                   top_p=float(own.get("top_p", 1.0)))
    else:
        out.update(temperature=0.0, top_k=0, top_p=1.0)
    for key in ("repetition_penalty", "max_new_tokens"):
        if key in own:
            out[key] = own[key]
    return out


def _model_facts(model):
    """(layers, n_positions, vocab size) of a supported causal LM."""
    if hasattr(model, "layers") and hasattr(model, "rotary_emb"):  # the Llama family
        cfg = model.config  # the rotary encoding's positions (dynamic NTK rope goes past max_position_embeddings)
        return len(model.layers), int(model.rotary_emb.max_sequence_length), int(cfg.vocab_size)
    if hasattr(model, "h") and hasattr(model, "wpe"):  # GPT-2
        cfg = model.config
        return len(model.h), int(cfg.n_positions), int(cfg.vocab_size)
    raise GenerationError(f"generate: expected a causal language model of engine.models (the Llama family or GPT-2), "
                          f"found {type(model).__name__}")


def _attention_sizes(model) -> tuple[int, int, int, int, int]:
    """(hidden, heads, kv heads, head dim, MLP width) of a supported causal LM, from its config."""
    cfg = model.config
    if hasattr(model, "rotary_emb"):  # the Llama family
        return (int(cfg.hidden_size), int(cfg.num_attention_heads), int(cfg.num_key_value_heads), int(cfg.head_dim),
                int(cfg.intermediate_size))
    return int(cfg.n_embd), int(cfg.n_head), int(cfg.n_head), int(cfg.n_embd) // int(cfg.n_head), int(cfg.d_inner)


def estimate_generation(model, batch: int = 1, prompt_length: int = 1, max_new_tokens: int = 1,
                        use_cache: bool = True) -> memory.MemoryEstimate:
    """What generating with `model` allocates, from shapes only (nothing is read or allocated):
    every lazy parameter initialized (each is used, and the largest one's initializer works on
    `memory.INIT_WORKING_COPIES` more copies of it: `memory.estimate_initialize`), one plain weight per LoRA / DoRA adapted
    parameter (folded once per call), the key/value cache of `batch` rows of `prompt_length +
    max_new_tokens` positions in every layer (a sliding-window layer's: at most its window's
    bounded buffer, `2 * (window - 1) + prompt_length`), and the largest step's working arrays (the prompt
    pass: the layer's activations, the attention scores, the last position's logits).
    `GenerationStream` checks it against `memory.available_memory()` before it starts."""
    from ..module.lora import QLoraAdapter  # noqa: PLC0415

    n_layers, _positions, vocab = _model_facts(model)
    hidden, heads, kv_heads, head_dim, inner = _attention_sizes(model)
    folded = 0
    itemsize = 4
    for _path, p in tree_params(model):
        size = memory.param_bytes(p)
        r = p.reparameterization
        if r is not None and not isinstance(r, QLoraAdapter) and not getattr(r, "MULTIPLIES", False):
            folded += size
        if p.kind == "float" and p.numel():
            itemsize = size // p.numel()  # the activations' dtype is the weights'
    b, total = int(batch), int(prompt_length) + int(max_new_tokens)
    width = int(prompt_length) if use_cache else total  # the longest pass
    held = sum(_cache_positions(w, int(prompt_length), total) for w in _layer_windows(model, n_layers))
    cache = 2 * b * kv_heads * head_dim * held * itemsize if use_cache else 0
    layer = b * width * (4 * hidden + 2 * kv_heads * head_dim + 3 * inner) + 2 * b * heads * width * width
    logits = b * vocab * (itemsize + 16)  # the last position's logits, and their float64 warp and draw
    return memory.MemoryEstimate("Generation", {
        **memory.estimate_initialize(model).parts,
        "adapters folded into their weights": folded, "key/value cache": cache,
        "working arrays": layer * itemsize + logits})


def _layer_windows(model, n_layers: int) -> list:
    """Each layer's sliding attention window (None: the layer attends to every earlier position)."""
    layers = getattr(model, "layers", None)
    if layers is None:  # GPT-2
        return [None] * n_layers
    return [getattr(getattr(layer, "self_attn", None), "window", None) for layer in layers]


def _cache_positions(window, prompt_length: int, total: int) -> int:
    """The positions a layer's `nn.KVCache` buffer holds at most in a generation of `total`
    positions: every one, or with a window the `window - 1` it keeps, the prompt and room to move."""
    return total if window is None else min(total, 2 * (window - 1) + prompt_length)


def _inference_model(model):
    """The model generation runs: `valid()`, with every LoRA / DoRA adapter folded into its weight
    once (`materialized_param`), so that a step multiplies by one weight instead of merging the
    factors again; the same values as `val()` gives each step. QLoRA weights stay packed (folding
    them in would hold a full-precision copy of each), and so do the weights whose
    reparameterization multiplies by itself (`MULTIPLIES`: a GGUF weight kept in its blocks, and
    LoRA over one), which the layers multiply in their blocks."""
    from ..module.lora import QLoraAdapter  # noqa: PLC0415
    from ..module.reparam import iter_param_slots, materialized_param  # noqa: PLC0415

    m = model.valid()
    for path, p in list(iter_param_slots(m)):
        r = p.reparameterization
        if r is not None and not isinstance(r, QLoraAdapter) and not getattr(r, "MULTIPLIES", False):
            m = m.with_child(path, materialized_param(p))
    return m


_HEAD_COPY_LIMIT = 512 * 2**20  # bytes: a larger head off the host is used through the model's own forward


class _Head:
    """The logits of the last position: the model's hidden states, then one product with its
    language-model head as a `[hidden, vocab]` array; the prompt's earlier positions get no
    logits at all. On the CPU that array is the parameter's own (a Hugging Face head or tied
    embedding is a transposed view of the stored `[vocab, hidden]` tensor, which the products
    take as it lies: one row times the view ran as fast as times a C-ordered copy, and the copy
    itself cost far more than the product, every call: benchmarks/TUNING.md, "generation's head"). Off the host, the head is copied
    to the host once per call when it holds at most `_HEAD_COPY_LIMIT` bytes, else `forward`
    gives the logits."""

    def __init__(self, model):
        self.model = model
        llama = hasattr(model, "rotary_emb")
        head = model.lm_head
        table = model.embed_tokens if llama else model.wte
        weight = head.weight if head is not None else table.weight
        # a weight kept quantized multiplies in its blocks (a GGUF head or tied embedding): its
        # value is read only if it has no kernel
        self.quantized = weight.reparameterization if getattr(weight.reparameterization, "MULTIPLIES", False) else None
        self.tied = head is None
        self.quantized_param = weight
        self.weight = self.bias = None
        bias = head.bias.val() if head is not None and getattr(head, "bias", None) is not None else None
        if self.quantized is not None and bias is None:
            return
        self.quantized = None
        value = weight.val()
        stored = _raw.array(value)
        if isinstance(stored, np.ndarray):
            self.weight = stored if head is not None else stored.T
            if bias is not None:
                self.bias = _raw.array(bias)
        elif stored.nbytes <= _HEAD_COPY_LIMIT:
            host = value.numpy()
            self.weight = host if head is not None else np.ascontiguousarray(host.T)
            if bias is not None:
                self.bias = bias.numpy()

    def __call__(self, ids, mask, cache, positions=None) -> np.ndarray:
        if self.quantized is not None:
            h = self.model.hidden_states(ids, mask, cache, positions)
            last = h.narrow(1, h.shape[1] - 1, 1)
            out = self.quantized.matmul(last, self.tied)
            if out is None:  # no kernel for its type: its dequantized value, each call
                value = self.quantized_param.val()
                out = last @ (value.transpose() if self.tied else value)
            return self._capped(out.numpy()[:, 0, :])
        if self.weight is None:
            return self.model.forward(ids, attention_mask=mask, cache=cache, position_ids=positions).numpy()[:, -1, :]
        h = self.model.hidden_states(ids, mask, cache, positions)
        last = h.narrow(1, h.shape[1] - 1, 1).numpy()[:, 0, :]
        w = self.weight if self.weight.dtype == last.dtype else self.weight.astype(last.dtype)
        out = cpu.matmul(last, w)
        out = out if self.bias is None else out + self.bias
        return self._capped(out)

    def _capped(self, out):
        cap = getattr(self.model.config, "final_logit_softcapping", None)  # Gemma 2: forward's tanh(x / c) * c
        return out if cap is None else np.tanh(out / cap) * cap


def _encode(tokenizer, text: str) -> list[int]:
    out = tokenizer.encode(text)
    ids = getattr(out, "ids", out)  # a tokenizers.Encoding, or a list of ids
    return [int(i) for i in ids]


def _decode(tokenizer, ids) -> str | None:
    if tokenizer is None:
        return None
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def _token_id(tokenizer, text: str):
    for obj in (tokenizer, getattr(tokenizer, "tokenizer", None)):
        fn = getattr(obj, "token_to_id", None)
        if fn is not None:
            return fn(text)
    return None


def _prompt_rows(tokenizer, prompt, vocab: int) -> tuple[list[list[int]], bool]:
    """The prompt's rows of ids and whether it was a batch."""
    if isinstance(prompt, Tensor):
        prompt = prompt.numpy()
    if isinstance(prompt, np.ndarray):
        if prompt.dtype.kind not in "iu" or prompt.ndim not in (1, 2):
            raise GenerationError(f"generate: expected a prompt of int token ids [seq] or [batch, seq], found an array "
                                  f"of {prompt.dtype} dims {list(prompt.shape)}")
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        items, batched = [prompt], False
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, (int, np.integer)) for p in prompt):
        items, batched = [list(prompt)], False
    elif isinstance(prompt, (list, tuple)) and prompt:
        items, batched = list(prompt), True
    else:
        raise GenerationError(f"generate: the prompt is empty (expected text, a list of texts or token ids, found "
                              f"{prompt!r})")
    rows = []
    for r, item in enumerate(items):
        where = f"prompt {r}" if batched else "the prompt"
        if isinstance(item, str):
            if not item:
                raise GenerationError(f"generate: {where} is empty text (expected at least one character)")
            if tokenizer is None:
                raise GenerationError(f"generate: {where} is text, but no tokenizer was given to encode it")
            ids = _encode(tokenizer, item)
        elif isinstance(item, (list, tuple, np.ndarray)):
            ids = list(item)
            if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in ids):
                raise GenerationError(f"generate: {where}: expected int token ids, found {ids!r}")
            ids = [int(i) for i in ids]
        else:
            raise GenerationError(f"generate: {where}: expected text or a list of token ids, found "
                                  f"{type(item).__name__}")
        if not ids:
            raise GenerationError(f"generate: {where} has no tokens (expected at least one)")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise GenerationError(f"generate: {where} holds token id {bad[0]}, outside the model's vocabulary "
                                  f"0..{vocab - 1} (a tokenizer for another model?)")
        rows.append(ids)
    return rows, batched


def _check_settings(max_new_tokens, temperature, top_k, top_p, repetition_penalty=1.0):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise GenerationError(f"generate: max_new_tokens must be a positive int, found {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise GenerationError(f"generate: temperature must be a number >= 0 (0: greedy), found {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise GenerationError(f"generate: top_k must be a positive int or None, found {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise GenerationError(f"generate: top_p must be a number in (0, 1] or None, found {top_p!r}")
    if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, (int, float)) \
            or not 0 < repetition_penalty < float("inf"):
        raise GenerationError(f"generate: repetition_penalty must be a number > 0 (1: off), found "
                              f"{repetition_penalty!r}")


def _stops(tokenizer, stop, eos: list[int]) -> tuple[set[int], list[str]]:
    """The stop ids (`eos`, the `stop` ids and the stop strings that are one token) and the stop
    strings that are not one token."""
    ids: set[int] = {int(e) for e in eos}
    texts: list[str] = []
    if stop is None:
        stop = []
    elif isinstance(stop, (str, int, np.integer)):
        stop = [stop]
    for s in stop:
        if isinstance(s, (int, np.integer)) and not isinstance(s, bool):
            ids.add(int(s))
        elif isinstance(s, str) and s:
            tid = _token_id(tokenizer, s) if tokenizer is not None else None
            if tid is not None:
                ids.add(int(tid))
            elif tokenizer is None:
                raise GenerationError(f"generate: the stop string {s!r} needs a tokenizer")
            else:
                texts.append(s)
        else:
            raise GenerationError(f"generate: a stop entry must be a token id or a non-empty string, found {s!r}")
    return ids, texts


# ---------------------------------------------------------------------------------- the loop
class GenerationStream:
    """An iterator of `GeneratedToken`s (made by `stream`); `result` is the `GenerationResult`
    once the iteration has ended (also when the consumer stops early: then call `close()`)."""

    def __init__(self, model, tokenizer, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None,
                 stop=None, cancel=None, use_cache=True, decode_stream=True, repetition_penalty=1.0,
                 eos_token_id=None):
        _check_settings(max_new_tokens, temperature, top_k, top_p, repetition_penalty)
        n_layers, n_positions, vocab = _model_facts(model)
        own = generation_config(model)
        if eos_token_id is not None:  # the caller's replace the model's, as in transformers
            given = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else eos_token_id
            eos = _token_ids(given, "eos_token_id", "generate")
        else:  # the model's; the tokenizer's where the model names none (a model made in code)
            tok_eos = getattr(tokenizer, "eos_id", None)
            eos = own["eos_token_id"] or ([int(tok_eos)] if tok_eos is not None else [])
        rows, self._batched = _prompt_rows(tokenizer, prompt, vocab)
        width = max(len(r) for r in rows)
        if width > n_positions:
            raise GenerationError(f"generate: the prompt has {width} tokens, longer than the model's {n_positions} "
                                  f"positions")
        if width + max_new_tokens > n_positions:
            raise GenerationError(f"generate: max_new_tokens {max_new_tokens} would pass the model's {n_positions} "
                                  f"positions after the prompt's {width} tokens: at most {n_positions - width} new tokens")
        self._stop_ids, self._stop_texts = _stops(tokenizer, stop, eos)
        # a model that cannot fit is refused before a weight is read (NotEnoughMemory)
        estimate_generation(model, len(rows), width, max_new_tokens, use_cache).check()
        if cancel is not None and hasattr(cancel, "is_set"):
            cancel = cancel.is_set
        self._cancel = cancel
        self._model, self._tokenizer = model, tokenizer
        self._rows, self._width, self._n_layers = rows, width, n_layers
        self._max_new = int(max_new_tokens)
        self._greedy = temperature == 0
        self._temperature, self._top_k, self._top_p = float(temperature), top_k, top_p
        self._penalty = float(repetition_penalty)
        self._rng = np.random.default_rng(seed)
        self._use_cache = use_cache
        self._decode_stream = decode_stream and tokenizer is not None
        # what fills a shorter row's left and a finished row's next input: never read (masked, or the row's
        # result is frozen), but the embedding looks it up, so it must be a token of the vocabulary:
        # transformers' pad (the model's pad_token_id, else its first eos), else the tokenizer's, else 0
        candidates = [own["pad_token_id"], *eos, getattr(tokenizer, "pad_id", None), 0]
        self._pad = next(int(c) for c in candidates if c is not None and 0 <= int(c) < vocab)
        self.result: GenerationResult | None = None
        self._it = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> GeneratedToken:
        return next(self._it)

    def close(self) -> None:
        """End the generation now (the result keeps the tokens so far)."""
        self._it.close()
        if self.result is None:
            self._finish(["cancelled" if r is None else r for r in self._reasons])

    def _choose(self, logits: np.ndarray) -> list[int]:
        if self._penalty != 1.0:
            logits = penalize_repetition(logits, [r + n for r, n in zip(self._rows, self._new)], self._penalty)
        if self._greedy:
            return [int(i) for i in np.argmax(logits, axis=-1)]
        warped = warp_logits(logits, self._temperature, self._top_k, self._top_p)
        return [_draw(row, self._rng) for row in warped]

    def _finish(self, reasons):
        texts = [_decode(self._tokenizer, ids) for ids in self._new]
        self.result = GenerationResult(self._new, texts, [list(r) for r in self._rows], list(reasons), self._batched,
                                       sum(len(n) for n in self._new), time.perf_counter() - self._t0)

    def _run(self):
        self._t0 = time.perf_counter()
        rows, width, b = self._rows, self._width, len(self._rows)
        self._new = [[] for _ in range(b)]
        self._reasons = [None] * b
        decoded = [""] * b
        padded = any(len(r) < width for r in rows)
        ids = np.full((b, width), self._pad, dtype=np.int64)
        mask = np.zeros((b, width + self._max_new), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
        mask[:, width:] = 1
        model = _inference_model(self._model)
        # a padded row's rotary positions count from its first real token, as transformers' generate
        # numbers them (GPT-2 numbers its learned positions from the first column, as its forward does)
        pos = None
        if padded and hasattr(model, "rotary_emb"):
            pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        recompute = getattr(model, "cache_recompute_length", None)
        with no_recording():
            head = _Head(model)
            cache = nn.KVCache.layers(self._n_layers, capacity=width + self._max_new) if self._use_cache else None
            seq = ids
            last = head(Tensor.from_data(ids), mask[:, :width] if padded else None, cache,
                        None if pos is None else pos[:, :width])
        for step in range(self._max_new):
            if self._cancel is not None and self._cancel():
                self._reasons = ["cancelled" if r is None else r for r in self._reasons]
                break
            chosen = self._choose(last)
            out = []
            for i, t in enumerate(chosen):
                if self._reasons[i] is not None:
                    chosen[i] = self._pad  # a finished row is fed padding, its result frozen
                    continue
                self._new[i].append(t)
                text = ""
                if self._decode_stream or self._stop_texts:
                    full = _decode(self._tokenizer, self._new[i])
                    if not full.endswith("\ufffd"):  # an incomplete character waits for its next bytes
                        text = full[len(decoded[i]):] if full.startswith(decoded[i]) else full
                        decoded[i] = full
                if t in self._stop_ids or any(s in decoded[i] for s in self._stop_texts):
                    self._reasons[i] = "stop"
                elif step == self._max_new - 1:
                    self._reasons[i] = "length"
                out.append(GeneratedToken(i, step, t, text))
            yield from out
            if all(r is not None for r in self._reasons):
                break
            nxt = np.asarray(chosen, dtype=np.int64).reshape(b, 1)
            n = width + step + 1
            with no_recording():
                seq = np.concatenate([seq, nxt], axis=1)
                if cache is not None and n == recompute and width < n:
                    for c in cache:  # transformers' Phi-3: the cache is rebuilt once the sequence passes the
                        c.reset()    # original length, every key then rotated with longrope's long factors
                    last = head(Tensor.from_data(seq), mask[:, :n] if padded else None, cache,
                                None if pos is None else pos[:, :n])
                elif cache is not None:
                    last = head(Tensor.from_data(nxt), mask[:, :n] if padded else None, cache,
                                None if pos is None else pos[:, n - 1:n])
                else:
                    last = head(Tensor.from_data(seq), mask[:, :n] if padded else None, None,
                                None if pos is None else pos[:, :n])
        self._finish(self._reasons)


def stream(model, tokenizer, prompt, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, seed: int | None = None, stop=None, cancel=None,
           use_cache: bool = True, repetition_penalty: float = 1.0, eos_token_id=None) -> GenerationStream:
    """`generate`, one `GeneratedToken` at a time: iterate it (on a worker thread in an app); its
    `result` is set once the iteration ends. Settings are checked when it is made."""
    return GenerationStream(model, tokenizer, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, cancel,
                            use_cache, repetition_penalty=repetition_penalty, eos_token_id=eos_token_id)


def generate(model, tokenizer, prompt, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, stop=None, on_token=None, cancel=None,
             use_cache: bool = True, repetition_penalty: float = 1.0, eos_token_id=None) -> GenerationResult:
    """Continue `prompt` by up to `max_new_tokens` tokens (see the module docstring).

    - `tokenizer`: a `tokenizers.Tokenizer` or `engine.train.text.TextTokenizer` (anything with
      `encode(text)` and `decode(ids, skip_special_tokens=True)`); None for a prompt of ids
      (then the result has ids and no text).
    - `prompt`: text, a list of texts (one left-padded batch), token ids, or a list of rows of ids.
    - `temperature` 0: greedy; `top_k`, `top_p`, `seed`: sampling as transformers does it.
    - `repetition_penalty`: > 1 makes tokens already in the row less likely (transformers' rule); 1: off.
    - `eos_token_id`: the stop token(s) instead of the model's own (`generation_config(model)`);
      `[]`: none. `stop`: token ids and strings to stop at, besides them.
    - `on_token(GeneratedToken)`: called for each new token (streaming); `cancel()`: checked
      before each step, true ends the generation (finish reason "cancelled").
    - `use_cache=False` recomputes the whole sequence every step (a reference for the cache;
      it numbers a padded GPT-2 row's positions from the first column, as `forward` does).

    Raises `GenerationError` for an empty prompt, a prompt longer than the model's positions,
    `max_new_tokens` that would pass them (the message gives the limit) and bad settings, and
    `engine.module.memory.NotEnoughMemory` (before anything is read) when `estimate_generation`
    says the weights, the cache and the working arrays would not fit in the memory available.
    """
    s = GenerationStream(model, tokenizer, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, cancel,
                         use_cache, decode_stream=on_token is not None, repetition_penalty=repetition_penalty,
                         eos_token_id=eos_token_id)
    for token in s:
        if on_token is not None:
            on_token(token)
    return s.result


class _GenerateModule(types.ModuleType):
    """This module, callable as `generate`: importing `engine.models.generate` (for `stream` or
    `GenerationError`) makes Python set the package's attribute `generate` to the module, so a
    later `from engine.models import generate` would otherwise get the module, not the function."""

    def __call__(self, *args, **kwargs) -> GenerationResult:
        return generate(*args, **kwargs)


sys.modules[__name__].__class__ = _GenerateModule
