"""The events a training run emits, in order, to its listeners.

Each is a small frozen dataclass; listeners receive them on the thread that runs the loop
(the app forwards them to the GUI thread through a queued signal).

- `Started(total_epochs, steps_per_epoch, start_epoch, seed)`: once, before the first step.
- `StepLoss(epoch, step, steps_per_epoch, global_step, loss)`: after every training step.
- `LearningRate(epoch, step, global_step, lr)`: the learning rate that step used.
- `Throughput(epoch, global_step, items_per_second, steps_per_second)`: about once a second
  of training, and at the end of each epoch's training part.
- `EpochMetrics(epoch, metrics)`: the training metrics of an epoch (name -> value).
- `ValidationMetrics(epoch, metrics)`: the validation metrics of an epoch.
- `CheckpointSaved(epoch, path)`.
- `Paused(epoch, step)`, `Resumed(epoch, step)`: around a pause, between two steps.
- `Stopped(epoch, step)`: a stop was requested; the run ends between two steps.
- `Finished(epochs, metrics)`: the last epoch ended (metrics: the last validation metrics,
  or training metrics without a validation set).
- `Failed(epoch, step, message, loss_name=None, value=None, param=None)`: the run ended with
  an error: a non-finite loss (the message says which loss, where, and its value), a
  parameter that became NaN or infinite although the losses were finite (`param`: its path;
  `value`: a non-finite value it holds), or an exception.

Two more come from the app's worker (`engine.train.worker`), not from the loop itself:

- `GradNorms(epoch, global_step, norms)`: per-module gradient norms, sampled now and then.
- `Prefill(step_losses, history, global_step)`: the progress a resumed run starts from.
- `DataInfo(text)`: how a data file was read (the kind inferred for its targets, the inputs' dtype).

Steps are counted from 1 within an epoch; epochs from 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class Event:
    """Base class of training events."""


@dataclass(frozen=True)
class Started(Event):
    total_epochs: int
    steps_per_epoch: int
    start_epoch: int
    seed: int


@dataclass(frozen=True)
class StepLoss(Event):
    epoch: int
    step: int
    steps_per_epoch: int
    global_step: int
    loss: float


@dataclass(frozen=True)
class LearningRate(Event):
    epoch: int
    step: int
    global_step: int
    lr: float


@dataclass(frozen=True)
class Throughput(Event):
    epoch: int
    global_step: int
    items_per_second: float
    steps_per_second: float


@dataclass(frozen=True)
class EpochMetrics(Event):
    epoch: int
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ValidationMetrics(Event):
    epoch: int
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointSaved(Event):
    epoch: int
    path: str


@dataclass(frozen=True)
class Paused(Event):
    epoch: int
    step: int


@dataclass(frozen=True)
class Resumed(Event):
    epoch: int
    step: int


@dataclass(frozen=True)
class Stopped(Event):
    epoch: int
    step: int


@dataclass(frozen=True)
class Finished(Event):
    epochs: int
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Failed(Event):
    epoch: int
    step: int
    message: str
    loss_name: str | None = None
    value: float | None = None
    param: str | None = None


@dataclass(frozen=True)
class GradNorms(Event):
    """Per-module gradient L2 norms at `global_step` (module path -> norm; `None` when no
    parameter below the module received a gradient, i.e. it is frozen)."""

    epoch: int
    global_step: int
    norms: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Prefill(Event):
    """The progress a resumed run starts from (read from its checkpoint)."""

    step_losses: tuple
    history: tuple
    global_step: int


@dataclass(frozen=True)
class DataInfo(Event):
    """How the run's data file was read: the kind of its targets (chosen or inferred, and why)
    and the dtype its inputs keep."""

    text: str
