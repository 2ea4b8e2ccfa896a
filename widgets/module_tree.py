"""The module tree: a lazy QAbstractItemModel over an engine module, and its view.

Nodes are created when a branch is first expanded (`canFetchMore` / `fetchMore`), so opening a
6.7 B-parameter lazy model creates a handful of rows and allocates no tensor. Counts come from
one metadata pass (`ModelStats`), never from parameter values.

Columns: name (with a LoRA badge), type, parameters, trainable (a tri-state checkbox: trainable
/ partly / frozen), device, contract, grad norm, and the Hugging Face name of each node when the
app passes names in (`set_module(module, names=...)`, a model opened from a Hugging Face folder;
the column is hidden otherwise, and the name's tooltip shows it too). The model changes nothing: a click on a checkbox emits
`trainable_toggled(path, trainable)` and the app decides.
"""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPoint, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QBrush, QColor, QFont, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QMenu, QSpinBox,
                               QStyledItemDelegate, QTreeView, QVBoxLayout, QWidget)

from engine.module.summary import ModelStats, ParamStats
from engine.module.tree import FieldKind, children, find, join

from .common import count, monospace_font

NAME, TYPE, PARAMS, TRAINABLE, DEVICE, CONTRACT, GRAD, HF_NAME = range(8)
HEADERS = ["Name", "Type", "Parameters", "Trainable", "Device", "Contract", "Grad norm", "Hugging Face name"]
PATH_ROLE = Qt.ItemDataRole.UserRole + 1
KIND_ROLE = Qt.ItemDataRole.UserRole + 2
STATE_ROLE = Qt.ItemDataRole.UserRole + 3

STATUS_MARK = {"ok": "✓", "violated": "✗", "failed inside": "▸", "not run": "·"}
STATUS_COLOR = {"ok": "#2e9d4a", "violated": "#d04437", "failed inside": "#c98a1b", "not run": "#8a8f98"}

# (contract text or None, status or "", message) for a path
ContractProvider = Callable[[str, Any], tuple[str | None, str, str]]

_badge: QIcon | None = None

# The nodes of the tree view (flags and constants are listed by the inspector instead), and
# the Type column's text, which the inspector's header shares.
TREE_KINDS = frozenset({FieldKind.MODULE, FieldKind.CONTAINER, FieldKind.PARAM, FieldKind.REPARAMETERIZATION})


def tree_children(value: Any) -> list[tuple[str, FieldKind, Any]]:
    """`(segment, kind, value)` of the children the tree view shows under a node."""
    return [c for c in children(value) if c[1] in TREE_KINDS]


def has_tree_children(value: Any) -> bool:
    return any(k in TREE_KINDS for _, k, _ in children(value))


GROUP_MIN = 8  # a list below the top level with more modules than this is a group (a layer's experts)


def is_group(kind: FieldKind, value: Any, path: str) -> bool:
    """A list of more than GROUP_MIN modules below the model's own fields (`layers.0.mlp.experts` of a
    mixture of experts): named with its count ("experts (64)") and left collapsed when the tree is
    expanded to a depth or in full (a filter still opens it to show what matches)."""
    return (kind == FieldKind.CONTAINER and "." in path and isinstance(value, (list, tuple))
            and len(value) > GROUP_MIN and all(k == FieldKind.MODULE for _, k, _ in children(value)))


def type_name(kind: FieldKind, value: Any) -> str:
    """The Type column: the class name, `Param float[4, 3]`, `Vec[2]`, `Tensor int[4]`."""
    if kind in (FieldKind.MODULE, FieldKind.REPARAMETERIZATION):
        return type(value).__name__
    if kind == FieldKind.PARAM:
        return f"Param {value.kind}{list(value.shape)}"
    if kind == FieldKind.CONTAINER:
        tag = "Tuple" if isinstance(value, tuple) else ("Map" if isinstance(value, dict) else "Vec")
        return f"{tag}[{len(value)}]"
    if kind == FieldKind.CONSTANT:
        return f"Tensor {value.kind}{list(value.shape)}"
    return type(value).__name__



def quantization(p) -> tuple[str, int] | None:
    """(the stored type such as "Q4_1", its bytes) of a parameter kept in quantized blocks (a GGUF
    weight, or an adapter over one); None for any other."""
    r = getattr(p, "reparameterization", None)
    stored = r if getattr(r, "TAKES_ADAPTER", False) else getattr(r, "gguf", None)
    if stored is None or not hasattr(stored, "qtype"):
        return None
    return str(stored.qtype), int(stored.nbytes())


def byte_text(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n >= 2 ** 20 else f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def lora_badge() -> QIcon:
    """A small rounded 'L' badge marking nodes with LoRA (any reparameterization) below."""
    global _badge
    if _badge is None:
        pm = QPixmap(18, 14)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setBrush(QColor("#7b4bd6"))
        p.setPen(Qt.PenStyle.NoPen)
        p.drawRoundedRect(QRectF(0.5, 0.5, 17, 13), 4, 4)
        p.setPen(QColor("white"))
        f = QFont()
        f.setPixelSize(10)
        f.setBold(True)
        p.setFont(f)
        p.drawText(QRectF(0, 0, 18, 14), Qt.AlignmentFlag.AlignCenter, "L")
        p.end()
        _badge = QIcon(pm)
    return _badge


class _Node:
    __slots__ = ("parent", "row", "seg", "path", "kind", "value", "children", "expandable")

    def __init__(self, parent, row, seg, path, kind, value):
        self.parent = parent
        self.row = row
        self.seg = seg
        self.path = path
        self.kind = kind
        self.value = value
        self.children: list[_Node] | None = None  # None until fetched
        self.expandable = has_tree_children(value)


class ModuleTreeModel(QAbstractItemModel):
    trainable_toggled = Signal(str, bool)  # path, whether the user wants it trainable

    def __init__(self, parent=None):
        super().__init__(parent)
        self._root = _Node(None, 0, "", "<root>", "root", None)
        self._root.children = []
        self.module: Any = None
        self.stats = ModelStats(None)
        self._filter = ""
        self._visible: set[str] | None = None  # paths shown while filtering
        self._contracts: ContractProvider | None = None
        self._grad_norms: dict | None = None  # module path -> live gradient norm (None: frozen)
        self._names: dict[str, str] = {}  # path -> the Hugging Face name
        self._mono = monospace_font()

    # ---- content -------------------------------------------------------------------------
    def set_module(self, module: Any) -> None:
        self.beginResetModel()
        self.module = module
        self.stats = ModelStats(module)
        self._visible = self._matching_paths(self._filter) if self._filter else None
        self._root.children = []
        if module is not None:
            self._root.children = [_Node(self._root, 0, "", "", FieldKind.MODULE, module)]
        self.endResetModel()

    def set_names(self, names: dict[str, str] | None) -> None:
        """Other names of the nodes ({path: Hugging Face name}), shown in their own column and in
        the name's tooltip, and matched by the filter; takes effect at the next `set_module`."""
        self._names = {k: v for k, v in (names or {}).items() if v}  # the same name too (lm_head)

    def names(self) -> dict[str, str]:
        return dict(self._names)

    def set_contract_provider(self, provider: ContractProvider | None) -> None:
        self._contracts = provider
        self.refresh_column(CONTRACT)

    def set_grad_norms(self, norms: dict | None) -> None:
        """Live gradient norms per module path while training (None for a frozen module)."""
        self._grad_norms = norms
        self.refresh_column(GRAD)

    def set_filter(self, text: str) -> None:
        """Show only nodes whose name, type or path contains `text` (and their ancestors)."""
        text = text.strip()
        if text == self._filter:
            return
        self._filter = text
        self.set_module(self.module)

    def filter_text(self) -> str:
        return self._filter

    def refresh_column(self, column: int) -> None:
        """Tell views that one column changed on every fetched row."""
        stack = [(QModelIndex(), self._root)]
        while stack:
            parent_index, node = stack.pop()
            kids = node.children or []
            if kids:
                self.dataChanged.emit(self.index(0, column, parent_index), self.index(len(kids) - 1, column, parent_index))
                for child in kids:
                    if child.children:
                        stack.append((self.index(child.row, 0, parent_index), child))

    def _matching_paths(self, text: str) -> set[str]:
        needle = text.lower()
        visible: set[str] = set()
        if self.module is None:
            return visible

        def walk(value, path, kind):
            hit = needle in (path.rsplit(".", 1)[-1] or type(value).__name__).lower() or \
                needle in type_name(kind, value).lower() or (path and needle in path.lower()) or \
                needle in self._names.get(path, "").lower()
            any_child = False
            for seg, k, v in tree_children(value):
                if walk(v, join(path, seg), k):
                    any_child = True
            if hit or any_child:
                visible.add(path)
            return hit or any_child

        walk(self.module, "", FieldKind.MODULE)
        return visible

    # ---- lazy children ------------------------------------------------------------------------
    def _node(self, index: QModelIndex) -> _Node:
        return index.internalPointer() if index.isValid() else self._root

    def _make_children(self, node: _Node) -> list[_Node]:
        out = []
        for seg, kind, value in tree_children(node.value):
            path = join(node.path, seg)
            if self._visible is not None and path not in self._visible:
                continue
            out.append(_Node(node, len(out), seg, path, kind, value))
        return out

    def canFetchMore(self, parent: QModelIndex) -> bool:
        node = self._node(parent)
        return node.children is None and node.expandable

    def fetchMore(self, parent: QModelIndex) -> None:
        node = self._node(parent)
        if node.children is not None:
            return
        kids = self._make_children(node)
        if not kids:
            node.children = []
            node.expandable = False
            return
        self.beginInsertRows(parent, 0, len(kids) - 1)
        node.children = kids
        self.endInsertRows()

    def hasChildren(self, parent: QModelIndex = QModelIndex()) -> bool:
        node = self._node(parent)
        if node.children is not None:
            return bool(node.children)
        return node.expandable

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:
        if parent.isValid() and parent.column() != 0:
            return 0
        node = self._node(parent)
        return len(node.children) if node.children is not None else 0

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return len(HEADERS)

    def index(self, row: int, column: int, parent: QModelIndex = QModelIndex()) -> QModelIndex:
        node = self._node(parent)
        kids = node.children
        if kids is None or not (0 <= row < len(kids)) or not (0 <= column < len(HEADERS)):
            return QModelIndex()
        return self.createIndex(row, column, kids[row])

    def parent(self, index: QModelIndex = QModelIndex()) -> QModelIndex:  # noqa: A003 - Qt's name
        if not index.isValid():
            return QModelIndex()
        node: _Node = index.internalPointer()
        parent = node.parent
        if parent is None or parent is self._root:
            return QModelIndex()
        return self.createIndex(parent.row, 0, parent)

    # ---- lookup -------------------------------------------------------------------------------
    def index_of(self, path: str, fetch: bool = True) -> QModelIndex:
        """The index of the node at `path` (fetching the branches on the way when `fetch`)."""
        if not self._root.children:
            return QModelIndex()
        index = self.index(0, 0)
        if path == "":
            return index
        for seg in path.split("."):
            node = self._node(index)
            if node.children is None:
                if not fetch:
                    return QModelIndex()
                self.fetchMore(index)
            for child in node.children or []:
                if child.seg == seg:
                    index = self.createIndex(child.row, 0, child)
                    break
            else:
                return QModelIndex()
        return index

    def path_of(self, index: QModelIndex) -> str | None:
        return self._node(index).path if index.isValid() else None

    def fetched_nodes(self):
        """Every created node (for consistency checks), depth first."""
        stack = list(reversed(self._root.children or []))
        while stack:
            n = stack.pop()
            yield n
            stack.extend(reversed(n.children or []))

    # ---- data ---------------------------------------------------------------------------------
    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return HEADERS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole and section == TRAINABLE:
            return ("Checked: trainable; unchecked: frozen; partly: some parameters below are frozen (a click "
                    "freezes the rest)")
        return None

    def flags(self, index: QModelIndex):
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        f = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.column() == TRAINABLE and self.stats.get(self._node(index).path).floats:
            f |= Qt.ItemFlag.ItemIsUserCheckable
        return f

    def _contract(self, node: _Node) -> tuple[str | None, str, str]:
        if self._contracts is None or node.kind not in (FieldKind.MODULE, FieldKind.REPARAMETERIZATION):
            return None, "", ""
        return self._contracts(node.path, node.value)

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        node: _Node = index.internalPointer()
        col = index.column()
        if role == PATH_ROLE:
            return node.path
        if role == KIND_ROLE:
            return node.kind
        st = self.stats.get(node.path)
        if role == STATE_ROLE:
            return st.state
        if role == Qt.ItemDataRole.DisplayRole:
            if col == NAME:
                if is_group(node.kind, node.value, node.path):
                    return f"{node.seg} ({len(node.value)})"
                return node.seg or type(node.value).__name__
            if col == TYPE:
                q = quantization(node.value if node.kind is FieldKind.PARAM else getattr(node.value, "weight", None))
                if q is not None:
                    return f"{type_name(node.kind, node.value)} · {q[0]}, {byte_text(q[1])}"
                if st.quantized and node.kind is not FieldKind.PARAM:
                    return f"{type_name(node.kind, node.value)} · {st.quantized} quantized"
                if node.path in self.stats.shared:  # one parameter at several places: counted at the first
                    return f"{type_name(node.kind, node.value)} · shared with {self.stats.shared[node.path]}"
                return type_name(node.kind, node.value)
            if col == PARAMS:
                return count(st.numel)
            if col == TRAINABLE:
                return count(st.trainable) if st.floats else ""
            if col == DEVICE:
                return ", ".join(st.devices)
            if col == CONTRACT:
                text, status, _ = self._contract(node)
                if not text and not status:
                    return ""
                mark = STATUS_MARK.get(status, "")
                return f"{mark} {text or '(no contract)'}".strip()
            if col == GRAD:
                norms = self._grad_norms
                if not norms or node.path not in norms:
                    return ""
                value = norms[node.path]
                return "frozen" if value is None else f"{value:.2e}"
            if col == HF_NAME:
                return self._names.get(node.path, "")
            return None
        if role == Qt.ItemDataRole.CheckStateRole and col == TRAINABLE and st.floats:
            state = st.state
            if state == "trainable":
                return Qt.CheckState.Checked
            if state == "frozen":
                return Qt.CheckState.Unchecked
            return Qt.CheckState.PartiallyChecked
        if role == Qt.ItemDataRole.DecorationRole and col == NAME and st.reparameterized:
            return lora_badge()
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (PARAMS, TRAINABLE, GRAD):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.FontRole and col in (CONTRACT, TYPE, GRAD, HF_NAME):
            return self._mono
        if role == Qt.ItemDataRole.ForegroundRole and col == GRAD and self._grad_norms \
                and self._grad_norms.get(node.path, 0.0) is None:
            return QBrush(QColor("#8a8f98"))
        if role == Qt.ItemDataRole.ForegroundRole and col == CONTRACT:
            _, status, _ = self._contract(node)
            color = STATUS_COLOR.get(status)
            return QBrush(QColor(color)) if color else None
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(node, col, st)
        return None

    def _tooltip(self, node: _Node, col: int, st: ParamStats) -> str:
        lines = [node.path or "(the whole model)"]
        if node.path in self._names and col in (NAME, HF_NAME):
            lines.append(f"Hugging Face: {self._names[node.path]}")
        if col == TRAINABLE and st.floats:
            lines.append(f"{st.state}: {st.trainable_floats} of {st.floats} float tensors trainable "
                         f"({count(st.trainable)} of {count(st.numel)} values)")
        elif col == CONTRACT:
            text, status, message = self._contract(node)
            if text:
                lines.append(f"contract: {text}")
            if status:
                lines.append(f"check: {status}")
            if message:
                lines.append(message)
        elif col == NAME and st.reparameterized:
            lines.append(f"LoRA: {st.reparameterized} reparameterized parameter(s) below")
        if st.quantized:
            lines.append(f"quantized: {st.quantized} weight(s) kept in their GGUF blocks, "
                         f"{byte_text(st.stored_bytes)} as stored")
        return "\n".join(lines)

    def setData(self, index: QModelIndex, value, role=Qt.ItemDataRole.EditRole) -> bool:
        if index.isValid() and role == Qt.ItemDataRole.CheckStateRole and index.column() == TRAINABLE:
            state = Qt.CheckState(value) if not isinstance(value, Qt.CheckState) else value
            node = self._node(index)
            # a click on a half-checked box (Qt offers Checked next) freezes what is trainable below,
            # as a file manager's tri-state box does: unfreezing what is already partly trainable
            # would be no visible change the first time and a no-op every time after
            if self.stats.get(node.path).state == "partly":
                state = Qt.CheckState.Unchecked
            self.trainable_toggled.emit(node.path, state == Qt.CheckState.Checked)
            return True
        return False


class _ElideLeft(QStyledItemDelegate):
    """Cuts long text on the left: of `model.layers.0.self_attn.q_proj` the end is what differs."""

    def initStyleOption(self, option, index) -> None:
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideLeft


class ModuleTree(QWidget):
    """The tree with its filter box and expand-to-depth control, keeping expansion and
    selection across model changes. Emits what the user asked for; changes nothing itself."""

    selection_changed = Signal(str)  # path ("" is the whole model)
    trainable_toggled = Signal(str, bool)
    op_requested = Signal(str, str)  # op ("freeze" | "unfreeze" | "no_grad"), path
    lora_requested = Signal(str)  # path
    contract_requested = Signal(str)  # path

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model = ModuleTreeModel(self)
        self._restoring = False
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by name, type or path…")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.setObjectName("tree-filter")
        self.depth_spin = QSpinBox()
        self.depth_spin.setRange(0, 32)
        self.depth_spin.setPrefix("depth ")
        self.depth_spin.setToolTip("Expand the tree to this depth")
        self.depth_spin.setObjectName("tree-depth")
        self.view = QTreeView()
        self.view.setModel(self.model)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        header = self.view.header()
        header.setStretchLastSection(True)
        header.setSectionResizeMode(NAME, QHeaderView.ResizeMode.Interactive)
        for column, width in ((NAME, 150), (TYPE, 105), (PARAMS, 100), (TRAINABLE, 105), (DEVICE, 45)):
            self.view.setColumnWidth(column, width)
        # a model's Hugging Face names, when it has them, come right after the trainable state
        header.moveSection(header.visualIndex(HF_NAME), TRAINABLE + 1)
        self.view.setColumnWidth(HF_NAME, 260)
        self._hf_delegate = _ElideLeft(self.view)
        self.view.setItemDelegateForColumn(HF_NAME, self._hf_delegate)
        self.view.setColumnHidden(HF_NAME, True)
        self.empty_label = QLabel("No model open.")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        top = QHBoxLayout()
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.depth_spin)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(top)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.empty_label)
        self.filter_edit.textChanged.connect(self._on_filter)
        self.depth_spin.valueChanged.connect(self.expand_to_depth)
        self.view.selectionModel().currentRowChanged.connect(self._on_current)
        self.view.customContextMenuRequested.connect(self._context_menu)
        self.model.trainable_toggled.connect(self.trainable_toggled)
        # names and counts are never cut off: the columns fit their contents on open and expand
        # (once per burst of expansions, after them)
        self._fit_timer = QTimer(self)
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(0)
        self._fit_timer.timeout.connect(self.fit_columns)
        self.view.expanded.connect(lambda _index: self._fit_timer.start())
        self._set_empty(True)

    def sizeHint(self):
        return QSize(640, 600)

    def fit_columns(self) -> None:
        """Widen the name and count columns to what the shown rows need (never narrower than
        their default widths)."""
        for column, least in ((NAME, 150), (TYPE, 105), (PARAMS, 100), (TRAINABLE, 105), (DEVICE, 45)):
            want = max(self.view.sizeHintForColumn(column), self.view.header().sectionSizeHint(column), least)
            if self.view.columnWidth(column) < want:
                self.view.setColumnWidth(column, want)

    def _set_empty(self, empty: bool) -> None:
        self.view.setVisible(not empty)
        self.empty_label.setVisible(empty)

    # ---- content -------------------------------------------------------------------------
    def set_module(self, module: Any, names: dict[str, str] | None = None) -> None:
        """Show `module`, keeping the expanded branches and the selection that still exist.
        `names`: {path: Hugging Face name} of a model from a Hugging Face folder (a column and
        tooltips; the column is hidden without names)."""
        self.model.set_names(names)
        self.view.setColumnHidden(HF_NAME, not self.model.names())
        expanded = self.expanded_paths()
        selected = self.selected_path()
        first = self.model.module is None
        self._restoring = True  # the selection put back is not the user's
        try:
            self._restore(module, expanded, selected, first)
        finally:
            self._restoring = False

    def _restore(self, module, expanded, selected, first) -> None:
        self.model.set_module(module)
        self._set_empty(module is None)
        if module is None:
            return
        if first:
            self._expand(self.model.index(0, 0))
        for path in sorted(expanded, key=lambda p: p.count(".")):
            index = self.model.index_of(path)
            if index.isValid():
                self._expand(index)
        if self.model.filter_text():
            self.expand_all()
        # the selection that still exists, else the whole model
        self.select_path(selected if selected is not None and self.model.index_of(selected).isValid() else "")
        self.fit_columns()

    def expanded_paths(self) -> list[str]:
        out = []
        for node in self.model.fetched_nodes():
            if node.children is not None:
                index = self.model.createIndex(node.row, 0, node)
                if self.view.isExpanded(index):
                    out.append(node.path)
        return out

    def selected_path(self) -> str | None:
        index = self.view.currentIndex()
        return self.model.path_of(index) if index.isValid() else None

    def select_path(self, path: str) -> bool:
        index = self.model.index_of(path)
        if not index.isValid():
            return False
        parent = index.parent()
        while parent.isValid():
            self._expand(parent)
            parent = parent.parent()
        self.view.setCurrentIndex(index)
        self.view.scrollTo(index)
        return True

    def _expand(self, index: QModelIndex) -> None:
        # fetch first: the view alone would fetch at its next layout, after this call returns
        if self.model.canFetchMore(index):
            self.model.fetchMore(index)
        self.view.expand(index)

    def expand_to_depth(self, depth: int) -> None:
        """Expand every branch down to `depth` levels below the model (0: only the model)."""
        self.view.collapseAll()
        if self.model.rowCount():
            level = [self.model.index(0, 0)]
            for _ in range(depth + 1):
                nxt = []
                for index in level:
                    if self.model.hasChildren(index) and not self._is_group(index):
                        self._expand(index)
                        nxt.extend(self.model.index(r, 0, index) for r in range(self.model.rowCount(index)))
                level = nxt
        if self.depth_spin.value() != depth:
            self.depth_spin.blockSignals(True)
            self.depth_spin.setValue(depth)
            self.depth_spin.blockSignals(False)

    def _is_group(self, index: QModelIndex) -> bool:
        node = index.internalPointer()
        return node is not None and is_group(node.kind, node.value, node.path)

    def expand_all(self) -> None:
        """Expand every branch (fetching all of it: meant for filtered or small trees)."""
        stack = [(self.model.index(0, 0), 0)] if self.model.rowCount() else []
        deepest = 0
        while stack:
            index, depth = stack.pop()
            if self.model.hasChildren(index) and not (self._is_group(index) and not self.model.filter_text()):
                self._expand(index)
                deepest = max(deepest, depth)
                stack.extend((self.model.index(r, 0, index), depth + 1) for r in range(self.model.rowCount(index)))
        if self.depth_spin.value() != deepest:  # the depth box says how deep the tree is open
            self.depth_spin.blockSignals(True)
            self.depth_spin.setValue(deepest)
            self.depth_spin.blockSignals(False)

    def _on_filter(self, text: str) -> None:
        selected = self.selected_path()
        self.model.set_filter(text)
        if text.strip():
            self.expand_all()
        elif self.model.rowCount():
            self._expand(self.model.index(0, 0))
        if selected is not None:
            self.select_path(selected)

    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        path = self.model.path_of(current)
        if path is not None and not self._restoring:
            self.selection_changed.emit(path)

    def _context_menu(self, pos: QPoint) -> None:
        index = self.view.indexAt(pos)
        if not index.isValid():
            return
        self.view.setCurrentIndex(index)
        menu = self.context_menu(self.model.path_of(index))
        menu.exec(self.view.viewport().mapToGlobal(pos))

    def context_menu(self, path: str) -> QMenu:
        """The menu for `path` (built separately so tests can trigger its actions)."""
        menu = QMenu(self)
        where = path or "the whole model"
        for op, text in (("freeze", "Freeze"), ("unfreeze", "Unfreeze"), ("no_grad", "No Grad")):
            a = QAction(f"{text} {where}", menu)
            a.setObjectName(op)
            a.triggered.connect(lambda _=False, op=op: self.op_requested.emit(op, path))
            menu.addAction(a)
        menu.addSeparator()
        a = menu.addAction(f"Attach LoRA to {where}…")
        a.setObjectName("lora")
        a.triggered.connect(lambda: self.lora_requested.emit(path))
        found = find(self.model.module, path) if self.model.module is not None else None
        if found and found[0] in (FieldKind.MODULE, FieldKind.REPARAMETERIZATION):
            a = menu.addAction("Edit Shape Contract…")
            a.setObjectName("contract")
            a.triggered.connect(lambda: self.contract_requested.emit(path))
        return menu
