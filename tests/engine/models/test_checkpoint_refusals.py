"""Clear refusals from config.json alone (issue 47, item 5): a quantized checkpoint names its
quantization instead of "up_proj.weight is missing"; an unsupported architecture names the
closest supported family and what differs. The folders are tiny, written here: a copy of the
tiny Llama fixture whose config.json gains a `quantization_config` (and, for GPTQ, whose MLP
weights become GPTQ's packed tensors)."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine.models import PretrainedError, from_pretrained, open_checkpoint

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"

# quant_method: (quantization_config as transformers writes it, words the refusal must hold)
QUANTIZED = {
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
             r"quant_method 'gptq', bits 4, group_size 128\) is not supported: GPTQ: weights packed as integers"),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
            r"quant_method 'awq', bits 4, group_size 128, version 'gemm'\) is not supported: AWQ"),
    "bitsandbytes-4bit": ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                           "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16"},
                          r"quant_method 'bitsandbytes', load_in_4bit True, load_in_8bit False, bnb_4bit_quant_type "
                          r"'nf4'\) is not supported: bitsandbytes: int8 or 4-bit NF4"),
    "bitsandbytes-8bit-old": ({"load_in_8bit": True, "llm_int8_threshold": 6.0},
                              r"quant_method 'bitsandbytes', load_in_8bit True\) is not supported"),
    "fp8": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
            r"quant_method 'fp8', fmt 'e4m3', weight_block_size \[128, 128\], activation_scheme 'dynamic'\) is not "
            r"supported: FP8: float8 weights"),
    "compressed-tensors": ({"quant_method": "compressed-tensors", "format": "pack-quantized"},
                           r"quant_method 'compressed-tensors', format 'pack-quantized'\) is not supported"),
    "a-new-method": ({"quant_method": "newq", "bits": 3}, r"quant_method 'newq', bits 3\) is not supported: newq: "
                                                          r"quantized weights"),
}


def _folder(tmp_path: Path, **config_changes) -> Path:
    out = tmp_path / "model"
    shutil.copytree(HF / "llama-gqa", out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(config_changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _gptq_weights(folder: Path) -> None:
    """Replace each MLP projection's float weight by GPTQ's packed tensors (qweight I32, qzeros I32,
    scales F16), as AutoGPTQ / optimum write them."""
    path = folder / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    head.pop("__metadata__", None)
    blobs, out, offset = {}, {}, 0
    for name, d in head.items():
        b, e = d["data_offsets"]
        blobs[name] = (d["dtype"], d["shape"], data[8 + n + b: 8 + n + e])
    for name in [k for k in blobs if k.endswith(("up_proj.weight", "gate_proj.weight", "down_proj.weight"))]:
        _, (rows, cols), _ = blobs.pop(name)
        stem = name[: -len(".weight")]
        blobs[f"{stem}.qweight"] = ("I32", [cols // 8, rows], np.zeros((cols // 8, rows), np.int32).tobytes())
        blobs[f"{stem}.qzeros"] = ("I32", [1, rows // 8], np.zeros((1, rows // 8), np.int32).tobytes())
        blobs[f"{stem}.scales"] = ("F16", [1, rows], np.ones((1, rows), np.float16).tobytes())
    for name, (dtype, shape, raw) in blobs.items():
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(out).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in blobs.values()))


def test_a_gptq_checkpoint_names_its_quantization_not_a_missing_weight(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(HF / "llama-gqa", folder)
    _gptq_weights(folder)
    # without its quantization_config the packed weights read as a missing float weight (the old message)
    with pytest.raises(PretrainedError, match=r"mlp\.(up|gate|down)_proj\.weight' .*is missing"):
        from_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = QUANTIZED["gptq"][0]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedError, match=QUANTIZED["gptq"][1]) as err:
        from_pretrained(folder)
    msg = str(err.value)
    assert "is missing" not in msg and "config.json's quantization_config" in msg and "QLoRA" in msg
    assert err.value.where == str(folder / "config.json")


@pytest.mark.parametrize("method", list(QUANTIZED))
def test_each_quantization_method_is_named(method, tmp_path):
    qc, words = QUANTIZED[method]
    folder = _folder(tmp_path, quantization_config=qc)
    with pytest.raises(PretrainedError, match=words):
        from_pretrained(folder)
    # the check runs on config.json before any weight file is opened
    (folder / "model.safetensors").unlink()
    with pytest.raises(PretrainedError, match=words):
        from_pretrained(folder)


@pytest.mark.parametrize("side, body, method", [
    ("quantize_config.json", {"bits": 4, "group_size": 128, "desc_act": False}, "gptq"),
    ("quant_config.json", {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}, "awq"),
])
def test_autogptq_and_autoawq_side_files_are_named(tmp_path, side, body, method):
    folder = _folder(tmp_path)
    (folder / side).write_text(json.dumps(body))
    with pytest.raises(PretrainedError, match=rf"a quantized checkpoint \({side} beside config.json: quant_method "
                                              rf"'{method}'") as err:
        from_pretrained(folder)
    assert err.value.where == str(folder / side)


def test_a_quantization_config_that_is_not_an_object_is_refused(tmp_path):
    with pytest.raises(PretrainedError, match=r"'quantization_config' must be an object, found str"):
        from_pretrained(_folder(tmp_path, quantization_config="gptq"))


def test_a_float_checkpoint_still_opens():
    assert from_pretrained(HF / "llama-gqa") is not None
    assert open_checkpoint(HF / "llama-gqa").config["model_type"] == "llama"


@pytest.mark.parametrize("arch, model_type, words", [
    ("OlmoForCausalLM", "olmo", r"found OlmoForCausalLM; the closest supported family is LlamaForCausalLM \(OLMo uses "
                                r"a LayerNorm without parameters, so its weights do not fit\); supported: "),
    ("InternLM2ForCausalLM", "internlm2", r"closest supported family is LlamaForCausalLM \(InternLM2 fuses q/k/v"),
    ("RobertaModel", "roberta", r"closest supported family is BertModel \(RoBERTa offsets its positions"),
    ("GPTNeoXForCausalLM", "gpt_neox", r"closest supported family is GPT2LMHeadModel \(GPT-NeoX uses rotary"),
    ("DeiTForImageClassification", "deit", r"closest supported family is ViTForImageClassification"),
    ("Gemma3ForConditionalGeneration", "gemma3", r"closest supported family is Gemma3ForCausalLM \(the multimodal "
                                                 r"Gemma 3 adds a vision tower and keeps the text model's weights under "
                                                 r"model\.language_model, so its weights do not fit\)"),
    ("T5ForConditionalGeneration", "t5", r"t5 is an encoder-decoder, and no supported family is close to it"),
    ("BrandNewForCausalLM", "brand_new", r"found BrandNewForCausalLM; the closest supported kind of model is "
                                         r"LlamaForCausalLM \(the same task; the layers may differ\)"),
])
def test_an_unsupported_architecture_names_the_closest_supported_family(tmp_path, arch, model_type, words):
    folder = _folder(tmp_path, architectures=[arch], model_type=model_type)
    with pytest.raises(PretrainedError, match=r"unsupported architecture: " + (words if words.startswith("found")
                                                                               else ".*" + words)):
        from_pretrained(folder)
