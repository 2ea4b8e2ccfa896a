"""The document: the model a window shows, where it came from, and what the user did to it.

It holds the current module *value*. Widgets never change engine objects: `app/` turns what the
user asked for into an undo command, and the command replaces the document's module. Every view
listens to `model_changed`.

A project is one `.ember.json` file holding the source of the model, the replayable edits made
since, the edited shape contracts, and the training runs (`app.core.schema.Project`). Weights
never live in it.

The document also owns what is known about the module without reading a value: its statistics
(`stats`, one metadata pass per model change, read by the tree, the inspector, the status bar
and the actions) and each module's effective shape contract (`contract_for`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from engine.module.contracts import docstring_contract
from engine.module.summary import ModelStats

from .commands import ContractCommand, ModuleCommand
from .core.project import PROJECT_SUFFIX, project_data_at, write_json_atomic
from .core.schema import Edit, Project, RunRecord, Source, describe_source


class Document(QObject):
    model_changed = Signal()
    contracts_changed = Signal()
    check_changed = Signal()
    source_changed = Signal()
    runs_changed = Signal()
    dirty_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.undo_stack = QUndoStack(self)
        self.module: Any = None
        self.stats = ModelStats(None)  # of `module`, made again whenever it changes
        self.source: Source | None = None
        self.project_path: Path | None = None
        self.base_edits: list[Edit] = []  # replayed from the project file when it was opened
        self.contracts: dict[str, str] = {}  # module path -> contract text edited by the user
        self.runs: list[RunRecord] = []
        self.check_result = None  # the last contract check (engine.module.contracts.CheckResult)
        self._extra_dirty = False  # differs from the file outside the undo stack (a recovered autosave)
        self.undo_stack.cleanChanged.connect(self._on_clean_changed)

    # ---- the model -----------------------------------------------------------------------
    def set_model(self, module: Any, source: Source | None, *, edits: list[Edit] | None = None,
                  contracts: dict[str, str] | None = None, project_path: Path | None = None,
                  runs: list[RunRecord] | None = None, dirty: bool = False) -> None:
        """Start over with a new model: the undo history is cleared. `dirty` marks a document
        that differs from its file from the start (one recovered from an autosave)."""
        self.undo_stack.clear()
        self.module = module
        self.stats = ModelStats(module)
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
        self.runs_changed.emit()
        self.dirty_changed.emit(self.is_dirty())

    def push_module(self, text: str, after: Any, edit: Edit | None = None) -> ModuleCommand:
        """Replace the module by `after` as one undoable step; `edit` is what the project file
        replays (None for a step it cannot replay)."""
        if self.module is None:
            raise RuntimeError("no model is open")
        command = ModuleCommand(self, text, self.module, after, edit)
        self.undo_stack.push(command)
        return command

    def replace_module(self, module: Any) -> None:
        """Make `module` the document's model without an undo step: what `ModuleCommand` calls
        on redo and undo (everything else pushes a step: `push_module`)."""
        self.module = module
        self.stats = ModelStats(module)
        if self.check_result is not None:
            self.check_result = None
            self.check_changed.emit()
        self.model_changed.emit()

    # ---- edits -----------------------------------------------------------------------------
    def applied_commands(self) -> list:
        """The commands in effect now (those before the undo stack's index)."""
        return [self.undo_stack.command(i) for i in range(self.undo_stack.index())]

    @property
    def edits(self) -> list[Edit]:
        """The replayable edits since the source: from the project, then the applied commands."""
        return self.base_edits + [c.edit for c in self.applied_commands() if getattr(c, "edit", None)]

    # ---- contracts ---------------------------------------------------------------------------
    def set_contract(self, path: str, text: str | None) -> None:
        """Edit (or with `None`, reset) one module's contract, as an undoable step."""
        before = self.contracts.get(path)
        if before == text:
            return
        self.undo_stack.push(ContractCommand(self, path, before, text))

    def apply_contract(self, path: str, text: str | None) -> None:
        """Set (None: reset) one module's contract without an undo step: what `ContractCommand`
        calls (everything else pushes a step: `set_contract`)."""
        if text is None:
            self.contracts.pop(path, None)
        else:
            self.contracts[path] = text
        self.contracts_changed.emit()

    def contract_for(self, path: str, module: Any) -> str | None:
        """The contract in effect at `path`: the user's edit, else the module's docstring's."""
        return self.contracts.get(path) or docstring_contract(module)

    def set_check_result(self, result) -> None:
        self.check_result = result
        self.check_changed.emit()

    # ---- runs ----------------------------------------------------------------------------------
    def record_run(self, run: RunRecord) -> None:
        """Remember a training run (replacing the record of the same folder): the project file
        keeps it, so the document becomes dirty."""
        runs = [r for r in self.runs if r.folder != run.folder]
        at = next((i for i, r in enumerate(self.runs) if r.folder == run.folder), len(runs))
        runs.insert(at, run)
        self.runs = runs
        self._extra_dirty = True
        self.runs_changed.emit()
        self.dirty_changed.emit(True)

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
    def project(self) -> Project:
        return Project(self.source, self.edits, dict(self.contracts), list(self.runs))

    def project_data(self) -> dict:
        """The project file's JSON."""
        return self.project().to_json()

    def save_project(self, path: str | os.PathLike) -> Path:
        """Write the project atomically (a temporary file beside it, then a rename)."""
        path = Path(path)
        if not path.name.endswith(PROJECT_SUFFIX):
            path = path.with_name(path.name + PROJECT_SUFFIX)
        write_json_atomic(path, project_data_at(self.project(), path))  # paths relative to the file
        self.mark_saved(path)
        return path

    def autosave_path(self) -> Path | None:
        if self.project_path is None:
            return None
        return self.project_path.with_name(self.project_path.name + ".autosave")

