"""Learning-rate schedules, as Burn's `lr_scheduler` module has them.

A scheduler is stepped once per optimizer step; `step()` returns the learning rate to use for
that step. Each is built from a `...Config` whose fields, defaults and validity checks are
Burn's:

- `ConstantLr(lr)`: always `lr`.
- `LinearLrSchedulerConfig(initial_lr, final_lr, num_iters)`: `initial_lr` on the first step,
  then a constant change per step until `final_lr` after `num_iters` steps, then `final_lr`.
  With a small `initial_lr` this is the linear warm-up; `linear_warmup(...)` puts one in front
  of any other schedule.
- `CosineAnnealingLrSchedulerConfig(initial_lr, num_iters, min_lr=0.0)`: cosine from
  `initial_lr` to `min_lr` over `num_iters` steps, then restarts (SGDR).
- `StepLrSchedulerConfig(initial_lr, step_size, gamma=0.1)`: multiplied by `gamma` every
  `step_size` steps.
- `ExponentialLrSchedulerConfig(initial_lr, gamma)`: `initial_lr * gamma**i` at step `i`.
- `NoamLrSchedulerConfig(factor, warmup_steps=4000, model_size=512)`:
  `factor * model_size**-0.5 * min(t**-0.5, t * warmup_steps**-1.5)` at step `t` (from 1).
- `SequentialLrSchedulerConfig(schedulers, milestones)`: runs schedulers one after another;
  each milestone is the number of completed steps at which the next one takes over.

A scheduler's state is a few scalars: `to_record()` returns them as a dict, `load_record`
restores them, so a resumed run continues the same sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


class LrSchedulerError(ValueError):
    """A scheduler configuration is out of range; the message says which field and why."""


class LrScheduler:
    """Base of every scheduler: `step()` gives the next learning rate."""

    def step(self) -> float:
        raise NotImplementedError

    def to_record(self) -> dict:
        return {}

    def load_record(self, record: dict) -> "LrScheduler":
        return self

    # a scheduler can be passed where a config is expected
    def init(self) -> "LrScheduler":
        return self


def _check_initial(name: str, lr: float) -> None:
    if not (0.0 < lr <= 1.0):
        raise LrSchedulerError(f"{name}: initial_lr must be greater than 0 and at most 1, got {lr}")


def _check_iters(name: str, n: int) -> None:
    if int(n) != n or n < 1:
        raise LrSchedulerError(f"{name}: num_iters must be an integer of at least 1, got {n}")


# ---------------------------------------------------------------------------------- constant
class ConstantLr(LrScheduler):
    """A constant learning rate (Burn's `ConstantLr`; a plain float works the same)."""

    def __init__(self, lr: float):
        self.lr = float(lr)

    def step(self) -> float:
        return self.lr

    def __repr__(self) -> str:
        return f"ConstantLr({self.lr})"


# ---------------------------------------------------------------------------------- linear
@dataclass
class LinearLrSchedulerConfig:
    initial_lr: float
    final_lr: float
    num_iters: int

    def init(self) -> "LinearLrScheduler":
        _check_initial("LinearLrSchedulerConfig", self.initial_lr)
        if not (0.0 <= self.final_lr <= 1.0):
            raise LrSchedulerError(
                f"LinearLrSchedulerConfig: final_lr must be at least 0 and at most 1, got {self.final_lr}"
            )
        _check_iters("LinearLrSchedulerConfig", self.num_iters)
        return LinearLrScheduler(self.final_lr, (self.final_lr - self.initial_lr) / self.num_iters, self.num_iters + 1)


class LinearLrScheduler(LrScheduler):
    def __init__(self, final_lr: float, step_size: float, remaining_iters: int):
        self.final_lr = final_lr
        self.step_size = step_size
        self.remaining_iters = remaining_iters

    def step(self) -> float:
        if self.remaining_iters:
            self.remaining_iters -= 1
        return self.final_lr - self.step_size * self.remaining_iters

    def to_record(self) -> dict:
        return {"remaining_iters": self.remaining_iters}

    def load_record(self, record: dict) -> "LinearLrScheduler":
        if "remaining_iters" in record:
            self.remaining_iters = int(record["remaining_iters"])
        return self


# ---------------------------------------------------------------------------------- cosine
@dataclass
class CosineAnnealingLrSchedulerConfig:
    initial_lr: float
    num_iters: int
    min_lr: float = 0.0

    def init(self) -> "CosineAnnealingLrScheduler":
        _check_initial("CosineAnnealingLrSchedulerConfig", self.initial_lr)
        if not (0.0 <= self.min_lr <= self.initial_lr):
            raise LrSchedulerError(
                "CosineAnnealingLrSchedulerConfig: min_lr must be at least 0 and at most initial_lr "
                f"({self.initial_lr}), got {self.min_lr}"
            )
        _check_iters("CosineAnnealingLrSchedulerConfig", self.num_iters)
        return CosineAnnealingLrScheduler(self.min_lr, self.initial_lr, int(self.num_iters))


class CosineAnnealingLrScheduler(LrScheduler):
    def __init__(self, min_lr: float, max_lr: float, num_iters: int):
        self.min_lr = min_lr
        self.max_lr = max_lr
        self.num_iters = num_iters
        self.current_iter = -1  # the first step gives iteration 0

    def step(self) -> float:
        self.current_iter = (self.current_iter + 1) % (self.num_iters + 1)
        cos = math.cos(self.current_iter / self.num_iters * math.pi)
        return self.min_lr + 0.5 * (self.max_lr - self.min_lr) * (1.0 + cos)

    def to_record(self) -> dict:
        return {"current_iter": self.current_iter}

    def load_record(self, record: dict) -> "CosineAnnealingLrScheduler":
        if "current_iter" in record:
            self.current_iter = int(record["current_iter"])
        return self


# ---------------------------------------------------------------------------------- step
@dataclass
class StepLrSchedulerConfig:
    initial_lr: float
    step_size: int
    gamma: float = 0.1

    def init(self) -> "StepLrScheduler":
        if int(self.step_size) != self.step_size or self.step_size < 1:
            raise LrSchedulerError(f"StepLrSchedulerConfig: step_size must be an integer greater than 0, got {self.step_size}")
        return StepLrScheduler(float(self.initial_lr), int(self.step_size), float(self.gamma))


class StepLrScheduler(LrScheduler):
    def __init__(self, init_lr: float, step_size: int, gamma: float):
        self.init_lr = init_lr
        self.step_size = step_size
        self.gamma = gamma
        self.iter_idx = -1

    def step(self) -> float:
        self.iter_idx += 1
        return self.init_lr * self.gamma ** (self.iter_idx // self.step_size)

    def to_record(self) -> dict:
        return {"iter_idx": self.iter_idx}

    def load_record(self, record: dict) -> "StepLrScheduler":
        if "iter_idx" in record:
            self.iter_idx = int(record["iter_idx"])
        return self


# ---------------------------------------------------------------------------------- exponential
@dataclass
class ExponentialLrSchedulerConfig:
    initial_lr: float
    gamma: float

    def init(self) -> "ExponentialLrScheduler":
        _check_initial("ExponentialLrSchedulerConfig", self.initial_lr)
        if not (0.0 < self.gamma <= 1.0):
            raise LrSchedulerError(f"ExponentialLrSchedulerConfig: gamma must be greater than 0 and at most 1, got {self.gamma}")
        return ExponentialLrScheduler(self.initial_lr, self.gamma)


class ExponentialLrScheduler(LrScheduler):
    def __init__(self, initial_lr: float, gamma: float):
        self.gamma = gamma
        self.initial_lr = initial_lr
        self.iter_idx = -1

    def step(self) -> float:
        # computed from the step index (not by repeated multiplication) so a resumed run is exact
        self.iter_idx += 1
        return self.initial_lr * self.gamma**self.iter_idx

    def to_record(self) -> dict:
        return {"iter_idx": self.iter_idx}

    def load_record(self, record: dict) -> "ExponentialLrScheduler":
        if "iter_idx" in record:
            self.iter_idx = int(record["iter_idx"])
        return self


# ---------------------------------------------------------------------------------- noam
@dataclass
class NoamLrSchedulerConfig:
    factor: float
    warmup_steps: int = 4000
    model_size: int = 512

    def init(self) -> "NoamLrScheduler":
        if self.warmup_steps < 1:
            raise LrSchedulerError(
                f"NoamLrSchedulerConfig: warmup_steps (steps before the decay starts) must be greater than 0, got {self.warmup_steps}"
            )
        if self.model_size < 1:
            raise LrSchedulerError(f"NoamLrSchedulerConfig: model_size must be greater than 0, got {self.model_size}")
        return NoamLrScheduler(float(self.factor), float(self.warmup_steps), float(self.model_size))


class NoamLrScheduler(LrScheduler):
    def __init__(self, factor: float, warmup_steps: float, model_size: float):
        self.factor = factor
        self.warmup_steps = warmup_steps
        self.model_size = model_size
        self.step_count = 0.0

    def step(self) -> float:
        self.step_count += 1.0
        t = self.step_count
        return self.factor * self.model_size**-0.5 * min(t**-0.5, t * self.warmup_steps**-1.5)

    def to_record(self) -> dict:
        return {"step": self.step_count}

    def load_record(self, record: dict) -> "NoamLrScheduler":
        if "step" in record:
            self.step_count = float(record["step"])
        return self


# ---------------------------------------------------------------------------------- sequential
@dataclass
class SequentialLrSchedulerConfig:
    schedulers: list = field(default_factory=list)
    milestones: list = field(default_factory=list)

    def init(self) -> "SequentialLrScheduler":
        if not self.schedulers:
            raise LrSchedulerError("SequentialLrSchedulerConfig: at least one scheduler is required, got none")
        if len(self.milestones) + 1 != len(self.schedulers):
            raise LrSchedulerError(
                "SequentialLrSchedulerConfig: the number of milestones must be one less than the number of "
                f"schedulers: expected {len(self.schedulers) - 1}, got {len(self.milestones)}"
            )
        for i, m in enumerate(self.milestones):
            if m <= 0 or (i > 0 and m <= self.milestones[i - 1]):
                raise LrSchedulerError(
                    f"SequentialLrSchedulerConfig: milestones must be greater than zero and strictly increasing, got {list(self.milestones)}"
                )
        return SequentialLrScheduler([as_scheduler(s) for s in self.schedulers], list(self.milestones))


class SequentialLrScheduler(LrScheduler):
    def __init__(self, schedulers: list, milestones: list):
        self.schedulers = schedulers
        self.milestones = milestones
        self.step_count = 0

    def step(self) -> float:
        index = sum(1 for m in self.milestones if self.step_count >= m)
        lr = self.schedulers[index].step()
        self.step_count += 1
        return lr

    def to_record(self) -> dict:
        record = {"step": self.step_count}
        for i, s in enumerate(self.schedulers):
            for key, value in s.to_record().items():
                record[f"{i}.{key}"] = value
        return record

    def load_record(self, record: dict) -> "SequentialLrScheduler":
        if "step" in record:
            self.step_count = int(record["step"])
        for i, s in enumerate(self.schedulers):
            prefix = f"{i}."
            s.load_record({k[len(prefix):]: v for k, v in record.items() if k.startswith(prefix)})
        return self


def linear_warmup(scheduler, warmup_iters: int, start_lr: float | None = None, peak_lr: float | None = None):
    """A linear warm-up from `start_lr` to `peak_lr` over `warmup_iters` steps, then `scheduler`.

    `peak_lr` defaults to the scheduler's `initial_lr` (or the constant's lr); `start_lr` to
    `peak_lr / warmup_iters`. Returns a `SequentialLrSchedulerConfig`.
    """
    if peak_lr is None:
        peak_lr = getattr(scheduler, "initial_lr", None) or getattr(scheduler, "lr", None)
        if peak_lr is None:
            raise LrSchedulerError("linear_warmup: give peak_lr; it cannot be read from the scheduler")
    _check_iters("linear_warmup", warmup_iters)
    if start_lr is None:
        start_lr = peak_lr / warmup_iters
    # the linear part reaches peak_lr on its last (warmup_iters-th) step; the main schedule
    # then starts from its own first step
    warm = LinearLrSchedulerConfig(start_lr, peak_lr, max(warmup_iters - 1, 1))
    return SequentialLrSchedulerConfig([warm, scheduler], [warmup_iters])


def as_scheduler(value) -> LrScheduler:
    """A scheduler from a float, a scheduler or a scheduler config."""
    if isinstance(value, LrScheduler):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return ConstantLr(float(value))
    init = getattr(value, "init", None)
    if init is None:
        raise TypeError(f"expected a learning rate: a float, a scheduler or a scheduler config, got {type(value).__name__}")
    return init()
