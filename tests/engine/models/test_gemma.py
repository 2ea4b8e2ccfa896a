"""The Gemma families (Gemma, Gemma 2, Gemma 3 text) and sliding-window attention (Mistral, Qwen2
with use_sliding_window, Gemma 2/3's local layers) against transformers (issue 47).

The fixtures (tests/fixtures/hf/{gemma,gemma2,gemma3,mistral-swa,qwen2-swa}, and the peft adapters
tests/fixtures/peft/{gemma2,gemma3}-lora-all-linear) were made by
tests/fixtures/hf/make_window_fixtures.py with transformers 5.25: 12-position inputs, the second row
left-padded by 3, every window 4. The tests marked optional need torch / transformers / peft (never
Ember dependencies): run them with the oracle venv,
`PYTHONPATH=. python -m pytest -q -p no:cacheprovider --noconftest tests/engine/models/test_gemma.py` with a Python
that has torch, transformers, peft and Ember's own dependencies.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Device, Tensor, nn, optim
from engine.models import PretrainedError, from_pretrained, load_peft_adapter, save_peft_adapter, save_pretrained
from engine.models.gemma import GemmaConfig, GemmaForCausalLM
from engine.models.generate import generate
from engine.models.peft import peft_lora, peft_targets
from engine.module.reparam import iter_param_slots

FIX = Path(__file__).resolve().parents[2] / "fixtures"
HF, PEFT = FIX / "hf", FIX / "peft"
ATOL = 1e-4
WINDOWED = ["gemma2", "gemma3", "mistral-swa", "qwen2-swa"]
ALL = ["gemma"] + WINDOWED
ARCH = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
        "mistral-swa": "MistralForCausalLM", "qwen2-swa": "Qwen2ForCausalLM"}


def _exp(name):
    with np.load(HF / name / "expected.npz") as data:
        return {k: data[k] for k in data.files}


def _config(name) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def _logits(model, e, mask=True):
    args = (Tensor.from_data(e["input_ids"]),) + ((Tensor.from_data(e["attention_mask"]),) if mask else ())
    return model.valid().forward(*args).numpy()


# ---------------------------------------------------------------------------------- the fixtures
@pytest.mark.parametrize("name", ALL)
def test_fixture_inputs_are_left_padded_and_longer_than_the_window(name):
    e, cfg = _exp(name), _config(name)
    assert e["input_ids"].shape == (2, 12) and e["logits"].shape == (2, 12, 128)
    assert e["attention_mask"].tolist() == [[1] * 12, [0] * 3 + [1] * 9]
    assert e["greedy"].shape == (1, 15) and (e["greedy"][:, :5] == e["prompt"]).all()
    assert cfg["architectures"] == [ARCH[name]]
    if name in WINDOWED:
        assert cfg["sliding_window"] == 4 < 12
    assert sum(p.stat().st_size for p in (HF / name).iterdir()) < 300_000


# ---------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("name", ALL)
def test_logits_equal_transformers_with_a_left_padded_mask(name):
    model = from_pretrained(HF / name)
    assert type(model).__name__ == ARCH[name]
    e = _exp(name)
    np.testing.assert_allclose(_logits(model, e), e["logits"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(_logits(model, e, mask=False), e["logits_nomask"], rtol=0, atol=ATOL)
    # the left padding matters for the padded row's real positions
    assert np.abs(e["logits"][1, 3:] - e["logits_nomask"][1, 3:]).max() > 0.01


@pytest.mark.parametrize("name", WINDOWED)
def test_the_window_changes_exactly_the_positions_past_it(name, tmp_path):
    """With the window made longer than the input, the first 4 positions are unchanged and the later
    ones differ: the fixtures test the window, not only causal attention."""
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    cfg = _config(name)
    cfg["sliding_window"] = 64
    (folder / "config.json").write_text(json.dumps(cfg))
    e = _exp(name)
    wide = _logits(from_pretrained(folder), e, mask=False)
    np.testing.assert_allclose(wide[:, :4], e["logits_nomask"][:, :4], rtol=0, atol=ATOL)
    assert np.abs(wide[:, 4:] - e["logits_nomask"][:, 4:]).max() > 0.01


def test_which_layers_slide():
    windows = {n: [layer.self_attn.window for layer in from_pretrained(HF / n).layers] for n in ALL}
    assert windows == {"gemma": [None, None], "gemma2": [4, None], "gemma3": [4, None, 4],
                       "mistral-swa": [4, 4], "qwen2-swa": [None, 4]}  # Qwen2: from max_window_layers (1) on


def test_gemma_parts():
    g1, g2, g3 = (from_pretrained(HF / n) for n in ("gemma", "gemma2", "gemma3"))
    assert all(layer.input_layernorm.offset == 1.0 for m in (g1, g2, g3) for layer in m.layers)
    assert not hasattr(g1.layers[0], "pre_feedforward_layernorm")
    assert all(hasattr(m.layers[0], "post_feedforward_layernorm") for m in (g2, g3))
    assert g1.layers[0].self_attn.q_norm is None and g3.layers[0].self_attn.q_norm is not None
    assert g1.layers[0].self_attn.scale is None and g2.layers[0].self_attn.scale == 16 ** -0.5
    assert g2.layers[0].self_attn.softcap == 5.0 and g3.layers[0].self_attn.softcap is None
    assert g2.lm_head is None  # tied
    # Gemma 3: the local layers use the local rope base, the global ones the scaled global one
    assert g3.layer_rotary(0) is g3.rotary_emb_local and g3.layer_rotary(1) is g3.rotary_emb
    assert g3.rotary_emb_local.theta == 1000.0 and g3.rotary_emb.theta == 50000.0
    # embeddings scaled by sqrt(hidden)
    ids = Tensor.from_data([[5, 6]])
    np.testing.assert_allclose(g1.embed(ids).numpy(), g1.embed_tokens.forward(ids).numpy() * np.float32(32 ** 0.5),
                               rtol=1e-7)


def test_final_softcap_bounds_the_logits():
    e = _exp("gemma2")
    assert np.abs(e["logits"]).max() < 3.0  # final_logit_softcapping 3
    got = _logits(from_pretrained(HF / "gemma2"), e)
    assert np.abs(got).max() < 3.0


# ---------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("name", ALL)
def test_greedy_generation_equals_transformers_with_and_without_the_cache(name):
    e = _exp(name)
    model = from_pretrained(HF / name)
    prompt = e["prompt"][0].tolist()
    want = e["greedy"][0, 5:].tolist()  # 15 positions in all: past the window of 4
    cached = generate(model, None, prompt, 10, temperature=0.0, eos_token_id=[])
    full = generate(model, None, prompt, 10, temperature=0.0, eos_token_id=[], use_cache=False)
    assert cached.ids[0] == want
    assert full.ids[0] == want


def test_a_batch_left_padded_generates_each_row_as_alone():
    """Left padding counts in the window as transformers' masks count it (cache indices)."""
    model = from_pretrained(HF / "mistral-swa")
    e = _exp("mistral-swa")
    a, b = e["input_ids"][0, :9].tolist(), e["prompt"][0].tolist()
    both = generate(model, None, [a, b], 6, temperature=0.0, eos_token_id=[])
    alone = generate(model, None, a, 6, temperature=0.0, eos_token_id=[])
    assert both.ids[0] == alone.ids[0]


# ---------------------------------------------------------------------------------- save
@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma3", "qwen2-swa"])
def test_save_pretrained_reloads_with_the_same_config_and_logits(name, tmp_path):
    model = from_pretrained(HF / name)
    out = save_pretrained(model, tmp_path / "out")
    again = from_pretrained(out)
    e = _exp(name)
    np.testing.assert_array_equal(_logits(again, e), _logits(model, e))
    assert again.config == model.config


@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma3", "mistral-swa", "qwen2-swa"])
def test_config_to_json_rebuilds_in_ember_and_transformers(name, tmp_path):
    """`to_json` (what a model made in code saves as config.json) reads back as the same config; optional
    part: transformers builds the saved folder with that config.json, every tensor bit for bit equal to
    the original folder's, and gives the expected logits."""
    model = from_pretrained(HF / name)
    cfg = model.config
    rebuilt = type(cfg).from_json(json.loads(json.dumps(cfg.to_json())), cfg.model_type)
    assert rebuilt == cfg
    out = save_pretrained(model, tmp_path / "out", copy_extra_files=False)
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == [ARCH[name]]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    (out / "config.json").write_text(json.dumps(cfg.to_json()))
    theirs = getattr(transformers, ARCH[name]).from_pretrained(out, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    ref = getattr(transformers, ARCH[name]).from_pretrained(HF / name, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    mine, orig = theirs.state_dict(), ref.state_dict()
    assert sorted(mine) == sorted(orig)
    for k in orig:
        assert torch.equal(mine[k], orig[k]), k
    e = _exp(name)
    with torch.no_grad():
        got = theirs(torch.from_numpy(e["input_ids"]), attention_mask=torch.from_numpy(e["attention_mask"])).logits
    np.testing.assert_allclose(got.numpy(), e["logits"], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------- config refusals
def _gemma3_json(**change):
    return {**_config("gemma3"), **change}


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["sliding_attention"]), r"'layer_types' must list 3 of"),
    (dict(sliding_window=0), r"'sliding_window' must be a positive int or null, found 0"),
    (dict(hidden_activation="relu"), r"'hidden_activation' 'relu' is not supported: expected one of gelu_pytorch_tanh"),
    (dict(use_bidirectional_attention=True), r"'use_bidirectional_attention' true"),
    (dict(text_config={}), r"a Gemma 3 multimodal checkpoint"),
    (dict(query_pre_attn_scalar=-1), r"'query_pre_attn_scalar' must be a positive number, found -1"),
])
def test_bad_gemma_configs_are_clear_errors(change, message):
    with pytest.raises(PretrainedError, match=message) as info:
        GemmaConfig.from_json(_gemma3_json(**change), "gemma3_text")
    assert "config.json" in str(info.value)


def test_older_config_layouts():
    """transformers 4's keys: Gemma 3's rope_theta / rope_local_base_freq / sliding_window_pattern, Gemma's
    legacy hidden_act "gelu" (read as the tanh form, as transformers does)."""
    raw = {k: v for k, v in _config("gemma3").items() if k not in ("rope_parameters", "layer_types")}
    cfg = GemmaConfig.from_json({**raw, "rope_theta": 20000.0, "rope_local_base_freq": 500.0,
                                 "sliding_window_pattern": 3}, "gemma3_text")
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling) == (20000.0, 500.0, None)
    assert cfg.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    g1 = GemmaConfig.from_json({**_config("gemma"), "hidden_act": "gelu"}, "gemma")
    assert g1.hidden_activation == "gelu_pytorch_tanh"


def test_qwen2_layer_types_and_max_window_layers():
    from engine.models.llama import LlamaConfig  # noqa: PLC0415

    raw = _config("qwen2-swa")
    assert LlamaConfig.from_json(raw, "qwen2").layer_types == ["full_attention", "sliding_attention"]
    off = LlamaConfig.from_json({**raw, "use_sliding_window": False}, "qwen2")
    assert off.sliding_window is None and off.layer_window(1) is None
    with pytest.raises(PretrainedError, match=r"'layer_types' must list 2 of"):
        LlamaConfig.from_json({**raw, "layer_types": ["full_attention"]}, "qwen2")


# ---------------------------------------------------------------------------------- LoRA / peft
def _adapters(model):
    return {path: p.reparameterization for path, p in iter_param_slots(model) if p.reparameterization is not None}


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_a_peft_adapter_on_every_linear_loads_and_saves_back(name, tmp_path):
    adapter = PEFT / f"{name}-lora-all-linear"
    tuned = load_peft_adapter(from_pretrained(HF / name), adapter)
    e = np.load(adapter / "expected.npz")
    np.testing.assert_allclose(_logits(tuned, e), e["logits"], rtol=0, atol=ATOL)
    assert np.abs(e["logits"] - _exp(name)["logits"]).max() > 1.0  # the adapter matters
    n_layers = len(tuned.layers)
    assert len(_adapters(tuned)) == 7 * n_layers  # q, k, v, o, gate, up, down
    save_peft_adapter(tuned, tmp_path / "out")
    again = load_peft_adapter(from_pretrained(HF / name), tmp_path / "out")
    np.testing.assert_allclose(_logits(again, e), e["logits"], rtol=0, atol=ATOL)


def _trained(model, lora, steps=3):
    Device("cpu").seed(0)
    tuned = model.apply_reparameterization(lora).valid().train()
    ids = Tensor.from_data(_exp("gemma2")["input_ids"])
    target = Tensor.from_data(np.random.default_rng(0).standard_normal((2, 12, 128)).astype(np.float32))
    opt = optim.AdamConfig().init()
    for _ in range(steps):
        d = tuned.forward(ids) - target
        tuned = opt.step(0.05, tuned, optim.GradientsParams.from_grads(((d * d).mean()).backward(), tuned))
    return tuned


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_an_ember_trained_adapter_loads_in_peft_with_the_same_logits(name, tmp_path):
    """Trains through the soft-capped attention (Gemma 2) and the q/k norms (Gemma 3); the peft part is optional."""
    model = from_pretrained(HF / name)
    tuned = _trained(model, peft_lora(model, 4, 8.0, target_modules="all-linear"))
    e = _exp(name)
    ours = _logits(tuned, e)
    assert np.abs(ours - e["logits"]).max() > 0.05  # training changed the model
    save_peft_adapter(tuned, tmp_path / "a")
    np.testing.assert_allclose(_logits(load_peft_adapter(model, tmp_path / "a"), e), ours, rtol=0, atol=ATOL)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    base = getattr(transformers, ARCH[name]).from_pretrained(HF / name, dtype=torch.float32,
                                                            attn_implementation="eager")
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "a").eval()
    with torch.no_grad():
        got = theirs(input_ids=torch.from_numpy(e["input_ids"]),
                     attention_mask=torch.from_numpy(e["attention_mask"])).logits.numpy()
    np.testing.assert_allclose(ours, got, rtol=0, atol=ATOL)


def test_lora_targets_of_the_family_are_peft_names():
    names = {t.module.rpartition(".")[2] for t in peft_targets(from_pretrained(HF / "gemma3"))}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= names
    assert "lm_head" not in names and "q_norm" not in names


# ---------------------------------------------------------------------------------- the layer options
def test_window_mask_equals_an_explicit_attention_mask():
    Device("cpu").seed(3)
    x = Tensor.from_data(np.random.default_rng(1).standard_normal((2, 9, 16)).astype(np.float32))
    win = nn.MultiHeadAttentionConfig(16, 4, dropout=0.0, causal=True, window=3, n_kv_heads=2).init()
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    band = np.broadcast_to(i - j >= 3, (2, 9, 9)).copy()
    got = win.forward(nn.MhaInput.self_attn(x)).weights.numpy()
    assert (got[:, :, band[0]] == 0).all() and (got[:, :, ~band[0] & (j <= i)] > 0).all()
    # the cache: one step at a time gives the same context as the whole sequence
    cache = nn.KVCache()
    steps = [win.forward(nn.MhaInput.self_attn(x.narrow(1, t, 1)), cache=cache).context.numpy() for t in range(9)]
    np.testing.assert_allclose(np.concatenate(steps, 1), win.forward(nn.MhaInput.self_attn(x)).context.numpy(),
                               rtol=0, atol=1e-5)


def test_softcap_caps_the_scores():
    x = Tensor.from_data(10 * np.random.default_rng(2).standard_normal((1, 5, 8)).astype(np.float32))
    capped = nn.MultiHeadAttentionConfig(8, 2, dropout=0.0, causal=True, softcap=0.5, scale=1.0).init()
    w = capped.forward(nn.MhaInput.self_attn(x)).weights.numpy()
    # scores in [-0.5, 0.5]: no weight of the row's visible keys beyond e^1 times another's
    last = w[0, :, -1]
    assert (last.max(-1) / last.min(-1) <= np.e * (1 + 1e-5)).all()


@pytest.mark.parametrize("bad, message", [
    (dict(window=0), "window must be a positive int"), (dict(window=2, causal=False), "needs causal=True"),
    (dict(softcap=0.0), "softcap must be a positive number"), (dict(scale=-1.0), "scale must be a positive"),
])
def test_bad_attention_options_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        nn.MultiHeadAttentionConfig(8, 2, **{"causal": True, **bad}).init()


def test_rms_norm_offset_is_one_plus_the_weight():
    norm = nn.RmsNormConfig(4, epsilon=1e-6, offset=1.0).init()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    assert (norm.gamma.val().numpy() == 0).all()  # (1 + 0): the identity scale, as transformers initialises it
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(norm.forward(Tensor.from_data(x)).numpy(), want, rtol=1e-5)
    with pytest.raises(ValueError, match="offset must be 0 or 1"):
        nn.RmsNormConfig(4, offset=0.5).init()


def test_a_gemma_made_in_code_runs():
    cfg = GemmaConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
                      head_dim=4, model_type="gemma2", query_pre_attn_scalar=4, sliding_window=2,
                      layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=50.0,
                      final_logit_softcapping=30.0)
    out = GemmaForCausalLM(cfg).forward(Tensor.from_data([[1, 2, 3, 4]]))
    assert out.shape == (1, 4, 16) and np.isfinite(out.numpy()).all()


@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma3", "mistral-swa"])
def test_onnx_export_gives_embers_logits(name, tmp_path):
    """Soft-caps, (1 + w) norms, q/k norms and the window's mask (6 positions, window 4) in the exported
    graph, run by onnx's reference evaluator at batch 1 and 3."""
    onnx_reference = pytest.importorskip("onnx.reference")
    from engine.interop.onnx_export import export_onnx  # noqa: PLC0415

    model = from_pretrained(HF / name).valid()

    def tokens(b):
        return Tensor.from_data(np.random.default_rng(b).integers(0, 128, size=(b, 6)))

    path = export_onnx(model, tmp_path / "m.onnx", tokens(2))
    for b in (1, 3):
        ids = tokens(b).numpy()
        (got,) = onnx_reference.ReferenceEvaluator(str(path)).run(None, {"input_ids": ids,
                                                                          "attention_mask": np.ones_like(ids)})
        np.testing.assert_allclose(got, model.forward(tokens(b)).numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["gemma2", "qwen2-swa"])
def test_packed_sequences_with_a_window_give_each_its_own_logits(name):
    """Two sequences packed in one row (segment_ids, positions restarting): each one's logits are those it
    has alone, the window counted within its own sequence."""
    model = from_pretrained(HF / name).valid()
    ids = _exp(name)["input_ids"][0]
    a, b = ids[:7], ids[7:]
    packed = model.forward(Tensor.from_data(ids[None]), segment_ids=np.array([[0] * 7 + [1] * 5])).numpy()[0]
    alone_a = model.forward(Tensor.from_data(a[None])).numpy()[0]
    alone_b = model.forward(Tensor.from_data(b[None])).numpy()[0]
    np.testing.assert_allclose(packed[:7], alone_a, rtol=0, atol=1e-5)
    np.testing.assert_allclose(packed[7:], alone_b, rtol=0, atol=1e-5)
