"""Issue 18, items 2 and 3: the Designer toolbar's Build works, and unsaved work (the document or
the design) is asked about (Save / Discard / Cancel) wherever it would be replaced."""
import pytest
from PySide6.QtWidgets import QMessageBox, QToolButton

import app.prompts as prompts

Button = QMessageBox.StandardButton


@pytest.fixture
def answers(monkeypatch):
    """Answer the unsaved-work question with `answers.reply`; `answers.asked` lists the texts."""
    class Answers:
        reply = Button.Cancel
        asked: list = []

    a = Answers()
    a.asked = []

    def question(parent, title, text, buttons, default):
        a.asked.append(text)
        return a.reply

    monkeypatch.setattr(prompts, "ask_question", question)
    return a


def dirty_example(window, name="spirals"):
    assert window.open_example(name)
    assert window.group_op("freeze", "")
    assert window.document.is_dirty()
    return window.document.module


def test_the_toolbar_build_builds_a_design_with_layers(window):
    window.designer.load_sample("mnist")
    window.designer.action_build.trigger()
    assert "cannot build" not in window.designer.status.text(), window.designer.status.text()
    assert window.document.module is not None
    assert window.designer.last_model is window.document.module


@pytest.mark.parametrize("reply", [Button.Cancel, Button.Discard])
def test_open_example_asks_before_replacing_a_dirty_document(window, answers, reply):
    before = dirty_example(window)
    answers.reply = reply
    window.projects.fill_examples_menu()
    act = next(a for a in window.examples_menu.actions() if a.objectName() == "example:digits")
    act.trigger()
    assert len(answers.asked) == 1
    if reply == Button.Cancel:
        assert window.document.module is before and window.document.is_dirty()
        assert window.document.undo_stack.count() == 1
    else:
        assert window.document.module is not before and not window.document.is_dirty()


def test_no_question_when_nothing_would_be_lost(window, answers, tmp_path):
    assert window.open_example("spirals")
    assert window.open_example("digits")
    window.designer.load_sample("mnist")  # the empty design has nothing to lose
    window.designer.save(tmp_path / "d.ember.json")
    window.designer.load_sample("residual")  # saved: nothing lost
    assert answers.asked == []


@pytest.mark.parametrize("reply", [Button.Cancel, Button.Discard])
def test_designer_build_asks_before_replacing_a_dirty_document(window, answers, reply):
    before = dirty_example(window)
    window.designer.load_sample("mnist")
    answers.reply = reply
    window.designer.action_build.trigger()
    assert len(answers.asked) == 1
    if reply == Button.Cancel:
        assert window.document.module is before and window.document.undo_stack.count() == 1
    else:
        assert window.document.module is window.designer.last_model


@pytest.mark.parametrize("reply", [Button.Cancel, Button.Discard])
def test_samples_and_new_ask_before_replacing_an_unsaved_design(window, answers, reply):
    panel = window.designer
    panel.load_sample("mnist")
    panel.add_node("Relu")
    before = panel.design.to_dict()
    answers.reply = reply
    samples = next(b for b in panel.findChildren(QToolButton) if b.text() == "Samples")
    next(a for a in samples.menu().actions() if a.text() == "residual").trigger()
    assert len(answers.asked) == 1
    if reply == Button.Cancel:
        assert panel.design.to_dict() == before and panel.undo_stack.count() > 0
        panel.action_new.trigger()
        assert panel.design.to_dict() == before and len(answers.asked) == 2
    else:
        assert panel.design.to_dict() != before and panel.undo_stack.count() == 0


@pytest.mark.parametrize("reply", [Button.Cancel, Button.Discard])
def test_open_project_asks_before_replacing_a_dirty_document(window, answers, reply, tmp_path, monkeypatch):
    assert window.open_example("digits")
    assert window.projects.save_to(tmp_path / "p.ember.json")
    before = dirty_example(window)
    answers.reply = reply
    monkeypatch.setattr("app.project_io.QFileDialog.getOpenFileName",
                        lambda *a, **k: (str(tmp_path / "p.ember.json"), ""))
    window.actions.open_project.trigger()
    assert len(answers.asked) == 1
    if reply == Button.Cancel:
        assert window.document.module is before and window.document.undo_stack.count() == 1
    else:
        assert window.document.module is not before
        assert window.document.project_path == tmp_path / "p.ember.json"


def test_open_checkpoint_cancel_keeps_the_dirty_document(window, answers, tmp_path):
    before = dirty_example(window)
    answers.reply = Button.Cancel
    window.projects._open_checkpoint_choice(
        {"path": str(tmp_path / "w.bpk"), "architecture": {"kind": "example", "name": "spirals"},
         "allow_partial": False})
    assert len(answers.asked) == 1
    assert window.running_tasks == []
    assert window.document.module is before and window.document.undo_stack.count() == 1


def test_quit_discard_leaves_no_design_to_recover(qtbot, settings, answers):
    from app.main_window import MainWindow

    w = MainWindow(settings=settings, confirm_close=True)
    qtbot.addWidget(w)
    w.designer.load_sample("mnist")
    w.designer.autosave()
    assert w.designer.autosave_file().is_file()
    answers.reply = Button.Cancel
    assert not w.close()
    answers.reply = Button.Discard
    assert w.close()
    assert not w.designer.autosave_file().exists()
    w2 = MainWindow(settings=settings)
    qtbot.addWidget(w2)
    assert w2.designer.recoverable() == []


@pytest.mark.parametrize("reply", [Button.Cancel, Button.Discard, Button.Save])
def test_quit_asks_once_for_an_unsaved_project_and_design(qtbot, settings, answers, monkeypatch, tmp_path, reply):
    """Issue 48, item 7: a built design's model edited in the window and the design edited
    after: Quit asks one question naming both, and its answer holds for both."""
    from app.main_window import MainWindow
    from app.prompts import QFileDialog

    w = MainWindow(settings=settings, confirm_close=True)
    qtbot.addWidget(w)
    w.designer.new_design()
    w.designer.load_sample("mnist")
    w.designer.action_build.trigger()
    assert w.document.module is not None
    assert w.group_op("freeze", "")
    assert w.document.is_dirty() and w.designer.is_dirty()
    targets = [tmp_path / "p.ember.json", tmp_path / "d.design.json"]
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(targets.pop(0)), ""))
    answers.reply = reply
    closed = w.close()
    assert len(answers.asked) == 1, answers.asked
    assert "design" in answers.asked[0] and "unsaved" in answers.asked[0]
    assert closed == (reply != Button.Cancel)
    if reply == Button.Save:
        assert targets == [] and not w.document.is_dirty() and not w.designer.is_dirty()
    if reply == Button.Cancel:
        assert w.document.is_dirty() and w.designer.is_dirty()
