"""The main window: the module tree, the central tabs and the inspector around one document."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QPlainTextEdit, QTabWidget


class MainWindow(QMainWindow):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Ember")
        self.resize(1280, 800)
        self.tabs = QTabWidget()
        self.display = QPlainTextEdit(readOnly=True)
        self.tabs.addTab(self.display, "Display")
        self.setCentralWidget(self.tabs)
        tree_dock = QDockWidget("Module tree", self)
        tree_dock.setObjectName("dock.tree")
        tree_dock.setWidget(QLabel("no model open"))
        self.addDockWidget(Qt.LeftDockWidgetArea, tree_dock)
        self.statusBar().showMessage("ready")
