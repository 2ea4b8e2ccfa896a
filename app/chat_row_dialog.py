"""Preview rows: a conversation data file's rows as training renders and masks them, one at a time.

The model folder's chat template and tokenizer and the data file's conversations are read on a
worker (`BackgroundTask`: a big file never blocks the window; closing the dialog cancels it); a
row picker ("conversation n of N") then renders one conversation on the GUI thread (fast) into a
`widgets.chat_row_view.ChatRowView`. Problems (no template, a bad record) are shown in the dialog
with the file and line they come from.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout

from engine.train.chat_preview import preview_row
from engine.train.chat_template import ChatTemplateError, read_chat_template
from engine.train.conversations import conversation_file_format, read_conversations
from engine.train.text import load_tokenizer
from engine.train.tokenizer import TokenizerError
from widgets.chat_row_view import ChatRowView
from widgets.common import ErrorLabel

from .workers import BackgroundTask

def is_conversation_file(path: str) -> bool:
    """Whether the `.jsonl` file's first record is a conversation (a bounded read; False on any
    problem: the run names problems with the file and the line)."""
    return bool(str(path or "").strip()) and conversation_file_format(str(path)) is not None


def _load(state, data_file: str, folder: str):
    template = read_chat_template(folder)
    state.check_cancelled()
    tokenizer = load_tokenizer(folder)
    state.check_cancelled()
    return template, tokenizer, read_conversations(data_file)


class ChatRowDialog(QDialog):
    """The rows of `data_file` rendered with the chat template and tokenizer of `folder`."""

    def __init__(self, data_file: str, folder: str, parent=None):
        super().__init__(parent)
        self.setObjectName("chat-row-dialog")
        self.setWindowTitle(f"Training rows — {Path(data_file).name}")
        self.resize(1100, 640)
        self.data_file, self.folder = data_file, folder
        self.template = self.tokenizer = None
        self.conversations: list = []
        self.picker = QSpinBox()
        self.picker.setObjectName("chat-row-picker")
        self.picker.setEnabled(False)
        self.picker.valueChanged.connect(self.show_conversation)
        self.of_label = QLabel("Reading the file…")
        self.source_label = QLabel("")
        self.source_label.setWordWrap(True)
        self.error = ErrorLabel()
        self.view = ChatRowView()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        top = QHBoxLayout()
        top.addWidget(QLabel("Conversation"))
        top.addWidget(self.picker)
        top.addWidget(self.of_label)
        top.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.source_label)
        layout.addWidget(self.error)
        layout.addWidget(self.view, 1)
        layout.addWidget(buttons)
        self.task = BackgroundTask(_load, data_file, folder, title="Reading conversations")
        self.task.finished.connect(self._loaded)
        self.task.failed.connect(self._load_failed)
        self.task.start()

    def _loaded(self, out) -> None:
        self.template, self.tokenizer, self.conversations = out
        n = len(self.conversations)
        self.of_label.setText(f"of {n:,}")
        self.source_label.setText(f"{self.data_file}, rendered with {self.template.where} and the tokenizer of "
                                  f"{self.folder}")
        self.picker.setRange(1, max(1, n))
        self.picker.setEnabled(n > 0)
        self.show_conversation(self.picker.value())

    def _load_failed(self, failure) -> None:
        exc = failure.exception
        known = (ChatTemplateError, TokenizerError, ValueError, OSError)
        self.of_label.setText("")
        self.error.show_error(str(exc) if isinstance(exc, known) else f"{type(exc).__name__}: {exc}")

    def show_conversation(self, n: int) -> None:
        """Show conversation `n` (1-based) of the file."""
        if not self.conversations or not 1 <= n <= len(self.conversations):
            return
        conv = self.conversations[n - 1]
        try:
            preview = preview_row(conv, self.template, self.tokenizer)
        except (ChatTemplateError, ValueError) as e:
            self.error.show_error(f"{conv.file}, line {conv.line}: {e}")
            return
        self.error.show_error(None)
        self.view.show_row(preview)

    def wait_loaded(self, timeout: float = 30.0) -> bool:
        """For tests: process events until the file is read; False on timeout."""
        import time  # noqa: PLC0415

        from PySide6.QtWidgets import QApplication  # noqa: PLC0415

        deadline = time.monotonic() + timeout
        while self.task.outcome is None and time.monotonic() < deadline:
            QApplication.processEvents()
            time.sleep(0.002)
        QApplication.processEvents()
        return self.task.outcome is not None

    def done(self, result: int) -> None:  # closing cancels the read
        self.task.cancel()
        super().done(result)
