"""Run controls (which buttons make sense in each state, the progress line) and the gradient
norm table (frozen modules in grey, bars on a log scale)."""
import pytest
from PySide6.QtCore import Qt

from widgets.training.grad_norms import GradNormTable, bar_text, norm_text
from widgets.training.run_controls import RunControls, format_duration


@pytest.fixture
def controls(qtbot):
    c = RunControls()
    qtbot.addWidget(c)
    c.show()
    return c


def enabled(c):
    return {b.objectName() for b in (c.start_button, c.pause_button, c.resume_button, c.stop_button,
                                     c.checkpoint_button) if b.isEnabled()}


def test_buttons_follow_the_state(controls):
    assert enabled(controls) == {"start"}
    controls.set_checkpoint_available("run-1, epoch 2")
    assert enabled(controls) == {"start", "resume-checkpoint"}
    assert "epoch 2" in controls.checkpoint_button.toolTip()
    controls.set_state("running", "Training")
    assert enabled(controls) == {"pause", "stop"}
    controls.set_state("paused")
    assert enabled(controls) == {"resume", "stop"}
    controls.set_state("stopping")
    assert enabled(controls) == set()
    controls.set_state("failed", "Failed: boom")
    assert enabled(controls) == {"start", "resume-checkpoint"} and controls.status_label.text() == "Failed: boom"
    controls.set_can_start(False)
    assert enabled(controls) == set()


def test_each_button_asks_through_its_signal(controls, qtbot):
    asked = []
    for name in ("start", "pause", "resume", "stop", "resume_checkpoint"):
        getattr(controls, f"{name}_requested").connect(lambda n=name: asked.append(n))
    controls.set_checkpoint_available("x")
    qtbot.mouseClick(controls.start_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(controls.checkpoint_button, Qt.MouseButton.LeftButton)
    controls.set_state("running")
    qtbot.mouseClick(controls.pause_button, Qt.MouseButton.LeftButton)
    controls.set_state("paused")
    qtbot.mouseClick(controls.resume_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(controls.stop_button, Qt.MouseButton.LeftButton)
    assert asked == ["start", "resume_checkpoint", "pause", "resume", "stop"]


def test_progress_shows_rate_and_time_left(controls):
    controls.set_progress(0.25, 123.45, 75.0, "epoch 1/4")
    assert controls.bar.value() == 250
    assert controls.rate_label.text() == "epoch 1/4 · 123.5 steps/s · 1:15 left"
    controls.set_progress(0.5, 0.04, 300.0, "epoch 3/6")  # slow steps: seconds per step, not "0.0 steps/s"
    assert controls.rate_label.text() == "epoch 3/6 · 25 s/step · 5:00 left"
    controls.set_progress(1.5, None, None)
    assert controls.bar.value() == 1000 and controls.rate_label.text() == ""


def test_grad_norm_table_marks_frozen_modules(qtbot):
    t = GradNormTable()
    qtbot.addWidget(t)
    t.set_norms({"": 2.0, "encoder": None, "encoder.fc": None, "head": 2.0, "head.out": 2e-4})
    assert t.rowCount() == 5
    assert t.item(0, 0).text() == "(model)" and t.item(2, 0).text().strip() == "fc"
    assert t.item(2, 0).text().startswith("    ")  # indented by depth
    assert t.text_at("encoder") == "frozen" and t.text_at("encoder", 2) == ""
    assert t.item(t.row_of("encoder"), 1).font().italic()
    assert t.text_at("head") == "2.000e+00"
    assert len(t.text_at("head", 2)) > len(t.text_at("head.out", 2)) > 0
    t.set_norms({"": 1.0, "encoder": 0.5, "encoder.fc": 0.5, "head": 0.1, "head.out": 0.1})  # unfrozen
    assert t.text_at("encoder") == "5.000e-01" and not t.item(t.row_of("encoder"), 1).font().italic()


def test_norm_text_and_bars():
    assert norm_text(None) == "frozen" and norm_text(0.5) == "5.000e-01"
    assert bar_text(1.0, 1.0) == "█" * 16
    assert bar_text(1e-3, 1.0) == "█" * 8  # half of six decades
    assert bar_text(1e-9, 1.0) == "█"  # never empty while it has a gradient
    assert bar_text(None, 1.0) == "" and bar_text(0.0, 1.0) == ""


def test_durations_read_as_clock_times():
    assert format_duration(9.4) == "0:09"
    assert format_duration(247) == "4:07"
    assert format_duration(3 * 3600 + 5) == "3:00:05"
    assert format_duration(None) == "?" and format_duration(float("inf")) == "?"
