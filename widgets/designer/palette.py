"""The palette: every node kind, grouped as Burn's book groups its modules, with a search box.

Typing filters the kinds (by name, group or summary); Enter in the search box, a double click,
or Enter on a kind emits `kind_activated(kind)`. A kind can also be dragged onto the canvas: the
drag carries `KIND_MIME` (the kind's name) and is offered as a copy. The palette changes nothing
itself.
"""
from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtWidgets import QLineEdit, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from engine.design import CATEGORIES, catalog, kinds

KIND_ROLE = Qt.ItemDataRole.UserRole + 1
KIND_MIME = "application/x-ember-layer-kind"


def kind_mime(kind: str) -> QMimeData:
    """What a drag from the palette carries: the kind's name under `KIND_MIME` (and as text)."""
    data = QMimeData()
    data.setData(KIND_MIME, kind.encode("utf-8"))
    data.setText(kind)
    return data


def kind_from_mime(data: QMimeData | None) -> str | None:
    """The kind a palette drag carries, or None for anything else."""
    if data is None or not data.hasFormat(KIND_MIME):
        return None
    kind = bytes(data.data(KIND_MIME)).decode("utf-8", "replace").strip()
    return kind or None


class _KindTree(QTreeWidget):
    """The palette's tree: dragging a kind carries `KIND_MIME`; group headers do not drag."""

    def mimeTypes(self) -> list[str]:
        return [KIND_MIME, "text/plain"]

    def mimeData(self, items) -> QMimeData | None:
        found = [it.data(0, KIND_ROLE) for it in items if it.data(0, KIND_ROLE)]
        return kind_mime(found[0]) if found else None

    def supportedDropActions(self):
        return Qt.DropAction.CopyAction


class Palette(QWidget):
    kind_activated = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.search = QLineEdit()
        self.search.setObjectName("palette-search")
        self.search.setPlaceholderText("Search layers (Ctrl+F)…")
        self.search.setClearButtonEnabled(True)
        self.tree = _KindTree()
        self.tree.setObjectName("palette-tree")
        self.tree.setDragEnabled(True)
        self.tree.setDragDropMode(QTreeWidget.DragDropMode.DragOnly)
        self.tree.setDefaultDropAction(Qt.DropAction.CopyAction)
        self.tree.setHeaderHidden(True)
        self.tree.setRootIsDecorated(True)
        self._items: dict[str, QTreeWidgetItem] = {}
        self._groups: dict[str, QTreeWidgetItem] = {}
        specs = catalog()
        for cat in CATEGORIES:
            group = QTreeWidgetItem([cat])
            group.setFlags(Qt.ItemFlag.ItemIsEnabled)
            f = group.font(0)
            f.setBold(True)
            group.setFont(0, f)
            self.tree.addTopLevelItem(group)
            self._groups[cat] = group
            for kind in kinds(cat):
                item = QTreeWidgetItem([kind])
                item.setData(0, KIND_ROLE, kind)
                item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsDragEnabled)
                item.setToolTip(0, specs[kind].summary or kind)
                group.addChild(item)
                self._items[kind] = item
            group.setExpanded(cat in ("Structure", "General"))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.search)
        layout.addWidget(self.tree, 1)
        self.search.textChanged.connect(self.set_filter)
        self.search.returnPressed.connect(self.activate_current)
        self.tree.itemActivated.connect(self._activated)
        # a double-click is an activation already (itemActivated): connecting itemDoubleClicked too
        # added the node twice

    def set_filter(self, text: str) -> None:
        """Show the kinds whose name, group or summary contains `text` (case-insensitive)."""
        if self.search.text() != text:
            self.search.setText(text)
            return
        needle = text.strip().lower()
        specs = catalog()

        def by_name(kind, cat):
            return needle in kind.lower() or needle in cat.lower()

        by_name_any = any(by_name(k, specs[k].category) for k in self._items)
        first = None
        for cat, group in self._groups.items():
            any_visible = False
            for i in range(group.childCount()):
                item = group.child(i)
                kind = item.data(0, KIND_ROLE)
                if not needle:
                    hit = True
                elif by_name_any:  # names first: "linear" lists Linear, not every layer whose summary says so
                    hit = by_name(kind, cat)
                else:
                    hit = needle in specs[kind].summary.lower()
                item.setHidden(not hit)
                if hit:
                    any_visible = True
                    if first is None and needle:
                        first = item
            group.setHidden(not any_visible)
            if needle:
                group.setExpanded(any_visible)
        exact = next((it for k, it in self._items.items() if k.lower() == needle), None)
        if exact is not None or first is not None:
            self.tree.setCurrentItem(exact or first)

    def visible_kinds(self) -> list[str]:
        out = []
        for group in self._groups.values():
            if group.isHidden():
                continue
            for i in range(group.childCount()):
                item = group.child(i)
                if not item.isHidden():
                    out.append(item.data(0, KIND_ROLE))
        return out

    def item_for(self, kind: str) -> QTreeWidgetItem | None:
        """The tree item that shows `kind` (to scroll to, drag or click)."""
        return self._items.get(kind)

    def current_kind(self) -> str | None:
        item = self.tree.currentItem()
        return None if item is None or item.isHidden() else item.data(0, KIND_ROLE)

    def activate_current(self) -> None:
        """Emit the current kind, or the first visible one (Enter in the search box)."""
        kind = self.current_kind()
        if kind is None:
            visible = self.visible_kinds()
            kind = visible[0] if visible and self.search.text().strip() else None
        if kind is not None:
            self.kind_activated.emit(kind)

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def _activated(self, item, _column=0) -> None:
        kind = item.data(0, KIND_ROLE)
        if kind:
            self.kind_activated.emit(kind)
