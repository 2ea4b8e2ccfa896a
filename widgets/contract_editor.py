"""The shape-contract editor of the selected module, and the Check button with its report.

The contract is text with named axes (`[batch, 784] -> [batch, 10]`); the app gives a
`validator(text) -> error or None` so that a typo is reported under the field as you type. The
widget emits what the user asked for: apply, reset to the docstring's, or check the model with
an example input.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QVBoxLayout,
                               QWidget)

from .common import ErrorLabel, monospace_font

STATUS_STYLE = {"ok": "color: #2e9d4a;", "violated": "color: #d04437;"}


class ContractEditor(QWidget):
    contract_applied = Signal(str, str)  # path, text
    contract_reset = Signal(str)  # path
    check_requested = Signal(str)  # the example input text

    def __init__(self, parent=None):
        super().__init__(parent)
        self.path: str | None = None
        self._validator: Callable[[str], str | None] = lambda text: None
        self._input_validator: Callable[[str], str | None] = lambda text: None
        mono = monospace_font()
        self.title = QLabel("Select a module to see its contract.")
        self.title.setObjectName("contract-title")
        self.docstring = QLabel("")
        self.docstring.setObjectName("contract-docstring")
        self.docstring.setFont(mono)
        self.docstring.setWordWrap(True)
        self.edit = QLineEdit()
        self.edit.setObjectName("contract")
        self.edit.setFont(mono)
        self.edit.setPlaceholderText("[batch, 784] -> [batch, 10]")
        self.error = ErrorLabel()
        self.apply_button = QPushButton("Apply")
        self.apply_button.setObjectName("apply")
        self.reset_button = QPushButton("Reset to Docstring")
        self.reset_button.setObjectName("reset")
        self.input = QLineEdit()
        self.input.setObjectName("example-input")
        self.input.setFont(mono)
        self.input.setPlaceholderText("[2, 784]   or   int[2, 16]   or   example")
        self.input.setToolTip("The example input for Check: one shape per input tensor (random normal values), "
                              "int[...] for token ids, or 'example' for the example model's own input")
        self.input_error = ErrorLabel()
        self.check_button = QPushButton("Check")
        self.check_button.setObjectName("check")
        self.shapes_only = QCheckBox("Shapes only")
        self.shapes_only.setObjectName("shapes-only")
        self.shapes_only.setToolTip("Let shapes flow through each layer's shape rule: no layer runs and no "
                                    "parameter is allocated (the default for a model whose parameters are not "
                                    "allocated yet). Untick to run the example input through the real layers.")
        self.status = QLabel("")
        self.status.setObjectName("check-status")
        self.status.setWordWrap(True)
        self.report = QPlainTextEdit()
        self.report.setObjectName("check-report")
        self.report.setReadOnly(True)
        self.report.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.report.setFont(mono)
        self.report.setMaximumHeight(180)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.reset_button)
        buttons.addStretch(1)
        check_row = QHBoxLayout()
        check_row.addWidget(self.input, 1)
        check_row.addWidget(self.shapes_only)
        check_row.addWidget(self.check_button)
        form = QFormLayout()
        form.addRow("Docstring", self.docstring)
        form.addRow("Contract", self.edit)
        form.addRow("", self.error)
        form.addRow("", buttons)
        form.addRow("Example input", check_row)
        form.addRow("", self.input_error)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.title)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.report, 1)
        self.edit.textChanged.connect(self._validate)
        self.edit.returnPressed.connect(self._apply)
        self.apply_button.clicked.connect(self._apply)
        self.reset_button.clicked.connect(self._reset)
        self.input.textChanged.connect(self._validate_input)
        self.input.returnPressed.connect(self._check)
        self.check_button.clicked.connect(self._check)
        self.set_target(None, None, None, False)

    def set_validators(self, contract: Callable[[str], str | None], example_input: Callable[[str], str | None]) -> None:
        self._validator = contract
        self._input_validator = example_input

    def set_target(self, path: str | None, contract: str | None, docstring: str | None, edited: bool) -> None:
        """Show the contract of the module at `path` (None: no module selected)."""
        self.path = path
        enabled = path is not None
        if path is None:
            self.title.setText("Select a module to see its contract.")
        else:
            self.title.setText(f"<b>{path or '(the whole model)'}</b>" + (" — edited" if edited else ""))
        self.docstring.setText(docstring or "(none)")
        self.edit.blockSignals(True)
        self.edit.setText(contract or "")
        self.edit.setCursorPosition(0)
        self.edit.blockSignals(False)
        self.error.show_error(None)
        for w in (self.edit, self.apply_button):
            w.setEnabled(enabled)
        self.reset_button.setEnabled(enabled and edited)
        self.apply_button.setEnabled(False)

    def set_shapes_only(self, on: bool) -> None:
        """The check mode's default for the model shown (the user may change it)."""
        self.shapes_only.setChecked(on)

    def set_example_input(self, text: str) -> None:
        if not self.input.text().strip():
            self.input.setText(text)

    def clear_example_input(self) -> None:
        """Another model was opened: the example input typed for the last one, and its error, go
        (the new model's default is filled in when it is shown)."""
        self.input.clear()
        self.input_error.show_error(None)

    def _validate(self, text: str) -> bool:
        err = self._validator(text) if text.strip() else "a contract is required (Reset to Docstring removes an edit)"
        self.error.show_error(err)
        self.apply_button.setEnabled(err is None and self.path is not None)
        return err is None

    def _validate_input(self, text: str) -> bool:
        err = self._input_validator(text)
        self.input_error.show_error(err)
        return err is None

    def _apply(self) -> None:
        if self.path is not None and self._validate(self.edit.text()):
            self.contract_applied.emit(self.path, self.edit.text().strip())

    def _reset(self) -> None:
        if self.path is not None:
            self.contract_reset.emit(self.path)

    def _check(self) -> None:
        if self._validate_input(self.input.text()):
            self.check_requested.emit(self.input.text().strip())

    def show_result(self, ok: bool | None, status: str, report: str) -> None:
        """Show a check's outcome (ok None: running or nothing yet)."""
        self.status.setText(status)
        self.status.setStyleSheet(STATUS_STYLE.get("ok" if ok else "violated", "") if ok is not None else "")
        self.report.setPlainText(report)
