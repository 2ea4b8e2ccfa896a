"""A form generated from a dataclass: one editor per field, chosen from the field's type, and
validation as the user types.

- `bool` -> check box; `int`, `float`, `str` -> a line edit parsed on every keystroke;
  `X | None` -> the same, where an empty box means None; a field with `choices` (or a
  `Literal`) -> a combo box; a nested dataclass -> a group box (checkable when optional)
  holding its own form.
- A field whose text does not parse shows the error right under it. When every field parses,
  the dataclass is built (its `__post_init__` checks run) and then `check(value)` (for example
  `lambda c: c.init()` for configs that validate in `init`); an error there is shown under the
  field it names, or under the form.

    form = DataclassForm(engine.optim.AdamConfig, options={"grad_clipping": FieldOptions(hidden=True)})
    form.validity_changed.connect(start_button.setEnabled)
    config = form.value()          # raises FormError when invalid
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QFormLayout, QGroupBox, QLineEdit, QVBoxLayout, QWidget

from engine.train.config_json import unwrap_optional

from ..common import ErrorLabel


class FormError(ValueError):
    """The form's content is not a valid value; `errors` maps field names ('' for the whole
    form) to messages."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" if k else v for k, v in self.errors.items()))


@dataclass
class FieldOptions:
    label: str | None = None
    choices: Sequence | None = None  # allowed values (shown as their str)
    hidden: bool = False  # not shown; the default (or given) value is kept
    type: Any = None  # overrides the annotation (e.g. `GradientClippingConfig | None` for an `object`)
    tooltip: str = ""
    options: dict | None = None  # FieldOptions of a nested dataclass's fields


_MISSING = dataclasses.MISSING


def _label(name: str) -> str:
    return name.replace("_", " ")


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if (value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6)) else f"{value:g}"
    return str(value)


class _Editor(QWidget):
    changed = Signal()

    def value(self):  # raises ValueError with a message for the user
        raise NotImplementedError

    def set_value(self, value) -> None:
        raise NotImplementedError

    def input_widget(self) -> QWidget:
        return self


class _TextEditor(_Editor):
    def __init__(self, kind, optional: bool, name: str):
        super().__init__()
        self.kind = kind
        self.optional = optional
        self.edit = QLineEdit()
        self.edit.setObjectName(f"field:{name}")
        if optional:
            self.edit.setPlaceholderText("none")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.edit)
        self.edit.textChanged.connect(lambda _t: self.changed.emit())

    def input_widget(self) -> QWidget:
        return self.edit

    def value(self):
        text = self.edit.text().strip()
        if not text:
            if self.optional:
                return None
            if self.kind is str:
                return ""
            raise ValueError(f"expected {_kind_text(self.kind)}, found nothing")
        if self.kind is int:
            try:
                return int(text.replace("_", ""), 10)
            except ValueError:
                raise ValueError(f"expected a whole number, found {text!r}") from None
        if self.kind is float:
            try:
                v = float(text)
            except ValueError:
                raise ValueError(f"expected a number (like 0.001 or 1e-3), found {text!r}") from None
            if not math.isfinite(v):
                raise ValueError(f"expected a finite number, found {text!r}")
            return v
        return text

    def set_value(self, value) -> None:
        self.edit.setText(_fmt(value))


def _kind_text(kind) -> str:
    return {int: "a whole number", float: "a number", str: "text"}.get(kind, getattr(kind, "__name__", str(kind)))


class _BoolEditor(_Editor):
    def __init__(self, label: str, name: str):
        super().__init__()
        self.box = QCheckBox()
        self.box.setObjectName(f"field:{name}")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.box)
        self.box.toggled.connect(lambda _b: self.changed.emit())

    def input_widget(self) -> QWidget:
        return self.box

    def value(self):
        return self.box.isChecked()

    def set_value(self, value) -> None:
        self.box.setChecked(bool(value))


class _ChoiceEditor(_Editor):
    def __init__(self, choices: Sequence, name: str):
        super().__init__()
        self.choices = list(choices)
        self.combo = QComboBox()
        self.combo.setObjectName(f"field:{name}")
        for c in self.choices:
            self.combo.addItem("none" if c is None else (c.name if isinstance(c, enum.Enum) else str(c)))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo)
        self.combo.currentIndexChanged.connect(lambda _i: self.changed.emit())

    def input_widget(self) -> QWidget:
        return self.combo

    def value(self):
        i = self.combo.currentIndex()
        if i < 0:
            raise ValueError("expected one of " + ", ".join(map(str, self.choices)))
        return self.choices[i]

    def set_value(self, value) -> None:
        for i, c in enumerate(self.choices):
            if c == value:
                self.combo.setCurrentIndex(i)
                return


class _NestedEditor(_Editor):
    def __init__(self, cls, optional: bool, label: str, name: str, options: dict | None):
        super().__init__()
        self.optional = optional
        self.group = QGroupBox(label)
        self.group.setObjectName(f"field:{name}")
        self.group.setCheckable(optional)
        self.form = DataclassForm(cls, options=options)
        inner = QVBoxLayout(self.group)
        inner.setContentsMargins(6, 2, 6, 2)
        inner.addWidget(self.form)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.group)
        self.group.toggled.connect(self._on_toggled)
        self.form.changed.connect(self.changed.emit)
        if optional:
            self.group.setChecked(False)
            self.form.setVisible(False)

    def _on_toggled(self, on: bool) -> None:
        self.form.setVisible(on)
        self.changed.emit()

    def input_widget(self) -> QWidget:
        return self.group

    def value(self):
        if self.optional and not self.group.isChecked():
            return None
        try:
            return self.form.value()
        except FormError as e:
            raise ValueError(str(e)) from None

    def set_value(self, value) -> None:
        if value is None or not dataclasses.is_dataclass(value):
            if self.optional:
                self.group.setChecked(False)
            return
        if self.optional:
            self.group.setChecked(True)
        self.form.set_value(value)


class DataclassForm(QWidget):
    """Editors for the fields of dataclass `cls`, validated as the user types."""

    changed = Signal()
    validity_changed = Signal(bool)

    def __init__(self, cls, value: Any = None, options: dict[str, FieldOptions] | None = None,
                 check: Callable[[Any], Any] | None = None, parent=None):
        super().__init__(parent)
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"DataclassForm: expected a dataclass, got {cls!r}")
        self.cls = cls
        self.check = check
        self.options = dict(options or {})
        self.editors: dict[str, _Editor] = {}
        self.error_labels: dict[str, ErrorLabel] = {}
        self._fixed: dict[str, Any] = {}  # hidden fields
        self._valid: bool | None = None
        self._errors: dict[str, str] = {}
        hints = typing.get_type_hints(cls)
        self.layout_ = QFormLayout(self)
        self.layout_.setContentsMargins(0, 0, 0, 0)
        self.layout_.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        initial = self._initial(value)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            opt = self.options.get(f.name, FieldOptions())
            tp = opt.type if opt.type is not None else hints.get(f.name, Any)
            editor = None if opt.hidden else self._make_editor(f.name, tp, opt)
            if editor is None:
                if f.name in initial:
                    self._fixed[f.name] = initial[f.name]
                continue
            label = opt.label or _label(f.name)
            if f.name in initial:
                editor.set_value(initial[f.name])
            if opt.tooltip:
                editor.input_widget().setToolTip(opt.tooltip)
            err = ErrorLabel()
            err.setObjectName(f"error:{f.name}")
            cell = QWidget()
            box = QVBoxLayout(cell)
            box.setContentsMargins(0, 0, 0, 0)
            box.setSpacing(1)
            box.addWidget(editor)
            box.addWidget(err)
            self.layout_.addRow(label if not isinstance(editor, _NestedEditor) else "", cell)
            self.editors[f.name] = editor
            self.error_labels[f.name] = err
            editor.changed.connect(self._on_changed)
        self.form_error = ErrorLabel()
        self.form_error.setObjectName("error:form")
        self.layout_.addRow(self.form_error)
        self.validate()

    # ---- construction -----------------------------------------------------------------------
    def _initial(self, value) -> dict:
        out = {}
        for f in dataclasses.fields(self.cls):
            if f.default is not _MISSING:
                out[f.name] = f.default
            elif f.default_factory is not _MISSING:  # type: ignore[misc]
                out[f.name] = f.default_factory()  # type: ignore[misc]
        if value is None:
            return out
        if isinstance(value, dict):
            out.update(value)
        elif dataclasses.is_dataclass(value):
            out.update({f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init})
        return out

    def _make_editor(self, name: str, tp, opt: FieldOptions) -> _Editor | None:
        base, optional = unwrap_optional(tp)
        label = opt.label or _label(name)
        if opt.choices is not None:
            return _ChoiceEditor(opt.choices, name)
        if typing.get_origin(base) is typing.Literal:
            return _ChoiceEditor(typing.get_args(base), name)
        if isinstance(base, type) and issubclass(base, enum.Enum):
            return _ChoiceEditor(list(base), name)
        if base is bool:
            return _BoolEditor(label, name)
        if base in (int, float, str):
            return _TextEditor(base, optional, name)
        if dataclasses.is_dataclass(base):
            return _NestedEditor(base, optional, label, name, opt.options)
        return None  # a type the form cannot edit: kept as given

    # ---- values ------------------------------------------------------------------------------
    def field_values(self) -> tuple[dict, dict[str, str]]:
        values, errors = dict(self._fixed), {}
        for name, editor in self.editors.items():
            try:
                values[name] = editor.value()
            except ValueError as e:
                errors[name] = str(e)
        return values, errors

    def _build(self) -> tuple[Any, dict[str, str]]:
        values, errors = self.field_values()
        if errors:
            return None, errors
        try:
            obj = self.cls(**values)
            if self.check is not None:
                self.check(obj)
        except (ValueError, TypeError) as e:
            message = str(e)
            return None, {self._field_named_in(message): message}
        return obj, {}

    def _field_named_in(self, message: str) -> str:
        """The shown field a validation message is about ('' when it names none)."""
        for name in sorted(self.editors, key=len, reverse=True):
            if re.search(rf"\b{re.escape(name)}\b", message):
                return name
        return ""

    def value(self):
        """The dataclass the form describes; raises `FormError` when it is not valid."""
        obj, errors = self._build()
        if errors:
            raise FormError(errors)
        return obj

    def set_value(self, value) -> None:
        initial = self._initial(value)
        for name, editor in self.editors.items():
            if name in initial:
                editor.blockSignals(True)
                editor.set_value(initial[name])
                editor.blockSignals(False)
        for name in self._fixed:
            if name in initial:
                self._fixed[name] = initial[name]
        self.validate()

    def set_field(self, name: str, value) -> None:
        if name in self.editors:
            self.editors[name].set_value(value)
        else:
            self._fixed[name] = value
            self.validate()

    def set_row_visible(self, name: str, visible: bool) -> None:
        """Show or hide a field's row (label, editor and error); its value still counts."""
        editor = self.editors.get(name)
        if editor is not None:
            self.layout_.setRowVisible(editor.parentWidget(), visible)

    def field_widget(self, name: str) -> QWidget:
        """The input widget of a field (a line edit, check box, combo box or group box)."""
        return self.editors[name].input_widget()

    # ---- validation ----------------------------------------------------------------------------
    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def is_valid(self) -> bool:
        return not self._errors

    def validate(self) -> bool:
        _obj, errors = self._build()
        self._errors = errors
        for name, label in self.error_labels.items():
            label.show_error(errors.get(name))
        self.form_error.show_error(errors.get(""))
        valid = not errors
        if valid != self._valid:
            self._valid = valid
            self.validity_changed.emit(valid)
        return valid

    def _on_changed(self) -> None:
        self.validate()
        self.changed.emit()
