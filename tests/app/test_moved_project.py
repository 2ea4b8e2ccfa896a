"""A moved project folder opens whole (issue 18, item 11 / must-show 5): a project of a trainable
example, trained in the window, saved, copied elsewhere with its runs and the original deleted,
reopens in a fresh window with the trained weights, the runs list and curves, and Resume."""
import shutil

from PySide6.QtCore import Qt

from app.main_window import MainWindow
from app.settings import Settings
from tests.widgets.qt_helpers import type_into

TIMEOUT = 60_000


def _train(qtbot, window, epochs: int):
    panel = window.training_panel
    window.tabs.setCurrentWidget(panel)
    for name, value in (("num_epochs", epochs), ("batch_size", 64), ("checkpoint_every", 1)):
        type_into(qtbot, panel.training_form.field_widget(name), str(value))
        assert panel.training_form.is_valid(), panel.training_form.errors()
    assert panel.controls.start_button.isEnabled()
    qtbot.mouseClick(panel.controls.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    run = panel.runs[-1]
    assert run.outcome.status == "finished", panel.last_error
    return run


def test_a_copied_project_folder_reopens_with_its_weights_runs_and_curves(window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(window, "maybe_discard", lambda *a, **k: True, raising=False)
    original = tmp_path / "A"
    original.mkdir()
    project = original / "p.ember.json"
    assert window.open_example("spirals")
    assert window.projects.save_to(project)  # saved first: its runs go beside it (p.runs/)
    run = _train(qtbot, window, epochs=2)
    assert original in run.folder.parents, run.folder
    assert window.projects.save_to(project)
    trained = window.document.module.into_record().to_bytes()
    panel = window.training_panel
    panel.curves.redraw()
    points = len(panel.curves.curve_data(run.name, "raw")[0])
    assert points == run.history.global_step > 0
    window.close()

    moved = tmp_path / "elsewhere" / "B"
    shutil.copytree(original, moved)
    shutil.rmtree(original)
    assert not original.exists()

    fresh = MainWindow(settings=Settings.at(tmp_path / "fresh.ini"))
    qtbot.addWidget(fresh)
    fresh.show()
    try:
        assert fresh.open_project(str(moved / "p.ember.json")), fresh.last_message and fresh.last_message.text()
        qtbot.waitUntil(lambda: not fresh.running_tasks and fresh.document.project_path is not None, timeout=TIMEOUT)
        doc = fresh.document
        assert doc.project_path == moved / "p.ember.json"
        assert doc.module.into_record().to_bytes() == trained  # the trained weights, read from the copy
        p = fresh.training_panel
        assert [r.name for r in p.curves.runs()] == [run.name]  # the runs list and the curves
        assert [r.folder for r in doc.runs] == [str(moved / run.folder.relative_to(original))]
        p.curves.redraw()
        assert len(p.curves.curve_data(run.name, "raw")[0]) == points
        assert p.controls.checkpoint_button.isEnabled()  # Resume from checkpoint, from the copied folder
        assert str(moved) in str(p.resumable())
        assert str(original) not in (moved / "p.ember.json").read_text()  # every path in it is relative
    finally:
        fresh.training_panel.shutdown()
        for task in list(fresh.running_tasks):
            task.cancel()
            task.wait_thread(5)
