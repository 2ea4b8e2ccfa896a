"""The Qwen3 family: `Qwen3ForCausalLM`, the Llama architecture with per-head q/k RMS norms.

    Qwen3ForCausalLM (a LlamaForCausalLM)
      layers.{i}.self_attn     nn.MultiHeadAttention with `q_norm` / `k_norm`: RMS norms over
                               head_dim (epsilon rms_norm_eps) of each head's queries and keys, after
                               the projections and before the rotary encoding (transformers' q_norm /
                               k_norm); `attention_bias` is the bias of all four projections

Everything else is Llama's (engine.models.llama): the blocks, the rope variants of `rope_scaling`,
tied or untied head, the key/value cache. The norms' weights follow the rotary permutation of the
q/k rows (Ember rotates interleaved pairs, Hugging Face the two halves of a head: a norm weight is
one head's worth of rows). `sliding_window` counts only with `use_sliding_window`, then for the
layers from `max_window_layers` on (or as `layer_types` says), as Qwen2's.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import nn
from .hf_folder import PretrainedError
from .llama import LlamaConfig, LlamaForCausalLM, _qwen2_layer_types
from .llama import weight_map as llama_weight_map
from .mapping import RopePermute, Rule, WeightMap
from .pretrained import decoder_family

__all__ = ["Qwen3Config", "Qwen3ForCausalLM", "build", "weight_map", "FAMILIES"]

_WHERE = "config.json"


@dataclass
class Qwen3Config(LlamaConfig):
    """A Qwen3 config: `LlamaConfig`'s settings (`model_type` "qwen3"), with q/k norms."""

    model_type: str = "qwen3"

    @property
    def architecture(self) -> str:
        return "Qwen3ForCausalLM"

    def qk_norm(self):
        return nn.RmsNormConfig(self.head_dim, epsilon=self.rms_norm_eps)

    @classmethod
    def from_json(cls, data: dict, model_type: str | None = None) -> "Qwen3Config":
        """The config of a Qwen3 `config.json` (the keys transformers' Qwen3Config reads)."""
        if not isinstance(data, dict):
            raise PretrainedError(f"expected a JSON object, found {type(data).__name__}", where=_WHERE)
        d = dict(data)
        d.pop("mlp_bias", None)  # Qwen3's MLP has no biases whatever the file says (transformers ignores it)
        d.setdefault("max_position_embeddings", 32768)
        use = d.get("use_sliding_window", False)
        if not isinstance(use, bool):
            raise PretrainedError(f"'use_sliding_window' must be true or false, found {use!r}", where=_WHERE)
        if use:
            d.setdefault("sliding_window", 4096)
        else:
            d["sliding_window"] = None  # transformers' Qwen3Config: no window without use_sliding_window
        cfg = super().from_json(d, "llama")
        if cfg.sliding_window is not None:  # as Qwen2: sliding from layer max_window_layers on, or layer_types
            cfg.layer_types = _qwen2_layer_types(d, cfg.num_hidden_layers)
        cfg.model_type = "qwen3"
        return cfg

    def to_json(self) -> dict:
        out = super().to_json()
        out.pop("mlp_bias", None)
        out["use_sliding_window"] = self.sliding_window is not None
        out["sliding_window"] = self.sliding_window
        if self.layer_types is not None:
            out["layer_types"] = list(self.layer_types)
        return out


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: the Llama architecture with per-head q/k RMS norms before the rotary encoding."""


def build(config: Qwen3Config, device=None) -> Qwen3ForCausalLM:
    """The model of `config`, every parameter lazy (nothing allocated)."""
    return Qwen3ForCausalLM(config, device)


def weight_map(config: Qwen3Config) -> WeightMap:
    """Llama's names plus the q/k norms' weights (one head's rows, rotary-permuted)."""
    base = llama_weight_map(config)
    attn, ours = "model.layers.{i}.self_attn", "layers.{i}.self_attn"
    hd = config.head_dim
    rules = list(base.rules) + [
        Rule(f"{attn}.q_norm.weight", f"{ours}.q_norm.gamma", [RopePermute(1, hd, axis=0)]),
        Rule(f"{attn}.k_norm.weight", f"{ours}.k_norm.gamma", [RopePermute(1, hd, axis=0)]),
    ]
    return WeightMap(rules, ignore=[p.pattern for p in base.ignore])


FAMILIES = [decoder_family("qwen3", "Qwen3ForCausalLM", Qwen3Config.from_json, build, weight_map)]
