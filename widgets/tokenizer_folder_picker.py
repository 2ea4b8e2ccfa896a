"""Where a model's folder has no tokenizer.json: say so, and let the user pick a folder that has one.

    picker = TokenizerFolderPicker()
    picker.set_message("This model's folder has no tokenizer.json: …")
    picker.folder_chosen.connect(remember)      # a folder holding tokenizer.json
    picker.choose("/path/to/folder")            # what the button's folder dialog calls

A folder without tokenizer.json is refused in the picker's own error line (the folder and what it
holds), and nothing is emitted.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from .common import ErrorLabel

TOKENIZER_FILE = "tokenizer.json"


def tokenizer_problem(folder: str) -> str:
    """Why `folder` cannot give a tokenizer ('' when it holds tokenizer.json)."""
    p = Path(str(folder or "")).expanduser()
    if not p.is_dir():
        return f"expected a folder holding {TOKENIZER_FILE}, found no folder at {p}"
    if (p / TOKENIZER_FILE).is_file():
        return ""
    names = sorted(x.name for x in p.iterdir())[:8]
    held = ", ".join(names) if names else "nothing"
    return f"expected {TOKENIZER_FILE} in {p}, found {held}"


class TokenizerFolderPicker(QWidget):
    folder_chosen = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("tokenizer-folder-picker")
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.button = QPushButton("Choose tokenizer folder…")
        self.button.setObjectName("choose-tokenizer-folder")
        self.button.clicked.connect(self._browse)
        self.error = ErrorLabel()
        self.folder = ""
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.message, 1)
        row.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.error)

    def set_message(self, text: str) -> None:
        self.message.setText(text)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a folder holding tokenizer.json", self.folder)
        if folder:
            self.choose(folder)

    def choose(self, folder: str) -> bool:
        """Take `folder` when it holds tokenizer.json (emits `folder_chosen`); else say why."""
        problem = tokenizer_problem(folder)
        self.error.show_error(f"Not a tokenizer folder: {problem}" if problem else None)
        if problem:
            return False
        self.folder = str(Path(folder).expanduser())
        self.folder_chosen.emit(self.folder)
        return True
