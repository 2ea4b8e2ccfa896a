"""GGUF for the families of issue 47 (Qwen3, Phi-3, Gemma 1-3, Mixtral, Qwen2-MoE, Qwen3-MoE): each
committed Hugging Face fixture (tests/fixtures/hf) exported by Ember as GGUF, read back by Ember, read
by the `gguf` package, and run by llama.cpp.

The files carry a synthetic vocabulary (`tokenizer.ggml.model` "gpt2", one token per id of the
fixture's vocabulary, one merge): the ids are evaluated as they are, so no tokenizer plays a part.
Where llama.cpp computes something a fixture's config says otherwise, the test model is the fixture
with that key changed (Gemma 2 / 3's `query_pre_attn_scalar` set to their head_dim, which is what
llama.cpp scales by) or, for the Qwen mixtures whose fixtures have a dense layer (`mlp_only_layers`),
with that layer made sparse (experts copied from layer 0 in reverse order); the export of the
fixtures as they are is refused, naming the key (tested below).

llama.cpp is the oracle venv's llama-cpp-python ($EMBER_ORACLE_PYTHON, default
/work/oracle-venv/bin/python) in a subprocess (`llama_cpp_logits.py`, an F32 key/value cache);
those tests are skipped, saying so, without it.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from engine.models import from_pretrained  # noqa: E402
from engine.models.generate import generate  # noqa: E402
from engine.models.gguf_export import save_gguf  # noqa: E402
from engine.models.gguf_lora import save_gguf_lora  # noqa: E402
from engine.models.gguf_model import gguf_storage, gguf_weight_map  # noqa: E402
from engine.models.gguf_weight import GGUFWeight  # noqa: E402
from engine.models.hf_folder import PretrainedError  # noqa: E402
from engine.module import Lora, Param, ParamGroup  # noqa: E402
from engine.module.reparam import adapters_of, iter_param_slots  # noqa: E402
from engine.store.gguf_file import open_gguf  # noqa: E402
from engine.tensor import Tensor  # noqa: E402
from tests.engine.models.test_gguf_export import ORACLE, needs_llama_cpp  # noqa: E402

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
ORACLE_SCRIPT = Path(__file__).resolve().parent / "llama_cpp_logits.py"
IDS = [1, 5, 9, 40, 77, 3, 100, 17, 64, 2]  # longer than the Gemma fixtures' window of 4
GREEDY = 8

# family -> (fixture, config keys changed, dense layers made sparse, llama.cpp's architecture)
CASES = {
    "qwen3": ("qwen3", {}, False, "qwen3"),
    "phi3": ("phi3", {}, False, "phi3"),
    "gemma": ("gemma", {}, False, "gemma"),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 8}, False, "gemma2"),
    "gemma3": ("gemma3", {"query_pre_attn_scalar": 8}, False, "gemma3"),
    "mixtral": ("mixtral", {}, False, "llama"),
    "qwen2moe": ("qwen2-moe", {}, True, "qwen2moe"),
    "qwen3moe": ("qwen3-moe", {}, True, "qwen3moe"),
}
GEMMA = ("gemma", "gemma2", "gemma3")


def _llama_cpp(path: Path, count: int = GREEDY, adapter: Path | None = None, ids=IDS) -> tuple[np.ndarray, list[int]]:
    args = [str(ORACLE), str(ORACLE_SCRIPT), str(path), json.dumps(list(ids)), str(count)]
    run = subprocess.run(args + ([str(adapter)] if adapter is not None else []), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    return np.array(out["logits"]), out["ids"]


def _tokenizer(vocab: int) -> dict:
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(vocab)],
            "tokenizer.ggml.token_type": [1] * vocab, "tokenizer.ggml.merges": ["< t"]}


def _all_sparse(src: Path, dst: Path) -> None:
    """The fixture with its dense layers (`mlp_only_layers`) made sparse: layer 0's router, shared
    expert and experts copied (the experts in reverse order, the router's rows reversed)."""
    cfg = json.loads((src / "config.json").read_text())
    tensors = safetensors_numpy.load_file(src / "model.safetensors")
    n = cfg.get("num_experts") or cfg.get("num_local_experts")
    for i in cfg["mlp_only_layers"]:
        for k in [k for k in tensors if k.startswith(f"model.layers.{i}.mlp.")]:
            del tensors[k]
        for k in [k for k in list(tensors) if k.startswith("model.layers.0.mlp.")]:
            new = k.replace("model.layers.0.", f"model.layers.{i}.")
            for e in range(n):
                new = new.replace(f".experts.{e}.", f".experts.#{n - 1 - e}.")
            tensors[new.replace("#", "")] = tensors[k][::-1].copy() if k.endswith("mlp.gate.weight") else tensors[k]
    cfg["mlp_only_layers"] = []
    safetensors_numpy.save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """family -> the test model's folder; exports made on demand and kept: (family, qtype) -> path."""
    root = tmp_path_factory.mktemp("families")
    folders: dict[str, Path] = {}
    files: dict[tuple, Path] = {}

    def folder(family: str) -> Path:
        if family not in folders:
            name, edits, sparse, _ = CASES[family]
            dst = root / family
            dst.mkdir()
            if sparse:
                _all_sparse(HF / name, dst)
            else:
                shutil.copy(HF / name / "model.safetensors", dst / "model.safetensors")
                cfg = json.loads((HF / name / "config.json").read_text())
                (dst / "config.json").write_text(json.dumps(dict(cfg, **edits)))
            folders[family] = dst
        return folders[family]

    def export(family: str, qtype: str = "F32") -> Path:
        if (family, qtype) not in files:
            model = from_pretrained(folder(family))
            files[family, qtype] = save_gguf(model, root / f"{family}-{qtype}.gguf", qtype,
                                             tokenizer=_tokenizer(model.config.vocab_size))
        return files[family, qtype]
    return folder, export


def _logits(model, ids=IDS) -> np.ndarray:
    return model.forward(Tensor.from_data(np.array([list(ids)]), dtype="int64")).numpy()[0]


def _greedy(model) -> list[int]:
    return generate(model, None, IDS, GREEDY, temperature=0.0, eos_token_id=[]).token_ids


# ---------------------------------------------------------------------------------- Ember both ways
@pytest.mark.parametrize("family", list(CASES))
def test_an_f32_export_reads_back_as_the_hugging_face_model(built, family):
    folder, export = built
    ours = from_pretrained(folder(family))
    back = from_pretrained(export(family))
    assert type(back) is type(ours)
    for key, value in dataclasses.asdict(ours.config).items():  # floats as float32 metadata holds them
        assert dataclasses.asdict(back.config)[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float)
                                                        else value), key
    theirs = dict(iter_param_slots(back))
    for path, p in iter_param_slots(ours):
        assert np.allclose(theirs[path].val().numpy(), p.val().numpy(), rtol=0, atol=1e-6), path
    assert np.abs(_logits(back) - _logits(ours)).max() <= 1e-5


@pytest.mark.parametrize("family", list(CASES))
def test_the_gguf_package_reads_llama_cpps_names_and_metadata(built, family):
    _, export = built
    arch = CASES[family][3]
    reader = gguf.GGUFReader(str(export(family)))
    assert reader.fields["general.architecture"].contents() == arch
    enum = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[enum]}
    names = {t.name for t in reader.tensors}
    for name in names:
        assert re.sub(r"^blk\.[0-9]+\.", "blk.{bid}.", name.rsplit(".", 1)[0]) in allowed, name
    cfg = from_pretrained(built[0](family)).config
    assert reader.fields[f"{arch}.block_count"].contents() == cfg.num_hidden_layers
    if family in ("gemma2", "gemma3"):
        assert reader.fields[f"{arch}.attention.sliding_window"].contents() == cfg.sliding_window
    if family == "gemma2":
        assert reader.fields["gemma2.attn_logit_softcapping"].contents() == pytest.approx(cfg.attn_logit_softcapping)
        assert reader.fields["gemma2.final_logit_softcapping"].contents() == pytest.approx(cfg.final_logit_softcapping)
    if family in ("mixtral", "qwen2moe", "qwen3moe"):
        assert reader.fields[f"{arch}.expert_count"].contents() == cfg.num_experts
        assert reader.fields[f"{arch}.expert_used_count"].contents() == cfg.num_experts_per_tok
        stacked = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
        assert list(reversed([int(d) for d in stacked.shape])) == [cfg.num_experts, cfg.moe_intermediate_size,
                                                                   cfg.hidden_size]
    if family in GEMMA:  # llama.cpp multiplies by the stored norm: 1 + w
        model = from_pretrained(built[0](family))
        stored = next(t for t in reader.tensors if t.name == "output_norm.weight")
        assert np.allclose(np.asarray(stored.data), model.norm.gamma.val().numpy() + 1, atol=1e-7)


# ---------------------------------------------------------------------------------- llama.cpp
# measured (llama-cpp-python 0.3.36, CPU): the largest |logit difference| over the 10 positions,
# relative to the largest |logit|. F32: 4e-7 .. 7e-7 except the Gemmas, 6e-4 .. 9e-4 (ggml's CPU GELU
# is a table of float16 values); F16: Ember reads the same F16 weights, llama.cpp multiplies in F16.
_F32_TOLERANCE = {"gemma": 2e-3, "gemma2": 2e-3, "gemma3": 2e-3}


@needs_llama_cpp
@pytest.mark.parametrize("family", list(CASES))
def test_llama_cpp_computes_the_f32_export_as_ember_and_generates_its_tokens(built, family):
    folder, export = built
    ours = from_pretrained(folder(family))
    logits, ids = _llama_cpp(export(family))
    expected = _logits(ours)
    rel = np.abs(logits - expected).max() / np.abs(expected).max()
    assert rel <= _F32_TOLERANCE.get(family, 1e-5), rel
    assert (logits.argmax(-1) == expected.argmax(-1)).all()
    assert ids == _greedy(ours)


@needs_llama_cpp
@pytest.mark.parametrize("family", list(CASES))
def test_llama_cpp_computes_the_f16_export_as_ember_reads_it(built, family):
    _, export = built
    path = export(family, "F16")
    ours = from_pretrained(path)
    logits, ids = _llama_cpp(path)
    expected = _logits(ours)
    rel = np.abs(logits - expected).max() / np.abs(expected).max()
    assert rel <= 1e-2, rel  # measured 6e-4 .. 4.2e-3 (Gemma 2)
    assert ids == _greedy(ours)


def test_phi3_longrope_is_written_as_llama_cpps_factor_tensors_and_read_back(tmp_path):
    model = from_pretrained(HF / "phi3-longrope")
    path = save_gguf(model, tmp_path / "longrope.gguf", "F32", tokenizer=_tokenizer(model.config.vocab_size))
    with open_gguf(path) as f:
        scaling = model.config.rope_scaling
        assert np.array_equal(f.read("rope_factors_long.weight"), np.float32(scaling["long_factor"]))
        assert np.array_equal(f.read("rope_factors_short.weight"), np.float32(scaling["short_factor"]))
        assert f.metadata["phi3.rope.scaling.original_context_length"] == scaling["original_max_position_embeddings"]
    back = from_pretrained(path)
    ids = list(range(3, 23))  # past original_max_position_embeddings (16): the long factors
    for seq in (IDS, ids):
        assert np.abs(_logits(back, seq) - _logits(model, seq)).max() <= 1e-5


@needs_llama_cpp
def test_llama_cpp_runs_phi3_longrope_as_ember_past_the_original_context(tmp_path):
    # llama.cpp takes the long factors when its context (n_ctx 64) exceeds the original 16, transformers
    # and Ember when the sequence does: they agree on sequences longer than 16
    model = from_pretrained(HF / "phi3-longrope")
    path = save_gguf(model, tmp_path / "longrope.gguf", "F32", tokenizer=_tokenizer(model.config.vocab_size))
    ids = list(range(3, 23))
    logits, _ = _llama_cpp(path, 0, ids=ids)
    expected = _logits(model, ids)
    assert np.abs(logits - expected).max() / np.abs(expected).max() <= 1e-5


# ---------------------------------------------------------------------------------- quantized
@pytest.mark.parametrize("family", ["phi3", "mixtral", "qwen2moe", "qwen3moe"])
def test_quantized_experts_and_fused_rows_stay_in_blocks_equal_to_gguf_dequantized(built, family):
    _, export = built
    path = export(family, "Q8_0")
    model = from_pretrained(path)
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    wmap = gguf_weight_map(CASES[family][3], model.config)
    kept = 0
    for p_path, p in iter_param_slots(model):
        hit = wmap.find(p_path)
        if hit is None:
            continue
        rule, name = hit
        t = stored[name]
        shape = [int(d) for d in reversed(t.shape)]
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            full = np.asarray(t.data, dtype=np.float32).reshape(shape)
        else:
            full = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
        if ".experts." in p_path or ".query." in p_path or "gate_proj" in p_path:
            kept += isinstance(p.reparameterization, GGUFWeight)
        assert np.array_equal(p.val().numpy(), rule.load(full.astype(np.float32))), p_path
    assert kept > 0  # the experts (or Phi-3's fused parts) are kept in their blocks
    storage = gguf_storage(model)  # each part counts its own rows: the bytes add up to the file's
    assert sum(nbytes for _, _, nbytes in storage.values()) == sum(int(t.n_bytes) for t in reader.tensors)
    cfg = model.config
    if family == "phi3":  # the key rows' share of attn_qkv
        name, _, nbytes = storage["layers.0.self_attn.key.weight"]
        rows = cfg.num_key_value_heads, cfg.num_attention_heads + 2 * cfg.num_key_value_heads
    else:  # one expert of ffn_up_exps
        name, _, nbytes = storage["layers.0.mlp.experts.1.up_proj.weight"]
        rows = 1, cfg.num_experts
    assert name in ("blk.0.attn_qkv.weight", "blk.0.ffn_up_exps.weight")
    assert nbytes * rows[1] == int(stored[name].n_bytes) * rows[0]


@pytest.mark.parametrize("family", ["phi3", "qwen2moe"])
def test_a_source_typed_export_copies_the_stacked_and_fused_blocks(built, family, tmp_path):
    _, export = built
    src = export(family, "Q8_0")
    out = save_gguf(from_pretrained(src), tmp_path / "again.gguf", "source",
                    tokenizer=_tokenizer(from_pretrained(src).config.vocab_size))
    with open_gguf(src) as a, open_gguf(out) as b:
        assert sorted(a.tensors) == sorted(b.tensors)
        for name, t in a.tensors.items():
            assert b.tensors[name].type == t.type and b.tensors[name].shape == t.shape, name
            assert np.array_equal(a.read(name), b.read(name)), name


# ---------------------------------------------------------------------------------- LoRA adapters
def _with_random_lora(model, regex: str):
    model = model.apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(regex)))
    rng = np.random.default_rng(5)
    for r in adapters_of(model).values():
        r.a = Param(Tensor.from_data((rng.standard_normal(r.a.shape) * 0.3).astype(np.float32)))
        r.b = Param(Tensor.from_data((rng.standard_normal(r.b.shape) * 0.3).astype(np.float32)))
    return model


@needs_llama_cpp
@pytest.mark.parametrize("family, regex", [
    # Phi-3: LoRAs on some parts of the fused attn_qkv and ffn_up (query and value, not key; gate, not up)
    ("phi3", r"layers\.[01]\.(self_attn\.(query|value)|mlp\.(gate_proj|down_proj))"),
    ("qwen3", r"layers\.[01]\.(self_attn\.(query|key|value|output)|mlp)"),
    ("gemma2", r"layers\.[01]\.self_attn\.(query|key|value|output)"),
    ("mixtral", r"layers\.[01]\.self_attn\.(query|key|value|output)"),
])
def test_an_exported_lora_adapter_runs_in_llama_cpp_as_in_ember(built, family, regex, tmp_path):
    _, export = built
    base = export(family)
    model = _with_random_lora(from_pretrained(base), regex)
    adapter = save_gguf_lora(model, tmp_path / "adapter.gguf")
    logits, ids = _llama_cpp(base, adapter=adapter)
    expected = _logits(model)
    assert np.abs(expected - _logits(from_pretrained(base))).max() > 0.5  # the adapters change the logits
    rel = np.abs(logits - expected).max() / np.abs(expected).max()
    assert rel <= _F32_TOLERANCE.get(family, 1e-5), rel
    assert ids == _greedy(model)


def test_a_lora_on_an_expert_is_refused_for_a_gguf_adapter(built, tmp_path):
    model = _with_random_lora(from_pretrained(built[1]("qwen3moe")), r"layers\.0\.mlp\.experts\.1\.up_proj")
    with pytest.raises(PretrainedError, match="'layers.0.mlp.experts.1.up_proj.weight' \\(one expert of "
                                              "blk.0.ffn_up_exps.weight\\) carries a LoRA"):
        save_gguf_lora(model, tmp_path / "adapter.gguf")
    assert not (tmp_path / "adapter.gguf").exists()


# ---------------------------------------------------------------------------------- refusals
def _rewritten(src: Path, dst: Path, drop_tensor: str | None = None, drop_key: str | None = None) -> Path:
    raw = gguf.GGUFReader(str(src))
    arch = raw.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, field in raw.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        sub = field.types[-1] if len(field.types) > 1 else None
        w.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for t in raw.tensors:
        if t.name != drop_tensor:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("family, tensor", [("qwen3", "blk.0.attn_q_norm.weight"), ("phi3", "blk.1.attn_qkv.weight"),
                                            ("gemma2", "blk.0.post_ffw_norm.weight"),
                                            ("qwen3moe", "blk.2.ffn_down_exps.weight"),
                                            ("qwen2moe", "blk.1.ffn_gate_inp_shexp.weight")])
def test_a_missing_tensor_is_refused_naming_it(built, family, tensor, tmp_path):
    path = _rewritten(built[1](family), tmp_path / "m.gguf", drop_tensor=tensor)
    with pytest.raises(PretrainedError, match=f"lacks tensors the metadata needs: '{tensor}'"):
        from_pretrained(path)


@pytest.mark.parametrize("family, key", [("gemma3", "gemma3.attention.sliding_window"),
                                         ("qwen3moe", "qwen3moe.expert_used_count"),
                                         ("qwen2moe", "qwen2moe.expert_count"),
                                         ("qwen3", "qwen3.attention.head_count")])
def test_missing_metadata_is_refused_naming_it(built, family, key, tmp_path):
    path = _rewritten(built[1](family), tmp_path / "m.gguf", drop_key=key)
    with pytest.raises(PretrainedError, match=f"metadata '{key}' is missing"):
        from_pretrained(path)


def _edited(tmp_path: Path, src: Path, **edits) -> Path:
    dst = tmp_path / "edited"
    dst.mkdir()
    shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(dict(json.loads((src / "config.json").read_text()), **edits)))
    return dst


@pytest.mark.parametrize("fixture, edits, message", [
    ("gemma2", {}, "'query_pre_attn_scalar' is 16; llama.cpp's gemma2 with 2 layers scales the attention by 8"),
    ("gemma2", {"query_pre_attn_scalar": 8, "attn_logit_softcapping": None}, "always soft-caps"),
    ("gemma3", {"query_pre_attn_scalar": 8, "final_logit_softcapping": 2.0}, "llama.cpp's gemma3 does not soft-cap"),
    ("qwen2-moe", {}, r"layers \[1\] have a dense feed-forward block"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4}, "llama.cpp's qwen3 has no sliding window"),
    ("qwen3-bias", {}, r"llama.cpp's qwen3 has no bias on the attention output \(o_proj\)"),
])
def test_what_llama_cpp_would_compute_otherwise_is_refused_before_writing(tmp_path, fixture, edits, message):
    model = from_pretrained(_edited(tmp_path, HF / fixture, **edits))
    target = tmp_path / "out.gguf"
    with pytest.raises(PretrainedError, match=message):
        save_gguf(model, target, "F32", tokenizer=_tokenizer(model.config.vocab_size))
    assert not target.exists()


def test_a_qwen2_moe_renormalising_its_experts_is_refused(built, tmp_path):
    model = from_pretrained(_edited(tmp_path, built[0]("qwen2moe"), norm_topk_prob=True))
    with pytest.raises(PretrainedError, match="'norm_topk_prob' is True; llama.cpp's qwen2_moe never renormalises"):
        save_gguf(model, tmp_path / "out.gguf", "F32", tokenizer=_tokenizer(model.config.vocab_size))


def test_a_folder_model_without_a_tokenizer_json_or_tokenizer_metadata_is_refused():
    model = from_pretrained(HF / "qwen3")
    with pytest.raises(PretrainedError, match="expected a tokenizer.json in the model's folder"):
        save_gguf(model, "/nonexistent/never.gguf", "F32")


def _per_expert(src: Path, dst: Path) -> Path:
    """The file with its stacked experts written one tensor per expert (`blk.N.ffn_gate.E.weight`), as
    llama.cpp's converter wrote Mixtral files before it stacked them."""
    raw = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), raw.fields["general.architecture"].contents())
    for name, field in raw.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            sub = field.types[-1] if len(field.types) > 1 else None
            w.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for t in raw.tensors:
        data = np.asarray(t.data)
        if "_exps." in t.name:
            for e in range(data.shape[0]):
                w.add_tensor(t.name.replace("_exps.", f".{e}."), np.ascontiguousarray(data[e]), raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_a_mixtral_file_of_one_tensor_per_expert_reads_as_the_stacked_one(built, qtype, tmp_path):
    stacked = built[1]("mixtral", qtype)
    legacy = _per_expert(stacked, tmp_path / "legacy.gguf")
    assert "blk.1.ffn_down.3.weight" in {t.name for t in gguf.GGUFReader(str(legacy)).tensors}
    a, b = from_pretrained(stacked), from_pretrained(legacy)
    assert np.array_equal(_logits(a), _logits(b))
    again = save_gguf(b, tmp_path / "again.gguf", "source", tokenizer=_tokenizer(b.config.vocab_size))
    with open_gguf(stacked) as x, open_gguf(again) as y:  # written back stacked, the blocks as they were
        assert sorted(x.tensors) == sorted(y.tensors)
        for name in x.tensors:
            assert x.tensors[name].type == y.tensors[name].type and np.array_equal(x.read(name), y.read(name)), name


def test_an_experts_size_left_out_of_the_metadata_is_the_stacked_tensors(built, tmp_path):
    src = built[1]("qwen3moe")
    path = _rewritten(src, tmp_path / "m.gguf", drop_key="qwen3moe.expert_feed_forward_length")
    a, b = from_pretrained(src), from_pretrained(path)
    assert b.config.moe_intermediate_size == a.config.moe_intermediate_size != a.config.intermediate_size
    assert np.array_equal(_logits(a), _logits(b))


@needs_llama_cpp
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q5_K_M"])
@pytest.mark.parametrize("family", list(CASES))
def test_a_k_quant_mix_gives_each_tensor_llama_cpps_type(built, family, mix, tmp_path):
    # llama.cpp's own quantizer of the F32 export (tests/engine/models/llama_cpp_quantize.py) picks the
    # types Ember's mix picks: Phi-3's fused qkv, the mixtures' routers and stacked experts, the rows
    # that are no multiple of 256 (these fixtures' all) falling back
    from tests.engine.models.test_gguf_kquants import _llama_cpp_quantize  # noqa: PLC0415

    folder, export = built
    model = from_pretrained(folder(family))
    ours = save_gguf(model, tmp_path / "ours.gguf", mix, tokenizer=_tokenizer(model.config.vocab_size))
    theirs = tmp_path / "theirs.gguf"
    _llama_cpp_quantize(export(family), theirs, mix)
    with open_gguf(ours) as a, open_gguf(theirs) as b:
        assert {n: t.type for n, t in a.tensors.items()} == {n: t.type for n, t in b.tensors.items()}


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_1"])
@pytest.mark.parametrize("family", ["mixtral", "qwen2moe"])
def test_a_mixture_s_router_stays_f32_in_every_quantized_type(built, family, qtype, tmp_path):
    # llama.cpp's quantizer keeps ffn_gate_inp (and Qwen2-MoE's ffn_gate_inp_shexp) F32 whatever the
    # file type; the K mixes did already, the gguf-package types too now
    folder, export = built
    model = from_pretrained(folder(family))
    ours = save_gguf(model, tmp_path / "ours.gguf", qtype, tokenizer=_tokenizer(model.config.vocab_size))
    with open_gguf(ours) as f:
        types = {n: t.type for n, t in f.tensors.items()}
    routers = {n: t for n, t in types.items() if "ffn_gate_inp" in n}
    assert routers and set(routers.values()) == {"F32"}, routers
    assert types["blk.0.ffn_up_exps.weight"] == qtype
    if ORACLE is not None and qtype == "Q8_0":
        from tests.engine.models.test_gguf_kquants import _llama_cpp_quantize  # noqa: PLC0415

        theirs = tmp_path / "theirs.gguf"
        _llama_cpp_quantize(export(family), theirs, qtype)
        with open_gguf(theirs) as f:
            assert {n: f.tensors[n].type for n in routers} == routers
