"""The window shell: docks, tabs, menus with shortcuts, themes, and layout kept in settings."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QDockWidget

from app.main_window import MainWindow


def menu_titles(w):
    return [a.text().replace("&", "") for a in w.menuBar().actions()]


def test_the_window_has_its_docks_tabs_and_menus(window):
    docks = {d.objectName(): d for d in window.findChildren(QDockWidget)}
    assert {"dock.tree", "dock.inspector", "dock.contract"} <= set(docks)
    assert window.dockWidgetArea(docks["dock.tree"]) == Qt.DockWidgetArea.LeftDockWidgetArea
    assert window.dockWidgetArea(docks["dock.inspector"]) == Qt.DockWidgetArea.RightDockWidgetArea
    assert [window.tabs.tabText(i) for i in range(window.tabs.count())] == ["Display", "Graph / Designer", "Training",
                                                                                  "Generate"]
    assert menu_titles(window) == ["File", "Edit", "Model", "Train", "View", "Help"]
    assert window.device_selector.devices()[:2] == ["cpu", "cpu:1"]


def test_frequent_actions_have_shortcuts_listed_in_help(window):
    table = dict(window.shortcut_table())
    for name in ("Undo", "Freeze", "Attach LoRA", "Parameter Group", "Check Shape Contracts", "Save Project"):
        assert table.get(name), f"{name} has no shortcut"
    keys = [k for _, k in window.shortcut_table()]
    assert len(keys) == len(set(keys)), "two actions share a shortcut"


def test_tab_shortcuts_switch_the_central_view(window, qtbot):
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentIndex() == 1
    window.actions.show_display.trigger()
    assert window.tabs.currentIndex() == 0


def test_dark_theme_changes_the_palette_and_is_remembered(window, settings, qtbot):
    light = QApplication.palette().color(QPalette.ColorRole.Window).lightness()
    window.actions.theme_dark.trigger()
    dark = QApplication.palette().color(QPalette.ColorRole.Window).lightness()
    assert dark < light - 100
    assert settings.theme() == "dark"
    w2 = MainWindow(settings=settings)
    qtbot.addWidget(w2)
    assert w2.actions.theme_dark.isChecked()


def test_dock_layout_is_restored_on_the_next_start(window, settings, qtbot):
    window.inspector_dock.hide()
    window.resize(780, 590)
    window.close()
    w2 = MainWindow(settings=settings)
    qtbot.addWidget(w2)
    w2.show()
    assert w2.inspector_dock.isHidden()
    assert not w2.tree_dock.isHidden()
    assert (w2.width(), w2.height()) == (780, 590)
