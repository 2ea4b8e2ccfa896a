"""Metrics: loss, accuracy, top-k accuracy, and a hook for the user's own.

A metric accumulates over the batches of an epoch: `reset()`, then `update(output, targets,
loss)` once per batch, then `value()`. `output` is the model's output tensor (logits
`[batch, classes]`, or `[batch, seq, classes]` with targets `[batch, seq]`), `targets` the
batch's targets, `loss` the batch's loss as a float. Averages are weighted by the number of
items (positions, for sequences), so an epoch's value does not depend on the batch size.

Causal-LM metrics (the `"causal-lm"` kind's defaults) count target tokens, the targets that
are not `IGNORE_INDEX` (-100: pads, prompt tokens): `TokenLossMetric` ("loss", the mean loss
per target token of the epoch, so the value does not depend on how tokens fall into batches),
`PerplexityMetric` ("perplexity", exp of that mean), `AccuracyMetric(pad_token=-100)`
(next-token accuracy) and `TokensPerSecondMetric` ("tokens_per_second": target tokens per
second from the metric's reset, i.e. the epoch's start, to when its value is read).

User metrics: subclass `Metric`, or wrap a function with
`CustomMetric(name, fn)` where `fn(output: np.ndarray, targets: np.ndarray) -> float` gives
the batch's mean (weighted by batch size), or `-> (total, count)`.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .losses import IGNORE_INDEX


def _host(t) -> np.ndarray:
    data = getattr(t, "_data", t)
    if isinstance(data, np.ndarray):
        return data
    return data.get() if hasattr(data, "get") else np.asarray(data)


class Metric:
    name = "metric"
    higher_is_better = True

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, output, targets, loss: float | None = None) -> None:
        raise NotImplementedError

    def value(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}={self.value():.6g})"


class LossMetric(Metric):
    name = "loss"
    higher_is_better = False

    def update(self, output, targets, loss=None) -> None:
        if loss is None:
            return
        n = int(targets.shape[0]) if targets is not None else 1
        self.total += float(loss) * n
        self.count += n


def _class_targets(output, targets, metric: str):
    logits = _host(output)
    y = _host(targets)
    if logits.ndim < 2:
        raise ValueError(f"{metric}: expected logits with a class axis ([batch, classes]), got dims {list(logits.shape)}")
    if y.shape != logits.shape[:-1]:
        raise ValueError(
            f"{metric}: expected targets of dims {list(logits.shape[:-1])} (the logits' dims without the class axis), "
            f"got {list(y.shape)}"
        )
    return logits.reshape(-1, logits.shape[-1]), y.reshape(-1)


class AccuracyMetric(Metric):
    """Fraction of items whose arg-max class is the target; `pad_token` targets are skipped."""

    name = "accuracy"

    def __init__(self, pad_token: int | None = None):
        self.pad_token = pad_token
        super().__init__()

    def update(self, output, targets, loss=None) -> None:
        logits, y = _class_targets(output, targets, self.name)
        keep = y != self.pad_token if self.pad_token is not None else slice(None)
        pred = logits.argmax(axis=1)
        hits = pred[keep] == y[keep]
        self.total += float(hits.sum())
        self.count += int(hits.size)


class TopKAccuracyMetric(Metric):
    """Fraction of items whose target is among the `k` highest-scoring classes."""

    higher_is_better = True

    def __init__(self, k: int = 5, pad_token: int | None = None):
        if k < 1:
            raise ValueError(f"TopKAccuracyMetric: k must be at least 1, got {k}")
        self.k = int(k)
        self.pad_token = pad_token
        self.name = f"top{k}_accuracy"
        super().__init__()

    def update(self, output, targets, loss=None) -> None:
        logits, y = _class_targets(output, targets, self.name)
        if self.pad_token is not None:
            keep = y != self.pad_token
            logits, y = logits[keep], y[keep]
        k = min(self.k, logits.shape[1])
        top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
        hits = (top == y[:, None]).any(axis=1)
        self.total += float(hits.sum())
        self.count += int(hits.size)


class CustomMetric(Metric):
    """A user metric from a function of (output, targets) as NumPy arrays."""

    def __init__(self, name: str, fn, higher_is_better: bool = True):
        self.name = name
        self.fn = fn
        self.higher_is_better = higher_is_better
        super().__init__()

    def update(self, output, targets, loss=None) -> None:
        out = self.fn(_host(output), _host(targets))
        if isinstance(out, tuple):
            total, count = out
            self.total += float(total)
            self.count += int(count)
        else:
            n = int(targets.shape[0])
            self.total += float(out) * n
            self.count += n


def _kept(targets) -> int:
    return int((_host(targets) != IGNORE_INDEX).sum())


class TokenLossMetric(LossMetric):
    """The mean loss per target token (targets not `IGNORE_INDEX`), weighted by tokens."""

    def update(self, output, targets, loss=None) -> None:
        if loss is None or targets is None:
            return
        n = _kept(targets)
        self.total += float(loss) * n
        self.count += n


class PerplexityMetric(TokenLossMetric):
    """exp(mean loss per target token)."""

    name = "perplexity"

    def value(self) -> float:
        if not self.count:
            return float("nan")
        mean = self.total / self.count
        return math.exp(mean) if mean < 700 else float("inf")


class TokensPerSecondMetric(Metric):
    """Target tokens per second of wall time since `reset()`."""

    name = "tokens_per_second"

    def reset(self) -> None:
        super().reset()
        self.started = time.perf_counter()

    def update(self, output, targets, loss=None) -> None:
        if targets is not None:
            self.count += _kept(targets)

    def value(self) -> float:
        return self.count / max(time.perf_counter() - self.started, 1e-9)


def default_metrics(kind: str) -> list[Metric]:
    """Loss, plus accuracy for classification; for causal-lm the token loss, perplexity,
    next-token accuracy and tokens per second."""
    if kind == "causal-lm":
        return [TokenLossMetric(), PerplexityMetric(), AccuracyMetric(IGNORE_INDEX), TokensPerSecondMetric()]
    if kind == "classification":
        return [LossMetric(), AccuracyMetric()]
    return [LossMetric()]
