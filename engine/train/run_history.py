"""What a training run produced so far, kept for plotting: per-step losses and learning rates,
per-epoch training and validation metrics, progress and status.

A `RunHistory` is fed the loop's events (`engine.train.events`) in order with `apply(event)`;
it counts its changes in `version`, so a view redraws only what changed. It is where a run's
status lives while it runs (`status`, from the events, and `end(status)` when the worker
returns). `ema()` is the smoothing the curves use; `write_csv()` writes one long table for any
number of runs.
"""
from __future__ import annotations

import math

import numpy as np

from . import events as ev
from .events import GradNorms, Prefill

CSV_HEADER = ["run", "granularity", "split", "series", "epoch", "global_step", "value"]


def ema(values, weight: float) -> np.ndarray:
    """Exponential moving average with the start-up bias removed (as TensorBoard smooths):
    `s_t = w s_{t-1} + (1 - w) x_t`, divided by `1 - w^t`. `weight` 0 returns the values."""
    out = EmaState(weight)
    out.extend(values)
    return np.asarray(out.values, dtype=np.float64)


class EmaState:
    """The smoothed series, extended as points arrive (each point is smoothed once)."""

    def __init__(self, weight: float):
        w = float(weight)
        if not 0.0 <= w < 1.0:
            raise ValueError(f"ema: weight must be in [0, 1), got {weight}")
        self.weight = w
        self.values: list[float] = []
        self._acc = 0.0
        self._wt = 1.0  # w ** t

    def extend(self, xs) -> None:
        w, acc, wt = self.weight, self._acc, self._wt
        out = self.values
        if w == 0.0:
            out.extend(float(x) for x in xs)
            return
        for x in xs:
            acc = w * acc + (1.0 - w) * float(x)
            wt *= w
            out.append(acc / (1.0 - wt))
        self._acc, self._wt = acc, wt


class RunHistory:
    """The curves and progress of one run."""

    def __init__(self, name: str, description: str = ""):
        self.name = name
        self.description = description
        self.status = "idle"  # idle | running | paused | finished | stopped | failed
        self.message = ""
        self.total_epochs = 0
        self.steps_per_epoch = 0
        self.start_epoch = 1
        self.epoch = 0
        self.global_step = 0
        self.start_step = 0  # global step the current session began at (resume)
        self.steps_per_second: float | None = None
        self.items_per_second: float | None = None
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.lr_steps: list[int] = []
        self.lrs: list[float] = []
        self.epochs: list[dict] = []  # {"epoch", "global_step", "train": {...}, "valid": {...}}
        self.checkpoints: list[tuple[int, str]] = []
        self.grad_norms: dict = {}
        self.grad_norm_step = 0
        self.version = 0  # counts every change
        self.epoch_version = 0  # counts changes of the per-epoch rows
        self._ema: EmaState | None = None

    # ---- events ------------------------------------------------------------------------------
    def apply(self, event) -> None:
        """Take one event of the loop (or a `GradNorms` / `Prefill`)."""
        self.version += 1
        if isinstance(event, ev.StepLoss):
            self.steps.append(event.global_step)
            self.losses.append(float(event.loss))
            self.epoch, self.global_step = event.epoch, event.global_step
            self.steps_per_epoch = event.steps_per_epoch
        elif isinstance(event, ev.LearningRate):
            self.lr_steps.append(event.global_step)
            self.lrs.append(float(event.lr))
        elif isinstance(event, ev.Throughput):
            self.steps_per_second = event.steps_per_second
            self.items_per_second = event.items_per_second
        elif isinstance(event, ev.EpochMetrics):
            self._epoch_row(event.epoch)["train"] = dict(event.metrics)
            self.epoch_version += 1
        elif isinstance(event, ev.ValidationMetrics):
            self._epoch_row(event.epoch)["valid"] = dict(event.metrics)
            self.epoch_version += 1
        elif isinstance(event, ev.Started):
            self.status = "running"
            self.total_epochs = event.total_epochs
            self.steps_per_epoch = event.steps_per_epoch
            self.start_epoch = event.start_epoch
            self.epoch = event.start_epoch
            self.start_step = self.global_step
        elif isinstance(event, ev.Paused):
            self.status = "paused"
        elif isinstance(event, ev.Resumed):
            self.status = "running"
        elif isinstance(event, ev.Stopped):
            self.status = "stopped"
            self.message = f"stopped at epoch {event.epoch}, step {event.step}"
        elif isinstance(event, ev.Finished):
            self.status = "finished"
            self.message = f"finished {event.epochs} epochs"
        elif isinstance(event, ev.Failed):
            self.status = "failed"
            self.message = event.message
        elif isinstance(event, ev.CheckpointSaved):
            self.checkpoints.append((event.epoch, event.path))
        elif isinstance(event, GradNorms):
            self.grad_norms = dict(event.norms)
            self.grad_norm_step = event.global_step
        elif isinstance(event, Prefill):
            self._prefill(event)
            self.epoch_version += 1

    def begin(self) -> None:
        """The run (re)starts: it is running until its events or its end say otherwise."""
        self.status = "running"

    def end(self, status: str, message: str | None = None) -> None:
        """The worker returned: the run ended `status` (finished | stopped | failed)."""
        self.version += 1
        self.status = status
        if message is not None:
            self.message = message

    def _epoch_row(self, epoch: int) -> dict:
        if self.epochs and self.epochs[-1]["epoch"] == epoch:
            return self.epochs[-1]
        row = {"epoch": epoch, "global_step": self.global_step, "train": {}, "valid": {}}
        self.epochs.append(row)
        return row

    def _prefill(self, p: Prefill) -> None:
        self._ema = None  # the series is replaced, not extended
        self.steps = list(range(1, len(p.step_losses) + 1))
        self.losses = [float(v) for v in p.step_losses]
        keep = sum(1 for s in self.lr_steps if s <= p.global_step)
        del self.lr_steps[keep:], self.lrs[keep:]
        self.checkpoints = [(e, c) for e, c in self.checkpoints if e <= len(p.history)]
        done = len(p.history)
        per_epoch = p.global_step // done if done else 0
        self.epochs = [{"epoch": int(r["epoch"]), "global_step": int(r["epoch"]) * per_epoch,
                        "train": dict(r.get("train", {})), "valid": dict(r.get("valid", {}))} for r in p.history]
        self.global_step = p.global_step
        self.epoch = done

    # ---- series ------------------------------------------------------------------------------
    def step_series(self, smoothing: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(global steps, losses); with `smoothing`, the losses' EMA (computed incrementally)."""
        x = np.asarray(self.steps, dtype=np.float64)
        if not smoothing:
            return x, np.asarray(self.losses, dtype=np.float64)
        e = self._ema
        if e is None or e.weight != smoothing or len(e.values) > len(self.losses):
            e = self._ema = EmaState(smoothing)
        if len(e.values) < len(self.losses):
            e.extend(self.losses[len(e.values):])
        return x, np.asarray(e.values, dtype=np.float64)

    def lr_series(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.lr_steps, dtype=np.float64), np.asarray(self.lrs, dtype=np.float64)

    def epoch_series(self, split: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(global step at each epoch's end, value) for one metric of one split."""
        xs, ys = [], []
        for row in self.epochs:
            v = row.get(split, {}).get(metric)
            if v is not None:
                xs.append(row["global_step"])
                ys.append(float(v))
        return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for row in self.epochs:
            for split in ("train", "valid"):
                for k in row.get(split, {}):
                    if k not in names:
                        names.append(k)
        return names

    # ---- progress ----------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.total_epochs * self.steps_per_epoch

    def fraction_done(self) -> float:
        total = self.total_steps
        return min(1.0, self.global_step / total) if total else 0.0

    def seconds_left(self) -> float | None:
        sps = self.steps_per_second
        if not sps or not self.total_steps or not math.isfinite(sps):
            return None
        return max(0.0, (self.total_steps - self.global_step) / sps)

    # ---- saved with the run ---------------------------------------------------------------------
    _SAVED = ("status", "message", "total_epochs", "steps_per_epoch", "start_epoch", "epoch", "global_step",
              "steps", "losses", "lr_steps", "lrs", "epochs")

    def to_json(self) -> dict:
        """The series and progress, as the run folder's `curves.json` keeps them."""
        return {k: getattr(self, k) for k in self._SAVED}

    def load_json(self, data: dict) -> None:
        """Take back what `to_json` saved (a reopened project's runs); a malformed entry is left out."""
        for k in self._SAVED:
            if k not in data:
                continue
            v = data[k]
            default = getattr(self, k)
            if isinstance(default, list) and isinstance(v, list):
                setattr(self, k, list(v))
            elif isinstance(default, (int, float)) and isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(self, k, type(default)(v))
            elif isinstance(default, str) and isinstance(v, str):
                setattr(self, k, v)
        n = min(len(self.steps), len(self.losses))
        self.steps, self.losses = self.steps[:n], self.losses[:n]
        n = min(len(self.lr_steps), len(self.lrs))
        self.lr_steps, self.lrs = self.lr_steps[:n], self.lrs[:n]
        self.epochs = [r for r in self.epochs if isinstance(r, dict) and "epoch" in r and "global_step" in r]
        self._ema = None
        self.version += 1
        self.epoch_version += 1

    # ---- export ------------------------------------------------------------------------------
    def csv_rows(self) -> list[list]:
        rows: list[list] = []
        for s, v in zip(self.steps, self.losses):
            rows.append([self.name, "step", "train", "loss", _epoch_of(s, self.steps_per_epoch), s, repr(v)])
        for s, v in zip(self.lr_steps, self.lrs):
            rows.append([self.name, "step", "train", "lr", _epoch_of(s, self.steps_per_epoch), s, repr(v)])
        for row in self.epochs:
            for split in ("train", "valid"):
                for k, v in row.get(split, {}).items():
                    rows.append([self.name, "epoch", split, k, row["epoch"], row["global_step"], repr(float(v))])
        return rows


def _epoch_of(step: int, per_epoch: int) -> int | str:
    return (step - 1) // per_epoch + 1 if per_epoch else ""


def write_csv(path, runs) -> int:
    """Write every run's series to one CSV file (long format, `CSV_HEADER`); returns the rows."""
    import csv  # noqa: PLC0415
    import io  # noqa: PLC0415

    from ..store.atomic import atomic_write_text  # noqa: PLC0415

    n = 0
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(CSV_HEADER)
    for run in runs:
        rows = run.csv_rows()
        w.writerows(rows)
        n += len(rows)
    atomic_write_text(path, buf.getvalue())  # an export over an existing file never leaves half of it
    return n
