"""BERT (`engine.models.bert`) against transformers: the committed oracle folder
tests/fixtures/hf/bert (tiny random BertModel made by transformers 5.24 with its pooler, perturbed
weights; see its README) and its expected.npz."""
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.models import PretrainedError, from_pretrained, pretrained_names, save_pretrained
from engine.models.bert import BertConfig, BertModel

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "bert"
# transformers 5.24: BertModel.from_pretrained(FIXTURE).num_parameters()
TRANSFORMERS_NUM_PARAMS = 20906
ATOL = 1e-4


def _expected():
    return dict(np.load(FIXTURE / "expected.npz"))


def _inputs(exp):
    return (Tensor.from_data(exp["input_ids"]), Tensor.from_data(exp["attention_mask"]),
            Tensor.from_data(exp["token_type_ids"]))


def _stored(folder: Path) -> dict[str, np.ndarray]:
    """model.safetensors read with the format's own layout, independently of Ember."""
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + start:8 + n + end], dtype="<f4").reshape(info["shape"])
    return out


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


def _copy(tmp_path, config_changes=None, drop_keys=(), tensors=None, name="bert") -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURE, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(config_changes or {})
    for k in drop_keys:
        cfg.pop(k)
    (folder / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        _write_safetensors(folder / "model.safetensors", tensors)
    return folder


def test_hidden_states_and_pooler_match_transformers_with_padding():
    exp = _expected()
    model = from_pretrained(FIXTURE)
    assert isinstance(model, BertModel)
    model = model.valid()  # transformers' eval(): no dropout
    ids, mask, types = _inputs(exp)
    hidden = model.forward(ids, attention_mask=mask, token_type_ids=types)
    assert hidden.shape == (2, 7, 32)
    # every position (in BERT the mask changes all of row 1: README)
    np.testing.assert_allclose(hidden.numpy(), exp["last_hidden_state"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(model.pool(hidden).numpy(), exp["pooler_output"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(model.pooled(ids, mask, types).numpy(), exp["pooler_output"], rtol=0, atol=ATOL)
    # the embeddings' output (after their LayerNorm) and the first layer's
    np.testing.assert_allclose(model.embeddings.forward(ids, types).numpy(), exp["hidden_states_0"], rtol=0,
                               atol=ATOL)
    # the mask and the token types both matter
    unmasked = model.forward(ids, token_type_ids=types).numpy()
    assert np.abs(unmasked[1] - exp["last_hidden_state"][1]).max() > 0.01
    np.testing.assert_allclose(unmasked[0], exp["last_hidden_state"][0], rtol=0, atol=ATOL)  # row 0 has no pad
    assert np.abs(model.forward(ids, mask).numpy() - exp["last_hidden_state"]).max() > 0.01
    # no token_type_ids means all zeros
    zeros = Tensor.from_data(np.zeros((2, 7), dtype=np.int64))
    np.testing.assert_array_equal(model.forward(ids, mask).numpy(), model.forward(ids, mask, zeros).numpy())


def test_parameter_count_paths_and_display():
    model = from_pretrained(FIXTURE)
    assert model.num_params() == TRANSFORMERS_NUM_PARAMS
    assert not any(p.is_initialized() for _, p in model.named_params())
    names = pretrained_names(model)
    assert names["embeddings.LayerNorm.gamma"] == "embeddings.LayerNorm.weight"
    assert names["encoder.layer.1.attention.self.query.weight"] == "encoder.layer.1.attention.self.query.weight"
    assert names["encoder.layer.0.attention.self.output.bias"] == "encoder.layer.0.attention.output.dense.bias"
    assert names["encoder.layer.0.output.LayerNorm.beta"] == "encoder.layer.0.output.LayerNorm.bias"
    assert names["pooler.dense.weight"] == "pooler.dense.weight"
    assert len(names) == len(model.named_params())
    text = str(model)
    assert text.startswith("BertModel {\n  embeddings: BertEmbeddings {\n")
    assert "self: MultiHeadAttention {d_model: 32, n_heads: 4, d_k: 8," in text
    assert "LayerNorm: LayerNorm {d_model: 32, epsilon: 0.000000000001, bias: true, params: 64}" in text
    assert "intermediate_act_fn: Gelu\n" in text and "activation: Tanh" in text
    assert not any(p.is_initialized() for _, p in model.named_params())


def test_linear_weights_are_transposed_from_torch_layout():
    stored = _stored(FIXTURE)
    model = from_pretrained(FIXTURE)
    layer = model.encoder.layer[0]
    w = stored["encoder.layer.0.attention.self.query.weight"]  # torch [out, in], square
    np.testing.assert_array_equal(layer.attention.self.query.weight.val().numpy(), w.T)
    np.testing.assert_array_equal(layer.intermediate.dense.weight.val().numpy(),
                                  stored["encoder.layer.0.intermediate.dense.weight"].T)  # [37, 32] -> [32, 37]


def test_task_model_folder_with_bert_prefix_and_head(tmp_path):
    """A folder of a task model (BertForSequenceClassification) names BertModel's tensors under
    `bert.` and adds its head: it opens as the same BertModel, the head ignored."""
    tensors = {f"bert.{k}": v for k, v in _stored(FIXTURE).items()}
    rng = np.random.default_rng(7)
    tensors["classifier.weight"] = rng.normal(size=(2, 32)).astype(np.float32)
    tensors["classifier.bias"] = np.zeros(2, np.float32)
    folder = _copy(tmp_path, {"architectures": ["BertForSequenceClassification"]}, tensors=tensors)
    model = from_pretrained(folder).valid()
    assert model.num_params() == TRANSFORMERS_NUM_PARAMS
    assert pretrained_names(model)["pooler.dense.bias"] == "bert.pooler.dense.bias"
    exp = _expected()
    np.testing.assert_allclose(model.forward(*_inputs(exp)).numpy(), exp["last_hidden_state"], rtol=0, atol=ATOL)

    # a masked-LM folder has no pooler: the model has none either
    no_pool = {k: v for k, v in tensors.items() if "pooler" not in k and not k.startswith("classifier")}
    no_pool["cls.predictions.bias"] = np.zeros(128, np.float32)
    folder2 = _copy(tmp_path, {"architectures": ["BertForMaskedLM"]}, tensors=no_pool, name="mlm")
    mlm = from_pretrained(folder2).valid()
    assert mlm.pooler is None and mlm.num_params() == TRANSFORMERS_NUM_PARAMS - 32 * 32 - 32
    np.testing.assert_allclose(mlm.forward(*_inputs(exp)).numpy(), exp["last_hidden_state"], rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="no pooler"):
        mlm.pooled(*_inputs(exp))
    # converted pre-training checkpoints (bert-base-uncased: BertForMaskedLM) still hold the pooler
    with_pool = dict(no_pool, **{k: v for k, v in tensors.items() if "pooler" in k})
    folder3 = _copy(tmp_path, {"architectures": ["BertForMaskedLM"]}, tensors=with_pool, name="mlm-pooler")
    assert from_pretrained(folder3).pooler is None


def test_save_pretrained_round_trip_is_bit_exact(tmp_path):
    source = _stored(FIXTURE)
    model = from_pretrained(FIXTURE)
    model.valid().forward(*_inputs(_expected()))  # read every value: saved from the parameters
    out = save_pretrained(model, tmp_path / "out")
    again = _stored(out)
    assert set(again) == set(source)
    for k, v in source.items():
        np.testing.assert_array_equal(again[k], v)
    cfg = json.loads((out / "config.json").read_text())
    assert BertConfig.from_json(cfg) == BertConfig.from_json(json.loads((FIXTURE / "config.json").read_text()))


@pytest.mark.parametrize("changes, key", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"is_decoder": True}, "is_decoder"),
    ({"hidden_act": "quick_gelu"}, "hidden_act"),
    ({"num_attention_heads": 5}, "hidden_size"),
    ({"intermediate_size": -1}, "intermediate_size"),
])
def test_unsupported_or_invalid_settings_are_refused_naming_the_key(tmp_path, changes, key):
    folder = _copy(tmp_path, changes)
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    assert f"'{key}'" in str(info.value) and "config.json" in str(info.value)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                 "vocab_size", "max_position_embeddings"])
def test_a_missing_size_is_a_clear_error(tmp_path, key):
    folder = _copy(tmp_path, drop_keys=[key])
    with pytest.raises(PretrainedError, match=f"'{key}': missing"):
        from_pretrained(folder)


def test_a_tensor_that_does_not_fit_the_config_names_it(tmp_path):
    folder = _copy(tmp_path, {"type_vocab_size": 3})
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    message = str(info.value)
    assert "embeddings.token_type_embeddings.weight" in message and "[2, 32]" in message and "[3, 32]" in message


def test_bad_inputs_are_clear_errors():
    model = from_pretrained(FIXTURE).valid()
    ids = Tensor.from_data(np.ones((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="65 tokens, but this BERT has 64 positions"):
        model.forward(Tensor.from_data(np.ones((1, 65), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"token_type_ids: expected dims \[1, 3\]"):
        model.forward(ids, token_type_ids=Tensor.from_data(np.zeros((1, 2), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"attention_mask: expected dims \[1, 3\]"):
        model.forward(ids, attention_mask=Tensor.from_data(np.ones((2, 3), dtype=np.int64)))


def test_lora_finetune_materialized_and_saved_loads_in_transformers(tmp_path):
    """Optional (transformers installed, e.g. the oracle venv with --noconftest): LoRA on the
    attention's query/value, a few Adam steps, materialize(), save_pretrained; transformers'
    BertModel.from_pretrained gives Ember's hidden states and pooler output."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from engine import ParamGroup, optim
    from engine.module import Lora

    exp = _expected()
    inputs = _inputs(exp)
    model = from_pretrained(FIXTURE).apply_lora(
        Lora(rank=4, alpha=8.0, param_group=ParamGroup.from_regex(r"attention\.self\.(query|value)\.weight$")))
    optimizer = optim.AdamConfig().init()
    target = Tensor.from_data(exp["last_hidden_state"])
    for _ in range(3):
        loss = (model.forward(*inputs) * target).mean()
        model = optimizer.step(1e-2, model, optim.GradientsParams.from_grads(loss.backward(), model))
    merged = model.materialize().valid()
    hidden = merged.forward(*inputs)
    ours, ours_pooled = hidden.numpy(), merged.pool(hidden).numpy()
    assert np.abs(ours - exp["last_hidden_state"]).max() > 1e-3  # the fine-tune changed the model
    out = save_pretrained(merged, tmp_path / "tuned")
    theirs_model = transformers.BertModel.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = theirs_model(input_ids=torch.from_numpy(exp["input_ids"]),
                              attention_mask=torch.from_numpy(exp["attention_mask"]),
                              token_type_ids=torch.from_numpy(exp["token_type_ids"]))
    np.testing.assert_allclose(ours, theirs.last_hidden_state.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(ours_pooled, theirs.pooler_output.numpy(), rtol=0, atol=ATOL)


def test_bert_base_builds_lazily_with_transformers_parameter_count():
    """transformers 5.24's BertModel(BertConfig(vocab_size=30522)).num_parameters() is 109,482,240
    (bert-base, with its pooler); Ember builds it without allocating its weights."""
    from engine.models.bert import build
    raw = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
           "intermediate_size": 3072, "max_position_embeddings": 512}
    model = build(BertConfig.from_json(raw))
    assert model.num_params() == 109_482_240
    assert not any(p.is_initialized() for _, p in model.named_params())
