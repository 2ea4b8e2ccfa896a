"""llama.cpp's architectures in GGUF files: which Ember family each is, its tensor names and its metadata.

    llama.cpp          Ember family (model_type)           in the file
    "llama"            Llama, Mistral; Mixtral (with       q/k rows permuted into interleaved rotary pairs
                       `llama.expert_count`)               (llama.cpp's converter), experts stacked
    "qwen2"            Qwen2                                Hugging Face's row order (NEOX rotary)
    "qwen3"            Qwen3                                + attn_q_norm / attn_k_norm (one head's width)
    "phi3"             Phi-3                                attn_qkv (q, k, v rows), ffn_up (gate rows, then up)
    "gemma"            Gemma                                norms stored as 1 + w (what the model multiplies by)
    "gemma2"           Gemma 2                              + post_attention_norm, ffn_norm (pre-feed-forward),
                                                            post_ffw_norm; soft-caps and the window as metadata
    "gemma3"           Gemma 3 (text)                       Gemma 2's norms + attn_q_norm / attn_k_norm
    "qwen2moe"         Qwen2-MoE                            ffn_gate_inp (router), ffn_{gate,up,down}_exps
                                                            [E, ...], ffn_*_shexp, ffn_gate_inp_shexp [hidden]
    "qwen3moe"         Qwen3-MoE                            the router and the stacked experts

The tensor names come from the family's Hugging Face weight map with its names translated
(`_NAMES`), so that each family's layout facts (the fused q/k/v split of Phi-3, the rotary permutation
of the q/k rows and of the q/k norms' weights) are written once. What differs from the Hugging Face
layout: a "llama" file's q/k rows are already in Ember's order (no permutation); Gemma's norms hold
`1 + w` (`Offset`); the experts of a layer are one tensor `[experts, rows, cols]` (`ExpertPart`; older Mixtral files
hold one tensor per expert, `blk.N.ffn_gate.E.weight`, which is read too and written stacked);
Qwen2-MoE's shared expert gate is a vector.

Metadata beyond the Llama keys: Gemma 2's `attention.sliding_window`, `attn_logit_softcapping`,
`final_logit_softcapping`; Gemma 3's `attention.sliding_window`, `rope.freq_base_swa` (the sliding
layers' rope base) and `attention.sliding_window_pattern` written as one flag per layer (llama.cpp
reads it; a file without it slides five layers of six; a period is read too); the mixtures'
`expert_count`, `expert_used_count`, `expert_feed_forward_length`, `expert_shared_feed_forward_length`;
Phi-3's `rope.scaling.original_context_length` and `attention.sliding_window` (which llama.cpp
0.3.36 does not apply: it attends to the whole context, measured); Phi-3's longrope as the tensors
`rope_factors_long` / `rope_factors_short` and `rope.scaling.attn_factor` (llama.cpp takes the long
factors when its context exceeds the original one, transformers when the sequence does).

What llama.cpp computes that a config could say otherwise, and Ember's export refuses rather than
write a file llama.cpp would run differently: Gemma 2 / 3's attention scale is `head_dim ** -0.5`
(`hidden / heads` for the 27 B models: 46 layers of Gemma 2, 62 of Gemma 3), whatever
`query_pre_attn_scalar` says (the reader takes that rule too); Gemma 2 always soft-caps (its
defaults 50 and 30), Gemma 3 never does; Gemma 2's sliding layers are every other one; Qwen2-MoE
never renormalises the chosen experts' weights and Qwen3-MoE / Mixtral always do (measured against
llama.cpp); every layer of a mixture is sparse; the Qwens have no sliding window (a Mistral's is
left out, as llama.cpp's converter leaves it: llama.cpp attends to the whole context) and biases on
q, k and v only (llama.cpp refuses a qwen3 file with `attn_output.bias`).
(Facts from llama.cpp's llama-model.cpp and src/models/*.cpp, gguf-py's constants.py, and
llama-cpp-python 0.3.36 run on Ember's exports.)
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .hf_folder import PretrainedError
from .mapping import Reshape, RopePermute, Rule, Transform, Transpose, WeightMap
from .moe import ExpertPart

__all__ = ["ARCHITECTURES", "Offset", "arch_config", "arch_metadata", "arch_tensors", "export_architecture",
           "gguf_weight_map",
           "hf_architecture", "per_expert_names"]

# llama.cpp's architecture -> (Ember's model_type, the Hugging Face architecture); a "llama" file with
# experts is Mixtral (llama.cpp's converter writes Mixtral as "llama")
ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma": ("gemma", "GemmaForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "qwen2moe": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
}
_MIXTRAL = ("mixtral", "MixtralForCausalLM")
# Ember's model_type -> llama.cpp's architecture
_EXPORT = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
           "phi3": "phi3", "gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3", "qwen2_moe": "qwen2moe",
           "qwen3_moe": "qwen3moe"}
# llama.cpp permutes the q/k rows of these architectures into interleaved pairs (its rope NORM)
_PERMUTED = {"llama"}
_GEMMA = {"gemma", "gemma2", "gemma3"}
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}  # llama.cpp: layer i slides when i % n < n - 1
_BIG = {"gemma2": 46, "gemma3": 62}  # the layer counts of the 27 B models (their attention scale)

_L = r"model\.layers\.(\{i\})\."
# Hugging Face name templates -> llama.cpp's (the Gemma 2/3 norms first: their post_attention_layernorm
# is not the feed-forward norm)
_SANDWICH = [(_L + r"post_attention_layernorm\.weight$", r"blk.\1.post_attention_norm.weight"),
             (_L + r"pre_feedforward_layernorm\.weight$", r"blk.\1.ffn_norm.weight"),
             (_L + r"post_feedforward_layernorm\.weight$", r"blk.\1.post_ffw_norm.weight")]
_NAMES = [
    (r"^model\.embed_tokens\.weight$", "token_embd.weight"),
    (r"^model\.norm\.weight$", "output_norm.weight"),
    (r"^lm_head\.weight$", "output.weight"),
    (_L + r"input_layernorm\.weight$", r"blk.\1.attn_norm.weight"),
    (_L + r"post_attention_layernorm\.weight$", r"blk.\1.ffn_norm.weight"),
    (_L + r"self_attn\.q_proj\.(weight|bias)$", r"blk.\1.attn_q.\2"),
    (_L + r"self_attn\.k_proj\.(weight|bias)$", r"blk.\1.attn_k.\2"),
    (_L + r"self_attn\.v_proj\.(weight|bias)$", r"blk.\1.attn_v.\2"),
    (_L + r"self_attn\.o_proj\.(weight|bias)$", r"blk.\1.attn_output.\2"),
    (_L + r"self_attn\.qkv_proj\.weight$", r"blk.\1.attn_qkv.weight"),
    (_L + r"self_attn\.q_norm\.weight$", r"blk.\1.attn_q_norm.weight"),
    (_L + r"self_attn\.k_norm\.weight$", r"blk.\1.attn_k_norm.weight"),
    (_L + r"mlp\.gate_proj\.(weight|bias)$", r"blk.\1.ffn_gate.\2"),
    (_L + r"mlp\.up_proj\.(weight|bias)$", r"blk.\1.ffn_up.\2"),
    (_L + r"mlp\.down_proj\.(weight|bias)$", r"blk.\1.ffn_down.\2"),
    (_L + r"mlp\.gate_up_proj\.weight$", r"blk.\1.ffn_up.weight"),  # Phi-3: gate rows, then up rows
    (_L + r"(mlp|block_sparse_moe)\.gate\.weight$", r"blk.\1.ffn_gate_inp.weight"),
    (_L + r"mlp\.shared_expert\.gate_proj\.weight$", r"blk.\1.ffn_gate_shexp.weight"),
    (_L + r"mlp\.shared_expert\.up_proj\.weight$", r"blk.\1.ffn_up_shexp.weight"),
    (_L + r"mlp\.shared_expert\.down_proj\.weight$", r"blk.\1.ffn_down_shexp.weight"),
    (_L + r"mlp\.shared_expert_gate\.weight$", r"blk.\1.ffn_gate_inp_shexp.weight"),
]
_EXPERT_RULE = re.compile(r"\.experts\.\{e\}\.")
_EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


@dataclass(frozen=True)
class Offset(Transform):
    """Stored values are the parameter's plus `value` (Gemma's norms: llama.cpp multiplies by the
    stored weight, Ember's offset-1 RmsNorm by `1 + gamma`)."""

    value: float

    def shape(self, stored):
        return tuple(stored)

    def stored_shape(self, ember):
        return tuple(ember)

    def forward(self, array):
        return np.asarray(array, dtype=np.float32) - np.float32(self.value)

    def inverse(self, array):
        return np.asarray(array, dtype=np.float32) + np.float32(self.value)


def _translate(hf: str, arch: str) -> str:
    for pattern, new in (_SANDWICH if arch in ("gemma2", "gemma3") else []) + _NAMES:
        name, n = re.subn(pattern, new, hf)
        if n:
            return name
    raise PretrainedError(f"the Hugging Face tensor {hf!r} has no llama.cpp name in Ember's {arch} map (an Ember bug)")


def per_expert_names(names) -> bool:
    """Whether a file's tensor names hold its experts one tensor each (`blk.N.ffn_gate.E.weight`: the
    Mixtral files llama.cpp's converter wrote before it stacked them; llama-cpp-python 0.3.36 no longer
    loads them, Ember reads them and writes the experts stacked)."""
    return any(_LEGACY_EXPERT.match(n) for n in names)


_LEGACY_EXPERT = re.compile(r"^blk\.[0-9]+\.ffn_(gate|up|down)\.[0-9]+\.weight$")


def gguf_weight_map(arch: str, cfg, hf_map: WeightMap, per_expert: bool = False) -> WeightMap:
    """llama.cpp's tensor names <-> Ember's paths for a model of `cfg` whose Hugging Face weight map is
    `hf_map` (see this file's doc); `per_expert`: the experts one tensor each (`per_expert_names`)."""
    rules = []
    for rule in hf_map.rules:
        if _EXPERT_RULE.search(rule.hf):
            continue  # the experts: stacked below
        transforms = list(rule.transforms)
        if arch in _PERMUTED:  # llama.cpp's converter permuted the q/k rows into Ember's order already
            transforms = [t for t in transforms if not isinstance(t, RopePermute)]
        if arch in _GEMMA and rule.ember.endswith(".gamma"):
            transforms = [Offset(1.0)] + transforms
        if rule.ember.endswith("mlp.shared_expert_gate.weight"):  # llama.cpp: a vector of the hidden size
            transforms = [Reshape((cfg.hidden_size,), (1, cfg.hidden_size))] + transforms
        rules.append(Rule(_translate(rule.hf, arch), rule.ember, transforms))
    n = getattr(cfg, "num_experts", 0) or 0
    if n and any(_EXPERT_RULE.search(r.hf) for r in hf_map.rules) and per_expert:
        for ours, theirs in _EXPERTS.items():
            rules.append(Rule(f"blk.{{i}}.{theirs.replace('_exps', '')}.{{e}}.weight",
                              f"layers.{{i}}.mlp.experts.{{e}}.{ours}.weight", [Transpose()]))
    elif n and any(_EXPERT_RULE.search(r.hf) for r in hf_map.rules):
        for e in range(n):
            for ours, theirs in _EXPERTS.items():
                rules.append(Rule(f"blk.{{i}}.{theirs}.weight", f"layers.{{i}}.mlp.experts.{e}.{ours}.weight",
                                  [ExpertPart(e, n), Transpose()]))
    return WeightMap(rules, ignore=[r"^rope_freqs\.weight$", r"^rope_factors_(long|short)\.weight$"])


# ---------------------------------------------------------------------------------- reading
def _int(file, key: str, default=None):
    value = file.metadata.get(key, default)
    if value is None:
        raise PretrainedError(f"metadata {key!r} is missing (a {file.architecture} model needs it)",
                              where=str(file.path))
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PretrainedError(f"metadata {key!r}: expected an integer, found {value!r}", where=str(file.path))
    return int(value)


def _float(file, key: str, default=None):
    value = file.metadata.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PretrainedError(f"metadata {key!r}: expected a number, found {value!r}", where=str(file.path))
    return float(value)


def hf_architecture(file) -> tuple[str, str]:
    """(Ember's model_type, the Hugging Face architecture) of a GGUF file's `general.architecture`."""
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise PretrainedError(f"unsupported GGUF architecture {arch!r}; Ember reads {', '.join(sorted(ARCHITECTURES))}",
                              where=str(file.path))
    experts = file.metadata.get(f"{arch}.expert_count")
    if arch == "llama" and isinstance(experts, int) and not isinstance(experts, bool) and experts > 0:
        return _MIXTRAL
    return ARCHITECTURES[arch]


def arch_config(file, config: dict) -> None:
    """Add to `config` (the config.json keys of the Llama-like part) what the file's architecture adds."""
    arch, mt = file.architecture, config["model_type"]
    layers, heads, hidden = config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]
    config.setdefault("head_dim", hidden // heads if heads > 0 else 0)
    if mt in ("mixtral", "qwen2_moe", "qwen3_moe"):
        n = _int(file, f"{arch}.expert_count")
        config["num_local_experts" if mt == "mixtral" else "num_experts"] = n
        config["num_experts_per_tok"] = _int(file, f"{arch}.expert_used_count")
        if mt != "mixtral":
            stacked = file.tensors.get("blk.0.ffn_gate_exps.weight")  # without the key: the experts' rows
            rows = stacked.shape[1] if stacked is not None and len(stacked.shape) == 3 else None
            config["moe_intermediate_size"] = _int(file, f"{arch}.expert_feed_forward_length",
                                                   rows or config["intermediate_size"])
            config["norm_topk_prob"] = mt == "qwen3_moe"  # what llama.cpp computes (see the doc)
            config["mlp_only_layers"] = []
            config["decoder_sparse_step"] = 1
        if mt == "qwen2_moe":
            config["qkv_bias"] = config["attention_bias"]
            config["shared_expert_intermediate_size"] = _int(file, f"{arch}.expert_shared_feed_forward_length",
                                                             config["intermediate_size"])
    if arch == "phi3":
        original = _int(file, f"{arch}.rope.scaling.original_context_length", config["max_position_embeddings"])
        config["original_max_position_embeddings"] = original
        factors = [name in file.tensors for name in _LONGROPE]
        if any(factors):
            if not all(factors):
                raise PretrainedError(f"the file holds one of {list(_LONGROPE)} (Phi-3's longrope factors) without "
                                      f"the other", where=str(file.path))
            config["rope_scaling"] = _longrope(file, original)
        window = file.metadata.get(f"{arch}.attention.sliding_window")
        if window:
            config["sliding_window"] = _int(file, f"{arch}.attention.sliding_window")
    if arch in _GEMMA:
        config["hidden_act" if arch == "gemma" else "hidden_activation"] = "gelu_pytorch_tanh"
        config.pop("attention_output_bias", None)
        if "rope_scaling" in config:
            scaling = config.pop("rope_scaling")
        else:
            scaling = None
        theta = config.pop("rope_theta")
        rope = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
        if arch != "gemma":
            config["layer_types"] = _layer_types(file, arch, layers)
            default = 4096 if arch == "gemma2" else None  # llama.cpp's gemma2 default; its gemma3 needs the key
            config["sliding_window"] = _int(file, f"{arch}.attention.sliding_window", default)
            config["query_pre_attn_scalar"] = hidden // heads if layers == _BIG[arch] else config["head_dim"]
        if arch == "gemma2":
            config["attn_logit_softcapping"] = _float(file, f"{arch}.attn_logit_softcapping", 50.0)
            config["final_logit_softcapping"] = _float(file, f"{arch}.final_logit_softcapping", 30.0)
        if arch == "gemma3":
            local = _float(file, f"{arch}.rope.freq_base_swa", 10000.0)
            config["final_logit_softcapping"] = None
            config["rope_parameters"] = {"full_attention": rope,
                                         "sliding_attention": {"rope_type": "default", "rope_theta": local}}
        else:
            config["rope_parameters"] = rope


_LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")


def _longrope(file, original: int) -> dict:
    """Phi-3's longrope from the factor tensors (one per frequency) and `rope.scaling.attn_factor`."""
    long, short = (np.asarray(file.read(name), dtype=np.float64).reshape(-1).tolist() for name in _LONGROPE)
    out = {"rope_type": "longrope", "long_factor": long, "short_factor": short,
           "original_max_position_embeddings": original}
    attn = _float(file, f"{file.architecture}.rope.scaling.attn_factor")
    if attn is not None:
        out["attention_factor"] = attn
    return out


def arch_tensors(arch: str, cfg) -> dict[str, np.ndarray]:
    """The tensors an architecture's file holds beyond the parameters: Phi-3's longrope factors."""
    scaling = getattr(cfg, "rope_scaling", None) or {}
    if arch == "phi3" and scaling.get("rope_type") == "longrope":
        return {"rope_factors_long.weight": np.asarray(scaling["long_factor"], dtype=np.float32),
                "rope_factors_short.weight": np.asarray(scaling["short_factor"], dtype=np.float32)}
    return {}


def _layer_types(file, arch: str, layers: int) -> list[str]:
    """Each layer's kind: `{arch}.attention.sliding_window_pattern` as a period (layer i slides when
    i % n < n - 1) or one flag per layer (true: sliding), else llama.cpp's period for the architecture."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = file.metadata.get(key, _SWA_PATTERN[arch])
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list):
        if len(value) != layers or not all(isinstance(v, (bool, int)) for v in value):
            raise PretrainedError(f"metadata {key!r}: expected {layers} flags (one per layer), found {value!r}",
                                  where=str(file.path))
        return ["sliding_attention" if v else "full_attention" for v in value]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PretrainedError(f"metadata {key!r}: expected a positive period or one flag per layer, found {value!r}",
                              where=str(file.path))
    return ["sliding_attention" if i % value < value - 1 else "full_attention" for i in range(layers)]


# ---------------------------------------------------------------------------------- writing
def export_architecture(cfg) -> str | None:
    """llama.cpp's architecture for an Ember config, None when llama.cpp has none for its family."""
    return _EXPORT.get(getattr(cfg, "model_type", None))


def _refuse(cfg, what: str) -> None:
    raise PretrainedError(f"this {cfg.architecture} cannot be written as GGUF: {what}")


def arch_metadata(writer, arch: str, cfg) -> None:
    """Write the architecture's own metadata keys, after refusing a config llama.cpp would run otherwise."""
    mt = cfg.model_type
    if arch in ("qwen2", "qwen3", "qwen2moe", "qwen3moe") and cfg.output_bias:  # llama.cpp: q/k/v biases only
        _refuse(cfg, f"llama.cpp's {arch} has no bias on the attention output (o_proj), which this model has")
    if arch != "llama" and getattr(cfg, "mlp_bias", False):
        _refuse(cfg, f"llama.cpp's {arch} has no biases in the feed-forward block ('mlp_bias' is true)")
    if arch in _GEMMA and cfg.attention_bias:
        _refuse(cfg, "llama.cpp's Gemma has no attention biases ('attention_bias' is true)")
    if arch in ("gemma2", "gemma3"):
        n, layers = _SWA_PATTERN[arch], cfg.num_hidden_layers
        want = ["sliding_attention" if i % n < n - 1 else "full_attention" for i in range(layers)]
        if arch == "gemma3":  # llama.cpp's gemma3 reads the layers' kinds (else five of six slide)
            writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
        elif list(cfg.layer_types or []) != want:
            _refuse(cfg, f"its layer types {cfg.layer_types} are not llama.cpp's {arch} pattern (every layer slides "
                         f"except each {n}th)")
        scale = cfg.hidden_size // cfg.num_attention_heads if layers == _BIG[arch] else cfg.head_dim
        if cfg.query_pre_attn_scalar is not None and not math.isclose(cfg.query_pre_attn_scalar, scale):
            _refuse(cfg, f"'query_pre_attn_scalar' is {cfg.query_pre_attn_scalar}; llama.cpp's {arch} with "
                         f"{layers} layers scales the attention by {scale} ** -0.5")
        if cfg.sliding_window is None:
            _refuse(cfg, "llama.cpp's sliding layers need 'sliding_window'")
        writer.add_sliding_window(int(cfg.sliding_window))
    if arch == "gemma2":
        if cfg.attn_logit_softcapping is None or cfg.final_logit_softcapping is None:
            _refuse(cfg, "llama.cpp's gemma2 always soft-caps the attention scores and the logits; the config "
                         "leaves one of them out")
        writer.add_attn_logit_softcapping(float(cfg.attn_logit_softcapping))
        writer.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
    if arch == "gemma3":
        if cfg.final_logit_softcapping is not None:
            _refuse(cfg, f"'final_logit_softcapping' is {cfg.final_logit_softcapping}; llama.cpp's gemma3 does not "
                         f"soft-cap")
        writer.add_rope_freq_base_swa(float(cfg.rope_local_theta))
    if arch == "phi3":
        scaling = cfg.rope_scaling or {}
        if scaling.get("rope_type") == "longrope":  # the factors are tensors (arch_tensors)
            writer.add_rope_scaling_attn_factors(float(cfg.rope().scaling.attention_factor))
        writer.add_rope_scaling_orig_ctx_len(int(cfg.original_max_position_embeddings or cfg.max_position_embeddings))
        if cfg.sliding_window is not None:  # llama.cpp's converter writes it; llama.cpp (0.3.36) attends to all
            writer.add_sliding_window(int(cfg.sliding_window))
    elif arch not in _GEMMA and arch != "llama" and getattr(cfg, "sliding_window", None) is not None:
        # (a Mistral's window is left out as llama.cpp's converter leaves it: llama.cpp attends to all)
        _refuse(cfg, f"llama.cpp's {arch} has no sliding window ('sliding_window' is {cfg.sliding_window})")
    if mt in ("mixtral", "qwen2_moe", "qwen3_moe"):
        dense = [i for i in range(cfg.num_hidden_layers) if not cfg.is_sparse(i)]
        if dense:
            _refuse(cfg, f"layers {dense} have a dense feed-forward block ('mlp_only_layers' / "
                         f"'decoder_sparse_step'); llama.cpp's {arch} has experts in every layer")
        norm = mt != "qwen2_moe"
        if cfg.norm_topk_prob != norm:
            _refuse(cfg, f"'norm_topk_prob' is {cfg.norm_topk_prob}; llama.cpp's {mt} "
                         f"{'always' if norm else 'never'} renormalises the chosen experts' weights")
        writer.add_expert_count(int(cfg.num_experts))
        writer.add_expert_used_count(int(cfg.num_experts_per_tok))
        if mt != "mixtral":
            writer.add_expert_feed_forward_length(int(cfg.moe_intermediate_size))
        if mt == "qwen2_moe":
            writer.add_expert_shared_feed_forward_length(int(cfg.shared_expert_intermediate_size))
