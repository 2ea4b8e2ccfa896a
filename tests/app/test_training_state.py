"""Issue 18, items 6, 7, 8 and 17, driven through the Training tab's widgets: a reopened
project's training state, typed data files and their targets' kind, runs that belong to one
model, the kept checkpoints, the plots in the dark theme, and a full disk after training."""
import errno

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.core.schema import CheckpointSource, ExampleSource
from app.theme import apply_theme
from tests.widgets.qt_helpers import type_into

TIMEOUT = 60_000


@pytest.fixture
def panel(window, monkeypatch):
    monkeypatch.setattr(window, "maybe_discard", lambda *a, **k: True, raising=False)  # nothing to ask here
    assert window.open_example("spirals")
    p = window.training_panel
    window.tabs.setCurrentWidget(p)
    yield p
    p.shutdown()


def set_field(qtbot, form, name, text):
    type_into(qtbot, form.field_widget(name), str(text))
    assert form.is_valid(), form.errors()


def click(qtbot, button):
    assert button.isEnabled(), f"{button.objectName()} is disabled"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def train(qtbot, panel):
    click(qtbot, panel.controls.start_button)
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    return panel.runs[-1]


def write_script(tmp_path, d_input, d_output):
    path = tmp_path / f"lin_{d_input}_{d_output}.py"
    path.write_text(f"from engine import nn\n\n\ndef build():\n    return nn.LinearConfig(d_input={d_input}, "
                    f"d_output={d_output}).init()\n")
    return f"{path}:build"


# ---- item 6: a reopened project keeps its training state --------------------------------------
def test_a_reopened_project_shows_its_runs_settings_and_resume(window, panel, qtbot, tmp_path):
    set_field(qtbot, panel.training_form, "num_epochs", 300)
    set_field(qtbot, panel.training_form, "batch_size", 100)
    set_field(qtbot, panel.training_form, "checkpoint_every", 1)
    panel.apply_check.setChecked(False)
    click(qtbot, panel.controls.start_button)
    run = panel.runs[-1]
    qtbot.waitUntil(lambda: len(run.history.checkpoints) >= 1, timeout=TIMEOUT)
    click(qtbot, panel.controls.stop_button)
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    assert run.status == "stopped"
    steps = len(run.history.losses)
    project = tmp_path / "p.ember.json"
    assert window.projects.save_to(project)

    assert window.open_example("digits")  # another model: its own (no) runs and task
    assert panel.data_form.value().task == "digits"
    assert window.projects.open_project(str(project))
    qtbot.waitUntil(lambda: window.document.project_path is not None, timeout=TIMEOUT)

    assert [r.name for r in panel.curves.runs()] == [run.name]  # the runs list and curves come back
    panel.curves.redraw()
    assert len(panel.curves.curve_data(run.name, "raw")[0]) == steps
    assert panel.training_form.value().batch_size == 100  # the run's settings
    assert panel.data_form.value().task == "spirals"
    assert panel.controls.checkpoint_button.isEnabled()  # Resume from checkpoint
    assert [r.folder for r in window.document.runs] == [str(run.folder)]
    assert window.projects.save_to(project)  # saving again keeps the run
    assert '"runs": [' in project.read_text() and run.folder.name in project.read_text()
    click(qtbot, panel.controls.checkpoint_button)  # continues the reopened run
    resumed = panel.runs[-1]
    assert resumed.name == run.name
    qtbot.waitUntil(lambda: resumed.history.global_step > steps, timeout=TIMEOUT)
    click(qtbot, panel.controls.stop_button)
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    assert resumed.outcome.status == "stopped", panel.last_error


def test_a_checkpoint_opened_into_an_example_architecture_gets_its_task(window, panel, qtbot, tmp_path):
    assert window.open_example("digits")
    path = tmp_path / "digits.bpk"
    window.document.module.into_record().save(path)
    assert window.open_example("spirals")
    assert panel.data_form.value().task == "spirals"
    window.projects._open_checkpoint_choice({"path": str(path), "allow_partial": False,
                                             "architecture": ExampleSource("digits").to_json()})
    qtbot.waitUntil(lambda: isinstance(window.document.source, CheckpointSource), timeout=TIMEOUT)
    assert panel.data_form.value().task == "digits"


# ---- item 7: typed data files, the targets' kind, integer inputs --------------------------------
def test_a_typed_data_file_is_the_data_trained_on(window, panel, qtbot, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=y)
    assert panel.data_form.value().task == "spirals"
    type_into(qtbot, panel.data_form.field_widget("file"), str(path))  # typed, not browsed
    assert panel.data_form.value().task == "file"
    set_field(qtbot, panel.training_form, "num_epochs", 1)
    run = train(qtbot, panel)
    assert run.outcome.status == "finished", panel.last_error
    assert run.spec.data.file == str(path) and run.history.global_step == 2  # 96 items, batch 64


def test_whole_number_regression_targets_are_inferred_as_regression(window, panel, qtbot, tmp_path):
    rng = np.random.default_rng(0)
    rows = ["height,weight,age"] + [f"{rng.normal():.3f},{rng.normal():.3f},{int(a)}"
                                    for a in rng.integers(18, 81, 200)]
    csv = tmp_path / "ages.csv"
    csv.write_text("\n".join(rows) + "\n")
    assert window.open_script(write_script(tmp_path, 2, 1))
    panel.data_form.set_field("task", "file")
    type_into(qtbot, panel.data_form.field_widget("file"), str(csv))
    set_field(qtbot, panel.training_form, "num_epochs", 1)
    run = train(qtbot, panel)
    assert run.outcome.status == "finished", panel.last_error
    assert "regression" in run.data_note and "inferred" in run.data_note
    # chosen explicitly in the data settings: classification is refused with the reason
    panel.data_form.field_widget("kind").setCurrentText("classification")
    run = train(qtbot, panel)
    assert run.status == "failed" and "out of range" in panel.last_error


# ---- item 8: runs belong to their model; kept checkpoints; the dark theme ------------------------
def test_another_model_shows_only_its_own_runs_and_checkpoints(window, panel, qtbot):
    set_field(qtbot, panel.training_form, "num_epochs", 2)
    set_field(qtbot, panel.training_form, "checkpoint_every", 1)
    panel.apply_check.setChecked(False)
    run = train(qtbot, panel)
    assert run.outcome.status == "finished"
    assert panel.controls.checkpoint_button.isEnabled()
    assert window.open_example("digits")
    assert panel.curves.runs() == [] and panel.curves.run_list.count() == 0
    assert panel.resumable() is None and not panel.controls.checkpoint_button.isEnabled()
    x_range = panel.curves.plots["loss"].vb.viewRange()[0]
    assert x_range[1] < 100  # the axis starts afresh, not at the spirals run's planned steps


def test_only_the_last_checkpoints_are_kept(window, panel, qtbot):
    assert panel.training_form.value().keep_checkpoints == 3
    set_field(qtbot, panel.training_form, "num_epochs", 5)
    set_field(qtbot, panel.training_form, "checkpoint_every", 1)
    run = train(qtbot, panel)
    assert run.outcome.status == "finished"
    assert sorted(p.name for p in run.folder.iterdir() if p.name.startswith("epoch-")) == \
        ["epoch-3", "epoch-4", "epoch-5"]


def test_the_plots_follow_the_dark_theme(window, panel, qtbot):
    graphics = panel.curves.graphics
    assert graphics.backgroundBrush().color().lightness() > 200
    apply_theme(QApplication.instance(), "dark")
    QApplication.processEvents()
    assert graphics.backgroundBrush().color().lightness() < 80
    axis = panel.curves.plots["loss"].getAxis("left")
    assert axis.textPen().color().lightness() > 150
    apply_theme(QApplication.instance(), "light")
    QApplication.processEvents()
    assert graphics.backgroundBrush().color().lightness() > 200


# ---- item 17: a full disk after training -----------------------------------------------------------
def _full_disk(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_keeps_the_trained_model_and_says_so(window, panel, qtbot, monkeypatch):
    from engine.store.record import ModuleRecord

    before = window.document.module
    set_field(qtbot, panel.training_form, "num_epochs", 1)
    set_field(qtbot, panel.training_form, "checkpoint_every", 0)
    monkeypatch.setattr(ModuleRecord, "save", _full_disk)  # the disk fills up: trained.bpk cannot be written
    run = train(qtbot, panel)
    assert run.outcome.status == "finished"
    assert window.document.module is run.outcome.model and window.document.module is not before
    assert "disk is full" in panel.last_error and "kept" in panel.last_error
    assert "left as it was" not in panel.last_error
    assert not (run.folder / "trained.bpk").exists()


def test_a_full_disk_at_a_checkpoint_is_not_a_training_error(window, panel, qtbot, monkeypatch):
    import engine.train.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "save_checkpoint", _full_disk)
    set_field(qtbot, panel.training_form, "num_epochs", 2)
    set_field(qtbot, panel.training_form, "checkpoint_every", 1)
    run = train(qtbot, panel)
    assert run.status == "failed"
    assert "disk is full" in panel.last_error and "epoch-1" in panel.last_error
    assert window.document.module is run.outcome.model  # trained through epoch 1: kept
