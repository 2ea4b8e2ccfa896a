"""The Training tab: settings forms, run controls, live curves and per-module gradient norms,
wired to `engine.train`'s loop running on a worker thread.

How a run goes:

- Start builds a `RunSpec` from the forms (data, loss, optimizer, schedule, training config,
  device) and a run folder under `runs_dir` (`run.json` plus the loop's `epoch-<e>/`
  checkpoints). A `BackgroundTask` (app.workers) runs `engine.train.worker.run_training` on a thread:
  it makes the data set, forks the document's model to the chosen device, checks that one
  batch fits the model and the loss (a mismatch names the module where it failed), then runs
  a `Learner`.
- The loop's events are batched on the worker and sent as one queued signal at most every
  `FLUSH_S` seconds (control events at once); the GUI thread applies them to the run's
  `RunHistory`, and the curves and progress redraw at most `REFRESH_HZ` times a second, less
  often when a redraw with its paint costs more than `GUI_BUDGET` of the time. While the panel
  redraws and the curves paint, it holds the runs' `GuiGate` and the worker waits between two
  steps (at most `GUI_WAIT_S`), so the paint's many Python callbacks do not each queue for
  the GIL.
- Every `GRAD_NORM_S` seconds the optimizer wrapper (`GradTap`) computes, before the update,
  the L2 norm of the gradients below every module (None for modules with no gradient:
  frozen); the panel shows them and re-emits them as `grad_norms_changed(dict)`.
- A run has one owner, its `TrainingRun` (app/training_run.py): record, history (the status)
  and worker. The panel starts it and passes the controls' pause / resume / stop to it; the run
  applies the worker's events to its history, then tells the panel (`events`, `finished`,
  `failed`), which updates the controls, `run.json` and the project's record of the run.
- Pause / resume / stop go to the learner from the GUI thread (it honours them between two
  steps). A run that ends finished or stopped saves the trained weights in its folder
  (`trained.bpk`) and replaces the document's model with the trained value as one undoable
  step whose edit loads those weights (so a saved project reopens trained), unless the
  document's model changed meanwhile: then 'Apply trained model' does it on request. A failed
  run (NaN loss, an exception, data that does not fit) shows what happened and where, and
  leaves the model as it was.
- 'Resume from checkpoint' continues the last stopped, failed or crashed run of the model open
  now (in this session, in the reopened project, or found on disk with that model's source in
  its `run.json`) from its newest checkpoint.
- Runs belong to the document that made them: opening another model or project shows that
  document's runs only (a reopened project's runs are made again from their folders: settings,
  curves, status), the axes start afresh, the status, progress, gradient norms and figures of the
  model before go, and the settings are those of its last run, else the defaults with the
  example's own task (also for a checkpoint opened into an example's architecture), or for a
  language model causal-lm with its folder's tokenizer and a block size within its positions;
  the metric plotted follows (perplexity for causal-lm).
- A full disk does not throw a trained model away: when `trained.bpk` (or a checkpoint) cannot
  be written, the trained model still becomes the document's model and the panel says it was
  the disk.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QStandardPaths, Qt, QTimer, Signal
from PySide6.QtWidgets import (QApplication, QCheckBox, QHBoxLayout, QLabel, QPushButton, QSplitter,
                               QVBoxLayout, QWidget)

# Everything the worker uses is imported here (`engine.train.worker` imports it all), not on first
# use: an import on the worker thread holds the GIL while PySide's import hook reads the module's
# source, and the window stalls.
from engine.train import events as ev
from engine.module import memory
from engine.train.preflight import TrainingSetupError, estimate_run
from engine.train.checkpoint import describe_os_error
from engine.train.run_folder import latest_checkpoint, new_run_folder, read_run, resumable_on_disk
from engine.train.run_history import RunHistory
from engine.train.run_spec import CAUSAL_LM_TASK, FILE_TASK, RunSpec
from engine.train.tasks import TASKS
from engine.train.text import model_limits
from engine.train.worker import RunOutcome
from widgets.common import ErrorLabel
from widgets.training.config_form import FormError
from widgets.training.curves import TrainingCurves
from widgets.training.grad_norms import GradNormTable
from widgets.training.run_controls import RunControls
from widgets.training.run_settings import RunSettings

from .chat_row_dialog import ChatRowDialog, is_conversation_file
from .run_overlay import RunOverlay
from .core.schema import CheckpointSource, ExampleSource, LoadEdit, Source
from .training_data_note import describe_text_file, missing_tokenizer, tokenizer_folder  # noqa: F401 - reached here
from .training_run import GuiGate, TrainingRun

# A paint of the curves calls back into Python (pyqtgraph's items) many times, and each call would
# queue for the GIL behind the training thread: the worker waits between two steps while the GUI
# paints (`wait_for_paint`). Lowering Python's switch interval during runs (`switch_interval`, off
# by default) was measured too: it cut the paints' delays less and cost more throughput.
SWITCH_INTERVAL_S = None
REFRESH_HZ = 4  # curves and progress redraw at most this often
GUI_BUDGET = 0.05  # ... and less often when a redraw (with its paint) costs more than this share of the time
GRAD_LABEL = "Gradient norms per module (sampled while training)"


def is_language_model(module) -> bool:
    """Whether `module` is a causal language model (a language-model head: the Llama family, GPT-2)."""
    return module is not None and hasattr(module, "lm_head")


def example_task(source: Source | None) -> str | None:
    """The built-in task an example model trains on (its `task()`), if it names one; a
    checkpoint opened into an example's architecture trains on that example's task."""
    if isinstance(source, CheckpointSource):
        source = source.architecture
    if not isinstance(source, ExampleSource):
        return None
    try:
        from resources.examples import example_task as task_of  # noqa: PLC0415

        name = task_of(source.name)
    except Exception:  # noqa: BLE001 - a broken example shows up when it is opened
        return None
    return name if name in TASKS else None


def lm_metrics_text(history: RunHistory) -> str:
    """The language-model figures of a run's last epoch: perplexity (train, validation) and
    target tokens per second ('' before the first epoch ends or for another task)."""
    for row in reversed(history.epochs):
        train, valid = row.get("train", {}), row.get("valid", {})
        if "perplexity" not in train and "perplexity" not in valid:
            continue
        parts = []
        if "perplexity" in train:
            parts.append(f"perplexity {train['perplexity']:.3g} (train)")
        if "perplexity" in valid:
            parts.append(f"{valid['perplexity']:.3g} (validation)")
        if "tokens_per_second" in train:
            parts.append(f"{train['tokens_per_second']:,.0f} tokens/s")
        return f"Epoch {row['epoch']}: " + " · ".join(parts)
    return ""


# ---- the panel ---------------------------------------------------------------------------------
class TrainingPanel(QWidget):
    """The dashboard. `document` is the app's Document; `runs_dir` where run folders go (default:
    beside the project, or the app's data folder); `start_task(task, on_finished, on_failed)`
    optionally runs the worker through the window (status-bar progress and cancel)."""

    grad_norms_changed = Signal(dict)  # module path -> gradient L2 norm (None: frozen)
    run_started = Signal(str)  # run name
    run_ended = Signal(str, str)  # run name, status (finished | stopped | failed)
    active_changed = Signal(bool)

    def __init__(self, document, parent=None, *, runs_dir: str | Path | None = None,
                 default_runs_dir: str | Path | None = None, start_task: Callable | None = None,
                 yield_between_steps: bool = False, switch_interval: float | None = SWITCH_INTERVAL_S,
                 wait_for_paint: bool = True):
        super().__init__(parent)
        self.switch_interval = switch_interval
        self.wait_for_paint = wait_for_paint
        self._saved_switch_interval: float | None = None
        self.setObjectName("training-panel")
        self.document = document
        self._runs_dir = Path(runs_dir) if runs_dir is not None else None
        self._default_runs_dir = Path(default_runs_dir) if default_runs_dir is not None else None
        self._start_task = start_task
        self.yield_between_steps = yield_between_steps
        self.runs: list[TrainingRun] = []
        self.active: TrainingRun | None = None
        self.pending_apply: TrainingRun | None = None
        self.last_error = ""
        self.gui_gate = GuiGate()  # held while the panel redraws and the curves paint
        self._build()
        self._shown_run: TrainingRun | None = None
        self._seen_source: Any = object()  # the source the settings were last defaulted for
        self.generation = 0  # counts the documents opened (set_model): a run belongs to one
        self.refresh_timer = QTimer(self)  # at most REFRESH_HZ redraws a second, however fast events come
        self.refresh_timer.setSingleShot(True)
        self.refresh_timer.setInterval(int(1000 / REFRESH_HZ))
        self.refresh_timer.timeout.connect(self.refresh)
        self.cancel_poll = QTimer(self)
        self.cancel_poll.setInterval(200)
        self.cancel_poll.timeout.connect(self._poll_cancel)
        document.model_changed.connect(self._on_model_changed)
        if hasattr(document, "source_changed"):
            document.source_changed.connect(self._on_document_replaced)
        self._on_document_replaced()
        self._on_model_changed()

    # ---- layout ---------------------------------------------------------------------------------
    def _build(self) -> None:
        self.run_settings = RunSettings()
        self.run_settings.changed.connect(self._update_can_start)
        self.run_settings.changed.connect(self._update_data_note)
        self.run_settings.preview_rows_button.clicked.connect(self.preview_rows)
        self._noted_file: tuple | None = None
        # the forms, as the window, the tests and the benchmarks reach them
        self.data_form = self.run_settings.data_form
        self.browse_button = self.run_settings.browse_button
        self.optimizer_combo = self.run_settings.optimizer_combo
        self.optimizer_forms = self.run_settings.optimizer_forms
        self.schedule_combo = self.run_settings.schedule_combo
        self.schedule_forms = self.run_settings.schedule_forms
        self.training_form = self.run_settings.training_form

        self.controls = RunControls()
        self.controls.start_requested.connect(self.start)
        self.controls.pause_requested.connect(self.pause)
        self.controls.resume_requested.connect(self.resume)
        self.controls.stop_requested.connect(self.stop)
        self.controls.resume_checkpoint_requested.connect(self.resume_from_checkpoint)
        self.apply_check = QCheckBox("Apply the trained model when a run ends")
        self.apply_check.setObjectName("apply-when-done")
        self.apply_check.setChecked(True)
        self.apply_button = QPushButton("Apply trained model")
        self.apply_button.setObjectName("apply")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self.apply_pending)
        self.error_label = ErrorLabel()
        self.error_label.setObjectName("run-error")
        # a causal-lm run's perplexity and tokens per second (its last epoch)
        self.lm_label = QLabel("")
        self.lm_label.setObjectName("lm-metrics")
        self.lm_label.hide()
        apply_row = QHBoxLayout()
        apply_row.addWidget(self.apply_check)
        apply_row.addStretch(1)
        apply_row.addWidget(self.apply_button)

        self.curves = TrainingCurves()
        # "Overlay run…": another run folder's curves beside these (app/run_overlay.py, issue 48)
        self.overlay = RunOverlay(self.curves, start_folder=self.runs_dir, show_error=self._show_error)
        if self.wait_for_paint:
            self.curves.graphics.paint_began.connect(self.gui_gate.hold)
            self.curves.graphics.paint_ended.connect(self.gui_gate.release)
        self.grad_table = GradNormTable()
        norms_box = QWidget()
        nl = QVBoxLayout(norms_box)
        nl.setContentsMargins(0, 0, 0, 0)
        self.grad_label = QLabel(GRAD_LABEL)
        nl.addWidget(self.grad_label)
        nl.addWidget(self.grad_table)
        right_split = QSplitter(Qt.Orientation.Vertical)
        right_split.addWidget(self.curves)
        right_split.addWidget(norms_box)
        right_split.setStretchFactor(0, 4)
        right_split.setStretchFactor(1, 1)
        right_split.setSizes([600, 150])
        # the curves keep their room on a short window; the norms table shrinks (or is dragged shut)
        norms_box.setMinimumHeight(48)
        right_split.setCollapsible(0, False)
        right_split.setCollapsible(1, True)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(4, 4, 4, 4)
        rl.addWidget(self.controls)
        rl.addLayout(apply_row)
        rl.addWidget(self.lm_label)
        rl.addWidget(self.error_label)
        rl.addWidget(right_split, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.run_settings)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([320, 900])
        # the run controls and the curves are the working area: never collapsed; the settings
        # column (a scroll area) can be dragged shut and open again
        split.setCollapsible(0, True)
        split.setCollapsible(1, False)
        self.settings_split = split
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        self.run_settings.show_chosen()
        self._update_can_start()

    # ---- settings -----------------------------------------------------------------------------
    def settings_valid(self) -> bool:
        return self.run_settings.is_valid()

    def _update_can_start(self) -> None:
        self.controls.set_can_start(self.document.module is not None and self.settings_valid())

    def current_spec(self) -> RunSpec:
        """The run the forms describe; raises `FormError` when a form is invalid."""
        return self.run_settings.current_spec()

    def set_spec(self, spec: RunSpec) -> None:
        self.run_settings.set_spec(spec)

    def _on_document_replaced(self) -> None:
        """Another model or project was opened (`Document.set_model`): show its runs only (a
        reopened project's, made again from their folders) and start the axes afresh."""
        self.generation += 1
        self.curves.clear_runs()
        self._shown_run = None
        self.runs = []
        for record in list(getattr(self.document, "runs", []) or []):
            folder = self._record_folder(record.folder)
            run = TrainingRun.restored(record, folder)
            run.source = getattr(self.document, "source", None)
            run.generation = self.generation
            if run.name in {r.name for r in self.curves.runs()}:
                run.name = run.history.name = f"{run.name} ({folder.name})"
            self.runs.append(run)
            self.curves.add_run(run.history)
        self.curves.redraw()
        self._seen_source = object()  # the settings are defaulted for the new document
        # the status, progress, norms and figures shown were the model's before
        if self.active is None:
            self.controls.set_state("idle", "Ready.")
            self.controls.set_progress(0.0, None, None)
        self.grad_table.set_norms({})
        self.grad_label.setText(GRAD_LABEL)
        self.lm_label.setText("")
        self.lm_label.hide()
        self._show_error("")
        self.pending_apply = None
        self.apply_button.setEnabled(False)
        self._update_checkpoint_button()

    def _record_folder(self, folder: str) -> Path:
        """A run record's folder; a relative one is relative to the project file."""
        path = Path(folder).expanduser()
        project = getattr(self.document, "project_path", None)
        if not path.is_absolute() and project is not None:
            path = Path(project).parent / path
        return path

    def _on_model_changed(self) -> None:
        module = self.document.module
        source = getattr(self.document, "source", None)
        if module is not None and source != self._seen_source:  # another model was opened
            self._seen_source = source
            self._default_settings(module, source)
        self._update_can_start()
        self._update_checkpoint_button()

    def _default_settings(self, module, source) -> None:
        """The settings of a model just opened: those of its last run (a reopened project), else
        the example's own task, else causal-lm for a language model (its folder's tokenizer, a
        block size within its positions), else the defaults; the metric plotted to match."""
        _vocab, positions = model_limits(module)
        self.run_settings.reset(positions)
        saved = next((r.spec for r in reversed(self.runs) if r.spec is not None), None)
        task = example_task(source)
        if saved is not None:  # a reopened project trains as it last did
            self.set_spec(saved)
        elif task:
            self.data_form.set_field("task", task)
        elif is_language_model(module):
            self.data_form.set_field("task", CAUSAL_LM_TASK)
        devices = module.devices() if hasattr(module, "devices") else []
        if devices:
            self.run_settings.set_device(str(devices[0]))
        self.run_settings.set_tokenizer_folder(tokenizer_folder(source), missing_tokenizer(source))
        lm = self.data_form.field_widget("task").currentText() == CAUSAL_LM_TASK
        self.curves.reset_metric("perplexity" if lm else "accuracy")

    def _update_data_note(self) -> None:
        """Say what the chosen causal-lm data file holds (text, prompt/completion or conversations)."""
        values, _errors = self.data_form.field_values()
        key = (values.get("task"), values.get("file"), values.get("per_line"), values.get("tokenizer"))
        if key == self._noted_file:
            return
        self._noted_file = key
        lm = values.get("task") == CAUSAL_LM_TASK and str(values.get("file") or "").strip()
        self.run_settings.set_data_note(describe_text_file(values["file"], bool(values.get("per_line", True)),
                                                           str(values.get("tokenizer") or "")) if lm else "")
        self.run_settings.preview_rows_button.setVisible(bool(lm) and is_conversation_file(values["file"]))

    def preview_rows(self) -> ChatRowDialog | None:
        """Open the rendered rows of the conversation data file (None, and the reason shown, when
        no tokenizer folder is set)."""
        values, _errors = self.data_form.field_values()
        folder = str(values.get("tokenizer") or "")
        if not folder:
            self.error_label.show_error("Preview rows needs the tokenizer folder (with the chat template) set "
                                        "in the data form.")
            return None
        dialog = ChatRowDialog(str(values["file"]), folder, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    # ---- run folders ------------------------------------------------------------------------------
    def runs_dir(self) -> Path:
        if self._runs_dir is not None:
            return self._runs_dir
        project = getattr(self.document, "project_path", None)
        if project is not None:
            return Path(project).parent / (Path(project).name.split(".")[0] + ".runs")
        if self._default_runs_dir is not None:
            return self._default_runs_dir
        base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation) or str(Path.home())
        return Path(base) / "runs"

    def _new_folder(self, spec: RunSpec) -> Path:
        return new_run_folder(self.runs_dir(), spec.data.task if spec.data.task != FILE_TASK else
                              Path(spec.data.file).stem)

    def resumable(self) -> tuple[Path, int, Path] | None:
        """(run folder, epoch, checkpoint folder) that 'Resume from checkpoint' would continue:
        the newest run of this session with a checkpoint, else the newest on disk that did not
        finish."""
        for run in reversed(self.runs):
            found = latest_checkpoint(run.folder)
            if found is not None and run is not self.active:
                return run.folder, found[0], found[1]
        source = getattr(self.document, "source", None)
        if source is None or not hasattr(source, "to_json"):
            return None
        wanted = source.to_json()
        return resumable_on_disk(self.runs_dir(), accept=lambda info: info.get("source") == wanted)

    def _update_checkpoint_button(self) -> None:
        found = self.resumable() if self.active is None else None
        self.controls.set_checkpoint_available(f"{found[0].name}, epoch {found[1]}" if found else "")

    # ---- control ------------------------------------------------------------------------------------
    def is_active(self) -> bool:
        return self.active is not None

    def start(self, max_steps: int | None = None) -> TrainingRun | None:
        """Start a new run with the forms' settings; returns it (None when it cannot start)."""
        if self.active is not None or self.document.module is None:
            return None
        try:
            spec = self.current_spec()
        except FormError as e:
            self._show_error(f"The settings are not valid: {e}")
            return None
        if not self._fits(self.document.module, spec):
            return None
        try:
            folder = self._new_folder(spec)
        except OSError as e:
            self._show_error(f"Cannot make a run folder under {self.runs_dir()}: {describe_os_error(e)}.")
            return None
        taken = {r.name for r in self.curves.runs()}
        number = len(self.runs) + 1
        while f"{number}: {spec.describe()}" in taken:
            number += 1
        name = f"{number}: {spec.describe()}"
        history = RunHistory(name, f"{folder}")
        run = TrainingRun(name, folder, spec, history, self.document.module,
                          self.gui_gate if self.wait_for_paint else None)
        self.curves.add_run(history)
        return self._launch(run, None, max_steps)

    def _fits(self, module, spec: RunSpec) -> bool:
        """Whether a training step of `module` with `spec` fits in memory (`estimate_run`, shapes
        only); a refusal is shown and nothing starts, as an edit or an export that would not fit.
        The worker checks again before it reads the data."""
        refusal = estimate_run(module, spec).refusal(memory.available_memory())
        if refusal:
            self._show_error(f"Not enough memory: {refusal}. No run was started; the model was left as it was.")
            return False
        return True

    def resume_from_checkpoint(self, max_steps: int | None = None) -> TrainingRun | None:
        """Continue the run `resumable()` names from its newest checkpoint."""
        if self.active is not None or self.document.module is None:
            return None
        found = self.resumable()
        if found is None:
            self._show_error("No checkpoint to resume from: runs write one every N epochs (checkpoint every).")
            return None
        folder, epoch, checkpoint = found
        existing = next((r for r in self.runs if r.folder == folder), None)
        if existing is not None and existing.spec is not None:
            spec = existing.spec
            history = existing.history
            name = existing.name
        else:
            info = read_run(folder) or {}
            try:
                spec = RunSpec.from_json(info["spec"])
            except Exception as e:  # noqa: BLE001
                self._show_error(f"{folder / 'run.json'}: cannot read the run's settings: {type(e).__name__}: {e}")
                return None
            name = str(info.get("name") or folder.name)
            if existing is not None:
                self.curves.remove_run(existing.name)
                self.runs.remove(existing)
            if name in {r.name for r in self.curves.runs()}:
                name = f"{name} ({folder.name})"
            history = RunHistory(name, str(folder))
            self.curves.add_run(history)
        try:
            form_epochs = self.training_form.value().num_epochs
        except FormError:
            form_epochs = spec.training.num_epochs
        if epoch >= spec.training.num_epochs:
            spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training,
                                                                          num_epochs=max(form_epochs, epoch + 1)))
        run = TrainingRun(name, folder, spec, history, self.document.module,
                          self.gui_gate if self.wait_for_paint else None)
        return self._launch(run, str(checkpoint), max_steps)

    def _launch(self, run: TrainingRun, resume_from: str | None, max_steps: int | None) -> TrainingRun:
        self.runs = [r for r in self.runs if r.folder != run.folder]  # a resumed run continues its record
        self.runs.append(run)
        self.active = run
        self.pending_apply = None
        self.apply_button.setEnabled(False)
        self._show_error("")
        lm = run.spec is not None and run.spec.data.task == CAUSAL_LM_TASK
        self.lm_label.setText("Perplexity and tokens/s appear when the first epoch ends." if lm else "")
        self.lm_label.setVisible(lm)
        if lm:
            self.curves.set_metric("perplexity")
        # the run owns its worker and tells the panel what came back
        run.events.connect(lambda batch, r=run: self._on_events(r, batch))
        run.finished.connect(lambda out, r=run: self._on_outcome(r, out))
        run.failed.connect(lambda failure, r=run: self._on_failure(r, failure))
        self.controls.set_state("starting", f"Starting {run.name}…" if not resume_from else
                                f"Resuming {run.name} from {Path(resume_from).name}…")
        run.start(getattr(self.document, "source", None), self.generation, resume_from, max_steps,
                  self.yield_between_steps, self._start_task)
        self.cancel_poll.start()
        if self.switch_interval is not None and self._saved_switch_interval is None:
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval)
        self.run_started.emit(run.name)
        self.active_changed.emit(True)
        return run

    def pause(self) -> None:
        if self.active is not None:
            self.active.pause()
            self.controls.set_state("paused" if self.controls.state == "starting" else self.controls.state,
                                    "Pausing after the current step…")

    def resume(self) -> None:
        if self.active is not None:
            self.active.resume()

    def stop(self) -> None:
        if self.active is not None:
            self.active.stop()
            self.controls.set_state("stopping", "Stopping after the current step…")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop a running run and wait for its thread (the window is closing)."""
        if self.active is not None:
            self.active.shutdown(timeout)
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None

    def _poll_cancel(self) -> None:
        run = self.active
        if run is None:
            self.cancel_poll.stop()
            return
        run.cancel_if_asked()  # the window's Cancel: end a pause too

    # ---- events from the worker -----------------------------------------------------------------
    def _on_events(self, run: TrainingRun, batch: list) -> None:
        """What the run's worker sent (the run's history has it already): the controls and tables."""
        ours = run.generation == self.generation  # else a run of the model open before
        for event in batch:
            if isinstance(event, ev.GradNorms) and not ours:
                continue
            if isinstance(event, ev.GradNorms):
                self.grad_table.set_norms(event.norms)
                self.grad_label.setText(f"Gradient norms per module at step {event.global_step} "
                                        f"(frozen modules get none)")
                self.grad_norms_changed.emit(dict(event.norms))
            elif isinstance(event, ev.DataInfo) and ours and run.spec is not None and run.spec.data.task == CAUSAL_LM_TASK:
                self.run_settings.set_data_note(event.text)  # a conversation file, as the run read it
            elif isinstance(event, ev.Started):
                self.controls.set_state("running", f"Training {run.name}: epoch {event.start_epoch} of "
                                        f"{event.total_epochs}, {event.steps_per_epoch} steps an epoch"
                                        + (f"; {run.data_note}" if run.data_note else ""))
            elif isinstance(event, ev.Paused):
                self.controls.set_state("paused", f"Paused at epoch {event.epoch}, step {event.step}.")
            elif isinstance(event, ev.Resumed):
                self.controls.set_state("running", f"Training {run.name}")
            elif isinstance(event, ev.CheckpointSaved):
                self.controls.status_label.setText(f"Checkpoint saved: {Path(event.path).name} "
                                                   f"(epoch {event.epoch})")
            elif isinstance(event, ev.Failed):
                self._show_error(f"{run.name} failed: {event.message}")
        if not ours:
            return  # a run of the model open before: its curves are not this document's
        self._shown_run = run
        if not self.refresh_timer.isActive():
            self.refresh_timer.start()

    def refresh(self) -> None:
        """Redraw the curves and the progress line (throttled by `refresh_timer`)."""
        self.refresh_timer.stop()
        started = time.perf_counter()
        self.gui_gate.hold()  # the worker waits between two steps while this runs
        try:
            run = self._shown_run
            if run is not None:
                h = run.history
                self.controls.set_progress(h.fraction_done(), h.steps_per_second,
                                           h.seconds_left() if h.status == "running" else None,
                                           f"epoch {h.epoch}/{h.total_epochs} · step {h.global_step}/{h.total_steps}")
                lm = lm_metrics_text(h)
                if lm:
                    self.lm_label.setText(lm)
                    self.lm_label.show()
            self.curves.redraw()
        finally:
            self.gui_gate.release()
        # the next redraw waits long enough for this one (and the last paint) to stay in budget
        cost = time.perf_counter() - started + self.curves.graphics.paint_seconds
        self.refresh_timer.setInterval(int(1000 * min(1.0, max(1.0 / REFRESH_HZ, cost / GUI_BUDGET))))

    def _on_outcome(self, run: TrainingRun, out: RunOutcome) -> None:
        run.outcome = out
        h = run.history
        self._end(run)
        h.end(out.status)
        ours = run.generation == self.generation  # the document that made the run is still open
        if run.status == "failed" and out.save_error and out.steps > 0:
            # the disk, not the training, failed: the model trained so far is sound and is kept
            message = out.save_error
            run.write(message=message, error=out.error)
            kept = self._keep_trained(run, ours)
            self._show_error(f"{run.name} stopped: {message}. " + (
                f"The model trained so far ({out.steps} steps) is kept in the window; free space on the disk "
                f"to train on or save." if kept else "Free space on the disk; 'Apply trained model' keeps the "
                                                     "model trained so far."))
            self.controls.set_state(run.status, f"Stopped by the disk: {message}")
        elif run.status == "failed":
            message = out.message or h.message or "the run failed"
            self._show_error(f"{run.name} failed: {message}. The model was left as it was.")
            self.controls.set_state(run.status, f"Failed: {message}")
            run.write(message=message, error=out.error)
        else:
            how = f"trained {out.steps} steps" + (f" in {out.seconds:.1f} s" if out.seconds else "")
            word = "Finished" if run.status == "finished" else "Stopped"
            self.controls.set_state(run.status, f"{word}: {run.name}, {how}.")
            if run.status == "finished":
                self.controls.set_progress(1.0, h.steps_per_second, 0.0, f"epoch {h.epoch}/{h.total_epochs}")
            run.write(steps=out.steps, **({"message": out.save_error} if out.save_error else {}))
            if out.steps > 0:
                self._keep_trained(run, ours, word)
            if out.save_error:
                self._show_error(f"{run.name}: {out.save_error}. The trained model is kept in the window (not "
                                 f"on disk): free space on the disk, then save it.")
        run.save_curves()
        if ours:
            self.document.record_run(run.record())
        self.run_ended.emit(run.name, run.status)

    def _keep_trained(self, run: TrainingRun, ours: bool, word: str = "Stopped") -> bool:
        """Offer the run's trained model ('Apply trained model') and apply it now when asked to
        and the model did not change meanwhile; True when it was applied."""
        if not ours:
            return False
        self.pending_apply = run
        self.apply_button.setEnabled(True)
        if self.apply_check.isChecked():
            if self.document.module is run.source_module:
                return self.apply_pending()
            self.controls.status_label.setText(
                f"{word}: {run.name}. The model changed while it trained: 'Apply trained model' "
                f"replaces the current one.")
        return False

    def _on_failure(self, run: TrainingRun, failure) -> None:
        """The worker raised before or outside the loop (data, model, checkpoint)."""
        exc = failure.exception
        self._end(run)
        message = str(exc) if isinstance(exc, (TrainingSetupError, ValueError, OSError, memory.NotEnoughMemory)) \
            else f"{type(exc).__name__}: {exc}"
        run.history.end("failed", message)
        self._show_error(f"{run.name} could not run: {message}. The model was left as it was.")
        self.controls.set_state(run.status, f"Failed: {message}")
        run.write(message=message, error=getattr(failure, "traceback", ""))
        run.save_curves()
        if run.generation == self.generation:
            self.document.record_run(run.record())
        self.run_ended.emit(run.name, run.status)

    def _end(self, run: TrainingRun) -> None:
        if self.active is run:
            self.active = None
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None
        self.cancel_poll.stop()
        self.refresh()
        self._update_can_start()
        self._update_checkpoint_button()
        self.active_changed.emit(False)

    def apply_pending(self) -> bool:
        """Make the last run's trained model the document's model (one undoable step)."""
        run = self.pending_apply
        if run is None or run.outcome is None or self.document.module is None:
            return False
        if getattr(self.document, "source", None) != run.source or run.generation != self.generation:
            self._show_error(f"{run.name} trained another model than the one open now; it was not applied.")
            self.pending_apply = None
            self.apply_button.setEnabled(False)
            return False
        out = run.outcome
        edit = LoadEdit(out.weights) if out.weights else None  # no file (a full disk): not replayable
        self.document.push_module(f"Train {run.name} ({out.steps} steps)", out.model, edit)
        self.pending_apply = None
        self.apply_button.setEnabled(False)
        return True

    def _show_error(self, text: str) -> None:
        self.last_error = text
        self.error_label.show_error(text)

    # ---- for tests, --train-steps and benchmarks ---------------------------------------------------
    def wait(self, timeout: float = 120.0) -> bool:
        """Process events until no run is active; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.active is not None and time.monotonic() < deadline:
            QApplication.processEvents()
            time.sleep(0.002)
        QApplication.processEvents()
        return self.active is None
