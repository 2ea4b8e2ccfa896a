"""A run's scalars as TensorBoard event files, written with `tensorboardX` (its own record writer
and protobuf messages: no hand-written protobuf), so `tensorboard --logdir FOLDER` shows Ember's
runs beside any other tool's.

    write_tensorboard(folder, runs)   # FOLDER/<run name>/events.out.tfevents.*

Each run gets a folder of its own (TensorBoard's unit of comparison: one colour per run) holding
the tags

    train/loss_step        the loss of every step              (x: global step)
    train/lr               the learning rate of every step
    train/<metric>         each training metric at an epoch's end (loss, accuracy, perplexity,
    valid/<metric>         tokens_per_second, ...) and each validation metric (x: the epoch's last step)

A run's folder is written whole into a staging folder and swapped in (`engine.store.atomic.
save_folder`): an export killed at any moment leaves the previous export of that run or the new
one; a second export of a run replaces its event files and keeps anything else in its folder."""
from __future__ import annotations

import re
from pathlib import Path

from ..store.atomic import save_folder
from .run_history import RunHistory

EVENTS_PREFIX = "events.out.tfevents"
_UNSAFE = re.compile(r"[^\w.\- ]+")


def run_folder_name(name: str) -> str:
    """A run's name as a folder name: characters a file system may refuse become '_'."""
    safe = _UNSAFE.sub("_", name).strip(" .") or "run"
    return safe[:120]


def scalars(run: RunHistory) -> list[tuple[str, int, float]]:
    """Every (tag, global step, value) `write_tensorboard` writes for `run`, in order."""
    out = [("train/loss_step", int(s), float(v)) for s, v in zip(run.steps, run.losses)]
    out += [("train/lr", int(s), float(v)) for s, v in zip(run.lr_steps, run.lrs)]
    for row in run.epochs:
        for split in ("train", "valid"):
            for name, value in (row.get(split) or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.append((f"{split}/{name}", int(row["global_step"]), float(value)))
    return out


def write_tensorboard(folder, runs) -> list[Path]:
    """Write each run's scalars under `folder`/<run name>/; returns the run folders written.
    Two runs of one name get folders `name`, `name (2)`. Raises OSError when a folder cannot be
    written (what was written before stays whole)."""
    from tensorboardX import SummaryWriter  # noqa: PLC0415 - protobuf is loaded only to export

    root = Path(folder)
    written: list[Path] = []
    taken: set[str] = set()
    for run in runs:
        base = run_folder_name(run.name)
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base} ({n})"
        taken.add(name)
        rows = scalars(run)

        def write(staging: Path, rows=rows) -> None:
            writer = SummaryWriter(logdir=str(staging), flush_secs=3600)
            try:
                for tag, step, value in rows:
                    writer.add_scalar(tag, value, global_step=step)
            finally:
                writer.close()
            if not any(p.name.startswith(EVENTS_PREFIX) for p in staging.iterdir()):
                raise OSError(f"{staging}: tensorboardX wrote no event file")

        written.append(save_folder(root / name, write, owned=lambda entry: entry.startswith(EVENTS_PREFIX)))
    return written
