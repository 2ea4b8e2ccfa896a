"""The inspector: the selection's parameters and constants, and its freeze / LoRA state. For a
model from a Hugging Face folder the app passes each parameter's Hugging Face name in (a last
column, hidden for other models).

Reads metadata only: a lazy parameter shows as lazy and stays so.
"""
from __future__ import annotations

import itertools
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QHeaderView, QLabel, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from engine.module import Param
from engine.module.summary import ModelStats, param_trainable
from engine.module.tree import FieldKind, children, find, join, params

from .common import count, monospace_font
from .module_tree import byte_text, quantization, type_name

PARAM_COLUMNS = ["Path", "Id", "Shape", "DType", "Device", "State", "Require grad", "Reparameterized",
                 "Hugging Face name"]
HF_COLUMN = PARAM_COLUMNS.index("Hugging Face name")
CONST_COLUMNS = ["Path", "Shape", "DType", "Device"]
MAX_ROWS = 500


def _shape(dims) -> str:
    return "[" + ", ".join(str(int(d)) for d in dims) + "]"


def param_row(path: str, p: Param, hf_name: str = "") -> list[str]:
    if p.is_initialized():
        dtype = str(p.base().dtype)
        state = "initialized"
    else:  # the dtype it will have when read: a float parameter its device's default
        dtype = str(p.lazy_device().default_float_dtype) if p.kind == "float" else p.kind
        state = "lazy"
    r = p.reparameterization
    reparam = type(r).__name__ if r is not None else ""
    q = quantization(p)
    if q is not None:  # the type it is stored in, and its bytes
        dtype = f"{q[0]} ({byte_text(q[1])}; {dtype})"
    return [path, str(p.id), _shape(p.shape), dtype, str(p.lazy_device()), state,
            "yes" if param_trainable(p) else "no", reparam, hf_name]


class Inspector(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.header = QLabel("Nothing selected.")
        self.header.setObjectName("inspector-header")
        self.header.setWordWrap(True)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.state = QLabel("")
        self.state.setObjectName("inspector-state")
        self.state.setWordWrap(True)
        self.params = self._table(PARAM_COLUMNS)
        self.params.setObjectName("inspector-params")
        # a Hugging Face name, when the model has them, is shown next to the Ember path
        self.params.horizontalHeader().moveSection(HF_COLUMN, 1)
        self.params.setColumnHidden(HF_COLUMN, True)
        self.consts = self._table(CONST_COLUMNS)
        self.consts.setObjectName("inspector-consts")
        self.more = QLabel("")
        split = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(QLabel("<b>Parameters</b>"))
        tl.addWidget(self.params, 1)
        tl.addWidget(self.more)
        bottom = QWidget()
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(0, 0, 0, 0)
        bl.addWidget(QLabel("<b>Constants</b>"))
        bl.addWidget(self.consts, 1)
        split.addWidget(top)
        split.addWidget(bottom)
        split.setSizes([300, 100])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        layout.addWidget(self.state)
        layout.addWidget(split, 1)

    def sizeHint(self):
        return QSize(480, 420)

    @staticmethod
    def _table(columns: list[str]) -> QTableWidget:
        t = QTableWidget(0, len(columns))
        t.setHorizontalHeaderLabels(columns)
        t.verticalHeader().setVisible(False)
        t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        t.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        t.setAlternatingRowColors(True)
        t.setFont(monospace_font())
        t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        t.horizontalHeader().setStretchLastSection(True)
        return t

    def set_selection(self, module: Any, path: str | None, stats: ModelStats | None = None,
                      names: dict[str, str] | None = None) -> None:
        """Show what is at `path` in `module` (None: nothing selected). `names`: {parameter path:
        Hugging Face name}, shown in the last column (hidden when there are none)."""
        names = names or {}
        self.params.setColumnHidden(HF_COLUMN, not names)
        found = find(module, path) if module is not None and path is not None else None
        if found is None:
            self.header.setText("Nothing selected." if module is None or path is None else f"{path}: not in the model")
            self.state.setText("")
            self._fill(self.params, [])
            self._fill(self.consts, [])
            self.more.setText("")
            return
        kind, value = found
        hf = names.get(path, "")
        self.header.setText(f"<b>{path or '(the whole model)'}</b> — {type_name(kind, value)}"
                            + (f" · Hugging Face: <code>{hf}</code>" if hf and hf != path else ""))
        st = (stats or ModelStats(module)).get(path)
        rows = [param_row(p, v, names.get(p, "")) for p, v in itertools.islice(params(value, path), MAX_ROWS)]
        self._fill(self.params, rows)
        self.more.setText(f"… and {st.tensors - len(rows):,} more parameters" if st.tensors > len(rows) else "")
        consts = [(join(path, seg), v) for seg, k, v in children(value) if k is FieldKind.CONSTANT] \
            if kind in (FieldKind.MODULE, FieldKind.CONTAINER, FieldKind.REPARAMETERIZATION) else []
        self._fill(self.consts, [[p, _shape(t.shape), str(t.dtype), str(t.device)] for p, t in consts])
        parts = []
        if st.floats:
            parts.append(f"{st.state}: {count(st.trainable)} of {count(st.numel)} values trainable")
        elif st.numel:
            parts.append(f"{count(st.numel)} values, none trainable")
        if st.reparameterized:
            parts.append(f"{st.reparameterized} reparameterized (LoRA)")
        if st.quantized:
            parts.append(f"{st.quantized} quantized (GGUF blocks, {byte_text(st.stored_bytes)} as stored)")
        lazy = st.tensors - st.initialized
        if lazy:
            parts.append(f"{lazy:,} of {st.tensors:,} parameters lazy (not allocated)")
        self.state.setText(" · ".join(parts))

    @staticmethod
    def _fill(table: QTableWidget, rows: list[list[str]]) -> None:
        header = table.horizontalHeader()
        modes = [header.sectionResizeMode(c) for c in range(table.columnCount())]
        # ResizeToContents measures every row on every setItem (quadratic: 30 s for 2,344 items);
        # fill with fixed columns, then let the header measure once
        header.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        table.setUpdatesEnabled(False)
        table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                table.setItem(r, c, item)
        for c, mode in enumerate(modes):
            header.setSectionResizeMode(c, mode)
        table.setUpdatesEnabled(True)

    def rows(self, table: QTableWidget | None = None) -> list[list[str]]:
        t = table or self.params
        return [[t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())]
