"""Issue 47's families and rope variants against transformers: the committed tiny folders of
tests/fixtures/hf/ made by make_family_fixtures.py (Qwen3 with q/k norms; Llama with yarn, dynamic
and longrope rope; Phi-3 with its fused projections) and their peft adapters under tests/fixtures/peft/.

Each folder: logits within 1e-4 of transformers at every position with a left-padded mask and
without a mask (and, for the rope folders, below and above the original length); `save_pretrained`
writes the very tensors transformers wrote (bit for bit); greedy generation equals transformers'
`generate` with the cache and without it (transformers' `use_cache=False`: for dynamic rope the two
differ, cached keys keeping the frequencies they were rotated with); the peft adapter on every linear projection loads with
peft's logits and saves back as the same tensors. The optional part (skipped without transformers)
reloads Ember's saved folder and adapter in transformers + peft.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from engine import Tensor, nn
from engine.models import from_pretrained, generate, load_peft_adapter, save_peft_adapter, save_pretrained

FIX = Path(__file__).resolve().parents[2] / "fixtures"
HF, PEFT = FIX / "hf", FIX / "peft"
FOLDERS = {"qwen3": "Qwen3ForCausalLM", "qwen3-bias": "Qwen3ForCausalLM",
           "llama-yarn": "LlamaForCausalLM", "llama-dynamic": "LlamaForCausalLM",
           "llama-longrope": "LlamaForCausalLM", "phi3": "Phi3ForCausalLM", "phi3-longrope": "Phi3ForCausalLM"}
FOLDERS = {k: v for k, v in FOLDERS.items() if (HF / k / "config.json").exists()}
ROPE = [n for n in FOLDERS if (n.startswith("llama-") or "longrope" in n)]
ATOL = 1e-4
_MODELS = {}


def _model(name):
    if name not in _MODELS:
        _MODELS[name] = from_pretrained(HF / name)
    return _MODELS[name]


def _logits(model, ids, mask=None):
    m = None if mask is None else Tensor.from_data(mask)
    return model.forward(Tensor.from_data(ids), m).numpy()


@pytest.mark.parametrize("name", list(FOLDERS))
def test_logits_equal_transformers_with_a_left_padded_mask(name):
    model = _model(name)
    assert type(model).__name__ == FOLDERS[name]
    exp = np.load(HF / name / "expected.npz")
    assert exp["attention_mask"][1, 0] == 0  # row 1 is left-padded
    np.testing.assert_allclose(_logits(model, exp["input_ids"], exp["attention_mask"]), exp["logits"], rtol=0,
                               atol=ATOL)
    np.testing.assert_allclose(_logits(model, exp["input_ids"]), exp["logits_nomask"], rtol=0, atol=ATOL)
    assert np.abs(exp["logits"][1, 2:] - exp["logits_nomask"][1, 2:]).max() > 0.1  # the mask matters


@pytest.mark.parametrize("name", ROPE)
def test_rope_variants_below_and_above_the_original_length(name):
    model = _model(name)
    exp = np.load(HF / name / "expected.npz")
    for key in ("short", "long"):
        got = _logits(model, exp[f"{key}_ids"], exp[f"{key}_mask"])
        np.testing.assert_allclose(got, exp[f"{key}_logits"], rtol=0, atol=ATOL, err_msg=key)
    # the scaling matters: plain rope is off by far more than the tolerance above the original length
    plain = from_pretrained(HF / name)
    r = plain.rotary_emb
    plain.rotary_emb = nn.RotaryEncodingConfig(r.max_sequence_length, r.d_model, r.theta).init()
    assert np.abs(_logits(plain, exp["long_ids"], exp["long_mask"]) - exp["long_logits"]).max() > 1e-2
    # the order of calls does not matter (transformers' dynamic rope keeps state; Ember's answer is a fresh model's)
    got = _logits(model, exp["short_ids"], exp["short_mask"])
    np.testing.assert_allclose(got, exp["short_logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(FOLDERS))
def test_save_pretrained_writes_transformers_tensors_bit_for_bit(name, tmp_path):
    model = _model(name)
    save_pretrained(model, tmp_path / "out")
    mine = safetensors.numpy.load_file(tmp_path / "out" / "model.safetensors")
    theirs = safetensors.numpy.load_file(HF / name / "model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for k in theirs:
        assert mine[k].dtype == theirs[k].dtype and np.array_equal(mine[k], theirs[k]), k
    again = from_pretrained(tmp_path / "out")
    exp = np.load(HF / name / "expected.npz")
    np.testing.assert_allclose(_logits(again, exp["input_ids"], exp["attention_mask"]), exp["logits"], rtol=0,
                               atol=ATOL)


@pytest.mark.parametrize("name", list(FOLDERS))
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_equals_transformers(name, use_cache):
    exp = json.loads((HF / name / "generate_expected.json").read_text())
    model = _model(name)
    for case in exp["cases"]:
        prompt = case["prompt_ids"] if case.get("batch") else case["prompt_ids"][0]
        r = generate(model, None, prompt, exp["max_new_tokens"], temperature=0, stop=[exp["eos_token_id"]],
                     use_cache=use_cache)
        assert r.ids == case["new_ids" if use_cache else "new_ids_nocache"], (name, use_cache, case)


@pytest.mark.parametrize("name", list(FOLDERS))
def test_peft_adapter_on_every_linear_both_ways(name, tmp_path):
    folder = PEFT / f"{name}-all-linear"
    tuned = load_peft_adapter(from_pretrained(HF / name), folder)
    exp = np.load(folder / "expected.npz")
    np.testing.assert_allclose(_logits(tuned.valid(), exp["input_ids"], exp["attention_mask"]), exp["logits"],
                               rtol=0, atol=ATOL)
    base = np.load(HF / name / "expected.npz")["logits"]
    assert np.abs(exp["logits"] - base).max() > 0.5  # the adapter matters
    save_peft_adapter(tuned, tmp_path / "out")
    mine = safetensors.numpy.load_file(tmp_path / "out" / "adapter_model.safetensors")
    theirs = safetensors.numpy.load_file(folder / "adapter_model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for k in theirs:
        np.testing.assert_array_equal(mine[k], theirs[k], err_msg=k)
    targets = set(json.loads((tmp_path / "out" / "adapter_config.json").read_text())["target_modules"])
    assert targets == set(json.loads((folder / "adapter_config.json").read_text())["target_modules"])
    if name.startswith("phi3"):  # one A over a fused module's parts, as peft's one LoRA over it
        attn, mlp = tuned.layers[1].self_attn, tuned.layers[1].mlp
        a = attn.query.weight.reparameterization.a
        assert a is attn.key.weight.reparameterization.a is attn.value.weight.reparameterization.a
        assert mlp.gate_proj.weight.reparameterization.a is mlp.up_proj.weight.reparameterization.a
        assert a is not attn.output.weight.reparameterization.a


@pytest.mark.parametrize("name", list(FOLDERS))
def test_transformers_and_peft_reload_embers_files(name, tmp_path):
    """Optional (torch, transformers, peft: the oracle venv): Ember's save_pretrained folder and its saved
    adapter give transformers' / peft's logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    save_pretrained(_model(name), tmp_path / "base")
    tuned = load_peft_adapter(from_pretrained(HF / name), PEFT / f"{name}-all-linear")
    save_peft_adapter(tuned, tmp_path / "adapter")
    exp, pexp = np.load(HF / name / "expected.npz"), np.load(PEFT / f"{name}-all-linear" / "expected.npz")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    ids, mask = torch.tensor(exp["input_ids"]), torch.tensor(exp["attention_mask"])
    with torch.no_grad():
        np.testing.assert_allclose(model(ids, attention_mask=mask).logits.numpy(), exp["logits"], rtol=0, atol=1e-5)
        pm = peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
        np.testing.assert_allclose(pm(ids, attention_mask=mask).logits.numpy(), pexp["logits"], rtol=0, atol=1e-5)


def test_phi3_fused_projections_split_by_their_sizes_and_refusals():
    from engine.models import PretrainedError
    from engine.models.mapping import Split
    from engine.models.phi3 import Phi3Config

    qkv = np.arange(7 * 2).reshape(7, 2)
    parts = [Split(0, i, 3, (3, 2, 2)).forward(qkv) for i in range(3)]
    assert [p.shape for p in parts] == [(3, 2), (2, 2), (2, 2)]
    np.testing.assert_array_equal(np.concatenate(parts), qkv)
    with pytest.raises(ValueError, match=r"parts of \[3, 2, 2\] along axis 0 needs 7 there, found dims \[8, 2\]"):
        Split(0, 0, 3, (3, 2, 2)).shape((8, 2))
    cfg = json.loads((HF / "phi3-longrope" / "config.json").read_text())
    # Phi-3's older names for longrope ("su", "yarn") are longrope, as transformers reads them
    old = {**cfg, "rope_parameters": {**cfg["rope_parameters"], "rope_type": "su"}}
    assert Phi3Config.from_json(old).rope_scaling == Phi3Config.from_json(cfg).rope_scaling
    assert Phi3Config.from_json(cfg).rope_scaling["rope_type"] == "longrope"
    partial = {**cfg, "rope_parameters": {**cfg["rope_parameters"], "partial_rotary_factor": 0.75}}
    with pytest.raises(PretrainedError, match=r"'partial_rotary_factor' 0.75 is not supported.*Phi-4-mini"):
        Phi3Config.from_json(partial)


def test_qwen3_norms_are_per_head_and_follow_the_rotary_permutation():
    model = _model("qwen3")
    attn = model.layers[0].self_attn
    assert tuple(attn.q_norm.gamma.shape) == tuple(attn.k_norm.gamma.shape) == (16,)
    stored = safetensors.numpy.load_file(HF / "qwen3" / "model.safetensors")["model.layers.0.self_attn.q_norm.weight"]
    # Ember's interleaved pairs: (w[0], w[8]), (w[1], w[9]), ... of Hugging Face's halves
    np.testing.assert_array_equal(attn.q_norm.gamma.val().numpy(), stored.reshape(2, 8).T.reshape(-1))


@pytest.mark.parametrize("name", ["qwen3", "phi3", "llama-yarn", "phi3-longrope"])
def test_onnx_export_equals_ember(name, tmp_path):
    """The traced graph (q/k norms, the split projections, the scaled rope tables) run by onnx's
    reference evaluator gives Ember's logits (the language-model export: `input_ids` and
    `attention_mask` in, dynamic batch and sequence)."""
    onnx_reference = pytest.importorskip("onnx.reference")
    from engine.interop import export_onnx

    model = _model(name).valid()
    x = Tensor.from_data(np.load(HF / name / "expected.npz")["input_ids"])
    ids = x.numpy()
    if name == "phi3-longrope":  # its rope's table changes with the length: a fixed-length export
        path = export_onnx(model, tmp_path / f"{name}.onnx", x, dynamic_sequence=False)
        feeds = {"input_ids": ids}
    else:
        path = export_onnx(model, tmp_path / f"{name}.onnx", x)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    (got,) = onnx_reference.ReferenceEvaluator(str(path)).run(None, feeds)
    np.testing.assert_allclose(got, model.forward(x).numpy(), rtol=0, atol=1e-4)
