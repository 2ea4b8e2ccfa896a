"""A training run of this session, and its one owner: its record (name, folder, settings), its
state (the history, with the status), the model it started from, and its worker (the `BackgroundTask`,
the `RunControl` that carries pause / resume / stop, and what the task returned). The Training
tab and its run controls talk to the run: `start()` runs the worker, `pause()` / `resume()` /
`stop()` go to it, and the run tells them what came back (`events`, `finished`, `failed`),
its history already updated.

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
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from engine.train import events as ev
from engine.train.events import Prefill
from engine.train.run_folder import latest_checkpoint, read_curves, read_run, write_curves, write_run
from engine.train.run_history import RunHistory
from engine.train.run_spec import RunSpec
from engine.train.worker import RunControl, RunOutcome, run_training

from .core.schema import RunRecord
from .workers import BackgroundTask, TaskFailure

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


class TrainingRun(QObject):
    events = Signal(list)  # a batch of the loop's events, applied to `history` already
    finished = Signal(object)  # the worker's RunOutcome (`outcome`); the history is not ended yet
    failed = Signal(object)  # a TaskFailure: the worker raised before or outside the loop

    def __init__(self, name: str, folder: Path, spec: RunSpec | None, history: RunHistory, source_module: Any,
                 gui_gate: GuiGate | None = None):
        super().__init__()
        self.name = name
        self.folder = folder
        self.spec = spec
        self.history = history
        self.source_module = source_module
        self.source = None  # the document's source when the run started (the same model family)
        self.control = RunControl(gui_gate.between_steps if gui_gate is not None else None)
        self.task: BackgroundTask | None = None
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

    # ---- the worker ---------------------------------------------------------------------------------
    def start(self, source, generation: int, resume_from: str | None, max_steps: int | None,
              yield_between_steps: bool = False, start_task: Callable | None = None) -> BackgroundTask:
        """Run the worker (`engine.train.worker.run_training`) for the document's `source`, opened
        as the panel's `generation`: the history begins, `run.json` is written, and the task runs
        through `start_task(task, on_finished, on_failed)` (the window's runner) or on its own."""
        self.source = source
        self.generation = generation
        self.history.begin()
        self.write(resumed_from=resume_from)
        task = BackgroundTask(run_training, self.control, self.source_module, self.spec, str(self.folder), resume_from,
                              max_steps, yield_between_steps, title=f"Training {self.name}")
        self.task = task
        task.partial.connect(self._on_events)
        task.cancelled.connect(self._on_cancelled)
        if start_task is not None:
            start_task(task, self._on_outcome, self._on_failure)
        else:
            task.finished.connect(self._on_outcome)
            task.failed.connect(self._on_failure)
            task.start()
        return task

    def pause(self) -> None:
        self.control.pause()

    def resume(self) -> None:
        self.control.resume()

    def stop(self) -> None:
        self.control.stop()

    def cancel_if_asked(self) -> None:
        """The window's Cancel asked the task to stop: stop the run (it ends a pause too)."""
        if self.task is not None and self.task.is_cancel_requested() and not self.control.stopped:
            self.control.stop()

    def shutdown(self, timeout: float) -> None:
        """Stop the run and wait for its thread (the window is closing)."""
        if self.task is not None:
            self.control.stop()
            self.task.wait_thread(timeout)

    def _on_events(self, batch: list) -> None:
        for event in batch:
            self.history.apply(event)
            if isinstance(event, ev.DataInfo):
                self.data_note = event.text
        self.events.emit(batch)

    def _on_outcome(self, out: RunOutcome) -> None:
        self.outcome = out
        self.finished.emit(out)

    def _on_cancelled(self) -> None:
        """The window's Cancel stopped the task: the outcome was left on the run's control."""
        c = self.control
        if c.outcome is not None:
            self._on_outcome(c.outcome)
        else:
            exc = c.exception or RuntimeError("the run was cancelled before it started")
            self._on_failure(TaskFailure(exc, c.traceback))

    def _on_failure(self, failure) -> None:
        self.failed.emit(failure)

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
