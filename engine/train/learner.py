"""The training loop: epochs of training and validation steps, events, pause / resume / stop,
seeds, checkpoints.

```python
learner = Learner(model, optim.AdamConfig().init(), lr=1e-3, task=build_task("spirals"),
                  config=TrainingConfig(num_epochs=20, batch_size=64, seed=7))
learner.subscribe(print)          # every event (see events.py)
result = learner.run()            # blocks; run it on a worker thread for a GUI
result.model, result.status       # "finished" | "stopped" | "failed"
```

Control. `pause()`, `resume()` and `stop()` may be called from any thread; the loop honours
them between two steps (a step is never interrupted). `stop()` also ends a pause.

Batches. Training batches are associated with autodiff (`DataLoader(..., autodiff=True)`),
as in Burn, where they live on the autodiff backend: layers apply their training behaviour
(dropout, batch-norm running statistics, noise) only to autodiff inputs, so without it a
model's first such layer would never train. Validation runs `model.valid()` on plain batches.

One step. By default a step is `output = model.forward(inputs)`, then the task's loss
(`cross_entropy` for classification, `mse_loss` for regression, `causal_lm_loss` for
`kind="causal-lm"`: next-token cross entropy over the targets that are not `IGNORE_INDEX`,
with perplexity, next-token accuracy and tokens/s as its metrics); pass `step=fn(model, batch)`
returning a `StepOutput` for anything else (several named losses, a custom forward). A loss
that is NaN or infinite ends the run with a `Failed` event saying which loss, at which epoch
and step, and its value; the step's update is not applied.

Accumulation, warm-up, clipping (`TrainingConfig`). With `grad_accumulation=N` one optimizer
step takes N batches (micro-batches): each one's forward and backward run in turn and their
gradients are summed, each loss weighted by its share of the loss items of the N batches
(target tokens for causal-lm, whose `IGNORE_INDEX` targets count for nothing; targets
otherwise), so the gradient is that of the mean over all kept items of the accumulated batch,
as one big batch would give it (not a mean of per-batch means). A step is then N batches:
`Started.steps_per_epoch`, `StepLoss` and the schedule count optimizer steps, and the step's
loss is the accumulated batch's mean. `warmup_steps=W` puts a linear warm-up in front of the
learning-rate schedule (`optim.linear_warmup`: step k of W uses `peak * k / W`, then the
schedule from its first step). `max_grad_norm=M` scales all gradients together so that their
global L2 norm is at most M before each update (`GradientsParams.clip_grad_norm_global`,
PyTorch's `clip_grad_norm_`; an optimizer's own `grad_clipping` clips per tensor, as Burn).

Finite parameters. A finite loss does not make finite weights: a NaN gradient (say, of
`sqrt` at 0 behind a zero factor) leaves the loss finite and the updated parameters NaN. At
the end of every epoch (before validation and the checkpoint) and when a run stops, the loop
checks every initialized float parameter; one holding NaN or infinity ends the run "failed",
never "finished" or "stopped", with a `Failed` event naming the first such parameter's path,
the epoch and the steps whose updates could have done it; the model given to the loop is
checked before the first step too. Once an epoch keeps it cheap: one pass over the
parameters, 35 µs for the spirals MLP (0.2 % of its epoch; every step would cost 6 %). A
non-finite loss also says which parameter was already non-finite, when one was.

Reproducibility. `seed` fixes the shuffling (epoch `e` is shuffled by `(seed, e)`) and, at
the start of each epoch, reseeds the training device's generator from `(seed, e)`, so dropout
masks and any random op of epoch `e` do not depend on what ran before. A model given as a
factory `fn(device) -> Module` is built after the device is seeded with `seed`. Resuming from
a checkpoint written at the end of epoch `e` therefore gives the very losses of the
uninterrupted run from epoch `e + 1` on.

Checkpoints. With `checkpoint_every=N` and `checkpoint_dir`, the end of every N-th epoch
writes `checkpoint_dir/epoch-<e>/`: `model.bpk` (the module record), `optimizer.bpk` (the
optimizer state record), `scheduler.bpk` (the scheduler's scalars) and `training.json` (epoch,
global step, seed, history). `Learner.resume_from(path)` (or `TrainingConfig.resume_from`)
loads them and continues with the next epoch. Only the newest `keep_checkpoints` (default 3;
0: all) stay; older ones are deleted after each new one. A checkpoint that cannot be written
(a full disk) ends the run as failed with `TrainingResult.disk_error` saying so; the model it
returns is the one trained through that epoch, and no half-written folder is left.
"""
from __future__ import annotations

import math
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..autodiff import no_recording
from ..tensor import raw
from ..tensor.device import as_device
from . import events as ev
from .data import DataLoader, Dataset
from .losses import IGNORE_INDEX, causal_lm_loss, cross_entropy, mse_loss
from .metrics import LossMetric, Metric, default_metrics


@dataclass
class TrainingConfig:
    num_epochs: int = 10
    batch_size: int = 64
    valid_batch_size: int | None = None
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    checkpoint_every: int = 0  # epochs; 0: never
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 3  # the newest N checkpoints are kept, older ones deleted; 0: keep all
    resume_from: str | None = None
    throughput_interval: float = 1.0  # seconds between Throughput events
    device: object = None
    grad_accumulation: int = 1  # batches (micro-batches) per optimizer step
    warmup_steps: int = 0  # a linear learning-rate warm-up over this many optimizer steps, then the schedule
    max_grad_norm: float | None = None  # clip all gradients together to this global L2 norm; None: no clipping

    def __post_init__(self):
        if self.num_epochs < 1:
            raise ValueError(f"TrainingConfig: num_epochs must be at least 1, got {self.num_epochs}")
        if self.batch_size < 1:
            raise ValueError(f"TrainingConfig: batch_size must be at least 1, got {self.batch_size}")
        if self.keep_checkpoints < 0:
            raise ValueError(f"TrainingConfig: keep_checkpoints must be 0 (keep all) or more, got {self.keep_checkpoints}")
        if int(self.grad_accumulation) != self.grad_accumulation or self.grad_accumulation < 1:
            raise ValueError(f"TrainingConfig: grad_accumulation must be a whole number of at least 1, got "
                             f"{self.grad_accumulation}")
        if int(self.warmup_steps) != self.warmup_steps or self.warmup_steps < 0:
            raise ValueError(f"TrainingConfig: warmup_steps must be a whole number of 0 (none) or more, got "
                             f"{self.warmup_steps}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"TrainingConfig: max_grad_norm must be greater than 0 (or None: no clipping), got "
                             f"{self.max_grad_norm}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("TrainingConfig: checkpoint_every is set but checkpoint_dir is not: say where to write")


@dataclass
class StepOutput:
    """What one step produced: the loss to minimize, and what metrics read.

    `losses` optionally names the loss's parts (each is checked for NaN / infinity)."""

    loss: object  # Tensor, rank 0
    output: object = None  # Tensor
    targets: object = None  # Tensor
    losses: dict = field(default_factory=dict)


@dataclass
class TrainingResult:
    status: str  # "finished" | "stopped" | "failed"
    model: object
    epochs_completed: int
    step_losses: list  # training loss of every step, in order
    history: list  # per epoch: {"epoch", "train": {...}, "valid": {...}}
    error: str | None = None
    disk_error: str = ""  # a checkpoint could not be written (a full disk): what, in words


def default_step(kind: str, pad_token: int | None = None):
    if kind == "causal-lm":
        def lm_step(model, batch) -> StepOutput:
            # rows are right-padded: under causal attention no real token attends to a pad, so the
            # logits at real positions need no attention mask; pad targets are IGNORE_INDEX
            if batch.segment_ids is not None:  # packed sequences: each attends to itself, positions from 0
                output = model.forward(batch.inputs, position_ids=batch.position_ids, segment_ids=batch.segment_ids)
            else:
                output = model.forward(batch.inputs)
            return StepOutput(causal_lm_loss(output, batch.targets), output, batch.targets)

        return lm_step
    loss_fn = cross_entropy if kind == "classification" else mse_loss

    def step(model, batch) -> StepOutput:
        output = model.forward(batch.inputs)
        if kind == "classification":
            loss = loss_fn(output, batch.targets, pad_token) if pad_token is not None else loss_fn(output, batch.targets)
        else:
            loss = loss_fn(output, batch.targets)
        return StepOutput(loss, output, batch.targets)

    return step


def _derived_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), 0x5EED]).generate_state(1)[0])


class Learner:
    def __init__(self, model, optimizer, lr=1e-3, task=None, train=None, valid=None, config=None, kind=None,
                 step=None, valid_step=None, metrics=None, listeners=()):
        from ..optim.lr_scheduler import as_scheduler

        self.config = config or TrainingConfig()
        device = self.config.device
        if device is None and not _is_factory(model) and hasattr(model, "devices"):
            devices = model.devices()  # train where the model lives
            device = devices[0] if devices else None
        self.device = as_device(device)
        self.task = task
        self.train_set: Dataset = train if train is not None else (task.train if task is not None else None)
        self.valid_set: Dataset | None = valid if valid is not None else (task.valid if task is not None else None)
        if self.train_set is None:
            raise ValueError("Learner: give a task or a training data set (train=...)")
        self.kind = kind or (task.kind if task is not None else "classification")
        self.step_fn = step or default_step(self.kind)
        self.valid_step_fn = valid_step or self.step_fn
        self._model_arg = model
        self.optimizer = optimizer
        self.scheduler = as_scheduler(_with_warmup(lr, self.config.warmup_steps))
        self.metric_factory = metrics
        self._listeners = list(listeners)
        self._cond = threading.Condition()
        self._paused = False
        self._stop = False
        self.state = "idle"  # idle | running | paused | finished | stopped | failed
        self._start_epoch = 1
        self._global_step = 0
        self._step_losses: list = []
        self._history: list = []
        if self.config.resume_from:
            self.resume_from(self.config.resume_from)

    # ------------------------------------------------------------------ listeners
    def subscribe(self, listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, event) -> None:
        for listener in list(self._listeners):
            listener(event)

    # ------------------------------------------------------------------ control (any thread)
    def pause(self) -> None:
        with self._cond:
            self._paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    @property
    def is_paused(self) -> bool:
        return self._paused

    def _checkpoint_between_steps(self, epoch: int, step: int) -> bool:
        """Honour pause and stop; True when the run must stop."""
        if not self._paused and not self._stop:
            return False
        with self._cond:
            if self._paused and not self._stop:
                self.state = "paused"
                self._emit(ev.Paused(epoch, step))
                while self._paused and not self._stop:
                    self._cond.wait()
                if not self._stop:
                    self.state = "running"
                    self._emit(ev.Resumed(epoch, step))
            return self._stop

    # ------------------------------------------------------------------ metrics
    def _new_metrics(self) -> list[Metric]:
        if self.metric_factory is None:
            return default_metrics(self.kind)
        ms = self.metric_factory() if callable(self.metric_factory) else list(self.metric_factory)
        if not any(isinstance(m, LossMetric) for m in ms):
            ms = [LossMetric(), *ms]
        return ms

    # ------------------------------------------------------------------ checkpoints
    def resume_from(self, path) -> None:
        """Load a checkpoint written by this loop; the run continues with the next epoch."""
        from .checkpoint import load_checkpoint

        state = load_checkpoint(path, self._build_model(), self.optimizer, self.scheduler)
        self._model_arg = state["model"]
        self.optimizer = state["optimizer"]
        self._start_epoch = state["epoch"] + 1
        self._global_step = state["global_step"]
        self._step_losses = list(state["step_losses"])
        self._history = list(state["history"])

    def _save_checkpoint(self, model, epoch: int) -> str:
        from .checkpoint import save_checkpoint

        from .checkpoint import describe_os_error, disk_errno, prune_checkpoints

        path = Path(self.config.checkpoint_dir) / f"epoch-{epoch}"
        try:
            save_checkpoint(path, model, self.optimizer, self.scheduler, dict(
                epoch=epoch, global_step=self._global_step, seed=self.config.seed,
                step_losses=self._step_losses, history=self._history))
        except Exception as e:
            if isinstance(e, OSError) or disk_errno(e) is not None:
                raise _DiskError(f"the checkpoint {path} could not be written: {describe_os_error(e)}") from e
            raise
        prune_checkpoints(self.config.checkpoint_dir, self.config.keep_checkpoints)
        return str(path)

    # ------------------------------------------------------------------ the loop
    def _build_model(self):
        m = self._model_arg
        if _is_factory(m):
            self.device.seed(self.config.seed)
            m = m(self.device)
        return m

    def run(self) -> TrainingResult:
        """Train; a `stop()` asked before or during the run ends it between two steps."""
        try:
            return self._run()
        finally:
            with self._cond:  # the request is used up: a later run() starts afresh
                self._stop = False

    def _run(self) -> TrainingResult:
        cfg = self.config
        self.state = "running"
        epoch, step = self._start_epoch, 0
        model = None
        try:
            model = self._build_model()
            if hasattr(model, "train"):
                model = model.train()
            # training batches are associated with autodiff: a first layer's training behaviour
            # (dropout, batch-norm statistics, noise) needs it; validation batches stay plain
            loader = DataLoader(self.train_set, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed,
                                drop_last=cfg.drop_last, device=self.device, autodiff=True)
            valid_loader = None
            if self.valid_set is not None and len(self.valid_set):
                valid_loader = DataLoader(self.valid_set, cfg.valid_batch_size or cfg.batch_size, shuffle=False,
                                          device=self.device)
            if self.kind == "causal-lm":  # token ids the model has no embedding for fail here, not mid-epoch
                from .text import check_fits

                for data in (self.train_set, self.valid_set):
                    if data is not None and data.arrays() is not None:
                        check_fits(model, data)
            broken = first_non_finite_param(model)
            if broken is not None:
                path, value = broken
                message = (f"parameter '{path}' is {value} before the first step: the model given to the loop "
                           f"is not finite")
                self.state = "failed"
                self._emit(ev.Failed(epoch, 0, message, None, value, path))
                return TrainingResult("failed", model, epoch - 1, self._step_losses, self._history, error=message)
            accum = int(cfg.grad_accumulation)
            steps_per_epoch = -(-len(loader) // accum)
            self._emit(ev.Started(cfg.num_epochs, steps_per_epoch, self._start_epoch, cfg.seed))
            last_metrics: dict = {}
            from ..optim import GradientsParams

            for epoch in range(self._start_epoch, cfg.num_epochs + 1):
                loader.set_epoch(epoch)
                self.device.seed(_derived_seed(cfg.seed, epoch))
                metrics = self._new_metrics()
                t_mark, items_mark, steps_mark = time.perf_counter(), 0, 0
                step = 0
                epoch_start_step = self._global_step + 1
                for step, group in enumerate(_micro_batches(loader, accum), start=1):
                    if self._checkpoint_between_steps(epoch, step - 1):
                        return self._finish_stopped(model, epoch, step - 1, epoch_start_step)
                    lr = self.scheduler.step()
                    counts = [self._loss_items(b) for b in group] if len(group) > 1 else [1]
                    total = sum(counts)
                    grads, loss_value, n = None, 0.0, 0
                    for k, (batch, count) in enumerate(zip(group, counts), start=1):
                        out = self.step_fn(model, batch)
                        bad = _non_finite(out)
                        if bad is not None:
                            name, value = bad
                            part = f" (micro-batch {k} of {len(group)})" if len(group) > 1 else ""
                            message = (f"the {name} is {value} at epoch {epoch}, step {step}{part} "
                                       f"(global step {self._global_step + 1}); the run stopped before applying "
                                       f"this step")
                            broken = first_non_finite_param(model)
                            if broken is not None:
                                message += (f"; parameter '{broken[0]}' was already {broken[1]} before it (an "
                                            f"earlier update made it non-finite)")
                            return self._finish_failed(model, epoch, step, message, name, value)
                        part_value = float(out.loss)
                        if len(group) == 1:
                            loss, loss_value = out.loss, part_value
                        else:  # weighted by this batch's share of the accumulated batch's loss items
                            share = count / total if total else 0.0
                            loss, loss_value = out.loss * share, loss_value + part_value * share
                        part_grads = GradientsParams.from_grads(loss.backward(), model)
                        grads = part_grads if grads is None else _add_grads(grads, part_grads)
                        n += len(batch)
                        _update_metrics(metrics, out, batch, part_value)
                        del out, loss
                    if cfg.max_grad_norm is not None:
                        grads.clip_grad_norm_global(cfg.max_grad_norm)
                    model = self.optimizer.step(lr, model, grads)
                    self._global_step += 1
                    self._step_losses.append(loss_value)
                    self._emit(ev.StepLoss(epoch, step, steps_per_epoch, self._global_step, loss_value))
                    self._emit(ev.LearningRate(epoch, step, self._global_step, float(lr)))
                    items_mark += n
                    steps_mark += 1
                    now = time.perf_counter()
                    if now - t_mark >= cfg.throughput_interval or step == steps_per_epoch:
                        dt = max(now - t_mark, 1e-9)
                        self._emit(ev.Throughput(epoch, self._global_step, items_mark / dt, steps_mark / dt))
                        t_mark, items_mark, steps_mark = now, 0, 0
                failure = self._check_params(model, epoch, step, epoch_start_step,
                                             f"at the end of epoch {epoch} (step {step}, global step {self._global_step})")
                if failure is not None:
                    return failure
                train_metrics = {m.name: m.value() for m in metrics}
                self._emit(ev.EpochMetrics(epoch, train_metrics))
                record = {"epoch": epoch, "train": train_metrics}
                last_metrics = train_metrics
                if valid_loader is not None:
                    valid_metrics = self._validate(model, valid_loader, epoch)
                    if valid_metrics is None:
                        return self._finish_stopped(model, epoch, step, epoch_start_step)
                    record["valid"] = valid_metrics
                    last_metrics = valid_metrics
                    self._emit(ev.ValidationMetrics(epoch, valid_metrics))
                self._history.append(record)
                if cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0:
                    path = self._save_checkpoint(model, epoch)
                    self._emit(ev.CheckpointSaved(epoch, path))
            self.state = "finished"
            self._emit(ev.Finished(cfg.num_epochs, last_metrics))
            return TrainingResult("finished", model, cfg.num_epochs, self._step_losses, self._history)
        except _NonFiniteLoss as e:
            return self._finish_failed(model, epoch, step, e.message, e.name, e.value)
        except _DiskError as e:  # the model trained through this epoch is sound: the disk is not
            message = f"{e} (after epoch {epoch})"
            self.state = "failed"
            self._emit(ev.Failed(epoch, step, message))
            return TrainingResult("failed", model, epoch, self._step_losses, self._history, error=message,
                                  disk_error=message)
        except Exception as e:  # reported as an event: the worker thread must not die silently
            message = f"{type(e).__name__}: {e} (at epoch {epoch}, step {step})"
            self.state = "failed"
            self._emit(ev.Failed(epoch, step, message))
            return TrainingResult("failed", model, epoch - 1, self._step_losses, self._history,
                                  error=message + "\n" + traceback.format_exc())

    def _loss_items(self, batch) -> int:
        """What a batch's loss is the mean over: target tokens not IGNORE_INDEX (causal-lm), else
        its targets' entries (items, positions of a sequence, outputs of a regression)."""
        y = raw.array(batch.targets)
        if self.kind == "causal-lm":
            return int((y != IGNORE_INDEX).sum())
        return int(y.size)

    def _validate(self, model, loader, epoch):
        metrics = self._new_metrics()
        vmodel = model.valid() if hasattr(model, "valid") else model
        with no_recording():
            for i, batch in enumerate(loader):
                if self._stop:
                    return None
                out = self.valid_step_fn(vmodel, batch)
                bad = _non_finite(out, "validation")
                if bad is not None:
                    name, value = bad
                    raise _NonFiniteLoss(name, value, f"the {name} is {value} at epoch {epoch}, validation batch {i + 1}")
                _update_metrics(metrics, out, batch, float(out.loss))
        return {m.name: m.value() for m in metrics}

    def _check_params(self, model, epoch, step, first_step, where):
        """A failed result when a parameter holds NaN or infinity, else None."""
        broken = first_non_finite_param(model)
        if broken is None:
            return None
        path, value = broken
        last = self._global_step
        steps = f"global step {last}" if first_step >= last else f"global steps {first_step}-{last}"
        message = (f"parameter '{path}' is {value} {where} although every loss was finite: an update of "
                   f"{steps} made it non-finite (a NaN or infinite gradient, or a learning rate too large); "
                   f"the trained model is not usable")
        self.state = "failed"
        self._emit(ev.Failed(epoch, step, message, None, value, path))
        return TrainingResult("failed", model, epoch - 1, self._step_losses, self._history, error=message)

    def _finish_stopped(self, model, epoch, step, first_step) -> TrainingResult:
        if step > 0:  # steps ran since the last check
            failure = self._check_params(model, epoch, step, first_step, f"when the run stopped at epoch {epoch}, "
                                         f"step {step} (global step {self._global_step})")
            if failure is not None:
                return failure
        self.state = "stopped"
        self._emit(ev.Stopped(epoch, step))
        return TrainingResult("stopped", model, epoch - 1, self._step_losses, self._history)

    def _finish_failed(self, model, epoch, step, message, name, value) -> TrainingResult:
        self.state = "failed"
        self._emit(ev.Failed(epoch, step, message, name, value))
        return TrainingResult("failed", model, epoch - 1, self._step_losses, self._history, error=message)


def first_non_finite_param(model):
    """`(path, value)` of the first float parameter (in the model's order) that holds NaN or
    infinity, `value` being its first such entry; None when all are finite. Lazy parameters not
    yet initialized are skipped (never initialized by the check)."""
    params = getattr(model, "named_params", None)
    if params is None:
        return None
    for path, param in params():
        if param.kind != "float" or not param.is_initialized():
            continue
        t = param.val()
        data = raw.array(t)
        xp = t.device.xp
        finite = xp.isfinite(data)
        if not bool(finite.all()):
            return path, float(data[~finite].ravel()[0])
    return None


def _update_metrics(metrics, out: StepOutput, batch, loss_value: float) -> None:
    targets = out.targets if out.targets is not None else batch.targets
    for m in metrics:
        if out.output is None and not isinstance(m, LossMetric):
            continue  # a step that reports only its loss feeds only the loss metric
        m.update(out.output, targets, loss_value)


def _micro_batches(loader, n: int):
    """The loader's batches in groups of `n` (the last group may be smaller)."""
    group = []
    for batch in loader:
        group.append(batch)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


def _add_grads(into, more):
    """Sum two `GradientsParams` (into `into`)."""
    for pid in more.ids():
        g = more.get(pid)
        have = into.get(pid)
        if have is None:
            into.register(pid, g)
        else:
            into.register(pid, raw.wrap(raw.array(have) + raw.array(g), have.device))
    return into


def _with_warmup(lr, warmup_steps: int):
    """The learning rate (a float, a scheduler or a config) behind a linear warm-up, when asked."""
    if not warmup_steps:
        return lr
    from ..optim.lr_scheduler import linear_warmup

    peak = float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else (
        getattr(lr, "initial_lr", None) or getattr(lr, "lr", None))
    if peak is None:
        raise ValueError(f"warmup_steps: the schedule {type(lr).__name__} has no initial learning rate to warm up "
                         f"to (it may warm up itself, as Noam does): set warmup_steps to 0")
    return linear_warmup(lr, int(warmup_steps), peak_lr=float(peak))


def _is_factory(m) -> bool:
    from ..module import Module

    return not isinstance(m, Module) and callable(m)


class _DiskError(Exception):
    """A checkpoint could not be written (a full disk, a read-only folder)."""


class _NonFiniteLoss(Exception):
    def __init__(self, name, value, message):
        super().__init__(message)
        self.name, self.value, self.message = name, value, message


def _non_finite(out: StepOutput, split: str = "training"):
    """(name, value) of the first NaN / infinite loss of a step, or None; a named part that
    went bad is reported rather than the total it spoiled."""
    for name, part in (out.losses or {}).items():
        v = float(part)
        if not math.isfinite(v):
            return f"{split} loss '{name}'", v
    value = float(out.loss)
    if not math.isfinite(value):
        return f"{split} loss", value
    return None
