"""PEFT (Hugging Face `peft`) LoRA adapters in and out: `load_peft_adapter`, `save_peft_adapter`.

An adapter folder holds `adapter_config.json` and `adapter_model.safetensors`, tensors named

    base_model.model.<module>.lora_A.weight          [r, d_in]       Ember lora.a [d_in, r]: transposed
    base_model.model.<module>.lora_B.weight          [d_out, r]      Ember lora.b [r, d_out]: transposed
    base_model.model.<module>.lora_magnitude_vector  [d_out]         DoRA (use_dora): Ember lora.magnitude
    base_model.model.<module>.lora_embedding_A       [r, V]          an Embedding's LoRA: Ember lora.a [V, r]
    base_model.model.<module>.lora_embedding_B       [d, r]          Ember lora.b [r, d]
    base_model.model.<module>.base_layer.weight      the base weight peft saves along with an embedding LoRA
    base_model.model.<module>.<param>                a module of `modules_to_save`, whole (`lm_head.weight`)
    base_model.model.<module>.base_layer.bias        `bias` "lora_only" / "all": an adapted module's bias
    base_model.model.<module>.bias                   `bias` "all": any other bias

where `<module>` is the Hugging Face module path (`model.layers.0.self_attn.q_proj`): for a model of
a known family (`from_pretrained`) it comes from the family's weight map (`pretrained_names`), for
any other model it is the Ember module path. The factors go through the same layout transforms as
the weight they adapt (`engine.models.mapping`): the B factor's rows (and a DoRA magnitude) of
Llama's q_proj / k_proj are permuted like the weight's rows (rotary convention), and GPT-2's fused
`c_attn` LoRA (one A, one B of 3·d rows) becomes three LoRAs on Ember's query / key / value with
one A (the same parameter, so they train as peft trains the fused module; Phi-3's `qkv_proj` /
`gate_up_proj` likewise) and B's three row blocks: the same function exactly. Saving parts that
share an A writes one LoRA; three LoRAs with their own A write one c_attn LoRA of their summed rank
whose B is block diagonal (again exact), with its rank and alpha in `rank_pattern` / `alpha_pattern`.

A mixture's experts (transformers 5 fuses them: `mlp.experts.gate_up_proj` [E, 2I, H], `down_proj`
[E, H, I]) take peft's LoRA on a parameter (`target_parameters`, a ParamWrapper per fused parameter):

    base_model.model.<layer>.mlp.experts[.base_layer].lora_A.weight   [r · E, d_in]   expert e: rows e·r … (e+1)·r
    base_model.model.<layer>.mlp.experts[.base_layer].lora_B.weight   [parts · d_out, r · E]   expert e: columns e, e+E, …

(`.base_layer` on gate_up_proj's when both are targeted: peft nests its wrappers). Each expert's
gate_proj and up_proj (gate rows first) get one LoRA each with that expert's A, shared, and down_proj
its own: the same function, trained as peft trains it. Ember writes expert LoRAs in this form
(`peft_targets.FusedExpert`); an adapter of transformers 4's per-expert modules (`experts.0.w1`)
still loads.

The scale of a module's adapter is `alpha / r` (`alpha / sqrt(r)` with `use_rslora`), `r` and
`alpha` from `rank_pattern` / `alpha_pattern` where a key matches the module (peft's rule), else
`r` / `lora_alpha`. `target_modules` is a list (exact name or suffix after a dot), a regex (full
match) or "all-linear" (every Linear but the output head); `target_group` and `peft_lora` apply
the same rules to attach fresh adapters.

`modules_to_save` and `bias` (`engine.models.peft_full`): the adapter's values replace the model's
own parameters, which stay trainable (Ember keeps no second copy); saving writes the trainable base
parameters back the same way, and refuses one peft could not express.

Loading checks the config and every tensor's name, dtype and shape from the header before it reads
anything, and never runs code from the folder (no pickle). An adapter for another base, a
tensor no module fits, a target without its tensors, an unsupported `peft_type` or option: a
`PretrainedError` naming the file and the tensor; the model is never changed (a new one is returned).
An adapter that would load broken is refused too: adapter_config.json is read as config.json is
(bounded, nested at most 64 levels, no NaN / Infinity), `lora_alpha` and `alpha_pattern` must be
finite of magnitude at most 2^20, `r` and `rank_pattern` positive integers up to 2^20,
`use_rslora` / `use_dora` true or false; the weights file must end with its last tensor's data
(nothing after it is read) and each tensor is read once, when needed; a NaN or infinite value is
refused naming its tensor, as is an update `scale * B @ A` that can leave float32's range.

Saving writes both files into a staging folder and swaps it in at once
(`engine.store.atomic.save_folder`): a save killed at any moment leaves the old adapter or the
new one, never the config of one and the tensors of the other; a full disk is a
PretrainedError and leaves the old adapter.
"""
from __future__ import annotations

from .peft_full import full_candidates, peft_full_paths, peft_train_fully
from .peft_read import MAX_ALPHA, MAX_RANK, load_peft_adapter
from .peft_targets import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX, FusedExpert, PeftTarget, fused_tensor_prefixes,
                           peft_lora, peft_targets, target_group)
from .peft_write import save_peft_adapter

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "MAX_ALPHA", "MAX_RANK", "PREFIX", "FusedExpert", "PeftTarget",
           "full_candidates", "fused_tensor_prefixes", "load_peft_adapter",
           "peft_full_paths", "peft_lora", "peft_targets", "peft_train_fully", "save_peft_adapter", "target_group"]
