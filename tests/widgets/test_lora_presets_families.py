"""The LoRA dialog's PEFT target presets for issue 47's families: Qwen3 gets Llama's presets (its
projections have Llama's names), Phi-3 the fused `qkv_proj` / `gate_up_proj` ones; each preset
selects the Ember weights that peft's LoRA on those Hugging Face modules adapts."""
from pathlib import Path

import pytest

from engine.models import from_pretrained
from engine.models.peft import target_group
from widgets.lora_dialog import LoraDialog, peft_target_modules, target_presets

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.mark.parametrize("name, presets", [
    ("qwen3", ["q_proj, v_proj", "q_proj, k_proj, v_proj, o_proj", "all-linear"]),
    ("phi3", ["qkv_proj", "qkv_proj, o_proj", "gate_up_proj, down_proj", "all-linear"]),
])
def test_family_presets(name, presets, qtbot):
    model = from_pretrained(HF / name)
    keys = [k for k, _ in target_presets(model)]
    assert keys[:len(presets)] == presets and keys[len(presets):] == ["custom", "group"]
    d = LoraDialog(model)
    qtbot.addWidget(d)
    counts = {}
    for key in presets:
        d.set_targets(key)
        counts[key] = d.preview_counts["targets"]
        group = target_group(model, peft_target_modules(key))
        assert counts[key] == sum(group.matches(p.id, path) for path, p in model.named_params())
    if name == "phi3":  # the fused modules are split into Ember's parts: 3 per qkv_proj, 2 per gate_up_proj
        assert counts["qkv_proj"] == 2 * 3 and counts["qkv_proj, o_proj"] == 2 * 4
        assert counts["gate_up_proj, down_proj"] == 2 * 3 and counts["all-linear"] == 2 * 7
    else:
        assert counts["q_proj, v_proj"] == 4 and counts["all-linear"] == 14
