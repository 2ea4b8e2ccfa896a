"""Input helpers for widget tests."""
from PySide6.QtCore import QPoint, Qt


def click_box(qtbot, box):
    """Click a check box on its indicator (a click right of its text does nothing)."""
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))


def type_into(qtbot, field, text):
    field.clear()
    qtbot.keyClicks(field, text)
