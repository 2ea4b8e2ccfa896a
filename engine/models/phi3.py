"""The Phi-3 family: `Phi3ForCausalLM` (Phi-3, Phi-3.5-mini, Phi-4), the Llama architecture with
fused projections.

Hugging Face stores each layer's attention projections as one `self_attn.qkv_proj` (`[(heads + 2 ·
kv_heads) · head_dim, hidden]`: the query rows, then the key rows, then the value rows) and the
MLP's gate and up projections as one `mlp.gate_up_proj` (`[2 · intermediate, hidden]`: gate first).
Ember keeps Llama's separate layers (`self_attn.query` / `key` / `value`, `mlp.gate_proj` /
`up_proj`): the weight map splits the fused tensors on loading (`mapping.Split` with the parts'
sizes; the q/k rows rotary-permuted as Llama's) and concatenates them again on saving. A peft LoRA
on `qkv_proj` or `gate_up_proj` (what peft targets, one A and one B over the fused rows) becomes
LoRAs on the parts with one shared A (the same parameter: its gradient the sum over the parts, one
optimizer state, saved and counted once) and B's row blocks, and saves back as one
(engine.models.peft); a LoRA Ember attaches to the parts shares its A the same way
(`lora_shared_a`), so both train step for step as peft trains the fused module.

Phi-3's rope: default, or `longrope` (`rope_scaling` types "su" and "yarn" are longrope in Phi-3,
as transformers reads them), with `original_max_position_embeddings` at the config's top level.
`partial_rotary_factor` below 1 (Phi-4-mini) is refused; a `sliding_window` (Phi-3-mini's 2047)
is every layer's attention window, as in transformers.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hf_folder import PretrainedError
from .llama import LlamaConfig, LlamaForCausalLM
from .mapping import RopePermute, Rule, Split, Transpose, WeightMap
from .pretrained import decoder_family

__all__ = ["Phi3Config", "Phi3ForCausalLM", "build", "weight_map", "FAMILIES"]

_WHERE = "config.json"


@dataclass
class Phi3Config(LlamaConfig):
    """A Phi-3 config: `LlamaConfig`'s settings (`model_type` "phi3"; no biases)."""

    model_type: str = "phi3"
    original_max_position_embeddings: int | None = None

    @property
    def architecture(self) -> str:
        return "Phi3ForCausalLM"

    @classmethod
    def from_json(cls, data: dict, model_type: str | None = None) -> "Phi3Config":
        """The config of a Phi-3 `config.json` (the keys transformers' Phi3Config reads)."""
        if not isinstance(data, dict):
            raise PretrainedError(f"expected a JSON object, found {type(data).__name__}", where=_WHERE)
        d = {k: v for k, v in data.items() if k not in ("attention_bias", "mlp_bias")}  # Phi-3 has neither
        d.setdefault("rms_norm_eps", 1e-5)
        d.setdefault("max_position_embeddings", 4096)
        d.setdefault("original_max_position_embeddings", 4096)
        rope = d.get("rope_parameters") or d.get("rope_scaling")
        if isinstance(rope, dict):
            rope = dict(rope)
            factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
            if factor != 1.0:
                raise PretrainedError(f"'partial_rotary_factor' {factor!r} is not supported: Ember rotates the whole "
                                      f"head (1.0; Phi-4-mini rotates part of it)", where=_WHERE)
            if rope.get("rope_type", rope.get("type")) in ("su", "yarn"):  # Phi-3's names for longrope
                rope["rope_type"] = "longrope"
                rope.pop("type", None)
            d["rope_parameters" if d.get("rope_parameters") else "rope_scaling"] = rope
        elif d.get("partial_rotary_factor", 1.0) != 1.0:
            raise PretrainedError(f"'partial_rotary_factor' {d['partial_rotary_factor']!r} is not supported: Ember "
                                  f"rotates the whole head (1.0; Phi-4-mini rotates part of it)", where=_WHERE)
        cfg = super().from_json(d, "llama")
        cfg.model_type = "phi3"
        original = d["original_max_position_embeddings"]
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise PretrainedError(f"'original_max_position_embeddings' must be a positive int, found {original!r}",
                                  where=_WHERE)
        cfg.original_max_position_embeddings = original
        return cfg

    def to_json(self) -> dict:
        out = super().to_json()
        for key in ("attention_bias", "mlp_bias"):
            out.pop(key, None)
        out["original_max_position_embeddings"] = self.original_max_position_embeddings or self.max_position_embeddings
        out["sliding_window"] = self.sliding_window
        out["rope_parameters"]["partial_rotary_factor"] = 1.0  # transformers' Phi3Config writes it
        return out


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3: the Llama architecture, its q/k/v and gate/up projections fused in the files."""

    def lora_shared_a(self) -> dict[str, str]:
        """The parts of each fused module share one LoRA `a` factor, as peft's one LoRA over
        `qkv_proj` / `gate_up_proj` has one A (engine.module.lora)."""
        out = {}
        for i in range(len(self.layers)):
            for part in ("query", "key", "value"):
                out[f"layers.{i}.self_attn.{part}.weight"] = f"layers.{i}.self_attn.qkv_proj"
            for part in ("gate_proj", "up_proj"):
                out[f"layers.{i}.mlp.{part}.weight"] = f"layers.{i}.mlp.gate_up_proj"
        return out

    @property
    def cache_recompute_length(self) -> int | None:
        """With longrope: the sequence length at which generation rebuilds its key/value cache from
        the start (`original_max_position_embeddings + 1`, the first length that takes the long
        factors: transformers' Phi-3 `prepare_inputs_for_generation` does so); None otherwise."""
        scaling = self.config.rope_scaling
        if not scaling or scaling.get("rope_type") != "longrope":
            return None
        return int(scaling["original_max_position_embeddings"]) + 1


def build(config: Phi3Config, device=None) -> Phi3ForCausalLM:
    """The model of `config`, every parameter lazy (nothing allocated)."""
    return Phi3ForCausalLM(config, device)


def weight_map(config: Phi3Config) -> WeightMap:
    """Hugging Face names <-> Ember paths, the fused tensors split by the parts' sizes."""
    hd, heads, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    attn, mlp, ours = "model.layers.{i}.self_attn", "model.layers.{i}.mlp", "layers.{i}.self_attn"
    sizes = (heads * hd, kv * hd, kv * hd)
    inter = config.intermediate_size
    rules = [
        Rule("model.embed_tokens.weight", "embed_tokens.weight"),
        Rule(f"{attn}.qkv_proj.weight", f"{ours}.query.weight",
             [Split(0, 0, 3, sizes), RopePermute(heads, hd, axis=0), Transpose()]),
        Rule(f"{attn}.qkv_proj.weight", f"{ours}.key.weight",
             [Split(0, 1, 3, sizes), RopePermute(kv, hd, axis=0), Transpose()]),
        Rule(f"{attn}.qkv_proj.weight", f"{ours}.value.weight", [Split(0, 2, 3, sizes), Transpose()]),
        Rule(f"{attn}.o_proj.weight", f"{ours}.output.weight", [Transpose()]),
        Rule("model.layers.{i}.input_layernorm.weight", "layers.{i}.input_layernorm.gamma"),
        Rule("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attention_layernorm.gamma"),
        Rule(f"{mlp}.gate_up_proj.weight", "layers.{i}.mlp.gate_proj.weight", [Split(0, 0, 2, (inter, inter)),
                                                                                Transpose()]),
        Rule(f"{mlp}.gate_up_proj.weight", "layers.{i}.mlp.up_proj.weight", [Split(0, 1, 2, (inter, inter)),
                                                                              Transpose()]),
        Rule(f"{mlp}.down_proj.weight", "layers.{i}.mlp.down_proj.weight", [Transpose()]),
        Rule("model.norm.weight", "norm.gamma"),
    ]
    ignore = [r"(^|\.)rotary_emb\.(inv_freq|long_inv_freq|short_inv_freq)$"]
    if config.tie_word_embeddings:
        ignore.append(r"^lm_head\.weight$")
    else:
        rules.append(Rule("lm_head.weight", "lm_head.weight", [Transpose()]))
    return WeightMap(rules, ignore=ignore)


FAMILIES = [decoder_family("phi3", "Phi3ForCausalLM", Phi3Config.from_json, build, weight_map)]
