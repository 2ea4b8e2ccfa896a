"""The Gemma families: `GemmaForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM` (text).

The Llama decoder (engine.models.llama) with Gemma's differences, each from `engine.nn` layers:

    GemmaForCausalLM / Gemma2ForCausalLM / Gemma3ForCausalLM
      embed_tokens             nn.Embedding; its output times sqrt(hidden_size), rounded to the model dtype
      rotary_emb               nn.RotaryEncoding (Gemma 3: of the global layers, `rope_theta`)
      rotary_emb_local         Gemma 3 only: of the sliding layers (`rope_local_base_freq`)
      layers.{i}
        input_layernorm        nn.RmsNorm with offset 1: `x / rms(x) * (1 + w)`
        self_attn              nn.MultiHeadAttention: Gemma 2/3 scale the scores by
                               `query_pre_attn_scalar ** -0.5`; Gemma 2 soft-caps them
                               (`attn_logit_softcapping`); Gemma 3 has `q_norm` / `k_norm`;
                               "sliding_attention" layers attend within `sliding_window`
        post_attention_layernorm nn.RmsNorm (offset 1)
        pre_feedforward_layernorm, post_feedforward_layernorm  Gemma 2/3: the four norms
        mlp                    gate_proj, up_proj, down_proj, GELU's tanh approximation
      norm                     nn.RmsNorm (offset 1)
      lm_head                  tied to embed_tokens unless `tie_word_embeddings` is false;
                               Gemma 2 soft-caps the logits (`final_logit_softcapping`: tanh(x / c) * c)

Gemma 1 blocks: `h = x + attn(norm(x))`, `h + mlp(norm(h))`; Gemma 2/3 blocks normalise each
branch's output too: `h = x + post_attn_norm(attn(in_norm(x)))`, `h + post_ff_norm(mlp(pre_ff_norm(h)))`.
Every fact is transformers' modeling_gemma*.py (5.x).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..module import Module
from ..tensor import Tensor
from .hf_folder import PretrainedError
from .llama import LlamaForCausalLM, LlamaMlp, _bool, _number, _positive_int, weight_map as _llama_weight_map
from .mapping import RopePermute, Rule, WeightMap
from .pretrained import Family, decoder_family, layer_range
from .rope import check_rope_scaling, rope_length, rope_scaling

__all__ = ["GemmaConfig", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GemmaDecoderLayer",
           "FAMILIES"]

_WHERE = "config.json"
_ARCHITECTURE = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# transformers' defaults for what a config.json leaves out
_DEFAULTS = {
    "gemma": dict(max_position_embeddings=8192, sliding_window=None, query_pre_attn_scalar=None,
                  attn_logit_softcapping=None, final_logit_softcapping=None, pattern=None),
    "gemma2": dict(max_position_embeddings=8192, sliding_window=4096, query_pre_attn_scalar=256,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, pattern=2),
    "gemma3_text": dict(max_position_embeddings=131072, sliding_window=4096, query_pre_attn_scalar=256,
                        attn_logit_softcapping=None, final_logit_softcapping=None, pattern=6),
}
_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
_KINDS = ("sliding_attention", "full_attention")


@dataclass
class GemmaConfig:
    """The settings of a Gemma-family model, as `config.json` names them (`model_type` "gemma",
    "gemma2" or "gemma3_text"). `query_pre_attn_scalar` None: the scores' scale is
    `head_dim ** -0.5`. `layer_types` says which layers are "sliding_attention" (Gemma 2: every
    other one from the first; Gemma 3: five of each six). `rope_local_theta` is Gemma 3's base of
    the sliding layers; `rope_scaling` applies to the global ones."""

    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_local_theta: float | None = None
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    hidden_activation: str = "gelu_pytorch_tanh"
    query_pre_attn_scalar: float | None = None
    sliding_window: int | None = None
    layer_types: list | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    model_type: str = "gemma"

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads

    # the names LlamaMlp and the llama weight map read
    mlp_bias = False

    @property
    def output_bias(self) -> bool:
        return self.attention_bias

    @property
    def architecture(self) -> str:
        return _ARCHITECTURE[self.model_type]

    @property
    def sandwich_norms(self) -> bool:
        """Gemma 2/3: four norms per layer."""
        return self.model_type != "gemma"

    def layer_window(self, i: int) -> int | None:
        if self.sliding_window is None or self.layer_types is None or self.layer_types[i] != "sliding_attention":
            return None
        return self.sliding_window

    def rope(self, local: bool = False) -> nn.RotaryEncodingConfig:
        if local:
            return nn.RotaryEncodingConfig(self.max_position_embeddings, self.head_dim, self.rope_local_theta)
        return nn.RotaryEncodingConfig(rope_length(self.rope_scaling, self.max_position_embeddings), self.head_dim,
                                       self.rope_theta, scaling=rope_scaling(self.rope_scaling, self.rope_theta,
                                                                             self.max_position_embeddings))

    # ------------------------------------------------------------------ config.json
    @classmethod
    def from_json(cls, data: dict, model_type: str) -> "GemmaConfig":
        if not isinstance(data, dict):
            raise PretrainedError(f"expected a JSON object, found {type(data).__name__}", where=_WHERE)
        mt = model_type
        if "text_config" in data or data.get("model_type") == "gemma3":
            raise PretrainedError("a Gemma 3 multimodal checkpoint (model_type 'gemma3', "
                                  "Gemma3ForConditionalGeneration) is not supported: expected a text model, "
                                  "Gemma3ForCausalLM (model_type 'gemma3_text')", where=_WHERE)
        defaults = _DEFAULTS[mt]
        for key in _REQUIRED:
            if key not in data:
                raise PretrainedError(f"missing key {key!r} (a {_ARCHITECTURE[mt]} needs {', '.join(_REQUIRED)})",
                                      where=_WHERE)
        kw = {k: _positive_int(data, k) for k in _REQUIRED}
        heads = kw["num_attention_heads"]
        kw["num_key_value_heads"] = _positive_int(data, "num_key_value_heads", heads)
        kw["head_dim"] = _positive_int(data, "head_dim", 256)
        if heads % kw["num_key_value_heads"]:
            raise PretrainedError(f"'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' "
                                  f"({kw['num_key_value_heads']})", where=_WHERE)
        if kw["head_dim"] % 2:
            raise PretrainedError(f"'head_dim' must be even for the rotary encoding, found {kw['head_dim']}",
                                  where=_WHERE)
        act_key = "hidden_act" if mt == "gemma" else "hidden_activation"  # the key transformers' MLP reads
        act = data.get(act_key) or "gelu_pytorch_tanh"
        if mt == "gemma" and act == "gelu":  # transformers reads Gemma 1's legacy "gelu" as the tanh form
            act = "gelu_pytorch_tanh"
        if act not in _TANH:
            raise PretrainedError(f"{act_key!r} {act!r} is not supported: expected one of {', '.join(_TANH)}",
                                  where=_WHERE)
        kw["hidden_activation"] = act
        kw["rms_norm_eps"] = _number(data, "rms_norm_eps", 1e-6)
        kw["max_position_embeddings"] = _positive_int(data, "max_position_embeddings",
                                                      defaults["max_position_embeddings"])
        kw["tie_word_embeddings"] = _bool(data, "tie_word_embeddings", True)
        kw["attention_bias"] = _bool(data, "attention_bias", False)
        if data.get("use_bidirectional_attention"):
            raise PretrainedError("'use_bidirectional_attention' true (an encoder use of Gemma) is not supported: "
                                  "expected causal attention", where=_WHERE)
        # Gemma 1 has none of these; Gemma 3's attention takes no soft-cap (transformers ignores the key)
        keys = {"gemma": (), "gemma2": ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"),
                "gemma3_text": ("query_pre_attn_scalar", "final_logit_softcapping")}[mt]
        for key in keys:
            value = data.get(key, defaults[key])
            kw[key] = None if value is None else _number({key: value}, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                kw[key] = value  # transformers' config declares query_pre_attn_scalar an int
        kw.update(_rope(data, mt, kw["head_dim"], kw["max_position_embeddings"]))
        if mt != "gemma":
            window = data.get("sliding_window", defaults["sliding_window"])
            if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
                raise PretrainedError(f"'sliding_window' must be a positive int or null, found {window!r}",
                                      where=_WHERE)
            kw["sliding_window"] = window
            kw["layer_types"] = _layer_types(data, kw["num_hidden_layers"], defaults["pattern"])
        kw["model_type"] = mt
        return cls(**kw)

    def to_json(self) -> dict:
        """The config.json keys transformers needs to rebuild this model."""
        out = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
        }
        global_rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        if self.model_type == "gemma":
            out["hidden_act"] = self.hidden_activation
            out["rope_parameters"] = global_rope
            return out
        out.update(hidden_activation=self.hidden_activation, query_pre_attn_scalar=self.query_pre_attn_scalar,
                   sliding_window=self.sliding_window, layer_types=list(self.layer_types),
                   attn_logit_softcapping=self.attn_logit_softcapping,
                   final_logit_softcapping=self.final_logit_softcapping)
        if self.model_type == "gemma3_text":
            local = {"rope_type": "default", "rope_theta": self.rope_local_theta}
            out["rope_parameters"] = {"full_attention": global_rope, "sliding_attention": local}
        else:
            out["rope_parameters"] = global_rope
        return out


def _rope(data: dict, mt: str, head_dim: int, max_position_embeddings: int) -> dict:
    """rope_theta, rope_scaling (and Gemma 3's rope_local_theta) of a config.json, either layout:
    transformers 5's `rope_parameters` (Gemma 3: one per layer type) or 4's `rope_theta` /
    `rope_scaling` / `rope_local_base_freq`."""
    params = data.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise PretrainedError(f"'rope_parameters' must be an object, found {params!r}", where=_WHERE)
    params = dict(params or {})
    if mt == "gemma3_text":
        full = params.get("full_attention") or {}
        local = params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise PretrainedError(f"'rope_parameters' of Gemma 3 must hold objects per layer type, found {params!r}",
                                  where=_WHERE)
        theta = full.get("rope_theta", data.get("rope_theta", 1_000_000.0))
        local_theta = local.get("rope_theta", data.get("rope_local_base_freq", 10_000.0))
        if local.get("rope_type", "default") != "default":
            raise PretrainedError(f"Gemma 3's sliding layers' rope_type {local.get('rope_type')!r} is not "
                                  f"supported: expected 'default'", where=_WHERE)
        scaling = full if full.get("rope_type", "default") != "default" else data.get("rope_scaling")
    else:
        theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
        local_theta = None
        scaling = params if params.get("rope_type", "default") != "default" else data.get("rope_scaling")
    out = {"rope_theta": _number({"rope_theta": theta}, "rope_theta", None),
           "rope_scaling": check_rope_scaling(scaling, head_dim=head_dim, max_position_embeddings=max_position_embeddings,
                                              original_max_position_embeddings=data.get("original_max_position_embeddings"))}
    if local_theta is not None:
        out["rope_local_theta"] = _number({"rope_local_base_freq": local_theta}, "rope_local_base_freq", None)
    return out


def _layer_types(data: dict, n_layers: int, pattern: int) -> list:
    """Each layer's kind: `layer_types` as stored, else sliding except every `sliding_window_pattern`-th."""
    types = data.get("layer_types")
    if types is None:
        pattern = data.get("sliding_window_pattern", pattern)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise PretrainedError(f"'sliding_window_pattern' must be a positive int, found {pattern!r}", where=_WHERE)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in _KINDS for t in types):
        raise PretrainedError(f"'layer_types' must list {n_layers} of {_KINDS}, found {types!r}", where=_WHERE)
    return list(types)


# ---------------------------------------------------------------------------------- the model
class GemmaDecoderLayer(Module):
    """Gemma 1: `h = x + attn(in_norm(x))`, `h + mlp(post_attn_norm(h))`; Gemma 2/3 (four norms):
    `h = x + post_attn_norm(attn(in_norm(x)))`, `h + post_ff_norm(mlp(pre_ff_norm(h)))`."""

    def __init__(self, config: GemmaConfig, device=None, window: int | None = None):
        d = config.hidden_size
        norm = nn.RmsNormConfig(d, epsilon=config.rms_norm_eps, offset=1.0)
        scale = None if config.query_pre_attn_scalar is None else config.query_pre_attn_scalar ** -0.5
        qk_norm = (nn.RmsNormConfig(config.head_dim, epsilon=config.rms_norm_eps, offset=1.0)
                   if config.model_type == "gemma3_text" else None)
        self.input_layernorm = norm.init(device)
        self.self_attn = nn.MultiHeadAttentionConfig(
            d, config.num_attention_heads, dropout=0.0, n_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim, bias=config.attention_bias, causal=True, scale=scale,
            softcap=config.attn_logit_softcapping, window=window, qk_norm=qk_norm,
        ).init(device)
        self.post_attention_layernorm = norm.init(device)
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = norm.init(device)
            self.post_feedforward_layernorm = norm.init(device)
        self.mlp = LlamaMlp(config, device)
        self.mlp.act_fn = nn.GeluTanh()

    def forward(self, x, rotary, mask_pad=None, start: int | None = None, cache=None, mask_attn=None,
                positions=None):
        """The block (arguments as `LlamaDecoderLayer.forward`).

        # Shapes

        - x: `[batch_size, seq_length, d_model]`
        - output: `[batch_size, seq_length, d_model]`
        """
        attn_in = nn.MhaInput.self_attn(self.input_layernorm.forward(x))
        if mask_pad is not None:
            attn_in = attn_in.mask_pad(mask_pad)
        if mask_attn is not None:
            attn_in = attn_in.mask_attn(mask_attn)
        a = self.self_attn.forward(attn_in, rotary, start, cache, positions).context
        if not hasattr(self, "pre_feedforward_layernorm"):
            h = x + a
            return h + self.mlp.forward(self.post_attention_layernorm.forward(h))
        h = x + self.post_attention_layernorm.forward(a)
        return h + self.post_feedforward_layernorm.forward(self.mlp.forward(self.pre_feedforward_layernorm.forward(h)))


class GemmaForCausalLM(LlamaForCausalLM):
    """A Gemma-family causal language model (see the module docstring); `forward`, `hidden_states`
    and the cache are `LlamaForCausalLM`'s."""

    def __init__(self, config: GemmaConfig, device=None):
        self._config = config
        self.embed_tokens = nn.EmbeddingConfig(config.vocab_size, config.hidden_size).init(device)
        self.rotary_emb = config.rope().init(device)
        if config.rope_local_theta is not None:
            self.rotary_emb_local = config.rope(local=True).init(device)
        self.layers = [GemmaDecoderLayer(config, device, config.layer_window(i))
                       for i in layer_range(config.num_hidden_layers)]
        self.norm = nn.RmsNormConfig(config.hidden_size, epsilon=config.rms_norm_eps, offset=1.0).init(device)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.LinearConfig(config.hidden_size, config.vocab_size, bias=False).init(device))

    def forward(self, input_ids, attention_mask=None, cache=None, position_ids=None, segment_ids=None):
        """Next-token logits, soft-capped as `tanh(x / c) * c` where `final_logit_softcapping` is `c`
        (arguments as `LlamaForCausalLM.forward`).

        # Shapes

        - input_ids: `[batch_size, seq_length]`
        - output: `[batch_size, seq_length, vocab_size]`
        """
        logits = super().forward(input_ids, attention_mask, cache, position_ids, segment_ids)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else (logits * (1.0 / cap)).tanh() * cap

    def embed(self, input_ids) -> Tensor:
        """The embeddings times sqrt(hidden_size) rounded to the embeddings' dtype (transformers'
        `GemmaTextScaledWordEmbedding`)."""
        x = self.embed_tokens.forward(input_ids)
        scale = Tensor.from_data(np.asarray(math.sqrt(self.config.hidden_size), dtype=np.float32),
                                 device=x.device).cast(x.dtype)
        return x * scale

    def layer_rotary(self, i: int):
        if self.config.rope_local_theta is not None and self.config.layer_types[i] == "sliding_attention":
            return self.rotary_emb_local
        return self.rotary_emb


class Gemma2ForCausalLM(GemmaForCausalLM):
    """Gemma 2: four norms per layer, soft-capped attention scores and logits, alternating sliding / global layers."""


class Gemma3ForCausalLM(GemmaForCausalLM):
    """Gemma 3 (text): four norms, q/k norms, a rope base per layer kind, five sliding layers of each six."""


_CLASSES = {"gemma": GemmaForCausalLM, "gemma2": Gemma2ForCausalLM, "gemma3_text": Gemma3ForCausalLM}


def build(config: GemmaConfig, device=None) -> GemmaForCausalLM:
    """The model of `config`, every parameter lazy (nothing allocated)."""
    return _CLASSES[config.model_type](config, device)


# ---------------------------------------------------------------------------------- names
def weight_map(config: GemmaConfig) -> WeightMap:
    """Hugging Face names <-> Ember paths: Llama's, with Gemma 2/3's extra norms and Gemma 3's
    q/k norms (their weights permuted as the q/k rows are: Ember rotates interleaved pairs)."""
    base = _llama_weight_map(config)
    rules = list(base.rules)
    if config.sandwich_norms:
        rules += [Rule(f"model.layers.{{i}}.{n}.weight", f"layers.{{i}}.{n}.gamma")
                  for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm")]
    if config.model_type == "gemma3_text":
        rules += [Rule(f"model.layers.{{i}}.self_attn.{n}.weight", f"layers.{{i}}.self_attn.{n}.gamma",
                       [RopePermute(1, config.head_dim, axis=0)]) for n in ("q_norm", "k_norm")]
    return WeightMap(rules, ignore=[p.pattern for p in base.ignore])


def _family(name: str) -> Family:
    return decoder_family(name, _ARCHITECTURE[name], lambda data, _mt=name: GemmaConfig.from_json(data, _mt), build,
                          weight_map)


FAMILIES = [_family("gemma"), _family("gemma2"), _family("gemma3_text")]
