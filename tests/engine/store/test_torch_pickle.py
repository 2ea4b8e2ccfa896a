"""Reading torch.save zip checkpoints without running code (engine/store/torch_pickle.py), and
ModuleRecord.load of `.bin` / `.pt` files through it.

The committed fixtures under tests/fixtures/torch_pickle/ were written by torch 2.13 (see
make_torch_pickle_fixtures.py); their .npz files hold what torch itself reads back, as stored
bits, so these tests check Ember's reader against torch without torch installed. Hostile
pickles are built here with the standard library's pickler and by hand with pickle opcodes."""
import collections
import io
import json
import os
import pickle
import random
import re
import struct
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn
from engine.module import Module
from engine.store import ModuleRecord, PyTorchAdapter, RecordError
from engine.store import filesource, torch_pickle
from engine.store.torch_pickle import TorchZip

from tests.limits import capped_memory
from tests.work import counted_calls

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "torch_pickle"
STATE_DICT = FIXTURES / "state_dict.bin"
CONV1D = FIXTURES / "gpt2_conv1d.bin"


def _expected(npz_path):
    data = np.load(npz_path)
    dtypes = json.loads(str(data["__dtypes__"]))
    return {name: data[name] for name in dtypes}, dtypes


# ----------------------------------------------------------------------------- fixtures
def test_every_tensor_equals_what_torch_reads_bit_for_bit():
    expected, dtypes = _expected(FIXTURES / "state_dict.npz")
    with TorchZip(STATE_DICT) as z:
        assert list(z.tensors) == list(expected)  # the state dict's order
        for name, t in z.tensors.items():
            assert t.dtype == dtypes[name], name
            assert t.shape == expected[name].shape, name
            got = t.read_stored()
            assert got.flags.c_contiguous and got.flags.writeable, name
            assert got.dtype == expected[name].dtype and got.tobytes() == expected[name].tobytes(), name
    # the views saved without .contiguous() really are views in the file
    with TorchZip(STATE_DICT) as z:
        t = z.tensors
        assert t["f32.transposed"].stride == (1, 5) and t["f32.sliced"].offset == 11
        assert t["f32.expanded"].stride == (0, 1) and t["f32.permuted"].stride == (1, 12, 4)
        assert len({t[n].storage for n in ("f32.transposed", "f32.sliced", "f32.row", "f32.base",
                                           "f32.every_other")}) == 1  # one storage, five tensors
        assert t["bf16.transposed"].storage == t["bf16"].storage


def test_module_record_load_reads_a_bin_state_dict():
    expected, dtypes = _expected(FIXTURES / "state_dict.npz")
    rec = ModuleRecord.load(STATE_DICT)
    assert rec.names() == list(expected)
    assert rec.source == str(STATE_DICT)
    for name in rec.names():
        e = rec[name]
        assert e.dtype == dtypes[name]
        assert e.array.tobytes() == expected[name].tobytes(), name
    # BF16 entries hold the bits; values() widens them exactly
    bits = expected["bf16"]
    np.testing.assert_array_equal(rec["bf16"].values(), (bits.astype(np.uint32) << 16).view(np.float32))


def test_a_pt_path_and_other_archive_names(tmp_path):
    # torch names the archive's folder after the file; any single top folder is accepted
    src = tmp_path / "weights.pt"
    _repack(STATE_DICT, src, rename=lambda n: "weights/" + n.split("/", 1)[1])
    expected, _ = _expected(FIXTURES / "state_dict.npz")
    rec = ModuleRecord.load(src)
    assert rec["f32.sliced"].array.tobytes() == expected["f32.sliced"].tobytes()


def test_a_burnpack_named_bin_still_loads(tmp_path):
    rec = ModuleRecord.load(STATE_DICT)
    path = rec.save(tmp_path / "model.bin")  # record.save writes burnpack whatever the extension
    assert path.read_bytes()[:4] == b"NRUB"
    assert ModuleRecord.load(path).names() == rec.names()


def test_the_file_is_not_needed_after_module_record_load(tmp_path):
    path = tmp_path / "m.bin"
    path.write_bytes(STATE_DICT.read_bytes())
    rec = ModuleRecord.load(path)
    path.unlink()
    expected, _ = _expected(FIXTURES / "state_dict.npz")
    assert rec["f32.base"].array.tobytes() == expected["f32.base"].tobytes()


def test_opening_reads_no_tensor_and_each_read_reads_only_its_view(monkeypatch):
    calls = []
    real = filesource.FileSource.read_array

    def counting(self, offset, dtype, count):
        calls.append((offset, np.dtype(dtype).itemsize * count))
        return real(self, offset, dtype, count)

    monkeypatch.setattr(filesource.FileSource, "read_array", counting)
    with TorchZip(STATE_DICT) as z:
        assert calls == []  # the zip directory and the pickle only
        z.tensors["f32.sliced"].read_stored()
        assert calls == [(calls[0][0], (2 * 5 + 3) * 4)]  # rows 2..4, columns 1..3: 13 elements, not 30
        z.tensors["f32.expanded"].read_stored()
        assert calls[1][1] == 3 * 4  # an expanded [4, 3] view reads its 3 stored elements


def test_a_tensor_read_after_the_file_changed_is_an_error(tmp_path):
    path = tmp_path / "m.bin"
    path.write_bytes(STATE_DICT.read_bytes())
    z = TorchZip(path)
    with open(path, "r+b") as f:
        f.seek(0, 2)
        f.write(b"\0" * 16)
    with pytest.raises(RecordError, match="changed since it was opened"):
        z.tensors["f32"].read_stored()
    z.close()


# ----------------------------------------------------------------------------- GPT-2 Conv1D
class _Attn(Module):
    def __init__(self, d):
        self.c_attn = nn.LinearConfig(d, 3 * d).init()
        self.c_proj = nn.LinearConfig(d, d).init()


class _Mlp(Module):
    def __init__(self, d):
        self.c_fc = nn.LinearConfig(d, 4 * d).init()
        self.c_proj = nn.LinearConfig(4 * d, d).init()


class _Block(Module):
    def __init__(self, d):
        self.attn = _Attn(d)
        self.mlp = _Mlp(d)
        self.head = nn.LinearConfig(d, 5).init()


class _GPT2ish(Module):
    def __init__(self, d=8):
        self.h = [_Block(d)]


def _outputs(model, data):
    x, x4 = Tensor.from_data(data["x"]), Tensor.from_data(data["x_4d"])
    blk = model.h[0]
    return {"out.h.0.attn.c_attn": blk.attn.c_attn.forward(x), "out.h.0.attn.c_proj": blk.attn.c_proj.forward(x),
            "out.h.0.mlp.c_fc": blk.mlp.c_fc.forward(x), "out.h.0.mlp.c_proj": blk.mlp.c_proj.forward(x4),
            "out.h.0.head": blk.head.forward(x)}


@pytest.mark.parametrize("path", [CONV1D, CONV1D.with_suffix(".safetensors")], ids=["bin", "safetensors"])
def test_gpt2_conv1d_weights_load_untransposed(path):
    """transformers' Conv1D stores [in, out]: the PyTorch adapter keeps GPT-2's c_attn / c_proj /
    c_fc untransposed (the square attn.c_proj used to load transposed, silently) and still
    transposes the nn.Linear beside them."""
    data = np.load(FIXTURES / "gpt2_conv1d.npz")
    model = _GPT2ish().load_record(ModuleRecord.load(path, adapter="pytorch"))
    for name, out in _outputs(model, data).items():
        np.testing.assert_allclose(out.numpy(), data[name], atol=1e-5, rtol=1e-5, err_msg=name)


class _ProjOnly(Module):
    def __init__(self, d=8):
        self.c_proj = nn.LinearConfig(d, d).init()


class _SquareBlock(Module):
    def __init__(self):
        self.attn = _ProjOnly()


class _SquareOnly(Module):
    def __init__(self):
        self.h = [_SquareBlock()]


def test_a_square_gpt2_c_proj_is_not_loaded_transposed():
    """The defect of issue 19: a square Conv1D weight fits either way round, so a transposed load
    was silent. Loaded alone (the other tensors ignored), its output must equal torch's."""
    data = np.load(FIXTURES / "gpt2_conv1d.npz")
    rec = ModuleRecord.load(CONV1D, adapter="pytorch").allow_unused(True)
    model = _SquareOnly().load_record(rec)
    out = model.h[0].attn.c_proj.forward(Tensor.from_data(data["x"])).numpy()
    np.testing.assert_allclose(out, data["out.h.0.attn.c_proj"], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(model.h[0].attn.c_proj.weight.val().numpy(), data["h.0.attn.c_proj.weight"])


def test_gpt2_conv1d_weights_save_untransposed(tmp_path):
    data = np.load(FIXTURES / "gpt2_conv1d.npz")
    model = _GPT2ish().load_record(ModuleRecord.load(CONV1D, adapter="pytorch"))
    out = model.into_record().save(tmp_path / "again.safetensors", adapter="pytorch")
    import safetensors.numpy as stn

    saved = stn.load_file(str(out))
    for name in ("h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight",
                 "h.0.mlp.c_proj.weight", "h.0.head.weight"):
        np.testing.assert_array_equal(saved[name], data[name], err_msg=name)  # torch's own layout


def test_conv1d_names_are_configurable():
    """`conv1d=()`: every Linear weight transposed (GPTBigCode's c_attn / c_proj are nn.Linear);
    `conv1d=[regex]` names other Conv1D layers."""
    data = np.load(FIXTURES / "gpt2_conv1d.npz")
    rec = ModuleRecord.load(CONV1D, adapter=PyTorchAdapter(conv1d=()))
    with pytest.raises(RecordError, match=r"mismatch  h\.0\.attn\.c_attn\.weight: expected shape \[8, 24\], found \[24, 8\]"):
        _GPT2ish().load_record(rec)
    ad = PyTorchAdapter(conv1d=[r"\.(c_attn|c_proj|c_fc)\.weight$", r"head\.weight$"])
    assert ad.is_conv1d("h.0.head.weight") and not PyTorchAdapter().is_conv1d("h.0.head.weight")
    with pytest.raises(RecordError, match="regular expressions"):
        PyTorchAdapter(conv1d=["("])


# ----------------------------------------------------------------------------- building zips
def _repack(src, dst, *, rename=lambda n: n, change=lambda name, data: data, compress=zipfile.ZIP_STORED,
            extra=()):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compress) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(rename(info.filename), data)
        for name, data in extra:
            zout.writestr(name, data)


def _zip_with_pickle(path, pkl: bytes, storages=()):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for key, data in storages:
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    return path


class _System:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Eval:
    def __reduce__(self):
        return (eval, ("__import__('os').system('true')",))


class _Popen:
    def __init__(self, argv):
        self.argv = argv

    def __reduce__(self):
        return (subprocess.Popen, (self.argv,))


def _hostile_pickles(marker: Path):
    cmd = f"touch {marker}"
    opcode_system = b"cos\nsystem\n(S'" + cmd.encode() + b"'\ntR."
    stack_global = (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(cmd)]) + cmd.encode()
                    + b"\x85R.")
    inst = b"(S'" + cmd.encode() + b"'\nios\nsystem\n."
    return {
        "os.system (__reduce__)": pickle.dumps({"w": _System(cmd)}, protocol=2),
        "os.system (GLOBAL opcode)": opcode_system,
        "os.system (STACK_GLOBAL)": stack_global,
        "os.system (INST)": inst,
        "builtins.eval": pickle.dumps(_Eval(), protocol=2),
        "subprocess.Popen": pickle.dumps({"w": _Popen(["touch", str(marker)])}, protocol=2),
        "a torch global that is not allowed": b"\x80\x02ctorch\nload\nX\x01\x00\x00\x00x\x85R.",
        "torch._utils with another name": b"\x80\x02ctorch._utils\n_import_dotted_name\nX\x02\x00\x00\x00os\x85R.",
        "copyreg._reconstructor": b"\x80\x02ccopyreg\n_reconstructor\n.",
    }


@pytest.mark.parametrize("case", list(_hostile_pickles(Path("/x"))))
def test_hostile_pickles_are_refused_and_run_nothing(tmp_path, case):
    marker = tmp_path / "marker"
    pkl = _hostile_pickles(marker)[case]
    if case.startswith("os.system"):  # the stdlib would run it: the test's pickles really are hostile
        probe = tmp_path / "probe"
        pickle.loads(_hostile_pickles(probe)[case])
        assert probe.exists()
    path = _zip_with_pickle(tmp_path / "pytorch_model.bin", pkl)
    with pytest.raises(RecordError, match="refused: the pickle asks for the global") as err:
        TorchZip(path)
    assert "nothing was run" in str(err.value) and str(path) in str(err.value)
    with pytest.raises(RecordError, match="refused"):
        ModuleRecord.load(path)
    time.sleep(0.05)
    assert not marker.exists()


def test_the_refusal_names_the_global(tmp_path):
    path = _zip_with_pickle(tmp_path / "m.bin", pickle.dumps({"w": _System("true")}, protocol=2))
    with pytest.raises(RecordError, match=r"global (posix|os|nt)\.system"):
        TorchZip(path)


def test_stand_ins_refuse_build_and_fake_storages(tmp_path):
    # _rebuild_tensor_v2 called with a tuple instead of a storage from persistent_load
    fake = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(X\x01\x00\x00\x000K\x00K\x01\x85K\x01\x85\x89tR.")
    with pytest.raises(RecordError, match="a storage expected"):
        TorchZip(_zip_with_pickle(tmp_path / "a.bin", fake))
    # BUILD on a storage-type marker, trying to change its dtype
    build = b"\x80\x02ctorch\nFloatStorage\n}X\x05\x00\x00\x00dtypeX\x03\x00\x00\x00F64sb."
    with pytest.raises(RecordError, match=r"BUILD"):
        TorchZip(_zip_with_pickle(tmp_path / "b.bin", build))


# the calls refusing one of these pickles may make: 630-3,043 measured (the first loads the reader).
# No time bound: the 2 GB memo would end in MemoryError under capped_memory, and the messages say
# the opcodes were refused before anything was unpickled
PICKLE_CHECK_CALLS = 30_000


@pytest.mark.parametrize("pkl, match", [
    (b"\x80\x02]r\xff\xff\xff\x07.", "memo index 134217727 at byte 3 is beyond the 2 opcodes"),  # 2 GB memo
    (b"\x80\x02]p4000000000\n.", "memo index 4000000000"),
    (b"\x80\x02\x82\x01.", "opcode EXT1"),
    (b"\x80\x02P0\n.", "opcode PERSID"),
    (b"\x80\x02\xfe.", "the pickle cannot be read"),
])
def test_pickles_that_would_exhaust_memory_or_use_odd_opcodes(tmp_path, pkl, match):
    """The C unpickler grows its memo to whatever index a PUT names: 8 bytes would allocate and
    clear 2 GB (8.8 s here). The opcodes are checked first, by a walk that runs nothing."""
    path = _zip_with_pickle(tmp_path / "m.bin", pkl)
    with counted_calls() as calls, capped_memory(), pytest.raises(RecordError, match=match):
        TorchZip(path)
    assert calls.n < PICKLE_CHECK_CALLS, calls.n


def _pid_pickle(numel: int, offset: int, size, stride, key="0") -> bytes:
    """A state dict {'w': tensor} written with pickle opcodes, as torch writes it."""
    def tup(xs):
        return b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"
    return (b"\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n("
            + b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX" + struct.pack("<I", len(key)) + key.encode()
            + b"X\x03\x00\x00\x00cpuJ" + struct.pack("<i", numel) + b"tQ"
            + b"J" + struct.pack("<i", offset) + tup(size) + tup(stride)
            + b"\x89ccollections\nOrderedDict\n)RtRu.")


def test_many_views_of_one_storage_are_bounded(tmp_path):
    """Each view fits the file, but together they would make far more than it holds."""
    one = (b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000"
           b"X\x03\x00\x00\x00cpuK\x06tQK\x00(J\x00\x00\x10\x00t(K\x00t\x89tR")
    body = b"".join(b"X\x04\x00\x00\x00" + f"w{i:03d}".encode() + one for i in range(200))
    pkl = b"\x80\x02}(" + body + b"u."
    path = _zip_with_pickle(tmp_path / "m.bin", pkl, [("0", bytes(24))])
    with pytest.raises(RecordError, match=r"the state dict's 200 tensors make 838860800 bytes, more than 8 times"):
        TorchZip(path)


def test_hand_written_state_dict_reads(tmp_path):
    data = np.arange(6, dtype=np.float32)
    path = _zip_with_pickle(tmp_path / "ok.bin", _pid_pickle(6, 1, (2, 2), (1, 2)), [("0", data.tobytes())])
    with TorchZip(path) as z:
        np.testing.assert_array_equal(z.tensors["w"].read_stored(), np.array([[1, 3], [2, 4]], np.float32))


@pytest.mark.parametrize("numel, offset, size, stride, storages, match", [
    (6, 0, (2, 4), (4, 1), [("0", bytes(24))], r"tensor 'w': shape \[2, 4\], stride \[4, 1\] and offset 0 reach "
                                                r"element 7 of storage '0', which holds 6"),
    (6, 5, (2,), (1,), [("0", bytes(24))], "reach element 6"),
    (6, 0, (3, 3), (0, 3), [("0", bytes(24))], "reach element 6"),
    (8, 0, (2,), (1,), [("0", bytes(24))], r"8 elements of FloatStorage need 32 bytes, its entry data/0 holds 24"),
    (6, 0, (2,), (1,), [("1", bytes(24))], r"storage '0': the archive has no entry archive/data/<key>"),
    (6, 0, (2, 3), (3,), [("0", bytes(24))], "differ in rank"),
    (6, 7, (0,), (1,), [("0", bytes(24))], "past the end of storage"),
    # one stored element expanded to 2**20 x 2**20 (4 TiB): refused before anything is allocated
    (6, 0, (2 ** 20, 2 ** 20), (0, 0), [("0", bytes(24))], r"makes 4398046511104 bytes, more than the whole file"),
])
def test_sizes_that_do_not_fit_the_storage(tmp_path, numel, offset, size, stride, storages, match):
    path = _zip_with_pickle(tmp_path / "bad.bin", _pid_pickle(numel, offset, size, stride), storages)
    with pytest.raises(RecordError, match=match) as err:
        TorchZip(path)
    assert err.value.where == str(path)


def test_compressed_storages_are_refused(tmp_path):
    path = tmp_path / "deflated.bin"
    _repack(STATE_DICT, path, compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(RecordError, match=r"storage entry state_dict/data/0 is compressed .*re-save it with torch.save"):
        TorchZip(path)


def test_big_endian_archives_are_swapped(tmp_path):
    with TorchZip(STATE_DICT) as z:
        dtype_of = {t.storage: t.dtype for t in z.tensors.values()}
    from engine.store.burnpack import storage_dtype

    def change(name, data):
        if name.endswith("/byteorder"):
            return b"big"
        if "/data/" in name:
            sd = storage_dtype(dtype_of[name.rsplit("/", 1)[1]])
            return np.frombuffer(data, sd).astype(sd.newbyteorder(">")).tobytes()
        return data

    path = tmp_path / "big.bin"
    _repack(STATE_DICT, path, change=change)
    expected, _ = _expected(FIXTURES / "state_dict.npz")
    with TorchZip(path) as z:
        for name, t in z.tensors.items():
            assert t.read_stored().tobytes() == expected[name].tobytes(), name


@pytest.mark.parametrize("content, match", [
    (b"\x80\x02\x8a\x0alZ\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", "legacy format"),
    (b"NRUB....", "not a PyTorch zip checkpoint"),
    (b"PK\x03\x04" + bytes(40), "not a readable PyTorch zip checkpoint"),
])
def test_files_that_are_not_torch_zips(tmp_path, content, match):
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    with pytest.raises(RecordError, match=match):
        TorchZip(path)
    with pytest.raises(RecordError):
        ModuleRecord.load(path)


@pytest.mark.parametrize("pkl, match", [
    (pickle.dumps([1, 2], protocol=2), "a state dict .* expected, the pickle holds a list"),
    (pickle.dumps({"a": 3}, protocol=2), "entry 'a' holds a value of type int; a tensor expected"),
    (pickle.dumps({"model": {"w": 1}}, protocol=2), "entry 'model' holds a nested dict"),
    (pickle.dumps({1: 2}, protocol=2), "tensor names must be text"),
    (b"\x80\x02}q\x00(X\x01", "the pickle cannot be read"),
])
def test_pickles_that_are_not_state_dicts(tmp_path, pkl, match):
    with pytest.raises(RecordError, match=match):
        TorchZip(_zip_with_pickle(tmp_path / "x.bin", pkl))


def test_no_data_pkl(tmp_path):
    path = tmp_path / "x.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a/b/data.pkl", b"")
        z.writestr("readme.txt", b"hi")
    with pytest.raises(RecordError, match=r"one <archive>/data.pkl entry\), found 0 among: a/b/data.pkl, readme.txt"):
        TorchZip(path)


# ----------------------------------------------------------------------------- fuzz
FUZZ_CASES = 240
# the calls one fuzzed file may cost (16,103 at most measured): a reader that loops over a count the
# file claims (zip entries, storage sizes) goes far past it, however fast or busy the machine
CASE_CALLS = 200_000


def _mutations(seed_bytes: bytes, rng: random.Random):
    b = bytearray(seed_bytes)
    kind = rng.randrange(5)
    if kind == 0:  # bit flips anywhere
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncation
        del b[rng.randrange(len(b)):]
    elif kind == 2:  # flips inside the pickle (the first entry's data)
        start = 64  # about where the first entry's (data.pkl's) bytes begin
        for _ in range(rng.randint(1, 6)):
            b[start + rng.randrange(800)] ^= 1 << rng.randrange(8)
    elif kind == 3:  # random 32-bit values over zip header fields (sizes, offsets, counts)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(b) - 4)
            b[pos:pos + 4] = struct.pack("<I", rng.choice([0, 1, 2 ** 31 - 1, 2 ** 32 - 1, rng.randrange(2 ** 32)]))
    else:  # flips in the central directory at the end
        for _ in range(rng.randint(1, 6)):
            b[len(b) - 1 - rng.randrange(min(len(b), 1200))] ^= 1 << rng.randrange(8)
    return bytes(b)


def test_fuzzed_bin_files_end_in_record_errors_in_bounded_time_and_memory(tmp_path):
    seeds = [STATE_DICT.read_bytes(), CONV1D.read_bytes()]
    rng = random.Random(1919)
    counts = {"rejected": 0, "accepted": 0}
    most = 0
    path = tmp_path / "fuzz.bin"
    for case in range(FUZZ_CASES):
        blob = _mutations(seeds[case % 2], rng)
        path.write_bytes(blob)
        try:
            with counted_calls() as calls, capped_memory():
                with TorchZip(path) as z:
                    for t in z.tensors.values():
                        t.read_stored()
                ModuleRecord.load(path)
            counts["accepted"] += 1
        except RecordError:
            counts["rejected"] += 1
        most = max(most, calls.n)
        assert calls.n < CASE_CALLS, f"case {case} made {calls.n} calls"
    assert counts["rejected"] + counts["accepted"] == FUZZ_CASES
    assert counts["rejected"] > FUZZ_CASES // 3
    print(f"\ntorch zip fuzz: {FUZZ_CASES} cases, {counts['rejected']} RecordError, {counts['accepted']} read, "
          f"the most calls in a case {most}")


# ----------------------------------------------------------------------------- against torch (optional)
def test_random_state_dicts_against_torch(tmp_path):
    """Optional: torch.save of random tensors and views, read here, equals torch.load."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(7)
    for trial in range(5):
        base = torch.randn(7, 6, 5, generator=g)
        sd = {"a": base, "b": base.permute(2, 0, 1), "c": base[1:5:2, ::3, 2:], "d": base.to(torch.bfloat16).transpose(0, 2),
              "e": torch.randn(3, generator=g).to(torch.float16), "f": torch.arange(10)[3:8]}
        path = tmp_path / f"t{trial}.bin"
        torch.save(sd, path)
        back = torch.load(path, weights_only=True)
        with TorchZip(path) as z:
            for name, t in back.items():
                ref = t.contiguous()
                ref = ref.view(torch.int16).numpy().view(np.uint16) if ref.dtype == torch.bfloat16 else ref.numpy()
                assert z.tensors[name].read_stored().tobytes() == ref.tobytes(), name


# ----------------------------------------------------------------------------- many entries
def _torch_like_pickle(monkeypatch, state) -> bytes:
    """`state` pickled as torch.save pickles a state dict ({name: tensor} -> _rebuild_tensor_v2 of a
    persistent storage id), with stand-in torch modules: torch is not installed here."""
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise AssertionError("never called")

    class FloatStorage:
        pass

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    FloatStorage.__module__, FloatStorage.__qualname__ = "torch", "FloatStorage"
    utils._rebuild_tensor_v2, torch.FloatStorage, torch._utils = _rebuild_tensor_v2, FloatStorage, utils
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)

    class Storage:
        pass

    class Tensor:
        def __reduce__(self):
            return _rebuild_tensor_v2, (Storage(), 0, (1,), (1,), False, collections.OrderedDict())

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", FloatStorage, "0", "cpu", 1) if isinstance(obj, Storage) else None

    def tensors(value):
        if isinstance(value, dict):
            return collections.OrderedDict((k, tensors(v)) for k, v in value.items())
        return [tensors(v) for v in value] if isinstance(value, list) else Tensor()

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(tensors(state))
    return buf.getvalue()


def test_a_state_dict_of_more_entries_than_the_limit_is_refused_while_its_pickle_is_walked(tmp_path, monkeypatch):
    """A .bin of 300,000 entries took 4.7 s: every opcode walked, the pickle loaded and each tensor
    described before the count was checked. The walk counts the state dict's entries as they are
    set and stops past the limit, before the pickle is loaded."""
    monkeypatch.setattr(torch_pickle, "MAX_TENSORS", 2500)
    pkl = _torch_like_pickle(monkeypatch, {f"model.layers.{i}.weight": None for i in range(10_000)})
    path = _zip_with_pickle(tmp_path / "pytorch_model.bin", pkl, [("0", bytes(4))])
    loads = []
    monkeypatch.setattr(torch_pickle._RestrictedUnpickler, "load", lambda self: loads.append(1))
    with pytest.raises(RecordError, match=r"the state dict sets more than 2500 entries \(at byte (\d+)\)") as err:
        TorchZip(path)
    at = int(re.search(r"at byte (\d+)", str(err.value)).group(1))
    assert at < 0.3 * len(pkl) and loads == []
    monkeypatch.undo()
    # at the limit the same pickle loads, whatever protocol wrote it
    monkeypatch.setattr(torch_pickle, "MAX_TENSORS", 2500)
    for protocol_pickle in (_torch_like_pickle(monkeypatch, {f"w{i}": None for i in range(2500)}),):
        path = _zip_with_pickle(tmp_path / "ok.bin", protocol_pickle, [("0", bytes(4))])
        with TorchZip(path) as z:
            assert len(z.tensors) == 2500 and z.tensors["w7"].read_stored().shape == (1,)
    # tensors kept elsewhere than in the state dict's entries are counted as they are rebuilt
    pkl = _torch_like_pickle(monkeypatch, {"w": None, "extra": [None] * 2501})
    with pytest.raises(RecordError, match=r"the pickle rebuilds more than 2500 tensors"):
        TorchZip(_zip_with_pickle(tmp_path / "list.bin", pkl, [("0", bytes(4))]))


@pytest.mark.parametrize("entries", [300, pytest.param(70_000, marks=pytest.mark.long)])
def test_an_archive_of_more_entries_than_the_limit_is_refused_from_its_end_record(tmp_path, monkeypatch, entries):
    """A storage a zip entry: 300,003 entries took seconds in zipfile's directory before the count
    was checked. The end record's count (the zip64 record's past 65,535) refuses them first."""
    path = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}.")
        for i in range(entries):
            z.writestr(f"archive/data/{i}", b"")
    monkeypatch.setattr(torch_pickle, "MAX_ZIP_ENTRIES", entries)
    made = []
    real = zipfile.ZipInfo.__init__
    monkeypatch.setattr(zipfile.ZipInfo, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    with pytest.raises(RecordError, match=rf"{entries + 1} zip entries exceed the limit of {entries} .*refused from "
                                          r"the archive's end record"):
        TorchZip(path)
    assert made == []
    if entries < 1000:  # one more allowed: the directory is read and the (empty) state dict loads
        monkeypatch.setattr(torch_pickle, "MAX_ZIP_ENTRIES", entries + 1)
        with TorchZip(path) as z:
            assert z.tensors == {} and made
