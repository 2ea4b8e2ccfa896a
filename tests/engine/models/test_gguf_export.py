"""GGUF export (issue 46, item 5): the merged model as a GGUF file, the LoRA adapters as a GGUF LoRA
adapter, an Ollama Modelfile; read back by the `gguf` package and Ember, and run by llama.cpp.

The llama.cpp tests run the oracle venv's Python ($EMBER_ORACLE_PYTHON, default
/work/oracle-venv/bin/python) with llama-cpp-python in a subprocess (`llama_cpp_oracle.py`) and
are skipped, saying so, without it: greedy tokens of an Ember-written F16 file equal Ember's; a
quantized one's logits close to Ember's on the same file; an exported adapter over its base
gives Ember's greedy tokens with the adapter.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from engine.models import from_pretrained  # noqa: E402
from engine.models.generate import generate  # noqa: E402
from engine.models.gguf_export import save_gguf  # noqa: E402
from engine.models.gguf_lora import check_gguf_lora, gguf_lora_tensors, save_gguf_lora  # noqa: E402
from engine.models.ollama import write_modelfile  # noqa: E402
from engine.models.gguf_weight import GGUFWeight  # noqa: E402
from engine.models.hf_folder import PretrainedError  # noqa: E402
from engine.module import Lora, Param, ParamGroup  # noqa: E402
from engine.module.reparam import adapters_of, iter_param_slots  # noqa: E402
from engine.store.gguf_file import open_gguf  # noqa: E402
from engine.tensor import Tensor  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gguf"
MIXED = FIXTURES / "tiny-llama-mixed.gguf"
QWEN = FIXTURES / "tiny-qwen2-q8.gguf"
ORACLE_SCRIPT = Path(__file__).resolve().parent / "llama_cpp_oracle.py"
PROMPT = [1, 5, 9, 40, 77, 3]


def _oracle_python() -> Path | None:
    given = os.environ.get("EMBER_ORACLE_PYTHON")
    p = Path(given) if given else Path(os.environ.get("EMBER_ORACLE_VENV", "/work/oracle-venv")) / "bin" / "python"
    if not p.is_file():
        return None
    ok = subprocess.run([str(p), "-c", "import llama_cpp"], capture_output=True, timeout=120)
    return p if ok.returncode == 0 else None


ORACLE = _oracle_python()
needs_llama_cpp = pytest.mark.skipif(ORACLE is None, reason="llama-cpp-python not found in the oracle venv "
                                                            "(set EMBER_ORACLE_PYTHON)")


def _llama_cpp(model: Path, count: int, adapter: Path | None = None) -> dict:
    args = [str(ORACLE), str(ORACLE_SCRIPT), str(model), json.dumps(PROMPT), str(count)]
    args += [str(adapter)] if adapter is not None else []
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _greedy(model, count: int) -> list[int]:
    return generate(model, None, PROMPT, count, temperature=0.0, eos_token_id=[]).token_ids


def _prompt_logits(model) -> np.ndarray:
    return model.forward(Tensor.from_data(np.array([PROMPT]), dtype="int64")).numpy()[0, -1]


def _random_adapters(model, seed: int, std: float = 0.1):
    rng = np.random.default_rng(seed)
    for r in adapters_of(model).values():
        r.a = Param(Tensor.from_data((rng.standard_normal(r.a.shape) * std).astype(np.float32)))
        r.b = Param(Tensor.from_data((rng.standard_normal(r.b.shape) * std).astype(np.float32)))
    return model


# ---------------------------------------------------------------------------------- merged export
def test_source_types_copy_unchanged_blocks_and_the_metadata(tmp_path):
    out = save_gguf(from_pretrained(MIXED), tmp_path / "out.gguf", "source")
    with open_gguf(MIXED) as src, open_gguf(out) as dst:
        assert list(dst.tensors) == list(src.tensors)
        for name, t in src.tensors.items():
            assert dst.tensors[name].type == t.type and dst.tensors[name].shape == t.shape, name
            assert np.array_equal(dst.read(name), src.read(name)), name  # the bytes as they were
        for key, value in src.metadata.items():
            if key.startswith("tokenizer."):
                ours = dst.metadata[key]
                assert (np.array_equal(ours, value) if isinstance(value, np.ndarray) else ours == value), key
        assert dst.metadata["tokenizer.chat_template"] == src.metadata["tokenizer.chat_template"]
        for key in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                    "feed_forward_length", "rope.freq_base", "attention.layer_norm_rms_epsilon"):
            assert dst.metadata[f"llama.{key}"] == pytest.approx(src.metadata[f"llama.{key}"]), key


@pytest.mark.parametrize("source", [MIXED, QWEN])
@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_1"])
def test_merged_lora_model_written_in_a_type_reads_back_as_its_values(tmp_path, source, qtype):
    model = _random_adapters(from_pretrained(source).apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(
        r"layers\.0"))), seed=3)
    out = save_gguf(model, tmp_path / "m.gguf", qtype)
    back = from_pretrained(out)
    ours = {path: p for path, p in iter_param_slots(model)}
    theirs = dict(iter_param_slots(back))
    adapted = set(adapters_of(model))
    checked = 0
    for path, p in theirs.items():
        if path not in ours or ".gguf." in path or ".lora." in path:
            continue
        value, written = ours[path].val().numpy(), p.val().numpy()
        if value.ndim == 1:
            assert np.array_equal(written, value), path  # vectors are F32
        elif qtype == "F16":
            assert np.array_equal(written, value.astype(np.float16).astype(np.float32)), path
        elif qtype == "BF16":  # gguf's rounding to bfloat16 (a float type: read back as a plain weight)
            bf16 = gguf.GGMLQuantizationType.BF16
            assert np.array_equal(written, gguf.quants.dequantize(gguf.quants.quantize(value, bf16), bf16)), path
        else:
            r = p.reparameterization
            assert isinstance(r, GGUFWeight), path
            if path in adapted or r.qtype != (ours[path].reparameterization.qtype if isinstance(
                    ours[path].reparameterization, GGUFWeight) else None):
                # a changed (or retyped) weight: gguf's quantization of the merged value
                stored = value.T if r.transpose else value  # a Linear's [in, out] is stored [out, in]
                expected = gguf.quants.dequantize(gguf.quants.quantize(
                    stored, gguf.GGMLQuantizationType[r.qtype]), gguf.GGMLQuantizationType[r.qtype])
                assert r.qtype == qtype, path
                if source == QWEN and ("query" in path or "key" in path):
                    continue  # rows reordered for the file: compared through the model's outputs below
                assert np.array_equal(written, expected.T if r.transpose else expected), path
            else:  # an unchanged weight of the type: its blocks copied
                assert np.array_equal(written, value), path
        checked += 1
    assert checked >= 8
    if qtype == "F16":
        assert np.allclose(_prompt_logits(back), _prompt_logits(model), rtol=1e-2, atol=1e-2 * np.abs(
            _prompt_logits(model)).max())


def test_export_is_refused_for_what_it_cannot_write_and_cancelled_leaves_the_old_file(tmp_path):
    from engine import nn

    with pytest.raises(PretrainedError, match="not opened from a pretrained model"):
        save_gguf(nn.Linear(2, 3), tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="qtype must be one of"):
        save_gguf(from_pretrained(QWEN), tmp_path / "x.gguf", "Q4_K")
    target = tmp_path / "keep.gguf"
    target.write_bytes(b"old")

    def cancel():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        save_gguf(from_pretrained(QWEN), target, "F16", check=cancel)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.gguf"]


# ---------------------------------------------------------------------------------- LoRA adapter
def test_adapter_layout_alpha_and_refusals(tmp_path):
    model = from_pretrained(MIXED).apply_lora(Lora(4, 8.0, use_rslora=True, param_group=ParamGroup.from_regex(
        r"layers\.")))
    model = _random_adapters(model, seed=1)
    arch, alpha, tensors = gguf_lora_tensors(model)
    assert arch == "llama" and alpha == pytest.approx(8.0 * 4 ** 0.5)  # rsLoRA: alpha * sqrt(r)
    with open_gguf(MIXED) as base:
        for name, (A, B) in tensors.items():
            assert A.shape[0] == B.shape[1] == 4
            assert (B.shape[0], A.shape[1]) == base.tensors[name].shape
    out = save_gguf_lora(model, tmp_path / "a.gguf")
    with open_gguf(out) as f:
        assert f.metadata["general.type"] == "adapter" and f.metadata["general.architecture"] == "llama"
        assert f.metadata["adapter.type"] == "lora"
        assert f.metadata["adapter.lora.alpha"] == pytest.approx(alpha)
        name = "blk.0.attn_q.weight"
        assert f.tensors[f"{name}.lora_a"].shape == tensors[name][0].shape
        assert np.array_equal(f.read(f"{name}.lora_b"), tensors[name][1])
    # the change llama.cpp adds, alpha / r * B @ A, is Ember's scale * a @ b (transposed)
    path = "layers.1.mlp.down_proj.weight"
    r = adapters_of(model)[path]
    A, B = tensors["blk.1.ffn_down.weight"]
    assert np.allclose(alpha / 4 * (B @ A), (r.scale * r.a.val().numpy() @ r.b.val().numpy()).T, rtol=1e-5,
                       atol=1e-6)

    with pytest.raises(PretrainedError, match="DoRA"):
        gguf_lora_tensors(from_pretrained(MIXED).apply_lora(Lora(2, 4.0, use_dora=True, param_group=ParamGroup.
                                                                 from_regex(r"layers\."))))
    with pytest.raises(PretrainedError, match="token embedding"):
        gguf_lora_tensors(from_pretrained(MIXED).apply_lora(Lora(2, 4.0)))
    tuned_norm = from_pretrained(MIXED).apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(r"layers\.")))
    tuned_norm = tuned_norm.unfreeze_group(ParamGroup.from_regex(r"^norm\.gamma$"))
    with pytest.raises(PretrainedError, match="'norm.gamma' is trainable outside the LoRA adapters"):
        gguf_lora_tensors(tuned_norm)
    with pytest.raises(PretrainedError, match="no LoRA adapters"):
        gguf_lora_tensors(from_pretrained(MIXED))
    with pytest.raises(PretrainedError, match="adapter is for a 'llama' model, the base GGUF is 'qwen2'"):
        check_gguf_lora(arch, tensors, QWEN)
    wrong = dict(tensors)
    A, B = wrong["blk.0.attn_q.weight"]
    wrong["blk.0.attn_q.weight"] = (A[:, :-1], B)
    with pytest.raises(PretrainedError, match="'blk.0.attn_q.weight' has dims"):
        check_gguf_lora(arch, wrong, MIXED)
    assert not (tmp_path / "b.gguf").exists()


def test_modelfile_names_base_adapter_and_template(tmp_path):
    with open_gguf(MIXED) as f:
        template = f.metadata["tokenizer.chat_template"]
    text = write_modelfile(tmp_path / "Modelfile", MIXED, tmp_path / "a.gguf", template).read_text()
    assert text.splitlines()[0] == f"FROM {MIXED.resolve()}"
    assert f"ADAPTER {(tmp_path / 'a.gguf').resolve()}" in text
    assert 'TEMPLATE """' in text and "{{ .Content }}<|im_end|>" in text and 'PARAMETER stop "<|im_end|>"' in text
    other = write_modelfile(tmp_path / "M2", MIXED, None, "{{ messages }}").read_text()
    assert not any(line.startswith(("ADAPTER", "TEMPLATE")) for line in other.splitlines())


# ---------------------------------------------------------------------------------- llama.cpp runs it
@needs_llama_cpp
@pytest.mark.parametrize("source", [MIXED, QWEN])
def test_llama_cpp_runs_the_exported_file_as_ember_does(tmp_path, source):
    model = _random_adapters(from_pretrained(source).apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(
        r"layers\."))), seed=5)
    f16 = save_gguf(model, tmp_path / "f16.gguf", "F16")
    assert _llama_cpp(f16, 8)["ids"] == _greedy(from_pretrained(f16), 8)


@needs_llama_cpp
@pytest.mark.parametrize("source", [MIXED, QWEN])
@pytest.mark.parametrize("qtype", ["F32", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "source"])
def test_llama_cpp_reads_every_written_type_with_ember_s_logits(tmp_path, source, qtype):
    out = save_gguf(from_pretrained(source), tmp_path / f"{qtype}.gguf", qtype)
    theirs, ours = np.array(_llama_cpp(out, 1)["logits"]), _prompt_logits(from_pretrained(out))
    # llama.cpp multiplies block-quantized weights by quantized activations (Q8_0 / Q8_1): close, not
    # equal; float types within float rounding (measured: F32 1e-3, BF16 5e-3, the block types 1-6e-2)
    tolerance = 0.01 if qtype in ("F32", "BF16") else 0.1
    assert np.linalg.norm(theirs - ours) <= tolerance * np.linalg.norm(ours)


@needs_llama_cpp
@pytest.mark.parametrize("source", [MIXED, QWEN])
def test_llama_cpp_applies_the_exported_adapter_as_ember_does(tmp_path, source):
    base = save_gguf(from_pretrained(source), tmp_path / "base.gguf", "F32")
    # two ranks and scales in one file: the second's scale * r / alpha is folded into its B
    model = from_pretrained(base).apply_lora(Lora(4, 8.0, use_rslora=True, param_group=ParamGroup.from_regex(
        r"layers\.0")))
    model = model.apply_lora(Lora(2, 3.0, param_group=ParamGroup.from_regex(r"layers\.1")))
    model = _random_adapters(model, seed=7)
    ranks = {r.a.shape[1] for r in adapters_of(model).values()}
    assert ranks == {4, 2} or source == QWEN  # the Qwen2 fixture has one layer
    adapter = save_gguf_lora(model, tmp_path / "adapter.gguf")
    expected = _greedy(model, 8)
    assert expected != _greedy(from_pretrained(base), 8)  # the adapter changes the output
    assert _llama_cpp(base, 8, adapter)["ids"] == expected


def test_the_display_counts_a_quantized_weight_as_its_values_not_its_blocks():
    model = from_pretrained(QWEN)
    text = str(model)
    embed = model.embed_tokens.weight
    assert isinstance(embed.reparameterization, GGUFWeight)  # Q8_0: 272 bytes per row of 256 values
    assert f"n_embedding: 300, d_model: 256, params: {300 * 256}}}" in text
    total = sum(int(np.prod(p.lazy_shape())) for path, p in iter_param_slots(model) if ".gguf." not in path)
    assert f"params: {total}\n}}" in text
