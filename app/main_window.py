"""The main window: the module tree, the central tabs and the inspector around one document."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (QApplication, QDockWidget, QLabel, QMainWindow, QMessageBox, QTabWidget,
                               QToolBar)

from engine import available_devices
from widgets.device_selector import DeviceSelector
from widgets.task_progress import TaskProgress

from .actions import Actions
from .document import Document
from .settings import Settings
from .theme import apply_theme


class MainWindow(QMainWindow):
    def __init__(self, document: Document | None = None, settings: Settings | None = None, parent=None):
        super().__init__(parent)
        self.document = document if document is not None else Document(self)
        self.settings = settings if settings is not None else Settings()
        self.setObjectName("ember-main-window")
        self.resize(1400, 860)
        self.actions = Actions(self)
        self._build_central()
        self._build_docks()
        self._build_toolbar()
        self._build_status()
        self._build_menus()
        self._connect()
        self.settings.restore_window(self)
        self.set_theme(self.settings.theme())
        self._update_title()

    # ---- layout --------------------------------------------------------------------------------
    def _build_central(self) -> None:
        self.tabs = QTabWidget()
        self.tabs.setObjectName("center-tabs")
        self.display_placeholder = QLabel("Open a model: File ▸ Open Example, or Ctrl+O for a script.")
        self.display_placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.tabs.addTab(self.display_placeholder, "Display")
        self.designer_tab = QLabel("The graph designer will live here.")
        self.designer_tab.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.tabs.addTab(self.designer_tab, "Graph / Designer")
        self.training_tab = QLabel("Training runs and live curves will live here.")
        self.training_tab.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.tabs.addTab(self.training_tab, "Training")
        self.setCentralWidget(self.tabs)

    def _dock(self, name: str, title: str, widget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _build_docks(self) -> None:
        self.tree_dock = self._dock("dock.tree", "Module Tree", QLabel("no model open"), Qt.DockWidgetArea.LeftDockWidgetArea)
        self.inspector_dock = self._dock("dock.inspector", "Inspector", QLabel(""), Qt.DockWidgetArea.RightDockWidgetArea)
        self.contract_dock = self._dock("dock.contract", "Shape Contract", QLabel(""), Qt.DockWidgetArea.RightDockWidgetArea)

    def _build_toolbar(self) -> None:
        tb = QToolBar("Main", self)
        tb.setObjectName("toolbar.main")
        a = self.actions
        for action in (a.undo, a.redo):
            tb.addAction(action)
        tb.addSeparator()
        for action in (a.freeze, a.unfreeze, a.attach_lora, a.check_contracts):
            tb.addAction(action)
        tb.addSeparator()
        self.device_selector = DeviceSelector()
        self.device_selector.set_devices([str(d) for d in available_devices()])
        tb.addWidget(self.device_selector)
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, tb)
        self.toolbar = tb

    def _build_status(self) -> None:
        self.summary_label = QLabel("")
        self.summary_label.setObjectName("trainable-summary")
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.task_progress = TaskProgress()
        self.statusBar().addWidget(self.summary_label, 1)
        self.statusBar().addPermanentWidget(self.task_progress)

    def _build_menus(self) -> None:
        a = self.actions
        bar = self.menuBar()
        m = bar.addMenu("&File")
        self.examples_menu = m.addMenu("Open &Example")
        m.addAction(a.open_script)
        m.addAction(a.open_checkpoint)
        m.addAction(a.open_project)
        self.recent_menu = m.addMenu("Open &Recent")
        m.addSeparator()
        m.addAction(a.save_project)
        m.addAction(a.save_project_as)
        m.addSeparator()
        m.addAction(a.import_checkpoint)
        export = m.addMenu("E&xport Checkpoint")
        for action in (a.export_whole, a.export_adapters, a.export_materialized):
            export.addAction(action)
        m.addSeparator()
        m.addAction(a.quit)
        m = bar.addMenu("&Edit")
        m.addAction(a.undo)
        m.addAction(a.redo)
        m.addSeparator()
        m.addAction(a.find)
        m = bar.addMenu("&Model")
        for action in (a.freeze, a.unfreeze, a.no_grad, a.param_group):
            m.addAction(action)
        m.addSeparator()
        for action in (a.attach_lora, a.detach_lora, a.materialize):
            m.addAction(action)
        m.addSeparator()
        m.addAction(a.fork)
        m.addAction(a.transfer)
        m.addSeparator()
        m.addAction(a.check_contracts)
        m = bar.addMenu("&Train")
        m.addAction(a.train_show)
        m = bar.addMenu("&View")
        m.addAction(a.theme_light)
        m.addAction(a.theme_dark)
        m.addSeparator()
        m.addAction(a.show_display)
        m.addAction(a.show_designer)
        m.addSeparator()
        m.addAction(a.expand_all)
        m.addAction(a.collapse_all)
        self.depth_menu = m.addMenu("Expand to &Depth")
        m.addSeparator()
        for dock in (self.tree_dock, self.inspector_dock, self.contract_dock):
            m.addAction(dock.toggleViewAction())
        m.addAction(self.toolbar.toggleViewAction())
        m = bar.addMenu("&Help")
        m.addAction(a.shortcuts)
        m.addAction(a.about)

    def _connect(self) -> None:
        a = self.actions
        doc = self.document
        a.undo.triggered.connect(doc.undo_stack.undo)
        a.redo.triggered.connect(doc.undo_stack.redo)
        doc.undo_stack.canUndoChanged.connect(a.undo.setEnabled)
        doc.undo_stack.canRedoChanged.connect(a.redo.setEnabled)
        doc.undo_stack.undoTextChanged.connect(lambda t: a.undo.setText(f"&Undo {t}".rstrip()))
        doc.undo_stack.redoTextChanged.connect(lambda t: a.redo.setText(f"&Redo {t}".rstrip()))
        a.undo.setEnabled(False)
        a.redo.setEnabled(False)
        a.quit.triggered.connect(self.close)
        a.theme_light.triggered.connect(lambda: self.set_theme("light"))
        a.theme_dark.triggered.connect(lambda: self.set_theme("dark"))
        a.show_display.triggered.connect(lambda: self.tabs.setCurrentIndex(0))
        a.show_designer.triggered.connect(lambda: self.tabs.setCurrentIndex(1))
        a.train_show.triggered.connect(lambda: self.tabs.setCurrentIndex(2))
        a.shortcuts.triggered.connect(self.show_shortcuts)
        a.about.triggered.connect(self.show_about)
        doc.dirty_changed.connect(lambda _d: self._update_title())
        doc.source_changed.connect(self._update_title)

    # ---- view ------------------------------------------------------------------------------------
    def set_theme(self, name: str) -> None:
        app = QApplication.instance()
        apply_theme(app, name)
        self.settings.set_theme(name)
        (self.actions.theme_dark if name == "dark" else self.actions.theme_light).setChecked(True)

    def _update_title(self) -> None:
        self.setWindowTitle(f"{self.document.title} — Ember")

    def shortcut_table(self) -> list[tuple[str, str]]:
        rows = []
        for action in self.actions.all():
            keys = ", ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts())
            if keys:
                rows.append((action.text().replace("&", "").rstrip("…"), keys))
        return sorted(rows)

    def show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td>{name}</td><td><b>{keys}</b></td></tr>" for name, keys in self.shortcut_table())
        QMessageBox.information(self, "Keyboard Shortcuts", f"<table cellspacing=6>{rows}</table>")

    def show_about(self) -> None:
        QMessageBox.about(self, "About Ember", "<b>Ember</b><br>Design, inspect and fine-tune neural networks "
                          "built on Burn's module system, in Python.")

    # ---- closing ---------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        self.settings.save_window(self)
        self.settings.sync()
        super().closeEvent(event)
