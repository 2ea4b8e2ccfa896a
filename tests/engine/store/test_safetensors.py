"""safetensors: the PyTorch fixture, interop with the `safetensors` package both ways, and the
same hardening as burnpack."""
import json
import struct
import types

import numpy as np
import pytest
import safetensors.numpy as stn

from engine.store import ModuleRecord, RecordError, filesource, safetensors_io as st
from engine.store.burnpack import MAX_TENSORS, TensorEntry


def _file(header: dict, data: bytes = b"", pad: bool = False) -> bytes:
    blob = json.dumps(header).encode()
    if pad:
        blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data


def test_torch_fixture_matches_the_safetensors_package(fixtures_dir):
    raw = (fixtures_dir / "torch-multi-layer.safetensors").read_bytes()
    ours = st.decode(raw)
    ref = stn.load(raw)
    assert {e.name for e in ours.entries} == set(ref)
    for e in ours.entries:
        assert e.array.dtype == ref[e.name].dtype
        np.testing.assert_array_equal(e.array, ref[e.name])
    shapes = {e.name: e.shape for e in ours.entries}
    assert shapes["fc1.weight"] == (16, 256) and shapes["conv1.weight"] == (4, 3, 3, 3)
    assert shapes["norm1.num_batches_tracked"] == ()


def test_files_we_write_are_read_by_the_package():
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array([1, -2], np.int64),
              "h": np.array([0.5], np.float16), "b": np.array([True, False]), "z": np.zeros((0,), np.float64)}
    blob = st.encode([TensorEntry.from_array(k, v) for k, v in arrays.items()], {"format": "pt"})
    assert (struct.unpack_from("<Q", blob)[0] + 8) % 8 == 0
    ref = stn.load(blob)
    for k, v in arrays.items():
        assert ref[k].dtype == v.dtype
        np.testing.assert_array_equal(ref[k], v)
    back = st.decode(blob)
    assert back.metadata == {"format": "pt"}
    assert [e.name for e in back.entries] == list(arrays)


def test_files_the_package_writes_are_read(tmp_path):
    arrays = {"a": np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32),
              "b": np.array([[1, 2]], np.int32), "c": np.array([True])}
    stn.save_file(arrays, tmp_path / "x.safetensors", metadata={"k": "v"})
    got = st.decode((tmp_path / "x.safetensors").read_bytes())
    assert got.metadata == {"k": "v"}
    for e in got.entries:
        np.testing.assert_array_equal(e.array, arrays[e.name])


def test_bf16_round_trips_through_the_package():
    bits = np.array([0x3F80, 0xC020], np.uint16)  # 1.0, -2.5
    blob = st.encode([TensorEntry("x", "BF16", (2,), bits)])
    hdr = json.loads(blob[8:8 + struct.unpack_from("<Q", blob)[0]])
    assert hdr["x"]["dtype"] == "BF16"
    e = st.decode(blob).entries[0]
    np.testing.assert_array_equal(e.values(), [1.0, -2.5])


GOOD = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize("blob,match", [
    (b"\x01\x00", "8-byte header length expected"),
    (struct.pack("<Q", 100_000_001) + b"{}", "exceeds the 100000000-byte limit"),
    (struct.pack("<Q", 50) + b"{}", "truncated: the header announces 50 bytes"),
    (struct.pack("<Q", 2) + b"[]", "JSON object expected"),
    (struct.pack("<Q", 3) + b"{,}", "not valid JSON"),
    (struct.pack("<Q", 9) + b'{"a":NaN}', "not valid JSON"),
    (_file({"t": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, bytes(1)), "not supported"),
    (_file({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)), "needs 12 bytes"),
    (_file({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8)), "after end"),
    (_file(GOOD, bytes(4)), "truncated: tensor 't' ends at data byte 8"),
    (_file({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8)), "unsigned"),
    (_file({"a": GOOD["t"], "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)), "overlaps"),
    (_file({"t": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40], "data_offsets": [0, 8]}}, bytes(8)), "needs"),
    (_file({"__metadata__": {"a": 1}}), "text to text"),
    (struct.pack("<Q", 4) + b"{\xff}" + b" ", "not valid JSON"),
    (struct.pack("<Q", 3000) + b"[" * 2999 + b"]", "JSON object expected"),
])
def test_reader_rejects(blob, match):
    with pytest.raises(RecordError, match=match):
        st.decode(blob)


def test_deep_json_nesting_ends_in_record_error():
    body = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(RecordError):
        st.decode(struct.pack("<Q", len(body)) + body)


def test_writer_refuses_what_safetensors_cannot_hold():
    with pytest.raises(RecordError, match="cannot be stored in safetensors"):
        st.encode([TensorEntry("q", "QFloat", (4,), np.zeros(4, np.uint8))])


def test_bytes_after_the_last_tensor_are_refused_and_never_read(tmp_path):
    """As the safetensors library: the tensors' data ends the file. A small file followed by a
    sparse hole of a gigabyte is refused from its header and size, reading none of the hole."""
    blob = _file(GOOD, bytes(8))
    assert st.decode(blob).entries[0].shape == (2,)
    with pytest.raises(RecordError, match=r"1 bytes after the last tensor's data \(which ends at data byte 8"):
        st.decode(blob + b"\0")
    with pytest.raises(RecordError, match=r"bytes after the last tensor's data \(which ends at data byte 0"):
        st.decode(_file({}, bytes(16)))
    path = tmp_path / "m.safetensors"
    path.write_bytes(blob)
    with open(path, "r+b") as f:
        f.truncate(len(blob) + 2 ** 30)
    read = []
    real = filesource.FileSource._fill

    def counting(self, view, offset):
        read.append(len(view))
        return real(self, view, offset)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(filesource.FileSource, "_fill", counting)
        with pytest.raises(RecordError, match=rf"{2 ** 30} bytes after the last tensor's data"):
            ModuleRecord.load(path)
    assert sum(read) < 2 * len(blob)  # the header only


def test_a_header_of_more_tensors_than_the_limit_is_refused_before_parsing(monkeypatch):
    """300,000 descriptors took 2.5 s to parse before the count was checked; the count of
    "data_offsets" keys refuses them in the time of a byte count."""
    n = MAX_TENSORS + 1
    body = ("{" + ",".join(f'"t{i}":{{"dtype":"F32","shape":[1],"data_offsets":[{4 * i},{4 * i + 4}]}}'
                           for i in range(n)) + "}").encode()
    blob = struct.pack("<Q", len(body)) + body + bytes(4 * n)
    parsed = []
    monkeypatch.setattr(st, "json", types.SimpleNamespace(
        loads=lambda text, **kw: parsed.append(len(text)) or json.loads(text, **kw)))
    with pytest.raises(RecordError, match=rf"{n} tensors exceed the limit of {MAX_TENSORS} \(refused before parsing"):
        st.decode(blob)
    assert parsed == []
    # at the limit, the header is parsed and accepted
    head = body[: body.index(f'"t{n - 1}"'.encode()) - 1] + b"}"
    st.decode(struct.pack("<Q", len(head)) + head + bytes(4 * (n - 1)))
    assert parsed == [len(head)]
