"""Issue 43, item 3: the autosave a crash left (an untitled model's, or a recent project's) is
offered on every start, the way the README starts the app (`--example burn-book`) included, and
an autosave that was not offered (another session's, crashed or still running) is never deleted
or overwritten."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication, QMessageBox

import app.settings
from app.__main__ import main
from app.core.project import write_json_atomic
from app.main_window import MainWindow
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
FROZEN = {"format": 1, "source": {"kind": "example", "name": "spirals"},
          "edits": [{"op": "freeze", "group": {"kind": "all"}}], "contracts": {}, "runs": []}

EDITOR = r"""
import sys, time
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.main_window import MainWindow
from app.settings import Settings
w = MainWindow(settings=Settings.at(sys.argv[1]))
w.show()
assert w.open_example("spirals") and w.group_op("freeze", "")
assert w.projects.autosave()
print("READY", flush=True)
while True:  # still working when the kill comes
    app.processEvents()
    time.sleep(0.05)
"""


def autosaves(folder: Path) -> list[Path]:
    return sorted(folder.glob("untitled*.ember.json.autosave"))


@pytest.fixture
def start(qtbot, settings, monkeypatch):
    """`start(*argv)`: the app's own start-up (`python -m app ...`) with the test's settings,
    up to its event loop; returns the window it showed."""
    monkeypatch.setattr(app.settings, "Settings", lambda: Settings.at(settings.q.fileName()))
    monkeypatch.setattr(QApplication, "exec", lambda *_: 0)

    def run(*argv: str) -> MainWindow:
        before = set(QApplication.topLevelWidgets())
        assert main(list(argv)) == 0
        (window,) = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w not in before]
        qtbot.addWidget(window)
        return window
    return run


def crashed_session(qtbot, settings) -> Path:
    """A window that worked on a model, autosaved and was dropped without its close path (a
    crash; one of this process's sessions counts as ended, as one whose process died)."""
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)  # closed after the test
    assert w.open_example("spirals") and w.group_op("freeze", "")
    assert w.projects.autosave()
    w.autosave_timer.stop()
    w.hide()
    (auto,) = autosaves(Path(settings.q.fileName()).parent)
    return auto


def test_a_killed_session_is_offered_at_a_start_with_an_example(start, settings, tmp_path, qtbot):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    errors = tmp_path / "stderr.txt"  # a file, not a pipe that Qt's warnings could fill
    with errors.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", EDITOR, settings.q.fileName()], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()  # READY, or the end of the output when it failed
        assert line.strip() == "READY", errors.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)  # a bound for a hang only: the kill ends it at once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        proc.stdout.close()
    (auto,) = autosaves(tmp_path)
    window = start("--example", "burn-book")  # as `make run` starts it
    assert window.document.source.to_json() == {"kind": "example", "name": "burn-book"}
    box = window.last_message
    assert box is not None and box.objectName() == "recovery", "no offer to recover the killed session's work"
    assert "an untitled model" in box.text() and "1 edit(s)" in box.text()
    box.button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=60_000)  # the edits replay on a worker
    doc = window.document
    assert doc.source.to_json() == {"kind": "example", "name": "spirals"} and doc.is_dirty()
    assert not any(p.is_active() for _, p in doc.module.named_params() if p.kind == "float")  # its freeze
    # taken over: this session's own autosave holds the work now, the killed session's copy is gone
    assert autosaves(tmp_path) == [window.projects.untitled_autosave()] and not auto.exists()


def test_a_clean_quit_keeps_an_autosave_it_was_not_offered(window, settings, tmp_path, qtbot):
    auto = crashed_session(qtbot, settings)
    saved = auto.read_bytes()
    assert window.open_example("burn-book")
    assert window.group_op("freeze", "") and window.projects.autosave()  # its own work: its own copy
    window.document.undo_stack.undo()  # nothing unsaved: the clean quit removes its own copy
    assert window.close()
    assert auto.read_bytes() == saved  # neither overwritten nor deleted
    assert autosaves(tmp_path) == [auto]


def test_an_offer_left_unanswered_keeps_the_autosave_and_discard_deletes_it(start, settings, tmp_path, qtbot):
    auto = crashed_session(qtbot, settings)
    window = start("--example", "burn-book")
    assert window.last_message.objectName() == "recovery"
    assert window.close()  # quit with the question open: not answered, so kept
    assert auto.exists()
    window = start("--example", "burn-book")  # offered again
    window.last_message.button(QMessageBox.StandardButton.Discard).click()
    assert not auto.exists()
    assert window.document.source.to_json() == {"kind": "example", "name": "burn-book"}


def test_recover_asks_about_unsaved_changes_first(start, settings, tmp_path, monkeypatch, qtbot):
    import app.prompts as prompts

    auto = crashed_session(qtbot, settings)
    window = start("--example", "burn-book")
    box = window.last_message
    assert window.group_op("freeze", "")  # unsaved changes before the answer (another recovery, say)
    asked = []
    monkeypatch.setattr(prompts, "ask_question", lambda *a, **k: asked.append(a[2]) or prompts.Button.Cancel)
    box.button(QMessageBox.StandardButton.Yes).click()
    assert len(asked) == 1 and "unsaved changes" in asked[0]
    assert window.document.source.to_json() == {"kind": "example", "name": "burn-book"}  # Cancel: kept
    assert window.document.is_dirty() and auto.exists()  # and the copy stays for the next start


def test_the_autosave_of_a_running_session_is_neither_offered_nor_touched(start, settings, tmp_path):
    running = tmp_path / f"untitled-{os.getppid()}-0123abcd.ember.json.autosave"  # a live process's
    write_json_atomic(running, FROZEN)
    legacy = tmp_path / "untitled.ember.json.autosave"  # as versions before sessions named it: offered
    write_json_atomic(legacy, FROZEN)
    odd = tmp_path / "untitled-9999999999-0123abcd.ember.json.autosave"  # no process has this id
    write_json_atomic(odd, FROZEN)
    os.utime(odd, (1, 1))  # older than the other
    window = start("--example", "burn-book")
    box = window.last_message
    assert box.objectName() == "recovery" and window.projects.crashed_autosaves() == [legacy, odd]
    box.button(QMessageBox.StandardButton.Discard).click()
    assert window.group_op("freeze", "") and window.projects.autosave()
    mine = window.projects.untitled_autosave()
    assert set(autosaves(tmp_path)) == {running, odd, mine}
    window.document.undo_stack.undo()
    assert window.close()
    assert set(autosaves(tmp_path)) == {running, odd}  # the next start offers `odd`, never `running`
    assert window.projects.crashed_autosaves() == [odd]


def crashed_project_session(qtbot, settings, tmp_path) -> tuple[Path, Path]:
    """A window that saved a project, edited it, autosaved and crashed: (project, its autosave)."""
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    assert w.open_example("spirals")
    project = tmp_path / "p.ember.json"
    assert w.projects.save_to(project)  # in the recent files now
    assert w.group_op("freeze", "") and w.projects.autosave()
    auto = project.with_name(project.name + ".autosave")
    os.utime(auto, (project.stat().st_mtime + 10,) * 2)  # written after the save
    w.autosave_timer.stop()
    w.hide()
    return project, auto


def test_a_recent_projects_autosave_is_offered_at_any_start(start, settings, tmp_path, qtbot):
    project, auto = crashed_project_session(qtbot, settings, tmp_path)
    window = start("--example", "burn-book")
    box = window.last_message
    assert box.objectName() == "recovery" and "p.ember.json" in box.text() and "1 edit(s)" in box.text()
    box.button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=60_000)
    doc = window.document
    assert doc.project_path == project and doc.is_dirty() and auto.exists()  # its autosave from now on
    assert not any(p.is_active() for _, p in doc.module.named_params() if p.kind == "float")


def test_the_untitled_and_a_projects_autosave_are_offered_one_after_the_other(start, settings, tmp_path, qtbot):
    untitled = crashed_session(qtbot, settings)
    _project, auto = crashed_project_session(qtbot, settings, tmp_path)
    window = start("--example", "burn-book")
    first = window.last_message
    assert "an untitled model" in first.text()
    first.button(QMessageBox.StandardButton.Discard).click()
    second = window.last_message
    assert second is not first and "p.ember.json" in second.text()
    second.button(QMessageBox.StandardButton.Discard).click()
    assert not untitled.exists() and not auto.exists()
    assert window.last_message is second  # nothing more to offer


def test_a_projects_autosave_that_a_running_session_writes_is_left_alone(start, settings, tmp_path, qtbot):
    project, auto = crashed_project_session(qtbot, settings, tmp_path)
    data = json.loads(auto.read_text())
    assert data["autosave"]["pid"] == os.getpid()  # the writer says who it is
    data["autosave"]["pid"] = os.getppid()  # a process that is running
    write_json_atomic(auto, data)
    os.utime(auto, (project.stat().st_mtime + 10,) * 2)
    window = start("--example", "burn-book")
    assert window.last_message is None  # nothing offered
    assert window.projects.open_project(project) and window.last_message is None  # not when it opens either
    assert window.close() and auto.exists()
