"""The selected module's display text (Burn's ModuleDisplay), with a live control for every
DisplaySettings option."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QGridLayout, QLabel, QPlainTextEdit, QSpinBox, QToolButton, QVBoxLayout,
                               QWidget)

from engine.module import DisplaySettings, Module
from engine.module.display import format_value

from .common import monospace_font


class DisplayPanel(QWidget):
    settings_changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.title = QLabel("")
        self.title.setObjectName("display-title")
        self.show_all = self._option("All attributes", "show_all_attributes", "All attributes (not only those a module chooses to show)")
        self.new_line = self._option("New lines", "new_line_after_attribute", "New line after each attribute")
        self.num_params = self._option("Counts", "show_num_parameters", "Parameter counts")
        self.param_ids = self._option("Ids", "show_param_id", "Parameter ids")
        self.indent = QSpinBox()
        self.indent.setObjectName("indentation_size")
        self.indent.setRange(-1, 16)
        self.indent.setValue(-1)
        self.indent.setPrefix("indent ")
        self.indent.setSpecialValueText("indent: own")
        self.indent.setToolTip("Spaces per level; at the minimum, each module's own setting (2 by default)")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy the display text to the clipboard")
        self.text = QPlainTextEdit()
        self.text.setObjectName("display-text")
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(monospace_font())
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                          | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        controls = QGridLayout()  # two rows, so that the panel stays narrow beside the docks
        controls.addWidget(self.show_all, 0, 0)
        controls.addWidget(self.new_line, 0, 1)
        controls.addWidget(self.indent, 0, 2)
        controls.addWidget(self.num_params, 1, 0)
        controls.addWidget(self.param_ids, 1, 1)
        controls.addWidget(self.copy_button, 1, 2, Qt.AlignmentFlag.AlignRight)
        controls.setColumnStretch(3, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.title)
        layout.addLayout(controls)
        layout.addWidget(self.text, 1)
        for box in (self.show_all, self.new_line, self.num_params, self.param_ids):
            box.stateChanged.connect(self._on_settings)
        self.indent.valueChanged.connect(self._on_settings)
        self.copy_button.clicked.connect(self.copy)
        self._value: Any = None
        self._path = ""
        self._pending = False

    @staticmethod
    def _option(text: str, name: str, what: str) -> QCheckBox:
        box = QCheckBox(text)
        box.setObjectName(name)
        box.setTristate(True)
        box.setCheckState(Qt.CheckState.PartiallyChecked)
        box.setToolTip(f"{what}: checked forces it on, unchecked off; partly checked leaves each module its own "
                       f"setting (a module's custom display, e.g. Linear on one line, wins)")
        return box

    def settings(self) -> DisplaySettings:
        """The settings the controls force; options left at "each module's own" stay unset, so
        modules' custom settings apply as Burn applies them."""
        s = DisplaySettings()
        for box, method in ((self.show_all, s.with_show_all_attributes),
                            (self.new_line, DisplaySettings.with_new_line_after_attribute),
                            (self.num_params, DisplaySettings.with_show_num_parameters),
                            (self.param_ids, DisplaySettings.with_show_param_id)):
            state = box.checkState()
            if state != Qt.CheckState.PartiallyChecked:
                s = getattr(s, method.__name__)(state == Qt.CheckState.Checked)
        if self.indent.value() >= 0:
            s = s.with_indentation_size(self.indent.value())
        return s

    def set_value(self, value: Any, path: str = "") -> None:
        """Show `value` (a module, container or parameter) found at `path`.

        Rendering waits for the event loop (several changes in a row render once) and for the
        panel to be visible; `display_text()` renders at once.
        """
        self._value = value
        self._path = path
        self._schedule()

    def _on_settings(self, *_):
        self.settings_changed.emit()
        self._schedule()

    def _schedule(self) -> None:
        if not self._pending:
            self._pending = True
            QTimer.singleShot(0, self._render_if_pending)

    def _render_if_pending(self) -> None:
        if self._pending and self.isVisible():
            self.render_now()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._pending:
            self.render_now()

    def render_now(self) -> None:
        self._pending = False
        value = self._value
        if value is None:
            self.title.setText("")
            self.text.setPlainText("")
            return
        self.title.setText(self._path or "the whole model")
        try:
            if isinstance(value, Module):
                text = value.format(self.settings())
            else:
                text = format_value(value, self.settings())
        except Exception as e:  # a custom display that raises must not take the window down
            text = f"the display of {type(value).__name__} raised {type(e).__name__}: {e}"
        self.text.setPlainText(text)

    def display_text(self) -> str:
        if self._pending:
            self.render_now()
        return self.text.toPlainText()

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.display_text())
