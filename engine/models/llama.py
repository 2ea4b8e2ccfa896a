"""The Llama family: `LlamaForCausalLM`, and `MistralForCausalLM` / `Qwen2ForCausalLM` on the same code.

A decoder-only causal language model built from `engine.nn` layers:

    LlamaForCausalLM
      embed_tokens             nn.Embedding [vocab_size, hidden_size]
      rotary_emb               nn.RotaryEncoding over head_dim (Llama-3 / linear frequency scaling)
      layers.{i}
        input_layernorm        nn.RmsNorm
        self_attn              nn.MultiHeadAttention (n_kv_heads, causal, the rotary passed in)
        post_attention_layernorm nn.RmsNorm
        mlp                    LlamaMlp: gate_proj, up_proj, down_proj (nn.Linear), SiLU
      norm                     nn.RmsNorm
      lm_head                  nn.Linear [hidden_size, vocab_size], or None when the head is tied to
                               `embed_tokens.weight` (one parameter, used transposed)

Parameter paths are Hugging Face's names less the `model.` prefix, with Ember's layer field names
(`layers.0.self_attn.query.weight` for `model.layers.0.self_attn.q_proj.weight`); `weight_map`
states the correspondence as data, with the rotary permutation of the q/k rows (and of Qwen2's q/k
biases): Ember rotates interleaved pairs, Hugging Face the two halves of each head.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import nn
from ..module import Module
from ..module.shape import assert_shape
from ..tensor import Tensor
from .hf_folder import MAX_SIZE, PretrainedError
from .mapping import RopePermute, Rule, Transpose, WeightMap
from .pretrained import Family, decoder_family, layer_range
from .rope import check_rope_scaling, rope_length, rope_scaling

__all__ = [
    "LlamaConfig", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "LlamaDecoderLayer", "LlamaMlp",
    "FAMILIES",
]

_WHERE = "config.json"

# the defaults transformers' config classes give a key a config.json leaves out
_FAMILY_DEFAULTS = {
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048, attention_bias=False,
                  attention_output_bias=None, mlp_bias=False, tie_word_embeddings=False, sliding_window=None),
    "mistral": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096 * 32,
                    attention_bias=False, attention_output_bias=None, mlp_bias=False, tie_word_embeddings=False,
                    sliding_window=4096),
    "qwen2": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768, attention_bias=True,
                  attention_output_bias=False, mlp_bias=False, tie_word_embeddings=False, sliding_window=None),
}
_ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass
class LlamaConfig:
    """The settings of a Llama-family model, as `config.json` names them.

    `num_key_value_heads` defaults to `num_attention_heads`, `head_dim` to
    `hidden_size // num_attention_heads`. `rope_scaling` is None or a dict with `rope_type`
    "linear", "llama3", "yarn", "dynamic" or "longrope" and its values (engine.models.rope).
    `attention_bias` is the bias of q/k/v (and of o_proj unless
    `attention_output_bias` says otherwise: Qwen2 has q/k/v biases and none on o_proj).
    `sliding_window` (Mistral; Qwen2 with `use_sliding_window`) is the attention window of the layers
    `layer_types` marks "sliding_attention" (None: every layer when there is a window; Qwen2's are the
    layers from `max_window_layers` on, as transformers numbers them).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_output_bias: bool | None = None
    mlp_bias: bool = False
    sliding_window: int | None = None
    model_type: str = "llama"
    layer_types: list | None = None

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    # ------------------------------------------------------------------ derived
    @property
    def architecture(self) -> str:
        return _ARCHITECTURE.get(self.model_type, "LlamaForCausalLM")

    def layer_window(self, i: int) -> int | None:
        """The attention window of layer `i` (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is not None and self.layer_types[i] != "sliding_attention":
            return None
        return self.sliding_window

    def qk_norm(self):
        """The per-head q/k norm before the rotary encoding (an `nn` norm config over head_dim), or
        None: none (Qwen3 has RMS norms there)."""
        return None

    @property
    def output_bias(self) -> bool:
        return self.attention_bias if self.attention_output_bias is None else self.attention_output_bias

    def rope(self) -> nn.RotaryEncodingConfig:
        """The rotary encoding over `head_dim`, with the frequency scaling of `rope_scaling`."""
        return nn.RotaryEncodingConfig(rope_length(self.rope_scaling, self.max_position_embeddings), self.head_dim,
                                       self.rope_theta, scaling=rope_scaling(self.rope_scaling, self.rope_theta,
                                                                             self.max_position_embeddings))

    # ------------------------------------------------------------------ config.json
    @classmethod
    def from_json(cls, data: dict, model_type: str | None = None) -> "LlamaConfig":
        """The config of a `config.json` object (transformers 4 or 5 layout).

        A missing required key, or a value of the wrong type, is a `PretrainedError` naming the key and
        config.json."""
        if not isinstance(data, dict):
            raise PretrainedError(f"expected a JSON object, found {type(data).__name__}", where=_WHERE)
        mt = model_type or data.get("model_type") or "llama"
        if mt not in _FAMILY_DEFAULTS:
            mt = "llama"
        defaults = _FAMILY_DEFAULTS[mt]
        for key in _REQUIRED:
            if key not in data:
                raise PretrainedError(f"missing key {key!r} (a {_ARCHITECTURE[mt]} needs {', '.join(_REQUIRED)})",
                                      where=_WHERE)
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise PretrainedError(f"'hidden_act' {act!r} is not supported: expected 'silu'", where=_WHERE)
        kw = {k: _positive_int(data, k) for k in _REQUIRED}
        heads = kw["num_attention_heads"]
        kw["num_key_value_heads"] = _positive_int(data, "num_key_value_heads", heads)
        kw["head_dim"] = _positive_int(data, "head_dim", kw["hidden_size"] // heads)
        if heads % kw["num_key_value_heads"]:
            raise PretrainedError(f"'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' "
                                  f"({kw['num_key_value_heads']})", where=_WHERE)
        if kw["head_dim"] % 2:
            raise PretrainedError(f"'head_dim' must be even for the rotary encoding, found {kw['head_dim']}",
                                  where=_WHERE)
        kw["rms_norm_eps"] = _number(data, "rms_norm_eps", defaults["rms_norm_eps"])
        kw["max_position_embeddings"] = _positive_int(data, "max_position_embeddings",
                                                      defaults["max_position_embeddings"])
        rope = data.get("rope_parameters")
        if rope is not None and not isinstance(rope, dict):
            raise PretrainedError(f"'rope_parameters' must be an object, found {rope!r}", where=_WHERE)
        rope = dict(rope or {})
        theta = rope.get("rope_theta", data.get("rope_theta", defaults["rope_theta"]))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise PretrainedError(f"'rope_theta' must be a positive number, found {theta!r}", where=_WHERE)
        kw["rope_theta"] = float(theta)
        scaling = rope if rope else data.get("rope_scaling")
        original = data.get("original_max_position_embeddings")
        if original is not None:
            original = _positive_int(data, "original_max_position_embeddings")
        kw["rope_scaling"] = check_rope_scaling(scaling, head_dim=kw["head_dim"],
                                                max_position_embeddings=kw["max_position_embeddings"],
                                                original_max_position_embeddings=original)
        kw["tie_word_embeddings"] = _bool(data, "tie_word_embeddings", defaults["tie_word_embeddings"])
        for key in ("attention_bias", "mlp_bias"):  # Mistral and Qwen2 fix their biases (transformers ignores the keys)
            kw[key] = _bool(data, key, defaults[key]) if mt == "llama" else defaults[key]
        kw["attention_output_bias"] = defaults["attention_output_bias"]
        window = data.get("sliding_window", defaults["sliding_window"])
        if mt == "qwen2" and not data.get("use_sliding_window", False):
            window = None
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise PretrainedError(f"'sliding_window' must be a positive int or null, found {window!r}", where=_WHERE)
        kw["sliding_window"] = window
        if mt == "qwen2" and window is not None:
            kw["layer_types"] = _qwen2_layer_types(data, kw["num_hidden_layers"])
        kw["model_type"] = mt
        return cls(**kw)

    def to_json(self) -> dict:
        """The config.json keys transformers needs to rebuild this model."""
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
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
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.model_type == "qwen2":  # q/k/v biases always, none on o_proj: no keys for them
            out["use_sliding_window"] = self.sliding_window is not None
            out["sliding_window"] = self.sliding_window
            if self.layer_types is not None:
                out["layer_types"] = list(self.layer_types)
        elif self.model_type == "mistral":  # no bias keys in MistralConfig
            out["sliding_window"] = self.sliding_window
        else:
            out["attention_bias"] = self.attention_bias
            out["mlp_bias"] = self.mlp_bias
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out


def _qwen2_layer_types(data: dict, n_layers: int) -> list:
    """Qwen2's "sliding_attention" / "full_attention" per layer: `layer_types` as stored, else
    sliding from layer `max_window_layers` (default 28) on."""
    types = data.get("layer_types")
    if types is None:
        first = data.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise PretrainedError(f"'max_window_layers' must be a non-negative int, found {first!r}", where=_WHERE)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(types, list) or len(types) != n_layers or any(t not in kinds for t in types):
        raise PretrainedError(f"'layer_types' must list {n_layers} of {kinds}, found {types!r}", where=_WHERE)
    return list(types)


def _positive_int(data, key, default=None):
    value = data.get(key, default)
    if value is None and default is not None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PretrainedError(f"{key!r} must be a positive int, found {value!r}", where=_WHERE)
    if value > MAX_SIZE:
        raise PretrainedError(f"{key!r} is {value}, beyond any model (a size is at most {MAX_SIZE})", where=_WHERE)
    return value


def _number(data, key, default):
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise PretrainedError(f"{key!r} must be a positive number, found {value!r}", where=_WHERE)
    return float(value)


def _bool(data, key, default):
    value = data.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, bool):
        raise PretrainedError(f"{key!r} must be true or false, found {value!r}", where=_WHERE)
    return value


# ---------------------------------------------------------------------------------- the model
class LlamaMlp(Module):
    """The gated feed-forward block: `down_proj(silu(gate_proj(x)) * up_proj(x))`."""

    def __init__(self, config: LlamaConfig, device=None):
        d, f, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.LinearConfig(d, f, bias=bias).init(device)
        self.up_proj = nn.LinearConfig(d, f, bias=bias).init(device)
        self.down_proj = nn.LinearConfig(f, d, bias=bias).init(device)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        """SwiGLU feed-forward.

        # Shapes

        - x: `[..., d_input]`
        - output: `[..., d_input]`
        """
        return self.down_proj.forward(self.act_fn.forward(self.gate_proj.forward(x)) * self.up_proj.forward(x))


class LlamaDecoderLayer(Module):
    """Pre-norm block: `h = x + attn(norm(x))`, `h + mlp(norm(h))`."""

    def __init__(self, config: LlamaConfig, device=None, window: int | None = None, mlp=None):
        """`mlp(config, device)`, when given, builds the feed-forward block in place of the dense
        LlamaMlp (a mixture of experts' `SparseMoe`, engine.models.moe)."""
        d = config.hidden_size
        self.input_layernorm = nn.RmsNormConfig(d, epsilon=config.rms_norm_eps).init(device)
        self.self_attn = nn.MultiHeadAttentionConfig(
            d, config.num_attention_heads, dropout=0.0, n_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim, bias=config.attention_bias, output_bias=config.output_bias, causal=True,
            window=window, qk_norm=config.qk_norm(),
        ).init(device)
        self.post_attention_layernorm = nn.RmsNormConfig(d, epsilon=config.rms_norm_eps).init(device)
        self.mlp = LlamaMlp(config, device) if mlp is None else mlp(config, device)

    def forward(self, x, rotary, mask_pad=None, start: int | None = None, cache=None, mask_attn=None,
                positions=None):
        """Causal self-attention with rotary positions, then the feed-forward block. `mask_pad`
        (optional, `[batch_size, seq_length]`, with a cache `[batch_size, cache length + seq_length]`)
        is true at padding positions. `cache` (an `nn.KVCache`) holds this layer's earlier keys
        and values; the new positions start at its length unless `start` says otherwise.
        `mask_attn` (`[batch_size, seq_length, seq_length]`, true: masked) and `positions` (each
        row's positions, `[batch_size, seq_length]`): packed sequences (see `LlamaForCausalLM.forward`).

        # Shapes

        - x: `[batch_size, seq_length, d_model]`
        - output: `[batch_size, seq_length, d_model]`
        """
        attn_in = nn.MhaInput.self_attn(self.input_layernorm.forward(x))
        if mask_pad is not None:
            attn_in = attn_in.mask_pad(mask_pad)
        if mask_attn is not None:
            attn_in = attn_in.mask_attn(mask_attn)
        h = x + self.self_attn.forward(attn_in, rotary, start, cache, positions).context
        return h + self.mlp.forward(self.post_attention_layernorm.forward(h))


class LlamaForCausalLM(Module):
    """A Llama-family causal language model (see the module docstring for its parts)."""

    def __init__(self, config: LlamaConfig, device=None):
        self._config = config  # not a field (the display shows the layers); read as `config`
        self.embed_tokens = nn.EmbeddingConfig(config.vocab_size, config.hidden_size).init(device)
        self.rotary_emb = config.rope().init(device)
        self.layers = [LlamaDecoderLayer(config, device, config.layer_window(i))
                       for i in layer_range(config.num_hidden_layers)]
        self.norm = nn.RmsNormConfig(config.hidden_size, epsilon=config.rms_norm_eps).init(device)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.LinearConfig(config.hidden_size, config.vocab_size, bias=False).init(device))

    @property
    def config(self) -> LlamaConfig:
        """The settings this model was built from."""
        return self._config

    def forward(self, input_ids, attention_mask=None, cache=None, position_ids=None, segment_ids=None):
        """Next-token logits (causal): `hidden_states` through the language-model head. `attention_mask` (optional, int or bool `[batch_size, seq_length]`,
        as transformers takes it): 1 for a real token, 0 for padding, whose keys no query attends to.

        `cache` (optional, generation): a list of `nn.KVCache`, one per layer
        (`nn.KVCache.layers(len(model.layers))`), holding the keys and values of the positions
        fed so far. `input_ids` are then the next positions only (they start at the caches'
        length), the caches grow by them, and `attention_mask`, when given, covers the cached
        positions and the new ones (`[batch_size, cache length + seq_length]`, as transformers).

        Packed sequences (training, no cache): `segment_ids` (int `[batch_size, seq_length]`) says
        which sequence each position belongs to, and a position attends only to the earlier
        positions of its own (a block-diagonal causal mask); `position_ids` (int `[batch_size,
        seq_length]`, default: restarting at 0 with each run of equal segment ids, as TRL's
        padding-free packing numbers them) are the rotary positions. Each sequence's logits are
        then those it has alone. With a cache, `position_ids` alone (the new positions' rotary
        positions) number a left-padded row's tokens from its first real one, as transformers'
        `generate` does (it matters only for rope whose frequencies change with the length).

        # Shapes

        - input_ids: `[batch_size, seq_length]`
        - output: `[batch_size, seq_length, vocab_size]`
        """
        x = self.hidden_states(input_ids, attention_mask, cache, position_ids, segment_ids)
        if self.lm_head is None:
            r = self.embed_tokens.weight.reparameterization
            out = r.matmul(x, True) if getattr(r, "MULTIPLIES", False) else None  # a GGUF table kept quantized
            return out if out is not None else x @ self.embed_tokens.weight.val().transpose()
        return self.lm_head.forward(x)

    def hidden_states(self, input_ids, attention_mask=None, cache=None, position_ids=None,
                      segment_ids=None) -> Tensor:
        """The last layer's output after the final norm, `[batch_size, seq_length, hidden_size]`
        (what the head turns into logits; the arguments are `forward`'s)."""
        if not isinstance(input_ids, Tensor):
            input_ids = Tensor.from_data(input_ids)
        assert_shape(input_ids, [None, None])
        batch_size, seq_length = input_ids.dims()
        if cache is not None:
            cache = list(cache)
        past = _cache_length(cache, len(self.layers))
        mask_pad = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor):
                attention_mask = Tensor.from_data(attention_mask, device=input_ids.device)
            assert_shape(attention_mask, [batch_size, past + seq_length])
            mask_pad = attention_mask.equal(0) if attention_mask.kind != "bool" else attention_mask.bool_not()
        mask_attn = positions = None
        if segment_ids is not None or position_ids is not None:
            if cache is not None and segment_ids is not None:
                raise ValueError(f"{type(self).__name__}: segment_ids are for training on packed sequences, not "
                                 f"with a cache")
            mask_attn, positions = nn.packed_attention(input_ids.dims(), position_ids, segment_ids, input_ids.device)
        x = self.embed(input_ids)
        if cache is None:
            for i, layer in enumerate(self.layers):
                x = layer.forward(x, self.layer_rotary(i), mask_pad, mask_attn=mask_attn, positions=positions)
        else:
            for i, (layer, layer_cache) in enumerate(zip(self.layers, cache)):
                x = layer.forward(x, self.layer_rotary(i), mask_pad, past, layer_cache, positions=positions)
        return self.norm.forward(x)

    def embed(self, input_ids) -> Tensor:
        """The input embeddings of `input_ids` (a family may scale them: Gemma)."""
        return self.embed_tokens.forward(input_ids)

    def layer_rotary(self, i: int):
        """The rotary encoding layer `i` uses (Gemma 3 has one for its local layers, one for its global)."""
        return self.rotary_emb


def _cache_length(cache, n_layers: int) -> int:
    """The positions a model's list of per-layer caches holds (0 without one); the list must
    have one cache per layer, all of the same length."""
    if cache is None:
        return 0
    cache = list(cache)
    if len(cache) != n_layers:
        raise ValueError(f"cache: expected one nn.KVCache per layer ({n_layers}), found {len(cache)}")
    lengths = {c.length for c in cache}
    if len(lengths) != 1:
        raise ValueError(f"cache: the layers' caches hold different lengths {sorted(lengths)} (a cache is used "
                         f"by one generation at a time)")
    return lengths.pop()


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: the Llama architecture (grouped-query attention, sliding-window attention)."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: the Llama architecture with q/k/v biases (none on o_proj)."""


_CLASSES = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM}


def build(config: LlamaConfig, device=None) -> LlamaForCausalLM:
    """The model of `config`, every parameter lazy (nothing allocated)."""
    return _CLASSES.get(config.model_type, LlamaForCausalLM)(config, device)


# ---------------------------------------------------------------------------------- names
def weight_map(config: LlamaConfig) -> WeightMap:
    """Hugging Face names <-> Ember paths for `config` (see engine.models.mapping)."""
    hd, heads, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    attn, mlp = "model.layers.{i}.self_attn", "model.layers.{i}.mlp"
    ours = "layers.{i}.self_attn"
    rules = [
        Rule("model.embed_tokens.weight", "embed_tokens.weight"),
        Rule(f"{attn}.q_proj.weight", f"{ours}.query.weight", [RopePermute(heads, hd, axis=0), Transpose()]),
        Rule(f"{attn}.k_proj.weight", f"{ours}.key.weight", [RopePermute(kv, hd, axis=0), Transpose()]),
        Rule(f"{attn}.v_proj.weight", f"{ours}.value.weight", [Transpose()]),
        Rule(f"{attn}.o_proj.weight", f"{ours}.output.weight", [Transpose()]),
        Rule("model.layers.{i}.input_layernorm.weight", "layers.{i}.input_layernorm.gamma"),
        Rule("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attention_layernorm.gamma"),
        Rule(f"{mlp}.gate_proj.weight", "layers.{i}.mlp.gate_proj.weight", [Transpose()]),
        Rule(f"{mlp}.up_proj.weight", "layers.{i}.mlp.up_proj.weight", [Transpose()]),
        Rule(f"{mlp}.down_proj.weight", "layers.{i}.mlp.down_proj.weight", [Transpose()]),
        Rule("model.norm.weight", "norm.gamma"),
    ]
    if config.attention_bias:
        rules += [
            Rule(f"{attn}.q_proj.bias", f"{ours}.query.bias", [RopePermute(heads, hd, axis=0)]),
            Rule(f"{attn}.k_proj.bias", f"{ours}.key.bias", [RopePermute(kv, hd, axis=0)]),
            Rule(f"{attn}.v_proj.bias", f"{ours}.value.bias"),
        ]
    if config.output_bias:
        rules.append(Rule(f"{attn}.o_proj.bias", f"{ours}.output.bias"))
    if config.mlp_bias:
        rules += [Rule(f"{mlp}.{n}.bias", f"layers.{{i}}.mlp.{n}.bias") for n in ("gate_proj", "up_proj", "down_proj")]
    ignore = [r"(^|\.)rotary_emb\.inv_freq$"]
    if config.tie_word_embeddings:
        ignore.append(r"^lm_head\.weight$")  # a tied head is the embedding (transformers ignores the copy too)
    else:
        rules.append(Rule("lm_head.weight", "lm_head.weight", [Transpose()]))
    return WeightMap(rules, ignore=ignore)


def _family(name: str) -> Family:
    return decoder_family(name, _ARCHITECTURE[name], lambda data, _mt=name: LlamaConfig.from_json(data, _mt), build,
                          weight_map)


FAMILIES = [_family("llama"), _family("mistral"), _family("qwen2")]
