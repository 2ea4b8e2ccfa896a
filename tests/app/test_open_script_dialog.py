"""Open Model Script (Ctrl+O) takes `path.py:factory` typed into its file name box (issue 18,
item 9): Qt's own file dialog refused it as "File not found". The dialog is Qt's widget dialog
(never the platform's), reachable as `window.dialog`; a missing file is said plainly in it."""
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QFileDialog

NET = """
from tests.widgets.models import Mlp


def make_model():
    return Mlp()


def build():
    return Mlp()
"""


@pytest.fixture
def script_folder(tmp_path, settings):
    (tmp_path / "net.py").write_text(NET)
    settings.remember_folder(tmp_path / "net.py")  # the dialog starts in the last folder used
    return tmp_path


def _open_dialog(window, qtbot):
    # on the old code Ctrl+O ran a blocking QFileDialog: close it after a while so the test fails, not hangs
    QTimer.singleShot(5000, lambda: QApplication.activeModalWidget() and QApplication.activeModalWidget().reject())
    qtbot.keyClick(window, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier)
    dialog = window.dialog
    assert isinstance(dialog, QFileDialog), dialog
    assert dialog.testOption(QFileDialog.Option.DontUseNativeDialog)
    qtbot.waitExposed(dialog)
    return dialog


def _type_and_accept(dialog, qtbot, text):
    edit = dialog.name_edit
    edit.clear()
    qtbot.keyClicks(edit, text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)


def test_typing_path_and_factory_opens_that_factory(window, qtbot, script_folder):
    dialog = _open_dialog(window, qtbot)
    assert dialog.directory().absolutePath() == str(script_folder)
    _type_and_accept(dialog, qtbot, "net.py:make_model")
    assert not dialog.isVisible()
    doc = window.document
    assert type(doc.module).__name__ == "Mlp"
    assert doc.source.to_json() == {"kind": "script", "path": str((script_folder / "net.py").resolve()),
                                    "factory": "make_model"}
    assert "net.py:make_model" in window.windowTitle()


def test_a_missing_file_is_said_in_the_dialog_and_nothing_opens(window, qtbot, script_folder):
    dialog = _open_dialog(window, qtbot)
    _type_and_accept(dialog, qtbot, "nope.py:make_model")
    assert dialog.isVisible()  # still open: the user can correct the name
    assert dialog.problem.isVisible()
    assert dialog.problem.text() == (f"No file 'nope.py' in {script_folder}: expected an existing Python file, "
                                     f"optionally followed by the factory to call (net.py:make_model)")
    assert window.document.module is None
    _type_and_accept(dialog, qtbot, "net.py:make_model")  # corrected
    assert not dialog.isVisible() and window.document.source.factory == "make_model"


def test_a_file_picked_without_a_factory_uses_build(window, qtbot, script_folder):
    dialog = _open_dialog(window, qtbot)
    dialog.selectFile(str(script_folder / "net.py"))
    ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Open)
    assert ok.isEnabled()
    ok.click()
    assert not dialog.isVisible(), dialog.problem.text()
    assert window.document.source.factory == "build"
    assert type(window.document.module).__name__ == "Mlp"


def test_an_absolute_path_with_a_factory_works_from_any_folder(window, qtbot, script_folder, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere")
    dialog = _open_dialog(window, qtbot)
    dialog.setDirectory(str(other))
    _type_and_accept(dialog, qtbot, f"{script_folder / 'net.py'}:make_model")
    assert not dialog.isVisible() and window.document.source.factory == "make_model"
