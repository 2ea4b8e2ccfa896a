"""Issue 18, item 9: a double-click on a palette kind adds one node, not two."""
from PySide6.QtCore import Qt

from widgets.designer.palette import Palette


def test_double_click_activates_a_kind_once(qtbot):
    palette = Palette()
    qtbot.addWidget(palette)
    palette.show()
    qtbot.waitExposed(palette)
    got = []
    palette.kind_activated.connect(got.append)
    tree = palette.tree
    item = None
    for i in range(tree.topLevelItemCount()):
        top = tree.topLevelItem(i)
        top.setExpanded(True)
        if top.childCount():
            item = top.child(0)
            break
    assert item is not None
    tree.scrollToItem(item)
    qtbot.wait(20)
    pos = tree.visualItemRect(item).center()
    qtbot.mouseClick(tree.viewport(), Qt.MouseButton.LeftButton, pos=pos)  # a double-click's first press
    qtbot.mouseDClick(tree.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.wait(20)
    assert len(got) == 1, got
