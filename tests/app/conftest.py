"""Fixtures for app tests: a main window with its own settings file; the theme put back after."""
import pytest
from PySide6.QtWidgets import QApplication, QFileDialog

from app.settings import Settings
from app.theme import apply_theme


@pytest.fixture
def settings(tmp_path):
    return Settings.at(tmp_path / "settings.ini")


@pytest.fixture
def window(qtbot, settings):
    from app.main_window import MainWindow

    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    yield w
    for task in list(getattr(w, "running_tasks", [])):
        task.cancel()
        task.wait_thread(5)
    apply_theme(QApplication.instance(), "light")


MLP_SCRIPT = """
from tests.widgets.models import Mlp


def build():
    return Mlp()
"""


@pytest.fixture
def mlp_script(tmp_path):
    path = tmp_path / "mlp_model.py"
    path.write_text(MLP_SCRIPT)
    return path


@pytest.fixture
def opened(window, mlp_script):
    """The window with the test Mlp opened from a script."""
    assert window.open_script(str(mlp_script))
    return window


def _answering(monkeypatch, method: str, what: str, shape) -> list:
    """QFileDialog.`method` answers with the paths put in the returned list, in order, each as
    `shape(path)` (the dialog's return value); a dialog the test did not expect fails it."""
    answers: list = []

    def choose(*_args, **_kwargs):
        assert answers, f"a {what} dialog was opened that the test did not expect"
        return shape(str(answers.pop(0)))

    monkeypatch.setattr(QFileDialog, method, choose)
    return answers


@pytest.fixture
def folders(monkeypatch):
    """QFileDialog.getExistingDirectory and the folder-to-write dialog (OutputFolderDialog.choose)
    answer with the folders put in this list, in order."""
    from app.prompts import OutputFolderDialog

    answers = _answering(monkeypatch, "getExistingDirectory", "folder", lambda path: path)

    def choose(*_args, **_kwargs):
        assert answers, "a folder dialog was opened that the test did not expect"
        return str(answers.pop(0))

    monkeypatch.setattr(OutputFolderDialog, "choose", choose)
    return answers


@pytest.fixture
def files(monkeypatch):
    """QFileDialog.getOpenFileName answers with the files put in this list, in order."""
    return _answering(monkeypatch, "getOpenFileName", "file", lambda path: (path, ""))
