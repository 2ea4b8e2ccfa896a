"""Issue 48, item 5: palette kinds drag onto the canvas and land where dropped; nodes added by
double-click / Enter land where they cover no node and no port."""
import pytest
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.designer_panel import DesignerPanel
from engine.design import mnist_design
from widgets.designer.canvas import NODE_H, NODE_W, PORT_R


@pytest.fixture
def panel(qtbot, tmp_path):
    p = DesignerPanel(autosave_dir=tmp_path / "autosave", autosave_ms=60_000)
    qtbot.addWidget(p)
    p.resize(1200, 800)
    p.show()
    qtbot.waitExposed(p)
    yield p
    p.shutdown()


def _palette_item(panel, kind):
    item = panel.palette.item_for(kind)
    item.parent().setExpanded(True)
    panel.palette.tree.scrollToItem(item)
    return item


def _drag_from_palette(panel, kind):
    """What a drag started on `kind` in the palette carries (the tree's own model builds it, as
    QAbstractItemView.startDrag does), and the actions it offers."""
    tree = panel.palette.tree
    assert tree.dragEnabled(), "the palette offers no drag"
    item = _palette_item(panel, kind)
    assert item.flags() & Qt.ItemFlag.ItemIsDragEnabled
    index = tree.indexFromItem(item)
    data = tree.model().mimeData([index])
    actions = tree.model().supportedDragActions()
    return data, actions


def _drop(canvas, data, actions, pos: QPoint):
    """Deliver a drag enter, move and drop at `pos` on the canvas's viewport, as Qt does."""
    vp = canvas.viewport()
    enter = QDragEnterEvent(pos, actions, data, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(vp, enter)
    assert enter.isAccepted(), "the canvas refuses a palette drag"
    move = QDragMoveEvent(pos, actions, data, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(vp, move)
    assert move.isAccepted()
    drop = QDropEvent(QPointF(pos), actions, data, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(vp, drop)
    assert drop.isAccepted()
    return drop


def test_a_kind_dragged_from_the_palette_lands_where_it_is_dropped(qtbot, panel):
    panel.set_design(mnist_design())
    qtbot.wait(20)
    canvas = panel.canvas
    before = set(panel.design.nodes())
    canvas.select(["fc1"])  # a drop does not connect to the selection: the user placed it
    data, actions = _drag_from_palette(panel, "Linear")
    spot = QPoint(canvas.viewport().width() - 150, canvas.viewport().height() // 2)
    at = canvas.mapToScene(spot)
    drop = _drop(canvas, data, actions, spot)
    assert drop.dropAction() == Qt.DropAction.CopyAction  # a copy, never a move
    added = set(panel.design.nodes()) - before
    assert len(added) == 1, added
    new = added.pop()
    assert panel.design.spec(new).kind == "Linear"
    assert not [e for e in panel.design.edges() if new in (e[0], e[2])]
    # the node is centred on the spot where it was dropped
    x, y = panel.design.position(new)
    assert abs(x + NODE_W / 2 - at.x()) <= 1 and abs(y + NODE_H / 2 - at.y()) <= 1, ((x, y), at)
    assert canvas.nodes[new].sceneBoundingRect().contains(at)
    assert canvas.selected_nodes() == [new]
    panel.undo_stack.undo()  # one undoable step
    assert set(panel.design.nodes()) == before


def test_the_canvas_ignores_drops_that_are_not_palette_kinds(qtbot, panel):
    from PySide6.QtCore import QMimeData
    data = QMimeData()
    data.setText("Linear")
    vp = panel.canvas.viewport()
    enter = QDragEnterEvent(QPoint(50, 50), Qt.DropAction.CopyAction, data, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    enter.setAccepted(False)
    QApplication.sendEvent(vp, enter)
    drop = QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, data, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(vp, drop)
    assert panel.design.nodes() == []


def _rect_with_ports(panel, name):
    x, y = panel.design.position(name)
    return QRectF(x, y, NODE_W, NODE_H).adjusted(-PORT_R, -PORT_R, PORT_R, PORT_R)


def _assert_no_overlaps(panel):
    names = panel.design.nodes()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ra, rb = _rect_with_ports(panel, a), _rect_with_ports(panel, b)
            assert not ra.intersects(rb), f"{a} at {panel.design.position(a)} covers {b} at {panel.design.position(b)}"


def test_unconnected_nodes_added_by_double_click_or_enter_cover_no_node(qtbot, panel):
    tree = panel.palette.tree
    for kind in ("Linear", "Linear", "Relu", "Dropout"):
        panel.canvas.select([])  # nothing selected: the node is added unconnected
        item = _palette_item(panel, kind)
        qtbot.wait(10)
        pos = tree.visualItemRect(item).center()
        qtbot.mouseClick(tree.viewport(), Qt.MouseButton.LeftButton, pos=pos)  # a double-click's first press
        qtbot.mouseDClick(tree.viewport(), Qt.MouseButton.LeftButton, pos=pos)
        qtbot.wait(300)  # past the double-click interval: the next kind's clicks are a fresh double-click
    assert len(panel.design.nodes()) == 4, panel.design.nodes()
    assert panel.design.edges() == []
    _assert_no_overlaps(panel)
    # Enter in the search box, with the view's centre over an existing design
    panel.set_design(mnist_design())
    panel.canvas.centerOn(panel.canvas.nodes["fc1"])
    for _ in range(3):
        panel.canvas.select([])
        panel.palette.search.setText("Linear")
        panel.palette.activate_current()
    assert len(panel.design.nodes()) == len(mnist_design().nodes()) + 3
    _assert_no_overlaps(panel)


def test_a_node_added_after_the_selection_does_not_cover_the_next_node(qtbot, panel):
    panel.set_design(mnist_design())
    panel.canvas.select(["fc1"])  # fc1's next node (gelu1) sits where "below fc1" is
    new = panel.add_node("Linear")
    assert new in panel.design.nodes()
    _assert_no_overlaps(panel)
