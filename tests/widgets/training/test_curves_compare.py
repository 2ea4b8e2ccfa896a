"""Runs you can compare and take elsewhere (issue 48, item 13): a Tokens/s plot for language-model
runs beside loss and perplexity, every run's scalars exported as TensorBoard event files (read
back here record by record, checksums checked, with tensorboardX's own messages), and a run
folder of another model overlaid on the curves."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from engine.train import events as ev
from engine.train.run_history import RunHistory
from engine.train.tensorboard_export import EVENTS_PREFIX, scalars, write_tensorboard
from widgets.training.curves import LOSS, LR, METRIC, SPEED, TrainingCurves


@pytest.fixture
def curves(qtbot):
    c = TrainingCurves()
    qtbot.addWidget(c)
    c.resize(900, 900)
    c.show()
    qtbot.waitExposed(c)
    return c


def lm_run(name, epochs=3, steps=5, speed=1000.0, seed=0) -> RunHistory:
    """A causal-LM run's events: step losses, learning rates, perplexity and tokens/s per epoch."""
    h = RunHistory(name)
    rng = np.random.default_rng(seed)
    h.apply(ev.Started(epochs, steps, 1, 0))
    g = 0
    for e in range(1, epochs + 1):
        for s in range(1, steps + 1):
            g += 1
            h.apply(ev.StepLoss(e, s, steps, g, float(3.0 / g + 0.1 * rng.random())))
            h.apply(ev.LearningRate(e, s, g, 1e-3 * (1 - g / (epochs * steps + 1))))
        h.apply(ev.EpochMetrics(e, {"loss": 3.0 / g, "perplexity": float(np.exp(3.0 / g)),
                                    "tokens_per_second": speed * e}))
        h.apply(ev.ValidationMetrics(e, {"loss": 3.3 / g, "perplexity": float(np.exp(3.3 / g))}))
    h.apply(ev.Finished(epochs, {}))
    return h


def test_a_language_model_run_shows_its_tokens_per_second_beside_loss_and_perplexity(curves):
    digits = RunHistory("digits")
    curves.add_run(digits)
    digits.apply(ev.Started(1, 2, 1, 0))
    digits.apply(ev.StepLoss(1, 1, 2, 1, 1.0))
    digits.apply(ev.EpochMetrics(1, {"loss": 1.0, "accuracy": 0.5}))
    curves.redraw()
    assert SPEED not in curves.shown_plots()  # a classifier has no tokens/s: no empty plot
    assert not curves.plot_buttons[SPEED].isChecked()

    run = lm_run("lm")
    curves.add_run(run)
    curves.set_metric("perplexity")
    curves.redraw()
    assert curves.shown_plots() == [LOSS, METRIC, SPEED, LR]
    assert curves.plot_buttons[SPEED].isChecked()
    x, y = curves.curve_data("lm", "speed")
    np.testing.assert_array_equal(x, run.epoch_series("train", "tokens_per_second")[0])
    np.testing.assert_allclose(y, [1000.0, 2000.0, 3000.0])
    lo, hi = curves.plots[SPEED].vb.viewRange()[1]
    assert lo <= 1000.0 and 3000.0 <= hi  # the speed plot's axis holds the values
    # the user's untick stays through later redraws; another model's runs start without it
    curves.choose_plot(SPEED, False)
    run.apply(ev.EpochMetrics(4, {"tokens_per_second": 10.0}))
    curves.redraw()
    assert SPEED not in curves.shown_plots()
    curves.choose_plot(SPEED, True)
    curves.clear_runs()
    assert SPEED not in curves.shown_plots()


def read_events(path) -> list:
    """Every Event record of a TFRecord event file, each record's length and data checksums
    checked (TensorBoard's framing: u64 length, masked crc32c, data, masked crc32c)."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        head = data[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert head_crc == masked_crc32c(head)
        body = data[at + 12:at + 12 + n]
        (body_crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        assert len(body) == n and body_crc == masked_crc32c(body)
        out.append(Event.FromString(body))
        at += 16 + n
    return out


def scalar_table(run_folder) -> dict:
    files = [p for p in run_folder.iterdir() if p.name.startswith(EVENTS_PREFIX)]
    assert len(files) == 1, files
    table: dict = {}
    for event in read_events(files[0]):
        for value in event.summary.value:
            table.setdefault(value.tag, []).append((event.step, value.simple_value))
    return table


def test_runs_export_as_tensorboard_event_files_that_read_back(curves, tmp_path):
    one, two = lm_run("run 1: corpus.txt", seed=1), lm_run("run 2/ bigger lr", speed=1500.0, seed=2)
    curves.add_run(one)
    curves.add_run(two)
    logdir = tmp_path / "tb"
    written = curves.export_tensorboard(logdir)
    assert [p.name for p in written] == ["run 1_ corpus.txt", "run 2_ bigger lr"]
    for run, folder in zip((one, two), written):
        table = scalar_table(folder)
        assert set(table) == {"train/loss_step", "train/lr", "train/loss", "train/perplexity",
                              "train/tokens_per_second", "valid/loss", "valid/perplexity"}
        steps, losses = run.step_series()
        assert [s for s, _v in table["train/loss_step"]] == steps.astype(int).tolist()
        np.testing.assert_allclose([v for _s, v in table["train/loss_step"]], losses, rtol=1e-6)
        tps_x, tps_y = run.epoch_series("train", "tokens_per_second")
        assert [s for s, _v in table["train/tokens_per_second"]] == tps_x.astype(int).tolist()
        np.testing.assert_allclose([v for _s, v in table["train/tokens_per_second"]], tps_y, rtol=1e-6)
        assert len(table["valid/perplexity"]) == 3
        assert sum(len(v) for v in table.values()) == len(scalars(run))
    # a second export replaces each run's event file and keeps what else its folder holds
    (written[0] / "notes.txt").write_text("mine")
    one.apply(ev.StepLoss(4, 1, 5, 16, 0.5))
    again = write_tensorboard(logdir, [one])
    assert again == [written[0]] and (written[0] / "notes.txt").read_text() == "mine"
    assert scalar_table(written[0])["train/loss_step"][-1] == (16, 0.5)


def test_the_export_menu_writes_tensorboard_files_where_the_user_chose(curves, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    curves.add_run(lm_run("run 1"))
    logdir = tmp_path / "chosen"
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(logdir))
    assert curves.export_tensorboard_action in curves.export_button.menu().actions()
    curves.export_tensorboard_action.trigger()
    assert "train/tokens_per_second" in scalar_table(logdir / "run 1")
    assert "Wrote 1 run(s)" in curves.last_message.text() and str(logdir) in curves.last_message.text()
    blocked = tmp_path / "a-file"
    blocked.write_text("x")  # a log folder that is a file: the export says why, nothing raised
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(blocked))
    curves.export_tensorboard_action.trigger()
    assert curves.last_message.icon() == curves.last_message.Icon.Warning and str(blocked) in curves.last_message.text()


def test_a_run_folder_of_another_model_is_overlaid(curves, tmp_path):
    from app.run_overlay import RunOverlay

    errors = []
    overlay = RunOverlay(curves, start_folder=lambda: tmp_path, show_error=errors.append)
    mine = lm_run("run 1")
    curves.add_run(mine)
    other = tmp_path / "20260101-0000-corpus-1"
    other.mkdir()
    (other / "curves.json").write_text(json.dumps(lm_run("elsewhere", speed=400.0, seed=3).to_json()))
    shown = overlay.overlay(other)
    assert shown is not None and errors == []
    assert [r.name for r in curves.runs()] == ["run 1", "20260101-0000-corpus-1 (overlay)"]
    np.testing.assert_allclose(curves.curve_data(shown.name, "speed")[1], [400.0, 800.0, 1200.0])
    np.testing.assert_allclose(curves.curve_data(shown.name, "raw")[1], lm_run("x", seed=3).losses)
    assert curves.is_run_visible(shown.name) and curves.is_run_visible("run 1")  # both drawn
    assert overlay.overlay(other).name == "20260101-0000-corpus-1 (overlay) 2"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert overlay.overlay(empty) is None
    assert "expected a run folder with curves.json" in errors[-1] and str(empty) in errors[-1]
    assert len(curves.runs()) == 3


def test_the_metric_box_grows_to_a_longer_metric_name_set_after_it_was_shown(qtbot):
    """Seen in a real window: "perplexity" was cut in a box sized for "accuracy" when it was first shown."""
    from widgets.training.curves import TrainingCurves

    curves = TrainingCurves()
    qtbot.addWidget(curves)
    curves.show()
    combo = curves.metric_combo
    combo.clear()
    combo.addItem("accuracy")
    qtbot.wait(10)
    short = combo.sizeHint().width()
    combo.addItem("perplexity of the validation set")
    combo.setCurrentIndex(1)
    assert combo.sizeHint().width() > short
    assert combo.sizeHint().width() >= combo.fontMetrics().horizontalAdvance("perplexity of the validation set")
