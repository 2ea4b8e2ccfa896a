"""Training checkpoints: a folder holding the model record, the optimizer state, the
scheduler state and the loop's progress.

    epoch-<e>/model.bpk        module.into_record() (burnpack)
    epoch-<e>/optimizer.bpk    optimizer.to_record() (burnpack, Burn's optimizer-record names)
    epoch-<e>/scheduler.bpk    the scheduler's scalars (burnpack scalars, no tensors)
    epoch-<e>/training.json    {"epoch", "global_step", "seed", "step_losses", "history"}

The folder is written under a temporary name (`<name>.partial`), each file fsync'ed, and
renamed when complete, so a crash never leaves a half checkpoint under the final name. An
existing checkpoint of the same name is first renamed to `<name>.old` and deleted only once
the new one is in place. A write that fails (a full disk) removes its `.partial` folder and
raises the `OSError`; `describe_os_error` says in words what it was (`the disk is full`).
`prune_checkpoints(run_dir, keep)` deletes all but the newest `keep` checkpoints (0 keeps all).
"""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

FILES = ("model.bpk", "optimizer.bpk", "scheduler.bpk", "training.json")


class CheckpointError(ValueError):
    """A checkpoint folder cannot be used; the message says which file and why."""


def save_checkpoint(path, model, optimizer, scheduler, progress: dict) -> Path:
    from ..store import burnpack as bp
    from ..store.atomic import atomic_write, atomic_write_text

    final = Path(path)
    tmp = final.with_name(final.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        # every file is fsync'ed (atomic_write), so the folder renamed into place is complete
        model.into_record().save(tmp / "model.bpk")
        optimizer.save(tmp / "optimizer.bpk")
        scalars = {k: bp.Scalar.of(v) for k, v in scheduler.to_record().items()}
        data = bp.encode([], None, scalars)
        atomic_write(tmp / "scheduler.bpk", lambda fp: fp.write(data), error=CheckpointError)
        atomic_write_text(tmp / "training.json", json.dumps(progress), error=CheckpointError)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no half checkpoint is left behind (a full disk)
        raise
    if final.exists():
        # the old checkpoint moves aside before the new one takes its name and is deleted only
        # after: a crash in between leaves both complete folders, never neither
        old = final.with_name(final.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    return final


def disk_errno(e: BaseException) -> int | None:
    """The errno of an OSError behind `e` (itself, or its cause / context), if any."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def describe_os_error(e: BaseException) -> str:
    """What a failed write was, in words: 'the disk is full (No space left on device)' for
    ENOSPC, the quota for EDQUOT, else the error's own text."""
    code = disk_errno(e)
    text = getattr(e, "strerror", None) or str(e)
    if code == errno.ENOSPC:
        return f"the disk is full ({text})"
    if code == getattr(errno, "EDQUOT", -1):
        return f"the disk quota is exceeded ({text})"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"the folder cannot be written ({text})"
    return text


def checkpoint_folders(run_dir) -> list[tuple[int, Path]]:
    """The run folder's complete `epoch-<e>/` checkpoints, oldest first."""
    root = Path(run_dir)
    found = []
    if not root.is_dir():
        return found
    for p in root.iterdir():
        name = p.name
        if p.is_dir() and name.startswith("epoch-") and name[6:].isdigit():
            found.append((int(name[6:]), p))
    return sorted(found)


def prune_checkpoints(run_dir, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints of a run folder (0: keep all); returns
    the folders deleted."""
    if keep <= 0:
        return []
    removed = []
    for _epoch, folder in checkpoint_folders(run_dir)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def load_checkpoint(path, model, optimizer, scheduler) -> dict:
    """Load a checkpoint into `model` (a module of the same structure), `optimizer` and
    `scheduler`; returns the progress dict with the loaded `model` and `optimizer` added."""
    from ..store import ModuleRecord
    from ..store import burnpack as bp

    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: expected a checkpoint folder (epoch-<n>), found none")
    missing = [f for f in FILES if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: expected the files {list(FILES)}, missing {missing}")
    try:
        progress = json.loads((folder / "training.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{folder / 'training.json'}: expected JSON, line {e.lineno} column {e.colno}: {e.msg}") from None
    for key in ("epoch", "global_step", "step_losses", "history"):
        if key not in progress:
            raise CheckpointError(f"{folder / 'training.json'}: expected a field {key!r}, found {sorted(progress)}")
    model = model.load_record(ModuleRecord.load(folder / "model.bpk"))
    optimizer = optimizer.load(folder / "optimizer.bpk")
    pack = bp.decode((folder / "scheduler.bpk").read_bytes(), str(folder / "scheduler.bpk"))
    scheduler.load_record({k: s.value for k, s in pack.scalars.items()})
    return dict(progress, model=model, optimizer=optimizer)
