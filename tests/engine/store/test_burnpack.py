"""The burnpack format layer: Burn's own file, every dtype, metadata, scalars, alignment, and
each check a careful reader makes."""
import struct

import cbor2
import numpy as np
import pytest

from engine.store import RecordError, burnpack as bp, cbor
from engine.store.burnpack import Scalar, TensorEntry

from .helpers import align, craft, desc

MNIST_NAMES = [
    "conv1.conv.weight", "conv1.conv.bias", "conv1.norm.gamma", "conv1.norm.beta",
    "conv1.norm.running_mean", "conv1.norm.running_var",
    "conv2.conv.weight", "conv2.conv.bias", "conv2.norm.gamma", "conv2.norm.beta",
    "conv2.norm.running_mean", "conv2.norm.running_var",
    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
]


@pytest.fixture
def mnist_bytes(fixtures_dir):
    return (fixtures_dir / "burn-mnist.bpk").read_bytes()


def test_burn_fixture_decodes_in_traversal_order(mnist_bytes):
    c = bp.decode(mnist_bytes)
    assert len(mnist_bytes) == 1_044_776
    assert [e.name for e in c.entries] == MNIST_NAMES
    shapes = {e.name: e.shape for e in c.entries}
    assert shapes["conv1.conv.weight"] == (64, 1, 3, 3)
    assert shapes["conv2.conv.weight"] == (64, 64, 3, 3)
    assert shapes["fc1.weight"] == (1600, 128)
    assert shapes["fc3.weight"] == (128, 10)
    assert all(e.dtype == "F32" and e.array.dtype == np.float32 for e in c.entries)
    assert c.metadata == {} and c.scalars == {}
    ids = {e.name: e.param_id for e in c.entries}
    # read straight from the CBOR with cbor2, independently of the reader under test
    meta_len = struct.unpack_from("<I", mnist_bytes, 6)[0]
    raw = cbor2.loads(mnist_bytes[10:10 + meta_len])["tensors"]
    assert ids == {k: v["param_id"] for k, v in raw.items()}
    data_start = align(10 + meta_len)
    w = raw["fc3.weight"]["data_offsets"]
    expect = np.frombuffer(mnist_bytes[data_start + w[0]:data_start + w[1]], "<f4").reshape(128, 10)
    got = next(e for e in c.entries if e.name == "fc3.weight").array
    np.testing.assert_array_equal(got, expect)
    # trained BatchNorm statistics, not an initializer's ones and zeros
    var = next(e for e in c.entries if e.name == "conv1.norm.running_var").array
    assert not np.allclose(var, 1.0) and (var > 0).all()


def test_burn_fixture_reencodes_byte_for_byte(mnist_bytes):
    c = bp.decode(mnist_bytes)
    assert bp.encode(c.entries, c.metadata, c.scalars) == mnist_bytes


def test_decoded_arrays_are_views_of_the_buffer(mnist_bytes):
    buf = bytearray(mnist_bytes)
    c = bp.decode(buf)
    e = c.entries[0]
    assert np.shares_memory(e.array, np.frombuffer(buf, np.uint8))
    ro = bp.decode(mnist_bytes).entries[0].array
    assert not ro.flags.writeable


ALL_ARRAYS = {
    "f64": np.array([[1.5, -2.25], [1e300, -0.0]], np.float64),
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    "f16": np.array([0.5, -65504.0, 6e-5], np.float16),
    "i64": np.array([-(2 ** 63), 2 ** 63 - 1], np.int64),
    "i32": np.array([-5, 7], np.int32),
    "i16": np.array([-32768, 32767], np.int16),
    "i8": np.array([-128, 127, 0], np.int8),
    "u64": np.array([2 ** 64 - 1, 0], np.uint64),
    "u32": np.array([4_000_000_000], np.uint32),
    "u16": np.array([65535, 1], np.uint16),
    "u8": np.array([[255, 0], [1, 2]], np.uint8),
    "bool": np.array([[True, False, True]]),
    "scalar": np.array(3.25, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}


def test_every_plain_dtype_round_trips():
    entries = [TensorEntry.from_array(k, v, param_id=i * 1000 + 1) for i, (k, v) in enumerate(ALL_ARRAYS.items())]
    blob = bp.encode(entries)
    c = bp.decode(blob)
    assert [e.name for e in c.entries] == list(ALL_ARRAYS)
    for e, (name, arr) in zip(c.entries, ALL_ARRAYS.items()):
        assert e.array.dtype == arr.dtype, name
        assert e.shape == arr.shape
        np.testing.assert_array_equal(e.array, arr)
        assert e.param_id == list(ALL_ARRAYS).index(name) * 1000 + 1
    assert {e.name: e.dtype for e in c.entries}["bool"] == "Bool(Native)"
    assert {e.name: e.dtype for e in c.entries}["f16"] == "F16"
    assert bp.encode(c.entries) == blob


@pytest.mark.parametrize("store,width", [("Native", 1), ("U8", 1), ("U32", 4)])
def test_bool_storages(store, width):
    values = np.array([True, False, False, True])
    blob = bp.encode([TensorEntry("m", f"Bool({store})", (4,), values)])
    meta_len = struct.unpack_from("<I", blob, 6)[0]
    raw = cbor2.loads(blob[10:10 + meta_len])["tensors"]["m"]
    assert raw["dtype"] == {"Bool": store}
    assert raw["data_offsets"] == [0, 4 * width]
    e = bp.decode(blob).entries[0]
    assert e.dtype == f"Bool({store})" and e.array.dtype == np.bool_
    np.testing.assert_array_equal(e.array, values)
    assert bp.encode([e]) == blob


def test_bf16_is_kept_as_raw_bits_and_widens_exactly():
    values = np.array([1.0, -2.5, 3.140625, 1e38], np.float32)
    bits = bp.float32_to_bf16(values)
    blob = bp.encode([TensorEntry("w", "BF16", (4,), bits)])
    e = bp.decode(blob).entries[0]
    assert e.dtype == "BF16" and e.array.dtype == np.uint16
    np.testing.assert_array_equal(e.array, bits)
    w = e.values()
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w[:3], values[:3])  # exactly representable in bfloat16
    assert abs(w[3] - 1e38) / 1e38 < 2 ** -8
    assert bp.encode([e]) == blob


def test_user_metadata_and_scalars_round_trip_in_spec_order():
    entries = [TensorEntry.from_array("a", np.ones(3, np.float32))]
    meta = {"z": "last", "a": "first"}
    scalars = {"epoch": 3, "lr": 0.001, "done": True, "big": 2 ** 64 - 1, "neg": -7, "half": 0.5}
    blob = bp.encode(entries, meta, scalars)
    meta_len = struct.unpack_from("<I", blob, 6)[0]
    raw = cbor2.loads(blob[10:10 + meta_len])
    assert list(raw) == ["tensors", "metadata", "scalars"]
    assert list(raw["metadata"]) == ["a", "z"]
    assert raw["scalars"] == {"big": {"UInt": 2 ** 64 - 1}, "done": {"Bool": True}, "epoch": {"Int": 3},
                              "half": {"Float": 0.5}, "lr": {"Float": 0.001}, "neg": {"Int": -7}}
    # ciborium writes floats in the narrowest exact width: 0.5 as a half float
    assert cbor2.dumps({"Float": 0.5}, canonical=True) in blob[10:10 + meta_len]
    c = bp.decode(blob)
    assert c.metadata == meta
    assert c.scalars["epoch"] == Scalar("Int", 3) and c.scalars["big"] == Scalar("UInt", 2 ** 64 - 1)
    assert c.scalars["lr"] == Scalar("Float", 0.001) and c.scalars["done"] == Scalar("Bool", True)
    assert bp.encode(c.entries, c.metadata, c.scalars) == blob


def test_empty_metadata_and_scalars_are_left_out():
    blob = bp.encode([TensorEntry.from_array("a", np.ones(1, np.float32))], {}, {})
    meta_len = struct.unpack_from("<I", blob, 6)[0]
    assert list(cbor2.loads(blob[10:10 + meta_len])) == ["tensors"]


def test_layout_alignment_order_and_descriptor_keys():
    arrays = [("b.second", np.ones(3, np.float32)), ("a.first", np.ones(70, np.float64)),
              ("c.empty", np.zeros(0, np.int8)), ("d.third", np.ones((2, 2), np.int16))]
    entries = [TensorEntry.from_array(n, a, param_id=7 if n == "a.first" else None) for n, a in arrays]
    blob = bp.encode(entries)
    meta_len = struct.unpack_from("<I", blob, 6)[0]
    assert blob[:4] == b"NRUB" and struct.unpack_from("<H", blob, 4)[0] == 1
    raw = cbor2.loads(blob[10:10 + meta_len])["tensors"]
    assert list(raw) == sorted(raw)  # names sorted bytewise
    assert list(raw["a.first"]) == ["dtype", "shape", "data_offsets", "param_id"]
    assert "param_id" not in raw["b.second"]
    # data in traversal (list) order, each start a multiple of 256
    assert raw["b.second"]["data_offsets"] == [0, 12]
    assert raw["a.first"]["data_offsets"] == [256, 256 + 560]
    assert raw["c.empty"]["data_offsets"] == [1024, 1024]
    assert raw["d.third"]["data_offsets"] == [1024, 1032]
    data_start = align(10 + meta_len)
    assert blob[10 + meta_len:data_start] == bytes(data_start - 10 - meta_len)
    assert len(blob) == data_start + 1032
    assert blob[data_start + 12:data_start + 256] == bytes(244)
    assert [e.name for e in bp.decode(blob).entries] == [n for n, _ in arrays]


def test_streamed_write_equals_encode(tmp_path):
    entries = [TensorEntry.from_array(k, v) for k, v in ALL_ARRAYS.items()]
    with open(tmp_path / "x.bpk", "wb") as f:
        n = bp.write(f, entries, {"k": "v"}, {"s": 1})
    assert (tmp_path / "x.bpk").read_bytes() == bp.encode(entries, {"k": "v"}, {"s": 1})
    assert n == (tmp_path / "x.bpk").stat().st_size


def test_writer_refuses_duplicates_and_bad_ids():
    a = np.ones(2, np.float32)
    with pytest.raises(RecordError, match="duplicate tensor name 'x'"):
        bp.encode([TensorEntry.from_array("x", a), TensorEntry.from_array("x", a)])
    with pytest.raises(RecordError, match="param_id"):
        bp.encode([TensorEntry.from_array("x", a, param_id=2 ** 64)])
    with pytest.raises(RecordError, match="complex"):
        TensorEntry.from_array("x", np.ones(2, np.complex64))


def test_big_endian_arrays_are_written_little_endian():
    big = np.array([1.5, 2.0], dtype=">f4")
    e = bp.decode(bp.encode([TensorEntry("x", "F32", (2,), big)])).entries[0]
    np.testing.assert_array_equal(e.array, [1.5, 2.0])


# ------------------------------------------------------------------ the reader's checks
def _one(shape=(2,), start=0, end=8, dtype="F32", data=bytes(8)):
    return craft({"tensors": {"t": desc(start, end, shape, dtype)}}, data)


def test_a_crafted_file_is_accepted():
    assert bp.decode(_one()).entries[0].shape == (2,)


@pytest.mark.parametrize("blob,match", [
    (b"", "10-byte header expected, found 0"),
    (b"NRUB\x01\x00", "10-byte header expected, found 6"),
    (b"BURN" + bytes(6), "magic"),
    (craft({"tensors": {}}, version=2), "version 2 is newer"),
    (craft({"tensors": {}}, meta_len=100 * 1024 * 1024 + 1), "exceeds the 104857600-byte limit"),
    (craft({"tensors": {}}, meta_len=5000), "5000 bytes of metadata"),
    (_one(start=8, end=0), "start 8 is after end 0"),
    (_one(end=8, data=bytes(4)), "truncated: tensor 't' ends at data byte 8"),
    (_one(shape=(3,)), r"shape \[3\] of F32 needs 12 bytes"),
    (_one(dtype="F128"), "unknown dtype 'F128'"),
    (_one(shape=(2 ** 62, 2 ** 62)), "needs"),
    (craft({"tensors": {"t": desc(0, 10 * 1024 ** 3 + 4, (10 * 1024 ** 3 // 4 + 1,))}}), "per-tensor limit"),
    (craft({"tensors": {"a": desc(0, 8, (2,)), "b": desc(4, 12, (2,))}}, bytes(12)), "overlaps"),
    (craft({"tensors": []}), "'tensors' map expected"),
    (craft([1, 2]), "a map expected"),
    (craft({"tensors": {"t": {"dtype": "F32", "shape": [2]}}}), "no 'data_offsets'"),
    (craft({"tensors": {"t": desc(0, 8, (-2,))}}, bytes(8)), "unsigned integer"),
    (craft({"tensors": {"t": desc(0, 8, (2,), param_id=-1)}}, bytes(8)), "param_id"),
    (craft({"tensors": {}, "metadata": {"a": 1}}), "text to text"),
    (craft({"tensors": {}, "scalars": {"a": {"Int": 2 ** 63}}}), "scalar 'a'"),
    (craft({"tensors": {}, "scalars": {"a": {"Complex": 1}}}), "scalar 'a'"),
    (craft(meta_bytes=b"\xa1\x67tensors\xa0\x00"), "trailing bytes"),
])
def test_reader_rejects(blob, match):
    with pytest.raises(RecordError, match=match):
        bp.decode(blob)


def test_reader_rejects_more_than_100000_tensors():
    tensors = {f"t{i}": desc(0, 0, (0,)) for i in range(100_001)}
    with pytest.raises(RecordError, match="100001 tensors exceed the limit of 100000"):
        bp.decode(craft({"tensors": tensors}))


def test_reader_rejects_duplicate_names():
    # a map with the key "t" twice, written by hand (no encoder produces it)
    d = cbor.dumps(desc(0, 0, (0,)))
    meta = b"\xa1\x67tensors\xa2" + b"\x61t" + d + b"\x61t" + d
    with pytest.raises(RecordError, match="Duplicate map key"):
        bp.decode(craft(meta_bytes=meta))


@pytest.mark.parametrize("tagged", [
    cbor2.CBORTag(35, "a+"),            # cbor2 would compile a regular expression
    cbor2.CBORTag(0, "2020-01-01T00:00:00Z"),
    cbor2.CBORTag(2, b"\x01\x00"),      # a bignum
    cbor2.CBORTag(28, [1]),             # value sharing
    cbor2.CBORTag(258, [1]),            # a set
    cbor2.CBORTag(4242, 1),
])
def test_cbor_tags_are_refused(tagged):
    meta = cbor2.dumps({"tensors": {}, "metadata": {"x": tagged}})
    with pytest.raises(RecordError, match="tag"):
        bp.decode(craft(meta_bytes=meta))


@pytest.mark.parametrize("meta,match", [
    (b"\xbf\x67tensors\xa0\xff", "indefinite-length"),
    (b"\xa1\x67tensors\x9b" + b"\xff" * 8, "claims"),         # an array of 2^64-1 items
    (b"\xa1\x67tensors\x7b" + b"\x7f" * 8, "claims"),         # a huge string
    (b"\x81" * 64 + b"\x00", "nesting deeper"),
    (b"\xa1\x67tensors\xf7", "simple value"),                # undefined
    (b"\xa1\x67tens", "claims"),
    (b"\xa1\x67tensors\x61\xff", "invalid CBOR"),            # invalid UTF-8
])
def test_malformed_cbor_is_refused(meta, match):
    with pytest.raises(RecordError, match=match):
        bp.decode(craft(meta_bytes=meta))


def test_error_names_the_file():
    with pytest.raises(RecordError) as info:
        bp.decode(b"XXXX" + bytes(6), where="model.bpk")
    assert str(info.value).startswith("model.bpk: not a burnpack")
    assert info.value.where == "model.bpk"
