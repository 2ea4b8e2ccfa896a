"""A compact progress line for a background task: what it does, how far, and a Cancel button."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QToolButton, QWidget


class TaskProgress(QWidget):
    cancel_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel()
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setMaximumWidth(180)
        self.bar.setTextVisible(False)
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.clicked.connect(self._cancel)
        layout.addWidget(self.label)
        layout.addWidget(self.bar)
        layout.addWidget(self.cancel_button)
        self.hide()

    def begin(self, title: str) -> None:
        self.label.setText(title)
        self.bar.setValue(0)
        self.cancel_button.setEnabled(True)
        self.show()

    def set_progress(self, fraction: float) -> None:
        self.bar.setValue(int(round(fraction * 1000)))

    def set_status(self, text: str) -> None:
        self.label.setText(text)

    def end(self) -> None:
        self.hide()

    def _cancel(self) -> None:
        self.cancel_button.setEnabled(False)
        self.label.setText(self.label.text() + " (cancelling…)")
        self.cancel_requested.emit()
