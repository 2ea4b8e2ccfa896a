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


def test_sigkill_in_the_middle_of_a_save_leaves_the_old_file_and_the_next_save_removes_its_temp(tmp_path):
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
        assert len(temps) == 1 and temps[0].name.startswith(f".model.bpk.{child.pid}.")
        stray = temps[0]
        assert stray.stat().st_size >= len(before) // 2  # really half-way through
        # a save here while the child is still writing never removes the child's file, even
        # one that looks long untouched: the writer holds its lock
        aged = time.time() - atomic.STALE_TEMP_S - 5
        os.utime(stray, (aged, aged))
        old.save(target)
        assert stray.exists()
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
    # the killed writer's temporary file: the next save removes it at once, however fresh
    now = time.time()
    os.utime(stray, (now, now))
    assert stray.exists()
    old.save(target)
    assert not stray.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bpk"]


def test_killed_saves_do_not_pile_up(tmp_path):
    """Each killed save leaves its temporary file, and the next save (here: the next killed
    one's) removes it at once: there is never more than one, and none after a save that
    finishes."""
    target = tmp_path / "model.bpk"
    code = CHILD.format(root=str(ROOT), target=str(target))
    for _ in range(5):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "HALF", child.stderr.read()
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        strays = [p for p in tmp_path.iterdir() if p.name.startswith(".model.bpk.")]
        assert len(strays) == 1 and strays[0].name.startswith(f".model.bpk.{child.pid}."), strays
    _record(1.0).save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bpk"]


def test_which_temporaries_a_save_removes(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    aged = time.time() - atomic.STALE_TEMP_S - 5
    names = {
        f".m.bpk.{dead_pid}.abc123.tmp": (aged, False),  # writer gone: removed
        f".m.bpk.{dead_pid}.fresh1.tmp": (time.time(), False),  # writer gone, written just now: removed too
        f".m.bpk.{os.getpid()}.mine01.tmp": (time.time(), True),  # a live pid, fresh: maybe a save starting
        f".m.bpk.{os.getppid()}.parent.tmp": (time.time(), True),  # a live process, fresh
        # a live pid but no lock and untouched for long: a reused pid must not keep it forever
        f".m.bpk.{os.getppid()}.reused.tmp": (aged, False),
        f".m.bpk.{os.getpid()}.mine02.tmp": (aged, False),
        f".other.bpk.{dead_pid}.abc123.tmp": (aged, True),  # another target's
        # target `m.bpk.<dead_pid>`'s temporary, its writer live and fresh: not this target's
        f".m.bpk.{dead_pid}.{os.getpid()}.abc123.tmp": (time.time(), True),
        ".m.bpk.notapid.tmp": (aged, True),  # not a name this module writes
        ".m.bpk.0.zero.tmp": (aged, True),  # pid 0 is no writer's
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


def test_a_locked_temporary_is_kept_whatever_its_pid_and_age(tmp_path):
    """A save in progress (its file locked) is never removed: not for a pid that looks dead
    (another machine's, on a shared folder) and not for age."""
    fcntl = pytest.importorskip("fcntl")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    aged = time.time() - atomic.STALE_TEMP_S - 5
    held = []
    for pid in (int(gone.stdout), os.getppid()):
        f = tmp_path / f".m.bpk.{pid}.locked.tmp"
        f.write_bytes(b"partial")
        os.utime(f, (aged, aged))
        fd = os.open(f, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append((f, fd))
    try:
        _record(1.0).save(tmp_path / "m.bpk")
        assert all(f.exists() for f, _ in held)
    finally:
        for _, fd in held:
            os.close(fd)
    _record(1.0).save(tmp_path / "m.bpk")  # unlocked now
    assert not held[0][0].exists()  # dead pid: removed at once
    assert not held[1][0].exists()  # live pid, untouched for long: removed


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


def test_saving_over_a_loaded_file_keeps_the_loaded_values(tmp_path):
    target = _record(1.0).save(tmp_path / "m.bpk")
    loaded = ModuleRecord.load(target)  # arrays of its own: the file is closed
    view = loaded["w"].array
    root = view
    while root.base is not None:
        root = root.base
    assert isinstance(root, np.ndarray) and root.flags.owndata and view.flags.writeable  # no mapping
    _record(2.0).save(target)  # replaces the path
    assert (view == 1.0).all()
    assert (ModuleRecord.load(target)["w"].array == 2.0).all()
    view[0] = 5.0  # writing to a loaded array never touches the file
    assert ModuleRecord.load(target)["w"].array[0] == 2.0
