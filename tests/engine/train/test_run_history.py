"""RunHistory: the loop's events turned into series, progress and CSV rows; the EMA smoothing."""
import csv
import math

import numpy as np
import pytest

from engine.train import events as ev
from engine.train.events import GradNorms, Prefill
from engine.train.run_history import CSV_HEADER, EmaState, RunHistory, ema, write_csv


def naive_ema(xs, w):
    out, acc = [], 0.0
    for t, x in enumerate(xs, start=1):
        acc = w * acc + (1 - w) * x
        out.append(acc / (1 - w ** t))
    return out


@pytest.mark.parametrize("w", [0.0, 0.3, 0.9, 0.99])
def test_ema_is_the_debiased_moving_average(w):
    xs = np.random.default_rng(1).normal(size=200)
    expected = xs if w == 0 else naive_ema(xs, w)
    assert np.allclose(ema(xs, w), expected, rtol=1e-12, atol=1e-12)
    # the first point is the first value (no pull towards zero)
    assert ema(xs, w)[0] == pytest.approx(xs[0])


def test_ema_grows_incrementally_with_the_same_result():
    xs = list(np.random.default_rng(2).normal(size=100))
    state = EmaState(0.8)
    for chunk in (xs[:7], xs[7:50], xs[50:]):
        state.extend(chunk)
    assert np.allclose(state.values, naive_ema(xs, 0.8))


def test_ema_refuses_weights_outside_0_1():
    with pytest.raises(ValueError, match=r"weight must be in \[0, 1\), got 1.0"):
        ema([1.0], 1.0)


def feed(h, epochs=2, steps=4, lr=0.1):
    h.apply(ev.Started(epochs, steps, 1, 0))
    g = 0
    for e in range(1, epochs + 1):
        for s in range(1, steps + 1):
            g += 1
            h.apply(ev.StepLoss(e, s, steps, g, 1.0 / g))
            h.apply(ev.LearningRate(e, s, g, lr))
        h.apply(ev.Throughput(e, g, 640.0, 10.0))
        h.apply(ev.EpochMetrics(e, {"loss": 1.0 / e, "accuracy": 0.5 + 0.1 * e}))
        h.apply(ev.ValidationMetrics(e, {"loss": 1.5 / e, "accuracy": 0.4 + 0.1 * e}))
        h.apply(ev.CheckpointSaved(e, f"/runs/epoch-{e}"))
    return g


def test_events_become_series_and_progress():
    h = RunHistory("r")
    n = feed(h)
    assert h.status == "running" and h.global_step == n == 8
    x, y = h.step_series()
    assert list(x) == list(range(1, 9)) and y[2] == pytest.approx(1 / 3)
    assert list(h.lr_series()[1]) == [0.1] * 8
    ex, ey = h.epoch_series("valid", "accuracy")
    assert list(ex) == [4, 8] and np.allclose(ey, [0.5, 0.6])  # plotted at each epoch's last step
    assert h.metric_names() == ["loss", "accuracy"]
    assert h.fraction_done() == 1.0 and h.seconds_left() == 0.0
    assert h.checkpoints == [(1, "/runs/epoch-1"), (2, "/runs/epoch-2")]
    h.apply(ev.Finished(2, {}))
    assert h.status == "finished"


def test_progress_half_way_and_time_left():
    h = RunHistory("r")
    h.apply(ev.Started(4, 10, 1, 0))
    for g in range(1, 11):
        h.apply(ev.StepLoss(1, g, 10, g, 0.5))
    h.apply(ev.Throughput(1, 10, 100.0, 5.0))
    assert h.fraction_done() == 0.25
    assert h.seconds_left() == pytest.approx(30 / 5.0)


def test_failed_paused_stopped_and_grad_norms():
    h = RunHistory("r")
    h.apply(ev.Paused(1, 3))
    assert h.status == "paused"
    h.apply(ev.Resumed(1, 3))
    assert h.status == "running"
    h.apply(GradNorms(1, 4, {"": 2.0, "fc1": None}))
    assert h.grad_norms == {"": 2.0, "fc1": None} and h.grad_norm_step == 4
    h.apply(ev.Stopped(1, 3))
    assert h.status == "stopped" and "epoch 1, step 3" in h.message
    h.apply(ev.Failed(2, 1, "the training loss is nan at epoch 2, step 1"))
    assert h.status == "failed" and "nan" in h.message


def test_prefill_replaces_the_curve_with_the_checkpoints_progress():
    h = RunHistory("r")
    feed(h, epochs=3, steps=4)
    h.step_series(0.5)  # a smoothed series was computed already
    history = [{"epoch": 1, "train": {"loss": 1.0}, "valid": {"loss": 1.5}},
               {"epoch": 2, "train": {"loss": 0.5}, "valid": {"loss": 0.75}}]
    h.apply(Prefill((4.0, 3.0, 2.0, 1.0, 0.9, 0.8, 0.7, 0.6), tuple(history), 8))
    assert h.losses == [4.0, 3.0, 2.0, 1.0, 0.9, 0.8, 0.7, 0.6]
    assert [r["epoch"] for r in h.epochs] == [1, 2] and h.epochs[1]["global_step"] == 8
    assert h.lr_steps == list(range(1, 9))  # later learning rates are dropped
    assert [e for e, _ in h.checkpoints] == [1, 2]
    assert np.allclose(h.step_series(0.5)[1], naive_ema(h.losses, 0.5))


def test_csv_holds_every_series_of_every_run(tmp_path):
    a, b = RunHistory("a"), RunHistory("b")
    feed(a, epochs=2, steps=3)
    feed(b, epochs=1, steps=2)
    path = tmp_path / "curves.csv"
    n = write_csv(path, [a, b])
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == CSV_HEADER and len(rows) == n + 1
    loss_a = [r for r in rows[1:] if r[0] == "a" and r[1] == "step" and r[3] == "loss"]
    assert [int(r[5]) for r in loss_a] == [1, 2, 3, 4, 5, 6]
    assert [int(r[4]) for r in loss_a] == [1, 1, 1, 2, 2, 2]  # epoch of each step
    assert float(loss_a[2][6]) == 1 / 3  # full precision
    valid_b = [r for r in rows[1:] if r[0] == "b" and r[2] == "valid" and r[3] == "accuracy"]
    assert len(valid_b) == 1 and math.isclose(float(valid_b[0][6]), 0.5)


def test_the_runs_status_follows_its_events_and_its_end():
    h = RunHistory("a")
    assert h.status == "idle"
    h.begin()
    assert h.status == "running"
    h.apply(ev.Stopped(1, 3))
    assert h.status == "stopped" and h.message == "stopped at epoch 1, step 3"
    version = h.version
    h.end("finished")  # max_steps reached: the worker reports a stop it asked for as finished
    assert h.status == "finished" and h.message == "stopped at epoch 1, step 3" and h.version > version
    h.end("failed", "the data do not fit")
    assert (h.status, h.message) == ("failed", "the data do not fit")
