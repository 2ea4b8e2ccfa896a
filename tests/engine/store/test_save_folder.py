"""`atomic.save_folder`: several files saved into a folder at one moment, the folder's other
entries kept (the kill tests of a real save are tests/engine/models/test_kill_saves.py)."""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from engine.store import atomic


def _writer(files: dict[str, bytes]):
    def write(staging: Path) -> None:
        for name, data in files.items():
            atomic.write_new_file(staging / name, lambda fp, data=data: fp.write(data))
    return write


def _owned(name: str) -> bool:
    return name.startswith("part-") or name == "head.json"


def _user_entries(folder: Path) -> None:
    (folder / "notes.txt").write_text("mine")
    os.symlink("notes.txt", folder / "link")
    (folder / "runs").mkdir()
    (folder / "runs" / "log.txt").write_text("log")


def _listing(folder: Path) -> dict[str, object]:
    out = {}
    for p in sorted(folder.iterdir()):
        out[p.name] = (f"-> {os.readlink(p)}" if p.is_symlink() else
                       sorted(c.name for c in p.iterdir()) if p.is_dir() else p.read_bytes())
    return out


def _beside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


OLD = {"head.json": b"old head", "part-1": b"old 1", "part-2": b"old 2", "part-3": b"old 3"}
NEW = {"head.json": b"new head", "part-1": b"new 1"}
WANT = {"head.json": b"new head", "link": "-> notes.txt", "notes.txt": b"mine", "part-1": b"new 1",
        "runs": ["log.txt"]}


@pytest.fixture
def folder(tmp_path) -> Path:
    folder = tmp_path / "out"
    atomic.save_folder(folder, _writer(OLD), _owned)
    _user_entries(folder)
    return folder


def _inodes(folder: Path) -> dict[str, int]:
    return {n: os.lstat(folder / n).st_ino for n in ("notes.txt", "runs")}


def test_the_save_replaces_its_files_and_keeps_the_users_entries_themselves(folder):
    before = _inodes(folder)
    got = atomic.save_folder(folder, _writer(NEW), _owned)
    assert got == folder
    assert _listing(folder) == WANT
    assert _inodes(folder) == before  # the same file and folder, not copies
    assert _beside(folder) == []


def test_without_an_exchange_call_the_folder_is_renamed_aside_and_back(folder, monkeypatch):
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    atomic.save_folder(folder, _writer(NEW), _owned)
    assert _listing(folder) == WANT and _beside(folder) == []


def test_where_nothing_can_be_swapped_the_files_are_replaced_in_place(folder, monkeypatch):
    monkeypatch.setattr(atomic, "_can_swap", lambda folder, parent: False)
    atomic.save_folder(folder, _writer(NEW), _owned)
    assert _listing(folder) == WANT and _beside(folder) == []


def test_on_a_file_system_without_hard_links_files_are_moved_back(folder, monkeypatch):
    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_links)
    before = _inodes(folder)
    atomic.save_folder(folder, _writer(NEW), _owned)
    assert _listing(folder) == WANT and _inodes(folder) == before and _beside(folder) == []


def test_a_save_stopped_after_its_swap_is_finished_by_the_next_one(folder, monkeypatch):
    real = atomic._finish
    monkeypatch.setattr(atomic, "_finish", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        atomic.save_folder(folder, _writer(NEW), _owned)
    # the save took effect; the user's sub-folder is still in the old folder beside it
    assert {n: v for n, v in _listing(folder).items() if n != "runs"} == {n: v for n, v in WANT.items() if n != "runs"}
    left = _beside(folder)
    assert len(left) == 2 and (folder.parent / left[1] / "runs" / "log.txt").is_file()  # .save, .save.d
    monkeypatch.setattr(atomic, "_finish", real)
    # this process is alive: its state is kept until STALE_TEMP_S has passed (or it has died)
    assert atomic.remove_stale_folder_saves(folder) == []
    later = time.time() + atomic.STALE_TEMP_S + 1
    assert len(atomic.remove_stale_folder_saves(folder, now=later)) == 1
    assert _listing(folder) == WANT and _beside(folder) == []


def test_a_failing_write_leaves_the_folder_and_nothing_beside_it(folder):
    before = _listing(folder)

    def write(staging):
        _writer(NEW)(staging)
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        atomic.save_folder(folder, write, _owned)
    assert _listing(folder) == before and _beside(folder) == []


def test_a_folder_named_like_a_file_of_the_save_is_an_error_and_nothing_changes(folder):
    (folder / "part-1").unlink()
    (folder / "part-1").mkdir()
    before = _listing(folder)
    with pytest.raises(IsADirectoryError):
        atomic.save_folder(folder, _writer(NEW), _owned)
    assert _listing(folder) == before and _beside(folder) == []


def test_a_link_to_the_folder_saves_into_its_target_and_stays_a_link(folder, tmp_path):
    os.symlink(folder, tmp_path / "alias")
    assert atomic.save_folder(tmp_path / "alias", _writer(NEW), _owned) == folder
    assert (tmp_path / "alias").is_symlink() and _listing(folder) == WANT and _beside(folder) == []


def test_a_new_folder_gets_the_usual_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        atomic.save_folder(tmp_path / "a" / "new", _writer(NEW))
    finally:
        os.umask(umask)
    assert (tmp_path / "a" / "new").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "new" / "part-1").stat().st_mode & 0o777 == 0o644


def test_a_folder_that_cannot_be_moved_gets_its_files_replaced_in_place(folder, monkeypatch):
    def refuse(a, b):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(b))
    monkeypatch.setattr(atomic, "exchange", refuse)
    atomic.save_folder(folder, _writer(NEW), _owned)
    assert _listing(folder) == WANT and _beside(folder) == []


def test_the_cleanup_of_a_folder_leaves_the_saves_of_a_folder_with_a_longer_name(folder, monkeypatch):
    other = folder.parent / f"{folder.name}.7"
    atomic.save_folder(other, _writer(OLD), _owned)
    _user_entries(other)
    real = atomic._finish
    monkeypatch.setattr(atomic, "_finish", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        atomic.save_folder(other, _writer(NEW), _owned)
    monkeypatch.setattr(atomic, "_finish", real)
    later = time.time() + atomic.STALE_TEMP_S + 1
    before = _listing(folder)
    assert atomic.remove_stale_folder_saves(folder, now=later) == []
    assert _listing(folder) == before and "runs" not in _listing(other)
    assert len(atomic.remove_stale_folder_saves(other, now=later)) == 1
    assert _listing(other) == WANT


def test_what_a_killed_in_place_save_left_inside_the_folder_goes_with_the_next_save(folder):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stray = folder / f"{atomic.IN_PLACE_PREFIX}{dead}.k1llx"
    stray.mkdir()
    (stray / "part-1").write_bytes(b"half")
    atomic.save_folder(folder, _writer(NEW), _owned)
    assert _listing(folder) == WANT and _beside(folder) == []


def test_a_process_working_in_the_folder_goes_on_in_the_new_one(folder, monkeypatch):
    monkeypatch.chdir(folder)
    atomic.save_folder(".", _writer(NEW), _owned)
    assert Path.cwd() == folder and Path("part-1").read_bytes() == b"new 1"
    assert _listing(folder) == WANT and _beside(folder) == []


def test_the_folder_keeps_its_mode(folder):
    os.chmod(folder, 0o710)
    atomic.save_folder(folder, _writer(NEW), _owned)
    assert folder.stat().st_mode & 0o777 == 0o710 and _listing(folder) == WANT


def _refuse_exchange(a, b):
    raise PermissionError(errno.EPERM, "Operation not permitted", str(b))


@pytest.mark.parametrize("way", ["swap", "rename aside", "in place", "cannot be moved"])
def test_a_sub_folder_of_the_save_replaces_the_old_one_and_the_users_stays(folder, monkeypatch, way):
    """A save that writes a sub-folder (an export's adapter folder) replaces the old sub-folder of
    that name whole: no file of the old one is left in it; the user's own sub-folder stays."""
    def write(files):
        def go(staging):
            _writer(NEW)(staging)
            (staging / "part-adapter").mkdir()
            _writer(files)(staging / "part-adapter")
        return go
    atomic.save_folder(folder, write({"a.json": b"old a", "old-only": b"x"}), _owned)
    if way == "rename aside":
        monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    elif way == "in place":
        monkeypatch.setattr(atomic, "_can_swap", lambda folder, parent: False)
    elif way == "cannot be moved":
        monkeypatch.setattr(atomic, "exchange", _refuse_exchange)
    atomic.save_folder(folder, write({"a.json": b"new a"}), _owned)
    assert _listing(folder) == {**WANT, "part-adapter": ["a.json"]}
    assert (folder / "part-adapter" / "a.json").read_bytes() == b"new a"
    assert _beside(folder) == [] and not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_a_file_of_the_save_never_replaces_a_folder_and_a_folder_never_replaces_a_file(folder):
    (folder / "part-1").unlink()
    (folder / "part-1").mkdir()  # the save writes a file part-1: refused, as before
    before = _listing(folder)

    def write(staging):
        _writer(NEW)(staging)
    with pytest.raises(IsADirectoryError):
        atomic.save_folder(folder, write, _owned)
    assert _listing(folder) == before and _beside(folder) == []
    # a sub-folder the save does not own is the user's: a save writing one of that name is refused too
    (folder / "part-1").rmdir()

    def write_runs(staging):
        _writer(NEW)(staging)
        (staging / "runs").mkdir()
    before = _listing(folder)
    with pytest.raises(IsADirectoryError):
        atomic.save_folder(folder, write_runs, _owned)
    assert _listing(folder) == before and _beside(folder) == []


def test_a_save_of_a_sub_folder_stopped_after_its_swap_is_finished_by_the_next_one(folder, monkeypatch):
    def write(files):
        def go(staging):
            _writer(NEW)(staging)
            (staging / "part-adapter").mkdir()
            _writer(files)(staging / "part-adapter")
        return go
    atomic.save_folder(folder, write({"a.json": b"old a", "old-only": b"x"}), _owned)
    real = atomic._finish
    monkeypatch.setattr(atomic, "_finish", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        atomic.save_folder(folder, write({"a.json": b"new a"}), _owned)
    assert sorted(p.name for p in (folder / "part-adapter").iterdir()) == ["a.json"]  # in effect already
    monkeypatch.setattr(atomic, "_finish", real)
    later = time.time() + atomic.STALE_TEMP_S + 1
    assert len(atomic.remove_stale_folder_saves(folder, now=later)) == 1
    assert _listing(folder) == {**WANT, "part-adapter": ["a.json"]} and _beside(folder) == []
