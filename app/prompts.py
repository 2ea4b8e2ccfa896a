"""The one question asked before unsaved work would be lost: Save / Discard / Cancel.

`MainWindow.maybe_discard` asks it for the document and the design before anything replaces
them (opening an example, a script, a project or a checkpoint, the designer's Build, New,
Open and Samples, Quit); the designer panel asks it for its design when it has no window.

`open_file` / `save_file`: the window's file dialogs, started in the last folder used.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

Button = QMessageBox.StandardButton


def ask_question(parent, title, text, buttons, default):
    """The modal question (QMessageBox.question); tests replace this to answer it."""
    return QMessageBox.question(parent, title, text, buttons, default)


def ask_save_discard(parent: QWidget | None, title: str, text: str,
                     save: Callable[[], object] | None = None) -> bool:
    """Ask whether to save before going on. True when the caller may go on: the user chose
    Discard, or Save and the save succeeded; False for Cancel (or a save that failed or was
    cancelled), and the caller then changes nothing. Without `save` only Discard / Cancel."""
    buttons = Button.Discard | Button.Cancel
    if save is not None:
        buttons |= Button.Save
    answer = ask_question(parent, title, text, buttons, Button.Cancel)
    if answer == Button.Discard:
        return True
    if answer == Button.Save and save is not None:
        return bool(save())
    return False


# ---- file dialogs: they start in the folder of the last file chosen (`Settings.last_folder`) ----
def _start(settings, name: str = "") -> str:
    folder = settings.last_folder() if settings is not None else str(Path.home())
    return str(Path(folder) / name) if name else folder


def open_file(parent, settings, title: str, filters: str) -> str:
    """Ask for a file to open, starting in the last used folder (else home); '' when cancelled."""
    path, _ = QFileDialog.getOpenFileName(parent, title, _start(settings), filters)
    if path and settings is not None:
        settings.remember_folder(path)
    return path


def save_file(parent, settings, title: str, filters: str, name: str = "") -> str:
    """Ask for a file to write (suggesting `name`), starting in the last used folder; '' when cancelled."""
    path, _ = QFileDialog.getSaveFileName(parent, title, _start(settings, name), filters)
    if path and settings is not None:
        settings.remember_folder(path)
    return path
