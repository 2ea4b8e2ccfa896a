"""Small pieces the views share: the monospace font, an in-place error label, number format."""
from __future__ import annotations

from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import QLabel


def monospace_font(point_size: int | None = None) -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setStyleHint(QFont.StyleHint.Monospace)
    if point_size:
        font.setPointSize(point_size)
    return font


class ErrorLabel(QLabel):
    """A red line of text placed next to the input it is about; hidden while there is no error."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(self.textInteractionFlags() | self.textInteractionFlags().TextSelectableByMouse)
        self.setStyleSheet("color: #d04437;")
        self.setObjectName("error")
        self.hide()

    def show_error(self, text: str | None) -> None:
        if text:
            self.setText(text)
            self.show()
        else:
            self.clear()
            self.hide()

    def error(self) -> str:
        return self.text() if not self.isHidden() else ""


def count(n: int) -> str:
    """An integer with thousands separators: 36618 -> '36,618'."""
    return f"{int(n):,}"
