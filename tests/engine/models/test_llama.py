"""The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) against transformers:
every committed tiny folder under tests/fixtures/hf/ (made by transformers, see its README) opens
with `from_pretrained` and gives transformers' logits to 1e-4 at every position, with and without
the padding mask; GQA 3:1, tied embeddings (one parameter), BF16, shards, pytorch_model.bin,
Llama-3 rope scaling; bad configs and tensors that do not fit are clear errors."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn
from engine.models import PretrainedError, from_pretrained, pretrained_info, pretrained_names
from engine.models.llama import LlamaConfig, LlamaForCausalLM, build, weight_map
from engine.store import safetensors_io
from engine.store.burnpack import storage_dtype

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
FOLDERS = ["llama-gqa", "llama-tied", "llama-bf16", "llama-sharded", "llama-bin", "llama3-rope", "mistral", "qwen2",
           "qwen2-tied"]
# transformers' own parameter counts of these folders (`model.num_parameters()`, torch 2.13 / transformers 5.24)
HF_COUNTS = {"llama-gqa": 45552, "llama-tied": 23200, "llama-bf16": 45552, "llama-sharded": 45552, "llama-bin": 45552,
             "llama3-rope": 45552, "mistral": 25248, "qwen2": 25376, "qwen2-tied": 21280}
CLASSES = {"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen2-tied": "Qwen2ForCausalLM"}


def _logits(model, exp, mask=True):
    ids = Tensor.from_data(exp["input_ids"])
    if mask:
        return model.forward(ids, Tensor.from_data(exp["attention_mask"])).numpy()
    return model.forward(ids).numpy()


@pytest.mark.parametrize("name", FOLDERS)
def test_logits_equal_transformers(name):
    model = from_pretrained(HF / name)
    assert type(model).__name__ == CLASSES.get(name, "LlamaForCausalLM")
    assert not any(p.is_initialized() for _, p in model.named_params())  # lazy until used
    assert model.num_params() == HF_COUNTS[name]
    exp = np.load(HF / name / "expected.npz")
    got = _logits(model, exp)
    assert got.shape == exp["logits"].shape == (2, 7, 128)
    # every position: the padded queries (row 1, positions 5, 6) are well defined in transformers too
    # (causal + right padding: each still sees the real tokens before it) and the mask changes them
    np.testing.assert_allclose(got, exp["logits"], rtol=0, atol=1e-4)
    np.testing.assert_allclose(_logits(model, exp, mask=False), exp["logits_nomask"], rtol=0, atol=1e-4)
    assert np.abs(exp["logits"][1, 5:] - exp["logits_nomask"][1, 5:]).max() > 0.1  # the mask is really tested


def test_gqa_three_query_heads_per_kv_head():
    model = from_pretrained(HF / "llama-gqa")
    attn = model.layers[0].self_attn
    assert (attn.n_heads, attn.n_kv_heads, attn.d_k) == (6, 2, 8)
    assert attn.query.weight.shape == (48, 48) and attn.key.weight.shape == (48, 16)
    assert attn.value.weight.shape == (48, 16) and attn.output.weight.shape == (48, 48)
    assert attn.query.bias is None and attn.output.bias is None
    names = pretrained_names(model)
    assert names["layers.0.self_attn.query.weight"] == "model.layers.0.self_attn.q_proj.weight"
    assert names["layers.1.mlp.down_proj.weight"] == "model.layers.1.mlp.down_proj.weight"
    assert names["norm.gamma"] == "model.norm.weight" and names["lm_head.weight"] == "lm_head.weight"


@pytest.mark.parametrize("name", ["llama-tied", "qwen2-tied"])
def test_tied_embeddings_are_one_parameter(name):
    model = from_pretrained(HF / name)
    assert model.lm_head is None and model.config.tie_word_embeddings
    params = model.named_params()
    ids = [p.id for _, p in params]
    assert len(ids) == len(set(ids))
    assert "lm_head.weight" not in pretrained_names(model).values()
    emb = model.embed_tokens.weight
    assert emb.id in ids and model.num_params() == HF_COUNTS[name]
    # the one parameter gets the gradient of both uses (the lookup and the head)
    exp = np.load(HF / name / "expected.npz")
    trained = model.train()
    out = trained.forward(Tensor.from_data(exp["input_ids"]))
    grads = out.sum().backward()
    g = trained.embed_tokens.weight.val().grad(grads).numpy()
    unused_rows = sorted(set(range(128)) - set(exp["input_ids"].ravel().tolist()))
    assert np.abs(g[unused_rows]).max() > 0  # rows never looked up still get the head's gradient


def test_qwen2_has_qkv_biases_and_no_output_bias():
    model = from_pretrained(HF / "qwen2")
    attn = model.layers[0].self_attn
    assert attn.query.bias is not None and attn.key.bias is not None and attn.value.bias is not None
    assert attn.output.bias is None
    assert model.rotary_emb.theta == 1e6
    assert pretrained_names(model)["layers.0.self_attn.key.bias"] == "model.layers.0.self_attn.k_proj.bias"


def test_bf16_folder_is_read_as_stored():
    model = from_pretrained(HF / "llama-bf16")
    info = pretrained_info(model)
    assert set(info.stored_dtypes.values()) == {"BF16"}
    assert model.embed_tokens.weight.val().dtype == "float32"


def test_llama3_rope_scaling():
    model = from_pretrained(HF / "llama3-rope")
    scaling = model.rotary_emb.scaling
    assert scaling == nn.Llama3RopeScaling(8.0, 1.0, 4.0, 16)
    assert model.config.rope_theta == 500000.0 and model.rotary_emb.max_sequence_length == 128
    # without the scaling the same weights give other logits: the scaling is what matches transformers
    cfg = LlamaConfig.from_json({**json.loads((HF / "llama3-rope" / "config.json").read_text()),
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})
    plain = build(cfg)
    for (path, p), (_, q) in zip(plain.named_params(), model.named_params()):
        assert path
        q.val()
    plain = plain.load_record(model.into_record())
    exp = np.load(HF / "llama3-rope" / "expected.npz")
    assert np.abs(_logits(plain, exp) - exp["logits"]).max() > 0.5


def test_display_is_burn_style():
    model = from_pretrained(HF / "llama-gqa")
    text = str(model)
    assert text.startswith("LlamaForCausalLM {\n  embed_tokens: Embedding {n_embedding: 128, d_model: 48, params: 6144}")
    assert "self_attn: MultiHeadAttention {d_model: 48, n_heads: 6, n_kv_heads: 2, d_k: 8" in text
    assert "causal: true" in text and "lm_head: Linear {d_input: 48, d_output: 128, bias: false, params: 6144}" in text
    assert text.endswith("params: 45552\n}")


# ---------------------------------------------------------------------------------- configs
def _config(name="llama-gqa"):
    return json.loads((HF / name / "config.json").read_text())


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads"])
def test_a_config_missing_a_key_names_it(tmp_path, key):
    folder = tmp_path / "m"
    shutil.copytree(HF / "llama-gqa", folder)
    cfg = _config()
    del cfg[key]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedError, match=rf"missing key '{key}'") as info:
        from_pretrained(folder)
    assert "config.json" in str(info.value)


def test_config_json_round_trip_and_older_layouts():
    for name in FOLDERS:
        raw = _config(name)
        cfg = LlamaConfig.from_json(raw)
        again = LlamaConfig.from_json(cfg.to_json())
        assert again == cfg, name
    cfg = LlamaConfig.from_json(_config("llama3-rope"))
    assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16}
    # transformers 4 files: rope_theta at the top level, scaling under rope_scaling ("type" in older ones)
    old = {k: v for k, v in _config("llama3-rope").items() if k != "rope_parameters"}
    old.update(rope_theta=500000.0, rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    assert LlamaConfig.from_json(old) == cfg
    q = LlamaConfig.from_json(_config("qwen2"))
    assert q.attention_bias and not q.output_bias and q.rope_theta == 1e6 and q.sliding_window is None


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "mystery", "factor": 4.0, "rope_theta": 1e4}},
     r"rope_type 'mystery' is not supported: expected one of default, linear, llama3, yarn, dynamic, longrope"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 4}},
     r"'short_factor' must be a list of 4 numbers \(one per frequency of head_dim 8\)"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": -2.0}}, r"rope scaling 'yarn': 'factor' must be a positive"),
    ({"rope_parameters": {"rope_type": "dynamic"}}, r"rope scaling 'dynamic': 'factor' must be a positive number, found None"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
     r"'low_freq_factor' must be a positive number, found None"),
    ({"num_key_value_heads": 4}, r"'num_attention_heads' \(6\) must be a multiple of 'num_key_value_heads' \(4\)"),
    ({"hidden_act": "gelu"}, r"'hidden_act' 'gelu' is not supported"),
    ({"hidden_size": "48"}, r"'hidden_size' must be a positive int, found '48'"),
    ({"tie_word_embeddings": "yes"}, r"'tie_word_embeddings' must be true or false"),
])
def test_bad_config_values_are_clear_errors(change, message):
    with pytest.raises(PretrainedError, match=message) as info:
        LlamaConfig.from_json({**_config(), **change})
    assert "config.json" in str(info.value)


def test_mistral_sliding_window_applies_past_its_size(tmp_path):
    """A window shorter than the input: the positions inside it are unchanged, the later ones see only
    their last 4 keys (transformers' numbers: test_gemma.py's mistral-swa fixture)."""
    folder = tmp_path / "m"
    shutil.copytree(HF / "mistral", folder)
    cfg = _config("mistral")
    assert cfg["sliding_window"] is None
    ids = Tensor.from_data([[3, 4, 5, 6, 7, 8]])
    full = from_pretrained(folder).forward(ids).numpy()
    cfg["sliding_window"] = 4
    (folder / "config.json").write_text(json.dumps(cfg))
    model = from_pretrained(folder)
    assert [layer.self_attn.window for layer in model.layers] == [4] * len(model.layers)
    windowed = model.forward(ids).numpy()
    np.testing.assert_array_equal(windowed[:, :4], full[:, :4])
    assert np.abs(windowed[:, 4:] - full[:, 4:]).max() > 1e-3


# ---------------------------------------------------------------------------------- tensors
def _rewrite_shape(path: Path, tensor: str, shape):
    """Give one tensor of a safetensors file another shape of the same size, in its header only."""
    buf = path.read_bytes()
    plan = safetensors_io.plan(buf, len(buf), str(path))
    data_start = min(t.offset for t in plan.tensors)
    specs = []
    for t in sorted(plan.tensors, key=lambda t: t.offset):
        dims = tuple(shape) if t.name == tensor else t.shape
        specs.append((t.name, t.dtype, dims, t.nbytes))
    assert int(np.prod(shape)) * storage_dtype(next(t.dtype for t in plan.tensors)).itemsize == next(
        t.nbytes for t in plan.tensors if t.name == tensor)
    path.write_bytes(safetensors_io.header(specs, plan.metadata) + buf[data_start:])


def test_a_tensor_that_does_not_fit_the_config_names_file_and_tensor(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(HF / "llama-gqa", folder)
    _rewrite_shape(folder / "model.safetensors", "model.layers.1.mlp.up_proj.weight", (48, 72))
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    text = str(info.value)
    assert "model.safetensors" in text and "model.layers.1.mlp.up_proj.weight" in text
    assert "[72, 48]" in text and "[48, 72]" in text  # expected and found
    # a q/k tensor whose rows do not fit the heads: the rotary permutation says so
    shutil.copy(HF / "llama-gqa" / "model.safetensors", folder / "model.safetensors")
    _rewrite_shape(folder / "model.safetensors", "model.layers.0.self_attn.k_proj.weight", (48, 16))
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    assert "model.layers.0.self_attn.k_proj.weight" in str(info.value) and "model.safetensors" in str(info.value)


def test_the_weight_map_covers_every_parameter_once():
    for name in FOLDERS:
        cfg = LlamaConfig.from_json(_config(name))
        model = build(cfg)
        wmap = weight_map(cfg)
        hf = [wmap.find(p)[1] for p, _ in model.named_params()]
        assert len(hf) == len(set(hf)), name
        assert isinstance(model, LlamaForCausalLM)


def test_the_llama_7b_example_takes_a_real_llama_2_folders_names():
    """The example is LlamaForCausalLM from Llama-2-7B's config: its 291 parameters are the 291 tensors
    of meta-llama/Llama-2-7b-hf (names and torch shapes as in that checkpoint), nothing allocated."""
    from resources.examples import build_example

    model = build_example("llama-7b")
    assert type(model) is LlamaForCausalLM and model.num_params() == 6_738_415_616
    cfg = model.config
    assert (cfg.num_key_value_heads, cfg.rms_norm_eps, cfg.vocab_size, cfg.tie_word_embeddings) == (32, 1e-5, 32000,
                                                                                                    False)
    wmap = weight_map(cfg)
    stored = {}
    for path, p in model.named_params():
        rule, name = wmap.find(path)
        stored[name] = rule.stored_shape(p.shape)
    expected = {"model.embed_tokens.weight": (32000, 4096), "model.norm.weight": (4096,),
                "lm_head.weight": (32000, 4096)}
    for i in range(32):
        pre = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            expected[pre + f"self_attn.{n}.weight"] = (4096, 4096)
        expected[pre + "mlp.gate_proj.weight"] = expected[pre + "mlp.up_proj.weight"] = (11008, 4096)
        expected[pre + "mlp.down_proj.weight"] = (4096, 11008)
        expected[pre + "input_layernorm.weight"] = expected[pre + "post_attention_layernorm.weight"] = (4096,)
    assert len(expected) == 291 and stored == expected
    assert not any(p.is_initialized() for _, p in model.named_params())


def test_left_padding_matches_transformers_eager_attention():
    """A left-padded row: every real token matches transformers (eager and sdpa agree there). The
    padded queries that see no real key are where transformers' own two attentions disagree; Ember
    gives eager's answer (every key masked alike: uniform weights)."""
    exp = np.load(Path(__file__).parent / "fixtures" / "llama_left_padding.npz")
    model = from_pretrained(HF / "llama-gqa")
    got = model.forward(Tensor.from_data(exp["input_ids"]), Tensor.from_data(exp["attention_mask"])).numpy()
    real = exp["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[real], exp["sdpa"][real], rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, exp["eager"], rtol=0, atol=1e-4)
    assert np.abs(exp["eager"][0, :2] - exp["sdpa"][0, :2]).max() > 1.0  # transformers itself differs there


@pytest.mark.parametrize("name", ["llama-gqa", "llama-tied", "llama3-rope", "mistral", "qwen2", "qwen2-tied"])
def test_transformers_rebuilds_the_model_from_to_json(tmp_path, name):
    """Optional (needs transformers and torch, never Ember dependencies): config.json written from
    `LlamaConfig.to_json()` next to the folder's weights makes transformers give the expected logits.
    Run with the oracle venv: `PYTHONPATH=. /tmp/torchvenv/bin/python -m pytest -q -p no:cacheprovider
    --noconftest tests/engine/models/test_llama.py -k rebuilds`."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    shutil.copy(HF / name / "model.safetensors", tmp_path / "model.safetensors")
    cfg = LlamaConfig.from_json(_config(name))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_json()))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    exp = np.load(HF / name / "expected.npz")
    with torch.no_grad():
        out = model(torch.tensor(exp["input_ids"]), attention_mask=torch.tensor(exp["attention_mask"])).logits
    np.testing.assert_allclose(out.numpy(), exp["logits"], rtol=0, atol=1e-5)
