"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE) against transformers (issue 47).

The fixtures (tests/fixtures/hf/{mixtral,mixtral-fused,qwen2-moe,qwen2-moe-norm,qwen3-moe}) were made by
tests/fixtures/hf/make_moe_fixtures.py with transformers 5.25: 4 experts, top 2, 12-position inputs,
the second row left-padded by 3. mixtral-fused holds mixtral's tensors in transformers 5's fused
layout. The tests marked optional need torch / transformers (never Ember dependencies): run them
with the oracle venv, `PYTHONPATH=. python -m pytest -q -p no:cacheprovider --noconftest
tests/engine/models/test_moe.py` with a Python that has torch, transformers and Ember's dependencies.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from engine import Device, Tensor, nn
from engine.models import PretrainedError, from_pretrained, save_pretrained
from engine.models.generate import generate
from engine.models.moe import MoeConfig, build

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
ATOL = 1e-4
ALL = ["mixtral", "mixtral-fused", "qwen2-moe", "qwen2-moe-norm", "qwen3-moe"]
ARCH = {"mixtral": "MixtralForCausalLM", "mixtral-fused": "MixtralForCausalLM", "qwen2-moe": "Qwen2MoeForCausalLM",
        "qwen2-moe-norm": "Qwen2MoeForCausalLM", "qwen3-moe": "Qwen3MoeForCausalLM"}
SAVED = [n for n in ALL if n != "mixtral-fused"]


def _exp(name):
    with np.load(HF / name / "expected.npz") as data:
        return {k: data[k] for k in data.files}


def _config(name) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def _logits(model, e, mask=True):
    args = (Tensor.from_data(e["input_ids"]),) + ((Tensor.from_data(e["attention_mask"]),) if mask else ())
    return model.valid().forward(*args).numpy()


def _stored_names(name):
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(HF / name / "model.safetensors"), "np") as f:
        return set(f.keys())


# ---------------------------------------------------------------------------------- the fixtures
@pytest.mark.parametrize("name", ALL)
def test_fixtures_are_small_left_padded_mixtures(name):
    e, cfg = _exp(name), _config(name)
    assert e["attention_mask"].tolist() == [[1] * 12, [0] * 3 + [1] * 9]
    assert e["greedy"].shape == (1, 15) and (e["greedy"][:, :5] == e["prompt"]).all()
    assert cfg["architectures"] == [ARCH[name]]
    assert cfg.get("num_local_experts", cfg.get("num_experts")) == 4 and cfg["num_experts_per_tok"] == 2
    assert sum(p.stat().st_size for p in (HF / name).iterdir()) < 300_000


def test_the_two_mixtral_layouts_hold_the_same_model():
    per_expert, fused = _stored_names("mixtral"), _stored_names("mixtral-fused")
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in per_expert
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"} <= fused
    assert not any("experts.0." in n for n in fused)


# ---------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("name", ALL)
def test_logits_equal_transformers_with_a_left_padded_mask(name):
    model = from_pretrained(HF / name)
    assert type(model).__name__ == ARCH[name]
    e = _exp(name)
    np.testing.assert_allclose(_logits(model, e), e["logits"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(_logits(model, e, mask=False), e["logits_nomask"], rtol=0, atol=ATOL)
    assert np.abs(e["logits"][1, 3:] - e["logits_nomask"][1, 3:]).max() > 0.01


def test_the_parts_of_each_family():
    mx, q2, q2n, q3 = (from_pretrained(HF / n) for n in ("mixtral", "qwen2-moe", "qwen2-moe-norm", "qwen3-moe"))
    assert all(isinstance(layer.mlp, nn.SparseMoe) for layer in mx.layers)
    assert mx.layers[0].mlp.normalize_top_k and mx.layers[0].mlp.shared_expert is None
    # Qwen2-MoE: mlp_only_layers [1] is a dense MLP; decoder_sparse_step 2 makes layer 0 (and 2) dense
    assert [isinstance(layer.mlp, nn.SparseMoe) for layer in q2.layers] == [True, False, True]
    assert [isinstance(layer.mlp, nn.SparseMoe) for layer in q2n.layers] == [False, True, False]
    assert q2.layers[0].mlp.shared_expert is not None and not q2.layers[0].mlp.normalize_top_k
    assert q2.layers[0].self_attn.query.bias is not None and q2.layers[0].self_attn.output.bias is None
    assert q3.layers[0].self_attn.q_norm is not None and q3.layers[0].mlp.shared_expert is None
    assert q3.layers[0].mlp.normalize_top_k and mx.layers[0].self_attn.q_norm is None
    assert len(mx.layers[0].mlp.experts) == 4 and mx.layers[0].mlp.top_k == 2


@pytest.mark.parametrize("name", ["qwen2-moe", "qwen3-moe"])
def test_norm_topk_prob_changes_the_logits(name, tmp_path):
    """The fixtures test the renormalisation: flipping `norm_topk_prob` moves the logits."""
    import shutil  # noqa: PLC0415

    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    cfg = _config(name)
    cfg["norm_topk_prob"] = not cfg["norm_topk_prob"]
    (folder / "config.json").write_text(json.dumps(cfg))
    e = _exp(name)
    assert np.abs(_logits(from_pretrained(folder), e) - e["logits"]).max() > 0.01


# ---------------------------------------------------------------------------------- the layer
def _dense_reference(moe, x):
    """Every expert on every token, weighted by the router's renormalised top-k (zero elsewhere)."""
    gate = moe.gate.weight.val().numpy()
    logits = x @ gate
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, -1)[:, :moe.top_k]
    w = np.zeros_like(p)
    np.put_along_axis(w, top, np.take_along_axis(p, top, -1), -1)
    if moe.normalize_top_k:
        w /= w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for e, expert in enumerate(moe.experts):
        out += w[:, e:e + 1] * expert.forward(Tensor.from_data(x)).numpy()
    if moe.shared_expert is not None:
        s = moe.shared_expert_gate.forward(Tensor.from_data(x)).numpy()
        out += moe.shared_expert.forward(Tensor.from_data(x)).numpy() / (1 + np.exp(-s))
    return out


@pytest.mark.parametrize("shared, normalize", [(None, True), (6, False)])
def test_sparse_moe_equals_the_dense_formula_and_runs_only_chosen_experts(shared, normalize):
    Device("cpu").seed(5)
    moe = nn.SparseMoeConfig(8, 12, n_experts=6, top_k=2, normalize_top_k=normalize, d_shared=shared).init()
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    got = moe.forward(Tensor.from_data(x))
    assert got.shape == (3, 5, 8)
    np.testing.assert_allclose(got.numpy().reshape(15, 8), _dense_reference(moe, x.reshape(15, 8)), rtol=0, atol=1e-5)
    # sparse: an expert the token did not choose does not run (NaN weights there leave its output finite;
    # a dense product with a zero weight would give NaN)
    one = x[:1, :1]
    only = set(moe.route(Tensor.from_data(one.reshape(1, 8)))[1].ravel().tolist())
    assert len(only) == 2
    unused = next(e for e in range(6) if e not in only)
    moe.experts[unused].down_proj.weight = moe.experts[unused].down_proj.weight.map(lambda t: t * float("nan"))
    assert np.isfinite(moe.forward(Tensor.from_data(one)).numpy()).all()
    moe.experts[min(only)].down_proj.weight = moe.experts[min(only)].down_proj.weight.map(lambda t: t * float("nan"))
    assert np.isnan(moe.forward(Tensor.from_data(one)).numpy()).all()


def test_the_router_gets_gradients_through_the_chosen_weights():
    """d loss / d router weight: the softmax (and renormalisation) of the chosen experts, checked against
    central differences (the choice stays fixed for small steps)."""
    Device("cpu").seed(7)
    moe = nn.SparseMoeConfig(4, 6, n_experts=4, top_k=2).init()
    x = Tensor.from_data(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float64).astype(np.float32))
    moe = moe.train()
    grads = (moe.forward(x) ** 2).sum().backward()
    g = moe.gate.weight.val().grad(grads).numpy()
    assert np.abs(g).max() > 1e-3
    w0 = moe.gate.weight.val().numpy().astype(np.float64)
    eps = 1e-3
    for (i, j) in [(0, 0), (2, 3), (3, 1)]:
        vals = []
        for s in (eps, -eps):
            w = w0.copy()
            w[i, j] += s
            moe.gate.weight = moe.gate.weight.map(lambda t, w=w: Tensor.from_data(w.astype(np.float32)))
            vals.append(float((moe.forward(x) ** 2).sum().numpy()))
        np.testing.assert_allclose(g[i, j], (vals[0] - vals[1]) / (2 * eps), rtol=2e-2, atol=2e-3)


def test_bad_moe_layers_are_refused():
    with pytest.raises(ValueError, match=r"expected 1 <= top_k <= n_experts \(4\), found top_k=5"):
        nn.SparseMoeConfig(8, 8, n_experts=4, top_k=5).init()


# ---------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("name", SAVED)
def test_greedy_generation_equals_transformers_with_and_without_the_cache(name):
    e = _exp(name)
    model = from_pretrained(HF / name)
    prompt = e["prompt"][0].tolist()
    want = e["greedy"][0, 5:].tolist()
    assert generate(model, None, prompt, 10, temperature=0.0, eos_token_id=[]).ids[0] == want
    assert generate(model, None, prompt, 10, temperature=0.0, eos_token_id=[], use_cache=False).ids[0] == want


# ---------------------------------------------------------------------------------- save
@pytest.mark.parametrize("name", ALL)
def test_save_pretrained_writes_the_per_expert_layout_and_reloads(name, tmp_path):
    model = from_pretrained(HF / name)
    out = save_pretrained(model, tmp_path / "out")
    again = from_pretrained(out)
    e = _exp(name)
    np.testing.assert_array_equal(_logits(again, e), _logits(model, e))
    assert again.config == model.config
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(out / "model.safetensors"), "np") as f:
        names = set(f.keys())
        if name.startswith("mixtral"):
            assert names == _stored_names("mixtral")  # the fused folder saves as transformers does
            for n in names:
                ref = safe_open(str(HF / "mixtral" / "model.safetensors"), "np").get_tensor(n)
                np.testing.assert_array_equal(f.get_tensor(n), ref)
        else:
            assert names == _stored_names(name)


@pytest.mark.parametrize("name", SAVED)
def test_config_to_json_rebuilds_in_ember_and_transformers(name, tmp_path):
    """`to_json` reads back as the same config; optional: transformers builds the saved folder with that
    config.json, every tensor bit for bit equal to the fixture's, and gives the expected logits."""
    model = from_pretrained(HF / name)
    cfg = model.config
    rebuilt = MoeConfig.from_json(json.loads(json.dumps(cfg.to_json())), cfg.model_type)
    assert rebuilt == cfg
    out = save_pretrained(model, tmp_path / "out", copy_extra_files=False)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    (out / "config.json").write_text(json.dumps(cfg.to_json()))
    cls = getattr(transformers, ARCH[name])
    theirs = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    ref = cls.from_pretrained(HF / name, dtype=torch.float32, attn_implementation="eager").eval()
    mine, orig = theirs.state_dict(), ref.state_dict()
    assert sorted(mine) == sorted(orig)
    for k in orig:
        assert torch.equal(mine[k], orig[k]), k
    e = _exp(name)
    with torch.no_grad():
        got = theirs(torch.from_numpy(e["input_ids"]), attention_mask=torch.from_numpy(e["attention_mask"])).logits
    np.testing.assert_allclose(got.numpy(), e["logits"], rtol=0, atol=1e-5)


def test_a_mixture_made_in_code_runs_and_saves(tmp_path):
    cfg = MoeConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
                    model_type="qwen2_moe", num_experts=3, num_experts_per_tok=2, moe_intermediate_size=6,
                    shared_expert_intermediate_size=10, norm_topk_prob=False, mlp_only_layers=[0])
    model = build(cfg)
    out = model.forward(Tensor.from_data([[1, 2, 3, 4]]))
    assert out.shape == (1, 4, 16) and np.isfinite(out.numpy()).all()
    again = from_pretrained(save_pretrained(model, tmp_path / "m"))
    np.testing.assert_array_equal(again.forward(Tensor.from_data([[1, 2, 3, 4]])).numpy(), out.numpy())


# ---------------------------------------------------------------------------------- config refusals
@pytest.mark.parametrize("name, change, message", [
    ("mixtral", dict(num_experts_per_tok=5), r"'num_experts_per_tok' \(5\) must be at most the number of experts \(4\)"),
    ("mixtral", dict(router_jitter_noise=0.1), r"'router_jitter_noise' 0.1 is not supported"),
    ("mixtral", dict(num_local_experts=0), r"'num_local_experts' must be a positive int, found 0"),
    ("qwen2-moe", dict(mlp_only_layers="1"), r"'mlp_only_layers' must be a list of layer indices"),
    ("qwen2-moe", dict(hidden_act="gelu"), r"'hidden_act' 'gelu' is not supported"),
    ("qwen3-moe", dict(use_sliding_window="yes"), r"'use_sliding_window' must be true or false"),
])
def test_bad_moe_configs_are_clear_errors(name, change, message):
    data = {**_config(name), **change}
    with pytest.raises(PretrainedError, match=message) as info:
        MoeConfig.from_json(data, data["model_type"])
    assert "config.json" in str(info.value)


def test_a_fused_tensor_of_the_wrong_expert_count_is_refused(tmp_path):
    import shutil  # noqa: PLC0415

    folder = tmp_path / "m"
    shutil.copytree(HF / "mixtral-fused", folder)
    cfg = _config("mixtral-fused")
    cfg["num_local_experts"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedError, match=r"mlp.gate.weight' has dims \[4, 32\].*dims \[32, 3\]"):
        from_pretrained(folder)


# ---------------------------------------------------------------------------------- LoRA / peft
PEFT = HF.parent / "peft"


def _adapted(model):
    from engine.module.reparam import iter_param_slots  # noqa: PLC0415

    return sorted(p for p, s in iter_param_slots(model) if s.reparameterization is not None)


def _trained(model, lora, steps=3):
    from engine import optim  # noqa: PLC0415

    Device("cpu").seed(0)
    tuned = model.apply_reparameterization(lora).valid().train()
    ids = Tensor.from_data(_exp("mixtral")["input_ids"])
    target = Tensor.from_data(np.random.default_rng(0).standard_normal((2, 12, 128)).astype(np.float32))
    opt = optim.AdamConfig().init()
    for _ in range(steps):
        d = tuned.forward(ids) - target
        tuned = opt.step(0.05, tuned, optim.GradientsParams.from_grads(((d * d).mean()).backward(), tuned))
    return tuned


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe"])
def test_a_peft_adapter_made_on_transformers_5_loads_with_peft_logits(name):
    """peft 0.21 adapts Mixtral's router as a parameter (target_parameters 'gate.weight'); the Qwen2-MoE
    adapter's gate_proj / up_proj / down_proj are the shared expert's and the dense layer's."""
    from engine.models import load_peft_adapter  # noqa: PLC0415

    adapter = PEFT / f"{name}-lora-moe"
    tuned = load_peft_adapter(from_pretrained(HF / name), adapter)
    e = np.load(adapter / "expected.npz")
    np.testing.assert_allclose(_logits(tuned, e), e["logits"], rtol=0, atol=ATOL)
    assert np.abs(e["logits"] - _exp(name)["logits"]).max() > 0.5
    paths = _adapted(tuned)
    assert not any(".experts." in p for p in paths)
    if name == "mixtral":
        assert json.loads((adapter / "adapter_config.json").read_text())["target_parameters"] == ["gate.weight"]
        assert "layers.0.mlp.gate.weight" in paths
    else:
        assert "layers.0.mlp.shared_expert.gate_proj.weight" in paths and "layers.1.mlp.gate_proj.weight" in paths


def test_an_ember_lora_on_mixtrals_experts_and_router_saves_and_loads_in_peft(tmp_path):
    """all-linear: attention, the router and every expert's w1 / w2 / w3, written as peft's LoRA on transformers 5's
    fused experts (target_parameters mlp.experts.gate_up_proj / down_proj). Optional part: peft's logits."""
    from engine.models import load_peft_adapter, save_peft_adapter  # noqa: PLC0415
    from engine.models.peft import peft_lora  # noqa: PLC0415

    model = from_pretrained(HF / "mixtral")
    tuned = _trained(model, peft_lora(model, 4, 8.0, target_modules="all-linear"))
    assert "layers.1.mlp.experts.3.down_proj.weight" in _adapted(tuned) and "layers.0.mlp.gate.weight" in _adapted(tuned)
    e = _exp("mixtral")
    ours = _logits(tuned, e)
    assert np.abs(ours - e["logits"]).max() > 0.05
    out = save_peft_adapter(tuned, tmp_path / "a")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["target_parameters"] == [f"model.layers.{i}.mlp.{p}" for i in (0, 1) for p in
                                        ("experts.down_proj", "experts.gate_up_proj", "gate.weight")]
    assert not any("experts" in m for m in cfg["target_modules"])
    np.testing.assert_allclose(_logits(load_peft_adapter(model, out), e), ours, rtol=0, atol=ATOL)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    base = transformers.MixtralForCausalLM.from_pretrained(HF / "mixtral", dtype=torch.float32,
                                                           attn_implementation="eager")
    theirs = peft.PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        got = theirs(input_ids=torch.from_numpy(e["input_ids"]),
                     attention_mask=torch.from_numpy(e["attention_mask"])).logits.numpy()
    np.testing.assert_allclose(got[0], ours[0], rtol=0, atol=ATOL)
    np.testing.assert_allclose(got[1, 3:], ours[1, 3:], rtol=0, atol=ATOL)


@pytest.mark.parametrize("name, targets, message", [
    ("qwen3-moe", ["gate_proj"], r"'model.layers.1.mlp.gate_proj' \(a layer of mlp_only_layers\) cannot be written "
                                 r"for a Qwen3MoeForCausalLM"),
])
def test_loras_transformers_would_load_wrongly_are_refused(name, targets, message, tmp_path):
    from engine.models import save_peft_adapter  # noqa: PLC0415
    from engine.models.peft import peft_lora  # noqa: PLC0415

    model = from_pretrained(HF / name)
    tuned = model.apply_reparameterization(peft_lora(model, 2, 4.0, target_modules=targets))
    with pytest.raises(PretrainedError, match=message):
        save_peft_adapter(tuned, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_a_lora_on_a_qwen3_moe_dense_layer_is_refused(tmp_path):
    """transformers 5.25 + peft 0.21 load a Qwen3-MoE adapter's mlp.gate_proj / up_proj / down_proj (a layer of
    mlp_only_layers) as LoRAs on the experts' fused parameters (seen in test_families47_steps.py's runs)."""
    from engine.models import save_peft_adapter  # noqa: PLC0415
    from engine.models.peft import peft_lora  # noqa: PLC0415

    model = from_pretrained(HF / "qwen3-moe")
    assert _config("qwen3-moe")["mlp_only_layers"] == [1]
    tuned = model.apply_reparameterization(peft_lora(model, 2, 4.0, target_modules="all-linear",
                                                     exclude_modules=r".*experts\..*"))
    with pytest.raises(PretrainedError, match=r"LoRA on 'model.layers.1.mlp.down_proj' \(a layer of mlp_only_layers\) "
                                              r"cannot be written for a Qwen3MoeForCausalLM"):
        save_peft_adapter(tuned, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    router = model.apply_reparameterization(peft_lora(model, 2, 4.0, target_modules="all-linear",
                                                      exclude_modules=r".*\.mlp\.(?!gate$).*|.*experts\..*"))
    assert "layers.0.mlp.gate.weight" in _adapted(router)
    cfg = json.loads((save_peft_adapter(router, tmp_path / "b") / "adapter_config.json").read_text())
    assert cfg["target_parameters"] == ["model.layers.0.mlp.gate.weight", "model.layers.2.mlp.gate.weight"]


def test_a_qwen_router_and_shared_expert_lora_round_trips(tmp_path):
    from engine.models import load_peft_adapter, save_peft_adapter  # noqa: PLC0415
    from engine.models.peft import peft_lora  # noqa: PLC0415

    model = from_pretrained(HF / "qwen2-moe")
    tuned = _trained(model, peft_lora(model, 4, 8.0, target_modules="all-linear", exclude_modules=r".*experts\..*"))
    assert "layers.0.mlp.gate.weight" in _adapted(tuned) and not any(".experts." in p for p in _adapted(tuned))
    out = save_peft_adapter(tuned, tmp_path / "a")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["target_parameters"] == ["model.layers.0.mlp.gate.weight", "model.layers.2.mlp.gate.weight"]
    e = _exp("qwen2-moe")
    np.testing.assert_allclose(_logits(load_peft_adapter(model, out), e), _logits(tuned, e), rtol=0, atol=ATOL)


def test_a_target_parameter_no_weight_answers_to_is_refused_by_name(tmp_path):
    import shutil  # noqa: PLC0415

    from engine.models import load_peft_adapter  # noqa: PLC0415

    folder = tmp_path / "a"
    shutil.copytree(PEFT / "mixtral-lora-moe", folder)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["target_parameters"] = ["gate.weight", "mlp.experts.gate_proj"]
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedError, match=r"LoRA on parameter 'mlp.experts.gate_proj' \(target_parameters\) "
                                              r"is not supported: no weight of this model answers to it \(.*gate_up_proj"):
        load_peft_adapter(from_pretrained(HF / "mixtral"), folder)


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe", "qwen2-moe-norm", "qwen3-moe"])
def test_the_onnx_export_routes_each_token_at_run_time(name, tmp_path, monkeypatch):
    """The export (no refusal now) holds the routing, not the traced example's choice of experts: read back
    by `import_onnx` (no onnxruntime needed), its logits at other batch sizes and lengths, whose tokens choose
    other experts than the trace's, are Ember's; every expert's weights are in the file and no TopK."""
    import onnx  # noqa: PLC0415

    from engine.design import build_model  # noqa: PLC0415
    from engine.interop import export_onnx, import_onnx  # noqa: PLC0415

    model = from_pretrained(HF / name).valid()
    path = export_onnx(model, tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    assert "TopK" not in {n.op_type for n in graph.node}
    stored = {i.name for i in graph.initializer}
    at, moe = next((p, m) for p, m in model.named_modules() if isinstance(m, nn.SparseMoe))
    assert all(f"{at}.experts.{e}.down_proj.weight" in stored for e in range(moe.n_experts)), sorted(stored)
    imported = import_onnx(path)
    assert imported.report.ok and not imported.report.unsupported
    module = build_model(imported.design).load_record(imported.record).valid()
    rng = np.random.default_rng(11)
    chosen, route = set(), nn.SparseMoe.route

    def spy(self, x):  # the experts Ember's forward chooses in the first mixture, token by token
        weights, experts = route(self, x)
        if self is moe:
            chosen.update(tuple(sorted(c)) for c in experts.tolist())
        return weights, experts

    monkeypatch.setattr(nn.SparseMoe, "route", spy)
    for b, s in [(1, 6), (3, 9)]:
        ids = rng.integers(0, 100, size=(b, s)).astype(np.int64)
        mask = np.ones((b, s), dtype=np.int64)
        mask[0, :2] = 0
        got = module.forward(Tensor.from_data(ids), Tensor.from_data(mask)).numpy()
        for r in range(b):
            real = mask[r] == 1
            want = model.forward(Tensor.from_data(ids[r:r + 1, real])).numpy()[0]
            np.testing.assert_allclose(got[r, real], want, atol=1e-5, rtol=0, err_msg=f"{name} batch {b} row {r}")
    assert len(chosen) > 1  # the tokens chose different experts: one traced choice could not give these logits


@pytest.mark.parametrize("shared, normalize", [(None, True), (6, False)])
def test_the_dense_form_a_trace_records_is_the_sparse_forward_ties_included(shared, normalize):
    """`dense_forward` (what ONNX export and the graph view trace) gives `forward`'s outputs, and its top-k
    keeps the experts `route` chooses, ties to the lowest index: an all-zero router ties every expert
    (experts 0 and 1 chosen); a router scoring expert 3 alone ties the rest (3 and 0, or 0 and 1)."""
    Device("cpu").seed(3)
    moe = nn.SparseMoeConfig(8, 12, n_experts=5, top_k=2, normalize_top_k=normalize, d_shared=shared).init()
    x = Tensor.from_data(np.random.default_rng(4).standard_normal((2, 7, 8)).astype(np.float32))
    np.testing.assert_allclose(moe.dense_forward(x).numpy(), moe.forward(x).numpy(), atol=1e-6, rtol=0)
    one_expert = np.zeros((8, 5), dtype=np.float32)
    one_expert[:, 3] = 1.0
    for router in (np.zeros((8, 5), dtype=np.float32), one_expert):
        moe.gate.weight = moe.gate.weight.map(lambda t, w=router: Tensor.from_data(w))
        flat = x.reshape(-1, 8)
        chosen = moe.route(flat)[1]
        kept = moe.top_k_weights(flat).numpy() != 0
        assert [sorted(np.nonzero(k)[0].tolist()) for k in kept] == [sorted(c) for c in chosen.tolist()]
        assert {tuple(sorted(c)) for c in chosen.tolist()} <= {(0, 1), (0, 3)}
        np.testing.assert_allclose(moe.dense_forward(x).numpy(), moe.forward(x).numpy(), atol=1e-6, rtol=0)
    assert {tuple(sorted(c)) for c in chosen.tolist()} == {(0, 1), (0, 3)}  # x sums of both signs: both ties


# ---------------------------------------------------------------------------------- LoRA on the fused experts
PEFT_SIDE = """
import json, sys
import numpy as np, torch, transformers, peft
base = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation="eager")
model = peft.PeftModel.from_pretrained(base, sys.argv[2]).eval()
e = np.load(sys.argv[3])
with torch.no_grad():
    logits = model(input_ids=torch.from_numpy(e["input_ids"]), attention_mask=torch.from_numpy(e["attention_mask"]))
np.save(sys.argv[4], logits.logits.numpy())
"""


@pytest.mark.parametrize("name, base", [("qwen3-moe-experts", "qwen3-moe"), ("qwen2-moe-experts", "qwen2-moe")])
def test_peft_lora_on_the_fused_experts_loads_with_peft_logits_and_saves_back(name, base, tmp_path):
    """peft's LoRA on transformers 5's fused experts (target_parameters mlp.experts.gate_up_proj / down_proj, a
    ParamWrapper each: lora_A [r * experts, in], lora_B [out, r * experts]) loads as per-expert LoRAs whose gate
    and up share one A, with peft's logits; Ember's save holds the same tensors under the same names and config."""
    from engine.models import load_peft_adapter, save_peft_adapter  # noqa: PLC0415
    from tests.engine.models.test_peft import _tensors  # noqa: PLC0415

    adapter = PEFT / name
    tuned = load_peft_adapter(from_pretrained(HF / base), adapter)
    e = np.load(adapter / "expected.npz")
    rows = e["attention_mask"].astype(bool)  # padded positions: transformers and Ember differ there
    ours = _logits(tuned, e)
    diff = float(np.abs(ours - e["logits"])[rows].max())
    print(f"{name}: |Ember - peft| logits {diff:.1e}")
    assert diff <= 1e-5
    assert np.abs(e["logits"] - _exp(base)["logits"])[rows].max() > 0.5  # the experts' LoRA moves the logits
    expert = tuned.layers[0].mlp.experts[1]
    a = expert.gate_proj.weight.reparameterization.a
    assert a is expert.up_proj.weight.reparameterization.a
    assert a is not expert.down_proj.weight.reparameterization.a
    assert a is not tuned.layers[0].mlp.experts[0].gate_proj.weight.reparameterization.a
    out = save_peft_adapter(tuned, tmp_path / "a")
    mine, theirs = _tensors(out / "adapter_model.safetensors"), _tensors(adapter / "adapter_model.safetensors")
    assert sorted(mine) == sorted(theirs)
    assert max(float(np.abs(mine[k] - theirs[k]).max()) for k in theirs) == 0.0
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["target_parameters"] == [f"model.layers.{i}.mlp.experts.{p}" for i in (0, 2)
                                        for p in ("down_proj", "gate_up_proj")]
    assert not any("experts" in m for m in cfg["target_modules"])
    np.testing.assert_allclose(_logits(load_peft_adapter(from_pretrained(HF / base), out), e), ours, rtol=0, atol=0)


@pytest.mark.parametrize("name, base", [("qwen3-moe-experts", "qwen3-moe"), ("qwen2-moe-experts", "qwen2-moe")])
def test_embers_save_of_a_fused_experts_lora_loads_in_peft_with_embers_logits(name, base, tmp_path):
    """Ember's save of an experts LoRA it trained a step (B no longer peft's) loaded by transformers 5 + peft 0.21 (the
    oracle Python in a subprocess; skipped visibly without one): the logits agree to 1e-5."""
    import subprocess  # noqa: PLC0415

    from engine import optim  # noqa: PLC0415
    from engine.models import load_peft_adapter, save_peft_adapter  # noqa: PLC0415
    from tests.engine.models.test_training_script import _torch_side  # noqa: PLC0415

    python = _torch_side()
    tuned = load_peft_adapter(from_pretrained(HF / base), PEFT / name).train()
    e = np.load(PEFT / name / "expected.npz")
    d = tuned.forward(Tensor.from_data(e["input_ids"])) - 1.0
    tuned = optim.AdamConfig().init().step(0.05, tuned, optim.GradientsParams.from_grads((d * d).mean().backward(),
                                                                                         tuned))
    ours = _logits(tuned, e)
    assert np.abs(ours - e["logits"]).max() > 0.05
    out = save_peft_adapter(tuned, tmp_path / "a")
    proc = subprocess.run([python, "-c", PEFT_SIDE, str(HF / base), str(out), str(PEFT / name / "expected.npz"),
                           str(tmp_path / "theirs.npy")], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = e["attention_mask"].astype(bool)
    diff = float(np.abs(np.load(tmp_path / "theirs.npy") - ours)[rows].max())
    print(f"{name}: Ember's save in peft, |peft - Ember| logits {diff:.1e}")
    assert diff <= 1e-5
