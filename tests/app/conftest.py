"""Fixtures for app tests: a main window with its own settings file; the theme put back after."""
import pytest
from PySide6.QtWidgets import QApplication

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
