"""A training run of this session, as the Training tab keeps it: its name, folder, settings,
history, the model it started from, its worker task and what the task returned.

The run's status has one owner, its history (`history.status`: set by the loop's events and by
`history.end()` when the worker returns); the run folder's `run.json` (`write()`) and the
project's record of the run (`record()`) are written from it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.train.run_folder import write_run
from engine.train.run_history import RunHistory
from engine.train.run_spec import RunSpec
from engine.train.worker import GuiGate, RunControl, RunOutcome

from .core.schema import RunRecord
from .workers import Task


class TrainingRun:
    def __init__(self, name: str, folder: Path, spec: RunSpec, history: RunHistory, source_module: Any,
                 gui_gate: GuiGate | None = None):
        self.name = name
        self.folder = folder
        self.spec = spec
        self.history = history
        self.source_module = source_module
        self.source = None  # the document's source when the run started (the same model family)
        self.control = RunControl(gui_gate)
        self.task: Task | None = None
        self.outcome: RunOutcome | None = None
        self.started_at = time.time()

    @property
    def status(self) -> str:
        return self.history.status

    def write(self, **extra) -> None:
        """Write the run folder's `run.json` with the run's status and progress now."""
        write_run(self.folder, {"name": self.name, "status": self.status, "created": self.started_at,
                                "spec": self.spec.to_json(), "global_step": self.history.global_step,
                                "epoch": self.history.epoch, **extra})

    def record(self) -> RunRecord:
        """What the project remembers of the run."""
        return RunRecord(self.name, str(self.folder), self.status, self.history.global_step, self.history.epoch)
