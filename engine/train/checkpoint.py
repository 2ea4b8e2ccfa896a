"""Training checkpoints: a folder holding the model record, the optimizer state, the
scheduler state and the loop's progress.

    epoch-<e>/model.bpk        module.into_record() (burnpack)
    epoch-<e>/optimizer.bpk    optimizer.to_record() (burnpack, Burn's optimizer-record names)
    epoch-<e>/scheduler.bpk    the scheduler's scalars (burnpack scalars, no tensors)
    epoch-<e>/training.json    {"epoch", "global_step", "seed", "step_losses", "history"}

The folder is written under a temporary name (`<name>.partial`), each file fsync'ed, and
renamed when complete, so a crash never leaves a half checkpoint under the final name. An
existing checkpoint of the same name is first renamed to `<name>.old` and deleted only once
the new one is in place.
"""
from __future__ import annotations

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
    tmp.mkdir(parents=True)
    # every file is fsync'ed (atomic_write), so the folder renamed into place is complete
    model.into_record().save(tmp / "model.bpk")
    optimizer.save(tmp / "optimizer.bpk")
    scalars = {k: bp.Scalar.of(v) for k, v in scheduler.to_record().items()}
    data = bp.encode([], None, scalars)
    atomic_write(tmp / "scheduler.bpk", lambda fp: fp.write(data), error=CheckpointError)
    atomic_write_text(tmp / "training.json", json.dumps(progress), error=CheckpointError)
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
