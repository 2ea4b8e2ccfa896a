"""Ember's ONNX export of language models (issue 47, must-show 2's second half): dynamic batch and
sequence axes, `input_ids` / `attention_mask` in and `logits` out, and the key/value-cache variant
run step by step by onnxruntime for greedy generation.

onnxruntime runs in this interpreter when installed, else in the oracle venv (a subprocess); the
tests that need it skip, saying so, without either."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from engine import Tensor
from engine.interop import OnnxExportError, export_onnx
from engine.models import from_pretrained
from engine.models.generate import generate

ROOT = Path(__file__).resolve().parents[3]
HF = ROOT / "tests" / "fixtures" / "hf"
RUNNER = Path(__file__).with_name("ort_runner.py")
ORACLE = Path("/work/oracle-venv/bin/python")


def _oracle_has_ort() -> bool:
    if not ORACLE.exists():
        return False
    return subprocess.run([str(ORACLE), "-c", "import onnxruntime"], capture_output=True).returncode == 0


def _ort_run(model_path, feeds: dict, tmp_path) -> dict:
    """The runner's outputs for `feeds` (see ort_runner.py), in this interpreter or the oracle venv's."""
    if importlib.util.find_spec("onnxruntime") is not None:
        spec = importlib.util.spec_from_file_location("ort_runner", RUNNER)
        runner = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(runner)
        return runner.run(str(model_path), feeds)
    if not _oracle_has_ort():
        pytest.skip("onnxruntime is not installed here nor in /work/oracle-venv: the exports are not run")
    fin, fout = tmp_path / "feeds.npz", tmp_path / "out.npz"
    np.savez(fin, **feeds)
    r = subprocess.run([str(ORACLE), str(RUNNER), str(model_path), str(fin), str(fout)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(np.load(fout))


def _model(name):
    return from_pretrained(HF / name).valid()


def _dims(path) -> dict:
    graph = onnx.load(str(path)).graph
    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    return {v.name: dims(v) for v in list(graph.input) + list(graph.output)}


# two sequence lengths and two batch sizes, the first row left-padded
SIZES = [(1, 5), (3, 11)]


# the mixtures of experts (Mixtral; Qwen2-MoE's sigmoid-gated shared expert; Qwen3-MoE's renormalised top-k),
# exported in their dense form (every expert on every token, weighted zero outside the top-k)
MIXTURES = ["mixtral", "qwen2-moe", "qwen3-moe"]


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "qwen2", "mistral-swa", "qwen3", "gemma2", "gemma3", "phi3",
                                  *MIXTURES])
def test_the_export_runs_at_other_lengths_and_batches_with_embers_logits(name, tmp_path):
    model = _model(name)
    path = export_onnx(model, tmp_path / f"{name}.onnx")  # traced at batch 2, length 3 (and one more of each)
    dims = _dims(path)
    assert dims["input_ids"] == ["batch", "sequence"] and dims["attention_mask"] == ["batch", "sequence"]
    assert dims["logits"][:2] == ["batch", "sequence"] and list(dims) == ["input_ids", "attention_mask", "logits"]
    rng = np.random.default_rng(7)
    feeds = {}
    for k, (b, s) in enumerate(SIZES):
        ids = rng.integers(0, 100, size=(b, s)).astype(np.int64)
        mask = np.ones((b, s), dtype=np.int64)
        mask[0, :2] = 0
        feeds[f"run{k}/input_ids"], feeds[f"run{k}/attention_mask"] = ids, mask
    got = _ort_run(path, feeds, tmp_path)
    tol = 1e-5 if name in MIXTURES else 1e-4  # the mixtures measured 4.0e-6 at most (the dense form, float32 sums)
    for k, (b, s) in enumerate(SIZES):
        logits, ids, mask = got[f"run{k}/logits"], feeds[f"run{k}/input_ids"], feeds[f"run{k}/attention_mask"]
        assert logits.shape[:2] == (b, s)
        for r in range(b):  # a left-padded row's real positions: the logits the row has alone
            real = mask[r] == 1
            np.testing.assert_allclose(logits[r, real], _alone(model, ids[r, real].tolist()), atol=tol, rtol=0,
                                       err_msg=f"{name} batch {b} length {s} row {r}")


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "mistral-swa", *MIXTURES])
def test_the_cache_variant_generates_embers_greedy_tokens(name, tmp_path):
    model = _model(name)
    path = export_onnx(model, tmp_path / f"{name}-cache.onnx", with_cache=True)
    dims = _dims(path)
    assert dims["past_key_values.0.key"][0] == "batch" and dims["past_key_values.0.key"][2] == "past_sequence"
    assert dims["present.0.value"][2] == "past_sequence + sequence"
    assert dims["attention_mask"] == ["batch", "past_sequence + sequence"]
    prompt = [[3, 17, 42, 8, 99, 5, 23]]
    got = _ort_run(path, {"generate/prompt": np.asarray(prompt, dtype=np.int64), "generate/steps": np.asarray(20)},
                   tmp_path)  # the first step with a past of length 0, then one token at a time
    want = generate(model, None, prompt[0], 20, temperature=0, eos_token_id=[])
    assert got["generate/tokens"][0].tolist() == list(want.ids[0] if hasattr(want, "ids") else want)
    assert len(set(got["generate/tokens"][0].tolist())) > 1  # not one repeated token: the cache matters


def _alone(model, tokens) -> np.ndarray:
    """Ember's logits `[n, vocab]` of one row of tokens fed alone, unpadded."""
    return model.forward(Tensor.from_data(np.asarray([tokens], dtype=np.int64))).numpy()[0]


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "qwen3", "gemma3"])
def test_left_padded_rows_generate_step_by_step_as_each_does_alone(name, tmp_path):
    """The cache variant numbers a left-padded row's positions from its first real token (from the
    attention mask, as transformers' generate): run step by step by onnxruntime on a left-padded batch of
    prompts of different lengths, each row's logits at every position are those Ember gives the row alone,
    each step's last logits transformers' generate's (padded_logits.npz, make_padded_logits_fixtures.py),
    and the greedy tokens Ember's and transformers'."""
    model = _model(name)
    path = export_onnx(model, tmp_path / f"{name}-cache.onnx", with_cache=True)
    fixture = np.load(HF / name / "padded_logits.npz")
    ids, mask, steps = fixture["input_ids"].astype(np.int64), fixture["attention_mask"].astype(np.int64), 12
    assert fixture["new_ids"].shape == (ids.shape[0], steps) and len(set(mask.sum(axis=1).tolist())) > 1
    got = _ort_run(path, {"generate/prompt": ids, "generate/mask": mask, "generate/steps": np.asarray(steps)},
                   tmp_path)
    tokens, logits = got["generate/tokens"], got["generate/logits"]
    width = ids.shape[1]
    assert logits.shape[1] == width + steps - 1
    np.testing.assert_allclose(logits[:, width - 1:], fixture["logits"], atol=1e-4, rtol=0,
                               err_msg=f"{name}: each step's last logits against transformers' generate")
    assert tokens.tolist() == fixture["new_ids"].tolist()
    prompts = [ids[r, mask[r] == 1].tolist() for r in range(ids.shape[0])]
    for r, p in enumerate(prompts):
        want = _alone(model, p + tokens[r, :-1].tolist())
        np.testing.assert_allclose(logits[r, width - len(p):], want, atol=1e-4, rtol=0, err_msg=f"{name} row {r}")
    ember = generate(model, None, prompts, steps, temperature=0, eos_token_id=[])
    assert tokens.tolist() == [list(r) for r in ember.ids]


def _cache_positions(mask: np.ndarray, seq: int) -> np.ndarray:
    """The new tokens' positions as Ember's generate numbers them: each row's real tokens counted."""
    return np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 0)[:, mask.shape[1] - seq:]


# (batch, sequence, past) of each run: two batch sizes, two lengths; with the cache, an empty past and a past
# whose first row begins with padding
IMPORT_SIZES = {False: [(1, 4, 0), (3, 7, 0)], True: [(1, 4, 0), (3, 7, 0), (1, 4, 5), (3, 7, 2)]}


@pytest.mark.parametrize("with_cache", [False, True], ids=["no-cache", "cache"])
@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "mistral-swa", "qwen3", "gemma2", "gemma3", "phi3", *MIXTURES])
def test_embers_own_export_imports_and_gives_onnxruntimes_and_embers_logits(name, with_cache, tmp_path):
    """`import_onnx` reads back Ember's language-model export (dynamic batch and sequence, run-time Slice,
    Range, Gather of positions, the mask's `past_sequence + sequence` axis); the imported module's outputs equal
    onnxruntime's and the model's own (with the cache: the same past, the positions counted from the mask)."""
    from engine.design import build_model  # noqa: PLC0415
    from engine.interop import import_onnx  # noqa: PLC0415
    from engine.nn import KVCache  # noqa: PLC0415

    model = _model(name)
    n_layers = len(model.layers) if hasattr(model, "layers") else len(model.h)
    path = export_onnx(model, tmp_path / f"{name}.onnx", with_cache=with_cache)
    imported = import_onnx(path)
    assert imported.report.ok and not imported.report.unsupported
    module = build_model(imported.design).load_record(imported.record).valid()
    graph = onnx.load(str(path)).graph
    assert set(imported.report.mapping) == {n.name for n in graph.node}  # every node said, none skipped
    rng = np.random.default_rng(3)
    feeds, runs = {}, []
    for k, (b, s, past) in enumerate(IMPORT_SIZES[with_cache]):
        mask = np.ones((b, past + s), dtype=np.int64)
        mask[0, :2] = 0  # the first row left-padded
        run = {"input_ids": rng.integers(0, 100, size=(b, s)).astype(np.int64), "attention_mask": mask}
        for v in graph.input[2:]:
            dims = v.type.tensor_type.shape.dim
            run[v.name] = rng.standard_normal((b, dims[1].dim_value, past, dims[3].dim_value)).astype(np.float32)
        feeds.update({f"run{k}/{key}": value for key, value in run.items()})
        runs.append(run)
    got_ort = _ort_run(path, feeds, tmp_path)
    # float32 noise between two runtimes; Gemma 3's larger logits (scaled embeddings, four norms) give 2.6e-5
    # between onnxruntime and Ember, the imported module in between
    tol_ember = 5e-5 if name == "gemma3" else 1e-5
    for k, run in enumerate(runs):
        y = module.forward(*[Tensor.from_data(run[v.name]) for v in graph.input])
        got = [t.numpy() for t in (y if isinstance(y, (tuple, list)) else (y,))]
        assert len(got) == len(graph.output)
        for v, g in zip(graph.output, got):
            want = got_ort[f"run{k}/{v.name}"]
            assert g.shape == want.shape, (v.name, g.shape, want.shape)
            np.testing.assert_allclose(g, want, atol=1e-5, rtol=0, err_msg=f"{name} run {k} {v.name}")
        pasts = [run[v.name] for v in graph.input[2:]]
        caches = [KVCache.holding(Tensor.from_data(pasts[2 * i]), Tensor.from_data(pasts[2 * i + 1]))
                  for i in range(n_layers)] if with_cache else KVCache.layers(n_layers)
        ids, mask = run["input_ids"], run["attention_mask"]
        extra = {} if name == "gpt2" else {"position_ids": Tensor.from_data(_cache_positions(mask, ids.shape[1]))}
        want = model.forward(Tensor.from_data(ids), Tensor.from_data(mask), caches, **extra).numpy()
        np.testing.assert_allclose(got[0], want, atol=tol_ember, rtol=0, err_msg=f"{name} run {k} against Ember")


def test_an_imported_cache_export_refuses_a_mask_longer_than_the_past_and_the_new_tokens(tmp_path):
    """The mask's axis is `past_sequence + sequence` in the file: a longer mask is refused naming both sizes
    (onnxruntime refuses it too), never cut silently to the sum."""
    from engine.design import build_model  # noqa: PLC0415
    from engine.interop import import_onnx  # noqa: PLC0415

    model = _model("llama-gqa")
    path = export_onnx(model, tmp_path / "llama.onnx", with_cache=True)
    imported = import_onnx(path)
    module = build_model(imported.design).load_record(imported.record).valid()
    graph = onnx.load(str(path)).graph
    b, s, past = 2, 3, 4

    def run(mask_length):
        feeds = [Tensor.from_data(np.ones((b, s), dtype=np.int64)),
                 Tensor.from_data(np.ones((b, mask_length), dtype=np.int64))]
        for v in graph.input[2:]:
            dims = v.type.tensor_type.shape.dim
            feeds.append(Tensor.from_data(np.zeros((b, dims[1].dim_value, past, dims[3].dim_value), np.float32)))
        return module.forward(*feeds)

    run(past + s)  # the sum: runs
    with pytest.raises(Exception, match=r"must be 7, found 9"):
        run(past + s + 2)


def test_names_are_an_option_and_other_models_keep_theirs(tmp_path):
    model = _model("llama-gqa")
    path = export_onnx(model, tmp_path / "named.onnx", input_names=["ids", "mask"], output_names=["scores"])
    assert list(_dims(path)) == ["ids", "mask", "scores"]
    with pytest.raises(OnnxExportError, match=r"input_names: 2 inputs \(input_ids, attention_mask\), 1 names"):
        export_onnx(model, tmp_path / "bad.onnx", input_names=["ids"])
    fixed = export_onnx(model, tmp_path / "fixed.onnx", Tensor.zeros([1, 4], dtype="int64"), dynamic_sequence=False)
    assert _dims(fixed)["input_ids"] == ["batch", 4]


def test_a_rope_whose_frequencies_change_with_the_length_is_refused_by_name(tmp_path):
    model = _model("llama-dynamic")
    with pytest.raises(OnnxExportError, match=r"rotary.*changes with the sequence length.*dynamic_sequence=False"):
        export_onnx(model, tmp_path / "dyn.onnx")
    assert not (tmp_path / "dyn.onnx").exists()


def test_the_cache_variant_needs_a_dynamic_sequence_and_a_language_model(tmp_path):
    with pytest.raises(OnnxExportError, match="needs dynamic_sequence"):
        export_onnx(_model("gpt2"), tmp_path / "x.onnx", with_cache=True, dynamic_sequence=False)
    from engine.nn import LinearConfig  # noqa: PLC0415

    with pytest.raises(OnnxExportError, match="for language models"):
        export_onnx(LinearConfig(2, 2).init(), tmp_path / "y.onnx", Tensor.zeros([1, 2]), with_cache=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
