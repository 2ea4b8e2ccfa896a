"""The configuration form of the selected node, generated from its kind's fields.

Each field of the node's `…Config` dataclass gets an editor for its type: a check box for a
bool, a combo box for an enum (and padding's Valid / Same), a line edit for everything else.
What the user types is validated as they type (the error shows under the field); a valid value
is emitted when the edit is finished (Enter or leaving the field) as `field_edited(node, field,
value)`. Renaming emits `rename_requested(old, new)`. The node's own problem (a shape that does
not fit, a configuration the layer refuses) shows at the top, its shapes and what its input sizes
must satisfy below it; where the incoming tensor fixes a setting that differs (a Linear's
`d_input`), a button offers the input's value (emitted as `field_edited` like a typed one). The
form changes nothing itself.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QLabel, QLineEdit, QPushButton, QScrollArea,
                               QVBoxLayout, QWidget)

from engine.design import FieldError, NodeSpec, NodeState
from engine.design.shapes import fields_from_input

from ..common import ErrorLabel, monospace_font


class ConfigForm(QWidget):
    field_edited = Signal(str, str, object)
    rename_requested = Signal(str, str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.node: str | None = None
        self.spec: NodeSpec | None = None
        self.values: dict = {}
        self.editors: dict[str, QWidget] = {}
        self.errors: dict[str, ErrorLabel] = {}
        self.title = QLabel("Select a node to edit it.")
        self.title.setObjectName("form-title")
        self.title.setWordWrap(True)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setObjectName("form-summary")
        self.shapes = QLabel("")
        self.shapes.setFont(monospace_font())
        self.shapes.setObjectName("form-shapes")
        self.shapes.setWordWrap(True)
        self.shapes.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.node_error = ErrorLabel()
        self.node_error.setObjectName("node-error")
        self.fill = QPushButton("")
        self.fill.setObjectName("form-fill")
        self.fill.hide()
        self.fill.clicked.connect(self._fill_from_input)
        self._fills: dict = {}
        self.body = QWidget()
        self.form = QFormLayout(self.body)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.body)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.summary)
        layout.addWidget(self.node_error)
        layout.addWidget(self.shapes)
        layout.addWidget(self.fill)
        layout.addWidget(scroll, 1)
        self.clear()

    # ------------------------------------------------------------------ showing
    def clear(self) -> None:
        self.node, self.spec, self.values = None, None, {}
        self._reset_form()
        self.title.setText("Select a node to edit it.")
        self.summary.setText("")
        self.shapes.setText("")
        self._show_fills({})
        self.node_error.show_error(None)

    def _reset_form(self) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        self.editors = {}
        self.errors = {}
        # a fresh name editor (removeRow deleted the old one)
        self.name_edit = QLineEdit(self.body)
        self.name_edit.setObjectName("field-name")
        self.name_edit.hide()
        self.name_error = ErrorLabel(self.body)
        self.name_edit.textChanged.connect(self._name_typed)
        self.name_edit.editingFinished.connect(self._name_finished)

    def set_node(self, name: str, spec: NodeSpec, values: dict, state: NodeState | None = None) -> None:
        """Show the node's fields. Re-showing the same node updates the editors in place (focus stays)."""
        if self.node == name and self.spec is spec and set(self.editors) == {f.name for f in spec.fields}:
            self.values = dict(values)
            self._show_state(state)
            for f in spec.fields:
                if self._editor_text(f.name) != self._value_text(f.name, values.get(f.name)):
                    self._set_editor_value(f.name, values.get(f.name))
            return
        self.node, self.spec, self.values = name, spec, dict(values)
        self._reset_form()
        self.title.setText(f"<b>{name}</b> — {spec.kind}")
        self.summary.setText(spec.summary)
        self.name_edit.setText(name)
        self.form.addRow("name", _column(self.name_edit, self.name_error))
        self.name_edit.show()
        for f in spec.fields:
            editor = self._make_editor(f)
            err = ErrorLabel()
            err.setObjectName(f"error-{f.name}")
            self.editors[f.name] = editor
            self.errors[f.name] = err
            label = f.name + ("" if not f.required else " *")
            self.form.addRow(label, _column(editor, err))
            self._set_editor_value(f.name, values.get(f.name))
        if not spec.fields:
            self.form.addRow(QLabel("This node has no settings."))
        self._show_state(state)

    def _show_state(self, state: NodeState | None) -> None:
        self.node_error.show_error(state.error if state is not None else None)
        lines = []
        if state is not None:
            for p, t in state.inputs.items():
                lines.append(f"in  {p}: {t.text()}")
            for p, t in (state.outputs or {}).items():
                lines.append(f"out {p}: {t.text()}")
            for c in state.constraint_texts():  # what the run-time sizes must satisfy
                lines.append(f"needs {c}")
            if state.blocked:
                lines.append("waiting for an input upstream")
        self.shapes.setText("\n".join(lines))
        self._show_fills(fields_from_input(self.spec, self.values, state) if self.spec is not None else {})

    def _show_fills(self, fills: dict) -> None:
        self._fills = dict(fills)
        if fills:
            what = ", ".join(f"{k} = {v}" for k, v in fills.items())
            self.fill.setText(f"Use {what} from the input")
        self.fill.setVisible(bool(fills))

    def _fill_from_input(self) -> None:
        if self.node is None:
            return
        for name, value in list(self._fills.items()):
            self.field_edited.emit(self.node, name, value)

    def _editor_text(self, name: str) -> str:
        w = self.editors[name]
        if isinstance(w, QCheckBox):
            return "true" if w.isChecked() else "false"
        if isinstance(w, QComboBox):
            return w.currentText()
        return w.text()

    def _value_text(self, name: str, value) -> str:
        w = self.editors[name]
        if isinstance(w, QComboBox):
            return "" if value is None else str(value)
        if isinstance(w, QCheckBox):
            return "true" if value else "false"
        return self.spec.field(name).to_text(value)

    def _make_editor(self, f) -> QWidget:
        if f.kind == "bool" and not f.optional:
            w = QCheckBox()
            w.toggled.connect(lambda on, name=f.name: self._commit(name, bool(on)))
        elif f.kind == "enum":
            w = QComboBox()
            if f.optional:
                w.addItem("")
            w.addItems(list(f.choices))
            w.activated.connect(lambda _i, name=f.name: self._combo_changed(name))
        else:
            w = QLineEdit()
            w.setPlaceholderText(f.expected())
            w.textChanged.connect(lambda text, name=f.name: self._typed(name, text))
            w.editingFinished.connect(lambda name=f.name: self._finished(name))
        w.setObjectName(f"field-{f.name}")
        w.setToolTip(f.help or f.expected())
        return w

    def _set_editor_value(self, name: str, value) -> None:
        w = self.editors[name]
        f = self.spec.field(name)
        w.blockSignals(True)
        try:
            if isinstance(w, QCheckBox):
                w.setChecked(bool(value))
            elif isinstance(w, QComboBox):
                w.setCurrentText("" if value is None else str(value))
            else:
                w.setText(f.to_text(value))
        finally:
            w.blockSignals(False)
        self.errors[name].show_error(None)

    # ------------------------------------------------------------------ editing
    def editor(self, name: str) -> QWidget:
        return self.name_edit if name == "name" else self.editors[name]

    def field_error(self, name: str) -> str:
        return self.name_error.error() if name == "name" else self.errors[name].error()

    def _parse(self, name: str, text: str):
        return self.spec.field(name).parse(text)

    def _typed(self, name: str, text: str) -> None:
        try:
            self._parse(name, text)
            self.errors[name].show_error(None)
        except FieldError as e:
            self.errors[name].show_error(str(e))

    def _finished(self, name: str) -> None:
        if self.spec is None or name not in self.editors:
            return
        text = self.editors[name].text()
        try:
            value = self._parse(name, text)
        except FieldError as e:
            self.errors[name].show_error(str(e))
            return
        self._commit(name, value)

    def _combo_changed(self, name: str) -> None:
        text = self.editors[name].currentText()
        self._commit(name, None if text == "" else text)

    def _commit(self, name: str, value) -> None:
        if self.node is None or self.values.get(name) == value:
            return
        self.values[name] = value
        self.field_edited.emit(self.node, name, value)

    def _name_typed(self, text: str) -> None:
        from engine.design import DesignError, check_node_name  # noqa: PLC0415

        try:
            check_node_name(text.strip())
            self.name_error.show_error(None)
        except DesignError as e:
            self.name_error.show_error(str(e))

    def _name_finished(self) -> None:
        new = self.name_edit.text().strip()
        if self.node is None or new == self.node or self.name_error.error():
            return
        self.rename_requested.emit(self.node, new)

    def show_name_error(self, message: str) -> None:
        """The app's answer to a refused rename (a taken name, ...)."""
        self.name_error.show_error(message)

    def focus_name(self) -> None:
        self.name_edit.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.name_edit.selectAll()


def _column(editor: QWidget, error: QLabel) -> QWidget:
    w = QWidget()
    lay = QVBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(1)
    lay.addWidget(editor)
    lay.addWidget(error)
    return w
