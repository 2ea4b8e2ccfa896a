"""GPT-2 (`GPT2LMHeadModel`) from `engine.nn` layers, and its Hugging Face family.

    GPT2LMHeadModel {wte, wpe, drop, h: [GPT2Block {ln_1, attn, ln_2, mlp}], ln_f, lm_head}

Token and learned position embeddings, pre-norm blocks (`x + attn(ln_1(x))`, `x + mlp(ln_2(x))`)
with causal multi-head attention (`nn.MultiHeadAttention`: `query`, `key`, `value`, `output`), an
MLP `c_fc` -> activation (`gelu_new`: Gelu's tanh approximation) -> `c_proj`, a final `ln_f` and
the language-model head. With `tie_word_embeddings` (GPT-2's default) the head is the token
embedding transposed: one parameter (`wte.weight`, one ParamId) used twice, and `lm_head` is None.

Hugging Face stores GPT-2's projections as `Conv1D`, already `[in, out]` (Ember's Linear layout):
nothing is transposed. `attn.c_attn` fuses query, key and value (`[d, 3d]`), split on loading and
concatenated again on saving (`mapping.Split`). The `attn.bias` / `attn.masked_bias` buffers of
older files are ignored.

`forward(input_ids, attention_mask=None)`: int `[batch, seq]` (and 1 = real token, 0 = padding,
as transformers) -> logits `[batch, seq, vocab]`. The model is built in training mode like every
Ember module, so its dropout layers (`embd_pdrop`, `attn_pdrop`, `resid_pdrop`) are active on
autodiff inputs; `model.valid()` is the inference model (transformers' `eval()`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..module import Module
from ..module import init as initializers
from ..tensor import Tensor
from .hf_folder import MAX_SIZE, PretrainedError
from .mapping import Rule, Split, Transpose, WeightMap
from .pretrained import Family, layer_range

__all__ = ["FAMILY", "GPT2Block", "GPT2Config", "GPT2LMHeadModel", "GPT2MLP"]

# scores of masked positions (transformers fills them with the dtype's lowest value; any value this low
# gives them a softmax weight of exactly 0 in float32, and displays readably)
MASKED = -1.0e9


# ---------------------------------------------------------------------------------- config.json
_REQUIRED = object()


class ConfigReader:
    """Typed reads of `config.json` keys; every fault is a `PretrainedError` naming the key.

    Shared by the GPT-2, BERT and ViT families (`engine.models.bert`, `engine.models.vit`).
    """

    def __init__(self, raw: dict, family: str):
        if not isinstance(raw, dict):
            raise PretrainedError(f"config.json must hold a JSON object, found {type(raw).__name__}",
                                  where="config.json")
        self.raw = raw
        self.family = family

    def fail(self, key: str, message: str):
        raise PretrainedError(f"{self.family} config key '{key}': {message}", where="config.json")

    def _get(self, key, default):
        if key in self.raw and self.raw[key] is not None:
            return self.raw[key]
        if default is _REQUIRED:
            self.fail(key, "missing (a required size of the model)")
        return default

    def int(self, key: str, default=_REQUIRED, minimum: int = 1) -> int:
        v = self._get(key, default)
        if v is default and default is not _REQUIRED:
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(key, f"expected an int >= {minimum}, found {v!r}")
        if v > MAX_SIZE:
            self.fail(key, f"{v} is beyond any model (a size is at most {MAX_SIZE})")
        return int(v)

    def float(self, key: str, default=_REQUIRED, minimum: float = 0.0, maximum: float = math.inf) -> float:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (minimum <= v <= maximum):
            self.fail(key, f"expected a number in [{minimum:g}, {maximum:g}], found {v!r}")
        return float(v)

    def bool(self, key: str, default) -> bool:
        v = self._get(key, default)
        if not isinstance(v, bool):
            self.fail(key, f"expected true or false, found {v!r}")
        return v

    def choice(self, key: str, default, choices) -> str:
        v = self._get(key, default)
        if v not in choices:
            self.fail(key, f"{v!r} is not supported; supported: {', '.join(repr(c) for c in choices)}")
        return v

    def refuse(self, key: str, supported, meaning: str) -> None:
        """A setting Ember does not implement: refused unless absent or `supported`."""
        v = self.raw.get(key)
        if v is not None and v != supported:
            self.fail(key, f"{v!r} ({meaning}) is not supported by Ember's implementation; "
                           f"supported: {json_text(supported)}")

    def token_id(self, key: str):
        v = self.raw.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            self.fail(key, f"expected a token id (an int >= 0) or null, found {v!r}")
        return v

    def divides(self, size_key: str, size: int, heads_key: str, heads: int) -> None:
        if size % heads:
            self.fail(size_key, f"{size} is not divisible by {heads_key} {heads}")


def json_text(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    return repr(v)


# activation names of transformers' ACT2FN that Ember has
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu", "silu", "swish", "tanh")


def activation(name: str) -> Module:
    """The Ember activation for a transformers activation name (`hidden_act`, `activation_function`)."""
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return nn.Gelu.tanh_approximate()
    return {"gelu": nn.Gelu, "relu": nn.Relu, "silu": nn.SiLU, "swish": nn.SiLU, "tanh": nn.Tanh}[name]()


def attention_masks(attention_mask, batch: int, seq: int, device):
    """The padding mask (true at padding keys, `[batch, seq]`) of transformers' `attention_mask`
    (1 = real token, 0 = padding; int or bool), or None."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        attention_mask = Tensor.from_data(np.asarray(attention_mask), device=device)
    if tuple(attention_mask.shape) != (batch, seq):
        raise ValueError(f"attention_mask: expected dims [{batch}, {seq}] (the input ids' dims), found "
                         f"{list(attention_mask.shape)}")
    if attention_mask.kind == "bool":
        return attention_mask.bool_not()
    if attention_mask.kind != "int":
        raise ValueError(f"attention_mask: expected an int or bool tensor (1 = token, 0 = padding), found "
                         f"{attention_mask.dtype}")
    return attention_mask.eq(0)


def check_ids(input_ids, name: str = "input_ids") -> Tensor:
    if not isinstance(input_ids, Tensor):
        input_ids = Tensor.from_data(np.asarray(input_ids))
    if input_ids.rank != 2 or input_ids.kind != "int":
        raise ValueError(f"{name}: expected an int tensor [batch, seq], found {input_ids.dtype} dims "
                         f"{list(input_ids.shape)}")
    return input_ids


@dataclass(frozen=True)
class GPT2Config:
    """The settings of `GPT2LMHeadModel` that `config.json` holds (transformers' names)."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int | None = None             # None: 4 * n_embd
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    tie_word_embeddings: bool = True
    reorder_and_upcast_attn: bool = False  # the same values in float32 (an fp16 safeguard)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # the wrapper prefix of the stored names: transformers writes "transformer.h.0...", the files
    # of the original GPT-2 release have none ("h.0...")
    prefix: str = "transformer."

    @property
    def d_inner(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @staticmethod
    def from_json(raw: dict) -> "GPT2Config":
        r = ConfigReader(raw, "GPT-2")
        r.refuse("scale_attn_weights", True, "attention scores not scaled by 1/sqrt(head_dim)")
        r.refuse("scale_attn_by_inverse_layer_idx", False, "scores scaled by 1/(layer index + 1)")
        r.refuse("add_cross_attention", False, "cross-attention blocks of an encoder-decoder")
        n_embd, n_head = r.int("n_embd"), r.int("n_head")
        r.divides("n_embd", n_embd, "n_head", n_head)
        return GPT2Config(
            vocab_size=r.int("vocab_size"), n_positions=r.int("n_positions"), n_embd=n_embd,
            n_layer=r.int("n_layer"), n_head=n_head, n_inner=r.int("n_inner", None),
            activation_function=r.choice("activation_function", "gelu_new", _ACTIVATIONS),
            layer_norm_epsilon=r.float("layer_norm_epsilon", 1e-5),
            resid_pdrop=r.float("resid_pdrop", 0.1, maximum=1.0), embd_pdrop=r.float("embd_pdrop", 0.1, maximum=1.0),
            attn_pdrop=r.float("attn_pdrop", 0.1, maximum=1.0),
            tie_word_embeddings=r.bool("tie_word_embeddings", True),
            reorder_and_upcast_attn=r.bool("reorder_and_upcast_attn", False),
            bos_token_id=r.token_id("bos_token_id"), eos_token_id=r.token_id("eos_token_id"),
        )

    def to_json(self) -> dict:
        out = {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": self.vocab_size, "n_positions": self.n_positions, "n_embd": self.n_embd,
            "n_layer": self.n_layer, "n_head": self.n_head, "n_inner": self.n_inner,
            "activation_function": self.activation_function, "layer_norm_epsilon": self.layer_norm_epsilon,
            "resid_pdrop": self.resid_pdrop, "embd_pdrop": self.embd_pdrop, "attn_pdrop": self.attn_pdrop,
            "tie_word_embeddings": self.tie_word_embeddings, "reorder_and_upcast_attn": self.reorder_and_upcast_attn,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
        }
        for key in ("bos_token_id", "eos_token_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


# ---------------------------------------------------------------------------------- the model
class GPT2MLP(Module):
    """`c_proj(act(c_fc(x)))`, dropout after (transformers' `GPT2MLP`)."""

    def __init__(self, c_fc, act, c_proj, dropout):
        self.c_fc = c_fc
        self.act = act
        self.c_proj = c_proj
        self.dropout = dropout

    def forward(self, x):
        return self.dropout.forward(self.c_proj.forward(self.act.forward(self.c_fc.forward(x))))


class GPT2Block(Module):
    """Pre-norm block: `x + drop(attn(ln_1(x)))`, then `x + mlp(ln_2(x))`."""

    def __init__(self, ln_1, attn, resid_dropout, ln_2, mlp):
        self.ln_1 = ln_1
        self.attn = attn
        self.resid_dropout = resid_dropout
        self.ln_2 = ln_2
        self.mlp = mlp

    def forward(self, x, mask_pad, mask_attn, cache=None):
        inp = nn.MhaInput.self_attn(self.ln_1.forward(x)).mask_attn(mask_attn)
        if mask_pad is not None:
            inp = inp.mask_pad(mask_pad)
        x = x + self.resid_dropout.forward(self.attn.forward(inp, cache=cache).context)
        return x + self.mlp.forward(self.ln_2.forward(x))


class GPT2LMHeadModel(Module):
    """GPT-2 with its language-model head (see the module docstring). `config` is its GPT2Config."""

    def __init__(self, config: GPT2Config, device=None):
        c = config
        d = c.n_embd
        self.wte = nn.EmbeddingConfig(c.vocab_size, d, initializer=initializers.Normal(0.0, 0.02)).init(device)
        self.wpe = nn.EmbeddingConfig(c.n_positions, d, initializer=initializers.Normal(0.0, 0.01)).init(device)
        self.drop = nn.DropoutConfig(c.embd_pdrop).init()
        self.h = [_block(c, device) for _ in layer_range(c.n_layer)]
        self.ln_f = nn.LayerNormConfig(d, epsilon=c.layer_norm_epsilon).init(device)
        self.lm_head = None if c.tie_word_embeddings else nn.LinearConfig(d, c.vocab_size, bias=False).init(device)
        self._config = c

    @property
    def config(self) -> GPT2Config:
        return self._config

    def hidden_states(self, input_ids, attention_mask=None, cache=None, position_ids=None,
                      segment_ids=None) -> Tensor:
        """The last block's output after `ln_f`: `[batch, seq, n_embd]` (the arguments: see `forward`)."""
        ids = check_ids(input_ids)
        batch, seq = ids.shape
        n_positions = self.wpe.weight.shape[0]
        if cache is None:
            if seq > n_positions:
                raise ValueError(f"input_ids: {seq} tokens, but this GPT-2 has {n_positions} positions (n_positions)")
            positions = Tensor.arange(seq, device=ids.device).reshape(1, seq)
            mask_pad = attention_masks(attention_mask, batch, seq, ids.device)
            causal = nn.generate_autoregressive_mask(batch, seq, device=ids.device)
            if segment_ids is not None or position_ids is not None:
                positions, causal = _packed(ids, causal, position_ids, segment_ids)
            blocks = [(block, None) for block in self.h]
        else:
            cache = list(cache)
            if segment_ids is not None or position_ids is not None:
                raise ValueError("GPT2LMHeadModel: position_ids / segment_ids are for training on packed sequences, "
                                 "not with a cache")
            if len(cache) != len(self.h):
                raise ValueError(f"cache: expected one nn.KVCache per block ({len(self.h)}), found {len(cache)}")
            lengths = {c.length for c in cache}
            if len(lengths) != 1:
                raise ValueError(f"cache: the blocks' caches hold different lengths {sorted(lengths)}")
            past = lengths.pop()
            if past + seq > n_positions:
                raise ValueError(f"input_ids: {seq} tokens after {past} cached ones, but this GPT-2 has {n_positions} "
                                 f"positions (n_positions)")
            mask_pad = attention_masks(attention_mask, batch, past + seq, ids.device)
            if attention_mask is None:
                positions = Tensor.arange(past, past + seq, device=ids.device).reshape(1, seq)
            else:  # transformers' generate: a row's positions count its real tokens (left padding)
                real = np.asarray(attention_mask.numpy() if isinstance(attention_mask, Tensor) else attention_mask) != 0
                pos = np.where(real, np.cumsum(real, axis=1) - 1, 0)[:, past:]
                positions = Tensor.from_data(pos.astype(np.int64), device=ids.device)
            m = np.triu(np.ones((seq, past + seq), dtype=bool), k=1 + past)
            causal = Tensor.from_data(np.broadcast_to(m, (batch, seq, past + seq)).copy(), device=ids.device)
            blocks = list(zip(self.h, cache))
        x = self.drop.forward(self.wte.forward(ids) + self.wpe.forward(positions))
        for block, block_cache in blocks:
            x = block.forward(x, mask_pad, causal, block_cache)
        return self.ln_f.forward(x)

    def forward(self, input_ids, attention_mask=None, cache=None, position_ids=None, segment_ids=None) -> Tensor:
        """Logits `[batch, seq, vocab_size]` of int `input_ids` `[batch, seq]`; `attention_mask`
        `[batch, seq]` (1 = token, 0 = padding) hides padding keys.

        `cache` (optional, generation): a list of `nn.KVCache`, one per block
        (`nn.KVCache.layers(len(model.h))`), holding the keys and values of the positions fed so
        far. `input_ids` are then the next positions only, the caches grow by them, and
        `attention_mask`, when given, covers the cached positions and the new ones
        (`[batch, cache length + seq]`); with it a row's positions count its real tokens, as
        transformers' `generate` numbers a left-padded row.

        Packed sequences (training, no cache): `segment_ids` `[batch, seq]` confines each position's
        attention to its own sequence, `position_ids` `[batch, seq]` (default: restarting at 0 with
        each run of equal segment ids) index the position embeddings: each sequence's logits are
        those it has alone."""
        x = self.hidden_states(input_ids, attention_mask, cache, position_ids, segment_ids)
        if self.lm_head is None:
            return x.matmul(self.wte.weight.val().transpose())
        return self.lm_head.forward(x)


def _packed(ids, causal, position_ids, segment_ids):
    """(positions, mask) of packed sequences: the causal mask joined by the segments' block-diagonal one."""
    mask, pos = nn.packed_attention(ids.shape, position_ids, segment_ids, ids.device)
    if not isinstance(pos, Tensor):
        pos = Tensor.from_data(np.asarray(pos, dtype=np.int64), device=ids.device)
    return pos, (causal if mask is None else causal.bool_or(mask))


def _block(c: GPT2Config, device) -> GPT2Block:
    d = c.n_embd
    init = initializers.Normal(0.0, 0.02)
    attn = nn.MultiHeadAttentionConfig(d, c.n_head, dropout=c.attn_pdrop, min_float=MASKED,
                                       initializer=init).init(device)
    mlp = GPT2MLP(nn.LinearConfig(d, c.d_inner, initializer=init).init(device), activation(c.activation_function),
                  nn.LinearConfig(c.d_inner, d, initializer=init).init(device), nn.DropoutConfig(c.resid_pdrop).init())
    return GPT2Block(nn.LayerNormConfig(d, epsilon=c.layer_norm_epsilon).init(device), attn,
                     nn.DropoutConfig(c.resid_pdrop).init(), nn.LayerNormConfig(d, epsilon=c.layer_norm_epsilon).init(device),
                     mlp)


def build(config: GPT2Config, device=None) -> GPT2LMHeadModel:
    """The model with every parameter lazy (nothing allocated until used)."""
    return GPT2LMHeadModel(config, device)


def weight_map(config: GPT2Config) -> WeightMap:
    p = config.prefix
    rules = [Rule(f"{p}wte.weight", "wte.weight"), Rule(f"{p}wpe.weight", "wpe.weight")]
    for i, part in enumerate(("query", "key", "value")):
        rules += [
            Rule(f"{p}h.{{i}}.attn.c_attn.weight", f"h.{{i}}.attn.{part}.weight", [Split(axis=1, index=i, parts=3)]),
            Rule(f"{p}h.{{i}}.attn.c_attn.bias", f"h.{{i}}.attn.{part}.bias", [Split(axis=0, index=i, parts=3)]),
        ]
    # Conv1D weights are stored [in, out], as Ember's Linear: no transpose
    for hf, ember in (("attn.c_proj", "attn.output"), ("mlp.c_fc", "mlp.c_fc"), ("mlp.c_proj", "mlp.c_proj")):
        rules += [Rule(f"{p}h.{{i}}.{hf}.weight", f"h.{{i}}.{ember}.weight"),
                  Rule(f"{p}h.{{i}}.{hf}.bias", f"h.{{i}}.{ember}.bias")]
    for norm in ("ln_1", "ln_2"):
        rules += [Rule(f"{p}h.{{i}}.{norm}.weight", f"h.{{i}}.{norm}.gamma"),
                  Rule(f"{p}h.{{i}}.{norm}.bias", f"h.{{i}}.{norm}.beta")]
    rules += [Rule(f"{p}ln_f.weight", "ln_f.gamma"), Rule(f"{p}ln_f.bias", "ln_f.beta")]
    ignore = [r"(^|\.)h\.[0-9]+\.attn\.(bias|masked_bias)\Z"]
    if config.tie_word_embeddings:
        ignore.append(r"\Alm_head\.weight\Z")  # a tied head some files still store: wte is the value
    else:
        rules.append(Rule("lm_head.weight", "lm_head.weight", [Transpose()]))  # torch nn.Linear [vocab, d]
    # the original openai-community/gpt2 files lack the "transformer." wrapper that transformers writes
    aliases = [(r"\A(?=(wte|wpe|h|ln_f)\.)", p)] if p else []
    return WeightMap(rules, ignore=ignore, aliases=aliases)


FAMILY = Family(
    name="gpt2",
    architectures=("GPT2LMHeadModel",),
    model_types=("gpt2",),
    config_from_json=GPT2Config.from_json,
    config_to_json=GPT2Config.to_json,
    build=build,
    weight_map=weight_map,
    layers=lambda cfg: ("n_layer", cfg.n_layer),
)
