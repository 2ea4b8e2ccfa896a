"""Per-module gradient norms while a run trains: one row per module, indented by depth, with
the L2 norm of the gradients of every parameter below it and a bar on a log scale. A module
whose parameters got no gradient (frozen) reads 'frozen' in grey and its bar stays empty.
"""
from __future__ import annotations

import math

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem

from ..common import monospace_font

BAR_CELLS = 16
FROZEN = "frozen"


def norm_text(norm: float | None) -> str:
    return FROZEN if norm is None else f"{norm:.3e}"


def bar_text(norm: float | None, largest: float) -> str:
    """A bar as long as the norm's place on a log scale spanning 6 decades below `largest`."""
    if norm is None or norm <= 0 or largest <= 0 or not math.isfinite(norm):
        return ""
    frac = 1.0 + math.log10(norm / largest) / 6.0
    n = max(1, int(round(max(0.0, min(1.0, frac)) * BAR_CELLS)))
    return "█" * n


class GradNormTable(QTableWidget):
    def __init__(self, parent=None):
        super().__init__(0, 3, parent)
        self.setObjectName("grad-norms")
        self.setHorizontalHeaderLabels(["Module", "Grad norm", ""])
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        self.setShowGrid(False)
        h = self.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        h.setStretchLastSection(True)
        self.setToolTip("L2 norm of the gradients below each module at the last sample; frozen modules get none")
        self._paths: list[str] = []
        self._mono = monospace_font()
        self.norms: dict[str, float | None] = {}

    def set_norms(self, norms: dict[str, float | None]) -> None:
        """Show `norms` (module path -> norm, None when frozen), in the dict's order."""
        self.norms = dict(norms)
        paths = list(norms)
        if paths != self._paths:
            self._paths = paths
            self.setRowCount(len(paths))
            for row, path in enumerate(paths):
                depth = path.count(".") + 1 if path else 0
                name = (path.rsplit(".", 1)[-1] if path else "(model)")
                item = QTableWidgetItem("  " * depth + name)
                item.setToolTip(path or "(the whole model)")
                self.setItem(row, 0, item)
                for col in (1, 2):
                    cell = QTableWidgetItem("")
                    cell.setFont(self._mono)
                    self.setItem(row, col, cell)
                self.item(row, 1).setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        finite = [v for v in norms.values() if v is not None and math.isfinite(v)]
        largest = max(finite) if finite else 0.0
        grey = QBrush(QColor("#8a8f98"))
        normal = QBrush(self.palette().text().color())
        bar = QBrush(QColor("#1f77b4"))
        for row, path in enumerate(paths):
            v = norms[path]
            frozen = v is None
            self.item(row, 1).setText(norm_text(v))
            self.item(row, 2).setText(bar_text(v, largest))
            for col in range(3):
                it = self.item(row, col)
                it.setForeground(grey if frozen else (bar if col == 2 else normal))
                f = QFont(it.font())
                f.setItalic(frozen)
                it.setFont(f)

    def row_of(self, path: str) -> int:
        return self._paths.index(path)

    def text_at(self, path: str, column: int = 1) -> str:
        return self.item(self.row_of(path), column).text()
