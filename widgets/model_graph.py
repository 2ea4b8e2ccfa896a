"""The traced graph of any model: module-level boxes that expand into their ops.

`ModelGraphView.set_trace(trace)` takes an `engine.tensor.trace.Trace` (from
`engine.design.trace_model`, shape-only for models whose parameters are not allocated) and draws
the model's direct children as boxes, top to bottom in the order they ran, joined by edges that
carry the shape of the tensor passed. A box with a "+" expands (double-click it, or `expand(path)`)
into its child modules, or, for a module with no children, into the ops it ran. Only what is
visible is drawn, so a 7 B model's graph is a few dozen items until the user opens a box.
A run of identical blocks called one after another (a decoder's 32 layers: `layers.0` to
`layers.31`, one type, the same ops on the same shapes) is one box, "layers.0–31 · LlamaDecoderLayer
× 32", that expands into the blocks, each expandable as before.
`select_path(path)` highlights the box of the module tree's selection (or the box it lies in).
The view decides nothing: `module_activated(path)` says which box was clicked.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPointF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import (QGraphicsItem, QGraphicsPathItem, QGraphicsRectItem, QGraphicsScene,
                               QGraphicsSimpleTextItem, QGraphicsView)

__all__ = ["ModelGraphView", "shape_text"]

BOX_W, BOX_H, GAP, INDENT = 260.0, 34.0, 30.0, 24.0
GROUP = 3  # more ops than this between two module calls are one box
_FILL = {"module": QColor("#dfe9f7"), "op": QColor("#f3f0e6"), "io": QColor("#e3f2e1")}
_SELECTED = QColor("#f6c453")


def shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass
class _Unit:
    key: str  # a module path, or "op:<index>", or "input" / "output"
    label: str
    kind: str  # "module", "op", "io"
    first: int
    end: int
    depth: int
    expandable: bool = False
    covers: tuple = ()  # a folded run of blocks: the paths of its blocks
    parent: str = ""  # a folded run: the path of the list holding its blocks (`layers`)


class _Box(QGraphicsRectItem):
    def __init__(self, view: "ModelGraphView", unit: _Unit):
        super().__init__(0, 0, BOX_W, BOX_H)
        self.view, self.unit = view, unit
        self.setBrush(QBrush(_FILL[unit.kind]))
        self.setPen(QPen(QColor("#5b6b82"), 1.2))
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable)
        mark = ("− " if unit.key in view.expanded else "+ ") if unit.expandable else ""
        self.text = QGraphicsSimpleTextItem(mark + unit.label, self)
        font = QFont()
        font.setPointSizeF(9.0)
        self.text.setFont(font)
        self.text.setPos(8, (BOX_H - self.text.boundingRect().height()) / 2)
        self.setToolTip(unit.label)

    def mouseDoubleClickEvent(self, event) -> None:
        if self.unit.expandable:
            self.view.toggle(self.unit.key)
        event.accept()

    def mousePressEvent(self, event) -> None:
        super().mousePressEvent(event)
        if self.unit.covers:
            self.view.module_activated.emit(self.unit.parent)  # the list of the folded blocks
        elif self.unit.kind == "module":
            self.view.module_activated.emit(self.unit.key.split("@", 1)[0])  # a second call's box: its module


class ModelGraphView(QGraphicsView):
    """The module-level graph of one trace (see the module docstring)."""

    module_activated = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("model-graph")
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(self.renderHints())
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.trace = None
        self.expanded: set[str] = set()
        self.selected_path: str | None = None
        self.boxes: dict[str, _Box] = {}
        self._message = ""

    def text_color(self) -> QColor:
        """The colour of what is drawn on the view's background (edge shapes, messages): slate on
        a light background, the palette's text colour on a dark one."""
        if self.palette().color(QPalette.ColorRole.Base).lightness() < 128:
            return self.palette().color(QPalette.ColorRole.Text)
        return QColor("#3b4a5e")

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:  # the theme changed: the labels follow it
            self.redraw()

    # ---- what is shown ----------------------------------------------------------------------------
    def set_trace(self, trace, title: str = "") -> None:
        self.trace = trace
        self.expanded = set()
        self._calls = {c.path: c for c in trace.calls} if trace is not None else {}
        self._children = {}
        for c in (trace.calls if trace is not None else []):
            if c.path == "":
                continue
            # the nearest enclosing module that was called (a list of layers, `layers`, is not one)
            parent = c.path
            while parent:
                parent = parent.rsplit(".", 1)[0] if "." in parent else ""
                if parent in self._calls:
                    break
            self._children.setdefault(parent, []).append(c)
        for kids in self._children.values():
            kids.sort(key=lambda c: c.first)
        self._signatures: dict[str, tuple] = {}
        self._message = title
        self.redraw()
        self.fit()

    def set_message(self, text: str) -> None:
        """No graph, a line saying why (tracing, or what failed)."""
        self.trace = None
        self._message = text
        self.redraw()

    def toggle(self, key: str) -> None:
        (self.expanded.discard if key in self.expanded else self.expanded.add)(key)
        self.redraw()

    def expand(self, path: str) -> None:
        self.expanded.add(path)
        self.redraw()

    def collapse(self, path: str) -> None:
        self.expanded.discard(path)
        self.redraw()

    def select_path(self, path: str | None) -> None:
        self.selected_path = path
        self._paint_selection()

    def texts(self) -> list[str]:
        """Every text drawn (box labels and edge shapes), for tests and accessibility."""
        return [i.text() for i in self.scene().items() if isinstance(i, QGraphicsSimpleTextItem)]

    def fit(self) -> None:
        rect = self.scene().itemsBoundingRect()
        if rect.isValid():
            self.fitInView(rect.adjusted(-20, -20, 20, 20), Qt.AspectRatioMode.KeepAspectRatio)
            if self.transform().m11() < 0.55:  # a long graph: readable at the top, scroll down
                self.resetTransform()
            elif self.transform().m11() > 1.0:  # a short graph (BERT's three boxes): never larger than life
                self.resetTransform()
                self.centerOn(rect.center())
                self.scale(0.8, 0.8)
                self.centerOn(rect.center().x(), rect.top() + self.viewport().height() / 1.6)

    # ---- layout -------------------------------------------------------------------------------------
    def _units(self) -> list[_Unit]:
        tr = self.trace
        root = self._calls.get("")
        head = f"input → {root.type_name}" if root is not None else "input"
        units = [_Unit("input", head + (f" ({self._message})" if self._message else ""), "io", -1, -1, 0)]

        def ops_unit(i, depth):
            o = tr.ops[i]
            what = o.attrs.get("type") if o.op == "module" else None
            label = f"{o.op} ({what})" if what else o.op
            return _Unit(f"op:{i}", label, "op", i, i + 1, depth)

        seen: set[str] = set()

        def add_ops(first, end, depth):
            """The ops between two module calls: a run of more than GROUP ops is one box that expands."""
            if end - first > GROUP:
                key = f"ops:{first}-{end}"
                names = []
                for o in tr.ops[first:end]:
                    if o.op not in names:
                        names.append(o.op)
                shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
                units.append(_Unit(key, f"{end - first} ops ({shown})", "op", first, end, depth, expandable=True))
                if key not in self.expanded:
                    return
                depth += 1
            for j in range(first, end):
                units.append(ops_unit(j, depth))

        def add_range(first, end, kids, depth):
            i = first
            # a module called twice (one activation used after two layers) has two boxes
            kids = [c for c in kids if c.first >= first and c.end <= end and (c.end > c.first or first <= c.first)]
            for run in self._runs(sorted(kids, key=lambda c: c.first), seen):
                c = run[0]
                if c.first > i:
                    add_ops(i, min(c.first, end), depth)
                if len(run) == 1:
                    add_call(c, depth)
                else:
                    add_fold(run, depth)
                i = max(i, run[-1].end)
            if end > i:
                add_ops(i, end, depth)

        def add_fold(run, depth):
            parent, _, lo = run[0].path.rpartition(".")
            hi = run[-1].path.rpartition(".")[2]
            key = f"repeat:{run[0].path}"
            units.append(_Unit(key, f"{parent}.{lo}–{hi} · {run[0].type_name} × {len(run)}", "module",
                               run[0].first, run[-1].end, depth, expandable=True,
                               covers=tuple(c.path for c in run), parent=parent))
            if key in self.expanded:
                for c in run:
                    add_call(c, depth + 1)

        def add_call(c, depth):
            name = c.path.rsplit(".", 1)[-1]
            kids = [k for k in self._children.get(c.path, []) if c.first <= k.first and k.end <= c.end]
            key = c.path if c.path not in seen else f"{c.path}@{c.first}"
            seen.add(c.path)
            unit = _Unit(key, f"{name} · {c.type_name}", "module", c.first, c.end, depth,
                         expandable=bool(kids) or c.end > c.first)
            units.append(unit)
            if key in self.expanded:
                add_range(c.first, c.end, kids, depth + 1)

        if root is not None:
            add_range(root.first, root.end, self._children.get("", []), 0)
        else:
            add_range(0, len(tr.ops), self._children.get("", []), 0)
        units.append(_Unit("output", "output", "io", len(tr.ops), len(tr.ops), 0))
        return units

    def _runs(self, kids: list, seen: set) -> list[list]:
        """`kids` (in call order) cut into runs: consecutive blocks of one list (`layers.0`,
        `layers.1`, ...) that ran back to back with the same signature form one run; any other
        call is a run of its own."""
        out: list[list] = []
        for c in kids:
            prev = out[-1] if out else None
            if prev is not None and c.path not in seen and self._continues(prev, c):
                prev.append(c)
            else:
                out.append([c])
        return out

    def _continues(self, run: list, c) -> bool:
        last = run[-1]
        head, _, index = c.path.rpartition(".")
        last_head, _, last_index = last.path.rpartition(".")
        return (index.isdigit() and last_index.isdigit() and head == last_head and int(index) == int(last_index) + 1
                and c.first == last.end and c.end > c.first and self._signature(c) == self._signature(run[0]))

    def _signature(self, c) -> tuple:
        """What makes two blocks the same for folding: the type, every op (name, input and output
        shapes, the weights' among them) and every inner call (relative path, type, span)."""
        sig = self._signatures.get(c.path)
        if sig is None:
            tr = self.trace

            def shapes(ids):
                return tuple(tuple(tr.tensors[t].shape) if t in tr.tensors else None for t in ids)

            ops = tuple((o.op, shapes(o.inputs), shapes(o.outputs)) for o in tr.ops[c.first:c.end])
            inner, stack = [], list(self._children.get(c.path, []))
            while stack:
                k = stack.pop()
                inner.append((k.path[len(c.path):], k.type_name, k.first - c.first, k.end - c.first))
                stack.extend(self._children.get(k.path, []))
            sig = (c.type_name, ops, tuple(sorted(inner)))
            self._signatures[c.path] = sig
        return sig

    def redraw(self) -> None:
        scene = self.scene()
        scene.clear()
        self.boxes = {}
        if self.trace is None:
            item = scene.addSimpleText(self._message or "No model open.")
            item.setBrush(QBrush(self.text_color()))
            item.setPos(0, 0)
            return
        tr = self.trace
        units = self._units()
        owner: dict[int, str] = {}
        for u in units:
            if u.expandable and u.key in self.expanded:
                continue
            for i in range(u.first, u.end):
                owner.setdefault(i, u.key)
        # a module shown expanded owns nothing itself: its ops belong to the boxes inside it
        y = 0.0
        pos: dict[str, QPointF] = {}
        for u in units:
            box = _Box(self, u)
            box.setPos(u.depth * INDENT, y)
            scene.addItem(box)
            self.boxes[u.key] = box
            pos[u.key] = QPointF(u.depth * INDENT, y)
            y += BOX_H + GAP
        edges: dict[tuple[str, str], str] = {}
        for u in units:
            if u.expandable and u.key in self.expanded:
                continue
            if u.key == "output":
                ins = list(tr.outputs)
                rng = range(0)
            else:
                ins = []
                rng = range(u.first, u.end) if u.first >= 0 else range(0)
            for i in rng:
                ins.extend(tr.ops[i].inputs)
            for tid in ins:
                t = tr.tensors.get(tid)
                if t is None:
                    continue
                if t.source == "input":
                    src = "input"
                elif t.source == "op" and t.producer is not None:
                    src = owner.get(t.producer)
                    if src is None or (src == u.key and u.key != "output"):
                        continue
                else:
                    continue
                edges.setdefault((src, u.key), shape_text(t.shape))
        for (a, b), label in edges.items():
            self._edge(pos[a], pos[b], label)
        self._paint_selection()

    def _edge(self, a: QPointF, b: QPointF, label: str) -> None:
        scene = self.scene()
        start = QPointF(a.x() + BOX_W / 2, a.y() + BOX_H)
        end = QPointF(b.x() + BOX_W / 2, b.y())
        path = QPainterPath(start)
        if end.y() - start.y() <= GAP + 1:
            path.lineTo(end)
            text_at = QPointF(start.x() + 6, start.y() + 4)
        else:  # a skip connection: round the boxes in between on the right
            side = max(start.x(), end.x()) + BOX_W / 2 + 16 + (end.y() - start.y()) / 40
            path.cubicTo(QPointF(side, start.y()), QPointF(side, end.y()), end)
            text_at = QPointF(side - 10, (start.y() + end.y()) / 2)
        item = QGraphicsPathItem(path)
        item.setPen(QPen(QColor("#7a8699"), 1.2))
        item.setZValue(-1)
        scene.addItem(item)
        text = scene.addSimpleText(label)
        font = QFont()
        font.setPointSizeF(8.0)
        text.setFont(font)
        text.setBrush(QBrush(self.text_color()))
        text.setPos(text_at)

    def _paint_selection(self) -> None:
        path = self.selected_path
        best = None
        if path is not None:
            for key, box in self.boxes.items():
                if box.unit.kind != "module":
                    continue
                bases = box.unit.covers or (key.split("@", 1)[0],)
                if any(path == base or path.startswith(base + ".") for base in bases):
                    rank = (box.unit.depth, len(key))  # the innermost box; a second call's after the first
                    if best is None or rank > (self.boxes[best].unit.depth, len(best)):
                        best = key
        for key, box in self.boxes.items():
            box.setBrush(QBrush(_SELECTED if key == best else _FILL[box.unit.kind]))

    def highlighted(self) -> str | None:
        for key, box in self.boxes.items():
            if box.brush().color() == _SELECTED:
                return key
        return None
