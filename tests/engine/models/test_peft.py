"""PEFT adapters both ways (issue 20, must-show 2): `load_peft_adapter` / `save_peft_adapter`.

Always run: every committed peft-written adapter of tests/fixtures/peft/ (peft 0.21.2, made by
make_peft_fixtures.py: LoRA on q/v, rsLoRA on all-linear with rank/alpha patterns, DoRA, an embedding
LoRA with a regex target, GPT-2's fused c_attn; every factor non-zero) opens in Ember on its base
folder with peft's logits; saving writes back the same tensors; target selection follows peft's
rules; bad adapters are clear errors and leave the model unchanged.

Optional (skipped without torch + transformers + peft): an Ember-trained LoRA, rsLoRA and DoRA
adapter saved by `save_peft_adapter` loads in `PeftModel.from_pretrained` with Ember's logits.
Run them with the oracle venv, without the app's conftest:

    PYTHONPATH=. /tmp/torchvenv/bin/python -m pytest -q -p no:cacheprovider --noconftest \\
        tests/engine/models/test_peft.py
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine import Device, Tensor, nn, optim
from engine.models import PretrainedError, from_pretrained, load_peft_adapter, save_peft_adapter
from engine.models.peft import peft_lora, target_group
from engine.module import Module, ParamGroup
from engine.module.lora import DoraAdapter, Lora, LoraAdapter, RsLoraAdapter
from engine.module.reparam import iter_param_slots
from engine.store import filesource

from tests.limits import capped_memory

FIX = Path(__file__).resolve().parents[2] / "fixtures"
HF, PEFT = FIX / "hf", FIX / "peft"
ATOL = 1e-4
# adapter folder: (base folder, adapter class, number of Ember weights adapted)
ADAPTERS = {
    "llama-lora-qv": ("llama-gqa", LoraAdapter, 4),
    "llama-rslora-all-linear": ("llama-gqa", RsLoraAdapter, 14),
    "llama-dora": ("llama-gqa", DoraAdapter, 10),
    "llama-embed-regex": ("llama-gqa", LoraAdapter, 3),
    "gpt2-lora-c_attn": ("gpt2", LoraAdapter, 8),  # 2 x (query, key, value from c_attn; c_fc)
}


def _adapters(model):
    return {path: p.reparameterization for path, p in iter_param_slots(model) if p.reparameterization is not None}


def _logits(model, exp):
    model = model.valid()
    return model.forward(Tensor.from_data(exp["input_ids"]), Tensor.from_data(exp["attention_mask"])).numpy()


def _header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        head = json.loads(fh.read(n))
    head.pop("__metadata__", None)
    return head


def _tensors(path: Path) -> dict:
    head = _header(path)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    out = {}
    for name, d in head.items():
        assert d["dtype"] == "F32"
        b, e = d["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b: 8 + n + e], dtype="<f4").reshape(d["shape"])
    return out


# ---------------------------------------------------------------------------------- peft -> Ember
@pytest.mark.parametrize("name", list(ADAPTERS))
def test_peft_written_adapter_gives_peft_logits(name):
    base_name, cls, count = ADAPTERS[name]
    base = from_pretrained(HF / base_name)
    tuned = load_peft_adapter(base, PEFT / name)
    exp = np.load(PEFT / name / "expected.npz")
    got = _logits(tuned, exp)
    assert got.shape == exp["logits"].shape
    np.testing.assert_allclose(got, exp["logits"], rtol=0, atol=ATOL)
    # the adapter really matters, and the base model is unchanged
    assert np.abs(exp["logits"] - np.load(HF / base_name / "expected.npz")["logits"]).max() > 1.0
    assert not _adapters(base)
    ads = _adapters(tuned)
    assert len(ads) == count and all(type(r) is cls for r in ads.values())
    # LoRA's freezing: only the factors (and DoRA's magnitudes) train
    trainable = {p for p, q in tuned.named_params() if q.is_require_grad()}
    assert trainable and all(".lora." in p for p in trainable)


def test_rotary_permutation_of_q_and_k_factors_comes_from_the_weight_map():
    """A q_proj / k_proj B factor loaded without the rows' rotary permutation gives other logits."""
    tuned = load_peft_adapter(from_pretrained(HF / "llama-gqa"), PEFT / "llama-dora")
    stored = _tensors(PEFT / "llama-dora" / "adapter_model.safetensors")
    b_hf = stored["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]  # [16, 4]: 2 kv heads of 8
    b = _adapters(tuned)["layers.0.self_attn.key.weight"].b.val().numpy()  # [4, 16]
    expected = b_hf.reshape(2, 2, 4, 4).swapaxes(1, 2).reshape(16, 4).T  # halves -> interleaved pairs per head
    np.testing.assert_array_equal(b, expected)
    assert not np.array_equal(b, b_hf.T)
    m_hf = stored["base_model.model.model.layers.0.self_attn.k_proj.lora_magnitude_vector"]
    m = _adapters(tuned)["layers.0.self_attn.key.weight"].magnitude.val().numpy()
    np.testing.assert_array_equal(m, m_hf.reshape(2, 2, 4).swapaxes(1, 2).reshape(16))


def test_gpt2_fused_c_attn_lora_becomes_query_key_value_loras_with_one_a():
    tuned = load_peft_adapter(from_pretrained(HF / "gpt2"), PEFT / "gpt2-lora-c_attn")
    ads = _adapters(tuned)
    q, k, v = (ads[f"h.0.attn.{n}.weight"] for n in ("query", "key", "value"))
    np.testing.assert_array_equal(q.a.val().numpy(), k.a.val().numpy())
    stored = _tensors(PEFT / "gpt2-lora-c_attn" / "adapter_model.safetensors")
    b_hf = stored["base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"]  # [96, 4]
    np.testing.assert_array_equal(k.b.val().numpy(), b_hf[32:64].T)
    assert q.scale == k.scale == v.scale == 2.0


# ---------------------------------------------------------------------------------- Ember -> files
@pytest.mark.parametrize("name", list(ADAPTERS))
def test_saving_a_loaded_adapter_writes_back_peft_tensors(name, tmp_path):
    base_name = ADAPTERS[name][0]
    tuned = load_peft_adapter(from_pretrained(HF / base_name), PEFT / name)
    save_peft_adapter(tuned, tmp_path / "out")
    mine = _tensors(tmp_path / "out" / "adapter_model.safetensors")
    theirs = _tensors(PEFT / name / "adapter_model.safetensors")
    # peft also saves an embedding LoRA's base weight (unchanged here); Ember writes the adapter only
    theirs = {n: a for n, a in theirs.items() if not n.endswith(".base_layer.weight")}
    assert sorted(mine) == sorted(theirs)
    for n in theirs:
        np.testing.assert_array_equal(mine[n], theirs[n], err_msg=n)  # transposes and permutations are exact
    cfg, ref = (json.loads((f / "adapter_config.json").read_text()) for f in (tmp_path / "out", PEFT / name))
    assert cfg["peft_type"] == "LORA" and cfg["use_rslora"] == ref["use_rslora"] and cfg["use_dora"] == ref["use_dora"]
    # a causal LM's adapter says so (PeftModel.from_pretrained makes a PeftModelForCausalLM); every key is one of
    # the LoraConfig fields peft itself wrote, so peft's LoraConfig(**cfg) takes it
    assert cfg["task_type"] == "CAUSAL_LM" and set(cfg) <= set(ref)
    again = load_peft_adapter(from_pretrained(HF / base_name), tmp_path / "out")
    exp = np.load(PEFT / name / "expected.npz")
    np.testing.assert_allclose(_logits(again, exp), exp["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("name, targets, task_type", [("bert", ["query", "value"], "FEATURE_EXTRACTION"),
                                                      ("vit", ["query", "value"], None)])
def test_an_encoders_adapter_gets_the_peft_task_type_that_fits_or_none(name, targets, task_type, tmp_path):
    """A bare BertModel is peft's FEATURE_EXTRACTION; a ViT image classifier fits no peft task type."""
    model = from_pretrained(HF / name)
    save_peft_adapter(model.apply_reparameterization(peft_lora(model, 2, 4.0, targets)), tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["task_type"] == task_type
    assert set(cfg) <= set(json.loads((PEFT / "llama-lora-qv" / "adapter_config.json").read_text()))


def _trained(model, lora, steps=3, seed=0):
    """`model` with `lora` attached and trained a few Adam steps on a toy objective (all factors non-zero)."""
    Device("cpu").seed(seed)
    tuned = model.apply_reparameterization(lora).valid().train()
    exp = np.load(HF / "llama-gqa" / "expected.npz")
    ids = Tensor.from_data(exp["input_ids"])
    target = Tensor.from_data(np.random.default_rng(seed).standard_normal((2, 7, 128)).astype(np.float32))
    opt = optim.AdamConfig().init()
    for _ in range(steps):
        d = tuned.forward(ids) - target
        loss = (d * d).mean()
        tuned = opt.step(0.05, tuned, optim.GradientsParams.from_grads(loss.backward(), tuned))
    return tuned


def test_gpt2_query_key_value_loras_that_differ_save_as_one_exact_block_diagonal_c_attn_lora(tmp_path):
    model = from_pretrained(HF / "gpt2")
    tuned = _trained(model, peft_lora(model, 2, 3.0, ["c_attn"], rank_pattern={"c_attn": 2}))
    save_peft_adapter(tuned, tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    stored = _tensors(tmp_path / "a" / "adapter_model.safetensors")
    assert stored["base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"].shape == (6, 32)
    assert cfg["r"] == 6 and cfg["target_modules"] == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    again = load_peft_adapter(from_pretrained(HF / "gpt2"), tmp_path / "a")
    exp = np.load(HF / "gpt2" / "expected.npz")
    np.testing.assert_allclose(_logits(again, exp), _logits(tuned, exp), rtol=0, atol=1e-5)


def test_a_qlora_adapter_saves_its_factors_for_the_plain_base(tmp_path):
    from engine.module.lora import QLora

    model = from_pretrained(HF / "llama-gqa")
    q = _trained(model, QLora(peft_lora(model, 4, 8.0, ["q_proj", "v_proj"]), block_size=16))
    save_peft_adapter(q, tmp_path / "q")
    again = load_peft_adapter(from_pretrained(HF / "llama-gqa"), tmp_path / "q")
    for path, r in _adapters(q).items():
        mine = _adapters(again)[path]
        np.testing.assert_array_equal(mine.a.val().numpy(), r.a.val().numpy())
        np.testing.assert_array_equal(mine.b.val().numpy(), r.b.val().numpy())
        assert mine.scale == r.scale


# ---------------------------------------------------------------------------------- targets
def test_target_modules_follow_peft_rules():
    model = from_pretrained(HF / "llama-gqa")

    def paths(targets, exclude=None):
        group = target_group(model, targets, exclude)
        return sorted(p for p, q in model.named_params() if group.matches(q.id, p))

    assert paths(["q_proj", "v_proj"]) == ["layers.0.self_attn.query.weight", "layers.0.self_attn.value.weight",
                                           "layers.1.self_attn.query.weight", "layers.1.self_attn.value.weight"]
    assert paths(["self_attn.q_proj"]) == ["layers.0.self_attn.query.weight", "layers.1.self_attn.query.weight"]
    assert paths(["model.layers.1.mlp.up_proj"]) == ["layers.1.mlp.up_proj.weight"]
    assert paths(r".*\.1\.self_attn\.(k|v)_proj") == ["layers.1.self_attn.key.weight",
                                                      "layers.1.self_attn.value.weight"]
    all_linear = paths("all-linear")
    assert len(all_linear) == 14 and "lm_head.weight" not in all_linear and "embed_tokens.weight" not in all_linear
    assert len(paths("all-linear", ["down_proj"])) == 12
    with pytest.raises(ValueError, match="match no Linear or Embedding module"):
        target_group(model, ["proj"])  # a suffix must follow a dot, as in peft
    # rank_pattern keys match Hugging Face names for a pretrained model
    lora = peft_lora(model, 4, 8, ["q_proj", "o_proj"], rank_pattern={"o_proj": 2}, use_rslora=True)
    tuned = model.apply_lora(lora)
    ads = _adapters(tuned)
    assert ads["layers.0.self_attn.output.weight"].a.shape == (48, 2)
    assert ads["layers.0.self_attn.query.weight"].a.shape == (48, 4)
    assert ads["layers.0.self_attn.output.weight"].scale == pytest.approx(8 / 2 ** 0.5)


class Tiny(Module):
    def __init__(self):
        self.embed = nn.EmbeddingConfig(10, 4).init()
        self.proj = nn.LinearConfig(d_input=4, d_output=6).init()
        self.head = nn.LinearConfig(d_input=6, d_output=3).init()

    def forward(self, ids):
        return self.head.forward(self.proj.forward(self.embed.forward(ids)))


def test_other_models_use_ember_module_paths(tmp_path):
    Device("cpu").seed(1)
    m = Tiny()
    group = target_group(m, ["proj", "embed"])
    assert sorted(p for p, q in m.named_params() if group.matches(q.id, p)) == ["embed.weight", "proj.weight"]
    tuned = _noise_free_train(m)
    save_peft_adapter(tuned, tmp_path / "t")
    names = sorted(_tensors(tmp_path / "t" / "adapter_model.safetensors"))
    assert names == ["base_model.model.embed.lora_embedding_A", "base_model.model.embed.lora_embedding_B",
                     "base_model.model.proj.lora_A.weight", "base_model.model.proj.lora_B.weight"]
    again = load_peft_adapter(Tiny().load_record(m.into_record()), tmp_path / "t")
    ids = Tensor.from_data(np.array([[1, 2, 9]]))
    np.testing.assert_allclose(again.forward(ids).numpy(), tuned.forward(ids).numpy(), rtol=1e-6, atol=1e-6)


def _noise_free_train(m):
    tuned = m.apply_lora(Lora(2, 4.0, param_group=target_group(m, ["proj", "embed"])))
    ids = Tensor.from_data(np.array([[1, 2, 9]]))
    opt = optim.AdamConfig().init()
    for _ in range(3):
        loss = (tuned.forward(ids) - 1.0).square().mean()
        tuned = opt.step(0.05, tuned, optim.GradientsParams.from_grads(loss.backward(), tuned))
    return tuned


# ---------------------------------------------------------------------------------- bad input
def _copy(name, tmp_path) -> Path:
    out = tmp_path / name
    shutil.copytree(PEFT / name, out)
    return out


def _edit_config(folder: Path, **changes):
    path = folder / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_an_adapter_for_another_base_names_the_file_and_the_tensor():
    gpt2 = from_pretrained(HF / "gpt2")
    with pytest.raises(PretrainedError) as e:
        load_peft_adapter(gpt2, PEFT / "llama-lora-qv")
    msg = str(e.value)
    assert "adapter_model.safetensors" in msg and "has no Linear or Embedding module 'model.layers." in msg
    qwen = from_pretrained(HF / "qwen2")  # same module names, other sizes
    with pytest.raises(PretrainedError, match=r"lora_A.weight' has dims \[4, 48\].*needs \[4, 32\]"):
        load_peft_adapter(qwen, PEFT / "llama-lora-qv")
    assert not _adapters(gpt2) and not _adapters(qwen)


def test_unsupported_peft_type_and_options_are_refused(tmp_path):
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    _edit_config(folder, peft_type="IA3")
    with pytest.raises(PretrainedError, match=r"adapter_config.json: unsupported peft_type 'IA3': expected 'LORA'"):
        load_peft_adapter(model, folder)
    _edit_config(folder, peft_type="LORA", bias="some")
    with pytest.raises(PretrainedError, match=r"'bias' must be one of none, lora_only, all, found 'some'"):
        load_peft_adapter(model, folder)
    _edit_config(folder, bias="none", modules_to_save=["lm_head"])
    with pytest.raises(PretrainedError, match=r"tensor 'base_model.model.lm_head.weight' is missing: "
                                              r"adapter_config.json's modules_to_save \['lm_head'\] needs it"):
        load_peft_adapter(model, folder)
    _edit_config(folder, modules_to_save=["wte"])
    with pytest.raises(PretrainedError, match=r"modules_to_save entry 'wte' matches no module of this LlamaForCausalLM"):
        load_peft_adapter(model, folder)
    _edit_config(folder, modules_to_save=["q_proj"])
    with pytest.raises(PretrainedError, match=r"'model.layers.0.self_attn.q_proj' is both a LoRA target and in "
                                              r"modules_to_save"):
        load_peft_adapter(model, folder)
    _edit_config(folder, modules_to_save=None, target_modules=r"(.|\.|[a-z_.0-9])*\d\d\d")
    with pytest.raises(PretrainedError, match=r"adapter_config.json: the regex .* took longer than"):
        load_peft_adapter(model, folder)
    _edit_config(folder, target_modules=["q_proj", "v_proj"], rank_pattern={r"(.|\.|[a-z_.0-9])*\d\d\d": 2})
    with pytest.raises(PretrainedError, match=r"adapter_config.json: rank_pattern / alpha_pattern: pattern"):
        load_peft_adapter(model, folder)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(PretrainedError, match="adapter_config.json: not a readable JSON file"):
        load_peft_adapter(model, folder)
    assert not _adapters(model)


def test_tensors_that_do_not_fit_the_config_are_refused(tmp_path):
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    _edit_config(folder, r=8)
    with pytest.raises(PretrainedError, match=r"q_proj.lora_A.weight' has dims \[4, 48\].*r = 8 needs \[8, 48\]"):
        load_peft_adapter(model, folder)
    _edit_config(folder, r=4, target_modules=["q_proj", "v_proj", "k_proj"])
    with pytest.raises(PretrainedError, match=r"no tensors for, e.g. 'model.layers.0.self_attn.k_proj'"):
        load_peft_adapter(model, folder)
    _edit_config(folder, target_modules=["q_proj"])
    with pytest.raises(PretrainedError, match=r"v_proj.lora_A.weight': module .* is not among .*target_modules"):
        load_peft_adapter(model, folder)
    _edit_config(folder, target_modules=["q_proj", "v_proj"], use_dora=True)
    with pytest.raises(PretrainedError, match=r"lora_magnitude_vector' is missing: the config has use_dora"):
        load_peft_adapter(model, folder)
    with pytest.raises(PretrainedError, match="no adapter_config.json"):
        load_peft_adapter(model, HF / "llama-gqa")
    (folder / "adapter_model.safetensors").write_bytes(b"\x08\x00")
    _edit_config(folder, use_dora=False)
    with pytest.raises(PretrainedError, match="adapter_model.safetensors"):
        load_peft_adapter(model, folder)
    assert not _adapters(model)


def test_an_embedding_lora_on_a_tied_head_is_refused_both_ways(tmp_path):
    """peft adapts only the input embedding; Ember's tied head reads the same (adapted) weight."""
    tied = from_pretrained(HF / "llama-tied")
    with pytest.raises(PretrainedError, match=r"lora_embedding_A': an embedding LoRA on a model whose output head is "
                                              r"tied to 'model.embed_tokens'"):
        load_peft_adapter(tied, PEFT / "llama-embed-regex")
    gpt2 = from_pretrained(HF / "gpt2")
    tuned = gpt2.apply_lora(Lora(2, 4.0, param_group=target_group(gpt2, ["wte", "c_fc"])))
    with pytest.raises(PretrainedError, match="'wte.weight' carries a LoRA, but this GPT2LMHeadModel's output head"):
        save_peft_adapter(tuned, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_saving_without_adapters_or_with_mixed_variants_is_refused(tmp_path):
    model = from_pretrained(HF / "llama-gqa")
    with pytest.raises(PretrainedError, match="no LoRA adapters to save"):
        save_peft_adapter(model, tmp_path / "x")
    dora = model.apply_lora(Lora(2, 4.0, use_dora=True, param_group=target_group(model, ["q_proj"])))
    mixed = dora.apply_lora(Lora(2, 4.0, param_group=target_group(model, ["v_proj"])))
    with pytest.raises(PretrainedError, match="some adapters are DoRA and some are not"):
        save_peft_adapter(mixed, tmp_path / "x")


# ---------------------------------------------------------------------------------- Ember -> peft (optional)
VARIANTS = {
    "lora": ("llama-gqa", dict(target_modules=["q_proj", "v_proj"])),
    "rslora": ("llama-gqa", dict(target_modules="all-linear", use_rslora=True, rank_pattern={"o_proj": 2},
                                 alpha_pattern={"down_proj": 3.0})),
    "dora": ("llama-gqa", dict(target_modules=["embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj"],
                               use_dora=True)),
    # Ember's query / key / value LoRAs differ after training: one block-diagonal c_attn LoRA of rank 12
    "gpt2-dora-c_attn": ("gpt2", dict(target_modules=["c_attn", "c_proj"], use_dora=True)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ember_trained_adapter_loads_in_peft_with_the_same_logits(variant, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    base_name, kwargs = VARIANTS[variant]
    model = from_pretrained(HF / base_name)
    tuned = _trained(model, peft_lora(model, 4, 8.0, **kwargs))
    save_peft_adapter(tuned, tmp_path / variant)
    exp = np.load(HF / base_name / "expected.npz")
    ours = _logits(tuned, exp)
    base = transformers.AutoModelForCausalLM.from_pretrained(HF / base_name, dtype=torch.float32,
                                                             attn_implementation="eager")
    theirs_model = peft.PeftModel.from_pretrained(base, tmp_path / variant).eval()
    with torch.no_grad():
        theirs = theirs_model(input_ids=torch.from_numpy(exp["input_ids"]).long(),
                              attention_mask=torch.from_numpy(exp["attention_mask"]).long()).logits.numpy()
    err = np.abs(ours - theirs).max()
    print(f"{variant}: max |Ember - peft| = {err:.2e}, |tuned - base| = {np.abs(ours - exp['logits']).max():.3f}")
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    assert np.abs(ours - exp["logits"]).max() > 0.05  # the trained adapter changed the model


# ---------------------------------------------------------------------------------- hostile adapters
@pytest.mark.parametrize("text, match", [
    ("NaN", r"not a readable JSON file: not valid JSON: NaN is not valid JSON"),
    ("Infinity", r"not valid JSON: Infinity is not valid JSON"),
    ("-Infinity", r"not valid JSON: -Infinity is not valid JSON"),
    ("1e400", r"'lora_alpha': a finite number of magnitude at most 1048576 expected, found inf"),
    ("1e308", r"'lora_alpha': a finite number of magnitude at most 1048576 expected, found 1e\+308"),
    ('"16"', r"'lora_alpha': a number expected, found '16'"),
])
def test_a_lora_alpha_that_would_make_every_logit_nan_is_refused(tmp_path, text, match):
    """lora_alpha NaN, +-Infinity or 1e308 loaded, and every logit became NaN."""
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    path = folder / "adapter_config.json"
    path.write_text(path.read_text().replace('"lora_alpha": 8', f'"lora_alpha": {text}'))
    assert f'"lora_alpha": {text}' in path.read_text()
    with pytest.raises(PretrainedError, match=match) as err:
        load_peft_adapter(model, folder)
    assert err.value.where == str(path)


@pytest.mark.parametrize("changes, match", [
    ({"rank_pattern": {"q_proj": "1e400"}}, r"'rank_pattern' \['q_proj'\]: a positive integer expected, found inf"),
    ({"rank_pattern": {"q_proj": 2.5}}, r"'rank_pattern' \['q_proj'\]: a positive integer expected, found 2.5"),
    ({"rank_pattern": {"q_proj": 2 ** 40}}, r"'rank_pattern' \['q_proj'\]: a positive integer of at most 1048576"),
    ({"alpha_pattern": {"q_proj": "-1e400"}}, r"'alpha_pattern' \['q_proj'\]: a finite number.*found -inf"),
    ({"r": 10 ** 400}, r"'r' must be a positive integer of at most 1048576, found 1000"),
    ({"use_rslora": "false"}, r"'use_rslora' must be true or false, found 'false'"),
    ({"exclude_modules": 5}, r"exclude_modules must be a list of module names or a regex, found 5"),
    ({"rank_pattern": {"q_proj{99999999999}": 2}}, r"rank_pattern / alpha_pattern: "),
])
def test_ranks_and_patterns_that_do_not_fit_are_refused(tmp_path, changes, match):
    """rank_pattern Infinity gave OverflowError (int(inf)); 'false' turned rsLoRA's scale on."""
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    _edit_config(folder, **changes)
    path = folder / "adapter_config.json"
    path.write_text(path.read_text().replace('"1e400"', "1e400").replace('"-1e400"', "-1e400"))  # JSON reads +-infinity
    with pytest.raises(PretrainedError, match=match):
        load_peft_adapter(model, folder)
    assert not _adapters(model)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_a_deeply_nested_adapter_config_is_refused(tmp_path, depth):
    """100,000 levels gave RecursionError; 100 parsed."""
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    path = folder / "adapter_config.json"
    path.write_text(path.read_text().rstrip()[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(PretrainedError, match=r"adapter_config.json: not a readable JSON file: "
                                              r"nested deeper than 64 levels"):
        load_peft_adapter(model, folder)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf_in_an_adapter_tensor_is_refused_naming_it(tmp_path, value):
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    path = folder / "adapter_model.safetensors"
    head, blob = _header(path), bytearray(path.read_bytes())
    name = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    (n,) = struct.unpack_from("<Q", blob)
    start = 8 + n + head[name]["data_offsets"][0]
    struct.pack_into("<f", blob, start + 4 * 7, value)
    path.write_bytes(bytes(blob))
    with pytest.raises(PretrainedError, match=rf"tensor '{name}' holds 1 NaN or infinite value\(s\) \(the first at "
                                              rf"index \[1, 3\]: -?(nan|inf)\)") as err:
        load_peft_adapter(model, folder)
    assert err.value.where == str(path)
    assert not _adapters(model)


def test_a_weights_file_followed_by_a_sparse_hole_is_refused_reading_only_its_header(tmp_path, monkeypatch):
    """A 3 GiB hole after the tensors loaded after 8.9 s and 3.1 GB (the whole file was read);
    the header and the file's size refuse it now, in bounded memory."""
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    path = folder / "adapter_model.safetensors"
    size = path.stat().st_size
    read = []
    real = filesource.FileSource._fill
    monkeypatch.setattr(filesource.FileSource, "_fill", lambda self, view, offset: (
        self.where == str(path) and read.append(len(view))) or real(self, view, offset))
    loaded = load_peft_adapter(model, folder)
    assert len(_adapters(loaded)) == 4
    assert sum(read) <= size + 16  # each tensor once, the header (and its first 16 bytes)
    read.clear()
    with open(path, "r+b") as f:
        f.truncate(size + 3 * 2 ** 30)
    with capped_memory(), pytest.raises(PretrainedError, match=rf"{3 * 2 ** 30} bytes after the last tensor's data"):
        load_peft_adapter(model, folder)
    assert sum(read) < 2 * (size - 4 * sum(np.prod(d["shape"]) for d in _header(path).values()))  # the header


def test_factors_whose_update_leaves_float32_are_refused(tmp_path):
    """Finite values can still make the adapted weight infinite: 3e38 in one A entry made every
    logit NaN. The update's bound r * max|A| * max|B| * scale must stay within float32."""
    model = from_pretrained(HF / "llama-gqa")
    folder = _copy("llama-lora-qv", tmp_path)
    path = folder / "adapter_model.safetensors"
    head, blob = _header(path), bytearray(path.read_bytes())
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    (n,) = struct.unpack_from("<Q", blob)
    struct.pack_into("<f", blob, 8 + n + head[name]["data_offsets"][0], 3e38)
    path.write_bytes(bytes(blob))
    with pytest.raises(PretrainedError, match=rf"tensors '{name}' and '.*q_proj.lora_B.weight': the update 2 \* B @ A "
                                              r"can reach .*, beyond float32's range"):
        load_peft_adapter(model, folder)
