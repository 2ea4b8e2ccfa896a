"""Clear refusals for checkpoints Ember does not read (issue 47, item 5), from config.json alone,
before any weight file is looked at:

- a **quantized** checkpoint (GPTQ, AWQ, bitsandbytes, FP8, compressed-tensors, ...: config.json's
  `quantization_config`, or AutoGPTQ's / AutoAWQ's `quantize_config.json` / `quant_config.json`
  beside it) names its method and settings instead of failing later on a float tensor its packed
  weights replace ("up_proj.weight is missing");
- an **unsupported architecture** names the closest supported family and what differs, so the user
  knows whether a conversion could work.
"""
from __future__ import annotations

import json
from pathlib import Path

from .hf_folder import PretrainedError

__all__ = ["closest_family", "refuse_quantized"]

# what each method stores instead of float weights (transformers' quant_method names)
_METHODS = {
    "gptq": "GPTQ: weights packed as integers (qweight, qzeros, scales, g_idx)",
    "awq": "AWQ: weights packed as integers (qweight, qzeros, scales)",
    "bitsandbytes": "bitsandbytes: int8 or 4-bit NF4 / FP4 weights with their quantization state",
    "fp8": "FP8: float8 weights with per-block scales (weight_scale_inv)",
    "fbgemm_fp8": "FP8 (fbgemm): float8 weights with per-row scales",
    "compressed-tensors": "compressed-tensors: packed integer or float8 weights with their scales",
    "hqq": "HQQ: packed low-bit weights with zeros and scales",
    "eetq": "EETQ: int8 weights with scales",
    "quanto": "quanto: int or float8 weights with scales",
    "torchao": "torchao: quantized tensor subclasses",
    "aqlm": "AQLM: additive codebooks",
    "bitnet": "BitNet: ternary packed weights",
    "mxfp4": "MXFP4: 4-bit microscaling blocks",
}
_SETTINGS = ("bits", "w_bit", "group_size", "q_group_size", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
             "fmt", "weight_block_size", "activation_scheme", "format", "version")
_SIDE_FILES = ("quantize_config.json", "quant_config.json")  # AutoGPTQ, AutoAWQ


def _describe(qc: dict) -> tuple[str, str]:
    method = qc.get("quant_method")
    if not isinstance(method, str) or not method:
        method = "bitsandbytes" if qc.get("load_in_4bit") or qc.get("load_in_8bit") else "unknown"
    method = method.lower()
    parts = []
    for k in _SETTINGS:
        v = qc.get(k)
        if isinstance(v, (str, int, float, bool)) or isinstance(v, list) and len(v) <= 4:
            parts.append(f"{k} {v!r}")
    return method, ", ".join(parts)


def refuse_quantized(config: dict, where: str) -> None:
    """Raise a PretrainedError naming the quantization of a quantized checkpoint (`where`: its
    config.json); return for a float one."""
    qc = config.get("quantization_config")
    side = None
    if qc is None:
        folder = Path(where).parent
        for name in _SIDE_FILES:
            path = folder / name
            try:
                if path.is_file() and path.stat().st_size <= 1 << 16:
                    loaded = json.loads(path.read_text(encoding="utf-8"))
                    if isinstance(loaded, dict):
                        qc, side = loaded, str(path)
                        break
            except (OSError, ValueError):
                continue
    if qc is None:
        return
    if not isinstance(qc, dict):
        raise PretrainedError(f"'quantization_config' must be an object, found {type(qc).__name__}: a quantized "
                              f"checkpoint, which Ember does not read", where=where)
    method, settings = _describe(qc)
    if side is not None and method == "unknown":
        method = "awq" if "w_bit" in qc or "zero_point" in qc else "gptq"
    what = _METHODS.get(method, f"{method}: quantized weights")
    source = f"{Path(side).name} beside config.json" if side else "config.json's quantization_config"
    raise PretrainedError(
        f"a quantized checkpoint ({source}: quant_method {method!r}{', ' + settings if settings else ''}) is not "
        f"supported: {what}, where Ember reads float weights (F32, F16, BF16). Open the unquantized model instead "
        f"(to fine-tune in less memory, Ember's QLoRA quantizes a float model to NF4 itself)", where=side or where)


# ---------------------------------------------------------------------------------- closest family
# model_type -> (the closest supported architecture, what differs from it)
_CLOSEST = {
    "qwen3": ("Qwen2ForCausalLM", "Qwen3 adds per-head RMS norms on the queries and keys"),
    "qwen3_moe": ("Qwen2ForCausalLM", "Qwen3-MoE adds q/k norms and routes each token to a few experts (mixture "
                                      "of experts)"),
    "qwen2_moe": ("Qwen2ForCausalLM", "Qwen2-MoE routes each token to a few experts plus a gated shared expert"),
    "mixtral": ("MistralForCausalLM", "Mixtral routes each token to 2 of 8 experts (mixture of experts)"),
    "gemma": ("LlamaForCausalLM", "Gemma scales the embeddings by sqrt(hidden), its norms multiply by (1 + w), "
                                  "GeLU MLP"),
    "gemma2": ("LlamaForCausalLM", "Gemma 2 adds logit soft-capping, four norms per layer and alternating sliding / "
                                   "global attention"),
    "gemma3": ("Gemma3ForCausalLM", "the multimodal Gemma 3 adds a vision tower and keeps the text model's "
                                    "weights under model.language_model"),
    "gemma3_text": ("LlamaForCausalLM", "Gemma 3 adds q/k norms, local and global rope bases and sliding windows"),
    "phi3": ("LlamaForCausalLM", "Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj"),
    "phi": ("GPT2LMHeadModel", "Phi-1/2 use parallel attention and MLP blocks with partial rotary embeddings"),
    "olmo": ("LlamaForCausalLM", "OLMo uses a LayerNorm without parameters"),
    "olmo2": ("LlamaForCausalLM", "OLMo 2 puts its norms after attention and MLP and adds q/k norms"),
    "granite": ("LlamaForCausalLM", "Granite scales embeddings, residuals, attention and logits by config "
                                    "multipliers"),
    "cohere": ("LlamaForCausalLM", "Cohere uses parallel attention and MLP with a LayerNorm and scaled logits"),
    "internlm2": ("LlamaForCausalLM", "InternLM2 fuses q/k/v into wqkv and names its tensors differently"),
    "deepseek_v2": ("LlamaForCausalLM", "DeepSeek-V2 uses multi-head latent attention and mixture-of-experts layers"),
    "deepseek_v3": ("LlamaForCausalLM", "DeepSeek-V3 uses multi-head latent attention and mixture-of-experts layers"),
    "stablelm": ("LlamaForCausalLM", "StableLM uses LayerNorms and partial rotary embeddings"),
    "starcoder2": ("MistralForCausalLM", "Starcoder2 uses LayerNorms with biases and a GeLU MLP"),
    "falcon": ("LlamaForCausalLM", "Falcon uses parallel attention with multi-query heads and LayerNorms"),
    "gpt_neox": ("GPT2LMHeadModel", "GPT-NeoX uses rotary embeddings and parallel residuals"),
    "gptj": ("GPT2LMHeadModel", "GPT-J uses rotary embeddings and parallel attention and MLP"),
    "gpt_neo": ("GPT2LMHeadModel", "GPT-Neo alternates local and global attention"),
    "gpt_bigcode": ("GPT2LMHeadModel", "GPTBigCode (StarCoder) uses multi-query attention"),
    "opt": ("GPT2LMHeadModel", "OPT uses ReLU and learned positions offset by 2"),
    "bloom": ("GPT2LMHeadModel", "BLOOM uses ALiBi position biases instead of learned positions"),
    "roberta": ("BertModel", "RoBERTa offsets its positions by the padding id and has no token types"),
    "xlm-roberta": ("BertModel", "XLM-RoBERTa offsets its positions by the padding id"),
    "camembert": ("BertModel", "CamemBERT is a RoBERTa: positions offset by the padding id"),
    "distilbert": ("BertModel", "DistilBERT has no token types and names its tensors differently"),
    "electra": ("BertModel", "ELECTRA projects its smaller embeddings to the hidden size"),
    "albert": ("BertModel", "ALBERT shares one layer's weights across all layers and factorizes its embeddings"),
    "deberta": ("BertModel", "DeBERTa uses disentangled relative-position attention"),
    "deberta-v2": ("BertModel", "DeBERTa-v2 uses disentangled relative-position attention"),
    "modernbert": ("BertModel", "ModernBERT uses rotary embeddings, GeGLU and alternating local attention"),
    "deit": ("ViTForImageClassification", "DeiT adds a distillation token"),
    "beit": ("ViTForImageClassification", "BEiT uses relative position biases and layer scales"),
    "dinov2": ("ViTForImageClassification", "DINOv2 adds layer scales and interpolated positions"),
    "swin": ("ViTForImageClassification", "Swin uses shifted windows and merges patches between stages"),
}
# an architecture's suffix -> the closest supported architecture when its model_type is not listed
_BY_SUFFIX = (("ForCausalLM", "LlamaForCausalLM"), ("LMHeadModel", "GPT2LMHeadModel"),
              ("ForImageClassification", "ViTForImageClassification"), ("ForMaskedLM", "BertForMaskedLM"),
              ("ForSequenceClassification", "BertForSequenceClassification"),
              ("ForTokenClassification", "BertForTokenClassification"))
_NO_RELATIVE = {"t5": "an encoder-decoder", "mt5": "an encoder-decoder", "bart": "an encoder-decoder",
                "whisper": "a speech encoder-decoder", "mamba": "a state-space model", "mamba2": "a state-space model",
                "rwkv": "a recurrent model", "jamba": "a hybrid state-space model"}


def closest_family(archs, model_type, supported: list[str]) -> str:
    """A sentence naming the supported architecture closest to a refused one and what differs
    (empty when nothing is close); `supported`: the architectures Ember reads."""
    if isinstance(model_type, str) and model_type in _NO_RELATIVE:
        return f"; {model_type} is {_NO_RELATIVE[model_type]}, and no supported family is close to it"
    hit = _CLOSEST.get(model_type) if isinstance(model_type, str) else None
    if hit is not None and hit[0] in supported:
        return f"; the closest supported family is {hit[0]} ({hit[1]}, so its weights do not fit)"
    for arch in archs or []:
        for suffix, near in _BY_SUFFIX:
            if arch.endswith(suffix) and near in supported:
                return f"; the closest supported kind of model is {near} (the same task; the layers may differ)"
    return ""
