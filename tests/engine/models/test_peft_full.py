"""PEFT `modules_to_save` and `bias` "lora_only" / "all" both ways (issue 47, item 3).

Always run: the peft-written adapters of tests/fixtures/peft/ made for this (make_peft_fixtures.py:
llama-modules-to-save -- embed_tokens, lm_head and every norm by peft's endswith rule --,
qwen2-bias-lora-only, qwen2-bias-all, gpt2-bias-ln_f -- the fused c_attn bias and ln_f whole --,
gpt2-bias-all; every trained tensor moved off the base) load in Ember with peft's logits, train what
peft trains, and save back the tensors peft wrote; what peft could not express is refused.

Optional (skipped without a Python with torch + transformers + peft: this one, $EMBER_ORACLE_PYTHON or
/work/oracle-venv/bin/python, run in a subprocess): adapters Ember trained with modules_to_save and each
bias mode load in `PeftModel.from_pretrained` with Ember's logits.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine import Device, Tensor, optim
from engine.models import PretrainedError, from_pretrained, load_peft_adapter, save_peft_adapter
from engine.models.peft import peft_lora, peft_train_fully

from tests.engine.models.test_peft import _logits, _tensors

FIX = Path(__file__).resolve().parents[2] / "fixtures"
HF, PEFT = FIX / "hf", FIX / "peft"
ATOL = 1e-4
# adapter folder: (base folder, Ember paths that train whole)
FULL = {
    "llama-modules-to-save": ("llama-gqa", {"embed_tokens.weight", "lm_head.weight", "norm.gamma",
                                            *(f"layers.{i}.{n}.gamma" for i in (0, 1)
                                              for n in ("input_layernorm", "post_attention_layernorm"))}),
    "qwen2-bias-lora-only": ("qwen2", {f"layers.{i}.self_attn.{n}.bias" for i in (0, 1) for n in ("query", "value")}),
    "qwen2-bias-all": ("qwen2", {f"layers.{i}.self_attn.{n}.bias" for i in (0, 1) for n in ("query", "key", "value")}),
    "gpt2-bias-ln_f": ("gpt2", {"ln_f.gamma", "ln_f.beta",
                                *(f"h.{i}.attn.{n}.bias" for i in (0, 1) for n in ("query", "key", "value"))}),
    "gpt2-bias-all": ("gpt2", {"ln_f.beta", "h.0.ln_1.beta", "h.0.ln_2.beta", "h.1.ln_1.beta", "h.1.ln_2.beta",
                               *(f"h.{i}.{n}.bias" for i in (0, 1) for n in ("attn.query", "attn.key", "attn.value",
                                               "attn.output", "mlp.c_fc", "mlp.c_proj"))}),
}


def _trainable(model):
    return {p for p, q in model.named_params() if q.is_active() and ".lora." not in p}


@pytest.mark.parametrize("name", list(FULL))
def test_peft_written_adapter_with_whole_modules_or_biases_gives_peft_logits(name):
    base_name, whole = FULL[name]
    base = from_pretrained(HF / base_name)
    tuned = load_peft_adapter(base, PEFT / name)
    exp = np.load(PEFT / name / "expected.npz")
    np.testing.assert_allclose(_logits(tuned, exp), exp["logits"], rtol=0, atol=ATOL)
    assert _trainable(tuned) == whole  # what peft trains, and nothing else of the base
    # the whole tensors matter: the base with only the LoRA factors gives other logits
    cfg = json.loads((PEFT / name / "adapter_config.json").read_text())
    stored = _tensors(PEFT / name / "adapter_model.safetensors")
    whole_names = [n for n in stored if ".lora_" not in n]
    assert whole_names and len(whole_names) < len(stored)
    assert cfg["modules_to_save"] or cfg["bias"] != "none"
    # the base model is untouched
    np.testing.assert_allclose(_logits(base, np.load(HF / base_name / "expected.npz")),
                               np.load(HF / base_name / "expected.npz")["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(FULL))
def test_saving_writes_back_the_tensors_peft_wrote(name, tmp_path):
    base_name, _ = FULL[name]
    tuned = load_peft_adapter(from_pretrained(HF / base_name), PEFT / name)
    save_peft_adapter(tuned, tmp_path / "out")
    mine = _tensors(tmp_path / "out" / "adapter_model.safetensors")
    theirs = _tensors(PEFT / name / "adapter_model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for n in theirs:
        np.testing.assert_array_equal(mine[n], theirs[n], err_msg=n)  # split c_attn bias, rotary rows: exact
    cfg, ref = (json.loads((f / "adapter_config.json").read_text()) for f in (tmp_path / "out", PEFT / name))
    assert cfg["bias"] == ref["bias"]
    # modules_to_save written as full names; by peft's endswith rule they select the same modules
    mods = {n[len("base_model.model."):].rpartition(".")[0] for n in theirs if ".lora_" not in n
            and not n.endswith("bias") or ref["modules_to_save"] and any(
                n[len("base_model.model."):].rpartition(".")[0].endswith(e) for e in ref["modules_to_save"])}
    assert set(cfg["modules_to_save"] or []) == (mods if ref["modules_to_save"] else set())
    again = load_peft_adapter(from_pretrained(HF / base_name), tmp_path / "out")
    exp = np.load(PEFT / name / "expected.npz")
    np.testing.assert_allclose(_logits(again, exp), exp["logits"], rtol=0, atol=ATOL)


def _train(model, steps=3, seed=0):
    Device("cpu").seed(seed)
    tuned = model.valid().train()
    exp = np.load(HF / "llama-gqa" / "expected.npz")
    ids = Tensor.from_data(exp["input_ids"])
    target = Tensor.from_data(np.random.default_rng(seed).standard_normal((2, 7, 128)).astype(np.float32))
    opt = optim.AdamConfig().init()
    for _ in range(steps):
        d = tuned.forward(ids) - target
        loss = (d * d).mean()
        tuned = opt.step(0.05, tuned, optim.GradientsParams.from_grads(loss.backward(), tuned))
    return tuned


# base, LoRA targets, modules_to_save, bias, Ember paths that must have trained
VARIANTS = {
    "llama-embed-head": ("llama-gqa", ["q_proj", "v_proj"], ["embed_tokens", "lm_head"], "none",
                         ["embed_tokens.weight", "lm_head.weight"]),
    "qwen2-lora-only": ("qwen2", ["q_proj", "k_proj"], None, "lora_only", ["layers.0.self_attn.key.bias"]),
    "qwen2-all-norm": ("qwen2", ["o_proj"], ["model.norm"], "all", ["layers.1.self_attn.value.bias", "norm.gamma"]),
    "gpt2-all-ln_f": ("gpt2", ["c_attn", "c_fc"], ["ln_f"], "all", ["h.0.attn.key.bias", "ln_f.gamma"]),
}


def _ember_trained(variant):
    base_name, targets, mts, bias, moved = VARIANTS[variant]
    model = from_pretrained(HF / base_name)
    lora = model.apply_lora(peft_lora(model, 4, 8.0, targets))
    tuned = _train(peft_train_fully(lora, mts, bias))
    for path in moved:
        before = dict(model.named_params())[path].val().numpy()
        assert np.abs(dict(tuned.named_params())[path].val().numpy() - before).max() > 1e-3, path
    return base_name, tuned


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ember_trained_whole_modules_and_biases_round_trip(variant, tmp_path):
    base_name, tuned = _ember_trained(variant)
    save_peft_adapter(tuned, tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["bias"] == VARIANTS[variant][3]
    again = load_peft_adapter(from_pretrained(HF / base_name), tmp_path / "a")
    exp = np.load(HF / base_name / "expected.npz")
    np.testing.assert_allclose(_logits(again, exp), _logits(tuned, exp), rtol=0, atol=1e-5)
    assert _trainable(again) == _trainable(tuned)


_PEFT_LOGITS = """
import sys
import numpy as np, torch, transformers, peft
base = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation="eager")
model = peft.PeftModel.from_pretrained(base, sys.argv[2]).eval()
exp = np.load(sys.argv[3])
with torch.no_grad():
    out = model(input_ids=torch.from_numpy(exp["input_ids"]).long(),
                attention_mask=torch.from_numpy(exp["attention_mask"]).long()).logits.numpy()
np.save(sys.argv[4], out)
"""


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ember_trained_whole_modules_and_biases_load_in_peft_with_the_same_logits(variant, tmp_path):
    """Live: peft (the oracle venv, in a subprocess) opens Ember's export with Ember's logits."""
    from tests.engine.models.test_training_script import _torch_side

    python = _torch_side()
    base_name, tuned = _ember_trained(variant)
    save_peft_adapter(tuned, tmp_path / variant)
    exp = np.load(HF / base_name / "expected.npz")
    ours = _logits(tuned, exp)
    proc = subprocess.run([python, "-c", _PEFT_LOGITS, str(HF / base_name), str(tmp_path / variant),
                           str(HF / base_name / "expected.npz"), str(tmp_path / "theirs.npy")],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=""))
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = np.load(tmp_path / "theirs.npy")
    print(f"{variant}: max |Ember - peft| = {np.abs(ours - theirs).max():.2e}, "
          f"|tuned - base| = {np.abs(ours - exp['logits']).max():.3f}")
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    assert np.abs(ours - exp["logits"]).max() > 0.05


# ---------------------------------------------------------------------------------- refusals
def test_trainable_parameters_peft_cannot_express_are_refused(tmp_path):
    gpt2 = from_pretrained(HF / "gpt2")
    lora = gpt2.apply_lora(peft_lora(gpt2, 2, 4.0, ["c_attn"]))
    from engine.module import ParamGroup

    half = lora.unfreeze_group(ParamGroup.from_paths(["h.0.mlp.c_fc.weight"]))  # its bias stays frozen
    with pytest.raises(PretrainedError, match=r"'h.0.mlp.c_fc.weight' \('transformer.h.0.mlp.c_fc.weight'\) is "
                                              r"trainable, but the rest of 'transformer.h.0.mlp.c_fc' is frozen"):
        save_peft_adapter(half, tmp_path / "x")
    split = lora.unfreeze_group(ParamGroup.from_paths(["h.0.attn.key.bias"]))
    with pytest.raises(PretrainedError, match=r"'h.0.attn.key.bias' is trainable but 'h.0.attn.query.bias' is not"):
        save_peft_adapter(split, tmp_path / "x")
    some = lora.unfreeze_group(ParamGroup.from_paths(["h.0.mlp.c_fc.bias"]))
    with pytest.raises(PretrainedError, match=r"neither the LoRA-adapted modules' .* nor every bias"):
        save_peft_adapter(some, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_whole_embedding_on_a_tied_head_is_refused_both_ways(tmp_path):
    tied = from_pretrained(HF / "llama-tied")
    lora = tied.apply_lora(peft_lora(tied, 2, 4.0, ["q_proj"]))
    with pytest.raises(PretrainedError, match=r"'model.embed_tokens.weight' \(embed_tokens.weight\) is in "
                                              r"modules_to_save, but this LlamaForCausalLM's output head is tied"):
        peft_train_fully(lora, ["embed_tokens"])
    from engine.module import ParamGroup

    with pytest.raises(PretrainedError, match=r"is trainable, but this LlamaForCausalLM's output head is tied"):
        save_peft_adapter(lora.unfreeze_group(ParamGroup.from_paths(["embed_tokens.weight"])), tmp_path / "x")


def _write_safetensors(path: Path, tensors: dict) -> None:
    head, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        head[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_an_adapter_of_a_resized_vocabulary_names_the_sizes(tmp_path):
    """LLaMA-Factory saves embed_tokens / lm_head whole after resizing the vocabulary."""
    folder = tmp_path / "a"
    shutil.copytree(PEFT / "llama-modules-to-save", folder)
    path = folder / "adapter_model.safetensors"
    tensors = _tensors(path)
    for n in ("base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"):
        tensors[n] = np.concatenate([tensors[n], np.zeros((2, 48), np.float32)])  # 2 added tokens
    _write_safetensors(path, tensors)
    llama = from_pretrained(HF / "llama-gqa")
    with pytest.raises(PretrainedError, match=r"tensor 'base_model.model.(model.embed_tokens|lm_head).weight' has "
                                              r"dims \[130, 48\]; '.*' is \[(128, 48|48, 128)\]: an adapter trained "
                                              r"with a resized vocabulary \(130 tokens, this model has 128\)"):
        load_peft_adapter(llama, folder)
    tensors = {n.replace("embed_tokens", "embed_tokenz"): a[:128] for n, a in tensors.items()}
    _write_safetensors(path, tensors)
    with pytest.raises(PretrainedError, match=r"tensor 'base_model.model.model.embed_tokenz.weight' is not a tensor "
                                              r"Ember reads"):
        load_peft_adapter(llama, folder)
