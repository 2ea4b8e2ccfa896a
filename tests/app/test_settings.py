"""Settings persist in the QSettings they are given (an INI file here, never the user's)."""
import pytest
from PySide6.QtWidgets import QMainWindow

from app.settings import MAX_RECENT, Settings


def test_recent_files_are_most_recent_first_without_duplicates(tmp_path):
    s = Settings.at(tmp_path / "s.ini")
    for i in range(MAX_RECENT + 3):
        s.add_recent(f"/m/{i}.py:build")
    s.add_recent("/m/5.py:build")
    again = Settings.at(tmp_path / "s.ini")
    files = again.recent_files()
    assert files[0] == "/m/5.py:build"
    assert len(files) == MAX_RECENT and len(set(files)) == MAX_RECENT
    assert "/m/0.py:build" not in files
    again.remove_recent("/m/5.py:build")
    assert "/m/5.py:build" not in again.recent_files()


def test_a_single_recent_file_comes_back_as_a_list(tmp_path):
    s = Settings.at(tmp_path / "s.ini")
    s.add_recent("/only.bpk")
    s.sync()
    assert Settings.at(tmp_path / "s.ini").recent_files() == ["/only.bpk"]


def test_theme_is_remembered_and_checked(tmp_path):
    s = Settings.at(tmp_path / "s.ini")
    assert s.theme() == "light"
    s.set_theme("dark")
    assert Settings.at(tmp_path / "s.ini").theme() == "dark"
    with pytest.raises(ValueError, match="expected one of light, dark"):
        s.set_theme("solarized")


def test_window_state_round_trips(qtbot, tmp_path):
    w = QMainWindow()
    qtbot.addWidget(w)
    w.resize(700, 500)
    s = Settings.at(tmp_path / "s.ini")
    s.save_window(w)
    s.sync()
    w2 = QMainWindow()
    qtbot.addWidget(w2)
    assert Settings.at(tmp_path / "s.ini").restore_window(w2)
    assert (w2.width(), w2.height()) == (700, 500)
