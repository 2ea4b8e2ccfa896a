"""save_pretrained(from_pretrained(d)): every tensor back bit for bit under the same names, the
config's keys kept, shards when asked, BF16 kept BF16; and (optional, needs transformers) a model
frozen in part, LoRA-tuned a few steps and materialized, saved and loaded by transformers, gives
Ember's outputs.

The files are read back here without Ember's reader: a safetensors file by its own format (an
8-byte length, a JSON header, the data; the raw bytes compared) and by `safetensors.numpy`, a
`pytorch_model.bin` by a small restricted unpickler of its own.

The transformers part is skipped unless torch and transformers import; run it with a Python that
has them and Ember's dependencies (the tests' conftest needs PySide6, which it does not use here):

    PYTHONPATH=. python -m pytest -p no:cacheprovider --noconftest -s tests/engine/models/test_roundtrip.py
"""
from __future__ import annotations

import json
import pickle
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

from engine import Device, ParamGroup, Tensor, optim
from engine.models import from_pretrained, pretrained_names, save_pretrained
from engine.module import Lora

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
# mixtral-fused (transformers 5's fused experts) saves in the per-expert layout transformers writes:
# test_moe checks it against the mixtral folder's bits
# the model fixtures with expected logits (qwen2-bpe is a tokenizer fixture: no expected.npz)
FOLDERS = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file() and (p / "expected.npz").is_file()
                 and p.name != "mixtral-fused")
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


# ---------------------------------------------------------------------------------- readers
def read_safetensors(where: Path) -> dict[str, tuple[str, tuple, bytes]]:
    """{name: (dtype, shape, raw bytes)} of one safetensors file, or over every *.safetensors
    file of a folder."""
    out = {}
    for f in (sorted(where.glob("*.safetensors")) if where.is_dir() else [where]):
        blob = f.read_bytes()
        n = struct.unpack("<Q", blob[:8])[0]
        head = json.loads(blob[8:8 + n])
        for name, spec in head.items():
            if name == "__metadata__":
                continue
            assert name not in out, f"{name} in two shards"
            start, end = spec["data_offsets"]
            out[name] = (spec["dtype"], tuple(spec["shape"]), blob[8 + n + start:8 + n + end])
    return out


class _BinUnpickler(pickle.Unpickler):
    """torch.save's state-dict pickle with only what such a file needs (a test-side reader)."""

    def __init__(self, fp, archive: zipfile.ZipFile, prefix: str):
        super().__init__(fp)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            def rebuild(storage, offset, size, stride, requires_grad, hooks, *rest):
                item = storage.itemsize
                return np.lib.stride_tricks.as_strided(storage[offset:], tuple(size),
                                                       tuple(s * item for s in stride)).copy()
            return rebuild
        if (module, name) == ("torch", "FloatStorage"):
            return np.float32
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed")

    def persistent_load(self, pid):
        kind, dtype, key, _location, numel = pid
        assert kind == "storage"
        data = self.archive.read(f"{self.prefix}data/{key}")
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"), count=numel)


def read_bin(path: Path) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        with z.open(pkl) as fp:
            return _BinUnpickler(fp, z, pkl[: -len("data.pkl")]).load()


def stored_tensors(folder: Path) -> dict[str, tuple[str, tuple, bytes]]:
    """What a fixture folder holds, as (dtype, shape, raw little-endian bytes) per name."""
    if (folder / "pytorch_model.bin").is_file():
        return {k: ("F32", tuple(v.shape), np.ascontiguousarray(v, "<f4").tobytes())
                for k, v in read_bin(folder / "pytorch_model.bin").items()}
    return read_safetensors(folder)


def check_with_safetensors_library(folder: Path, got: dict):
    """The files are valid for the reference library and hold what the raw reading says."""
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "np") as st:
            names = list(st.keys())
            for name in names:
                sl = st.get_slice(name)
                assert (sl.get_dtype(), tuple(sl.get_shape())) == got[name][:2], name
        if all(got[n][0] in _ST_DTYPES for n in names):
            for name, arr in safetensors.numpy.load_file(str(f)).items():
                dtype, shape, raw = got[name]
                assert arr.dtype == _ST_DTYPES[dtype] and arr.shape == shape
                assert arr.tobytes() == raw, name


# ---------------------------------------------------------------------------------- inputs
def inputs(name: str) -> dict:
    exp = np.load(FIXTURES / name / "expected.npz")
    if name == "vit":
        return {"pixel_values": exp["pixel_values"]}
    out = {"input_ids": exp["input_ids"], "attention_mask": exp["attention_mask"]}
    if name == "bert":
        out["token_type_ids"] = exp["token_type_ids"]
    return out


def ember_forward(model, name: str, train: bool = False) -> Tensor:
    """The model's output on the fixture's inputs; in validation mode (transformers' eval(): no
    dropout) unless `train`."""
    model = model if train else model.valid()
    return model.forward(**{k: Tensor.from_data(v) for k, v in inputs(name).items()})


# ---------------------------------------------------------------------------------- (a) always run
@pytest.mark.parametrize("touched", [False, True], ids=["untouched", "after-forward"])
@pytest.mark.parametrize("name", FOLDERS)
def test_save_gives_back_every_tensor_bit_for_bit(name, touched, tmp_path):
    """Untouched, a parameter is copied from its file; after a forward pass every value goes
    through the inverse transforms (transpose, rope permutation, fused q/k/v concatenation,
    BF16 narrowing): both must give the stored bits back."""
    source = FIXTURES / name
    model = from_pretrained(source)
    if touched:
        ember_forward(model, name)
        for _, p in model.named_params():  # what the forward did not use (BERT's pooler) read too
            p.val()
        assert all(p.is_initialized() for _, p in model.named_params())
    else:
        assert not any(p.is_initialized() for _, p in model.named_params())
    out = save_pretrained(model, tmp_path / "out")
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    want, got = stored_tensors(source), read_safetensors(out)
    assert sorted(got) == sorted(want)  # the same names, none added, none lost
    for k, (dtype, shape, raw) in want.items():
        assert got[k][:2] == (dtype, shape), k
        assert got[k][2] == raw, f"{k}: the bytes differ"
    check_with_safetensors_library(out, got)
    # config.json: every key kept with its value
    c_in = json.loads((source / "config.json").read_text())
    c_out = json.loads((out / "config.json").read_text())
    assert {k: c_out.get(k) for k in c_in} == c_in
    # and the saved folder opens again to the same outputs
    again = ember_forward(from_pretrained(out), name).numpy()
    np.testing.assert_allclose(again, ember_forward(model, name).numpy(), rtol=0, atol=1e-6)


def test_bin_fixture_is_read_independently():
    """The test's own .bin reader agrees with the fixture's documented shapes (so the .bin
    comparison above compares against real arrays)."""
    arrays = read_bin(FIXTURES / "llama-bin" / "pytorch_model.bin")
    assert arrays["model.embed_tokens.weight"].shape == (128, 48)
    assert arrays["model.layers.0.self_attn.k_proj.weight"].shape == (16, 48)
    assert float(np.abs(arrays["model.layers.0.self_attn.q_proj.weight"]).max()) > 0.1


@pytest.mark.parametrize("name", ["llama-gqa", "llama-sharded", "gpt2", "llama-bf16"])
def test_small_max_shard_size_writes_shards_and_an_index(name, tmp_path):
    source = FIXTURES / name
    model = from_pretrained(source)
    limit = 16_000
    out = save_pretrained(model, tmp_path / "out", max_shard_size=limit)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) >= 3 and "model.safetensors" not in shards
    n = len(shards)
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    want, got = stored_tensors(source), read_safetensors(out)
    assert sorted(got) == sorted(want) == sorted(index["weight_map"])
    for k, (dtype, shape, raw) in want.items():
        assert got[k] == (dtype, shape, raw), k
    assert index["metadata"]["total_size"] == sum(len(v[2]) for v in want.values())
    for shard in shards:  # each tensor listed where it is, each shard within the limit (or one tensor)
        inside = read_safetensors(out / shard)
        assert all(index["weight_map"][k] == shard for k in inside)
        assert sum(len(v[2]) for v in inside.values()) <= limit or len(inside) == 1
    check_with_safetensors_library(out, got)
    np.testing.assert_allclose(ember_forward(from_pretrained(out), name).numpy(),
                               ember_forward(model, name).numpy(), rtol=0, atol=1e-6)


def test_sharded_in_single_out_and_a_resave_leaves_no_stale_shards(tmp_path):
    source = FIXTURES / "llama-sharded"
    assert len(list(source.glob("model-*.safetensors"))) == 4
    model = from_pretrained(source)
    out = tmp_path / "out"
    save_pretrained(model, out, max_shard_size=16_000)
    assert len(list(out.glob("model-*.safetensors"))) >= 3
    save_pretrained(model, out)  # default size: one file; the earlier shards and index must go
    assert sorted(p.name for p in out.glob("model*")) == ["model.safetensors"]
    assert read_safetensors(out) == read_safetensors(source)


def test_bf16_stays_bf16(tmp_path):
    source = FIXTURES / "llama-bf16"
    model = from_pretrained(source)
    ember_forward(model, "llama-bf16")  # values widened to float32 in the model
    out = save_pretrained(model, tmp_path / "out")
    got = read_safetensors(out)
    assert {v[0] for v in got.values()} == {"BF16"}
    assert got == read_safetensors(source)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    # asked for float32, the same values widened exactly: the upper 16 bits are the BF16 bits
    wide = read_safetensors(save_pretrained(model, tmp_path / "f32", dtype="float32"))
    for k, (dtype, shape, raw) in got.items():
        assert wide[k][:2] == ("F32", shape)
        hi = (np.frombuffer(wide[k][2], "<u4") >> 16).astype("<u2")
        assert hi.tobytes() == raw and not (np.frombuffer(wide[k][2], "<u4") & 0xFFFF).any(), k


# ---------------------------------------------------------------------------------- (b) fine-tune, export
_LAYER0 = r"(^|\.)(layers|layer|h)\.0\."
_LAYER1_NORMS = r"(^|\.)(layers|layer|h)\.1\.(.*\.)?(?i:[a-z_]*norm[a-z_]*|ln_\d)\."
_QV = r"\.(query|value)\.weight$"


def fine_tune(name: str, steps: int = 3):
    """Open `name`, freeze layer 0, LoRA (rank 4) on the query/value weights of the other layers,
    the last layer's norms trained directly, a few Adam steps on a squared error, materialize().
    Returns (source model, tuned model before materialize, materialized model)."""
    Device("cpu").seed(19)
    model = from_pretrained(FIXTURES / name)
    qv_rest = ParamGroup.from_regex(_QV).exclude(ParamGroup.from_regex(_LAYER0))
    tuned = model.freeze_group(ParamGroup.from_regex(_LAYER0)).apply_lora(Lora(4, 8.0, param_group=qv_rest))
    tuned = tuned.set_require_grad_group(ParamGroup.from_regex(_LAYER1_NORMS), True)
    target = None
    opt = optim.AdamConfig().init()
    for _ in range(steps):
        out = ember_forward(tuned, name, train=True)
        if target is None:
            rng = np.random.default_rng(7)
            target = Tensor.from_data(rng.normal(size=out.shape).astype(np.float32))
        diff = out - target
        loss = (diff * diff).mean()
        tuned = opt.step(0.02, tuned, optim.GradientsParams.from_grads(loss.backward(), tuned))
    return model, tuned, tuned.materialize()


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "bert", "vit"])
def test_fine_tuned_export_keeps_frozen_tensors_and_changes_the_tuned_ones(name, tmp_path):
    model, tuned, merged = fine_tune(name)
    params = dict(tuned.named_params())
    loras = [p for path, p in params.items() if path.endswith(".lora.b")]
    assert loras and not any(re.search(_LAYER0, path) for path in params if ".lora." in path)
    assert any(np.abs(p.val().numpy()).max() > 0 for p in loras)  # b starts at zero: training moved it
    assert not any(p.reparameterization is not None for _, p in merged.named_params())
    out = save_pretrained(merged, tmp_path / "out")
    src, got = stored_tensors(FIXTURES / name), read_safetensors(out)
    assert sorted(got) == sorted(src)
    names = pretrained_names(model)
    layer0 = {names[p] for p in names if re.search(_LAYER0, p)}
    tuned_names = {names[p] for p in names if re.search(_QV, p) and not re.search(_LAYER0, p)}
    norms = {names[p] for p in names if re.search(_LAYER1_NORMS, p)}
    assert layer0 and tuned_names and norms
    for k in layer0 - tuned_names:  # frozen, untouched: the stored bits
        assert got[k] == src[k], k
    for k in tuned_names | norms:
        assert got[k][:2] == src[k][:2] and got[k][2] != src[k][2], f"{k} did not change"
    np.testing.assert_allclose(ember_forward(from_pretrained(out), name).numpy(),
                               ember_forward(merged, name).numpy(), rtol=0, atol=1e-5)


TRANSFORMERS_FAMILIES = ["llama-gqa", "llama-tied", "llama3-rope", "llama-bf16", "mistral", "qwen2", "qwen2-tied",
                         "gpt2", "bert", "vit"]


@pytest.mark.parametrize("name", TRANSFORMERS_FAMILIES)
def test_transformers_loads_the_fine_tuned_export(name, tmp_path, record_property):
    """Optional: transformers (with torch) opens the exported folder and gives Ember's outputs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, _, merged = fine_tune(name)
    out = save_pretrained(merged, tmp_path / "out")
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    hf = getattr(transformers, arch).from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        result = hf(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs(name).items()})
    theirs = (result.last_hidden_state if name == "bert" else result.logits).numpy()
    reopened = ember_forward(from_pretrained(out), name).numpy()
    diff = float(np.abs(reopened - theirs).max())
    record_property("max_abs_diff", diff)
    ours = float(np.abs(ember_forward(merged, name).numpy() - theirs).max())
    print(f"\n{name}: transformers {arch} on the exported folder vs Ember: max |diff| = {diff:.3g} "
          f"(Ember reopening the folder), {ours:.3g} (the tuned model in memory)")
    assert diff <= 1e-4
    if name != "llama-bf16":  # the float32 export holds the tuned values exactly (BF16 rounds them)
        assert ours <= 1e-4
    # the tuning is visible: the outputs moved away from the source model's
    assert float(np.abs(theirs - np.load(FIXTURES / name / "expected.npz")[
        "last_hidden_state" if name == "bert" else "logits"]).max()) > 1e-3
