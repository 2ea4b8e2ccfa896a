"""A user's .npz / .csv data: loaded when right, refused with file, place, expected and found
when wrong."""
import numpy as np
import pytest

from engine.train import DataFileError, load_csv, load_data_file, load_npz


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_with_header_and_class_labels(tmp_path):
    p = write(tmp_path, "iris.csv", "a,b,label\n1.5,2,0\n3,4.25,1\n\n5,6,2\n")
    ds = load_csv(p)
    np.testing.assert_array_equal(ds.inputs, np.array([[1.5, 2], [3, 4.25], [5, 6]], dtype=np.float32))
    assert ds.targets.dtype == np.int64 and ds.targets.tolist() == [0, 1, 2]


def test_csv_without_header_named_target_and_regression(tmp_path):
    p = write(tmp_path, "r.csv", "0.5,1,2\n0.25,3,4\n")
    ds = load_csv(p, target=0)
    assert ds.targets.dtype == np.float32 and ds.targets.shape == (2, 1)
    np.testing.assert_array_equal(ds.inputs, np.array([[1, 2], [3, 4]], dtype=np.float32))
    p2 = write(tmp_path, "h.csv", "y,x1\n3,1\n4,2\n")
    ds2 = load_csv(p2, target="y", kind="regression")
    assert ds2.targets[:, 0].tolist() == [3.0, 4.0]


def test_csv_non_numeric_cell_names_line_and_column(tmp_path):
    p = write(tmp_path, "bad.csv", "a,b,label\n1,2,0\n3,abc,1\n")
    with pytest.raises(DataFileError) as e:
        load_csv(p)
    msg = str(e.value)
    assert "bad.csv, line 3, column 2" in msg and "expected a number ('b')" in msg and "'abc'" in msg
    assert e.value.line == 3 and e.value.column == 2


def test_csv_wrong_number_of_columns(tmp_path):
    p = write(tmp_path, "short.csv", "a,b,label\n1,2,0\n3,1\n")
    with pytest.raises(DataFileError, match=r"short.csv, line 3: expected 3 columns \(as in the header on line 1\), found 2"):
        load_csv(p)


def test_csv_unknown_target_and_empty_file(tmp_path):
    p = write(tmp_path, "t.csv", "a,b\n1,2\n")
    with pytest.raises(DataFileError, match=r"expected a target column named 'y', found columns \['a', 'b'\]"):
        load_csv(p, target="y")
    with pytest.raises(DataFileError, match="empty file"):
        load_csv(write(tmp_path, "e.csv", "\n\n"))
    with pytest.raises(DataFileError, match="class label"):
        load_csv(write(tmp_path, "c.csv", "1,0.5\n2,1\n"), kind="classification")


def test_npz_roundtrip_and_errors(tmp_path):
    x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    y = np.arange(6) % 2
    good = tmp_path / "good.npz"
    np.savez(good, x=x, y=y)
    ds = load_data_file(good)
    np.testing.assert_array_equal(ds.inputs, x)
    assert ds.targets.tolist() == y.tolist()

    short = tmp_path / "short.npz"
    np.savez(short, x=x, y=y[:4])
    with pytest.raises(DataFileError, match=r"short.npz: arrays 'x' and 'y' must have the same length: expected 6 items.*found 4"):
        load_npz(short)

    keys = tmp_path / "keys.npz"
    np.savez(keys, inputs=x, labels=y)
    with pytest.raises(DataFileError, match=r"expected an array named 'x', found arrays \['inputs', 'labels'\]"):
        load_npz(keys)
    assert len(load_npz(keys, inputs="inputs", targets="labels")) == 6

    text = tmp_path / "text.npz"
    np.savez(text, x=np.array(["a", "b"]), y=np.array([0, 1]))
    with pytest.raises(DataFileError, match="expected numbers, found dtype <U1"):
        load_npz(text)

    junk = write(tmp_path, "junk.npz", "not a zip")
    with pytest.raises(DataFileError, match="junk.npz: expected a NumPy .npz archive"):
        load_npz(junk)
    with pytest.raises(DataFileError, match="expected a .npz or .csv file"):
        load_data_file(tmp_path / "model.json")
