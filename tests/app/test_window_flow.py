"""Issue 48, must-show 2: a user's flow in a real window, at 1024x640 and at 1600x1000.

Open the digits example, freeze conv1 by its check box and then the half-checked root by a click
(undone), train a few steps, open a Hugging Face folder (the fixture Llama), see a clean Training
tab (task causal-lm, no previous run's status), fine-tune it a few steps on a small text file,
load a PEFT adapter (File > Import > PEFT Adapter...), quit. After every step: every toolbar
action is shown (the toolbar's >> overflow button is hidden and each action's button lies inside
the toolbar) and every control of the current tab lies inside the window.

The window runs in a child process under a private Xvfb (started here, `QT_QPA_PLATFORM=xcb`);
without Xvfb the test is skipped and says why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests" / "fixtures" / "hf" / "llama-gqa"
ADAPTER = ROOT / "tests" / "fixtures" / "peft" / "llama-lora-qv"
SIZES = ((1024, 640), (1600, 1000))


# ---- the child ---------------------------------------------------------------------------------------------
def wait_for(app, predicate, timeout=60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    app.processEvents()
    return bool(predicate())


def layout_problems(window) -> list[str]:
    """Toolbar actions in the overflow or outside their toolbar; controls of the current tab
    (outside scroll areas, which scroll their contents) reaching out of the window."""
    from PySide6.QtCore import QPoint, QRect
    from PySide6.QtWidgets import QAbstractScrollArea, QToolBar

    from tests.app.test_window_geometry import ancestors, interactive_widgets

    problems = []
    for tb in window.findChildren(QToolBar):
        if not tb.isVisible() or tb.window() is not window:
            continue
        ext = tb.findChild(QWidget_(), "qt_toolbar_ext_button")
        if ext is not None and ext.isVisible():
            problems.append(f"toolbar {tb.objectName()}: the >> overflow button shows")
        for action in tb.actions():
            if action.isSeparator() or not action.isVisible():
                continue
            w = tb.widgetForAction(action)
            name = action.text() or (w.objectName() if w is not None else "?")
            if w is None or not w.isVisible():
                problems.append(f"toolbar {tb.objectName()}: {name!r} is not shown")
            elif not tb.rect().contains(w.geometry()):
                problems.append(f"toolbar {tb.objectName()}: {name!r} at {w.geometry().getRect()} is outside "
                                f"the toolbar {tb.rect().getRect()}")
    tab = window.tabs.currentWidget()
    inside = window.rect()
    for w in interactive_widgets(window):
        if w is not tab and tab not in ancestors(w, window):
            continue
        if any(isinstance(a, QAbstractScrollArea) for a in ancestors(w, tab)):
            continue
        rect = QRect(w.mapTo(window, QPoint(0, 0)), w.size())
        if not inside.contains(rect):
            problems.append(f"{type(w).__name__} {w.objectName() or getattr(w, 'text', lambda: '')()!r} at "
                            f"{rect.getRect()} is outside the window {inside.getRect()}")
    return problems


def QWidget_():
    from PySide6.QtWidgets import QWidget

    return QWidget


class Discarder:
    """Answers the window's modal "save or discard" questions with a click on Discard, as a user
    who means to move on does; keeps the questions' texts."""

    def __init__(self, app):
        from PySide6.QtCore import QTimer

        self.app, self.asked = app, []
        self.timer = QTimer()
        self.timer.setInterval(50)
        self.timer.timeout.connect(self._answer)
        self.timer.start()

    def _answer(self):
        from PySide6.QtWidgets import QMessageBox

        box = self.app.activeModalWidget()
        if isinstance(box, QMessageBox) and box.button(QMessageBox.StandardButton.Discard) is not None:
            self.asked.append(box.text())
            box.button(QMessageBox.StandardButton.Discard).click()


def click_checkbox(window, path):
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest

    from widgets.module_tree import TRAINABLE

    tree = window.tree
    assert tree.select_path(path), path
    index = tree.model.index_of(path).siblingAtColumn(TRAINABLE)
    tree.view.scrollTo(index)
    rect = tree.view.visualRect(index)
    QTest.mouseClick(tree.view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(rect.left() + 10, rect.center().y()))


def check_state(window, path):
    from PySide6.QtCore import Qt

    from widgets.module_tree import TRAINABLE

    return window.tree.model.index_of(path).siblingAtColumn(TRAINABLE).data(Qt.ItemDataRole.CheckStateRole)


def flow(app, window, size, corpus) -> dict:
    """The flow at one window size; {step: problems}."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QFileDialog

    out = {}
    window.resize(*size)

    def step(name, ok, why=""):
        wait_for(app, lambda: not window.running_tasks)
        found = [] if ok else [f"the step failed: {why}"]
        out[f"{size[0]}x{size[1]} {name}"] = found + layout_problems(window)

    window.tabs.setCurrentWidget(window.display)
    step("open digits", window.open_example("digits"), "digits did not open")
    click_checkbox(window, "conv1")
    frozen = check_state(window, "conv1") == Qt.CheckState.Unchecked
    half = check_state(window, "") == Qt.CheckState.PartiallyChecked
    click_checkbox(window, "")  # the half-checked root: a click freezes all
    all_frozen = not any(v.kind == "float" and v.is_active() for _, v in window.document.module.named_params())
    window.document.undo_stack.undo()
    step("freeze by clicks", frozen and half and all_frozen and window.document.undo_stack.undoText() == "Freeze conv1",
         f"conv1 frozen {frozen}, root half-checked {half}, all frozen by a click on the root {all_frozen}")

    panel = window.training_panel
    window.tabs.setCurrentWidget(panel)
    panel.training_form.set_field("num_epochs", 1)
    run = panel.start(max_steps=3)
    done = run is not None and wait_for(app, lambda: panel.active is None, 120)
    step("train digits", done and run.status in ("finished", "stopped"), panel.last_error or "the run did not end")

    step("open a Hugging Face folder", window.open_path(str(LLAMA)), "the folder did not open")
    window.tabs.setCurrentWidget(panel)
    task = panel.data_form.field_widget("task").currentText()
    status = panel.controls.status_label.text()
    step("a clean Training tab", task == "causal-lm" and status == "Ready." and not panel.runs,
         f"task {task!r}, status {status!r}, runs {len(panel.runs)}")

    panel.run_settings.choose_data_file(str(corpus))
    panel.data_form.set_field("block_size", 16)
    panel.training_form.set_field("batch_size", 4)
    panel.training_form.set_field("num_epochs", 1)
    run = panel.start(max_steps=2) if panel.settings_valid() else None
    done = run is not None and wait_for(app, lambda: panel.active is None, 120)
    step("fine-tune", done and run.status in ("finished", "stopped"),
         panel.last_error or str(panel.data_form.errors()))

    original = QFileDialog.getExistingDirectory
    QFileDialog.getExistingDirectory = staticmethod(lambda *a, **k: str(ADAPTER))
    try:
        before = window.document.module
        window.actions.import_peft.trigger()
        wait_for(app, lambda: not window.running_tasks)
    finally:
        QFileDialog.getExistingDirectory = original
    from engine.module.tree import params

    adapted = [p for p, v in params(window.document.module) if v.reparameterization is not None]
    window.tabs.setCurrentWidget(window.display)
    step("load a PEFT adapter", window.document.module is not before and len(adapted) == 4,
         f"{len(adapted)} adapted parameters; last edit {window.document.undo_stack.undoText()!r}")
    return out


def child_main(report_path: str) -> int:
    os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
    import engine  # noqa: F401
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings

    app = QApplication.instance() or QApplication(["ember-flow"])
    app.setStyle("Fusion")
    folder = Path(tempfile.mkdtemp(prefix="ember-flow-"))
    corpus = folder / "corpus.txt"
    words = ["the cat sat on the mat.", "a dog ran to the log.", "the bird looked at a box."]
    corpus.write_text("\n".join(words[i % 3] for i in range(60)) + "\n", encoding="utf-8")
    report = {"platform": app.platformName(), "steps": {}}
    discard = Discarder(app)
    for size in SIZES:
        window = MainWindow(settings=Settings.at(folder / f"settings-{size[0]}.ini"), confirm_close=True)
        window.show()
        report["steps"].update(flow(app, window, size, corpus))
        asked = len(discard.asked)
        window.actions.quit.trigger()  # File > Quit
        wait_for(app, lambda: not window.isVisible(), 10)  # noqa: B023
        questions = discard.asked[asked:]
        report["steps"][f"{size[0]}x{size[1]} quit"] = (["the window stayed open"] if window.isVisible() else []) + (
            [f"quit asked {len(questions)} times: {questions}"] if len(questions) > 1 else [])
        window.deleteLater()
        app.processEvents()
    Path(report_path).write_text(json.dumps(report))
    return 0


# ---- the test ----------------------------------------------------------------------------------------------
def test_a_users_flow_in_a_real_window_keeps_the_toolbar_and_controls_in_view(tmp_path):
    from tests.app.window_helpers import display_env, xvfb_display

    with xvfb_display() as display:
        if display is None:
            pytest.skip("Xvfb is not installed (or did not start): the real-window flow needs an X server")
        out = tmp_path / "report.json"
        run = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(out)], cwd=ROOT,
                             env=display_env(display), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and out.exists(), f"the window's child process failed:\n{run.stdout}\n{run.stderr}"
    report = json.loads(out.read_text())
    assert report["platform"] == "xcb"
    assert len(report["steps"]) == 8 * len(SIZES), sorted(report["steps"])
    failures = {k: v for k, v in report["steps"].items() if v}
    assert not failures, "\n".join(f"{k}:\n  " + "\n  ".join(v) for k, v in failures.items())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(child_main(sys.argv[1]))
