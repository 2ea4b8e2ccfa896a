"""The parameter-group dialog: choose parameters by regex, path or predicate, see which match as
you type, and freeze, unfreeze or stop their gradients. `GroupSelector` is the choosing part,
shared with the LoRA dialog."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.module import ParamGroup
from engine.module.summary import param_trainable

from .common import ErrorLabel, count, monospace_font

MODES = [("regex", "Regex"), ("path", "Exact path"), ("predicate", "Path contains"), ("all", "All parameters")]
OPS = [("freeze", "Freeze"), ("unfreeze", "Unfreeze"), ("no_grad", "No grad")]
PREVIEW_LIMIT = 500


class GroupSelector(QWidget):
    """Mode and pattern, with the error shown under the pattern. `changed` on every edit."""

    changed = Signal()

    def __init__(self, parent=None, *, mode: str = "regex", text: str = ""):
        super().__init__(parent)
        self.mode = QComboBox()
        self.mode.setObjectName("mode")
        for key, label in MODES:
            self.mode.addItem(label, key)
        self.mode.setCurrentIndex([k for k, _ in MODES].index(mode))
        self.pattern = QLineEdit(text)
        self.pattern.setObjectName("pattern")
        self.pattern.setFont(monospace_font())
        self.pattern.setPlaceholderText(r"e.g. ^blocks\.0\.  or  (^|\.)bias$")
        self.error = ErrorLabel()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.mode)
        row.addWidget(self.pattern, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.error)
        self.mode.currentIndexChanged.connect(self._changed)
        self.pattern.textChanged.connect(self._changed)
        self._sync_enabled()

    def _sync_enabled(self) -> None:
        self.pattern.setEnabled(self.mode.currentData() != "all")

    def _changed(self, *_):
        self._sync_enabled()
        self.changed.emit()

    def spec(self) -> dict:
        mode = self.mode.currentData()
        text = self.pattern.text()
        if mode == "all":
            return {"kind": "all"}
        if mode == "regex":
            return {"kind": "regex", "pattern": text}
        if mode == "path":
            return {"kind": "path", "path": text.strip()}
        return {"kind": "predicate", "text": text}

    def select(self, params: list[tuple[str, Any]]) -> list[tuple[str, Any]] | None:
        """The parameters the current choice selects, or None (the error is shown) when the
        choice is not usable."""
        if self.mode.currentData() != "all" and not self.pattern.text().strip():
            self.error.show_error("type a pattern to select parameters")
            return None
        try:
            group = ParamGroup.from_spec(self.spec())
        except ValueError as e:
            self.error.show_error(str(e))
            return None
        matches = [(p, v) for p, v in params if group.matches(v.id, p)]
        if not matches:
            hint = " (an exact path names one parameter, e.g. head.weight)" if self.mode.currentData() == "path" else ""
            self.error.show_error(f"no parameter matches{hint}")
            return None
        self.error.show_error(None)
        return matches


def fill_preview(table: QTableWidget, rows: list[tuple[str, ...]]) -> None:
    shown = rows[:PREVIEW_LIMIT]
    table.setRowCount(len(shown))
    for r, row in enumerate(shown):
        for c, text in enumerate(row):
            table.setItem(r, c, QTableWidgetItem(text))


def preview_table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setObjectName("preview")
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().setVisible(False)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.setFont(monospace_font())
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return t


def shape_text(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


class GroupDialog(QDialog):
    """Emits `group_chosen(op, spec)` when accepted; `spec` is a group spec's JSON form (see
    `ParamGroup.from_spec`; the app reads it as `app.core.schema.GroupSpec`)."""

    group_chosen = Signal(str, dict)

    def __init__(self, module: Any, parent=None, *, mode: str = "regex", text: str = "", op: str = "freeze"):
        super().__init__(parent)
        self.setWindowTitle("Parameter Group")
        self.setObjectName("group-dialog")
        self.params = module.named_params()
        self.selector = GroupSelector(mode=mode, text=text)
        self.mode, self.pattern, self.error = self.selector.mode, self.selector.pattern, self.selector.error
        self.op = QComboBox()
        self.op.setObjectName("op")
        for key, label in OPS:
            self.op.addItem(label, key)
        self.op.setCurrentIndex([k for k, _ in OPS].index(op))
        self.summary = QLabel("")
        self.summary.setObjectName("summary")
        self.preview = preview_table(["Path", "Shape", "Trainable now"])
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        form = QFormLayout()
        form.addRow("Select", self.selector)
        form.addRow("Operation", self.op)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.summary)
        layout.addWidget(self.preview, 1)
        layout.addWidget(self.buttons)
        self.resize(640, 480)
        self.selector.changed.connect(self._update)
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        self.matches: list[tuple[str, Any]] = []
        self._update()

    def ok_button(self):
        return self.buttons.button(QDialogButtonBox.StandardButton.Ok)

    def _update(self) -> None:
        matches = self.selector.select(self.params)
        self.matches = matches or []
        self.ok_button().setEnabled(matches is not None)
        if matches:
            n = sum(v.numel() for _, v in matches)
            total = sum(v.numel() for _, v in self.params)
            self.summary.setText(f"{len(matches)} of {len(self.params)} parameters match "
                                 f"({count(n)} of {count(total)} values)")
        else:
            self.summary.setText("")
        fill_preview(self.preview, [(p, shape_text(v.shape), "yes" if param_trainable(v) else "no")
                                    for p, v in self.matches])

    def preview_paths(self) -> list[str]:
        return [self.preview.item(r, 0).text() for r in range(self.preview.rowCount())]

    def _accept(self) -> None:
        if not self.ok_button().isEnabled():
            return
        self.group_chosen.emit(self.op.currentData(), self.selector.spec())
        self.accept()
