"""The Training tab driven through its widgets: a built-in example trains to the end, pause /
resume / stop, resume from a checkpoint (in the session and after a crash), and the failures
that must leave the app up and the model as it was."""
import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.__main__ import train_steps
from app.core.schema import ExampleSource, ScriptSource
from engine.train.run_folder import latest_checkpoint, read_run
from tests.widgets.qt_helpers import click_box, type_into

TIMEOUT = 60_000


@pytest.fixture
def panel(window, tmp_path):
    assert window.open_example("spirals")
    p = window.training_panel  # its runs go to tmp_path / "runs" (the settings folder's)
    window.tabs.setCurrentWidget(p)
    yield p
    p.shutdown()


def field(form, name):
    return form.field_widget(name)


def set_field(qtbot, form, name, text):
    type_into(qtbot, field(form, name), str(text))
    assert form.is_valid(), form.errors()


def click(qtbot, button):
    assert button.isEnabled(), f"{button.objectName()} is disabled"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def click_group_box(qtbot, group):
    """Click the check box in a checkable group box's title."""
    from PySide6.QtWidgets import QStyle, QStyleOptionGroupBox

    opt = QStyleOptionGroupBox()
    group.initStyleOption(opt)
    rect = group.style().subControlRect(QStyle.ComplexControl.CC_GroupBox, opt,
                                        QStyle.SubControl.SC_GroupBoxCheckBox, group)
    qtbot.mouseClick(group, Qt.MouseButton.LeftButton, pos=rect.center())


def wait_ended(qtbot, panel):
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)


def param_arrays(module):
    return {path: np.array(p.val().numpy(), copy=True) for path, p in module.named_params()}


def test_a_built_in_example_trains_to_the_end_through_the_widgets(window, panel, qtbot):
    before = window.document.module
    start_params = param_arrays(before)
    norms = []
    panel.grad_norms_changed.connect(norms.append)
    assert window.tabs.tabText(window.tabs.indexOf(panel)) == "Training"
    assert panel.data_form.value().task == "spirals"  # the example's own task
    set_field(qtbot, panel.training_form, "num_epochs", 3)
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)

    run = panel.runs[-1]
    assert run.outcome.status == "finished", panel.last_error
    steps = 3 * 32  # 2000 spirals, batch 64
    panel.curves.redraw()
    x, y = panel.curves.curve_data(run.name, "raw")
    assert len(x) == steps and list(x[:3]) == [1, 2, 3]
    assert np.mean(y[-10:]) < 0.6 * np.mean(y[:10])  # the loss fell
    assert len(panel.curves.curve_data(run.name, "smooth")[1]) == steps
    assert len(panel.curves.curve_data(run.name, "epoch_valid")[1]) == 3
    assert len(panel.curves.curve_data(run.name, "lr")[1]) == steps
    accuracy = panel.curves.curve_data(run.name, "metric_valid")[1]
    assert accuracy[-1] > 0.8
    assert panel.controls.bar.value() == 1000
    assert "steps/s" in panel.controls.rate_label.text()
    # the model in the tree is the trained one, as one undoable step
    trained = window.document.module
    assert trained is run.outcome.model and trained is not before
    assert window.tree.model.module is trained
    after_params = param_arrays(trained)
    assert all(not np.array_equal(start_params[k], after_params[k]) for k in start_params)
    assert window.document.undo_stack.undoText().startswith("Train ")
    # the project records the training as loading the run's trained weights: replaying it gives them back
    from app.core import edits
    from resources.examples import build_example

    edit = window.document.edits[-1]
    assert edit.to_json() == {"op": "load", "path": str(run.folder / "trained.bpk"), "allow_partial": False}
    replayed = param_arrays(edits.replay(build_example("spirals"), window.document.edits))
    assert all(np.array_equal(replayed[k], v) for k, v in after_params.items())
    window.document.undo_stack.undo()
    assert window.document.module is before
    assert all(np.array_equal(start_params[k], v) for k, v in param_arrays(before).items())
    # gradient norms reached the window, per module
    assert norms and set(norms[-1]) == {"", "fc1", "fc2", "fc3"}
    assert all(v is not None and v > 0 for v in norms[-1].values())
    # the run is recorded in the document and its folder
    assert window.document.runs[-1].status == "finished"
    assert read_run(run.folder)["status"] == "finished"


def test_pause_resume_and_stop_by_clicking(window, panel, qtbot):
    before = window.document.module
    set_field(qtbot, panel.training_form, "num_epochs", 300)
    controls = panel.controls
    click(qtbot, controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(lambda: run.history.global_step > 5, timeout=TIMEOUT)
    click(qtbot, controls.pause_button)
    qtbot.waitUntil(lambda: run.history.status == "paused", timeout=TIMEOUT)
    assert controls.resume_button.isEnabled() and not controls.pause_button.isEnabled()
    paused_at = run.history.global_step
    qtbot.wait(300)
    assert run.history.global_step == paused_at  # no step while paused
    click(qtbot, controls.resume_button)
    qtbot.waitUntil(lambda: run.history.global_step > paused_at + 5, timeout=TIMEOUT)
    assert run.history.status == "running"
    click(qtbot, controls.stop_button)
    wait_ended(qtbot, panel)
    assert run.outcome.status == "stopped"
    assert 0 < run.outcome.steps < 300 * 32
    assert controls.start_button.isEnabled() and not controls.stop_button.isEnabled()
    assert window.document.module is run.outcome.model is not before  # a stopped run keeps what it learned


def test_stop_during_a_pause_and_the_windows_cancel(window, panel, qtbot):
    set_field(qtbot, panel.training_form, "num_epochs", 300)
    click(qtbot, panel.controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(lambda: run.history.global_step > 2, timeout=TIMEOUT)
    click(qtbot, panel.controls.pause_button)
    qtbot.waitUntil(lambda: run.history.status == "paused", timeout=TIMEOUT)
    assert window.task_progress.isVisible()  # the run shows in the status bar
    window.task_progress.cancel_button.click()  # the window's Cancel ends a paused run
    wait_ended(qtbot, panel)
    assert run.outcome.status == "stopped"


def test_resume_from_checkpoint_continues_the_same_run(window, panel, qtbot, tmp_path, monkeypatch):
    # the uninterrupted run, for reference
    set_field(qtbot, panel.training_form, "num_epochs", 4)
    set_field(qtbot, panel.training_form, "checkpoint_every", 1)
    click_box(qtbot, panel.apply_check)  # keep training from the same model
    assert not panel.apply_check.isChecked()
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    reference = list(panel.runs[-1].history.losses)
    assert len(reference) == 4 * 32

    # a run stopped after its second checkpoint: the worker waits right after writing it until
    # Stop is clicked, so a busy machine cannot finish the run before the click lands
    import threading

    import engine.train.checkpoint as checkpoints

    written, clicked = threading.Event(), threading.Event()
    save = checkpoints.save_checkpoint

    def save_then_wait(path, *args, **kwargs):
        out = save(path, *args, **kwargs)
        if Path(path).name == "epoch-2":
            written.set()
            clicked.wait(TIMEOUT / 1000)
        return out
    monkeypatch.setattr(checkpoints, "save_checkpoint", save_then_wait)
    click(qtbot, panel.controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(written.is_set, timeout=TIMEOUT)
    click(qtbot, panel.controls.stop_button)
    clicked.set()
    wait_ended(qtbot, panel)
    monkeypatch.setattr(checkpoints, "save_checkpoint", save)
    assert run.outcome.status == "stopped"
    epoch, _ = latest_checkpoint(run.folder)
    assert epoch == 2
    assert panel.controls.checkpoint_button.isEnabled()
    assert f"epoch {epoch}" in panel.controls.checkpoint_button.toolTip()

    click(qtbot, panel.controls.checkpoint_button)
    wait_ended(qtbot, panel)
    resumed = panel.runs[-1]
    assert resumed.outcome.status == "finished", panel.last_error
    assert resumed.history is run.history  # the same curves continue
    assert resumed.outcome.steps == (4 - epoch) * 32
    assert [r["epoch"] for r in run.history.epochs] == [1, 2, 3, 4]
    # the resumed run computes the very losses of the uninterrupted one
    assert run.history.losses == reference
    assert latest_checkpoint(run.folder)[0] == 4


def test_a_crashed_run_resumes_in_a_new_window(window, panel, qtbot, settings, tmp_path):
    import shutil

    from app.main_window import MainWindow

    set_field(qtbot, panel.training_form, "num_epochs", 3)
    set_field(qtbot, panel.training_form, "checkpoint_every", 1)
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    run = panel.runs[-1]
    full = list(run.history.losses)
    # as if the app had died during epoch 3: run.json still says running, no epoch-3 checkpoint
    info = read_run(run.folder)
    info["status"] = "running"
    (run.folder / "run.json").write_text(json.dumps(info))
    shutil.rmtree(run.folder / "epoch-3")
    assert latest_checkpoint(run.folder)[0] == 2

    other = MainWindow(settings=settings)
    qtbot.addWidget(other)
    other.show()
    assert other.open_example("spirals")
    other.document.set_model(window.document.undo_stack.command(0).before, ExampleSource("spirals"))
    second = other.training_panel
    assert second.resumable()[0] == run.folder
    assert second.controls.checkpoint_button.isEnabled()
    click(qtbot, second.controls.checkpoint_button)
    wait_ended(qtbot, second)
    resumed = second.runs[-1]
    assert resumed.outcome.status == "finished", second.last_error
    assert resumed.outcome.steps == 32  # epoch 3 again, from the epoch-2 checkpoint
    assert [r["epoch"] for r in resumed.history.epochs] == [1, 2, 3]
    assert resumed.history.losses == full  # the earlier curve came from the checkpoint; the rest is the same
    assert read_run(run.folder)["status"] == "finished"
    other.close()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_a_nan_loss_stops_the_run_with_its_place_and_keeps_the_model(window, panel, qtbot, tmp_path):
    x = np.random.default_rng(0).normal(size=(200, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    x[130] = 3e38  # finite (the loader refuses NaN) but it overflows in the first layer
    path = tmp_path / "bad.npz"
    np.savez(path, x=x, y=y)
    before = window.document.module
    form = panel.data_form
    form.set_field("task", "file")
    type_into(qtbot, field(form, "file"), str(path))
    assert form.is_valid(), form.errors()
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    run = panel.runs[-1]
    assert run.outcome is not None and run.outcome.status == "failed", panel.last_error
    assert "nan" in panel.last_error and "epoch 1, step" in panel.last_error
    assert panel.error_label.isVisible()
    assert window.document.module is before
    assert panel.controls.start_button.isEnabled()
    assert read_run(run.folder)["status"] == "failed"


def test_an_exception_in_the_worker_is_reported_and_the_model_kept(window, panel, qtbot):
    from engine import nn
    from engine.module import Module

    class Flaky(Module):
        calls = 0

        def __init__(self):
            self.fc = nn.LinearConfig(2, 2).init()

        def forward(self, x):
            type(self).calls += 1
            if type(self).calls > 5:
                raise RuntimeError("the flaky layer broke")
            return self.fc.forward(x)

    model = Flaky()
    window.document.set_model(model, ScriptSource("flaky.py"))
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    assert panel.runs[-1].outcome.status == "failed"
    assert "RuntimeError: the flaky layer broke" in panel.last_error
    assert "epoch 1, step" in panel.last_error
    assert window.document.module is model
    assert panel.controls.start_button.isEnabled()


def test_data_that_does_not_fit_the_model_names_the_module(window, panel, qtbot):
    before = window.document.module
    panel.data_form.set_field("task", "noisy-sine")  # inputs [1]; the model wants [2]
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    assert "does not fit the model" in panel.last_error and "at fc1" in panel.last_error
    assert "inputs [1]" in panel.last_error
    assert window.document.module is before
    assert panel.runs[-1].history.status == "failed"

    panel.data_form.set_field("task", "spirals")
    panel.data_form.set_field("loss", "mse")  # class targets [n] against outputs [n, 2]
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    assert "does not fit the mse loss" in panel.last_error
    assert window.document.module is before


def test_frozen_modules_get_no_gradient_and_stay_still(window, panel, qtbot):
    assert window.group_op("freeze", "fc1")
    frozen = param_arrays(window.document.module)
    set_field(qtbot, panel.training_form, "num_epochs", 2)
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    assert panel.runs[-1].outcome.status == "finished", panel.last_error
    norms = panel.grad_table.norms
    assert norms["fc1"] is None and norms["fc2"] > 0 and norms["fc3"] > 0
    assert panel.grad_table.text_at("fc1") == "frozen"
    assert panel.grad_table.text_at("fc1", 2) == ""  # no bar
    trained = param_arrays(window.document.module)
    for path in ("fc1.weight", "fc1.bias"):
        assert np.array_equal(trained[path], frozen[path])
    assert not np.array_equal(trained["fc2.weight"], frozen["fc2.weight"])


def test_invalid_settings_are_shown_as_typed_and_block_start(panel, qtbot):
    batch = field(panel.training_form, "batch_size")
    type_into(qtbot, batch, "6x")
    assert not panel.controls.start_button.isEnabled()
    assert "whole number" in panel.training_form.error_labels["batch_size"].text()
    type_into(qtbot, batch, "0")
    assert "batch_size must be at least 1" in panel.training_form.error_labels["batch_size"].text()
    type_into(qtbot, batch, "32")
    assert panel.controls.start_button.isEnabled()
    panel.schedule_combo.setCurrentText("linear")
    type_into(qtbot, panel.schedule_forms["linear"].field_widget("initial_lr"), "3")
    assert "initial_lr" in panel.schedule_forms["linear"].error_labels["initial_lr"].text()
    assert not panel.controls.start_button.isEnabled()
    panel.schedule_combo.setCurrentText("constant")
    assert panel.controls.start_button.isEnabled()


def test_several_runs_overlay_with_other_settings(window, panel, qtbot):
    set_field(qtbot, panel.training_form, "num_epochs", 1)
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    panel.optimizer_combo.setCurrentText("SGD")
    click_group_box(qtbot, panel.optimizer_forms["SGD"].field_widget("momentum"))
    assert panel.optimizer_forms["SGD"].value().momentum is not None
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    names = [r.name for r in panel.curves.runs()]
    assert len(names) == 2 and "SGD" in names[1]
    panel.curves.redraw()
    assert all(len(panel.curves.curve_data(n, "raw")[0]) == 32 for n in names)
    assert panel.runs[-1].spec.optimizer_config.momentum.momentum == 0.9


def test_a_run_is_applied_on_request_when_the_model_changed_meanwhile(window, panel, qtbot):
    set_field(qtbot, panel.training_form, "num_epochs", 300)
    click(qtbot, panel.controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(lambda: run.history.global_step > 5, timeout=TIMEOUT)
    assert window.group_op("freeze", "fc2")  # the user edits the model while it trains
    edited = window.document.module
    click(qtbot, panel.controls.stop_button)
    wait_ended(qtbot, panel)
    assert window.document.module is edited  # not replaced behind the user's back
    assert panel.apply_button.isEnabled() and "Apply trained model" in panel.controls.status_label.text()
    click(qtbot, panel.apply_button)
    assert window.document.module is run.outcome.model
    window.document.undo_stack.undo()
    assert window.document.module is edited

    # a run of another model is never applied to a different one
    click(qtbot, panel.controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(lambda: run.history.global_step > 2, timeout=TIMEOUT)
    panel.apply_check.setChecked(False)
    click(qtbot, panel.controls.stop_button)
    wait_ended(qtbot, panel)
    assert panel.apply_button.isEnabled()
    assert window.open_example("digits")  # the run's offer went with its model (issue 48)
    digits = window.document.module
    assert not panel.apply_button.isEnabled()
    assert not panel.apply_pending() and window.document.module is digits
    assert panel.data_form.value().task == "digits"  # the newly opened example's own task


def test_the_windows_status_bar_follows_the_run(window, panel, qtbot):
    set_field(qtbot, panel.training_form, "num_epochs", 300)
    click(qtbot, panel.controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(lambda: window.task_progress.bar.value() > 0, timeout=TIMEOUT)
    assert window.task_progress.isVisible() and run.name in window.task_progress.label.text()
    click(qtbot, panel.controls.stop_button)
    wait_ended(qtbot, panel)
    qtbot.waitUntil(lambda: not window.task_progress.isVisible(), timeout=TIMEOUT)


def test_train_steps_trains_exactly_that_many_steps(window, qtbot, tmp_path):
    assert window.open_example("spirals")
    p = window.training_panel  # its runs go to tmp_path / "runs" (the settings folder's)
    assert train_steps(window, 50)
    run = p.runs[-1]
    assert run.outcome.status == "finished" and run.outcome.steps == 50
    assert window.tabs.currentWidget() is p
    assert window.document.module is run.outcome.model


def test_the_window_tree_shows_live_gradient_norms_per_module(window, qtbot):
    from widgets.module_tree import GRAD, PATH_ROLE

    assert window.open_example("spirals")
    panel = window.training_panel  # the one the window installed and wired to its tree
    window.tabs.setCurrentWidget(panel)
    set_field(qtbot, panel.training_form, "num_epochs", 2)
    click(qtbot, panel.controls.start_button)
    wait_ended(qtbot, panel)
    assert panel.runs[-1].outcome.status == "finished", panel.last_error
    model = window.tree.model
    assert model.headerData(GRAD, Qt.Orientation.Horizontal) == "Grad norm"
    root = model.index(0, 0)
    shown = {}
    for row in range(model.rowCount(root)):
        path = model.index(row, 0, root).data(PATH_ROLE)
        shown[path] = model.index(row, GRAD, root).data()
    assert set(shown) >= {"fc1", "fc2", "fc3"}
    assert all(float(shown[p]) > 0 for p in ("fc1", "fc2", "fc3")), shown
    panel.shutdown()
