"""A training run of this session, as the Training tab keeps it: its name, folder, settings,
history, the model it started from, its worker task and what the task returned.

The run's status has one owner, its history (`history.status`: set by the loop's events and by
`history.end()` when the worker returns); the run folder's `run.json` (`write()`) and the
project's record of the run (`record()`) are written from it. `run.json` names the model the
run trained (its source), so 'Resume from checkpoint' offers only that model's runs; the run's
series are kept in `curves.json` when it ends (`save_curves()`), and `restored(record)` makes a
run of a reopened project again from its folder (settings, curves, status).
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from engine.train.events import Prefill
from engine.train.run_folder import latest_checkpoint, read_curves, read_run, write_curves, write_run
from engine.train.run_history import RunHistory
from engine.train.run_spec import RunSpec
from engine.train.worker import RunControl, RunOutcome

from .core.schema import RunRecord
from .workers import Task

GUI_WAIT_S = 0.05  # the longest a training step waits for the GUI to end a paint


class GuiGate:
    """Held by the GUI thread while it draws the curves (`hold()` ... `release()`, nested
    holds count); the worker waits on it between two steps (`between_steps`, the engine's
    `RunControl` hook: at most `GUI_WAIT_S` a step), so the drawing's many Python callbacks do
    not each queue for the GIL behind the training thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._holds = 0
        self._free = threading.Event()
        self._free.set()

    def hold(self) -> None:
        with self._lock:
            self._holds += 1
            self._free.clear()

    def release(self) -> None:
        with self._lock:
            self._holds = max(0, self._holds - 1)
            if self._holds == 0:
                self._free.set()

    def is_held(self) -> bool:
        return not self._free.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait until no hold is left, at most `timeout` seconds; False on timeout."""
        return self._free.wait(timeout)

    def between_steps(self) -> None:
        """On the worker, between two steps: the GUI is drawing, let it have the GIL."""
        if self.is_held():
            self.wait(GUI_WAIT_S)


class TrainingRun:
    def __init__(self, name: str, folder: Path, spec: RunSpec | None, history: RunHistory, source_module: Any,
                 gui_gate: GuiGate | None = None):
        self.name = name
        self.folder = folder
        self.spec = spec
        self.history = history
        self.source_module = source_module
        self.source = None  # the document's source when the run started (the same model family)
        self.control = RunControl(gui_gate.between_steps if gui_gate is not None else None)
        self.task: Task | None = None
        self.outcome: RunOutcome | None = None
        self.started_at = time.time()
        self.generation = 0  # which document the run belongs to (the panel counts models opened)
        self.data_note = ""  # how the data file was read (the worker's DataInfo)

    @classmethod
    def restored(cls, record: RunRecord, folder: Path) -> "TrainingRun":
        """A run of a reopened project, made again from its folder: its settings (`run.json`),
        its curves (`curves.json`, else its newest checkpoint's) and the status the project saved."""
        info = read_run(folder) or {}
        try:
            spec = RunSpec.from_json(info["spec"])
        except Exception:  # noqa: BLE001 - a folder without (readable) settings still shows its record
            spec = None
        history = RunHistory(record.name, str(folder))
        curves = read_curves(folder)
        if curves is not None:
            history.load_json(curves)
        else:
            found = latest_checkpoint(folder)
            if found is not None:
                try:
                    progress = json.loads((found[1] / "training.json").read_text())
                    history.apply(Prefill(tuple(progress["step_losses"]), tuple(progress["history"]),
                                          int(progress["global_step"])))
                except (OSError, ValueError, KeyError, TypeError):
                    pass
        history.status = record.status
        history.global_step = max(history.global_step, record.global_step)
        history.epoch = max(history.epoch, record.epoch)
        run = cls(record.name, folder, spec, history, None)
        run.started_at = float(info.get("created", 0.0) or 0.0) if isinstance(info.get("created"), (int, float)) \
            else 0.0
        return run

    @property
    def status(self) -> str:
        return self.history.status

    def write(self, **extra) -> None:
        """Write the run folder's `run.json` with the run's status and progress now."""
        source = self.source.to_json() if hasattr(self.source, "to_json") else None
        write_run(self.folder, {"name": self.name, "status": self.status, "created": self.started_at,
                                "source": source, "spec": self.spec.to_json() if self.spec is not None else None,
                                "global_step": self.history.global_step, "epoch": self.history.epoch, **extra})

    def save_curves(self) -> bool:
        """Keep the run's series in its folder (`curves.json`) for a reopened project."""
        return write_curves(self.folder, self.history.to_json())

    def record(self) -> RunRecord:
        """What the project remembers of the run."""
        return RunRecord(self.name, str(self.folder), self.status, self.history.global_step, self.history.epoch)
