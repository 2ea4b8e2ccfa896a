"""The exported PyTorch training script for issue 47's families: Qwen3 (q/k norms), Phi-3 (its fused qkv_proj
and gate_up_proj: Ember's LoRA gives their parts one shared A, peft's one LoRA over the module) and Mixtral
(every expert: peft's LoRA on transformers 5's fused experts) with an all-linear LoRA, Qwen3-MoE's experts and
the mixtures' routers train in the script with Ember's losses over 5 AdamW steps (needs a Python with torch +
transformers + peft, the oracle venv; skipped visibly without one). A LoRA on some parts of a fused module
only (q without k and v, w1 without w3) is refused before anything is written: peft trains one LoRA over
the whole module."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import Device, optim
from engine.interop import export_training_script
from engine.models import from_pretrained
from engine.models.peft import peft_lora
from engine.module import Lora, ParamGroup
from engine.train import Learner, TrainingConfig
from engine.train.text import load_tokenizer, text_data_for_model
from tests.engine.models.test_training_script import _compare, _run_script, _torch_side, corpus

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
CONFIG = TrainingConfig(num_epochs=1, batch_size=4, seed=3, grad_accumulation=1, warmup_steps=0, max_grad_norm=1.0)
ADAMW = optim.AdamWConfig(weight_decay=0.01)


@pytest.mark.parametrize("name, targets", [("qwen3", "all-linear"), ("phi3", "all-linear"),
                                           ("mixtral", "all-linear"), ("qwen3-moe", r".*\.(o_proj|experts\.\d+\.\w+)"),
                                           ("qwen2-moe", ["q_proj", "v_proj", "shared_expert_gate", "gate"])])
def test_the_script_trains_a_lora_with_embers_losses(name, targets, tmp_path):
    python = _torch_side()
    base = from_pretrained(HF / name)
    Device("cpu").seed(0)
    model = base.apply_lora(peft_lora(base, r=4, lora_alpha=8, target_modules=targets, init_std=0.05))
    # the tiny models share llama-gqa's vocabulary of 128: its tokenizer makes their rows
    data = text_data_for_model(model, corpus(tmp_path / "corpus.txt"), load_tokenizer(HF / "llama-gqa"),
                               block_size=16, per_line=True)
    out = export_training_script(model, tmp_path / "export", data=data, training_config=CONFIG, optimizer=ADAMW,
                                 lr=1e-2)
    cfg = json.loads((tmp_path / "export" / "train_config.json").read_text())
    text = json.dumps(cfg)
    assert ("o_proj" in text and "qkv_proj" in text) if name == "phi3" else ("o_proj" in text or "q_proj" in text)
    if name in ("mixtral", "qwen2-moe"):  # the router's LoRA trains through the routing in the script too
        assert "model.layers.0.mlp.gate.weight" in cfg["lora"]["target_parameters"]
    if name in ("mixtral", "qwen3-moe"):  # the experts: peft's LoRA on transformers 5's fused parameters
        assert "model.layers.0.mlp.experts.gate_up_proj" in cfg["lora"]["target_parameters"]
    result = Learner(out.model, ADAMW.init(), lr=1e-2, train=data, kind="causal-lm", config=CONFIG).run()
    assert result.status == "finished", result.error
    losses = tmp_path / "losses.json"
    _run_script([python, str(out.script), "--steps", "5", "--losses", str(losses), "--out", str(tmp_path / "t")],
                tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 5)
    print(f"{name}: Ember vs the exported script, 5 steps: |loss difference| {['%.1e' % d for d in diffs]}")


def test_a_lora_on_part_of_a_mixtures_fused_experts_is_refused_before_writing(tmp_path):
    """w1 without w3: peft's one LoRA over the fused gate_up_proj cannot train the gate rows alone."""
    from engine.models import PretrainedError

    base = from_pretrained(HF / "mixtral")
    model = base.apply_lora(peft_lora(base, r=4, lora_alpha=8, target_modules=["w1", "w2"]))
    data = text_data_for_model(model, corpus(tmp_path / "corpus.txt"), load_tokenizer(HF / "llama-gqa"),
                               block_size=16, per_line=True)
    with pytest.raises(PretrainedError, match=r"a LoRA on a part of the fused module "
                                              r"'model\.layers\.0\.mlp\.experts\.gate_up_proj' .*\(1 of its 2 parts"):
        export_training_script(model, tmp_path / "export", data=data, training_config=CONFIG, optimizer=ADAMW,
                               lr=1e-2)
    assert not (tmp_path / "export").exists()


def test_a_lora_on_a_fused_module_is_refused_before_writing(tmp_path):
    from engine.models import PretrainedError

    base = from_pretrained(HF / "phi3")
    query = ParamGroup.from_paths(["layers.0.self_attn.query.weight"])  # q alone, not k and v
    model = base.apply_lora(Lora(4, 8.0, param_group=query))
    data = text_data_for_model(model, corpus(tmp_path / "corpus.txt"), load_tokenizer(HF / "llama-gqa"),
                               block_size=16, per_line=True)
    with pytest.raises(PretrainedError, match=r"a part of the fused module 'model\.layers\.0\.self_attn\.qkv_proj' "
                                              r".*\(1 of its 3 parts adapted"):
        export_training_script(model, tmp_path / "export", data=data, training_config=CONFIG, optimizer=ADAMW,
                               lr=1e-2)
    assert not (tmp_path / "export").exists()
