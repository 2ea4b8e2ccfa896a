"""Run folders: run.json written and read back, fresh folders, and which run 'Resume from
checkpoint' finds on disk."""
import os

from engine.train.checkpoint import FILES
from engine.train.run_folder import latest_checkpoint, new_run_folder, read_run, resumable_on_disk, write_run


def checkpoint(folder, epoch):
    d = folder / f"epoch-{epoch}"
    d.mkdir()
    for f in FILES:
        (d / f).write_text("x")
    return d


def test_run_json_round_trips_and_a_missing_one_reads_none(tmp_path):
    assert read_run(tmp_path) is None
    write_run(tmp_path, {"name": "1: spirals", "status": "running"})
    assert read_run(tmp_path) == {"name": "1: spirals", "status": "running"}
    (tmp_path / "run.json").write_text("{not json")
    assert read_run(tmp_path) is None


def test_new_folders_never_reuse_a_name(tmp_path):
    a = new_run_folder(tmp_path / "runs", "spirals")
    b = new_run_folder(tmp_path / "runs", "spirals")
    assert a != b and a.is_dir() and b.is_dir() and a.name.endswith("-spirals-1") and b.name.endswith("-spirals-2")


def test_the_newest_unfinished_run_with_a_checkpoint_is_resumable(tmp_path):
    assert resumable_on_disk(tmp_path / "none") is None
    old, done, new = (new_run_folder(tmp_path, n) for n in ("old", "done", "new"))
    for i, (folder, status) in enumerate(((old, "stopped"), (done, "finished"), (new, "running"))):
        write_run(folder, {"status": status})
        checkpoint(folder, 1)
        os.utime(folder, (1000 + i, 1000 + i))
    checkpoint(new, 2)
    assert latest_checkpoint(new)[0] == 2
    assert resumable_on_disk(tmp_path) == (new, 2, new / "epoch-2")
    write_run(new, {"status": "finished"})
    os.utime(new, (1002, 1002))
    assert resumable_on_disk(tmp_path)[0] == old
