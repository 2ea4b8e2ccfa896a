"""A run's folder: `run.json` (its name, status, settings and progress; `write_run`,
`read_run`), the loop's `epoch-<e>/` checkpoints (`latest_checkpoint`) and, when it trained,
`trained.bpk` (a resumed run's `trained-step<N>.bpk` beside it). `new_run_folder` makes a fresh one under a runs folder; `resumable_on_disk`
finds the newest unfinished run there that has a checkpoint (of the model `accept` takes, when
given). `write_curves` / `read_curves` keep a run's series (`curves.json`) for a reopened project."""
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


def write_curves(run_dir: Path, data: dict) -> bool:
    """Write the run's series (`curves.json`, RunHistory.to_json) atomically; False when the
    folder cannot be written (a full disk: the run's record stays without its curves)."""
    try:
        atomic_write_text(run_dir / "curves.json", json.dumps(data) + "\n")
    except OSError:
        return False
    return True


def read_curves(run_dir: Path) -> dict | None:
    """The folder's `curves.json`; None when it is missing or not JSON."""
    try:
        data = json.loads((run_dir / "curves.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def resumable_on_disk(root: Path, accept=None) -> tuple[Path, int, Path] | None:
    """(run folder, epoch, checkpoint folder) of the newest run under `root` that did not
    finish and has a complete checkpoint; with `accept(run_json)`, only runs it accepts (the
    runs of one model)."""
    if not root.is_dir():
        return None
    folders = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in folders:
        info = read_run(folder)
        if info is None or info.get("status") == "finished":
            continue
        if accept is not None and not accept(info):
            continue
        found = latest_checkpoint(folder)
        if found is not None:
            return folder, found[0], found[1]
    return None
