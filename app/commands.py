"""Undo commands. Engine transitions return new modules, so a command keeps the module value
before and after: undo and redo swap values and copy nothing (the two share parameters)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtGui import QUndoCommand

if TYPE_CHECKING:  # pragma: no cover
    from .document import Document


class ModuleCommand(QUndoCommand):
    """Replace the document's module: `before` on undo, `after` on redo.

    `edit` is the replayable description saved in the project file (an `app.core.schema` edit).
    """

    def __init__(self, document: "Document", text: str, before: Any, after: Any, edit=None):
        super().__init__(text)
        self.document = document
        self.before = before
        self.after = after
        self.edit = edit

    def redo(self) -> None:
        self.document._replace_module(self.after)

    def undo(self) -> None:
        self.document._replace_module(self.before)


class ContractCommand(QUndoCommand):
    """Set (or with `None`, reset to the docstring's) the shape contract of one module path."""

    def __init__(self, document: "Document", path: str, before: str | None, after: str | None):
        where = path or "the model"
        super().__init__(f"Edit contract of {where}" if after is not None else f"Reset contract of {where}")
        self.document = document
        self.path = path
        self.before = before
        self.after = after
        self.edit = None

    def redo(self) -> None:
        self.document._set_contract(self.path, self.after)

    def undo(self) -> None:
        self.document._set_contract(self.path, self.before)
