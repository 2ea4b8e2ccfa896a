"""The committed Hugging Face oracle fixtures (tests/fixtures/hf/, issue 19) stay what they say they are.

Two kinds of checks:

* always run (numpy and the standard library only): each folder's files, tensor names, dtypes and
  shapes, the sharded index, the `.bin` pickle's globals, and expected.npz's keys and shapes — what
  the folder is meant to exercise (GQA 3:1, tied head, BF16, >= 3 shards, ...) is really in it;
* optional (skipped unless torch and transformers are importable): transformers reloads each
  committed folder and reproduces the committed expected.npz, so a fixture cannot drift silently.
  Ember's venv has no transformers; run these with the oracle venv, without the app's conftest
  (it needs PySide6):

      /tmp/torchvenv/bin/python -m pytest -q -p no:cacheprovider --noconftest \\
          tests/engine/models/test_oracle_live.py
"""
from __future__ import annotations

import json
import pickletools
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"

CAUSAL = ["llama-gqa", "llama-tied", "llama-bf16", "llama-sharded", "llama-bin", "llama3-rope",
          "mistral", "qwen2", "qwen2-tied", "gpt2"]
ALL = CAUSAL + ["bert", "vit"]
SAFETENSORS_DTYPES = {"F32": np.float32, "BF16": np.uint16}


def config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text(encoding="utf-8"))


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        assert n < 1 << 20, f"{path}: header length {n}"
        header = json.loads(fh.read(n))
        size = path.stat().st_size
    header.pop("__metadata__", None)
    for name, info in header.items():
        begin, end = info["data_offsets"]
        itemsize = np.dtype(SAFETENSORS_DTYPES[info["dtype"]]).itemsize
        assert end - begin == itemsize * int(np.prod(info["shape"])), (path, name)
        assert 8 + n + end <= size, (path, name)
    return header


def stored_tensors(name: str) -> dict[str, dict]:
    """{HF tensor name: {"dtype", "shape", "file"}} from the safetensors headers of one folder."""
    folder = HF / name
    index = folder / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists()
             else ["model.safetensors"])
    out = {}
    for file in files:
        for tensor, info in safetensors_header(folder / file).items():
            assert tensor not in out, (name, tensor)
            out[tensor] = {"dtype": info["dtype"], "shape": tuple(info["shape"]), "file": file}
    return out


def expected(name: str) -> dict[str, np.ndarray]:
    with np.load(HF / name / "expected.npz") as data:
        return {k: data[k] for k in data.files}


# ----------------------------------------------------------------------------- always run


def test_every_fixture_folder_is_there_and_small():
    total = sum(p.stat().st_size for p in HF.rglob("*") if p.is_file())
    assert total < 6 * 2**20, total  # 30-odd tiny families and variants (issue 47) in about 4.4 MB
    for name in ALL:
        assert (HF / name / "config.json").is_file(), name
        assert (HF / name / "expected.npz").is_file(), name


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_expected_arrays(name):
    e = expected(name)
    assert e["input_ids"].shape == (2, 7) and e["input_ids"].dtype == np.int64
    assert e["attention_mask"].tolist() == [[1] * 7, [1] * 5 + [0, 0]]
    vocab = config(name)["vocab_size"]
    assert e["logits"].shape == e["logits_nomask"].shape == (2, 7, vocab)
    assert e["logits"].dtype == np.float32
    assert np.isfinite(e["logits"]).all()
    # with right padding the mask changes only the padded queries, and there it must show
    np.testing.assert_allclose(e["logits"][:, :5], e["logits_nomask"][:, :5], atol=1e-5)
    assert np.abs(e["logits"][1, 5:] - e["logits_nomask"][1, 5:]).max() > 0.1
    assert "hidden_states_0" in e


@pytest.mark.parametrize("name", [n for n in ALL if n != "llama-bin"])
def test_stored_tensors_are_perturbed(name):
    """No tensor keeps transformers' trivial init (zero biases, unit norms)."""
    tensors = stored_tensors(name)
    for tensor, info in tensors.items():
        array = read_safetensor(HF / name / info["file"], tensor)
        assert array.std() > 0.02, (name, tensor)


def read_safetensor(path: Path, tensor: str) -> np.ndarray:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        info = json.loads(fh.read(n))[tensor]
        begin, end = info["data_offsets"]
        fh.seek(8 + n + begin)
        raw = np.frombuffer(fh.read(end - begin), dtype=SAFETENSORS_DTYPES[info["dtype"]])
    if info["dtype"] == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.reshape(info["shape"])


def test_llama_gqa_has_three_query_heads_per_kv_head():
    c = config("llama-gqa")
    assert c["num_attention_heads"] // c["num_key_value_heads"] == 3
    t = stored_tensors("llama-gqa")
    assert t["model.layers.0.self_attn.q_proj.weight"]["shape"] == (48, 48)
    assert t["model.layers.0.self_attn.k_proj.weight"]["shape"] == (16, 48)
    assert "lm_head.weight" in t and not c["tie_word_embeddings"]


@pytest.mark.parametrize("name, embedding", [("llama-tied", "model.embed_tokens.weight"),
                                             ("qwen2-tied", "model.embed_tokens.weight"),
                                             ("gpt2", "transformer.wte.weight")])
def test_tied_folders_have_no_head_tensor(name, embedding):
    assert config(name)["tie_word_embeddings"] is True
    t = stored_tensors(name)
    assert "lm_head.weight" not in t and embedding in t


def test_bf16_folder_is_all_bf16():
    assert config("llama-bf16")["dtype"] == "bfloat16"
    assert {i["dtype"] for i in stored_tensors("llama-bf16").values()} == {"BF16"}


def test_sharded_folder_has_an_index_and_at_least_three_shards():
    index = json.loads((HF / "llama-sharded" / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 3
    assert not (HF / "llama-sharded" / "model.safetensors").exists()
    t = stored_tensors("llama-sharded")
    assert {k: v["file"] for k, v in t.items()} == index["weight_map"]


def test_bin_folder_pickle_uses_only_state_dict_globals():
    path = HF / "llama-bin" / "pytorch_model.bin"
    assert not (HF / "llama-bin" / "model.safetensors").exists()
    with zipfile.ZipFile(path) as z:
        (pkl,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        data = z.read(pkl)
    found = {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert found == {"collections OrderedDict", "torch._utils _rebuild_tensor_v2", "torch FloatStorage"}
    assert not any(op.name == "STACK_GLOBAL" for op, _, _ in pickletools.genops(data))


def test_llama3_rope_parameters_where_transformers_5_writes_them():
    c = config("llama3-rope")
    assert "rope_theta" not in c
    assert c["rope_parameters"] == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16}


def test_qwen2_has_qkv_biases_and_no_o_bias():
    t = stored_tensors("qwen2")
    for p in ("q", "k", "v"):
        assert f"model.layers.0.self_attn.{p}_proj.bias" in t
    assert "model.layers.0.self_attn.o_proj.bias" not in t


def test_encoder_expected_arrays():
    b = expected("bert")
    assert b["last_hidden_state"].shape == (2, 7, 32) and b["pooler_output"].shape == (2, 32)
    assert b["attention_mask"].tolist() == [[1] * 7, [1] * 5 + [0, 0]]
    assert set(np.unique(b["token_type_ids"]).tolist()) == {0, 1}
    v = expected("vit")
    assert v["pixel_values"].shape == (2, 3, 16, 16) and v["logits"].shape == (2, 5)


# ----------------------------------------------------------------------------- optional: transformers


def transformers_model(name: str, attn: str = "eager"):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    (arch,) = config(name)["architectures"]
    cls = getattr(transformers, arch)
    model, info = cls.from_pretrained(HF / name, dtype=torch.float32, attn_implementation=attn,
                                      output_loading_info=True)
    # every stored tensor was used and nothing was left at random init
    assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
    assert not info.get("mismatched_keys"), (name, info)
    return torch, model.eval()


def run(torch, model, arrays: dict, keys: list[str], **extra):
    with torch.no_grad():
        return model(**{k: torch.from_numpy(arrays[k]) for k in keys}, **extra)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", CAUSAL)
def test_transformers_reproduces_causal_fixture(name, attn):
    torch, model = transformers_model(name, attn)
    e = expected(name)
    out = run(torch, model, e, ["input_ids", "attention_mask"], output_hidden_states=True)
    np.testing.assert_allclose(out.logits.numpy(), e["logits"], atol=2e-5, rtol=0)
    for i, h in enumerate(out.hidden_states):
        np.testing.assert_allclose(h.numpy(), e[f"hidden_states_{i}"], atol=2e-5, rtol=0)
    nomask = run(torch, model, e, ["input_ids"])
    np.testing.assert_allclose(nomask.logits.numpy(), e["logits_nomask"], atol=2e-5, rtol=0)
    if config(name)["tie_word_embeddings"]:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_transformers_reproduces_bert_fixture(attn):
    torch, model = transformers_model("bert", attn)
    e = expected("bert")
    out = run(torch, model, e, ["input_ids", "token_type_ids", "attention_mask"], output_hidden_states=True)
    np.testing.assert_allclose(out.last_hidden_state.numpy(), e["last_hidden_state"], atol=2e-5, rtol=0)
    np.testing.assert_allclose(out.pooler_output.numpy(), e["pooler_output"], atol=2e-5, rtol=0)
    for i, h in enumerate(out.hidden_states):
        np.testing.assert_allclose(h.numpy(), e[f"hidden_states_{i}"], atol=2e-5, rtol=0)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_transformers_reproduces_vit_fixture(attn):
    torch, model = transformers_model("vit", attn)
    e = expected("vit")
    out = run(torch, model, e, ["pixel_values"], output_hidden_states=True)
    np.testing.assert_allclose(out.logits.numpy(), e["logits"], atol=2e-5, rtol=0)
    for i, h in enumerate(out.hidden_states):
        np.testing.assert_allclose(h.numpy(), e[f"hidden_states_{i}"], atol=2e-5, rtol=0)


def test_bf16_expected_is_the_bf16_file_widened():
    """llama-bf16's expected outputs are transformers' from the bf16 weights widened to float32:
    loading the folder in bfloat16 and widening every parameter gives the float32-loaded model."""
    torch, model32 = transformers_model("llama-bf16")
    transformers = pytest.importorskip("transformers")
    model16 = transformers.LlamaForCausalLM.from_pretrained(HF / "llama-bf16", dtype=torch.bfloat16)
    p16 = dict(model16.named_parameters())
    for key, p in model32.named_parameters():
        assert torch.equal(p16[key].to(torch.float32), p), key


def test_transformers_reads_the_tokenizer():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = HF / "llama-gqa"
    cases = json.loads((folder / "tokenizer_expected.json").read_text(encoding="utf-8"))
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tok) == cases["vocab_size"] == config("llama-gqa")["vocab_size"]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    for case in cases["single"]:
        ids = tok(case["text"])["input_ids"]
        assert ids == case["input_ids"], case["text"]
        assert tok.convert_ids_to_tokens(ids) == case["tokens"]
        assert tok.decode(ids, skip_special_tokens=True) == case["decoded"]
    batch = tok(cases["batch_padded"]["texts"], padding=True)
    assert batch["input_ids"] == cases["batch_padded"]["input_ids"]
    assert batch["attention_mask"] == cases["batch_padded"]["attention_mask"]
