"""A run on a worker thread, as the app's Training tab runs it: `run_training` checks that a
training step fits in memory (`preflight.estimate_run`, `NotEnoughMemory` when it does not),
makes the data set, forks the model to the chosen device, checks that one batch fits the model and the loss,
then runs a `Learner` and saves the trained weights in the run folder (`trained.bpk`; a resumed run,
whose earlier weights an applied edit loads, `trained-step<N>.bpk`).

- The loop's events are batched and sent through `state.set_partial_result(batch)` at most
  every `FLUSH_S` seconds (control events at once); the task's progress goes to
  `state.set_progress(fraction)` at most every `PROGRESS_S` seconds.
- `RunControl` carries pause / resume / stop from another thread to the learner once it
  exists, and the outcome (or the exception) back, since a cancelled task drops its result.
- `RunControl.between_steps`, when given, is called on the worker between two steps: the
  app's Training tab waits there while it draws (`app.training_run.GuiGate`), since a paint
  calls back into Python many times and each call would otherwise queue for the GIL behind the
  training thread. The engine sets no policy of its own there.
"""
from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# Everything the worker uses is imported here, not on first use: an import on the worker thread
# holds the GIL while the GUI's import hook reads the module's source, and the window stalls.
from .. import store  # noqa: F401 - checkpoints and trained.bpk
from . import events as ev
from .events import GradNorms, Prefill
from .grad_norms import GradTap
from .checkpoint import describe_os_error, disk_errno
from .learner import Learner
from .preflight import TrainingSetupError, estimate_run, preflight
from .run_spec import CAUSAL_LM_TASK, FILE_TASK, RunSpec, fit_file_data, make_data, make_step

FLUSH_S = 1 / 4  # the worker sends batched events at most this often (control events at once)
PROGRESS_S = 0.5  # and the task's progress (the window's status bar) at most this often
CONTROL_EVENTS = (ev.Started, ev.Paused, ev.Resumed, ev.Stopped, ev.Finished, ev.Failed, ev.CheckpointSaved)


def save_trained(model, path: Path) -> Path:
    """Write the trained model's record (`trained.bpk`); raises the OSError of a full disk."""
    return model.into_record().save(path)


class RunControl:
    """Pause / resume / stop asked from the GUI, forwarded to the learner once it exists.
    `between_steps()`, when given, is called on the worker thread between two steps."""

    def __init__(self, between_steps: Callable[[], None] | None = None):
        self._lock = threading.Lock()
        self.learner: Learner | None = None
        self.paused = False
        self.stopped = False
        self.between_steps = between_steps  # the caller's hook between two steps (the app's GUI waits there)
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
    save_error: str = ""  # trained.bpk or a checkpoint could not be written (a full disk): what, in words
    data_note: str = ""  # how the data was read (the kind inferred for a file's targets)


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
            if self.control.between_steps is not None:
                self.control.between_steps()
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
    # a step that cannot fit is refused before the data is read or a weight allocated
    estimate_run(model, spec).check()
    # causal-lm text is checked against the model's vocabulary and positions as it is read
    train, valid, kind, data_name = make_data(spec.data, cfg.seed, model=model if spec.data.task == CAUSAL_LM_TASK
                                              else None)
    # A lazy parameter stays lazy in the fork and shares its lazy state with the document's, so
    # every run (and the document itself) reads the values the first reader made.
    try:
        fork = model.fork(cfg.device)
    except Exception as e:  # noqa: BLE001
        raise TrainingSetupError(f"the model cannot be moved to {cfg.device}: {type(e).__name__}: {e}") from e
    devices = fork.devices()
    data_note = ""
    if spec.data.task == FILE_TASK:
        train, valid, kind, data_note = fit_file_data(fork, train, valid, spec.data, devices[0] if devices else None)
        forwarder_note = ev.DataInfo(data_note)
    else:  # a conversation file: its format, conversations, assistant tokens learnt, rows truncated
        forwarder_note = ev.DataInfo(train.note) if getattr(train, "note", "") else None
    if spec.data.loss == "mse":
        kind = "regression"
    elif spec.data.loss == "cross-entropy":
        kind = "classification"
    preflight(fork, train, kind, spec.data.loss, devices[0] if devices else None, data_name)
    forwarder = _Forwarder(state.set_partial_result, control, max_steps, yield_between_steps,
                           getattr(state, "set_progress", None))
    if forwarder_note is not None:
        forwarder(forwarder_note)
    optimizer = GradTap(spec.optimizer_config.init(), forwarder.grad_norms)
    epochs, done = cfg.num_epochs, 0
    if resume_from:
        progress = json.loads((Path(resume_from) / "training.json").read_text())
        done = int(progress["epoch"])
        forwarder(Prefill(tuple(progress["step_losses"]), tuple(progress["history"]), int(progress["global_step"])))
    if max_steps is not None:
        n = len(train)
        batches = max(1, n // cfg.batch_size if cfg.drop_last else -(-n // cfg.batch_size))
        per_epoch = -(-batches // max(1, int(cfg.grad_accumulation)))  # optimizer steps, as the Learner counts
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
    save_error = getattr(result, "disk_error", "") or ""
    if status != "failed" and steps > 0:
        # the project keeps an edit that loads these weights, so reopening it gives the trained model
        target = Path(run_dir) / "trained.bpk"
        if target.exists():  # a resumed run: the weights applied before stay where their edit loads them
            target = Path(run_dir) / f"trained-step{forwarder.global_step}.bpk"
        try:
            weights = str(save_trained(result.model, target))
        except Exception as e:  # noqa: BLE001 - a full disk must not throw the trained model away
            if not (isinstance(e, OSError) or disk_errno(e) is not None):
                raise
            save_error = f"the trained weights could not be written to {target}: {describe_os_error(e)}"
            try:
                target.unlink()  # no partial file is left behind
            except OSError:
                pass
    return RunOutcome(status, result.model, steps, forwarder.global_step, weights=weights, error=result.error or "",
                      save_error=save_error, data_note=data_note,
                      message=result.error.splitlines()[0] if result.error else "",
                      reached_max_steps=forwarder.reached_max, seconds=time.perf_counter() - started,
                      train_seconds=ended - forwarder.started_at if forwarder.started_at is not None else 0.0)
