"""File ▸ Open from the Hugging Face Hub…: a model id ('org/name') and an optional revision,
checked as typed; emits `chosen(repo_id, revision)` (revision '' for the default branch). The
download itself is the app's (on a worker, with progress and Cancel)."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QVBoxLayout

from engine.models.hub import is_hub_id

from .common import ErrorLabel


class HubIdDialog(QDialog):
    chosen = Signal(str, str)

    def __init__(self, parent=None, *, repo_id: str = ""):
        super().__init__(parent)
        self.setObjectName("hub-id-dialog")
        self.setWindowTitle("Open from the Hugging Face Hub")
        self.repo_id = QLineEdit(repo_id)
        self.repo_id.setObjectName("repo-id")
        self.repo_id.setPlaceholderText("org/name, e.g. HuggingFaceTB/SmolLM2-135M")
        self.revision = QLineEdit()
        self.revision.setObjectName("revision")
        self.revision.setPlaceholderText("main (a branch, tag or commit)")
        self.error = ErrorLabel()
        note = QLabel("The config, tokenizer and safetensors weights are downloaded into the Hugging Face cache "
                      "(HF_TOKEN and HF_ENDPOINT are honoured), then opened lazily.")
        note.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Model id", self.repo_id)
        form.addRow("Revision", self.revision)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(note)
        layout.addWidget(self.buttons)
        self.repo_id.textChanged.connect(self._update)
        self.revision.textChanged.connect(self._update)
        self._update()

    def problem(self) -> str:
        """Why the fields cannot be used ('' when they can)."""
        text = self.repo_id.text().strip()
        if not text:
            return "Type a model id: org/name."
        if not is_hub_id(text):
            return f"expected a Hub model id 'org/name' (letters, digits, '_', '.', '-'), found {text!r}"
        rev = self.revision.text().strip()
        if rev and (any(c.isspace() for c in rev) or ".." in rev):
            return f"expected a branch, tag or commit name without spaces or '..', found {rev!r}"
        return ""

    def _update(self, *_):
        why = self.problem()
        shown = why if self.repo_id.text().strip() else None  # an empty field is not yet an error
        self.error.show_error(shown)
        self.buttons.button(QDialogButtonBox.StandardButton.Open).setEnabled(not why)

    def accept(self) -> None:
        if self.problem():
            return
        self.chosen.emit(self.repo_id.text().strip(), self.revision.text().strip())
        super().accept()
