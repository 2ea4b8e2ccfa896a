"""ViT (`engine.models.vit`) against transformers: the committed oracle folder
tests/fixtures/hf/vit (tiny random ViTForImageClassification made by transformers 5.24: 16x16
images, 4x4 patches, 5 labels, perturbed weights; see its README) and its expected.npz."""
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.models import PretrainedError, from_pretrained, pretrained_names, save_pretrained
from engine.models.vit import ViTConfig, ViTForImageClassification

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "vit"
# transformers 5.24: ViTForImageClassification.from_pretrained(FIXTURE).num_parameters()
TRANSFORMERS_NUM_PARAMS = 15951
ATOL = 1e-4


def _expected():
    return dict(np.load(FIXTURE / "expected.npz"))


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


def _copy(tmp_path, config_changes=None, drop_keys=()) -> Path:
    folder = tmp_path / "vit"
    shutil.copytree(FIXTURE, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(config_changes or {})
    for k in drop_keys:
        cfg.pop(k)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_logits_and_hidden_states_match_transformers():
    exp = _expected()
    model = from_pretrained(FIXTURE)
    assert isinstance(model, ViTForImageClassification)
    model = model.valid()
    pixels = Tensor.from_data(exp["pixel_values"])
    logits = model.forward(pixels)
    assert logits.shape == (2, 5)
    np.testing.assert_allclose(logits.numpy(), exp["logits"], rtol=0, atol=ATOL)
    # the embeddings (class token + 16 patches, positions added) and the encoder's output
    np.testing.assert_allclose(model.embeddings.forward(pixels).numpy(), exp["hidden_states_0"], rtol=0, atol=ATOL)
    x = model.embeddings.forward(pixels)
    np.testing.assert_allclose(model.encoder.forward(x).numpy(), exp["hidden_states_2"], rtol=0, atol=ATOL)


def test_parameter_count_paths_layouts_and_display():
    model = from_pretrained(FIXTURE)
    assert model.num_params() == TRANSFORMERS_NUM_PARAMS
    assert not any(p.is_initialized() for _, p in model.named_params())
    names = pretrained_names(model)
    assert names["embeddings.cls_token"] == "vit.embeddings.cls_token"
    assert names["encoder.layer.1.attention.key.bias"] == "vit.encoder.layer.1.attention.attention.key.bias"
    assert names["encoder.layer.0.attention.output.weight"] == "vit.encoder.layer.0.attention.output.dense.weight"
    assert names["layernorm.gamma"] == "vit.layernorm.weight" and names["classifier.weight"] == "classifier.weight"
    text = str(model)
    assert text.startswith("ViTForImageClassification {\n  embeddings: ViTEmbeddings {\n"
                           "    cls_token: ParamTensor {rank: 3, shape: [1, 1, 32], kind: float}\n")
    assert "projection: Conv2d {ch_in: 3, ch_out: 32, stride: [4, 4], kernel_size: [4, 4]," in text
    assert "classifier: Linear {d_input: 32, d_output: 5, bias: true, params: 165}" in text
    assert not any(p.is_initialized() for _, p in model.named_params())
    stored = _stored(FIXTURE)
    # Conv2d: torch's layout is Ember's; Linear: transposed; the class token as stored
    np.testing.assert_array_equal(model.embeddings.patch_embeddings.projection.weight.val().numpy(),
                                  stored["vit.embeddings.patch_embeddings.projection.weight"])
    np.testing.assert_array_equal(model.classifier.weight.val().numpy(), stored["classifier.weight"].T)
    np.testing.assert_array_equal(model.embeddings.cls_token.val().numpy(), stored["vit.embeddings.cls_token"])


def test_save_pretrained_round_trip_is_bit_exact(tmp_path):
    source = _stored(FIXTURE)
    model = from_pretrained(FIXTURE)
    model.valid().forward(Tensor.from_data(_expected()["pixel_values"]))
    out = save_pretrained(model, tmp_path / "out")
    again = _stored(out)
    assert set(again) == set(source)
    for k, v in source.items():
        np.testing.assert_array_equal(again[k], v)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["id2label"]["4"] == "LABEL_4" and cfg["label2id"]["LABEL_0"] == 0
    assert ViTConfig.from_json(cfg) == ViTConfig.from_json(json.loads((FIXTURE / "config.json").read_text()))


def test_labels_follow_id2label(tmp_path):
    cfg = ViTConfig.from_json(json.loads((FIXTURE / "config.json").read_text()))
    assert cfg.num_labels == 5 and cfg.image_size == (16, 16) and cfg.patch_size == (4, 4) and cfg.num_patches == 16
    folder = _copy(tmp_path, {"num_labels": 3})
    with pytest.raises(PretrainedError, match="'num_labels': 3, but id2label names 5 labels"):
        from_pretrained(folder)


@pytest.mark.parametrize("changes, key", [
    ({"qkv_bias": False}, "qkv_bias"),
    ({"hidden_act": "quick_gelu"}, "hidden_act"),
    ({"image_size": 18}, "image_size"),          # not a whole number of 4x4 patches
    ({"patch_size": 0}, "patch_size"),
    ({"num_attention_heads": 3}, "hidden_size"),
])
def test_unsupported_or_invalid_settings_are_refused_naming_the_key(tmp_path, changes, key):
    folder = _copy(tmp_path, changes)
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    assert f"'{key}'" in str(info.value) and "config.json" in str(info.value)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"])
def test_a_missing_size_is_a_clear_error(tmp_path, key):
    folder = _copy(tmp_path, drop_keys=[key])
    with pytest.raises(PretrainedError, match=f"'{key}': missing"):
        from_pretrained(folder)


def test_a_tensor_that_does_not_fit_the_config_names_it(tmp_path):
    folder = _copy(tmp_path, {"image_size": 32})  # 64 patches: the file's positions have 17 rows
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    message = str(info.value)
    assert "vit.embeddings.position_embeddings" in message and "[1, 17, 32]" in message and "[1, 65, 32]" in message


def test_bad_inputs_are_clear_errors():
    model = from_pretrained(FIXTURE).valid()
    with pytest.raises(ValueError, match=r"pixel_values: expected dims \[batch, 3, 16, 16\].*found \[1, 3, 32, 32\]"):
        model.forward(Tensor.from_data(np.zeros((1, 3, 32, 32), dtype=np.float32)))


def test_lora_finetune_materialized_and_saved_loads_in_transformers(tmp_path):
    """Optional (transformers installed, e.g. the oracle venv with --noconftest): LoRA on the
    attention's query/value and the classifier, a few Adam steps, materialize(), save_pretrained;
    transformers' ViTForImageClassification.from_pretrained gives Ember's logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from engine import ParamGroup, optim
    from engine.module import Lora

    exp = _expected()
    pixels = Tensor.from_data(exp["pixel_values"])
    model = from_pretrained(FIXTURE).apply_lora(
        Lora(rank=4, alpha=8.0, param_group=ParamGroup.from_regex(r"(attention\.(query|value)|classifier)\.weight$")))
    optimizer = optim.AdamConfig().init()
    for _ in range(3):
        loss = (model.forward(pixels) * Tensor.from_data(exp["logits"])).mean()
        model = optimizer.step(1e-2, model, optim.GradientsParams.from_grads(loss.backward(), model))
    merged = model.materialize().valid()
    ours = merged.forward(pixels).numpy()
    assert np.abs(ours - exp["logits"]).max() > 1e-3  # the fine-tune changed the model
    out = save_pretrained(merged, tmp_path / "tuned")
    theirs_model = transformers.ViTForImageClassification.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = theirs_model(pixel_values=torch.from_numpy(exp["pixel_values"])).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)


def test_vit_base_builds_lazily_with_transformers_parameter_count():
    """transformers 5.24's ViTForImageClassification(ViTConfig(num_labels=1000)).num_parameters()
    is 86,567,656 (vit-base-patch16-224); Ember builds it without allocating its weights."""
    from engine.models.vit import build
    raw = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
           "num_labels": 1000}
    model = build(ViTConfig.from_json(raw))
    assert model.num_params() == 86_567_656
    assert model.config.image_size == (224, 224) and model.config.num_patches == 196
    assert not any(p.is_initialized() for _, p in model.named_params())
