"""Undo commands. Engine transitions return new modules, so a command keeps the module value
before and after: undo and redo swap values and copy nothing (the two share parameters)."""
from __future__ import annotations

from typing import Any, Protocol

from PySide6.QtGui import QUndoCommand


class CommandTarget(Protocol):
    """What a command changes: the document (app/document.py), through its public methods that
    make no undo step of their own (the command is the step)."""

    def replace_module(self, module: Any) -> None: ...

    def apply_contract(self, path: str, text: str | None) -> None: ...


class ModuleCommand(QUndoCommand):
    """Replace the document's module: `before` on undo, `after` on redo.

    `edit` is the replayable description saved in the project file (an `app.core.schema` edit).
    """

    def __init__(self, document: CommandTarget, text: str, before: Any, after: Any, edit=None):
        super().__init__(text)
        self.document = document
        self.before = before
        self.after = after
        self.edit = edit

    def redo(self) -> None:
        self.document.replace_module(self.after)

    def undo(self) -> None:
        self.document.replace_module(self.before)


class ContractCommand(QUndoCommand):
    """Set (or with `None`, reset to the docstring's) the shape contract of one module path."""

    def __init__(self, document: CommandTarget, path: str, before: str | None, after: str | None):
        where = path or "the model"
        super().__init__(f"Edit contract of {where}" if after is not None else f"Reset contract of {where}")
        self.document = document
        self.path = path
        self.before = before
        self.after = after
        self.edit = None

    def redo(self) -> None:
        self.document.apply_contract(self.path, self.after)

    def undo(self) -> None:
        self.document.apply_contract(self.path, self.before)
