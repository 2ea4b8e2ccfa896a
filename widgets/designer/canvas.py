"""The design canvas: a QGraphicsView of the dataflow graph.

Nodes show their name, kind and output dims; a node whose input does not fit (or whose
configuration is bad) is outlined in red with the message under it. Edges run from an output
port (bottom of a node) to an input port (top) and are labelled with the dims that flow along
them. The canvas only shows and reports: connecting (click an output port, then an input port,
or drag from one to the other), moving, deleting, and key commands are emitted as signals and
the app turns them into undoable edits. A kind dragged from the palette and dropped on the canvas
is emitted as `kind_dropped(kind, x, y)`, the node's top-left corner in scene coordinates (the node
centred where it was dropped).

Keys (handled while the canvas has focus, ahead of window shortcuts): Delete / Backspace,
Ctrl+Z, Ctrl+Shift+Z / Ctrl+Y, Ctrl+C, Ctrl+X, Ctrl+V, Ctrl+D (duplicate), Ctrl+A,
Ctrl+Shift+R (arrange), Ctrl+B (build), Ctrl+F (search the palette), F2 (rename), Ctrl+0 (fit),
Ctrl++ / Ctrl+- (zoom), Escape (cancel a connection).
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QKeySequence, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (QGraphicsEllipseItem, QGraphicsItem, QGraphicsPathItem, QGraphicsScene,
                               QGraphicsSimpleTextItem, QGraphicsView)

from engine.design import Analysis, Design

from ..common import monospace_font
from .palette import kind_from_mime

NODE_W, NODE_H = 190.0, 58.0
PORT_R = 6.0
CATEGORY_COLORS = {
    "Structure": "#6b7280", "General": "#3b82f6", "Convolutions": "#10b981", "Pooling": "#0d9488",
    "Interpolation": "#8b5cf6", "RNNs": "#d97706", "Transformer": "#db2777", "Loss": "#dc2626",
}
ERROR = QColor("#d04437")

# key sequence -> the command the canvas emits
KEYS = {
    "Del": "delete", "Backspace": "delete", "Ctrl+Z": "undo", "Ctrl+Shift+Z": "redo", "Ctrl+Y": "redo",
    "Ctrl+C": "copy", "Ctrl+X": "cut", "Ctrl+V": "paste", "Ctrl+D": "duplicate", "Ctrl+A": "select_all",
    "Ctrl+Shift+R": "arrange", "Ctrl+B": "build", "Ctrl+F": "search", "F2": "rename", "Ctrl+0": "fit",
    "Ctrl++": "zoom_in", "Ctrl+=": "zoom_in", "Ctrl+-": "zoom_out", "Esc": "cancel",
}


class PortItem(QGraphicsEllipseItem):
    def __init__(self, node: str, port: str, is_input: bool, parent):
        super().__init__(-PORT_R, -PORT_R, 2 * PORT_R, 2 * PORT_R, parent)
        self.node, self.port, self.is_input = node, port, is_input
        self.setBrush(QBrush(QColor("#f8fafc")))
        self.setPen(QPen(QColor("#334155"), 1.5))
        self.setAcceptHoverEvents(True)
        self.setZValue(2)
        self.setToolTip(f"{node}.{port} ({'input' if is_input else 'output'})")

    def hoverEnterEvent(self, event):
        self.setBrush(QBrush(QColor("#fde047")))
        super().hoverEnterEvent(event)

    def hoverLeaveEvent(self, event):
        self.setBrush(QBrush(QColor("#f8fafc")))
        super().hoverLeaveEvent(event)


class NodeItem(QGraphicsItem):
    def __init__(self, name: str, kind: str, category: str, shape_text: str, error: str | None, blocked: bool,
                 inputs, outputs):
        super().__init__()
        self.name, self.kind, self.category = name, kind, category
        self.shape_text, self.error, self.blocked = shape_text, error, blocked
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsMovable | QGraphicsItem.GraphicsItemFlag.ItemIsSelectable
                      | QGraphicsItem.GraphicsItemFlag.ItemSendsGeometryChanges)
        self.setZValue(1)
        self.ports: dict[tuple[str, bool], PortItem] = {}
        for ports, is_input, y in ((inputs, True, 0.0), (outputs, False, NODE_H)):
            n = len(ports)
            for i, p in enumerate(ports):
                item = PortItem(name, p, is_input, self)
                item.setPos(NODE_W * (i + 1) / (n + 1), y)
                self.ports[(p, is_input)] = item
                if n > 1:
                    label = QGraphicsSimpleTextItem(p, self)
                    f = QFont()
                    f.setPointSizeF(7)
                    label.setFont(f)
                    label.setBrush(QBrush(QColor("#64748b")))
                    w = label.boundingRect().width()
                    label.setPos(NODE_W * (i + 1) / (n + 1) - w / 2, y + (4 if is_input else -16))
        tip = f"{name}: {kind}"
        if shape_text:
            tip += f"\noutput {shape_text}"
        if error:
            tip += f"\n{error}"
        self.setToolTip(tip)
        self.edges: list["EdgeItem"] = []

    def boundingRect(self) -> QRectF:
        extra = 40 if self.error else 0
        return QRectF(-3, -3, NODE_W + 6, NODE_H + 6 + extra)

    def paint(self, painter: QPainter, option, widget=None) -> None:
        pal = widget.palette() if widget is not None else None
        base = pal.base().color() if pal else QColor("white")
        text = pal.text().color() if pal else QColor("black")
        color = QColor(CATEGORY_COLORS.get(self.category, "#64748b"))
        rect = QRectF(0, 0, NODE_W, NODE_H)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        border = ERROR if self.error else (QColor("#94a3b8") if self.blocked else color)
        pen = QPen(border, 3 if self.isSelected() else (2.2 if self.error else 1.4))
        if self.blocked and not self.error:
            pen.setStyle(Qt.PenStyle.DashLine)
        if self.isSelected():
            pen.setColor(QColor("#2563eb") if not self.error else ERROR)
        painter.setPen(pen)
        painter.setBrush(QBrush(base))
        painter.drawRoundedRect(rect, 7, 7)
        band = QRectF(0, 0, 6, NODE_H)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QBrush(color))
        painter.drawRoundedRect(band, 3, 3)
        painter.setPen(text)
        f = QFont()
        f.setBold(True)
        painter.setFont(f)
        painter.drawText(QRectF(14, 6, NODE_W - 20, 18), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         self.name)
        f = QFont()
        f.setPointSizeF(max(f.pointSizeF() - 1, 7))
        painter.setFont(f)
        painter.setPen(color if not self.error else ERROR)
        painter.drawText(QRectF(14, 23, NODE_W - 20, 14), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         self.kind)
        mono = monospace_font()
        mono.setPointSizeF(max(mono.pointSizeF() - 1, 7))
        painter.setFont(mono)
        painter.setPen(text)
        shape = self.shape_text or ("—" if self.blocked else "")
        painter.drawText(QRectF(14, 37, NODE_W - 20, 16), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         shape)
        if self.error:
            f = QFont()
            f.setPointSizeF(max(f.pointSizeF() - 1.5, 7))
            painter.setFont(f)
            painter.setPen(ERROR)
            painter.drawText(QRectF(0, NODE_H + 6, NODE_W + 120, 34),
                             Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap, "⚠ " + self.error)

    def itemChange(self, change, value):
        if change == QGraphicsItem.GraphicsItemChange.ItemPositionHasChanged:
            for e in self.edges:
                e.update_path()
        return super().itemChange(change, value)

    def port_scene_pos(self, port: str, is_input: bool) -> QPointF:
        return self.ports[(port, is_input)].scenePos()


class EdgeItem(QGraphicsPathItem):
    def __init__(self, edge: tuple, src: NodeItem, dst: NodeItem, label: str):
        super().__init__()
        self.edge = edge
        self.src, self.dst = src, dst
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable)
        self.setZValue(0)
        self.label = QGraphicsSimpleTextItem(label)
        mono = monospace_font()
        mono.setPointSizeF(max(mono.pointSizeF() - 1.5, 7))
        self.label.setFont(mono)
        self.label.setBrush(QBrush(QColor("#475569")))
        self.label.setZValue(3)
        src.edges.append(self)
        dst.edges.append(self)
        self.setToolTip(f"{edge[0]}.{edge[1]} → {edge[2]}.{edge[3]}: {label}")
        self.update_path()

    def update_path(self) -> None:
        a = self.src.port_scene_pos(self.edge[1], False)
        b = self.dst.port_scene_pos(self.edge[3], True)
        self.setPath(_curve(a, b))
        mid = (a + b) / 2
        self.label.setPos(mid.x() + 6, mid.y() - self.label.boundingRect().height() / 2)

    def paint(self, painter, option, widget=None):
        pen = QPen(QColor("#2563eb") if self.isSelected() else QColor("#64748b"), 2.4 if self.isSelected() else 1.6)
        self.setPen(pen)
        super().paint(painter, option, widget)


def _curve(a: QPointF, b: QPointF) -> QPainterPath:
    path = QPainterPath(a)
    dy = max(abs(b.y() - a.y()) / 2, 30.0)
    path.cubicTo(QPointF(a.x(), a.y() + dy), QPointF(b.x(), b.y() - dy), b)
    return path


class DesignCanvas(QGraphicsView):
    """Shows a design and its analysis; emits what the user asks for."""

    connect_requested = Signal(str, str, str, str)
    nodes_moved = Signal(dict)  # {name: (x, y)}
    selection_changed = Signal(list)  # node names
    command_requested = Signal(str)  # see KEYS
    connection_refused = Signal(str)  # a connection the canvas cannot even ask for (input to input, ...)
    kind_dropped = Signal(str, float, float)  # a palette kind dropped: its top-left corner in the scene

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("design-canvas")
        self.setScene(QGraphicsScene(self))
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setDragMode(QGraphicsView.DragMode.RubberBandDrag)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.FullViewportUpdate)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAcceptDrops(True)
        self.viewport().setMouseTracking(True)
        self.nodes: dict[str, NodeItem] = {}
        self.edge_items: list[EdgeItem] = []
        self._positions: dict[str, tuple[float, float]] = {}
        self._pending: PortItem | None = None
        self._rubber: QGraphicsPathItem | None = None
        self._pressed_port: PortItem | None = None
        self._rendering = False
        self.scene().selectionChanged.connect(self._selection_changed)

    # ------------------------------------------------------------------ showing
    def show_design(self, design: Design, analysis: Analysis, selected: list[str] | None = None) -> None:
        """Rebuild the scene from the design and its analysis (keeping the selection)."""
        keep = set(selected if selected is not None else self.selected_nodes())
        self._rendering = True
        self.cancel_connection()
        scene = self.scene()
        scene.clear()
        self.nodes.clear()
        self.edge_items.clear()
        self._positions = {}
        for n in design.nodes():
            spec = design.spec(n)
            st = analysis.nodes.get(n)
            shape = ""
            if st is not None and st.outputs:
                shape = "  ".join(t.text() for t in st.outputs.values())
            elif st is not None and spec.kind == "Output" and "input" in st.inputs:
                shape = st.inputs["input"].text()
            item = NodeItem(n, spec.kind, spec.category, shape, st.error if st else None,
                            bool(st and st.blocked), design.input_ports(n), design.output_ports(n))
            x, y = design.position(n)
            item.setPos(x, y)
            self._positions[n] = (x, y)
            scene.addItem(item)
            self.nodes[n] = item
            item.setSelected(n in keep)
        for e in design.edges():
            t = analysis.edge_shape(e)
            edge = EdgeItem(e, self.nodes[e[0]], self.nodes[e[2]], t.text() if t is not None else "?")
            scene.addItem(edge)
            scene.addItem(edge.label)
            self.edge_items.append(edge)
        rect = scene.itemsBoundingRect().adjusted(-200, -150, 300, 200)
        scene.setSceneRect(rect)
        self._rendering = False

    MIN_FIT_SCALE = 0.6  # below this the text is unreadable: show the top of the design instead

    def fit(self) -> None:
        if not self.nodes:
            return
        rect = self.scene().itemsBoundingRect().adjusted(-30, -30, 30, 30)
        self.fitInView(rect, Qt.AspectRatioMode.KeepAspectRatio)
        scale = self.transform().m11()
        if scale > 1.0 or scale < self.MIN_FIT_SCALE:
            self.resetTransform()
            s = min(1.0, max(scale, self.MIN_FIT_SCALE))
            self.scale(s, s)
            if scale < self.MIN_FIT_SCALE:
                view = self.mapToScene(self.viewport().rect()).boundingRect()
                self.centerOn(rect.center().x(), rect.top() + view.height() / 2)

    def zoom(self, factor: float) -> None:
        self.scale(factor, factor)

    # ------------------------------------------------------------------ reading
    def selected_nodes(self) -> list[str]:
        return [n for n, item in self.nodes.items() if item.isSelected()]

    def selected_edges(self) -> list[tuple]:
        return [e.edge for e in self.edge_items if e.isSelected()]

    def select(self, names) -> None:
        names = set(names)
        for n, item in self.nodes.items():
            item.setSelected(n in names)

    def port_view_pos(self, node: str, port: str, is_input: bool):
        """Where a port is in viewport coordinates (for tests and tools)."""
        return self.mapFromScene(self.nodes[node].port_scene_pos(port, is_input))

    def node_view_pos(self, node: str):
        item = self.nodes[node]
        return self.mapFromScene(item.scenePos() + QPointF(NODE_W / 2, 12))

    def edge_label(self, edge: tuple) -> str:
        for e in self.edge_items:
            if e.edge == tuple(edge):
                return e.label.text()
        raise KeyError(f"no edge {edge}")

    def new_node_position(self) -> tuple[float, float]:
        """Where a node added from the palette goes: below the selection, or the view's centre --
        moved to the nearest place where it covers no node and no port (`free_position`)."""
        sel = self.selected_nodes()
        if sel:
            item = self.nodes[sel[-1]]
            return self.free_position(item.x(), item.y() + 90.0)
        c = self.mapToScene(self.viewport().rect().center())
        return self.free_position(round(c.x() - NODE_W / 2), round(c.y() - NODE_H / 2))

    GAP = 24.0  # the free margin kept around a placed node (its ports stick out PORT_R)

    def _occupied(self) -> list[QRectF]:
        g = self.GAP
        return [item.sceneBoundingRect().adjusted(-g, -g, g, g) for item in self.nodes.values()]

    def is_free(self, x: float, y: float) -> bool:
        """Whether a node at (x, y) would cover no node, no port and no error text."""
        rect = QRectF(x, y, NODE_W, NODE_H).adjusted(-PORT_R, -PORT_R, PORT_R, PORT_R)
        return not any(rect.intersects(r) for r in self._occupied())

    def free_position(self, x: float, y: float) -> tuple[float, float]:
        """(x, y) if a node there covers nothing, else the nearest free place on a grid of node-sized
        steps around it (rings outward; nearer rings first, then straight below, then right)."""
        if self.is_free(x, y):
            return float(x), float(y)
        dx, dy = NODE_W + self.GAP + 2 * PORT_R, NODE_H + self.GAP + 2 * PORT_R
        for ring in range(1, 60):
            cells = [(i, j) for i in range(-ring, ring + 1) for j in range(-ring, ring + 1)
                     if max(abs(i), abs(j)) == ring]
            cells.sort(key=lambda c: (c[0] * c[0] * dx * dx + c[1] * c[1] * dy * dy, c[1] < 0, c[0] < 0, c))
            for i, j in cells:
                if self.is_free(x + i * dx, y + j * dy):
                    return float(x + i * dx), float(y + j * dy)
        box = self.scene().itemsBoundingRect()
        return float(x), float(box.bottom() + self.GAP + PORT_R)

    # ------------------------------------------------------------------ connecting
    def _port_at(self, pos) -> PortItem | None:
        for item in self.items(pos):
            if isinstance(item, PortItem):
                return item
        return None

    def begin_connection(self, port: PortItem) -> None:
        self.cancel_connection()
        self._pending = port
        self._rubber = QGraphicsPathItem()
        self._rubber.setPen(QPen(QColor("#2563eb"), 1.6, Qt.PenStyle.DashLine))
        self._rubber.setZValue(5)
        self.scene().addItem(self._rubber)

    def cancel_connection(self) -> None:
        if self._rubber is not None and self._rubber.scene() is not None:
            self.scene().removeItem(self._rubber)
        self._rubber = None
        self._pending = None

    def finish_connection(self, port: PortItem) -> None:
        start = self._pending
        self.cancel_connection()
        if start is None or port is start:
            return
        if start.is_input == port.is_input:
            self.connection_refused.emit(
                f"connect an output port (bottom of a node) to an input port (top): {start.node}.{start.port} and "
                f"{port.node}.{port.port} are both {'inputs' if port.is_input else 'outputs'}")
            return
        src, dst = (start, port) if not start.is_input else (port, start)
        self.connect_requested.emit(src.node, src.port, dst.node, dst.port)

    # ------------------------------------------------------------------ events
    def mousePressEvent(self, event):
        if event.button() == Qt.MouseButton.LeftButton:
            port = self._port_at(event.position().toPoint())
            if port is not None:
                if self._pending is None:
                    self.begin_connection(port)
                    self._pressed_port = port
                else:
                    self.finish_connection(port)
                    self._pressed_port = None
                event.accept()
                return
            if self._pending is not None:
                self.cancel_connection()
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event):
        if self._pending is not None and self._rubber is not None:
            a = self._pending.scenePos()
            b = self.mapToScene(event.position().toPoint())
            self._rubber.setPath(_curve(a, b) if not self._pending.is_input else _curve(b, a))
            event.accept()
            return
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event):
        if self._pressed_port is not None and event.button() == Qt.MouseButton.LeftButton:
            port = self._port_at(event.position().toPoint())
            pressed = self._pressed_port
            self._pressed_port = None
            if port is not None and port is not pressed:  # a drag from port to port
                self.finish_connection(port)
            event.accept()
            return
        super().mouseReleaseEvent(event)
        moved = {}
        for n, item in self.nodes.items():
            pos = (round(item.x(), 1), round(item.y(), 1))
            if pos != tuple(round(v, 1) for v in self._positions.get(n, pos)):
                moved[n] = pos
        if moved:
            self._positions.update(moved)
            self.nodes_moved.emit(moved)

    # a kind dragged from the palette
    def dragEnterEvent(self, event):
        if kind_from_mime(event.mimeData()) is None:
            super().dragEnterEvent(event)
            return
        event.setDropAction(Qt.DropAction.CopyAction)
        event.accept()

    def dragMoveEvent(self, event):
        if kind_from_mime(event.mimeData()) is None:
            super().dragMoveEvent(event)
            return
        event.setDropAction(Qt.DropAction.CopyAction)
        event.accept()

    def dropEvent(self, event):
        kind = kind_from_mime(event.mimeData())
        if kind is None:
            super().dropEvent(event)
            return
        event.setDropAction(Qt.DropAction.CopyAction)
        event.accept()
        at = self.mapToScene(event.position().toPoint())
        self.kind_dropped.emit(kind, float(round(at.x() - NODE_W / 2)), float(round(at.y() - NODE_H / 2)))

    def wheelEvent(self, event):
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.zoom(1.15 if event.angleDelta().y() > 0 else 1 / 1.15)
            event.accept()
            return
        super().wheelEvent(event)

    def event(self, event):
        # take the designer's keys before window-wide shortcuts (Ctrl+Z in the main window, ...)
        if event.type() == QEvent.Type.ShortcutOverride and self._command_for(event) is not None:
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event):
        command = self._command_for(event)
        if command is None:
            super().keyPressEvent(event)
            return
        event.accept()
        if command == "cancel":
            self.cancel_connection()
        elif command == "fit":
            self.fit()
        elif command == "zoom_in":
            self.zoom(1.15)
        elif command == "zoom_out":
            self.zoom(1 / 1.15)
        elif command == "select_all":
            self.select(self.nodes)
        else:
            self.command_requested.emit(command)

    @staticmethod
    def _command_for(event) -> str | None:
        key = event.keyCombination().toCombined() if hasattr(event, "keyCombination") else event.key()
        text = QKeySequence(key).toString(QKeySequence.SequenceFormat.PortableText)
        return KEYS.get(text)

    def _selection_changed(self) -> None:
        if not self._rendering:
            self.selection_changed.emit(self.selected_nodes())
