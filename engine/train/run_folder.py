"""A run's folder: `run.json` (its name, status, settings and progress; `write_run`,
`read_run`), the loop's `epoch-<e>/` checkpoints (`latest_checkpoint`) and, when it trained,
`trained.bpk`. `new_run_folder` makes a fresh one under a runs folder; `resumable_on_disk`
finds the newest unfinished run there that has a checkpoint."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..store.atomic import atomic_write_text
from .checkpoint import FILES


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete `epoch-<e>/` checkpoint of a run folder."""
    best = None
    if not run_dir.is_dir():
        return None
    for p in run_dir.iterdir():
        name = p.name
        if p.is_dir() and name.startswith("epoch-") and name[6:].isdigit():
            if all((p / f).is_file() for f in FILES):
                e = int(name[6:])
                if best is None or e > best[0]:
                    best = (e, p)
    return best


def read_run(run_dir: Path) -> dict | None:
    """The folder's `run.json`; None when it is missing or not JSON."""
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None


def write_run(run_dir: Path, data: dict) -> None:
    """Write `run.json` atomically; a folder that cannot be written is left as it was (the run
    goes on: its record is a convenience for 'Resume from checkpoint')."""
    try:
        atomic_write_text(run_dir / "run.json", json.dumps(data, indent=2, sort_keys=False) + "\n")
    except OSError:
        pass


def new_run_folder(root: Path, label: str) -> Path:
    """A new, empty `<date>-<time>-<label>-<i>` folder under `root` (made if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1, 1000):
        folder = root / f"{stamp}-{label}-{i}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise OSError(f"cannot make a run folder under {root}")


def resumable_on_disk(root: Path) -> tuple[Path, int, Path] | None:
    """(run folder, epoch, checkpoint folder) of the newest run under `root` that did not
    finish and has a complete checkpoint."""
    if not root.is_dir():
        return None
    folders = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in folders:
        info = read_run(folder)
        if info is None or info.get("status") == "finished":
            continue
        found = latest_checkpoint(folder)
        if found is not None:
            return folder, found[0], found[1]
    return None
