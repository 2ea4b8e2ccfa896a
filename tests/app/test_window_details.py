"""Issue 18, item 9: small things seen in the window."""
from PySide6.QtCore import Qt


def test_a_negative_contract_axis_is_explained_without_internal_names(opened, qtbot):
    w = opened
    editor = w.contract_editor
    editor.edit.clear()
    qtbot.keyClicks(editor.edit, "[batch, -5] -> [batch, 3]")
    text = editor.error.text()
    assert "-5" in text and "negative" in text, text
    assert "UnaryOp" not in text and "USub" not in text


def test_the_example_input_and_its_error_go_with_the_model(opened, qtbot):
    w = opened
    editor = w.contract_editor
    editor.input.clear()
    qtbot.keyClicks(editor.input, "x: [2, 999")
    assert editor.input_error.text()
    assert w.open_example("spirals")
    assert editor.input.text() != "x: [2, 999"
    assert not editor.input_error.text()


def test_the_tree_fits_names_and_counts_and_expand_all_sets_the_depth(window, qtbot, tmp_path):
    assert window.open_example("transformer")
    tree = window.tree
    window.actions.expand_all.trigger()
    qtbot.wait(20)
    assert tree.depth_spin.value() >= 2
    view = tree.view
    from widgets.module_tree import NAME, PARAMS
    for column in (NAME, PARAMS):
        assert view.columnWidth(column) >= view.sizeHintForColumn(column), column


def test_open_checkpoint_starts_on_the_open_models_architecture(window, mlp_script):
    assert window.open_example("digits")
    window.actions.open_checkpoint.trigger()
    dialog = window.dialog
    assert dialog.architecture.currentData() == "digits"
    dialog.reject()
    assert window.open_script(str(mlp_script))
    window.actions.open_checkpoint.trigger()
    dialog = window.dialog
    assert dialog.architecture.currentData() == "__script__"
    assert dialog.script.text() == f"{mlp_script}:build"
    dialog.reject()


def test_an_adapters_only_file_loads_partially_without_ticking_allow_partial(opened, qtbot, tmp_path):
    from PySide6.QtWidgets import QDialogButtonBox

    from engine.store import ModuleRecord
    from tests.app.test_lora import attach
    from tests.widgets.qt_helpers import type_into

    attach(qtbot, opened)
    out = tmp_path / "adapters.bpk"
    task = opened.checkpoints.export_checkpoint(str(out), "adapters")
    qtbot.waitUntil(lambda: not opened.running_tasks, timeout=20000)
    assert task.outcome == "finished"
    assert all(".lora." in n for n in ModuleRecord.load(out).names())
    steps = opened.document.undo_stack.count()
    opened.actions.import_checkpoint.trigger()
    d = opened.dialog
    type_into(qtbot, d.path, str(out))
    assert not d.allow_partial.isChecked()
    d.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    qtbot.waitUntil(lambda: not opened.running_tasks, timeout=20000)
    assert opened.document.undo_stack.count() == steps + 1
    assert opened.last_message is not None and opened.last_message.windowTitle() == "Adapters loaded"
    assert "adapters only" in opened.last_message.text()


def test_file_dialogs_start_in_the_last_folder_used(window, tmp_path, monkeypatch):
    from pathlib import Path

    from PySide6.QtWidgets import QFileDialog

    starts = []
    folder = tmp_path / "work"
    folder.mkdir()

    def get_open(parent, title, start, filters):
        starts.append(start)
        return (str(folder / "p.ember.json"), "") if len(starts) == 1 else ("", "")

    monkeypatch.setattr(QFileDialog, "getOpenFileName", get_open)
    window.actions.open_project.trigger()  # the file does not exist: refused, but the folder is remembered
    window.actions.open_project.trigger()
    assert starts[0] == str(Path.home())
    assert starts[1] == str(folder)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda parent, title, start, filters: (starts.append(start), ("", ""))[1])
    window.designer.action_save_as.trigger()
    assert starts[2] == str(folder)


def _toolbar_button(toolbar, action):
    return toolbar.widgetForAction(action)


def test_a_long_undo_command_keeps_the_toolbar_button_one_word_and_names_it_in_the_menu_and_tooltip(opened, qtbot):
    """Issue 48, item 3: the Undo button grew to the whole command and pushed the toolbar's
    other buttons into the overflow."""
    w = opened
    button = _toolbar_button(w.toolbar, w.actions.undo)
    width = button.sizeHint().width()
    long = "Attach LoRA (rank 8, alpha 16) to " + ", ".join(f"layers.{i}.self_attn.query.weight" for i in range(6))
    w.document.push_module(long, w.document.module)
    qtbot.wait(10)
    assert w.actions.undo.text() == f"&Undo {long}"  # the Edit menu says the whole command
    assert long in w.actions.undo.toolTip()
    assert button.text() == "Undo" and button.sizeHint().width() == width
    w.actions.undo.trigger()
    assert w.actions.redo.text() == f"&Redo {long}" and _toolbar_button(w.toolbar, w.actions.redo).text() == "Redo"


def test_the_designers_undo_button_does_not_change_size_with_the_command(window, qtbot):
    from PySide6.QtGui import QUndoCommand

    designer = window.designer
    toolbars = [o for o in designer.action_undo.associatedObjects() if hasattr(o, "widgetForAction")]
    assert toolbars, "the designer's Undo action is on a toolbar"
    button = toolbars[0].widgetForAction(designer.action_undo)
    width = button.sizeHint().width()
    designer.undo_stack.push(QUndoCommand("Connect a very long node name output 0 to another very long node input 1"))
    qtbot.wait(10)
    assert button.text() == "Undo" and button.sizeHint().width() == width
    assert "another very long node input 1" in designer.action_undo.toolTip()
    assert "another very long node input 1" in designer.action_undo.text()


def test_a_drop_is_accepted_as_a_copy_never_as_the_proposed_move(window, qtbot, tmp_path):
    """Issue 48, item 4: a drop accepted as the proposed MoveAction lets a file manager delete
    the user's folder afterwards."""
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent

    script = tmp_path / "net.py"
    script.write_text("import engine.nn as nn\n\ndef build():\n    return nn.LinearConfig(2, 2).init()\n")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(script))])
    both = Qt.DropAction.MoveAction | Qt.DropAction.CopyAction
    enter = QDragEnterEvent(window.rect().center(), both, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dragEnterEvent(enter)
    assert enter.isAccepted() and enter.dropAction() == Qt.DropAction.CopyAction
    drop = QDropEvent(QPointF(20, 20), both, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    drop.setDropAction(Qt.DropAction.MoveAction)  # what a file manager that proposes a move sets
    window.dropEvent(drop)
    assert drop.isAccepted() and drop.dropAction() == Qt.DropAction.CopyAction
    assert script.exists()
    link_only = QDropEvent(QPointF(20, 20), Qt.DropAction.LinkAction, mime, Qt.MouseButton.LeftButton,
                           Qt.KeyboardModifier.NoModifier)
    window.dropEvent(link_only)
    assert link_only.isAccepted() and link_only.dropAction() == Qt.DropAction.LinkAction
    move_only = QDropEvent(QPointF(20, 20), Qt.DropAction.MoveAction, mime, Qt.MouseButton.LeftButton,
                           Qt.KeyboardModifier.NoModifier)
    window.dropEvent(move_only)
    assert not move_only.isAccepted()


problems: list[str] = []


def _answer_folder_dialog(qtbot, text: str):
    """Type `text` into the folder-to-write dialog when it shows, and press Choose."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.prompts import OutputFolderDialog

    def answer():
        dialog = next((w for w in QApplication.topLevelWidgets()
                       if isinstance(w, OutputFolderDialog) and w.isVisible()), None)
        if dialog is None:
            QTimer.singleShot(20, answer)
            return
        dialog.name_edit.setText(text)
        dialog.accept()
        if dialog.isVisible():  # refused: the problem is said in the dialog, which stays open
            problems.append(dialog.problem.text())
            dialog.reject()

    QTimer.singleShot(20, answer)


def test_a_folder_to_write_may_be_typed_new_or_picked_existing(qtbot, tmp_path):
    """Issue 48, item 8: pickers titled "choose or make a folder" rejected a typed new folder
    ("Directory not found")."""
    from app.prompts import OutputFolderDialog
    from app.settings import Settings

    settings = Settings.at(tmp_path / "settings.ini")
    settings.remember_folder(str(tmp_path))
    _answer_folder_dialog(qtbot, "new-export")
    assert OutputFolderDialog.choose(None, settings, "Export (choose or make a folder)") == str(tmp_path / "new-export")
    assert not (tmp_path / "new-export").exists()  # the export makes it, not the dialog
    (tmp_path / "old").mkdir()
    _answer_folder_dialog(qtbot, "old")
    assert OutputFolderDialog.choose(None, settings, "Export") == str(tmp_path / "old")
    _answer_folder_dialog(qtbot, "no-such-parent/child")  # a new folder inside a missing one: refused
    assert OutputFolderDialog.choose(None, settings, "Export") == ""
    assert problems and "no-such-parent" in problems[-1] and "inside an existing one" in problems[-1]
    (tmp_path / "a-file").write_text("x")
    _answer_folder_dialog(qtbot, "a-file")
    assert OutputFolderDialog.choose(None, settings, "Export") == ""
    assert "is a file" in problems[-1]
