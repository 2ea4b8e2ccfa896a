"""Fuzzing the readers: truncations, bit flips, offsets past the end, overlapping ranges, huge
shapes and lengths, garbage CBOR / JSON. Every case must end in a clean decode or a
`RecordError` (never another exception), within a budget of calls per case, and with the
process's address space capped a few hundred MiB above its size at the start (so a reader
that trusted a size from the file would hit MemoryError and fail the test)."""
import json
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.store import ModuleRecord, RecordError, burnpack as bp, cbor, safetensors_io
from engine.store.burnpack import TensorEntry

from tests.limits import FUZZ_HEADROOM, capped_memory
from tests.work import counted_calls

from .helpers import craft

SETTINGS = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# the calls one case may make (617 at most measured): a decoder that loops over a count the file
# claims goes far past it, however fast or busy the machine (a count, not a time bound)
CASE_CALLS = 20_000
COUNTS = {"cases": 0, "rejected": 0, "accepted": 0, "most calls": 0}


def _seed_entries():
    return [
        TensorEntry.from_array("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4), param_id=11),
        TensorEntry.from_array("a.bias", np.ones(4, np.float64), param_id=2 ** 64 - 1),
        TensorEntry.from_array("b.mask", np.array([True, False, True])),
        TensorEntry.from_array("b.idx", np.array([[1, 2], [3, 4]], np.int64)),
        TensorEntry("c.bf", "BF16", (2,), np.array([0x3F80, 0x4000], np.uint16)),
        TensorEntry("c.flags", "Bool(U32)", (2,), np.array([True, False])),
        TensorEntry.from_array("d.empty", np.zeros((0, 5), np.float16)),
    ]


SEED = bp.encode(_seed_entries(), {"note": "fuzz seed"}, {"epoch": 3, "lr": 0.01, "ok": True})
SEED_META = bp.decode(SEED)
SEED_ST = safetensors_io.encode([e for e in _seed_entries() if e.dtype != "Bool(U32)"], {"k": "v"})


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print(f"\nfuzz: {COUNTS['cases']} cases, {COUNTS['rejected']} ended in RecordError, "
          f"{COUNTS['accepted']} decoded cleanly, the most calls in a case {COUNTS['most calls']}")


def check(blob: bytes, decoder=None, must_fail: bool = False):
    """Decode `blob`; anything but success or RecordError fails the test."""
    decoder = decoder or (lambda b: ModuleRecord.from_bytes(b))
    COUNTS["cases"] += 1
    try:
        with counted_calls() as calls, capped_memory():
            result = decoder(blob)
    except RecordError:
        COUNTS["rejected"] += 1
        result = None
    COUNTS["most calls"] = max(COUNTS["most calls"], calls.n)
    assert calls.n < CASE_CALLS, f"a case made {calls.n} calls"
    if result is not None:
        COUNTS["accepted"] += 1
        assert not must_fail, "a malformed file was accepted"
    return result


def _meta_dict(blob):
    n = struct.unpack_from("<I", blob, 6)[0]
    return cbor.loads(blob[10:10 + n]), bp.decode(blob)


def _rebuild(meta: dict) -> bytes:
    """The seed's data section under new metadata (offsets unchanged)."""
    n = struct.unpack_from("<I", SEED, 6)[0]
    data = SEED[-(-(10 + n) // 256) * 256:]
    return craft(meta, data)


@SETTINGS
@given(cut=st.integers(0, len(SEED) - 1))
def test_truncations(cut):
    check(SEED[:cut], must_fail=True)


@SETTINGS
@given(cut=st.integers(0, len(SEED) - 1), flips=st.lists(st.tuples(st.integers(0, len(SEED) - 1),
                                                                   st.integers(0, 7)), max_size=4),
       suffix=st.sampled_from([".bpk", ".safetensors"]))
def test_damaged_files_through_module_record_load(tmp_path, cut, flips, suffix):
    """The file path (header read first, then each tensor read into its own array) holds as
    the in-memory one does."""
    seed = SEED if suffix == ".bpk" else SEED_ST
    b = bytearray(seed[: cut % len(seed)] if flips == [] else seed)
    for pos, bit in flips:
        b[pos % len(b)] ^= 1 << bit
    path = tmp_path / f"m{suffix}"
    path.write_bytes(bytes(b))
    check(bytes(b), lambda _: ModuleRecord.load(path), must_fail=not flips)


@SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.integers(0, 7)), min_size=1, max_size=8),
       head_bias=st.booleans())
def test_bit_flips(flips, head_bias):
    b = bytearray(SEED)
    limit = 10 + struct.unpack_from("<I", SEED, 6)[0]
    for pos, bit in flips:
        if head_bias:
            pos %= limit  # most interesting flips hit the header and metadata
        b[pos] ^= 1 << bit
    check(bytes(b))


names = st.sampled_from([e.name for e in SEED_META.entries])
big = st.one_of(st.integers(0, 2 ** 64 - 1), st.sampled_from([2 ** 63, 2 ** 64 - 1, 2 ** 32, 10 * 1024 ** 3 + 1]))


@SETTINGS
@given(name=names, start=big, extra=big)
def test_offsets_past_the_end(name, start, extra):
    meta, _ = _meta_dict(SEED)
    desc = meta["tensors"][name]
    size = len(SEED)
    s = size + start % (2 ** 64 - size)
    desc["data_offsets"] = [min(s, 2 ** 64 - 1), min(s + extra, 2 ** 64 - 1)]
    check(_rebuild(meta), must_fail=True)


@SETTINGS
@given(a=names, b=names, shift=st.integers(0, 64))
def test_overlapping_ranges(a, b, shift):
    meta, dec = _meta_dict(SEED)
    da, db = meta["tensors"][a], meta["tensors"][b]
    if a == b or da["data_offsets"][0] == da["data_offsets"][1] or db["data_offsets"][0] == db["data_offsets"][1]:
        return
    length = db["data_offsets"][1] - db["data_offsets"][0]
    start = da["data_offsets"][0] + shift % (da["data_offsets"][1] - da["data_offsets"][0])
    db["data_offsets"] = [start, start + length]
    check(_rebuild(meta), must_fail=True)


dims = st.one_of(big, st.sampled_from([0, 1, 2 ** 61, 2 ** 62, 2 ** 63 - 1, 2 ** 63]))
shapes = st.one_of(st.lists(dims, min_size=0, max_size=6),
                   st.lists(st.sampled_from([0, 1]), min_size=60, max_size=70))  # NumPy's 64-axis limit


@SETTINGS
@given(name=names, shape=shapes)
def test_huge_shapes(name, shape):
    meta, dec = _meta_dict(SEED)
    desc = meta["tensors"][name]
    if [int(d) for d in shape] == desc["shape"]:
        return
    length = desc["data_offsets"][1] - desc["data_offsets"][0]
    dtype = next(e.dtype for e in dec.entries if e.name == name)
    from math import prod
    desc["shape"] = shape
    # a shape that fits the byte count may be valid, or still be one NumPy cannot hold: either
    # way the reader decodes it or raises RecordError, never NumPy's ValueError
    fits = prod(shape) * bp.storage_dtype(dtype).itemsize == length
    check(_rebuild(meta), must_fail=not fits)


# shapes whose byte count is right (0 or 4 bytes of F32) but which NumPy cannot hold
NOT_NUMPY = [
    ([0, 2 ** 64 - 1], 0, "dimension 18446744073709551615 (axis 1) exceeds NumPy's limit"),
    ([1] * 65, 4, "65 axes, NumPy holds at most 64"),
    ([0] * 65, 0, "65 axes, NumPy holds at most 64"),
    ([2 ** 32, 2 ** 32, 0], 0, "make 73786976294838206464 bytes, more than NumPy's limit"),
    ([0, 2 ** 62], 0, "make 18446744073709551616 bytes"),
    ([2 ** 31, 2 ** 31, 0], 0, "make 18446744073709551616 bytes"),
]


def _bpk_with_shape(shape, nbytes):
    from .helpers import desc
    return craft({"tensors": {"odd": desc(0, nbytes, shape)}}, bytes(nbytes))


def _st_with_shape(shape, nbytes):
    blob = json.dumps({"odd": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    return struct.pack("<Q", len(blob)) + blob + bytes(nbytes)


@pytest.mark.parametrize("fmt", ["bpk", "safetensors"])
@pytest.mark.parametrize("shape,nbytes,found", NOT_NUMPY, ids=["0x2^64-1", "65-ones", "65-zeros", "2^32x2^32x0",
                                                               "0x2^62", "2^31x2^31x0"])
def test_shapes_that_fit_the_bytes_but_not_numpy_are_record_errors(fmt, shape, nbytes, found, tmp_path):
    blob = (_bpk_with_shape if fmt == "bpk" else _st_with_shape)(shape, nbytes)
    decode = bp.decode if fmt == "bpk" else safetensors_io.decode
    with pytest.raises(RecordError) as info:
        decode(blob)
    assert type(info.value) is RecordError
    msg = str(info.value)
    assert "tensor 'odd'" in msg and "of F32 cannot be held" in msg and found in msg, msg
    assert "expected" in msg and "found" in msg, msg
    path = tmp_path / f"odd.{fmt}"
    path.write_bytes(blob)
    with pytest.raises(RecordError, match=f"{path}: tensor 'odd'"):  # the file is named
        ModuleRecord.load(path)


@pytest.mark.parametrize("shape", [[0, 2 ** 61 - 1], [0] * 64, [1] * 64, [2 ** 30, 0, 2 ** 30]])
def test_shapes_at_numpy_s_limits_still_load(shape):
    nbytes = 4 if all(d == 1 for d in shape) else 0
    for blob, decode in ((_bpk_with_shape(shape, nbytes), bp.decode),
                         (_st_with_shape(shape, nbytes), safetensors_io.decode)):
        e = decode(blob).entries[0]
        assert e.array.shape == tuple(shape) and e.shape == tuple(shape)


@SETTINGS
@given(shape=shapes, dtype=st.sampled_from(["F32", "U8", "F64"]))
def test_safetensors_huge_shapes(shape, dtype):
    from math import prod
    nbytes = prod(shape) * bp.storage_dtype(dtype).itemsize
    data_len = nbytes if nbytes <= 64 else 8
    blob = json.dumps({"w": {"dtype": dtype, "shape": shape, "data_offsets": [0, data_len]}}).encode()
    check(struct.pack("<Q", len(blob)) + blob + bytes(data_len), lambda x: safetensors_io.decode(x),
          must_fail=nbytes != data_len)


@SETTINGS
@given(meta_len=st.integers(0, 2 ** 32 - 1))
def test_metadata_length_field(meta_len):
    b = bytearray(SEED)
    if meta_len == struct.unpack_from("<I", SEED, 6)[0]:
        return
    struct.pack_into("<I", b, 6, meta_len)
    check(bytes(b), must_fail=True)


@SETTINGS
@given(garbage=st.binary(min_size=0, max_size=400))
def test_garbage_cbor(garbage):
    check(craft(meta_bytes=garbage))


def _cbor_values():
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 64), 2 ** 64 - 1), st.floats(),
                       st.text(max_size=8), st.binary(max_size=8))
    return st.recursive(leaves, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                        max_leaves=20)


@SETTINGS
@given(value=_cbor_values(), slot=st.sampled_from(["tensors", "descriptor", "dtype", "metadata", "scalars"]),
       name=names)
def test_structured_garbage_cbor(value, slot, name):
    meta, _ = _meta_dict(SEED)
    if slot == "tensors":
        meta["tensors"] = value
    elif slot == "descriptor":
        meta["tensors"][name] = value
    elif slot == "dtype":
        meta["tensors"][name]["dtype"] = value
    else:
        meta[slot] = value
    check(_rebuild(meta))


@SETTINGS
@given(header_len=st.integers(0, 2 ** 64 - 1), cut=st.integers(0, len(SEED_ST)))
def test_safetensors_lengths_and_truncations(header_len, cut):
    b = bytearray(SEED_ST[:cut])
    if len(b) >= 8 and header_len % 3 == 0:
        struct.pack_into("<Q", b, 0, header_len)
    if bytes(b) == SEED_ST:
        return
    check(bytes(b), lambda x: safetensors_io.decode(x), must_fail=True)


@SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, len(SEED_ST) - 1), st.integers(0, 7)), min_size=1, max_size=8))
def test_safetensors_bit_flips(flips):
    b = bytearray(SEED_ST)
    limit = 8 + struct.unpack_from("<Q", SEED_ST)[0]
    for pos, bit in flips:
        b[pos % limit] ^= 1 << bit
    check(bytes(b), lambda x: safetensors_io.decode(x))


@SETTINGS
@given(value=_cbor_values().filter(lambda v: not isinstance(v, bytes)), name=st.sampled_from(["w", "__metadata__"]),
       key=st.sampled_from(["dtype", "shape", "data_offsets", None]))
def test_safetensors_structured_garbage(value, name, key):
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    try:
        if key is None or name == "__metadata__":
            header[name] = value
        else:
            header[name][key] = value
        blob = json.dumps(header, default=lambda o: None).encode()
    except (ValueError, TypeError):
        return
    check(struct.pack("<Q", len(blob)) + blob + bytes(8), lambda x: safetensors_io.decode(x))


def test_the_cap_really_bounds_memory():
    """The harness itself: a reader that allocated from an unchecked size would fail."""
    with pytest.raises(MemoryError):
        with capped_memory():
            np.ones(FUZZ_HEADROOM * 2, np.uint8)
