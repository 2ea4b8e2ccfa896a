"""The Training tab: settings forms, run controls, live curves and per-module gradient norms,
wired to `engine.train`'s loop running on a worker thread.

How a run goes:

- Start builds a `RunSpec` from the forms (data, loss, optimizer, schedule, training config,
  device) and a run folder under `runs_dir` (`run.json` plus the loop's `epoch-<e>/`
  checkpoints). A `Task` (app.workers) runs `run_training` on a thread: it makes the data
  set, forks the document's model to the chosen device, checks that one batch fits the model
  and the loss (a mismatch names the module where it failed), then runs a `Learner`.
- The loop's events are batched on the worker and sent as one queued signal at most every
  `FLUSH_S` seconds (control events at once); the GUI thread applies them to the run's
  `RunHistory`, and the curves and progress redraw at most `REFRESH_HZ` times a second, less
  often when a redraw with its paint costs more than `GUI_BUDGET` of the time. While the
  curves paint, the worker waits between two steps (at most `GUI_WAIT_S`), so the paint's many
  Python callbacks do not each queue for the GIL.
- Every `GRAD_NORM_S` seconds the optimizer wrapper (`GradTap`) computes, before the update,
  the L2 norm of the gradients below every module (None for modules with no gradient:
  frozen); the panel shows them and re-emits them as `grad_norms_changed(dict)`.
- Pause / resume / stop go to the learner from the GUI thread (it honours them between two
  steps). A run that ends finished or stopped saves the trained weights in its folder
  (`trained.bpk`) and replaces the document's model with the trained value as one undoable
  step whose edit loads those weights (so a saved project reopens trained), unless the
  document's model changed meanwhile: then 'Apply trained model' does it on request. A failed run (NaN loss, an exception, data that does
  not fit) shows what happened and where, and leaves the model as it was.
- 'Resume from checkpoint' continues the last stopped, failed or crashed run (in this session
  or found on disk) from its newest checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QStandardPaths, Qt, QTimer, Signal
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QFileDialog, QGroupBox, QHBoxLayout, QLabel,
                               QPushButton, QScrollArea, QSizePolicy, QSplitter, QStackedWidget, QVBoxLayout, QWidget)

# Everything the worker uses is imported here, not on first use: an import on the worker thread
# holds the GIL while PySide's import hook reads the module's source, and the window stalls.
import engine.store  # noqa: F401 - checkpoints
from engine import available_devices, optim
from engine.autodiff import no_recording
from engine.train import (TASKS, DataLoader, Learner, StepOutput, TrainingConfig, build_task, cross_entropy,
                          load_data_file, mse_loss)
from engine.train import events as ev
from engine.train.checkpoint import FILES
from widgets.common import ErrorLabel
from widgets.training.config_form import DataclassForm, FieldOptions, FormError, from_dict, to_dict
from widgets.training.curves import TrainingCurves
from widgets.training.grad_norms import GradNormTable
from widgets.training.history import GradNorms, Prefill, RunHistory
from widgets.training.run_controls import RunControls

from . import contracts
from .document import write_json_atomic
from .workers import Task, TaskFailure

FLUSH_S = 1 / 4  # the worker sends batched events at most this often (control events at once)
PROGRESS_S = 0.5  # and the task's progress (the window's status bar) at most this often
# A paint of the curves calls back into Python (pyqtgraph's items) many times, and each call would
# queue for the GIL behind the training thread: the worker waits between two steps while the GUI
# paints (`wait_for_paint`). Lowering Python's switch interval during runs (`switch_interval`, off
# by default) was measured too: it cut the paints' delays less and cost more throughput.
SWITCH_INTERVAL_S = None
GUI_WAIT_S = 0.05  # the longest a step waits for a paint of the curves to end
GRAD_NORM_S = 0.25  # gradient norms are sampled at most this often
REFRESH_HZ = 4  # curves and progress redraw at most this often
GUI_BUDGET = 0.05  # ... and less often when a redraw (with its paint) costs more than this share of the time
FILE_TASK = "file"
LOSSES = ("auto", "cross-entropy", "mse")
CONTROL_EVENTS = (ev.Started, ev.Paused, ev.Resumed, ev.Stopped, ev.Finished, ev.Failed, ev.CheckpointSaved)


# ---- settings ---------------------------------------------------------------------------------
@dataclass
class DataSettings:
    """Where the data comes from and which loss to train with."""

    task: str = "spirals"  # a built-in task, or "file"
    file: str = ""  # a .npz (arrays x, y) or .csv (target in the last column) when task is "file"
    valid_fraction: float = 0.2  # of a file's items, held out for validation
    loss: str = "auto"  # auto: cross-entropy for class targets, mse otherwise

    def __post_init__(self):
        choices = (*TASKS, FILE_TASK)
        if self.task not in choices:
            raise ValueError(f"task: expected one of {list(choices)}, found {self.task!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {list(LOSSES)}, found {self.loss!r}")
        if self.task == FILE_TASK:
            if not self.file:
                raise ValueError("file: the task is 'file': give a .npz or .csv file")
            p = Path(self.file).expanduser()
            if p.suffix.lower() not in (".npz", ".csv", ".tsv", ".txt"):
                raise ValueError(f"file: expected a .npz or .csv file, found {p.name!r}")
            if not p.is_file():
                raise ValueError(f"file: {p} does not exist")
            if not 0.0 < self.valid_fraction < 1.0:
                raise ValueError(f"valid_fraction: expected a fraction between 0 and 1, found {self.valid_fraction}")


@dataclass
class ConstantLrConfig:
    """A constant learning rate (Burn's `ConstantLr`)."""

    lr: float = 1e-2

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr: the learning rate must be greater than 0, found {self.lr}")

    def init(self):
        return optim.ConstantLr(self.lr)


OPTIMIZERS: dict[str, type] = {"Adam": optim.AdamConfig, "AdamW": optim.AdamWConfig, "SGD": optim.SgdConfig}
SCHEDULES: dict[str, tuple[type, dict]] = {
    "constant": (ConstantLrConfig, {}),
    "linear": (optim.LinearLrSchedulerConfig, dict(initial_lr=1e-2, final_lr=1e-4, num_iters=1000)),
    "cosine": (optim.CosineAnnealingLrSchedulerConfig, dict(initial_lr=1e-2, num_iters=1000)),
    "step": (optim.StepLrSchedulerConfig, dict(initial_lr=1e-2, step_size=500, gamma=0.5)),
    "exponential": (optim.ExponentialLrSchedulerConfig, dict(initial_lr=1e-2, gamma=0.999)),
    "noam": (optim.NoamLrSchedulerConfig, dict(factor=1.0, warmup_steps=200, model_size=64)),
}
_CLIP = FieldOptions(label="gradient clipping", type=optim.GradientClippingConfig | None,
                     options={"kind": FieldOptions(choices=["norm", "value"])})
OPTIMIZER_OPTIONS = {"grad_clipping": _CLIP, "gradient_clipping": _CLIP}
OPTIMIZER_TYPES = {"grad_clipping": optim.GradientClippingConfig | None,
                   "gradient_clipping": optim.GradientClippingConfig | None}
_TRAINING_HIDDEN = ("valid_batch_size", "checkpoint_dir", "resume_from", "throughput_interval")


@dataclass
class RunSpec:
    """Everything a run needs besides the model; saved in the run folder as `run.json`."""

    data: DataSettings
    optimizer: str
    optimizer_config: Any
    schedule: str
    schedule_config: Any
    training: TrainingConfig  # device as a string; checkpoint_dir / resume_from set per run

    def to_json(self) -> dict:
        t = to_dict(self.training)
        t["device"] = str(self.training.device) if self.training.device is not None else None
        return {"data": to_dict(self.data), "optimizer": self.optimizer,
                "optimizer_config": to_dict(self.optimizer_config), "schedule": self.schedule,
                "schedule_config": to_dict(self.schedule_config), "training": t}

    @staticmethod
    def from_json(d: dict) -> "RunSpec":
        opt_cls = OPTIMIZERS[d["optimizer"]]
        sched_cls = SCHEDULES[d["schedule"]][0]
        return RunSpec(from_dict(DataSettings, d["data"]), d["optimizer"],
                       from_dict(opt_cls, d["optimizer_config"], OPTIMIZER_TYPES), d["schedule"],
                       from_dict(sched_cls, d["schedule_config"]), from_dict(TrainingConfig, d["training"]))

    def describe(self) -> str:
        lr = getattr(self.schedule_config, "lr", None) or getattr(self.schedule_config, "initial_lr", None)
        task = Path(self.data.file).name if self.data.task == FILE_TASK else self.data.task
        return f"{task} · {self.optimizer}" + (f" lr {lr:g}" if lr else f" {self.schedule}")


class TrainingSetupError(ValueError):
    """The run could not start: the data, the loss or the model do not fit together."""


# ---- the worker side (no Qt widgets; runs on the task's thread) ----------------------------------
def example_task(source: dict | None) -> str | None:
    """The built-in task an example model trains on (its `task()`), if it names one."""
    if not source or source.get("kind") != "example":
        return None
    try:
        from resources.examples import example_task as task_of  # noqa: PLC0415

        name = task_of(source["name"])
    except Exception:  # noqa: BLE001 - a broken example shows up when it is opened
        return None
    return name if name in TASKS else None


def make_data(settings: DataSettings, seed: int):
    """(train, valid, kind, description) for the data settings."""
    if settings.task == FILE_TASK:

        data = load_data_file(Path(settings.file).expanduser())
        train, valid = data.split(1.0 - settings.valid_fraction, seed=seed)
        kind = "classification" if data.targets.dtype.kind in "iu" else "regression"
        return train, valid, kind, Path(settings.file).name
    task = build_task(settings.task, seed=seed)
    return task.train, task.valid, task.kind, task.name


def make_step(loss: str):
    """The training step for a chosen loss (None: the loop's default for the task's kind)."""
    if loss == "auto":
        return None
    fn = cross_entropy if loss == "cross-entropy" else mse_loss

    def step(model, batch):
        output = model.forward(batch.inputs)
        return StepOutput(fn(output, batch.targets), output, batch.targets)

    return step


def _dims(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def preflight(model, train, kind: str, loss: str, device, name: str) -> None:
    """Run two items through the model and the loss; a `TrainingSetupError` says what does not
    fit and at which module."""


    if len(train) == 0:
        raise TrainingSetupError(f"the data set {name} has no training items")
    batch = next(iter(DataLoader(train, min(2, len(train)), shuffle=False, device=device)))
    what = (f"the data set {name} (inputs {_dims(batch.inputs.shape[1:])} {batch.inputs.dtype} per item, "
            f"targets {_dims(batch.targets.shape[1:])} {batch.targets.dtype})")
    vmodel = model.valid() if hasattr(model, "valid") else model
    with no_recording():
        result = contracts.check(vmodel, [batch.inputs], {}, list(vmodel.named_modules()))
        if not result.ok or result.error:
            where = (result.failure.path or "the model's own forward") if result.failure else "the model"
            raise TrainingSetupError(f"{what} does not fit the model: at {where}: {result.error}")
        output = vmodel.forward(batch.inputs)
        loss_name = loss if loss != "auto" else ("cross-entropy" if kind == "classification" else "mse")
        try:
            (cross_entropy if loss_name == "cross-entropy" else mse_loss)(output, batch.targets)
        except Exception as e:  # noqa: BLE001 - reported with the shapes
            raise TrainingSetupError(f"{what} does not fit the {loss_name} loss: the model outputs "
                                     f"{_dims(output.shape)}, the targets are {_dims(batch.targets.shape)}: "
                                     f"{e}") from None


def module_grad_norms(model, grads) -> dict[str, float | None]:
    """L2 norm of the gradients of the float parameters below each module that has some, in
    the model's module order; None for a module none of whose parameters got a gradient."""
    module_paths = [p for p, _ in model.named_modules()]
    known = set(module_paths)
    sums: dict[str, float] = {}
    seen: set[str] = set()
    for path, param in model.named_params():
        if param.kind != "float":
            continue
        owners = [""]
        parts = path.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in known:
                owners.append(prefix)
        g = grads.get(param.id)
        sq = None
        if g is not None:
            a = g._data.ravel()
            xp = g.device.xp
            sq = float(xp.vdot(a, a))
        for o in owners:
            seen.add(o)
            if sq is not None:
                sums[o] = sums.get(o, 0.0) + sq
    return {p: (math.sqrt(sums[p]) if p in sums else None) for p in module_paths if p in seen}


class GradTap:
    """Wraps the optimizer: every `every_s` seconds, before an update, reports the per-module
    gradient norms through `emit(norms)`. Everything else is the wrapped optimizer's."""

    def __init__(self, inner, emit: Callable[[dict], None], every_s: float = GRAD_NORM_S):
        self.inner = inner
        self.emit = emit
        self.every_s = every_s
        self._last = -math.inf

    def step(self, lr, model, grads):
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self.emit(module_grad_norms(model, grads))
        return self.inner.step(lr, model, grads)

    def load(self, path, device=None):
        self.inner = self.inner.load(path, device)
        return self

    def __getattr__(self, name):
        return getattr(self.inner, name)


class RunControl:
    """Pause / resume / stop asked from the GUI, forwarded to the learner once it exists."""

    def __init__(self):
        self._lock = threading.Lock()
        self.learner: Learner | None = None
        self.paused = False
        self.stopped = False
        self.gui_idle: threading.Event | None = None  # cleared while the GUI paints the curves
        self.outcome: "RunOutcome | None" = None
        self.exception: BaseException | None = None
        self.traceback = ""

    def attach(self, learner: Learner) -> None:
        with self._lock:
            self.learner = learner
            if self.paused:
                learner.pause()
            if self.stopped:
                learner.stop()

    def pause(self) -> None:
        with self._lock:
            self.paused = True
            if self.learner is not None:
                self.learner.pause()

    def resume(self) -> None:
        with self._lock:
            self.paused = False
            if self.learner is not None:
                self.learner.resume()

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            if self.learner is not None:
                self.learner.stop()


@dataclass
class RunOutcome:
    """What the worker returns."""

    status: str  # finished | stopped | failed
    model: Any
    steps: int  # steps trained in this session
    global_step: int
    message: str = ""
    error: str = ""
    reached_max_steps: bool = False
    seconds: float = 0.0  # the whole task: data, checks, training, checkpoints
    train_seconds: float = 0.0  # from the loop's start to its end
    weights: str = ""  # the trained model's record (run folder / trained.bpk) when it trained


class _Forwarder:
    """The learner's listener on the worker thread: batches events and sends them on."""

    def __init__(self, send: Callable[[list], None], control: RunControl, max_steps: int | None,
                 yield_between_steps: bool, progress: Callable[[float], None] | None = None):
        self.send = send
        self.progress = progress  # the task's progress (the window's status bar shows it)
        self.last_progress = -math.inf
        self.total_steps = 0
        self.control = control
        self.max_steps = max_steps
        self.yield_between_steps = yield_between_steps
        self.buffer: list = []
        self.last_flush = time.perf_counter()
        self.epoch = 0
        self.global_step = 0
        self.first_step: int | None = None
        self.reached_max = False
        self.started_at: float | None = None
        self.lock = threading.Lock()

    def __call__(self, event) -> None:
        with self.lock:
            self.buffer.append(event)
        if isinstance(event, ev.Started):
            self.started_at = time.perf_counter()
            self.total_steps = event.total_epochs * event.steps_per_epoch
            if self.control.stopped:  # asked while the run was being set up: run() cleared it
                self.control.stop()
        elif isinstance(event, ev.StepLoss):
            self.epoch, self.global_step = event.epoch, event.global_step
            if self.first_step is None:
                self.first_step = event.global_step - 1
            if self.max_steps is not None and event.global_step - self.first_step >= self.max_steps:
                self.reached_max = True
                self.control.stop()
        now = time.perf_counter()
        if isinstance(event, CONTROL_EVENTS) or now - self.last_flush >= FLUSH_S:
            self.flush(now)
        if isinstance(event, ev.LearningRate):  # between two steps
            idle = self.control.gui_idle
            if idle is not None and not idle.is_set():
                idle.wait(GUI_WAIT_S)  # the curves are being painted: let the paint have the GIL
            if self.yield_between_steps:
                time.sleep(0)  # let the GUI thread take the GIL between two steps

    def grad_norms(self, norms: dict) -> None:
        with self.lock:
            self.buffer.append(GradNorms(self.epoch, self.global_step + 1, norms))

    def flush(self, now: float | None = None) -> None:
        with self.lock:
            batch, self.buffer = self.buffer, []
        self.last_flush = now if now is not None else time.perf_counter()
        if batch:
            self.send(batch)
            if self.progress is not None and self.total_steps and self.last_flush - self.last_progress >= PROGRESS_S:
                self.last_progress = self.last_flush
                self.progress(self.global_step / self.total_steps)


def run_training(state, control: RunControl, model, spec: RunSpec, run_dir: str, resume_from: str | None = None,
                 max_steps: int | None = None, yield_between_steps: bool = False) -> RunOutcome:
    """The worker function: train a fork of `model`; events go out through `state`'s partial
    results in batches. Setup problems raise `TrainingSetupError`; problems during the loop come
    back as a failed `RunOutcome` (and a `Failed` event). The outcome (or the exception) is also
    left on `control`, since a cancelled task drops its return value."""
    try:
        control.outcome = _run_training(state, control, model, spec, run_dir, resume_from, max_steps,
                                        yield_between_steps)
    except BaseException as e:
        control.exception = e
        control.traceback = traceback.format_exc()
        raise
    return control.outcome


def _run_training(state, control, model, spec, run_dir, resume_from, max_steps, yield_between_steps) -> RunOutcome:
    started = time.perf_counter()
    cfg = spec.training
    train, valid, kind, data_name = make_data(spec.data, cfg.seed)
    if spec.data.loss == "mse":
        kind = "regression"
    elif spec.data.loss == "cross-entropy":
        kind = "classification"
    # A lazy parameter stays lazy in the fork and shares its lazy state with the document's, so
    # every run (and the document itself) reads the values the first reader made.
    try:
        fork = model.fork(cfg.device)
    except Exception as e:  # noqa: BLE001
        raise TrainingSetupError(f"the model cannot be moved to {cfg.device}: {type(e).__name__}: {e}") from e
    devices = fork.devices()
    preflight(fork, train, kind, spec.data.loss, devices[0] if devices else None, data_name)
    forwarder = _Forwarder(state.set_partial_result, control, max_steps, yield_between_steps,
                           getattr(state, "set_progress", None))
    optimizer = GradTap(spec.optimizer_config.init(), forwarder.grad_norms)
    epochs, done = cfg.num_epochs, 0
    if resume_from:
        progress = json.loads((Path(resume_from) / "training.json").read_text())
        done = int(progress["epoch"])
        forwarder(Prefill(tuple(progress["step_losses"]), tuple(progress["history"]), int(progress["global_step"])))
    if max_steps is not None:
        n = len(train)
        per_epoch = max(1, n // cfg.batch_size if cfg.drop_last else -(-n // cfg.batch_size))
        epochs = done + max(1, -(-max_steps // per_epoch))
    config = dataclasses.replace(cfg, num_epochs=max(epochs, done + 1), checkpoint_dir=run_dir,
                                 resume_from=resume_from)
    try:
        learner = Learner(fork, optimizer, lr=spec.schedule_config, train=train, valid=valid, kind=kind,
                          step=make_step(spec.data.loss), config=config, listeners=[forwarder])
    except Exception as e:  # noqa: BLE001 - a checkpoint that does not fit, a bad schedule
        raise TrainingSetupError(f"the run could not start: {type(e).__name__}: {e}") from e
    if control.stopped:  # stopped while the data and the model were being prepared
        return RunOutcome("stopped", fork, 0, 0, seconds=time.perf_counter() - started)
    control.attach(learner)
    result = learner.run()
    ended = time.perf_counter()
    forwarder.flush()
    steps = (forwarder.global_step - forwarder.first_step) if forwarder.first_step is not None else 0
    status = result.status
    if status == "stopped" and forwarder.reached_max:
        status = "finished"  # the asked-for number of steps
    weights = ""
    if status != "failed" and steps > 0:
        # the project keeps an edit that loads these weights, so reopening it gives the trained model
        weights = str(result.model.into_record().save(Path(run_dir) / "trained.bpk"))
    return RunOutcome(status, result.model, steps, forwarder.global_step, weights=weights, error=result.error or "",
                      message=result.error.splitlines()[0] if result.error else "",
                      reached_max_steps=forwarder.reached_max, seconds=time.perf_counter() - started,
                      train_seconds=ended - forwarder.started_at if forwarder.started_at is not None else 0.0)


# ---- run folders ---------------------------------------------------------------------------------
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
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None


# ---- the panel ---------------------------------------------------------------------------------
class _Run:
    """A run of this session: its folder, history, task and outcome."""

    def __init__(self, name: str, folder: Path, spec: RunSpec, history: RunHistory, source_module: Any):
        self.name = name
        self.folder = folder
        self.spec = spec
        self.history = history
        self.source_module = source_module
        self.source = None  # the document's source when the run started (the same model family)
        self.control = RunControl()
        self.task: Task | None = None
        self.outcome: RunOutcome | None = None
        self.started_at = time.time()

    def write(self, status: str, **extra) -> None:
        data = {"name": self.name, "status": status, "created": self.started_at, "spec": self.spec.to_json(),
                "global_step": self.history.global_step, "epoch": self.history.epoch, **extra}
        try:
            write_json_atomic(self.folder / "run.json", data)
        except OSError:
            pass


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
        self.runs: list[_Run] = []
        self.active: _Run | None = None
        self.pending_apply: _Run | None = None
        self.last_error = ""
        self._build()
        self._shown_run: _Run | None = None
        self._seen_source: Any = object()  # the source the settings were last defaulted for
        self.refresh_timer = QTimer(self)  # at most REFRESH_HZ redraws a second, however fast events come
        self.refresh_timer.setSingleShot(True)
        self.refresh_timer.setInterval(int(1000 / REFRESH_HZ))
        self.refresh_timer.timeout.connect(self.refresh)
        self.cancel_poll = QTimer(self)
        self.cancel_poll.setInterval(200)
        self.cancel_poll.timeout.connect(self._poll_cancel)
        document.model_changed.connect(self._on_model_changed)
        self._on_model_changed()

    # ---- layout ---------------------------------------------------------------------------------
    def _build(self) -> None:
        devices = self._device_choices()
        self.data_form = DataclassForm(DataSettings, options={
            "task": FieldOptions(choices=[*TASKS, FILE_TASK], tooltip="A built-in task, or 'file' for your own data"),
            "file": FieldOptions(label="data file", tooltip=".npz with arrays x and y, or .csv with the target last"),
            "valid_fraction": FieldOptions(label="validation fraction"),
            "loss": FieldOptions(choices=list(LOSSES)),
        })
        self.data_form.setObjectName("form:data")
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setObjectName("browse-data")
        self.browse_button.clicked.connect(self._browse_data)

        self.optimizer_combo = QComboBox()
        self.optimizer_combo.setObjectName("optimizer")
        self.optimizer_stack = QStackedWidget()
        self.optimizer_forms: dict[str, DataclassForm] = {}
        for name, cls in OPTIMIZERS.items():
            form = DataclassForm(cls, options=OPTIMIZER_OPTIONS, check=lambda c: c.init())
            form.setObjectName(f"form:optimizer:{name}")
            self.optimizer_forms[name] = form
            self.optimizer_combo.addItem(name)
            self.optimizer_stack.addWidget(form)
        self.optimizer_combo.currentIndexChanged.connect(self._on_choice_changed)

        self.schedule_combo = QComboBox()
        self.schedule_combo.setObjectName("schedule")
        self.schedule_stack = QStackedWidget()
        self.schedule_forms: dict[str, DataclassForm] = {}
        for name, (cls, defaults) in SCHEDULES.items():
            form = DataclassForm(cls, value=defaults or None, check=lambda c: c.init())
            form.setObjectName(f"form:schedule:{name}")
            self.schedule_forms[name] = form
            self.schedule_combo.addItem(name)
            self.schedule_stack.addWidget(form)
        self.schedule_combo.currentIndexChanged.connect(self._on_choice_changed)

        self.training_form = DataclassForm(
            TrainingConfig, value={"num_epochs": 10, "batch_size": 64, "checkpoint_every": 1,
                                   "checkpoint_dir": "(the run folder)", "device": devices[0]},
            options={**{k: FieldOptions(hidden=True) for k in _TRAINING_HIDDEN},
                     "num_epochs": FieldOptions(label="epochs"),
                     "batch_size": FieldOptions(label="batch size"),
                     "checkpoint_every": FieldOptions(label="checkpoint every (epochs)",
                                                      tooltip="0: no checkpoints"),
                     "drop_last": FieldOptions(label="drop last partial batch"),
                     "device": FieldOptions(type=str, choices=devices)})
        self.training_form.setObjectName("form:training")
        for form in (self.data_form, self.training_form, *self.optimizer_forms.values(), *self.schedule_forms.values()):
            form.changed.connect(self._update_can_start)

        settings = QWidget()
        col = QVBoxLayout(settings)
        col.setContentsMargins(4, 4, 4, 4)

        def group(title, *widgets):
            box = QGroupBox(title)
            lay = QVBoxLayout(box)
            lay.setContentsMargins(6, 6, 6, 6)
            for w in widgets:
                if isinstance(w, QHBoxLayout):
                    lay.addLayout(w)
                else:
                    lay.addWidget(w)
            col.addWidget(box)
            return box

        browse_row = QHBoxLayout()
        browse_row.addStretch(1)
        browse_row.addWidget(self.browse_button)
        group("Data and loss", self.data_form, browse_row)
        group("Optimizer", self.optimizer_combo, self.optimizer_stack)
        group("Learning-rate schedule", self.schedule_combo, self.schedule_stack)
        group("Training", self.training_form)
        col.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(settings)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # as wide as the widest form (AdamW's), so nothing is cut off at the right
        widest = max(f.minimumSizeHint().width() for f in self.optimizer_forms.values())
        settings_width = max(settings.minimumSizeHint().width(), widest + 40)
        scroll.setMinimumWidth(settings_width + scroll.verticalScrollBar().sizeHint().width() + 2 * scroll.frameWidth())

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
        apply_row = QHBoxLayout()
        apply_row.addWidget(self.apply_check)
        apply_row.addStretch(1)
        apply_row.addWidget(self.apply_button)

        self.curves = TrainingCurves()
        self.grad_table = GradNormTable()
        norms_box = QWidget()
        nl = QVBoxLayout(norms_box)
        nl.setContentsMargins(0, 0, 0, 0)
        self.grad_label = QLabel("Gradient norms per module (sampled while training)")
        nl.addWidget(self.grad_label)
        nl.addWidget(self.grad_table)
        right_split = QSplitter(Qt.Orientation.Vertical)
        right_split.addWidget(self.curves)
        right_split.addWidget(norms_box)
        right_split.setStretchFactor(0, 4)
        right_split.setStretchFactor(1, 1)
        right_split.setSizes([600, 150])
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(4, 4, 4, 4)
        rl.addWidget(self.controls)
        rl.addLayout(apply_row)
        rl.addWidget(self.error_label)
        rl.addWidget(right_split, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(scroll)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([320, 900])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        self._on_choice_changed()

    @staticmethod
    def _device_choices() -> list[str]:

        try:
            return [str(d) for d in available_devices()]
        except Exception:  # noqa: BLE001
            return ["cpu"]

    # ---- settings -----------------------------------------------------------------------------
    def _on_choice_changed(self, *_args) -> None:

        for stack, forms, name in ((self.optimizer_stack, self.optimizer_forms, self.optimizer_combo.currentText()),
                                   (self.schedule_stack, self.schedule_forms, self.schedule_combo.currentText())):
            for key, form in forms.items():  # the stack is as tall as the form shown, not the tallest
                policy = QSizePolicy.Policy.Preferred if key == name else QSizePolicy.Policy.Ignored
                form.setSizePolicy(policy, policy)
            stack.setCurrentWidget(forms[name])
            stack.adjustSize()
        self._update_can_start()

    def _forms(self) -> list[DataclassForm]:
        return [self.data_form, self.optimizer_forms[self.optimizer_combo.currentText()],
                self.schedule_forms[self.schedule_combo.currentText()], self.training_form]

    def settings_valid(self) -> bool:
        return all(f.is_valid() for f in self._forms())

    def _update_can_start(self) -> None:
        self.controls.set_can_start(self.document.module is not None and self.settings_valid())

    def current_spec(self) -> RunSpec:
        """The run the forms describe; raises `FormError` when a form is invalid."""
        errors = {}
        values = []
        for form in self._forms():
            try:
                values.append(form.value())
            except FormError as e:
                errors.update(e.errors)
        if errors:
            raise FormError(errors)
        data, opt, sched, training = values
        return RunSpec(data, self.optimizer_combo.currentText(), opt, self.schedule_combo.currentText(), sched,
                       training)

    def set_spec(self, spec: RunSpec) -> None:
        self.data_form.set_value(spec.data)
        self.optimizer_combo.setCurrentText(spec.optimizer)
        self.optimizer_forms[spec.optimizer].set_value(spec.optimizer_config)
        self.schedule_combo.setCurrentText(spec.schedule)
        self.schedule_forms[spec.schedule].set_value(spec.schedule_config)
        self.training_form.set_value(spec.training)

    def _browse_data(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Training data", "", "Data (*.npz *.csv *.tsv);;All files (*)")
        if path:
            self.data_form.set_field("task", FILE_TASK)
            self.data_form.set_field("file", path)

    def _on_model_changed(self) -> None:
        module = self.document.module
        source = getattr(self.document, "source", None)
        if module is not None and source != self._seen_source:  # another model was opened
            self._seen_source = source
            task = example_task(source)
            if task:
                self.data_form.set_field("task", task)
            devices = module.devices() if hasattr(module, "devices") else []
            if devices and str(devices[0]) in self._device_choices():
                self.training_form.set_field("device", str(devices[0]))
        self._update_can_start()
        self._update_checkpoint_button()

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
        root = self.runs_dir()
        root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        task = spec.data.task if spec.data.task != FILE_TASK else Path(spec.data.file).stem
        for i in range(1, 1000):
            folder = root / f"{stamp}-{task}-{i}"
            try:
                folder.mkdir()
                return folder
            except FileExistsError:
                continue
        raise OSError(f"cannot make a run folder under {root}")

    def resumable(self) -> tuple[Path, int, Path] | None:
        """(run folder, epoch, checkpoint folder) that 'Resume from checkpoint' would continue:
        the newest run of this session with a checkpoint, else the newest on disk that did not
        finish."""
        for run in reversed(self.runs):
            found = latest_checkpoint(run.folder)
            if found is not None and run is not self.active:
                return run.folder, found[0], found[1]
        root = self.runs_dir()
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

    def _update_checkpoint_button(self) -> None:
        found = self.resumable() if self.active is None else None
        self.controls.set_checkpoint_available(f"{found[0].name}, epoch {found[1]}" if found else "")

    # ---- control ------------------------------------------------------------------------------------
    def is_active(self) -> bool:
        return self.active is not None

    def start(self, max_steps: int | None = None) -> _Run | None:
        """Start a new run with the forms' settings; returns it (None when it cannot start)."""
        if self.active is not None or self.document.module is None:
            return None
        try:
            spec = self.current_spec()
        except FormError as e:
            self._show_error(f"The settings are not valid: {e}")
            return None
        folder = self._new_folder(spec)
        name = f"{len(self.runs) + 1}: {spec.describe()}"
        history = RunHistory(name, f"{folder}")
        run = _Run(name, folder, spec, history, self.document.module)
        self.curves.add_run(history)
        return self._launch(run, None, max_steps)

    def resume_from_checkpoint(self, max_steps: int | None = None) -> _Run | None:
        """Continue the run `resumable()` names from its newest checkpoint."""
        if self.active is not None or self.document.module is None:
            return None
        found = self.resumable()
        if found is None:
            self._show_error("No checkpoint to resume from: runs write one every N epochs (checkpoint every).")
            return None
        folder, epoch, checkpoint = found
        existing = next((r for r in self.runs if r.folder == folder), None)
        if existing is not None:
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
        run = _Run(name, folder, spec, history, self.document.module)
        return self._launch(run, str(checkpoint), max_steps)

    def _launch(self, run: _Run, resume_from: str | None, max_steps: int | None) -> _Run:
        run.source = getattr(self.document, "source", None)
        self.runs.append(run)
        self.active = run
        self.pending_apply = None
        self.apply_button.setEnabled(False)
        self._show_error("")
        run.write("running", resumed_from=resume_from)
        run.control.gui_idle = self.curves.graphics.idle if self.wait_for_paint else None
        task = Task(run_training, run.control, run.source_module, run.spec, str(run.folder), resume_from,
                    max_steps, self.yield_between_steps, title=f"Training {run.name}")
        run.task = task
        task.partial.connect(lambda batch, r=run: self._on_events(r, batch))
        task.cancelled.connect(lambda r=run: self._on_cancelled(r))
        self.controls.set_state("starting", f"Starting {run.name}…" if not resume_from else
                                f"Resuming {run.name} from {Path(resume_from).name}…")
        if self._start_task is not None:
            self._start_task(task, lambda out, r=run: self._on_outcome(r, out),
                             lambda failure, r=run: self._on_failure(r, failure))
        else:
            task.finished.connect(lambda out, r=run: self._on_outcome(r, out))
            task.failed.connect(lambda failure, r=run: self._on_failure(r, failure))
            task.start()
        self.cancel_poll.start()
        if self.switch_interval is not None and self._saved_switch_interval is None:
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval)
        self.run_started.emit(run.name)
        self.active_changed.emit(True)
        return run

    def pause(self) -> None:
        if self.active is not None:
            self.active.control.pause()
            self.controls.set_state("paused" if self.controls.state == "starting" else self.controls.state,
                                    "Pausing after the current step…")

    def resume(self) -> None:
        if self.active is not None:
            self.active.control.resume()

    def stop(self) -> None:
        if self.active is not None:
            self.active.control.stop()
            self.controls.set_state("stopping", "Stopping after the current step…")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop a running run and wait for its thread (the window is closing)."""
        run = self.active
        if run is not None and run.task is not None:
            run.control.stop()
            run.task.wait_thread(timeout)
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None

    def _poll_cancel(self) -> None:
        run = self.active
        if run is None:
            self.cancel_poll.stop()
            return
        if run.task is not None and run.task.is_cancel_requested() and not run.control.stopped:
            run.control.stop()  # the window's Cancel: end a pause too

    # ---- events from the worker -----------------------------------------------------------------
    def _on_events(self, run: _Run, batch: list) -> None:
        h = run.history
        for event in batch:
            h.apply(event)
            if isinstance(event, GradNorms):
                self.grad_table.set_norms(event.norms)
                self.grad_label.setText(f"Gradient norms per module at step {event.global_step} "
                                        f"(frozen modules get none)")
                self.grad_norms_changed.emit(dict(event.norms))
            elif isinstance(event, ev.Started):
                self.controls.set_state("running", f"Training {run.name}: epoch {event.start_epoch} of "
                                        f"{event.total_epochs}, {event.steps_per_epoch} steps an epoch")
            elif isinstance(event, ev.Paused):
                self.controls.set_state("paused", f"Paused at epoch {event.epoch}, step {event.step}.")
            elif isinstance(event, ev.Resumed):
                self.controls.set_state("running", f"Training {run.name}")
            elif isinstance(event, ev.CheckpointSaved):
                self.controls.status_label.setText(f"Checkpoint saved: {Path(event.path).name} "
                                                   f"(epoch {event.epoch})")
            elif isinstance(event, ev.Failed):
                self._show_error(f"{run.name} failed: {event.message}")
        self._shown_run = run
        if not self.refresh_timer.isActive():
            self.refresh_timer.start()

    def refresh(self) -> None:
        """Redraw the curves and the progress line (throttled by `refresh_timer`)."""
        self.refresh_timer.stop()
        started = time.perf_counter()
        idle = self.curves.graphics.idle
        idle.clear()  # the worker waits between two steps while this runs (see _Graphics)
        try:
            run = self._shown_run
            if run is not None:
                h = run.history
                self.controls.set_progress(h.fraction_done(), h.steps_per_second,
                                           h.seconds_left() if h.status == "running" else None,
                                           f"epoch {h.epoch}/{h.total_epochs} · step {h.global_step}/{h.total_steps}")
            self.curves.redraw()
        finally:
            idle.set()
        # the next redraw waits long enough for this one (and the last paint) to stay in budget
        cost = time.perf_counter() - started + self.curves.graphics.paint_seconds
        self.refresh_timer.setInterval(int(1000 * min(1.0, max(1.0 / REFRESH_HZ, cost / GUI_BUDGET))))

    def _on_outcome(self, run: _Run, out: RunOutcome) -> None:
        run.outcome = out
        h = run.history
        self._end(run)
        if out.status == "failed":
            message = out.message or h.message or "the run failed"
            self._show_error(f"{run.name} failed: {message}. The model was left as it was.")
            self.controls.set_state("failed", f"Failed: {message}")
            run.write("failed", message=message, error=out.error)
        else:
            h.status = out.status
            how = f"trained {out.steps} steps" + (f" in {out.seconds:.1f} s" if out.seconds else "")
            word = "Finished" if out.status == "finished" else "Stopped"
            self.controls.set_state(out.status, f"{word}: {run.name}, {how}.")
            if out.status == "finished":
                self.controls.set_progress(1.0, h.steps_per_second, 0.0, f"epoch {h.epoch}/{h.total_epochs}")
            run.write(out.status, steps=out.steps)
            if out.steps > 0:
                self.pending_apply = run
                self.apply_button.setEnabled(True)
                if self.apply_check.isChecked():
                    if self.document.module is run.source_module:
                        self.apply_pending()
                    else:
                        self.controls.status_label.setText(
                            f"{word}: {run.name}. The model changed while it trained: 'Apply trained model' "
                            f"replaces the current one.")
        self._record_run(run, out.status)
        self.run_ended.emit(run.name, out.status)

    def _on_cancelled(self, run: _Run) -> None:
        """The window's Cancel stopped the task: the outcome was left on the run's control."""
        c = run.control
        if c.outcome is not None:
            self._on_outcome(run, c.outcome)
        else:

            exc = c.exception or RuntimeError("the run was cancelled before it started")
            self._on_failure(run, TaskFailure(exc, c.traceback))

    def _on_failure(self, run: _Run, failure) -> None:
        """The worker raised before or outside the loop (data, model, checkpoint)."""
        exc = failure.exception
        self._end(run)
        run.history.status = "failed"
        message = str(exc) if isinstance(exc, (TrainingSetupError, ValueError, OSError)) else \
            f"{type(exc).__name__}: {exc}"
        run.history.message = message
        self._show_error(f"{run.name} could not run: {message}. The model was left as it was.")
        self.controls.set_state("failed", f"Failed: {message}")
        run.write("failed", message=message, error=getattr(failure, "traceback", ""))
        self._record_run(run, "failed")
        self.run_ended.emit(run.name, "failed")

    def _end(self, run: _Run) -> None:
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

    def _record_run(self, run: _Run, status: str) -> None:
        runs = getattr(self.document, "runs", None)
        if runs is None:
            return
        entry = {"name": run.name, "folder": str(run.folder), "status": status,
                 "global_step": run.history.global_step, "epoch": run.history.epoch}
        for i, r in enumerate(runs):
            if r.get("folder") == entry["folder"]:
                runs[i] = entry
                return
        runs.append(entry)

    def apply_pending(self) -> bool:
        """Make the last run's trained model the document's model (one undoable step)."""
        run = self.pending_apply
        if run is None or run.outcome is None or self.document.module is None:
            return False
        if getattr(self.document, "source", None) != run.source:
            self._show_error(f"{run.name} trained another model than the one open now; it was not applied.")
            self.pending_apply = None
            self.apply_button.setEnabled(False)
            return False
        out = run.outcome
        edit = {"op": "load", "path": out.weights, "allow_partial": False} if out.weights else None
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


def install(window, **kwargs) -> TrainingPanel:
    """Put a TrainingPanel in the window's 'Training' tab (replacing the placeholder) and wire it
    to the window: its document, its task runner (status-bar progress and Cancel), and the app's
    data folder for the runs of an unsaved document."""
    if "runs_dir" not in kwargs and "default_runs_dir" not in kwargs:
        data_dir = getattr(getattr(window, "settings", None), "data_dir", lambda: None)()
        if data_dir is not None:
            kwargs["default_runs_dir"] = Path(data_dir) / "runs"
    panel = TrainingPanel(window.document, window, start_task=getattr(window, "start_task", None), **kwargs)
    tabs = window.tabs
    index = next((i for i in range(tabs.count()) if tabs.tabText(i).replace("&", "") == "Training"), tabs.count())
    old = tabs.widget(index) if index < tabs.count() else None
    if old is not None:
        tabs.removeTab(index)
        old.deleteLater()
    # the dashboard's own minimum width must not widen the window: it shrinks with the tab
    panel.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    tabs.insertTab(index, panel, "Training")
    window.training_tab = panel
    window.training_panel = panel
    return panel


def train_steps(window, steps: int, timeout: float = 600.0) -> bool:
    """Show the Training tab, train the open model `steps` steps with the default settings and
    wait until the run has ended and the trained model is the document's (`--train-steps`)."""
    panel = getattr(window, "training_panel", None) or install(window)
    window.tabs.setCurrentWidget(panel)
    if panel.start(max_steps=steps) is None:
        return False
    done = panel.wait(timeout)
    return done and panel.runs[-1].history.status != "failed" and not panel.last_error
