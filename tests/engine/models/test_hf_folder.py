"""open_checkpoint (engine/models/hf_folder.py): Hugging Face folders read lazily and exactly,
and every bad folder, index, shard or file a clear PretrainedError naming the file and tensor.

Tensors are checked against independent readers: `safetensors.numpy` for F32 files, a plain
header parse for BF16 ones (NumPy has no bfloat16), and torch's own reading of the committed
.bin fixtures (tests/fixtures/torch_pickle/, made by torch.save)."""
import json
import random
import shutil
import struct
import time
import types
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as stn

from engine.models import from_pretrained, hf_folder
from engine.store import json_file
from engine.models.hf_folder import PretrainedError, StoredTensor, open_checkpoint
from engine.store import RecordError, filesource
from engine.store.burnpack import MAX_TENSORS

from tests.limits import capped_memory
from tests.work import counted_calls

from .json_fuzz import mutate_json

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
TP = Path(__file__).resolve().parents[2] / "fixtures" / "torch_pickle"
SAFETENSORS_FOLDERS = sorted(p.name for p in HF.iterdir() if (p / "model.safetensors").exists())


def _raw_safetensors(path: Path) -> dict:
    """name -> (dtype, shape, bytes): the file's header parsed by hand, as the format says."""
    blob = path.read_bytes()
    (n,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"]), blob[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


@pytest.mark.parametrize("name", SAFETENSORS_FOLDERS)
def test_every_tensor_of_a_single_file_folder_is_what_the_file_holds(name):
    folder = HF / name
    raw = _raw_safetensors(folder / "model.safetensors")
    with open_checkpoint(folder) as ckpt:
        assert ckpt.config == json.loads((folder / "config.json").read_text())
        assert ckpt.files == [folder / "model.safetensors"]
        assert set(ckpt.tensors) == set(raw)
        for tname, t in ckpt.tensors.items():
            dtype, shape, data = raw[tname]
            assert isinstance(t, StoredTensor) and t.name == tname and t.file == folder / "model.safetensors"
            assert t.shape == shape and t.nbytes == len(data)
            stored = t.read_stored()
            assert stored.shape == shape and stored.tobytes() == data  # bit for bit
            value = t.read()
            assert value.dtype == np.float32 and value.flags.writeable and value.flags.c_contiguous
            if dtype == "F32":
                assert t.dtype == "F32"
            else:
                assert dtype == "BF16" and t.dtype == "BF16" and stored.dtype == np.uint16
                # exact widening: the bf16 bits are float32's upper 16 bits
                np.testing.assert_array_equal(value.view(np.uint32), stored.astype(np.uint32) << 16)
        if all(d == "F32" for d, _, _ in raw.values()):
            ref = stn.load_file(str(folder / "model.safetensors"))
            for tname, t in ckpt.tensors.items():
                np.testing.assert_array_equal(t.read(), ref[tname])


def test_a_bf16_folder():
    with open_checkpoint(HF / "llama-bf16") as ckpt:
        assert {t.dtype for t in ckpt.tensors.values()} == {"BF16"}
        w = ckpt.tensors["model.embed_tokens.weight"].read()
        assert w.dtype == np.float32 and not np.all(w.view(np.uint32) & 0xFFFF)  # low halves zero


def test_a_sharded_folder():
    folder = HF / "llama-sharded"
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    with open_checkpoint(folder) as ckpt:
        assert [f.name for f in ckpt.files] == shards and len(shards) == 4
        assert set(ckpt.tensors) == set(index)
        refs = {s: stn.load_file(str(folder / s)) for s in shards}
        for tname, t in ckpt.tensors.items():
            assert t.file.name == index[tname]
            np.testing.assert_array_equal(t.read(), refs[index[tname]][tname])
    # the same names as the single-file folder of the same architecture
    with open_checkpoint(HF / "llama-gqa") as single:
        assert {n: t.shape for n, t in single.tensors.items()} == {n: t.shape for n, t in ckpt.tensors.items()}


def test_a_pytorch_model_bin_folder():
    with open_checkpoint(HF / "llama-bin") as ckpt, open_checkpoint(HF / "llama-gqa") as same_arch:
        assert ckpt.files == [HF / "llama-bin" / "pytorch_model.bin"]
        assert {n: (t.dtype, t.shape) for n, t in ckpt.tensors.items()} == \
               {n: (t.dtype, t.shape) for n, t in same_arch.tensors.items()}
        for t in ckpt.tensors.values():
            v = t.read()
            assert v.shape == t.shape and v.dtype == np.float32 and np.isfinite(v).all()


def test_a_sharded_bin_folder_equals_what_torch_reads():
    folder = TP / "sharded_bin"
    data = np.load(folder / "expected.npz")
    dtypes = json.loads(str(data["__dtypes__"]))
    with open_checkpoint(folder) as ckpt:
        assert [f.name for f in ckpt.files] == ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
        assert set(ckpt.tensors) == set(dtypes)
        for name, t in ckpt.tensors.items():
            assert t.dtype == dtypes[name]
            assert t.read_stored().tobytes() == data[name].tobytes(), name
        bits = data["norm.weight"]
        np.testing.assert_array_equal(ckpt.tensors["norm.weight"].read(), (bits.astype(np.uint32) << 16).view(np.float32))
        # layers.1.weight was saved as a transposed view: read as torch gives it
        assert ckpt.tensors["layers.1.weight"].read().tobytes() == data["layers.1.weight"].tobytes()


def test_opening_reads_headers_only(monkeypatch):
    reads = []
    for meth in ("read_array", "read_arrays"):
        real = getattr(filesource.FileSource, meth)
        monkeypatch.setattr(filesource.FileSource, meth,
                            lambda self, *a, _real=real, _m=meth: (reads.append(_m), _real(self, *a))[1])
    for name in ("llama-sharded", "llama-bin", "llama-gqa"):
        with open_checkpoint(HF / name) as ckpt:
            assert reads == []
            next(iter(ckpt.tensors.values())).read()
            assert reads == ["read_array"]  # one tensor, one read
            reads.clear()


def test_a_closed_checkpoint_and_a_changed_file_are_errors(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(HF / "llama-gqa", folder)
    ckpt = open_checkpoint(folder)
    t = ckpt.tensors["model.norm.weight"]
    with open(folder / "model.safetensors", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(PretrainedError, match="changed since it was opened") as err:
        t.read()
    assert err.value.where == str(folder / "model.safetensors")
    ckpt.close()
    with pytest.raises(PretrainedError, match="closed"):
        t.read()


# ----------------------------------------------------------------------------- bad folders
def _copy(tmp_path, name="llama-gqa") -> Path:
    dst = tmp_path / name
    shutil.copytree(HF / name, dst)
    return dst


def _raises(folder, match, where=None):
    with pytest.raises(PretrainedError, match=match) as err:
        open_checkpoint(folder)
    assert isinstance(err.value, RecordError)
    if where is not None:
        assert err.value.where == str(where), err.value.where
    return err.value


def test_missing_folder_and_a_file(tmp_path):
    _raises(tmp_path / "nope", "no such folder")
    (tmp_path / "f.txt").write_text("x")
    _raises(tmp_path / "f.txt", "found a file")


def test_a_folder_name_too_long_is_a_pretrained_error(tmp_path):
    """A 5,000-character path gave OSError: File name too long."""
    long = tmp_path / ("a" * 5000)
    for open_folder in (open_checkpoint, from_pretrained):
        with pytest.raises(PretrainedError, match="cannot read: File name too long"):
            open_folder(long)


def test_a_folder_without_config_json_says_what_it_holds(tmp_path):
    folder = _copy(tmp_path)
    (folder / "config.json").unlink()
    err = _raises(folder, r"no config.json in the folder", where=folder)
    assert "model.safetensors" in str(err) and "expected.npz" in str(err)


@pytest.mark.parametrize("text, match", [
    ("{not json", "config.json: not valid JSON"),
    ("[1, 2]", "a JSON object expected, found list"),
    ("NaN", "not valid JSON"),
    ('"text"', "a JSON object expected, found str"),
])
def test_a_config_json_that_is_not_a_json_object(tmp_path, text, match):
    folder = _copy(tmp_path)
    (folder / "config.json").write_text(text)
    _raises(folder, match, where=folder / "config.json")


def test_no_weights_file_names_what_was_looked_for(tmp_path):
    folder = _copy(tmp_path)
    (folder / "model.safetensors").unlink()
    err = _raises(folder, "no weights file: looked for model.safetensors, model.safetensors.index.json, "
                          "pytorch_model.bin, pytorch_model.bin.index.json", where=folder)
    assert "config.json" in str(err)


def _sharded(tmp_path) -> tuple[Path, dict]:
    folder = _copy(tmp_path, "llama-sharded")
    return folder, json.loads((folder / "model.safetensors.index.json").read_text())


def _write_index(folder, doc):
    (folder / "model.safetensors.index.json").write_text(json.dumps(doc))


def test_a_missing_shard(tmp_path):
    folder, doc = _sharded(tmp_path)
    (folder / "model-00003-of-00004.safetensors").unlink()
    err = _raises(folder, r"shard 'model-00003-of-00004.safetensors' \(holding '.+'.*\) does not exist",
                  where=folder / "model.safetensors.index.json")
    assert str(folder) in str(err)


def test_a_name_in_the_index_that_its_shard_lacks(tmp_path):
    folder, doc = _sharded(tmp_path)
    doc["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00002-of-00004.safetensors"
    _write_index(folder, doc)
    _raises(folder, r"tensor 'model.layers.9.mlp.up_proj.weight': model.safetensors.index.json says it is in "
                    r"model-00002-of-00004.safetensors, which does not hold it",
            where=folder / "model-00002-of-00004.safetensors")


def test_a_tensor_in_a_shard_but_not_in_the_index(tmp_path):
    folder, doc = _sharded(tmp_path)
    name = next(n for n, s in doc["weight_map"].items() if s == "model-00001-of-00004.safetensors")
    del doc["weight_map"][name]
    _write_index(folder, doc)
    _raises(folder, f"tensor '{name}' is in model-00001-of-00004.safetensors but not in "
                    f"model.safetensors.index.json's weight_map", where=folder / "model-00001-of-00004.safetensors")


def test_a_tensor_in_two_shards(tmp_path):
    folder, doc = _sharded(tmp_path)
    wm = doc["weight_map"]
    a = next(n for n, s in wm.items() if s == "model-00001-of-00004.safetensors")
    # shard 2 gets a copy of a tensor of shard 1
    shard2 = folder / "model-00002-of-00004.safetensors"
    tensors = stn.load_file(str(shard2))
    tensors[a] = stn.load_file(str(folder / "model-00001-of-00004.safetensors"))[a]
    stn.save_file(tensors, str(shard2))
    _raises(folder, f"tensor '{a}' is in model-00002-of-00004.safetensors and in model-00001-of-00004.safetensors",
            where=shard2)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "a/../../x.safetensors",
                                   "C:\\\\x.safetensors", "..\\\\x.safetensors", "", 7, None])
def test_shard_paths_that_leave_the_folder(tmp_path, shard):
    folder, doc = _sharded(tmp_path)
    (tmp_path / "outside.safetensors").write_bytes((folder / "model-00001-of-00004.safetensors").read_bytes())
    name = next(iter(doc["weight_map"]))
    doc["weight_map"][name] = shard
    _write_index(folder, doc)
    err = _raises(folder, rf"weight_map\['{name}'\]: ", where=folder / "model.safetensors.index.json")
    assert "outside the folder" in str(err) or "a shard file name expected" in str(err)


@pytest.mark.parametrize("shard, match", [
    ("a" * 5000 + ".safetensors", r"a shard file name of at most 255 bytes expected, found one of 5012 bytes"),
    ("sub/model.safetensors", r"a shard file name expected \(a file directly in "),
    ("model\x00.safetensors", r"a shard file name expected"),
    (".", r"a shard file name expected"),
])
def test_shard_names_that_are_not_file_names_in_the_folder(tmp_path, shard, match):
    """A 5,000-character name gave OSError: File name too long."""
    folder, doc = _sharded(tmp_path)
    (folder / "sub").mkdir()
    name = next(iter(doc["weight_map"]))
    doc["weight_map"][name] = shard
    _write_index(folder, doc)
    _raises(folder, rf"weight_map\['{name}'\]: {match}", where=folder / "model.safetensors.index.json")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [65, 900, 100_000])
def test_json_nested_too_deep_is_refused_whatever_the_parser_would_take(tmp_path, depth):
    """config.json and the index nest a few levels; 100,000 levels ended in RecursionError inside
    the parser, 900 parsed and waited for the next recursive walk (json.dumps on save)."""
    folder = _copy(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config)[:-1] + ', "x": ' + _nested(depth) + "}")
    _raises(folder, "config.json: nested deeper than 64 levels", where=folder / "config.json")
    (folder / "config.json").write_text(json.dumps(config)[:-1] + ', "x": ' + _nested(63) + "}")
    with open_checkpoint(folder) as ckpt:
        assert len(ckpt.tensors) > 0
    folder, doc = _sharded(tmp_path / "s")
    text = json.dumps(doc)
    _write_index(folder, doc)
    (folder / "model.safetensors.index.json").write_text(text[:-1] + ', "x": ' + _nested(depth) + "}")
    _raises(folder, "the index: nested deeper than 64 levels",
            where=folder / "model.safetensors.index.json")


def _index_of(n: int) -> dict:
    return {"metadata": {}, "weight_map": {f"model.layers.{i}.w": "model-00001-of-00001.safetensors"
                                           for i in range(n)}}


@pytest.mark.parametrize("n", [2 * MAX_TENSORS + 1000, pytest.param(1_000_000, marks=pytest.mark.long)])
def test_an_index_of_more_names_than_the_limit_is_refused_before_parsing(tmp_path, monkeypatch, n):
    """An index of 1,000,000 names took 8.3 s and 473 MB (parsed, then each name's shard path
    checked); it is refused from a byte count, without parsing, in bounded memory."""
    folder, _ = _sharded(tmp_path)
    _write_index(folder, _index_of(n))
    parsed = []
    monkeypatch.setattr(json_file, "json", types.SimpleNamespace(
        loads=lambda text, **kw: parsed.append(len(text)) or json.loads(text, **kw)))
    with capped_memory():
        _raises(folder, rf"at most {MAX_TENSORS} tensors expected, found {n + 2} ':' separators "
                        r"\(refused before parsing\)", where=folder / "model.safetensors.index.json")
    assert parsed == [(folder / "config.json").stat().st_size]  # config.json only


def test_the_tensor_count_of_an_index_is_checked_before_its_names(tmp_path, monkeypatch):
    """Past the byte count, the parsed weight_map's size is checked before any name: each
    shard's name is checked once, not once a tensor."""
    folder, doc = _sharded(tmp_path)
    monkeypatch.setattr(hf_folder, "MAX_TENSORS", 1000)
    _write_index(folder, _index_of(1001))
    _raises(folder, r"'weight_map' names 1001 tensors, more than the limit of 1000")
    checked = []
    real = hf_folder._shard_path
    monkeypatch.setattr(hf_folder, "_shard_path", lambda *a: checked.append(a[1]) or real(*a))
    _write_index(folder, doc)
    with open_checkpoint(folder) as ckpt:
        assert len(ckpt.tensors) == len(doc["weight_map"]) > 4
    assert sorted(checked) == sorted(set(doc["weight_map"].values())) and len(checked) == 4


@pytest.mark.parametrize("doc, match", [
    ([], "a JSON object expected, found list"),
    ({}, "a 'weight_map' object .* expected, found none"),
    ({"weight_map": []}, "a 'weight_map' object .* expected, found list"),
    ({"weight_map": {}}, "names no tensors"),
])
def test_index_files_that_are_not_indexes(tmp_path, doc, match):
    folder, _ = _sharded(tmp_path)
    _write_index(folder, doc)
    _raises(folder, match, where=folder / "model.safetensors.index.json")


def test_truncated_files(tmp_path):
    folder = _copy(tmp_path)
    path = folder / "model.safetensors"
    blob = path.read_bytes()
    path.write_bytes(blob[:-100])
    _raises(folder, "truncated: tensor .* ends at data byte", where=path)
    path.write_bytes(blob[:5])
    _raises(folder, "too short for safetensors", where=path)
    path.write_bytes(b"")
    _raises(folder, "the file is empty", where=path)
    folder = _copy(tmp_path, "llama-bin")
    path = folder / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[:-3000])
    _raises(folder, "not a readable PyTorch zip checkpoint \\(truncated or damaged\\)", where=path)


def test_sizes_that_do_not_fit(tmp_path):
    folder = _copy(tmp_path)
    path = folder / "model.safetensors"
    blob = bytearray(path.read_bytes())
    (n,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8:8 + n])
    name = "model.norm.weight"
    header[name]["shape"] = [header[name]["shape"][0] + 1]
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (n - len(new))
    assert len(new) == n
    blob[8:8 + n] = new
    path.write_bytes(bytes(blob))
    _raises(folder, rf"tensor '{name}': shape \[49\] of F32 needs 196 bytes, data_offsets .* hold 192", where=path)


# ----------------------------------------------------------------------------- fuzz
# the calls one case may make (3,583 at most measured): a reader that loops over a count the
# files claim goes far past it, however fast or busy the machine (a count, not a time bound)
CASE_CALLS = 50_000


def _check(folder, counts):
    try:
        with counted_calls() as calls, capped_memory():
            with open_checkpoint(folder) as ckpt:
                for t in ckpt.tensors.values():
                    t.read()
        counts["accepted"] += 1
    except PretrainedError:
        counts["rejected"] += 1
    counts["most calls"] = max(counts.get("most calls", 0), calls.n)
    assert calls.n < CASE_CALLS, f"a case made {calls.n} calls"


ODD = [None, True, -1, 0, 2 ** 64, 2 ** 63 - 1, 1.5, "", "x", "../x.safetensors", "/abs", [], {}, [1, 2],
       {"a": 1}, "model-00001-of-00004.safetensors", [2 ** 62, 2 ** 62], [0, 2 ** 64 - 1], "BF16", "F64", "BOOL"]


def _leaf(value, rng: random.Random):
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return value + rng.choice([-1, 1, 4, -4, 2 ** 32, 2 ** 63])
    return rng.choice(ODD)


def _mutate_json(value, rng: random.Random):
    return mutate_json(value, rng, ODD, ["", "x", ".weight"], _leaf)


def test_fuzzed_safetensors_headers(tmp_path):
    """Seeded: bit flips in the length and header, structural edits of the header JSON (dtypes,
    shapes, offsets, names) and truncations; every case a PretrainedError or a clean read."""
    base = _copy(tmp_path)
    path = base / "model.safetensors"
    seed = path.read_bytes()
    (n,) = struct.unpack_from("<Q", seed)
    header = json.loads(seed[8:8 + n])
    data = seed[8 + n:]
    rng = random.Random(19)
    counts = {"accepted": 0, "rejected": 0}
    cases = 200
    for case in range(cases):
        kind = case % 4
        if kind == 0:
            b = bytearray(seed)
            for _ in range(rng.randint(1, 6)):
                b[rng.randrange(8 + n)] ^= 1 << rng.randrange(8)
            blob = bytes(b)
        elif kind in (1, 2):
            h = header
            for _ in range(rng.randint(1, 3)):
                h = _mutate_json(h, rng)
            text = json.dumps(h).encode() if not isinstance(h, float) or h == h else b"NaN"
            blob = struct.pack("<Q", len(text)) + text + data
        else:
            blob = seed[: rng.randrange(len(seed))]
        path.write_bytes(blob)
        _check(base, counts)
    assert counts["rejected"] > cases // 2
    print(f"\nsafetensors header fuzz: {cases} cases, {counts['rejected']} PretrainedError, {counts['accepted']} read, "
          f"the most calls in a case {counts['most calls']}")


def test_fuzzed_index_files(tmp_path):
    folder, doc = _sharded(tmp_path)
    seed = (folder / "model.safetensors.index.json").read_bytes()
    rng = random.Random(1919)
    counts = {"accepted": 0, "rejected": 0}
    cases = 150
    for case in range(cases):
        if case % 3 == 0:
            b = bytearray(seed)
            for _ in range(rng.randint(1, 6)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            blob = bytes(b)
        else:
            d = doc
            for _ in range(rng.randint(1, 3)):
                d = _mutate_json(d, rng)
            blob = json.dumps(d).encode()
        (folder / "model.safetensors.index.json").write_bytes(blob)
        _check(folder, counts)
    assert counts["rejected"] > cases // 2
    print(f"\nindex fuzz: {cases} cases, {counts['rejected']} PretrainedError, {counts['accepted']} read, "
          f"the most calls in a case {counts['most calls']}")


# ----------------------------------------------------------------------------- against torch (optional)
def test_bin_folders_against_torch(tmp_path):
    """Optional: the llama-bin fixture and a freshly saved sharded .bin folder read as torch reads them."""
    torch = pytest.importorskip("torch")
    ref = torch.load(HF / "llama-bin" / "pytorch_model.bin", weights_only=True)
    with open_checkpoint(HF / "llama-bin") as ckpt:
        assert list(ckpt.tensors) == list(ref)
        for name, t in ref.items():
            assert ckpt.tensors[name].read().tobytes() == t.contiguous().numpy().tobytes(), name
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    g = torch.Generator().manual_seed(3)
    parts = [{"a": torch.randn(3, 4, generator=g).t(), "b": torch.randn(5, generator=g).to(torch.bfloat16)},
             {"c": torch.randn(2, 2, 2, generator=g, dtype=torch.float64).permute(1, 2, 0)}]
    wm = {}
    for i, sd in enumerate(parts):
        torch.save(sd, folder / f"p{i}.bin")
        wm.update({k: f"p{i}.bin" for k in sd})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": wm}))
    with open_checkpoint(folder) as ckpt:
        for sd in parts:
            for name, t in sd.items():
                want = t.contiguous() if t.dtype == torch.float64 else t.float().contiguous()  # read() widens
                assert ckpt.tensors[name].read().tobytes() == want.numpy().tobytes(), name
