"""The document: the model a window shows, where it came from, and what the user did to it.

It holds the current module *value*. Widgets never change engine objects: `app/` turns what the
user asked for into an undo command, and the command replaces the document's module. Every view
listens to `model_changed`.

A project is one `.ember.json` file holding the source of the model, the replayable edits made
since, the edited shape contracts, and the training runs. Weights never live in it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from engine.store.atomic import atomic_write_text

from .commands import ContractCommand, ModuleCommand

PROJECT_SUFFIX = ".ember.json"
PROJECT_FORMAT = 1


class ProjectError(ValueError):
    """A project file that cannot be read: says which file and what was wrong."""


class Document(QObject):
    model_changed = Signal()
    contracts_changed = Signal()
    check_changed = Signal()
    source_changed = Signal()
    dirty_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.undo_stack = QUndoStack(self)
        self.module: Any = None
        self.source: dict | None = None
        self.project_path: Path | None = None
        self.base_edits: list[dict] = []  # replayed from the project file when it was opened
        self.contracts: dict[str, str] = {}  # module path -> contract text edited by the user
        self.runs: list[dict] = []
        self.check_result = None  # the last contract check (engine.module.contracts.CheckResult)
        self._extra_dirty = False  # differs from the file outside the undo stack (a recovered autosave)
        self.undo_stack.cleanChanged.connect(self._on_clean_changed)

    # ---- the model -----------------------------------------------------------------------
    def set_model(self, module: Any, source: dict | None, *, edits: list[dict] | None = None,
                  contracts: dict[str, str] | None = None, project_path: Path | None = None,
                  runs: list[dict] | None = None, dirty: bool = False) -> None:
        """Start over with a new model: the undo history is cleared. `dirty` marks a document
        that differs from its file from the start (one recovered from an autosave)."""
        self.undo_stack.clear()
        self.module = module
        self.source = source
        self.base_edits = list(edits or [])
        self.contracts = dict(contracts or {})
        self.runs = list(runs or [])
        self.project_path = Path(project_path) if project_path else None
        self.check_result = None
        self.undo_stack.setClean()
        self._extra_dirty = bool(dirty)
        self.source_changed.emit()
        self.model_changed.emit()
        self.contracts_changed.emit()
        self.check_changed.emit()
        self.dirty_changed.emit(self.is_dirty())

    def push_module(self, text: str, after: Any, edit: dict | None = None) -> ModuleCommand:
        """Replace the module by `after` as one undoable step."""
        if self.module is None:
            raise RuntimeError("no model is open")
        command = ModuleCommand(self, text, self.module, after, edit)
        self.undo_stack.push(command)
        return command

    def _replace_module(self, module: Any) -> None:
        self.module = module
        if self.check_result is not None:
            self.check_result = None
            self.check_changed.emit()
        self.model_changed.emit()

    # ---- edits -----------------------------------------------------------------------------
    def applied_commands(self) -> list:
        """The commands in effect now (those before the undo stack's index)."""
        return [self.undo_stack.command(i) for i in range(self.undo_stack.index())]

    @property
    def edits(self) -> list[dict]:
        """The replayable edits since the source: from the project, then the applied commands."""
        return self.base_edits + [c.edit for c in self.applied_commands() if getattr(c, "edit", None)]

    # ---- contracts ---------------------------------------------------------------------------
    def set_contract(self, path: str, text: str | None) -> None:
        """Edit (or with `None`, reset) one module's contract, as an undoable step."""
        before = self.contracts.get(path)
        if before == text:
            return
        self.undo_stack.push(ContractCommand(self, path, before, text))

    def _set_contract(self, path: str, text: str | None) -> None:
        if text is None:
            self.contracts.pop(path, None)
        else:
            self.contracts[path] = text
        self.contracts_changed.emit()

    def set_check_result(self, result) -> None:
        self.check_result = result
        self.check_changed.emit()

    # ---- dirty state -------------------------------------------------------------------------
    def _on_clean_changed(self, clean: bool) -> None:
        self.dirty_changed.emit(self._extra_dirty or not clean)

    def is_dirty(self) -> bool:
        return self._extra_dirty or not self.undo_stack.isClean()

    def mark_saved(self, path: Path) -> None:
        self.project_path = Path(path)
        self._extra_dirty = False
        self.undo_stack.setClean()
        self.dirty_changed.emit(False)

    @property
    def title(self) -> str:
        if self.project_path is not None:
            name = self.project_path.name
        elif self.source is not None:
            name = describe_source(self.source)
        else:
            return "no model"
        return name + (" *" if self.is_dirty() else "")

    # ---- the project file --------------------------------------------------------------------
    def project_data(self) -> dict:
        return {
            "format": PROJECT_FORMAT,
            "application": "ember",
            "source": self.source,
            "edits": self.edits,
            "contracts": dict(sorted(self.contracts.items())),
            "runs": self.runs,
        }

    def save_project(self, path: str | os.PathLike) -> Path:
        """Write the project atomically (a temporary file beside it, then a rename)."""
        path = Path(path)
        if not path.name.endswith(PROJECT_SUFFIX):
            path = path.with_name(path.name + PROJECT_SUFFIX)
        write_json_atomic(path, self.project_data())
        self.mark_saved(path)
        return path

    def autosave_path(self) -> Path | None:
        if self.project_path is None:
            return None
        return self.project_path.with_name(self.project_path.name + ".autosave")


def describe_source(source: dict) -> str:
    kind = source.get("kind")
    if kind == "example":
        return f"example {source.get('name')}"
    if kind == "script":
        return f"{Path(source.get('path', '?')).name}:{source.get('factory', 'build')}"
    if kind == "checkpoint":
        return f"{Path(source.get('path', '?')).name} into {describe_source(source.get('architecture') or {})}"
    return str(kind)


def write_json_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_project(path: str | os.PathLike) -> dict:
    """Read and validate a project file; a `ProjectError` says what is wrong and where."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProjectError(f"{path}: no such project file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProjectError(f"{path}: not a project file (expected JSON): {e}") from None
    if not isinstance(data, dict):
        raise ProjectError(f"{path}: expected a JSON object at the top, found {type(data).__name__}")
    fmt = data.get("format")
    if fmt != PROJECT_FORMAT:
        raise ProjectError(f"{path}: expected project format {PROJECT_FORMAT}, found {fmt!r}")
    source = data.get("source")
    if not isinstance(source, dict) or "kind" not in source:
        raise ProjectError(f"{path}: 'source' must be an object with a 'kind', found {source!r}")
    for key, typ in (("edits", list), ("contracts", dict), ("runs", list)):
        value = data.setdefault(key, typ())
        if not isinstance(value, typ):
            raise ProjectError(f"{path}: {key!r} must be a {typ.__name__}, found {type(value).__name__}")
    return data
