"""Mixtures of experts: `MixtralForCausalLM`, `Qwen2MoeForCausalLM` and `Qwen3MoeForCausalLM`.

The Llama decoder (engine.models.llama) whose feed-forward block is an `nn.SparseMoe`:

    MixtralForCausalLM / Qwen2MoeForCausalLM
      embed_tokens, rotary_emb, norm, lm_head   as Llama's
      layers.{i}
        input_layernorm, self_attn, post_attention_layernorm   as Mistral's (Mixtral) / Qwen2's /
                               Qwen3's (per-head q/k RMS norms before rope: `q_norm`, `k_norm`)
        mlp                    nn.SparseMoe: gate (the router), experts.{e} (gate_proj, up_proj,
                               down_proj); Qwen2-MoE adds shared_expert and shared_expert_gate
                               (sigmoid). Qwen layers in `mlp_only_layers`, or not on the
                               `decoder_sparse_step`, have a dense LlamaMlp of `intermediate_size`.

Routing: softmax over the experts, top `num_experts_per_tok`; Mixtral always renormalises the
chosen weights, Qwen2-MoE and Qwen3-MoE when `norm_topk_prob`. Every fact is transformers'
modeling_mixtral.py / modeling_qwen2_moe.py / modeling_qwen3_moe.py (5.x).

Two stored layouts load: the per-expert one transformers saves (`block_sparse_moe.experts.{e}.w1 /
w2 / w3` for Mixtral, `mlp.experts.{e}.gate_proj / up_proj / down_proj` for the Qwens), and the
fused one of transformers 5's modules (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
[E, H, I]). Saving writes the per-expert layout (what transformers 5.25 writes and reloads).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import nn
from .hf_folder import PretrainedError
from .llama import (LlamaConfig, LlamaDecoderLayer, LlamaForCausalLM, _bool, _positive_int,
                    weight_map as _llama_weight_map)
from .mapping import RopePermute, Rule, Transform, Transpose, WeightMap
from .peft_targets import FusedExpert
from .pretrained import Family, decoder_family, layer_range

__all__ = ["MoeConfig", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MoeDecoderLayer", "ExpertPart", "FAMILIES"]

_WHERE = "config.json"
_ARCHITECTURE = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}
_BASE = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "llama"}  # the attention of the Llama family it shares


@dataclass
class MoeConfig(LlamaConfig):
    """A Llama-family config with the experts' settings, as config.json names them
    (`num_local_experts` is Mixtral's name for `num_experts`). `moe_intermediate_size` is an expert's
    size (Mixtral: `intermediate_size`); `shared_expert_intermediate_size` Qwen2-MoE's shared one."""

    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)

    def __post_init__(self):
        super().__post_init__()
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size

    @property
    def architecture(self) -> str:
        return _ARCHITECTURE[self.model_type]

    def qk_norm(self):
        if self.model_type == "qwen3_moe":
            return nn.RmsNormConfig(self.head_dim, epsilon=self.rms_norm_eps)
        return None

    def is_sparse(self, i: int) -> bool:
        """Whether layer `i`'s feed-forward block is the mixture (else a dense LlamaMlp)."""
        return (i not in self.mlp_only_layers and self.num_experts > 0
                and (i + 1) % self.decoder_sparse_step == 0)

    def moe(self) -> nn.SparseMoeConfig:
        return nn.SparseMoeConfig(self.hidden_size, self.moe_intermediate_size, self.num_experts,
                                  self.num_experts_per_tok, self.norm_topk_prob, self.shared_expert_intermediate_size)

    @classmethod
    def from_json(cls, data: dict, model_type: str | None = None) -> "MoeConfig":
        if not isinstance(data, dict):
            raise PretrainedError(f"expected a JSON object, found {type(data).__name__}", where=_WHERE)
        mt = model_type or data.get("model_type")
        data = dict(data)
        if mt == "mixtral":  # MixtralConfig's defaults differ from Mistral's
            data.setdefault("sliding_window", None)
            if "rope_parameters" not in data:
                data.setdefault("rope_theta", 1e6)
        elif mt == "qwen3_moe":  # Qwen3MoeConfig: all four projections' bias is attention_bias; no window
            data.pop("mlp_bias", None)  # without use_sliding_window, else every layer's
            data.setdefault("max_position_embeddings", 32768)
            use = data.get("use_sliding_window", False)
            if not isinstance(use, bool):
                raise PretrainedError(f"'use_sliding_window' must be true or false, found {use!r}", where=_WHERE)
            data["sliding_window"] = data.get("sliding_window", 4096) if use else None
        base = LlamaConfig.from_json(data, _BASE[mt])
        kw = asdict(base)
        kw["model_type"] = mt
        if mt == "mixtral":
            kw["num_experts"] = _n_experts(data, 8)
            kw["num_experts_per_tok"] = _positive_int(data, "num_experts_per_tok", 2)
            kw["norm_topk_prob"] = True
            if data.get("router_jitter_noise"):  # training-time noise transformers adds: not reproduced
                raise PretrainedError(f"'router_jitter_noise' {data['router_jitter_noise']!r} is not supported: "
                                      f"expected 0", where=_WHERE)
        else:
            qwen2 = mt == "qwen2_moe"
            if qwen2:
                kw["attention_bias"] = _bool(data, "qkv_bias", True)
                kw["shared_expert_intermediate_size"] = _positive_int(data, "shared_expert_intermediate_size", 5632)
            kw["num_experts"] = _n_experts(data, 60 if qwen2 else 128)
            kw["num_experts_per_tok"] = _positive_int(data, "num_experts_per_tok", 4 if qwen2 else 8)
            kw["moe_intermediate_size"] = _positive_int(data, "moe_intermediate_size", 1408 if qwen2 else 768)
            kw["norm_topk_prob"] = _bool(data, "norm_topk_prob", False)
            kw["decoder_sparse_step"] = _positive_int(data, "decoder_sparse_step", 1)
            only = data.get("mlp_only_layers") or []
            if not isinstance(only, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in only):
                raise PretrainedError(f"'mlp_only_layers' must be a list of layer indices, found {only!r}",
                                      where=_WHERE)
            kw["mlp_only_layers"] = list(only)
        if kw["num_experts_per_tok"] > kw["num_experts"]:
            raise PretrainedError(f"'num_experts_per_tok' ({kw['num_experts_per_tok']}) must be at most the number "
                                  f"of experts ({kw['num_experts']})", where=_WHERE)
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise PretrainedError(f"'hidden_act' {act!r} is not supported: expected 'silu'", where=_WHERE)
        return cls(**kw)

    def to_json(self) -> dict:
        out = super().to_json()
        out["architectures"] = [self.architecture]
        out.pop("attention_bias", None)
        out.pop("mlp_bias", None)
        out["num_experts_per_tok"] = self.num_experts_per_tok
        if self.model_type == "mixtral":
            out["num_local_experts"] = self.num_experts
            out["sliding_window"] = self.sliding_window
            out["router_jitter_noise"] = 0.0
        else:
            out["num_experts" if self.model_type == "qwen2_moe" else "num_local_experts"] = self.num_experts
            if self.model_type == "qwen2_moe":
                out["qkv_bias"] = self.attention_bias
                out["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
            else:
                out["attention_bias"] = self.attention_bias
            out["moe_intermediate_size"] = self.moe_intermediate_size
            out["norm_topk_prob"] = self.norm_topk_prob
            out["decoder_sparse_step"] = self.decoder_sparse_step
            out["mlp_only_layers"] = list(self.mlp_only_layers)
            out["use_sliding_window"] = self.sliding_window is not None
            if self.sliding_window is not None:  # else the file's own value stays (Qwen2-MoE writes 0)
                out["sliding_window"] = self.sliding_window
            if self.layer_types is not None:
                out["layer_types"] = list(self.layer_types)
        return out


def _n_experts(data: dict, default: int) -> int:
    """The number of experts: `num_local_experts` (Mixtral's name, and what transformers 5 writes
    for Qwen3-MoE) or `num_experts`."""
    key = "num_local_experts" if "num_local_experts" in data else "num_experts"
    return _positive_int(data, key, default)


# ---------------------------------------------------------------------------------- the model
def _sparse_moe(config: MoeConfig, device) -> nn.SparseMoe:
    """A layer's mixture of experts (`MoeDecoderLayer`'s feed-forward block)."""
    return config.moe().init(device)


class MoeDecoderLayer(LlamaDecoderLayer):
    """A Llama decoder layer whose feed-forward block is an `nn.SparseMoe` (when `sparse`)."""

    def __init__(self, config: MoeConfig, device=None, window: int | None = None, sparse: bool = True):
        # the mixture built in the dense block's place (not built, then replaced: 3 unused Linears a layer)
        super().__init__(config, device, window, mlp=_sparse_moe if sparse else None)


class _MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: MoeConfig, device=None):
        self._config = config
        self.embed_tokens = nn.EmbeddingConfig(config.vocab_size, config.hidden_size).init(device)
        self.rotary_emb = config.rope().init(device)
        self.layers = [MoeDecoderLayer(config, device, config.layer_window(i), config.is_sparse(i))
                       for i in layer_range(config.num_hidden_layers)]
        self.norm = nn.RmsNormConfig(config.hidden_size, epsilon=config.rms_norm_eps).init(device)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.LinearConfig(config.hidden_size, config.vocab_size, bias=False).init(device))


    def lora_shared_a(self) -> dict[str, str]:
        """Each expert's gate and up projections share one LoRA `a` factor, as peft's LoRA on
        transformers 5's fused `mlp.experts.gate_up_proj` (target_parameters) has one A per expert
        (engine.module.lora)."""
        out = {}
        for i, layer in enumerate(self.layers):
            for e in range(len(getattr(layer.mlp, "experts", None) or [])):
                for part in ("gate_proj", "up_proj"):
                    out[f"layers.{i}.mlp.experts.{e}.{part}.weight"] = f"layers.{i}.mlp.experts.{e}.gate_up"
        return out


class MixtralForCausalLM(_MoeForCausalLM):
    """Mixtral: Mistral's attention, a sparse mixture of SwiGLU experts in every layer."""


class Qwen2MoeForCausalLM(_MoeForCausalLM):
    """Qwen2-MoE: Qwen2's attention, experts plus a sigmoid-gated shared expert."""


class Qwen3MoeForCausalLM(_MoeForCausalLM):
    """Qwen3-MoE: Qwen3's attention (per-head q/k norms), experts without a shared one."""


_CLASSES = {"mixtral": MixtralForCausalLM, "qwen2_moe": Qwen2MoeForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}


def build(config: MoeConfig, device=None):
    """The model of `config`, every parameter lazy (nothing allocated)."""
    return _CLASSES[config.model_type](config, device)


# ---------------------------------------------------------------------------------- names
@dataclass(frozen=True)
class ExpertPart(Transform):
    """One expert's slice of a fused experts tensor (load only): stored `[n_experts, rows, cols]`,
    expert `expert`'s rows cut into `parts` and part `part` taken: `[rows / parts, cols]`."""

    expert: int
    n_experts: int
    part: int = 0
    parts: int = 1

    def shape(self, stored):
        if len(stored) != 3 or stored[0] != self.n_experts or stored[1] % self.parts:
            raise ValueError(f"expected a fused experts tensor of dims [{self.n_experts}, rows (a multiple of "
                             f"{self.parts}), cols], found dims {list(stored)}")
        return (stored[1] // self.parts, stored[2])

    def stored_shape(self, ember):
        return (self.n_experts, ember[0] * self.parts, ember[1])

    def forward(self, array):
        rows = array.shape[1] // self.parts
        return np.ascontiguousarray(array[self.expert, self.part * rows:(self.part + 1) * rows])

    def inverse(self, array):
        raise NotImplementedError("a fused experts tensor is saved in the per-expert layout")


_QWEN_EXPERT = ("mlp", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"})
_PER_EXPERT = {"mixtral": ("block_sparse_moe", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}),
               "qwen2_moe": _QWEN_EXPERT, "qwen3_moe": _QWEN_EXPERT}


def _common_rules(config: MoeConfig, block: str) -> list:
    rules = list(_llama_weight_map(config).rules)  # attention, norms, head, and the dense layers' mlp
    rules.append(Rule(f"model.layers.{{i}}.{block}.gate.weight", "layers.{i}.mlp.gate.weight", [Transpose()]))
    if config.qk_norm() is not None:  # Qwen3-MoE: one head's rows, rotary-permuted as the q/k rows
        attn, ours, hd = "model.layers.{i}.self_attn", "layers.{i}.self_attn", config.head_dim
        rules += [Rule(f"{attn}.q_norm.weight", f"{ours}.q_norm.gamma", [RopePermute(1, hd, axis=0)]),
                  Rule(f"{attn}.k_norm.weight", f"{ours}.k_norm.gamma", [RopePermute(1, hd, axis=0)])]
    if config.shared_expert_intermediate_size is not None:
        for n in ("gate_proj", "up_proj", "down_proj"):
            rules.append(Rule(f"model.layers.{{i}}.mlp.shared_expert.{n}.weight",
                              f"layers.{{i}}.mlp.shared_expert.{n}.weight", [Transpose()]))
        rules.append(Rule("model.layers.{i}.mlp.shared_expert_gate.weight", "layers.{i}.mlp.shared_expert_gate.weight",
                          [Transpose()]))
    return rules


def _ignore(config: MoeConfig) -> list:
    ignore = [r"(^|\.)rotary_emb\.inv_freq$"]
    if config.tie_word_embeddings:
        ignore.append(r"^lm_head\.weight$")
    return ignore


def weight_map(config: MoeConfig) -> WeightMap:
    """Hugging Face names <-> Ember paths in the per-expert layout transformers saves."""
    block, names = _PER_EXPERT[config.model_type]
    rules = _common_rules(config, block)
    for ours, theirs in names.items():
        rules.append(Rule(f"model.layers.{{i}}.{block}.experts.{{e}}.{theirs}.weight",
                          f"layers.{{i}}.mlp.experts.{{e}}.{ours}.weight", [Transpose()]))
    return WeightMap(rules, ignore=_ignore(config))


def fused_weight_map(config: MoeConfig) -> WeightMap:
    """The rules of the fused layout (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
    [E, H, I]; the router `mlp.gate.weight`), for loading."""
    rules = _common_rules(config, "mlp")
    n = config.num_experts
    fused = "model.layers.{i}.mlp.experts"
    for e in range(n):
        ours = f"layers.{{i}}.mlp.experts.{e}"
        rules += [Rule(f"{fused}.gate_up_proj", f"{ours}.gate_proj.weight", [ExpertPart(e, n, 0, 2), Transpose()]),
                  Rule(f"{fused}.gate_up_proj", f"{ours}.up_proj.weight", [ExpertPart(e, n, 1, 2), Transpose()]),
                  Rule(f"{fused}.down_proj", f"{ours}.down_proj.weight", [ExpertPart(e, n), Transpose()])]
    return WeightMap(rules, ignore=_ignore(config))


def stored_weight_map(config: MoeConfig, names) -> WeightMap:
    """The weight map of a checkpoint holding tensors `names`: fused or per-expert."""
    if any(name.endswith(".experts.gate_up_proj") for name in names):
        return fused_weight_map(config)
    return weight_map(config)


_ROUTER = re.compile(r"\.(block_sparse_moe|mlp)\.gate\Z")


_EXPERT_PART = re.compile(r"\.(block_sparse_moe|mlp)\.experts\.([0-9]+)\.(w1|w3|w2|gate_proj|up_proj|down_proj)\Z")
_PART = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1, "w2": 0, "down_proj": 0}


def peft_name(config: MoeConfig, module: str) -> tuple:
    """peft's name of a stored module (transformers 5's modules: Mixtral's router is `mlp.gate`),
    whether peft adapts it as a parameter (the router: `target_parameters` "...gate.weight"), whether
    an adapter whose `target_modules` select it may hold nothing for it (an expert: peft on transformers 5
    has no per-expert modules), and for an expert its place in transformers 5's fused experts parameter
    (`peft_targets.FusedExpert`: `mlp.experts.gate_up_proj`, gate rows then up rows, or `down_proj`),
    which peft adapts with `target_parameters`. The experts keep their per-expert names (an adapter of
    transformers 4 names them so)."""
    if _ROUTER.search(module):
        return _ROUTER.sub(".mlp.gate", module), True, False
    m = _EXPERT_PART.search(module)
    if m is None:
        return module, False, False
    kind = _FUSED[m.group(3)]
    fused = FusedExpert(f"{module[:m.start()]}.mlp.experts.{kind}", int(m.group(2)), config.num_experts,
                        _PART[m.group(3)], 2 if kind == "gate_up_proj" else 1)
    return module, False, True, fused


_DENSE_MLP = re.compile(r"\.mlp\.(gate_proj|up_proj|down_proj)\Z")


def check_peft_adapter(config: MoeConfig, modules: set) -> None:
    """Refuse a LoRA that transformers 5.25 + peft 0.21 would not load as Ember computes it (checked
    against them): a Qwen3-MoE dense layer's (transformers takes its gate_proj / up_proj / down_proj
    adapter for the experts'). The experts' LoRAs are written as peft's LoRA on the fused experts
    parameters (target_parameters), which loads as computed and trains as Ember trains."""
    if config.model_type == "qwen3_moe":
        dense = sorted(m for m in modules if _DENSE_MLP.search(m))
        if dense:
            raise PretrainedError(f"LoRA on '{dense[0]}' (a layer of mlp_only_layers) cannot be written for a "
                                  f"{config.architecture}: transformers 5.25 + peft 0.21 load a Qwen3-MoE's "
                                  f"gate_proj / up_proj / down_proj adapter onto the experts' fused parameters "
                                  f"(measured); adapt the attention, the router and the experts")


_STORED_EXPERT = re.compile(r"\.(block_sparse_moe|mlp)\.experts\.[0-9]+\.(w1|w3|w2|gate_proj|up_proj|down_proj)"
                            r"\.weight\Z")
_FUSED = {"w1": "gate_up_proj", "w3": "gate_up_proj", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
          "w2": "down_proj", "down_proj": "down_proj"}


def torch_name(config: MoeConfig, stored: str) -> str:
    """transformers 5's parameter of a stored tensor: an expert's weight is part of the fused
    `mlp.experts.gate_up_proj` / `down_proj`, Mixtral's router is `mlp.gate.weight`."""
    m = _STORED_EXPERT.search(stored)
    if m:
        return f"{stored[:m.start()]}.mlp.experts.{_FUSED[m.group(2)]}"
    return stored.replace(".block_sparse_moe.gate.weight", ".mlp.gate.weight")


def _family(name: str) -> Family:
    return decoder_family(
        name, _ARCHITECTURE[name], lambda data, _mt=name: MoeConfig.from_json(data, _mt), build, weight_map,
        stored_weight_map=stored_weight_map,
        peft_name=peft_name,
        check_peft_adapter=check_peft_adapter,
        torch_name=torch_name,
    )


FAMILIES = [_family("mixtral"), _family("qwen2_moe"), _family("qwen3_moe")]
