"""The one question asked before unsaved work would be lost: Save / Discard / Cancel.

`MainWindow.maybe_discard` asks it for the document and the design before anything replaces
them (opening an example, a script, a project or a checkpoint, the designer's Build, New,
Open and Samples, Quit); the designer panel asks it for its design when it has no window.

`open_file` / `save_file`: the window's file dialogs, started in the last folder used (a save in
the folder last saved to: opening a model from its folder does not move where saves start).
`ScriptFileDialog`: Open Model Script, where the typed name may carry a factory (`net.py:make_model`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QFileDialog, QLabel, QLineEdit, QMessageBox, QWidget

from .core.opening import split_script_spec

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
def _start(settings, name: str = "", save: bool = False) -> str:
    """Where a dialog starts: a save in the folder last saved to (not the open model's folder),
    else the last folder used, else home."""
    if settings is None:
        folder = str(Path.home())
    else:
        folder = settings.last_save_folder() if save else settings.last_folder()
    return str(Path(folder) / name) if name else folder


def open_file(parent, settings, title: str, filters: str) -> str:
    """Ask for a file to open, starting in the last used folder (else home); '' when cancelled."""
    path, _ = QFileDialog.getOpenFileName(parent, title, _start(settings), filters)
    if path and settings is not None:
        settings.remember_folder(path)
    return path


def save_file(parent, settings, title: str, filters: str, name: str = "") -> str:
    """Ask for a file to write (suggesting `name`), starting in the last used folder; '' when cancelled."""
    path, _ = QFileDialog.getSaveFileName(parent, title, _start(settings, name, save=True), filters)
    if path and settings is not None:
        settings.remember_save_folder(Path(path).parent)
    return path


class OutputFolderDialog(QFileDialog):
    """A folder to write into, existing or new: Qt's folder picker answers "Directory not found"
    to a typed name that does not exist yet, though an export makes the folder. This one (Qt's
    widget dialog, never the platform's) takes a typed new name inside an existing folder as the
    answer; the export makes it. `choose(...)` is the whole exchange."""

    def __init__(self, parent: QWidget | None, title: str, start: str):
        super().__init__(parent, title, start)
        self.setOption(QFileDialog.Option.DontUseNativeDialog, True)
        self.setFileMode(QFileDialog.FileMode.Directory)
        self.setOption(QFileDialog.Option.ShowDirsOnly, True)
        self.setLabelText(QFileDialog.DialogLabel.FileName, "Folder (new or existing):")
        self.setLabelText(QFileDialog.DialogLabel.Accept, "Choose")
        self.chosen = ""
        self.name_edit: QLineEdit | None = self.findChild(QLineEdit, "fileNameEdit")
        self.problem = QLabel("")
        self.problem.setObjectName("folder-problem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #c62828;")
        self.problem.hide()
        grid = self.layout()
        if grid is not None and hasattr(grid, "rowCount"):
            grid.addWidget(self.problem, grid.rowCount(), 0, 1, -1)
        if self.name_edit is not None:
            self.name_edit.textEdited.connect(lambda _text: self.problem.hide())

    def accept(self) -> None:
        text = self.name_edit.text().strip() if self.name_edit is not None else ""
        if text:
            target = Path(self.directory().absolutePath()) / Path(text).expanduser()
            if not target.exists():
                if not target.parent.is_dir():
                    # said here, in the dialog: Qt's own check would open a modal "Directory not found"
                    self.problem.setText(f"No folder {target.parent}: a new folder is made inside an existing one")
                    self.problem.show()
                    return
                self.chosen = str(target)
                QDialog.accept(self)  # past QFileDialog's own check, which wants an existing folder
                return
            if not target.is_dir():
                self.problem.setText(f"{target} is a file: choose a folder, or type a new folder's name")
                self.problem.show()
                return
        super().accept()
        if self.result() == QDialog.DialogCode.Accepted and self.selectedFiles():
            self.chosen = self.selectedFiles()[0]

    @classmethod
    def choose(cls, parent: QWidget | None, settings, title: str) -> str:
        """Ask for a folder to write (starting in the last used folder); '' when cancelled. The
        folder chosen is remembered as the last used one's parent, so the next export starts beside it."""
        dialog = cls(parent, title, _start(settings, save=True))
        if dialog.exec() != QDialog.DialogCode.Accepted or not dialog.chosen:
            return ""
        if settings is not None:
            settings.remember_save_folder(Path(dialog.chosen).parent)
        return dialog.chosen


SCRIPT_FILTER = "Python model scripts (*.py);;All files (*)"


class ScriptFileDialog(QFileDialog):
    """Open Model Script: pick a Python file, or type its name followed by the factory to call,
    `net.py:make_model` (without one, `build`). Qt's own dialog (native or not) checks the typed
    text as a file name and answers "File not found"; this one (Qt's widget dialog, never the
    platform's) splits off the factory, checks that the file exists, says plainly in the dialog
    when it does not, and emits `spec_chosen("/abs/net.py:make_model")`. Opens in the last
    folder used; the chosen file's folder is remembered."""

    spec_chosen = Signal(str)

    def __init__(self, parent: QWidget | None, settings=None):
        super().__init__(parent, "Open Model Script", _start(settings), SCRIPT_FILTER)
        self.settings = settings
        self.setObjectName("open-script-dialog")
        self.setOption(QFileDialog.Option.DontUseNativeDialog, True)
        self.setAcceptMode(QFileDialog.AcceptMode.AcceptOpen)
        self.setFileMode(QFileDialog.FileMode.AnyFile)  # a typed name is ours to check, not Qt's
        self.setLabelText(QFileDialog.DialogLabel.FileName, "Script[:factory]:")
        self.spec = ""
        self.name_edit: QLineEdit = self.findChild(QLineEdit, "fileNameEdit")
        self.problem = QLabel("")
        self.problem.setObjectName("script-problem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #c62828;")
        self.problem.hide()
        grid = self.layout()
        if grid is not None and hasattr(grid, "rowCount"):
            grid.addWidget(self.problem, grid.rowCount(), 0, 1, -1)
        # what the user typed, as typed: Qt's completer rewrites a typed full path to its last part
        self._typed = ""
        if self.name_edit is not None:
            self.name_edit.textEdited.connect(self._on_edited)

    def _on_edited(self, text: str) -> None:
        self._typed = text.strip()
        self.problem.hide()

    def typed_text(self) -> str:
        return self.name_edit.text().strip() if self.name_edit is not None else ""

    def resolve(self, text: str) -> tuple[Path | None, str, str | None]:
        """(file, factory, problem) for the text typed (or the file picked): a relative name is
        in the folder shown; `problem` says what is wrong (None when the file exists)."""
        path, factory = split_script_spec(text)
        path = path.expanduser()
        if not path.is_absolute():
            path = Path(self.directory().absolutePath()) / path
        if path.is_file():
            return path, factory, None
        if path.is_dir():
            return None, factory, f"{path} is a folder; expected a Python file such as net.py or net.py:make_model"
        return None, factory, (f"No file {path.name!r} in {path.parent}: expected an existing Python file, "
                               f"optionally followed by the factory to call (net.py:make_model)")

    def accept(self) -> None:
        text = self.typed_text()
        if not text:
            files = self.selectedFiles()
            text = files[0] if files else ""
        if not text:
            return
        folder = Path(self.directory().absolutePath()) / Path(text).expanduser()
        if ":" not in text and folder.is_dir():
            super().accept()  # Qt goes into the folder typed
            return
        path, factory, problem = self.resolve(text)
        if problem and self._typed and self._typed != text:  # the full text the user typed
            typed = self.resolve(self._typed)
            if typed[2] is None:
                path, factory, problem = typed
        if problem:  # a full path set in the box: Qt's completer cut it to the file's name and selected the file
            picked = [Path(f) for f in self.selectedFiles()]
            if picked and picked[-1].is_file() and picked[-1].name == split_script_spec(text)[0].name:
                path, factory, problem = picked[-1], split_script_spec(text)[1], None
        if problem:
            self.problem.setText(problem)
            self.problem.show()
            return
        self.spec = f"{path}:{factory}"
        if self.settings is not None:
            self.settings.remember_folder(path)
        QDialog.accept(self)  # Qt's own accept would look for a file named "net.py:make_model"
        self.spec_chosen.emit(self.spec)

