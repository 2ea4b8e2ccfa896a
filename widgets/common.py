"""Small pieces the views share: the monospace font, an in-place error label, number format."""
from __future__ import annotations

from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget


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


def titled_columns(n: int, make, name: str) -> tuple[QSplitter, list[QLabel], list]:
    """`n` side-by-side columns, each a title over the widget `make(i)` returns (the Generate tab's
    compared outputs and chat transcripts); no column can be collapsed away. Object names
    `<name>-title-<i>`. Returns the splitter, the titles and the widgets."""
    split = QSplitter(Qt.Orientation.Horizontal)
    titles, widgets = [], []
    for i in range(n):
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        title = QLabel("")
        title.setObjectName(f"{name}-title-{i}")
        widget = make(i)
        col.addWidget(title)
        col.addWidget(widget, 1)
        titles.append(title)
        widgets.append(widget)
        split.addWidget(box)
        split.setCollapsible(i, False)
    return split, titles, widgets
