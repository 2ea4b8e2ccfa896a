"""A loaded record never depends on its file afterwards: rewriting the file in place (what
`cp other.bpk model.bpk` or `rsync --inplace` do), truncating or deleting it leaves the loaded
module's values as they were and the process alive; reading the changed file again is a
RecordError, never a crash (SIGBUS). Truncations run in a child process, so that a SIGBUS shows
as its exit status instead of killing pytest."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from engine import Module, Tensor, nn
from engine.store import ModuleRecord, RecordError
from engine.store.filesource import FileSource

ROOT = Path(__file__).resolve().parents[3]


class Net(Module):
    def __init__(self):
        self.fc1 = nn.LinearConfig(64, 256).init()
        self.fc2 = nn.LinearConfig(256, 10).init()


def _values(module) -> dict:
    return {path: p.val().numpy().copy() for path, p in module.named_params()}


def _overwrite_in_place(path: Path, data: bytes) -> None:
    """Rewrite the file's bytes without replacing it (same inode), as cp does to an existing
    file and rsync --inplace does."""
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate(len(data))
        f.flush()
        os.fsync(f.fileno())


def _zeroed_copy(path: Path, tmp_path: Path) -> bytes:
    """Another checkpoint of the same structure and size, every value zero."""
    record = Net().into_record()
    for e in record.entries():
        e.array[...] = 0
    data = record.save(tmp_path / f"other{path.suffix}").read_bytes()
    assert len(data) == path.stat().st_size
    return data


@pytest.mark.parametrize("suffix", [".bpk", ".safetensors"])
def test_rewriting_the_file_in_place_leaves_the_loaded_model_unchanged(tmp_path, suffix):
    path = Net().into_record().save(tmp_path / f"model{suffix}")
    model = Net().load_record(ModuleRecord.load(path))
    before = _values(model)
    assert abs(before["fc1.weight"]).sum() > 0
    other = _zeroed_copy(path, tmp_path)
    time.sleep(0.05)  # past the file system's timestamp granularity
    _overwrite_in_place(path, other)
    for name, v in _values(model).items():
        np.testing.assert_array_equal(v, before[name], err_msg=name)
    # the model's own arrays are unchanged, and it still computes
    assert np.isfinite(model.fc2.forward(model.fc1.forward(Tensor.ones([2, 64]))).numpy()).all()
    # a new load reads the new contents (a valid file): all zeros
    again = Net().load_record(ModuleRecord.load(path))
    assert all((v == 0).all() for v in _values(again).values())


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import numpy as np
    from engine import Tensor
    from engine.store import ModuleRecord
    from engine import Module, nn

    class Net(Module):
        def __init__(self):
            self.fc1 = nn.LinearConfig(64, 256).init()
            self.fc2 = nn.LinearConfig(256, 10).init()

    model = Net().load_record(ModuleRecord.load({path!r}))
    print("LOADED", flush=True)
    sys.stdin.readline()  # the parent changes the file now
    out = model.fc2.forward(model.fc1.forward(Tensor.ones([2, 64]))).numpy()
    total = sum(float(np.abs(p.val().numpy()).astype(np.float64).sum()) for _, p in model.named_params())
    print("SUM", repr(total), repr(float(out.astype(np.float64).sum())), flush=True)
    try:  # reading the changed file again
        again = ModuleRecord.load({path!r})
        print("RELOADED", sum(float(np.abs(e.array).sum()) for e in again.entries()), flush=True)
    except Exception as exc:
        print("ERROR", type(exc).__name__, " ".join(str(exc).split()), flush=True)
""")

# what reading the file again gives after each change
AGAIN = {
    "truncate-0": "ERROR RecordError {path}: the file is empty",
    "truncate-half": "ERROR RecordError {path}: truncated: tensor",
    "delete": "ERROR RecordError {path}: no such file",
    "rewrite": "RELOADED 0.0",
}


@pytest.mark.parametrize("change", list(AGAIN))
def test_a_process_whose_checkpoint_file_changes_stays_alive(tmp_path, change):
    """In a child process, so that a SIGBUS (rc -7) would show instead of killing pytest."""
    path = Net().into_record().save(tmp_path / "model.bpk")
    reference = Net().load_record(ModuleRecord.load(path))
    want_total = sum(float(np.abs(p.val().numpy()).astype(np.float64).sum()) for _, p in reference.named_params())
    other = _zeroed_copy(path, tmp_path)
    code = CHILD.format(root=str(ROOT), path=str(path))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        line = child.stdout.readline().strip()
        assert line == "LOADED", child.stderr.read()
        time.sleep(0.05)
        if change == "truncate-0":
            os.truncate(path, 0)
        elif change == "truncate-half":
            os.truncate(path, path.stat().st_size // 2)
        elif change == "delete":
            path.unlink()
        else:
            _overwrite_in_place(path, other)
        out, err = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, (
        f"the child ended with {child.returncode}"
        f"{' (SIGBUS)' if child.returncode == -signal.SIGBUS else ''}: {err[-2000:]}")
    lines = out.splitlines()
    fields = lines[0].split()
    assert fields[0] == "SUM", out
    assert float(fields[1]) == pytest.approx(want_total, rel=1e-9)  # nothing became zero
    assert float(fields[1]) > 0
    assert lines[1].startswith(AGAIN[change].format(path=path)), lines[1]


def test_a_file_source_refuses_to_read_a_file_that_changed(tmp_path):
    """The primitive for deferred (lazy) reads: a change since opening is a RecordError."""
    path = tmp_path / "blob.bin"
    data = np.arange(1024, dtype=np.float32)
    path.write_bytes(data.tobytes())
    time.sleep(0.05)
    src = FileSource(path)
    np.testing.assert_array_equal(src.read_array(0, np.float32, 1024), data)
    arr = src.read_array(400, np.float32, 10)
    assert arr.flags.owndata and arr.flags.writeable and arr.flags.aligned
    np.testing.assert_array_equal(arr, data[100:110])

    _overwrite_in_place(path, np.zeros(1024, np.float32).tobytes())  # same size, same inode
    with pytest.raises(RecordError, match=r"blob.bin: the file changed since it was opened \(it was modified\)"):
        src.read_array(0, np.float32, 4)
    src.close()

    src = FileSource(path)
    os.truncate(path, 0)
    with pytest.raises(RecordError, match=r"the file changed since it was opened \(it now has 0 bytes\)"):
        src.read_array(0, np.float32, 1024)
    with pytest.raises(RecordError, match="changed"):
        src.read_bytes(0, 16)
    src.close()
    with pytest.raises(RecordError, match="closed"):
        src.read_bytes(0, 1)


def test_a_file_source_keeps_reading_the_file_it_opened_when_the_path_is_replaced(tmp_path):
    """An atomic save renames a new file over the path: the open file itself did not change, so
    deferred reads go on returning what was opened."""
    path = Net().into_record().save(tmp_path / "model.bpk")
    first = path.read_bytes()
    with FileSource(path) as src:
        Net().into_record().save(path)  # atomic: temp file + rename
        assert path.read_bytes() != first
        assert src.read_bytes(0, src.size) == first


@pytest.mark.parametrize("threads", [1, 2])
def test_a_file_source_reads_many_ranges_small_and_large(tmp_path, threads):
    import engine

    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, 40_000_000, dtype=np.uint8)
    path = tmp_path / "b.bin"
    path.write_bytes(blob.tobytes())
    spans = [(0, np.float32, 3), (12, np.uint8, 5), (4000, np.float64, 2), (10_000, np.float32, 0),
             (20_000, np.int16, 200_000), (1_000_000, np.float32, 100), (2_000_000, np.uint8, 600_000),
             (3_000_000, np.float32, 5_000_001), (24_000_004, np.float64, 1_999_999)]
    engine.set_num_threads(threads)
    try:
        with FileSource(path) as src:
            arrays = src.read_arrays(list(reversed(spans)))
            os.truncate(path, 30_000_000)
            with pytest.raises(RecordError, match="the file changed since it was opened"):
                src.read_arrays(spans)
    finally:
        engine.set_num_threads(None)
    for (off, dt, count), arr in zip(reversed(spans), arrays):
        want = blob[off: off + np.dtype(dt).itemsize * count].view(dt)
        np.testing.assert_array_equal(arr, want)
        assert arr.flags.owndata and arr.flags.aligned and arr.flags.writeable


def test_a_file_source_refuses_folders_and_missing_files(tmp_path):
    with pytest.raises(RecordError, match="is a folder"):
        FileSource(tmp_path)
    with pytest.raises(RecordError, match="no such file"):
        FileSource(tmp_path / "nope.bpk")
    with pytest.raises(RecordError, match="is a folder"):
        ModuleRecord.load(tmp_path)
