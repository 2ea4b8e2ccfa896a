"""safetensors: the PyTorch fixture, interop with the `safetensors` package both ways, and the
same hardening as burnpack."""
import json
import struct

import numpy as np
import pytest
import safetensors.numpy as stn

from engine.store import RecordError, safetensors_io as st
from engine.store.burnpack import TensorEntry


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
