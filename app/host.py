"""What a controller asks of the window it works in: the host protocol.

The controllers (`project_io.py`, `edit_actions.py`, `checkpoint_actions.py`, `contract_check.py`,
`onnx_actions.py`, `pretrained_actions.py`, `script_export_actions.py`, `generate_panel.py`) take
the `Document` they change and a `Host`; the widgets and sibling controllers a controller needs
besides (the tree, the contract editor, a menu, an action, a function) are handed to it by the
window when it wires them. A controller never imports `main_window.py`: `MainWindow` implements
this protocol, and a test can hand a controller any object that does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from PySide6.QtWidgets import QMessageBox, QWidget

    from .settings import Settings
    from .task_runner import TaskRunner

D = TypeVar("D")


class Host(Protocol):
    settings: "Settings"  # the user's settings: last folder, recent files, confirmed scripts
    tasks: "TaskRunner"  # long work on worker threads, shown in the status bar
    last_message: "QMessageBox | None"  # the message shown last (kept so a caller can add to it)

    def status(self, text: str, ms: int = 8000) -> None:
        """A passing note in the status bar."""

    def message(self, icon: "QMessageBox.Icon", title: str, text: str, details: str = "") -> "QMessageBox":
        """Show a message without blocking; it becomes `last_message`."""

    def error(self, title: str, text: str, details: str = "") -> "QMessageBox":
        """Show an error without blocking; it becomes `last_message`."""

    def open_dialog(self, dialog: D) -> D:
        """Open a dialog window-modal and return it."""

    def dialog_parent(self) -> "QWidget":
        """The parent of file pickers, questions and dialogs."""

    def maybe_discard(self, document: bool = True, design: bool = False) -> bool:
        """Before the document (or the designer's design) is replaced: ask about unsaved work;
        False: the caller changes nothing."""
