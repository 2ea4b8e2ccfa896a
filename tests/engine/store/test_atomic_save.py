"""Saving is atomic: a save that fails, or a process killed in the middle of one, leaves the
previous file intact."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.store import ModuleRecord, RecordError, TensorEntry, atomic

ROOT = Path(__file__).resolve().parents[3]


def _record(value: float, n: int = 1000) -> ModuleRecord:
    return ModuleRecord([TensorEntry.from_array("w", np.full(n, value, np.float32), param_id=5)])


def test_save_replaces_and_leaves_no_temporary(tmp_path):
    target = _record(1.0).save(tmp_path / "m")
    assert target == tmp_path / "m.bpk"
    _record(2.0).save(target)
    assert ModuleRecord.load(target)["w"].array[0] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bpk"]


def test_a_failing_save_keeps_the_old_file(tmp_path, monkeypatch):
    from engine.store import burnpack

    target = _record(1.0).save(tmp_path / "m.bpk")
    before = target.read_bytes()
    real_write = burnpack.write

    def half_then_fail(fp, entries, metadata=None, scalars=None):
        class Half:
            def write(self, b):
                fp.write(b)
                raise OSError(28, "No space left on device")
        real_write(Half(), entries, metadata, scalars)

    monkeypatch.setattr(burnpack, "write", half_then_fail)
    with pytest.raises(RecordError, match="No space left on device"):
        _record(2.0).save(target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bpk"]


def test_save_into_a_missing_folder_is_a_record_error(tmp_path):
    with pytest.raises(RecordError, match="does not exist"):
        _record(1.0).save(tmp_path / "nope" / "m.bpk")


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, {root!r})
    from engine.store import ModuleRecord, TensorEntry, burnpack

    real_write = burnpack.write

    class Stalling:
        # forwards writes; once half the file is out, says so and waits to be killed
        def __init__(self, fp, total):
            self.fp, self.total, self.done, self.told = fp, total, 0, False
        def write(self, b):
            n = self.fp.write(b)
            self.done += len(memoryview(b).cast("B"))
            if not self.told and self.done * 2 >= self.total:
                self.fp.flush()
                self.told = True
                print("HALF", flush=True)
                time.sleep(60)
            return n

    def stalling_write(fp, entries, metadata=None, scalars=None):
        total = burnpack.layout(entries, metadata, scalars)[3]
        return real_write(Stalling(fp, total), entries, metadata, scalars)

    burnpack.write = stalling_write
    entries = [TensorEntry.from_array(f"t{{i}}", np.full(250_000, 2.0, np.float32)) for i in range(8)]
    ModuleRecord(entries).save({target!r})
    print("SAVED", flush=True)
""")


def test_sigkill_in_the_middle_of_a_save_leaves_the_old_file(tmp_path):
    target = tmp_path / "model.bpk"
    old = ModuleRecord([TensorEntry.from_array(f"t{i}", np.full(250_000, 1.0, np.float32)) for i in range(8)])
    old.save(target)
    before = target.read_bytes()
    code = CHILD.format(root=str(ROOT), target=str(target))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        assert line == "HALF", child.stderr.read()
        temps = [p for p in tmp_path.iterdir() if p.name != "model.bpk"]
        assert len(temps) == 1 and temps[0].name.startswith(".model.bpk.")
        assert temps[0].stat().st_size >= len(before) // 2  # really half-way through
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert target.read_bytes() == before
    rec = ModuleRecord.load(target)
    assert all((rec[f"t{i}"].array == 1.0).all() for i in range(8))
    # the killed writer's temporary file names its pid; once it is old, the next save removes it
    stray = temps[0]
    assert stray.exists() and stray.name.startswith(f".model.bpk.{child.pid}.")
    old.save(target)
    assert stray.exists()  # fresh: perhaps still being written
    aged = time.time() - atomic.STALE_TEMP_S - 5
    os.utime(stray, (aged, aged))
    old.save(target)
    assert not stray.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bpk"]


def test_only_stale_temporaries_of_gone_writers_are_removed(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    aged = time.time() - atomic.STALE_TEMP_S - 5
    names = {
        f".m.bpk.{dead_pid}.abc123.tmp": (aged, False),  # writer gone, untouched for long: removed
        f".m.bpk.{dead_pid}.fresh1.tmp": (time.time(), True),  # writer gone but written just now
        f".m.bpk.{os.getpid()}.mine01.tmp": (aged, True),  # this process: maybe a save in progress
        f".m.bpk.{os.getppid()}.parent.tmp": (aged, True),  # a live process
        f".other.bpk.{dead_pid}.abc123.tmp": (aged, True),  # another target's
        ".m.bpk.notapid.tmp": (aged, True),  # not a name this module writes
        "m.bpk.tmp": (aged, True),
    }
    for name, (mtime, _) in names.items():
        f = tmp_path / name
        f.write_bytes(b"partial")
        os.utime(f, (mtime, mtime))
    _record(1.0).save(tmp_path / "m.bpk")
    for name, (_, kept) in names.items():
        assert (tmp_path / name).exists() == kept, name
    assert (tmp_path / "m.bpk").exists()


def test_optimizer_state_saves_atomically(tmp_path):
    from engine import nn, optim

    model = nn.LinearConfig(3, 2).init().train()
    opt = optim.AdamConfig().init()
    loss = model.forward(Tensor.ones([4, 3])).sum()
    model = opt.step(0.1, model, optim.GradientsParams.from_grads(loss.backward(), model))
    path = opt.save(tmp_path / "adam")
    assert path == tmp_path / "adam.bpk" and sorted(p.name for p in tmp_path.iterdir()) == ["adam.bpk"]
    with pytest.raises(RecordError, match="does not exist"):
        opt.save(tmp_path / "missing" / "adam")


def test_random_sigkills_never_leave_a_partial_file(tmp_path):
    target = tmp_path / "m.bpk"
    old = ModuleRecord([TensorEntry.from_array("t", np.full(2_000_000, 1.0, np.float32))])
    old.save(target)
    before = target.read_bytes()
    code = (f"import sys, numpy as np; sys.path.insert(0, {str(ROOT)!r}); "
            "from engine.store import ModuleRecord, TensorEntry; print('GO', flush=True); "
            "[ModuleRecord([TensorEntry.from_array('t', np.full(2_000_000, 2.0, np.float32))])"
            f".save({str(target)!r}) for _ in range(1000)]")
    outcomes = set()
    for delay in (0.05, 0.2, 0.4):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "GO"
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        data = target.read_bytes()
        rec = ModuleRecord.from_bytes(data)  # a partial file would fail here
        value = float(rec["t"].array[0])
        assert value in (1.0, 2.0) and (rec["t"].array == value).all()
        outcomes.add(value)
        if value == 1.0:
            assert data == before


def test_saving_over_a_file_that_is_still_mapped_keeps_the_loaded_values(tmp_path):
    target = _record(1.0).save(tmp_path / "m.bpk")
    loaded = ModuleRecord.load(target)  # views into a mapping of the old file
    view = loaded["w"].array
    _record(2.0).save(target)  # replaces the path; the mapped old file lives on
    assert (view == 1.0).all()
    assert (ModuleRecord.load(target)["w"].array == 2.0).all()
    view[0] = 5.0  # the mapping is copy-on-write: the file on disk never changes
    assert ModuleRecord.load(target)["w"].array[0] == 2.0
