""".npz files that are broken, truncated or lie about their size: every one is a DataFileError
naming the array, what its header declares and what the archive holds, found before any
array is allocated (never a MemoryError, never NumPy's own ValueError)."""
import io
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.train import DataFileError, load_npz
from tests.limits import capped_memory



def npy(shape, descr="<f8", data=b"", fortran=False, version=(1, 0)) -> bytes:
    """A .npy file with any header, even one NumPy itself would not write."""
    header = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {tuple(shape)!r}, }}"
    length_size = 2 if version == (1, 0) else 4
    pad = -(6 + 2 + length_size + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    length = struct.pack("<H" if version == (1, 0) else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header + data


def npz(path, members: dict, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, blob in members.items():
            z.writestr(name + ".npy", blob)
    return path


def good_y(n=4) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(n))
    return buf.getvalue()


def test_a_1kb_file_declaring_2_to_the_40_floats(tmp_path):
    path = npz(tmp_path / "huge.npz", {"x": npy((2 ** 40,), data=bytes(800)), "y": good_y()})
    assert path.stat().st_size < 1300
    with capped_memory(), pytest.raises(DataFileError) as info:
        load_npz(path)
    assert type(info.value) is DataFileError
    assert str(info.value) == (
        f"{path}: array 'x': truncated: its header declares shape [1099511627776] of float64, "
        f"8796093022208 bytes, the archive member holds 800 bytes after its header")


def test_a_truncated_array(tmp_path):
    x = np.arange(18, dtype=np.float32).reshape(6, 3)
    buf = io.BytesIO()
    np.save(buf, x)
    cut = buf.getvalue()[:-32]  # the member is a valid zip entry, its array data is short
    path = npz(tmp_path / "cut.npz", {"x": cut, "y": good_y(6)})
    with pytest.raises(DataFileError, match=r"cut.npz: array 'x': truncated: its header declares shape \[6, 3\] of "
                                            r"float32, 72 bytes, the archive member holds 40 bytes after its header"):
        load_npz(path)


def test_extra_bytes_after_the_array_are_refused_too(tmp_path):
    path = npz(tmp_path / "extra.npz", {"x": npy((2,), data=bytes(24)), "y": good_y(2)})
    with pytest.raises(DataFileError, match=r"array 'x': its header declares shape \[2\] of float64, 16 bytes, "
                                            r"the archive member holds 24 bytes"):
        load_npz(path)


@pytest.mark.parametrize("shape,found", [
    ((0, 2 ** 64 - 1), "dimension 18446744073709551615 (axis 1) exceeds NumPy's limit"),
    ((0,) * 65, "65 axes, NumPy holds at most 64"),
    ((1,) * 65, "65 axes, NumPy holds at most 64"),
    ((2 ** 32, 2 ** 32, 0), "make 147573952589676412928 bytes, more than NumPy's limit"),
    ((0, -3), None),
])
def test_shapes_numpy_cannot_hold(tmp_path, shape, found):
    path = npz(tmp_path / "odd.npz", {"x": npy(shape), "y": good_y()})
    with capped_memory(), pytest.raises(DataFileError) as info:
        load_npz(path)
    assert type(info.value) is DataFileError
    msg = str(info.value)
    if found is None:
        assert "array 'x': expected a shape of non-negative sizes, found [0, -3]" in msg, msg
    else:
        assert "array 'x': expected a shape NumPy can hold, found [" in msg and found in msg, msg


def test_a_deflated_member_that_claims_more_than_it_can_hold(tmp_path):
    path = tmp_path / "bomb.npz"
    npz(path, {"x": npy((4,), data=bytes(32)), "y": good_y()}, compression=zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    # the central directory's uncompressed size of x.npy: claim 2**31 bytes
    cd = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"x.npy") + 1)
    struct.pack_into("<I", raw, cd + 24, 2 ** 31)
    path.write_bytes(bytes(raw))
    with capped_memory(), pytest.raises(DataFileError, match=r"array 'x': the archive lists 2147483648 bytes for it, "
                                                             r"more than \d+ compressed bytes can hold"):
        load_npz(path)


def test_objects_strings_and_other_formats(tmp_path):
    obj = npz(tmp_path / "obj.npz", {"x": npy((2,), descr="|O", data=bytes(16)), "y": good_y(2)})
    with pytest.raises(DataFileError, match=r"array 'x': expected numbers, found dtype object \(Python objects, "
                                            r"which cannot be read without pickle\)"):
        load_npz(obj)
    text = npz(tmp_path / "text.npz", {"x": npy((2,), descr="<U3", data=bytes(24)), "y": good_y(2)})
    with pytest.raises(DataFileError, match="array 'x': expected numbers, found dtype <U3"):
        load_npz(text)
    v3 = npz(tmp_path / "v3.npz", {"x": npy((2,), data=bytes(16), version=(3, 0)), "y": good_y(2)})
    with pytest.raises(DataFileError, match="array 'x': expected .npy format version 1.0 or 2.0, found 3.0"):
        load_npz(v3)
    other = npz(tmp_path / "other.npz", {"x": b"just text", "y": good_y(2)})
    with pytest.raises(DataFileError, match="array 'x': expected a .npy array in the archive, found other data"):
        load_npz(other)
    single = tmp_path / "single.npz"
    single.write_bytes(good_y(2))
    with pytest.raises(DataFileError, match="found a single .npy array"):
        load_npz(single)


def test_what_numpy_writes_still_loads(tmp_path):
    rng = np.random.default_rng(0)
    x = np.asfortranarray(rng.normal(size=(5, 3)))
    y = np.arange(5, dtype=">i4")  # big-endian
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, x=x, y=y)
        ds = load_npz(path)
        np.testing.assert_array_equal(ds.inputs, x)
        assert ds.targets.tolist() == y.tolist()
    big = npz(tmp_path / "v2.npz", {"x": npy((2, 2), "<f4", np.ones(4, np.float32).tobytes(), version=(2, 0)),
                                     "y": good_y(2)})
    np.testing.assert_array_equal(load_npz(big).inputs, np.ones((2, 2), np.float32))
    fort = npz(tmp_path / "f.npz", {"x": npy((2, 3), "<f4", np.arange(6, dtype=np.float32).tobytes(), fortran=True),
                                     "y": good_y(2)})
    np.testing.assert_array_equal(load_npz(fort).inputs, np.arange(6, dtype=np.float32).reshape(3, 2).T)


def _seed(compression) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as z:
        z.writestr("x.npy", npy((3, 2), "<f4", np.arange(6, dtype=np.float32).tobytes()))
        z.writestr("y.npy", good_y(3))
    return buf.getvalue()


SEEDS = {"stored": _seed(zipfile.ZIP_STORED), "deflated": _seed(zipfile.ZIP_DEFLATED)}
FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _load_or_data_file_error(tmp_path, blob: bytes):
    path = tmp_path / "f.npz"
    path.write_bytes(blob)
    with capped_memory():
        try:
            load_npz(path)
        except DataFileError as e:
            assert type(e) is DataFileError and str(e).startswith(str(path))


@FUZZ
@given(kind=st.sampled_from(sorted(SEEDS)), cut=st.integers(0, 400),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)), max_size=6))
def test_fuzzed_archives_load_or_raise_data_file_error(tmp_path, kind, cut, flips):
    b = bytearray(SEEDS[kind])
    for pos, bit in flips:
        b[pos % len(b)] ^= 1 << bit
    _load_or_data_file_error(tmp_path, bytes(b[: len(b) - cut % len(b)]))


@FUZZ
@given(shape=st.one_of(st.lists(st.one_of(st.integers(-2, 2 ** 64), st.sampled_from([0, 2 ** 40, 2 ** 62])),
                                max_size=5),
                       st.lists(st.sampled_from([0, 1]), min_size=62, max_size=68)),
       data=st.integers(0, 64), descr=st.sampled_from(["<f8", "<f4", "|u1", ">i2"]))
def test_fuzzed_headers_load_or_raise_data_file_error(tmp_path, shape, data, descr):
    blob = npy(shape, descr, bytes(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("x.npy", blob)
        z.writestr("y.npy", good_y(1))
    _load_or_data_file_error(tmp_path, buf.getvalue())
