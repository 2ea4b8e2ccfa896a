"""GPT-2 (`engine.models.gpt2`) against transformers: the committed oracle folder
tests/fixtures/hf/gpt2 (tiny random GPT2LMHeadModel made by transformers 5.24, tied head,
`gelu_new`, perturbed weights; see its README) and its expected.npz."""
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.models import PretrainedError, from_pretrained, pretrained_names, save_pretrained
from engine.models.gpt2 import GPT2Config, GPT2LMHeadModel

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "gpt2"
# transformers 5.24: GPT2LMHeadModel.from_pretrained(FIXTURE).num_parameters() (tied: wte counted once)
TRANSFORMERS_NUM_PARAMS = 31616
ATOL = 1e-4


def _expected():
    return dict(np.load(FIXTURE / "expected.npz"))


def _stored(folder: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a model.safetensors, read here with the format's own layout (an
    8-byte header length, a JSON header, raw little-endian data) independently of Ember."""
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32"
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + start:8 + n + end], dtype="<f4").reshape(info["shape"])
    return out


def _copy(tmp_path, config_changes=None, drop_keys=(), tensors=None) -> Path:
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(config_changes or {})
    for k in drop_keys:
        cfg.pop(k)
    (folder / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        _write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_logits_match_transformers_with_and_without_the_padding_mask():
    exp = _expected()
    model = from_pretrained(FIXTURE)
    assert isinstance(model, GPT2LMHeadModel)
    model = model.valid()  # transformers' eval(): no dropout
    ids, mask = Tensor.from_data(exp["input_ids"]), Tensor.from_data(exp["attention_mask"])
    logits = model.forward(ids, attention_mask=mask).numpy()
    assert logits.shape == (2, 7, 128)
    # every position, padded queries included (the mask changes only those: README)
    np.testing.assert_allclose(logits, exp["logits"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(model.forward(ids).numpy(), exp["logits_nomask"], rtol=0, atol=ATOL)
    # the mask matters: without it the padded row's last positions differ
    assert np.abs(exp["logits"][1, 5:] - exp["logits_nomask"][1, 5:]).max() > 0.1
    # the final hidden states (after ln_f) too
    hidden = model.hidden_states(ids, attention_mask=mask).numpy()
    np.testing.assert_allclose(hidden, exp["hidden_states_2"], rtol=0, atol=ATOL)
    # a bool mask (True = token) means the same
    bool_mask = Tensor.from_data(exp["attention_mask"].astype(bool))
    np.testing.assert_allclose(model.forward(ids, attention_mask=bool_mask).numpy(), exp["logits"], rtol=0, atol=ATOL)


def test_parameter_count_and_the_tied_head_is_one_parameter(tmp_path):
    model = from_pretrained(FIXTURE)
    assert model.num_params() == TRANSFORMERS_NUM_PARAMS
    paths = [p for p, _ in model.named_params()]
    ids = [param.id for _, param in model.named_params()]
    assert len(set(ids)) == len(ids)
    assert model.lm_head is None and not any(p.startswith("lm_head") for p in paths)
    assert "wte.weight" in paths and "h.0.attn.query.weight" in paths and "h.1.mlp.c_proj.bias" in paths
    names = pretrained_names(model)
    assert names["wte.weight"] == "transformer.wte.weight"
    assert names["h.0.attn.value.bias"] == "transformer.h.0.attn.c_attn.bias"
    assert names["h.1.ln_2.gamma"] == "transformer.h.1.ln_2.weight"
    # the head is the embedding transposed
    exp = _expected()
    ids_t = Tensor.from_data(exp["input_ids"])
    valid = model.valid()
    hidden = valid.hidden_states(ids_t).numpy()
    np.testing.assert_allclose(valid.forward(ids_t).numpy(), hidden @ valid.wte.weight.val().numpy().T,
                               rtol=1e-5, atol=1e-5)
    # training: the one embedding gets the gradient of both uses (without dropout, so deterministic)
    folder = _copy(tmp_path, {"embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0})
    trained = from_pretrained(folder).train()
    one = Tensor.from_data(exp["input_ids"][:1, :1])
    grads = trained.forward(one).sum().backward()
    g = trained.wte.weight.val().grad(grads).numpy()
    # the lookup alone would reach one row; the head reaches every row (each with sum(hidden))
    np.testing.assert_allclose(np.delete(g, exp["input_ids"][0, 0], axis=0),
                               np.broadcast_to(trained.hidden_states(one).numpy().sum(axis=(0, 1)), (127, 32)),
                               rtol=1e-5, atol=1e-6)


def test_opening_reads_nothing_and_displays_like_burn():
    model = from_pretrained(FIXTURE)
    assert not any(p.is_initialized() for _, p in model.named_params())
    text = str(model)
    assert text.startswith("GPT2LMHeadModel {\n  wte: Embedding {n_embedding: 128, d_model: 32, params: 4096}\n")
    assert "attn: MultiHeadAttention {d_model: 32, n_heads: 4, d_k: 8," in text
    assert "act: Gelu {approximate: tanh}" in text and "lm_head: None" in text
    assert text.rstrip().endswith(f"params: {TRANSFORMERS_NUM_PARAMS}\n}}")
    assert not any(p.is_initialized() for _, p in model.named_params())


def test_square_c_proj_and_fused_c_attn_load_untransposed():
    """Conv1D stores [in, out] (Ember's Linear layout): the square attn.c_proj must load as it is
    (a transposing loader gave errors of 0.3 and no shape error), c_attn split along dim 1."""
    stored = _stored(FIXTURE)
    model = from_pretrained(FIXTURE)
    for i in (0, 1):
        w = stored[f"transformer.h.{i}.attn.c_proj.weight"]
        assert w.shape == (32, 32)
        got = model.h[i].attn.output.weight.val().numpy()
        np.testing.assert_array_equal(got, w)
        assert np.abs(got - w.T).max() > 0.1  # the test can tell the two layouts apart
        qkv, qkv_b = stored[f"transformer.h.{i}.attn.c_attn.weight"], stored[f"transformer.h.{i}.attn.c_attn.bias"]
        for j, part in enumerate(("query", "key", "value")):
            lin = getattr(model.h[i].attn, part)
            np.testing.assert_array_equal(lin.weight.val().numpy(), qkv[:, 32 * j:32 * (j + 1)])
            np.testing.assert_array_equal(lin.bias.val().numpy(), qkv_b[32 * j:32 * (j + 1)])
        np.testing.assert_array_equal(model.h[i].mlp.c_fc.weight.val().numpy(),
                                      stored[f"transformer.h.{i}.mlp.c_fc.weight"])  # [32, 128]
    # and the model built from those weights is transformers' (differential: the logits)
    exp = _expected()
    out = model.valid().forward(Tensor.from_data(exp["input_ids"])).numpy()
    np.testing.assert_allclose(out, exp["logits_nomask"], rtol=0, atol=ATOL)


def test_untied_head_loads_lm_head_transposed(tmp_path):
    """tie_word_embeddings false: lm_head.weight ([vocab, d], torch nn.Linear) is its own
    parameter; the logits are ln_f(hidden) @ lm_head.weight.T, checked with NumPy."""
    tensors = dict(_stored(FIXTURE))
    rng = np.random.default_rng(19)
    head = rng.normal(0, 0.2, size=(128, 32)).astype(np.float32)
    tensors["lm_head.weight"] = head
    folder = _copy(tmp_path, {"tie_word_embeddings": False}, tensors=tensors)
    model = from_pretrained(folder)
    assert model.lm_head is not None and model.num_params() == TRANSFORMERS_NUM_PARAMS + head.size
    model = model.valid()
    exp = _expected()
    ids, mask = Tensor.from_data(exp["input_ids"]), Tensor.from_data(exp["attention_mask"])
    hidden = exp["hidden_states_2"]  # transformers' ln_f output for the same weights
    np.testing.assert_allclose(model.forward(ids, mask).numpy(), hidden @ head.T, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(model.lm_head.weight.val().numpy(), head.T)
    # a tied folder that still stores lm_head.weight loads too (transformers ignores it as well)
    folder2 = _copy(tmp_path / "tied", tensors=tensors)
    assert from_pretrained(folder2).lm_head is None


def test_save_pretrained_round_trip_is_bit_exact(tmp_path):
    source = _stored(FIXTURE)
    model = from_pretrained(FIXTURE)
    out = save_pretrained(model, tmp_path / "untouched")
    again = _stored(out)
    assert set(again) == {k for k in source if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    for k, v in source.items():
        np.testing.assert_array_equal(again[k], v)
    # after reading every value (the split q/k/v concatenated again from the parameters)
    model.valid().forward(Tensor.from_data(_expected()["input_ids"]))
    assert all(p.is_initialized() for _, p in model.named_params())
    out2 = save_pretrained(model, tmp_path / "read")
    for k, v in _stored(out2).items():
        np.testing.assert_array_equal(v, source[k])
    cfg = json.loads((out2 / "config.json").read_text())
    assert cfg["architectures"] == ["GPT2LMHeadModel"] and cfg["tie_word_embeddings"] is True
    assert GPT2Config.from_json(cfg) == GPT2Config.from_json(json.loads((FIXTURE / "config.json").read_text()))
    reopened = from_pretrained(out2).valid()
    exp = _expected()
    np.testing.assert_allclose(reopened.forward(Tensor.from_data(exp["input_ids"]),
                                                Tensor.from_data(exp["attention_mask"])).numpy(),
                               exp["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("changes, key", [
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ({"scale_attn_weights": False}, "scale_attn_weights"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"activation_function": "quick_gelu"}, "activation_function"),
    ({"n_head": 5}, "n_embd"),  # 32 is not divisible by 5
    ({"n_layer": 0}, "n_layer"),
    ({"layer_norm_epsilon": "small"}, "layer_norm_epsilon"),
])
def test_unsupported_or_invalid_settings_are_refused_naming_the_key(tmp_path, changes, key):
    folder = _copy(tmp_path, changes)
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    message = str(info.value)
    assert f"'{key}'" in message and "config.json" in message
    assert repr(next(iter(changes.values()))) in message or key == "n_embd"


@pytest.mark.parametrize("key", ["n_embd", "n_head", "n_layer", "n_positions", "vocab_size"])
def test_a_missing_size_is_a_clear_error(tmp_path, key):
    folder = _copy(tmp_path, drop_keys=[key])
    with pytest.raises(PretrainedError, match=f"'{key}': missing") as info:
        from_pretrained(folder)
    assert "config.json" in str(info.value)


def test_a_tensor_that_does_not_fit_the_config_names_it(tmp_path):
    folder = _copy(tmp_path, {"n_positions": 32})  # the file's wpe has 64 rows
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    message = str(info.value)
    assert "transformer.wpe.weight" in message and "[64, 32]" in message and "[32, 32]" in message


def test_bad_inputs_are_clear_errors():
    model = from_pretrained(FIXTURE).valid()
    with pytest.raises(ValueError, match="65 tokens, but this GPT-2 has 64 positions"):
        model.forward(Tensor.from_data(np.zeros((1, 65), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"attention_mask: expected dims \[1, 3\]"):
        model.forward(Tensor.from_data(np.zeros((1, 3), dtype=np.int64)), Tensor.from_data(np.ones((1, 4), np.int64)))
    with pytest.raises(ValueError, match="input_ids: expected an int tensor"):
        model.forward(Tensor.from_data(np.zeros((1, 3), dtype=np.float32)))


def test_lora_finetune_materialized_and_saved_loads_in_transformers(tmp_path):
    """Optional (transformers installed, e.g. the oracle venv with --noconftest): LoRA on the
    query/value projections, a few Adam steps, materialize(), save_pretrained; transformers'
    GPT2LMHeadModel.from_pretrained gives Ember's logits (c_attn concatenated back from the
    trained query and value)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from engine import ParamGroup, optim
    from engine.module import Lora

    exp = _expected()
    ids, mask = Tensor.from_data(exp["input_ids"]), Tensor.from_data(exp["attention_mask"])
    model = from_pretrained(FIXTURE).apply_lora(
        Lora(rank=4, alpha=8.0, param_group=ParamGroup.from_regex(r"attn\.(query|value)\.weight$")))
    optimizer = optim.AdamConfig().init()
    for _ in range(3):
        loss = (model.forward(ids, mask) * Tensor.from_data(exp["logits"])).mean()
        model = optimizer.step(1e-2, model, optim.GradientsParams.from_grads(loss.backward(), model))
    merged = model.materialize().valid()
    ours = merged.forward(ids, mask).numpy()
    assert np.abs(ours - exp["logits"]).max() > 1e-3  # the fine-tune changed the model
    out = save_pretrained(merged, tmp_path / "tuned")
    theirs_model = transformers.GPT2LMHeadModel.from_pretrained(out, dtype=torch.float32,
                                                                attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = theirs_model(input_ids=torch.from_numpy(exp["input_ids"]),
                              attention_mask=torch.from_numpy(exp["attention_mask"])).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)


@pytest.mark.parametrize("sizes, transformers_count", [
    ({}, 124_439_808),                                             # gpt2 (transformers' defaults)
    ({"n_embd": 1600, "n_layer": 48, "n_head": 25}, 1_557_611_200),  # gpt2-xl
])
def test_real_sizes_build_lazily_with_transformers_parameter_count(sizes, transformers_count):
    """The counts are transformers 5.24's GPT2LMHeadModel(GPT2Config(**sizes)).num_parameters()
    (built on the meta device); Ember builds the same model without allocating its weights."""
    import tracemalloc

    from engine.models.gpt2 import build
    raw = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257, **sizes}
    tracemalloc.start()
    try:
        model = build(GPT2Config.from_json(raw))
        count = model.num_params()
        text = str(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == transformers_count
    assert not any(p.is_initialized() for _, p in model.named_params())
    assert peak < 64 * 2 ** 20  # the weights alone would be 0.5-6 GB
    assert f"params: {transformers_count}\n}}" in text


def test_older_files_attention_buffers_are_ignored(tmp_path):
    """transformers 4 before 4.3x saved each block's causal-mask buffers (`attn.bias` [1, 1, n, n],
    `attn.masked_bias` []): they are not parameters and are skipped; any other extra tensor is refused."""
    tensors = dict(_stored(FIXTURE))
    for i in (0, 1):
        tensors[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((64, 64), np.float32))[None, None]
        tensors[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    model = from_pretrained(_copy(tmp_path, tensors=tensors)).valid()
    exp = _expected()
    np.testing.assert_allclose(model.forward(Tensor.from_data(exp["input_ids"]),
                                             Tensor.from_data(exp["attention_mask"])).numpy(),
                               exp["logits"], rtol=0, atol=ATOL)
    tensors["transformer.h.0.attn.extra"] = np.zeros(3, np.float32)
    with pytest.raises(PretrainedError, match="transformer.h.0.attn.extra"):
        from_pretrained(_copy(tmp_path / "extra", tensors=tensors))
