"""The main window: the module tree, the central tabs and the inspector around one document.

Widgets emit what the user asked for; the window lays them out and wires them to small
controllers, each with one job:

- `projects`, a `ProjectIO` (app/project_io.py): examples, scripts, checkpoints into an
  architecture, project files, autosave and recovery;
- `edit_actions`, an `EditActions` (app/edit_actions.py): freeze / LoRA / moves as undo steps;
- `checkpoints`, a `CheckpointActions` (app/checkpoint_actions.py): import and export of weights;
- `checks`, a `ContractCheck` (app/contract_check.py): the contract editor and the checked run;
- `tasks`, a `TaskRunner` (app/task_runner.py): long work on worker threads, in the status bar.

Each controller takes the document and the window as its host (`app.host.Host`: status,
messages, dialogs, settings, the task runner), plus the few widgets or functions it needs,
handed to it here; no controller imports this file.

The designer and training panels are built here, in their tabs. The few commands scripts and
tests drive (`open_example`, `apply_edit`, `group_op`, `run_check`, …) are named on the window.
Every view is refreshed when the document says `model_changed`.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer
from shiboken6 import isValid
from PySide6.QtGui import QIcon, QKeySequence
from PySide6.QtWidgets import (QApplication, QDockWidget, QLabel, QMainWindow, QMessageBox, QSizePolicy, QTabWidget,
                               QToolBar)

from engine import available_devices
from engine.design import DesignFileError, analyze, read_design
from engine.module.tree import find
from widgets.contract_editor import ContractEditor
from widgets.device_selector import DeviceSelector
from widgets.display_panel import DisplayPanel
from widgets.guide_view import GuideDialog
from widgets.inspector import Inspector
from widgets.module_tree import ModuleTree
from widgets.task_progress import TaskProgress

from .actions import Actions
from .checkpoint_actions import CheckpointActions
from .contract_check import ContractCheck
from .core.schema import DesignSource, Edit, MaterializeEdit
from .designer_panel import DesignerPanel
from .document import Document
from .core.opening import hugging_face_names
from .edit_actions import EditActions
from .generate_panel import GeneratePanel
from .hub_open import HubOpen
from .onnx_actions import OnnxActions
from .gguf_actions import GGUFActions, quantized_summary
from .peft_import import PeftImportActions
from .pretrained_actions import PretrainedActions
from .script_export_actions import ScriptExportActions
from .project_io import ProjectIO
from .prompts import ScriptFileDialog, ask_save_discard
from .settings import Settings
from .task_runner import TaskRunner
from .theme import apply_theme
from .training_panel import TrainingPanel

AUTOSAVE_MS = 30_000
# the docks each tab shows until the user chooses otherwise on that tab (remembered per tab)
DEFAULT_TAB_DOCKS = {"display": ("dock.tree", "dock.inspector", "dock.contract"), "designer": (), "training": (),
                     "generate": ()}


ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons" / "app"
USER_GUIDE = Path(__file__).resolve().parent.parent / "docs" / "user-guide.md"


def app_icon() -> QIcon:
    icon = QIcon()
    for png in sorted(ICONS.glob("ember-*.png")):
        icon.addFile(str(png))
    return icon


class MainWindow(QMainWindow):
    def __init__(self, document: Document | None = None, settings: Settings | None = None, parent=None, *,
                 confirm_close: bool = False):
        super().__init__(parent)
        self.document = document if document is not None else Document(self)
        self.settings = settings if settings is not None else Settings()
        self.confirm_close = confirm_close
        self.last_message: QMessageBox | None = None
        self.dialog = None  # the open LoRA / group / checkpoint dialog, if any
        self.hf_names: dict[str, str] = {}  # the open model's Hugging Face names ({path: name}), if any
        self.setAcceptDrops(True)  # a dropped folder, project, script or checkpoint opens (PretrainedActions.drop)
        self.setObjectName("ember-main-window")
        self.setWindowIcon(app_icon())
        self.resize(1400, 860)
        self.actions = Actions(self)
        self.task_progress = TaskProgress()
        self.tasks = TaskRunner(self.task_progress, self.error, self.status, self)
        self._build_central()
        self._build_docks()
        self._build_toolbar()
        self._build_status()
        self._build_menus()
        self._build_controllers()
        self.tree.model.set_contract_provider(self.checks.contract_info)
        self._connect()
        self._layout_restored = self.settings.restore_window(self)
        self._apply_tab_docks()
        self.tabs.currentChanged.connect(self._apply_tab_docks)
        self.set_theme(self.settings.theme())
        self.autosave_timer = QTimer(self)
        self.autosave_timer.setInterval(AUTOSAVE_MS)
        self.autosave_timer.timeout.connect(self.projects.autosave)
        self.autosave_timer.start()
        self._on_model_changed()

    # ---- the controllers: each takes the document and this window as its `Host` (app/host.py) ------
    def _build_controllers(self) -> None:
        doc, a = self.document, self.actions
        self.edit_actions = EditActions(doc, self, current_path=self.current_path)
        self.checkpoints = CheckpointActions(doc, self)
        self.peft_import = PeftImportActions(doc, self)  # File > Import > PEFT Adapter (issue 48)
        # File > Open ONNX, Export > ONNX, the Graph page (app/onnx_actions.py)
        self.onnx = OnnxActions(doc, self, designer=self.designer, contract_editor=self.contract_editor,
                                contract_dock=self.contract_dock, selected_path=self.tree.selected_path,
                                show_designer=lambda: self.tabs.setCurrentWidget(self.designer))
        self.pretrained = PretrainedActions(doc, self, export_action=a.export_pretrained, peft_action=a.export_peft,
                                            hf_names=lambda: self.hf_names, open_path=self.open_path)
        # File > Open GGUF, Export > GGUF / GGUF LoRA adapter (issue 46)
        self.gguf = GGUFActions(doc, self, open_path=lambda path: self.pretrained.open_folder(path),
                                export_action=a.export_gguf, lora_action=a.export_gguf_lora)
        self.hub_open = HubOpen(doc, self, open_folder=self.pretrained.open_folder)  # issue 48
        self.projects = ProjectIO(doc, self, examples_menu=self.examples_menu, recent_menu=self.recent_menu,
                                  pretrained=self.pretrained, onnx=self.onnx, open_design=self.open_design)
        # File > Export > Training script (issue 20)
        self.script_export = ScriptExportActions(doc, self, action=a.export_training_script,
                                                 hf_names=lambda: self.hf_names,
                                                 current_spec=self.training_panel.current_spec)
        self.checks = ContractCheck(doc, self, editor=self.contract_editor, tree=self.tree, dock=self.contract_dock)

    # ---- layout --------------------------------------------------------------------------------
    def _build_central(self) -> None:
        data_dir = self.settings.data_dir()
        self.tabs = QTabWidget()
        self.tabs.setObjectName("center-tabs")
        # every tab's name stays in view at 1024 px (shortened with an ellipsis, the full name in the
        # tab's tooltip) rather than the last tabs hidden behind scroll arrows
        self.tabs.tabBar().setUsesScrollButtons(False)
        self.tabs.tabBar().setElideMode(Qt.TextElideMode.ElideRight)
        self.display = DisplayPanel()
        self.tabs.addTab(self.display, "Display")
        # a build in the designer becomes the document's model (the tree, inspector and training see it)
        self.designer = DesignerPanel(document=self.document,
                                      autosave_dir=None if data_dir is None else data_dir / "autosave")
        self.tabs.addTab(self.designer, "Graph / Designer")
        self.training_panel = TrainingPanel(self.document, self, start_task=self.tasks.start,
                                            default_runs_dir=None if data_dir is None else Path(data_dir) / "runs")
        # the dashboard's own minimum width must not widen the window: it shrinks with the tab
        self.training_panel.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.tabs.addTab(self.training_panel, "Training")
        self.generate_panel = GeneratePanel(self.document, self, self.training_panel)  # a language model continues a prompt (app/generate_panel.py)
        self.generate_panel.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.tabs.addTab(self.generate_panel, "Generate")
        for i in range(self.tabs.count()):
            self.tabs.setTabToolTip(i, self.tabs.tabText(i))
        self.setCentralWidget(self.tabs)

    def _dock(self, name: str, title: str, widget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _build_docks(self) -> None:
        self.tree = ModuleTree()
        self.inspector = Inspector()
        self.contract_editor = ContractEditor()
        left, right = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
        self.tree_dock = self._dock("dock.tree", "Module Tree", self.tree, left)
        self.inspector_dock = self._dock("dock.inspector", "Inspector", self.inspector, right)
        # under the tree (the module it edits is chosen there); the inspector gets the right side's height
        self.contract_dock = self._dock("dock.contract", "Shape Contract", self.contract_editor, left)
        self._switching_docks = False
        for dock in self.docks():
            dock.toggleViewAction().toggled.connect(lambda _on: self._remember_tab_docks())

    # ---- docks per tab: the working area of each tab gets the room --------------------------------------
    def docks(self) -> tuple[QDockWidget, ...]:
        return (self.tree_dock, self.inspector_dock, self.contract_dock)

    def tab_key(self, widget=None) -> str:
        widget = self.tabs.currentWidget() if widget is None else widget
        return {id(self.display): "display", id(self.designer): "designer",
                id(self.training_panel): "training", id(self.generate_panel): "generate"}.get(id(widget), "display")

    def _remember_tab_docks(self) -> None:
        """The user showed or closed a dock: remember it for the tab shown now."""
        if self._switching_docks or not isValid(self) or not self.isVisible():
            return
        # the actions' check marks: `toggled` comes before the dock is shown or hidden
        self.settings.set_tab_docks(self.tab_key(),
                                    [d.objectName() for d in self.docks() if d.toggleViewAction().isChecked()])

    def _apply_tab_docks(self, *_args) -> None:
        """Show the docks chosen for the current tab (by default: all around the display, none
        around the designer's canvas and the training dashboard)."""
        key = self.tab_key()
        shown = self.settings.tab_docks(key)
        if shown is None:
            shown = DEFAULT_TAB_DOCKS[key]
        self._switching_docks = True
        try:
            for dock in self.docks():
                dock.setVisible(dock.objectName() in shown)
        finally:
            self._switching_docks = False

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
        self.message_label = QLabel("")
        self.message_label.setObjectName("status-message")
        self.message_timer = QTimer(self)
        self.message_timer.setSingleShot(True)
        self.message_timer.timeout.connect(self.message_label.clear)
        self.statusBar().addWidget(self.summary_label, 1)
        self.statusBar().addPermanentWidget(self.message_label)
        self.statusBar().addPermanentWidget(self.task_progress)

    def _build_menus(self) -> None:
        a = self.actions
        bar = self.menuBar()
        m = bar.addMenu("&File")
        self.examples_menu = m.addMenu("Open &Example")
        self.examples_menu.aboutToShow.connect(lambda: self.projects.fill_examples_menu())
        m.addAction(a.open_script)
        m.addAction(a.open_checkpoint)
        m.addAction(a.open_project)
        m.addAction(a.open_pretrained)
        m.addAction(a.open_gguf)
        m.addAction(a.open_hub)
        m.addAction(a.open_onnx)
        self.recent_menu = m.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(lambda: self.projects.fill_recent_menu())
        m.addSeparator()
        m.addAction(a.save_project)
        m.addAction(a.save_project_as)
        m.addSeparator()
        imports = m.addMenu("&Import")
        imports.setObjectName("menu.import")
        imports.addAction(a.import_checkpoint)
        imports.addAction(a.import_peft)  # issue 48 (app/peft_import.py)
        export = m.addMenu("E&xport")
        export.setObjectName("menu.export")
        export.setToolTipsVisible(True)  # a disabled Hugging Face export says why
        for action in (a.export_whole, a.export_adapters, a.export_materialized):
            export.addAction(action)
        export.addSeparator()
        export.addAction(a.export_pretrained)
        export.addAction(a.export_peft)
        export.addAction(a.export_gguf)
        export.addAction(a.export_gguf_lora)
        export.addAction(a.export_onnx)
        export.addAction(a.export_training_script)
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
        m.addAction(a.generate_show)
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
        for depth in range(1, 6):
            act = self.depth_menu.addAction(f"Depth {depth}")
            act.triggered.connect(lambda _=False, d=depth: self.tree.expand_to_depth(d))
        m.addSeparator()
        for dock in (self.tree_dock, self.inspector_dock, self.contract_dock):
            m.addAction(dock.toggleViewAction())
        m.addAction(self.toolbar.toggleViewAction())
        m = bar.addMenu("&Help")
        m.addAction(a.user_guide)
        m.addAction(a.shortcuts)
        m.addAction(a.about)

    def _connect(self) -> None:
        a = self.actions
        doc = self.document
        stack = doc.undo_stack
        projects, edits, checkpoints, checks = self.projects, self.edit_actions, self.checkpoints, self.checks
        a.undo.triggered.connect(stack.undo)
        a.redo.triggered.connect(stack.redo)
        stack.canUndoChanged.connect(a.undo.setEnabled)
        stack.canRedoChanged.connect(a.redo.setEnabled)
        # the menu and the tooltip say the whole command; the toolbar button keeps its one word, so
        # a long command never pushes the toolbar's other buttons into the overflow
        a.undo.setIconText("Undo")
        a.redo.setIconText("Redo")
        stack.undoTextChanged.connect(lambda t: _name_command(a.undo, "Undo", t))
        stack.redoTextChanged.connect(lambda t: _name_command(a.redo, "Redo", t))
        stack.indexChanged.connect(self._on_index_changed)
        a.undo.setEnabled(False)
        a.redo.setEnabled(False)
        a.quit.triggered.connect(self.close)
        a.theme_light.triggered.connect(lambda: self.set_theme("light"))
        a.theme_dark.triggered.connect(lambda: self.set_theme("dark"))
        a.show_display.triggered.connect(lambda: self.tabs.setCurrentWidget(self.display))
        a.show_designer.triggered.connect(lambda: self.tabs.setCurrentWidget(self.designer))
        a.train_show.triggered.connect(lambda: self.tabs.setCurrentWidget(self.training_panel))
        a.generate_show.triggered.connect(lambda: self.tabs.setCurrentWidget(self.generate_panel))
        a.shortcuts.triggered.connect(self.show_shortcuts)
        a.about.triggered.connect(self.show_about)
        a.user_guide.triggered.connect(self.show_user_guide)
        a.find.triggered.connect(self._focus_filter)
        a.expand_all.triggered.connect(self.tree.expand_all)
        a.collapse_all.triggered.connect(self.tree.view.collapseAll)
        # files
        a.open_script.triggered.connect(self.ask_open_script)
        a.open_checkpoint.triggered.connect(projects.ask_open_checkpoint)
        a.open_project.triggered.connect(projects.ask_open_project)
        a.open_pretrained.triggered.connect(self.pretrained.ask_open)
        a.export_pretrained.triggered.connect(self.pretrained.ask_export)
        a.export_peft.triggered.connect(self.pretrained.ask_export_peft)
        a.open_onnx.triggered.connect(self.onnx.ask_open)
        a.open_gguf.triggered.connect(self.gguf.ask_open)
        a.export_gguf.triggered.connect(self.gguf.ask_export)
        a.export_gguf_lora.triggered.connect(self.gguf.ask_export_lora)
        a.export_onnx.triggered.connect(self.onnx.ask_export)
        a.export_training_script.triggered.connect(self.script_export.ask_export)
        # the Training tab's data decide whether a training script can be exported
        self.training_panel.run_settings.changed.connect(self.script_export.update_action)
        self.designer.graph_requested.connect(self.onnx.refresh_graph)
        self.designer.graph.module_activated.connect(self.tree.select_path)
        self.tree.selection_changed.connect(self.designer.graph.select_path)
        self.tabs.currentChanged.connect(lambda _i: self.onnx.model_changed()
                                         if self.tabs.currentWidget() is self.designer else None)
        a.save_project.triggered.connect(projects.save_project)
        a.save_project_as.triggered.connect(projects.save_project_as)
        a.import_checkpoint.triggered.connect(checkpoints.ask_import)
        a.import_peft.triggered.connect(self.peft_import.ask_import)
        a.open_hub.triggered.connect(self.hub_open.ask)
        a.export_whole.triggered.connect(lambda: checkpoints.ask_export("whole"))
        a.export_adapters.triggered.connect(lambda: checkpoints.ask_export("adapters"))
        a.export_materialized.triggered.connect(lambda: checkpoints.ask_export("materialized"))
        # model edits
        a.freeze.triggered.connect(lambda: edits.group_op("freeze", self.current_path()))
        a.unfreeze.triggered.connect(lambda: edits.group_op("unfreeze", self.current_path()))
        a.no_grad.triggered.connect(lambda: edits.group_op("no_grad", self.current_path()))
        a.param_group.triggered.connect(edits.open_group_dialog)
        a.attach_lora.triggered.connect(lambda: edits.open_lora_dialog(self.current_path()))
        a.detach_lora.triggered.connect(edits.detach_lora)
        a.materialize.triggered.connect(lambda: edits.apply_edit(MaterializeEdit()))
        a.fork.triggered.connect(lambda: edits.move_to(self.device_selector.device(), fork=True))
        a.transfer.triggered.connect(lambda: edits.move_to(self.device_selector.device(), fork=False))
        a.check_contracts.triggered.connect(lambda: checks.run_check(self.contract_editor.input.text()))
        # widgets
        self.tree.selection_changed.connect(self._show_selection)
        self.tree.trainable_toggled.connect(lambda path, on: edits.group_op("unfreeze" if on else "freeze", path))
        self.tree.op_requested.connect(lambda op, path: edits.group_op(op, path))
        self.tree.lora_requested.connect(edits.open_lora_dialog)
        self.tree.contract_requested.connect(checks.edit_contract)
        self.device_selector.fork_requested.connect(lambda d: edits.move_to(d, fork=True))
        self.device_selector.transfer_requested.connect(lambda d: edits.move_to(d, fork=False))
        self.contract_editor.contract_applied.connect(doc.set_contract)
        self.contract_editor.contract_reset.connect(lambda path: doc.set_contract(path, None))
        self.contract_editor.check_requested.connect(checks.run_check)
        self.designer.message.connect(self.status)
        self.designer.confirm_discard = self.maybe_discard
        self.designer.settings = self.settings
        self.training_panel.grad_norms_changed.connect(self.tree.model.set_grad_norms)
        # the document
        doc.model_changed.connect(self._on_model_changed)
        doc.contracts_changed.connect(checks.on_contracts_changed)
        doc.check_changed.connect(checks.on_check_changed)
        doc.dirty_changed.connect(lambda _d: self._update_title())
        doc.source_changed.connect(self._update_title)
        # a new model (set_model says source_changed first): the old model's example input goes
        doc.source_changed.connect(self.contract_editor.clear_example_input)

    # ---- views follow the document ---------------------------------------------------------------
    def _on_model_changed(self) -> None:
        doc = self.document
        self.hf_names = hugging_face_names(doc.module)  # {} unless a Hugging Face family's model
        self.tree.set_module(doc.module, names=self.hf_names)
        has = doc.module is not None
        gguf = quantized_summary(doc.module) if has else ""
        self.summary_label.setText((str(doc.stats.total.counts) + (f"  ·  {gguf}" if gguf else "")) if has
                                   else "No model open.")
        self.device_selector.set_model_devices(doc.stats.total.devices if has else [])
        self._show_selection(self.tree.selected_path())
        self._update_actions()
        if hasattr(self, "onnx"):
            # a model that is not the design's: the Graph / Designer tab shows its traced graph
            if has and not isinstance(doc.source, DesignSource) and not self.designer.action_graph.isChecked():
                self.designer.action_graph.setChecked(True)
                self.designer.pages.setCurrentIndex(1)
            self.onnx.model_changed()

    def _on_index_changed(self, _index: int) -> None:
        if isValid(self.document.undo_stack):  # not while the window is being torn down
            self._update_actions()

    def _update_actions(self) -> None:
        has = self.document.module is not None
        for action in self.actions.model_actions:
            action.setEnabled(has)
        self.actions.export_onnx.setEnabled(has)
        self.device_selector.set_enabled_actions(has)
        reparameterized = has and self.document.stats.total.reparameterized > 0
        self.actions.materialize.setEnabled(reparameterized)
        self.actions.export_adapters.setEnabled(reparameterized)
        self.actions.detach_lora.setEnabled(reparameterized)
        self.pretrained.update_action()
        if hasattr(self, "gguf"):
            self.gguf.update_actions()
        if hasattr(self, "script_export"):
            self.script_export.update_action()

    def current_path(self) -> str:
        path = self.tree.selected_path()
        return path if path is not None else ""

    def _show_selection(self, path: str | None) -> None:
        module = self.document.module
        if module is None:
            self.display.set_value(None)
            self.inspector.set_selection(None, None)
            self.contract_editor.set_target(None, None, None, False)
            return
        path = path if path is not None else ""
        found = find(module, path)
        value = found[1] if found else None
        self.display.set_value(value, path)
        self.inspector.set_selection(module, path, self.document.stats, names=self.hf_names)
        self.checks.show_contract(path, found)

    def _update_title(self) -> None:
        self.setWindowTitle(f"{self.document.title} — Ember")

    def _focus_filter(self) -> None:
        self.tree_dock.show()
        self.tree.filter_edit.setFocus()
        self.tree.filter_edit.selectAll()

    # ---- messages and dialogs ------------------------------------------------------------------------
    def message(self, icon: QMessageBox.Icon, title: str, text: str, details: str = "") -> QMessageBox:
        """Show a message without blocking (window-modal); kept as `last_message`."""
        box = QMessageBox(icon, title, text, QMessageBox.StandardButton.Ok, self)
        box.setObjectName("message")
        if details:
            box.setDetailedText(details)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.last_message = box
        return box

    def error(self, title: str, text: str, details: str = "") -> QMessageBox:
        return self.message(QMessageBox.Icon.Critical, title, text, details)

    def status(self, text: str, ms: int = 8000) -> None:
        """A passing note on the right of the status bar (the trainable summary stays on the left)."""
        self.message_label.setText(text)
        self._status_text = text
        self.message_timer.start(ms)

    def event(self, event) -> bool:
        """A hovered action's status tip goes where the passing notes go (QMainWindow would show it
        as the status bar's temporary message, which hides the trainable summary); leaving it
        brings back the note it covered, while that note lasts."""
        label, timer = getattr(self, "message_label", None), getattr(self, "message_timer", None)
        if event.type() == QEvent.Type.StatusTip and label is not None and timer is not None:
            note = getattr(self, "_status_text", "") if timer.isActive() else ""
            label.setText(event.tip() or note)
            return True
        return super().event(event)

    def dialog_parent(self) -> QMainWindow:
        """The parent of the controllers' file pickers, questions and dialogs (app/host.py)."""
        return self

    def open_dialog(self, dialog):
        """Open a dialog window-modal, kept as `dialog` while it is open."""
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(lambda _r: setattr(self, "dialog", None) if self.dialog is dialog else None)
        self.dialog = dialog
        dialog.open()
        return dialog

    # ---- the commands scripts and tests drive (each controller's own, named on the window) -----------
    @property
    def running_tasks(self) -> list:
        return self.tasks.running

    def open_example(self, name: str) -> bool:
        return self.projects.open_example(name)

    def open_script(self, spec: str) -> bool:
        return self.projects.open_script(spec)

    def ask_open_script(self, *_args) -> ScriptFileDialog:
        """Ctrl+O: the script dialog, window-modal (kept as `dialog`); the file chosen, or the
        `path.py:factory` typed, is opened."""
        dialog = ScriptFileDialog(self, self.settings)
        dialog.spec_chosen.connect(self.projects.open_script)
        return self.open_dialog(dialog)

    def open_path(self, entry: str) -> bool:
        if str(entry).lower().endswith(".onnx"):  # imported on a worker (app/onnx_actions.py)
            return self.onnx.open_onnx(entry) is not None
        return self.projects.open_path(entry)

    def open_project(self, path) -> bool:
        return self.projects.open_project(path)

    def open_design(self, path) -> bool:
        """Open a design file in the designer tab and, when it is complete, make its model the
        document's. What `--open DESIGN.ember.json` does."""
        try:
            complete = analyze(read_design(path)).ok
        except DesignFileError as e:  # refused before anything changes; the dialog says what and where
            self.error("Open design", str(e))
            return False
        # ask once, before anything changes: the design is replaced, and the model when complete
        if not self.maybe_discard(document=complete, design=True):
            return False
        if not self.designer.open_design(path, ask=False):
            return False
        self.tabs.setCurrentWidget(self.designer)
        if self.designer.analysis.ok:
            self.designer.build(ask=False)
        return True

    def apply_edit(self, edit: Edit) -> bool:
        return self.edit_actions.apply_edit(edit)

    def group_op(self, op: str, path: str) -> bool:
        return self.edit_actions.group_op(op, path)

    def move_to(self, device: str, fork: bool) -> bool:
        return self.edit_actions.move_to(device, fork)

    def run_check(self, input_text: str):
        return self.checks.run_check(input_text)

    # ---- view ------------------------------------------------------------------------------------------
    def set_theme(self, name: str) -> None:
        apply_theme(QApplication.instance(), name)
        self.settings.set_theme(name)
        (self.actions.theme_dark if name == "dark" else self.actions.theme_light).setChecked(True)

    def shortcut_table(self) -> list[tuple[str, str]]:
        rows = []
        for action in self.actions.all():
            keys = ", ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts())
            if keys:
                rows.append((action.text().replace("&", "").rstrip("…"), keys))
        return sorted(rows)

    def show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td>{name}</td><td><b>{keys}</b></td></tr>" for name, keys in self.shortcut_table())
        self.message(QMessageBox.Icon.Information, "Keyboard Shortcuts", f"<table cellspacing=6>{rows}</table>")

    def show_user_guide(self) -> GuideDialog:
        """Help > User Guide: docs/user-guide.md (beside the packages, in a checkout and in the bundle)."""
        return self.open_dialog(GuideDialog(USER_GUIDE, self, title="Ember User Guide"))

    def show_about(self) -> None:
        self.message(QMessageBox.Icon.Information, "About Ember",
                     "<b>Ember</b><br>Design, inspect and fine-tune neural networks built on Burn's module "
                     "system, in Python.")

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._layout_restored:  # first start: give the tree room for its columns
            self._layout_restored = True
            QTimer.singleShot(0, self.default_dock_sizes)

    def resizeEvent(self, event) -> None:
        """The docks keep their share of the width as the window grows or shrinks (Qt gives it
        all to the central tabs: at 1600 px the inspector kept the 190 px of a smaller window)."""
        super().resizeEvent(event)
        old, new = event.oldSize().width(), event.size().width()
        if old <= 0 or new == old or not self.isVisible():
            return
        docks = [d for d in (self.tree_dock, self.inspector_dock) if d.isVisible() and not d.isFloating()]
        if docks:
            self.resizeDocks(docks, [max(1, round(d.width() * new / old)) for d in docks], Qt.Orientation.Horizontal)

    def default_dock_sizes(self) -> None:
        """The first-start layout: wide docks around the display, narrow ones around the canvas."""
        w = self.width()
        current = self.tabs.currentWidget()
        if current is self.display:
            tree, inspector = 0.46, 0.27
        elif current is self.training_panel or current is self.generate_panel:
            tree, inspector = 0.14, 0.17
        else:
            tree, inspector = 0.24, 0.18
        self.resizeDocks([self.tree_dock, self.inspector_dock], [int(w * tree), int(w * inspector)],
                         Qt.Orientation.Horizontal)

    # ---- unsaved work ----------------------------------------------------------------------------------
    def maybe_discard(self, document: bool = True, design: bool = False) -> bool:
        """Before the document (`document`) or the designer's design (`design`) is replaced: Save /
        Discard / Cancel for each that has unsaved changes (nothing is asked when nothing would be
        lost). True when the caller may go on; False (Cancel, or a save that did not happen) and
        the caller changes nothing. Every path that replaces either asks here, Quit included."""
        doc = self.document
        ask_document = document and doc.module is not None and doc.is_dirty()
        if ask_document and design and self.designer.is_dirty():
            # one question for both (Quit, Open ONNX, Open Design): Discard means all of it
            model = ("The model built from a design" if isinstance(doc.source, DesignSource)
                     else doc.title.rstrip(" *"))
            return ask_save_discard(self, "Unsaved changes",
                                    f"{model} and the design {self.designer.design.name!r} have unsaved changes. "
                                    f"Save them first (the project, then the design)?",
                                    lambda: self.projects.save_project() and self.designer.save_or_ask())
        if ask_document:
            if not ask_save_discard(self, "Unsaved changes",
                                    f"{doc.title.rstrip(' *')} has unsaved changes. Save the project first?",
                                    self.projects.save_project):
                return False
        if design and not self.designer.maybe_discard_design():
            return False
        return True

    # ---- drag and drop: a folder (a Hugging Face model), a project, a script or a checkpoint ---------------
    # Ember only reads what is dropped: the drop is accepted as a copy (or a link), never as the
    # move a file manager may propose, which would let it delete the user's folder afterwards.
    def dragEnterEvent(self, event) -> None:
        if not (self.pretrained.accepts(event.mimeData()) and accept_as_copy(event)):
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:
        if not (self.pretrained.accepts(event.mimeData()) and accept_as_copy(event)):
            super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:
        if not (self.pretrained.accepts(event.mimeData()) and accept_as_copy(event)):
            super().dropEvent(event)
            return
        dropped = self.pretrained.dropped_paths(event.mimeData())
        if dropped and dropped[0].suffix.lower() == ".onnx" and dropped[0].is_file():
            self.onnx.open_onnx(dropped[0])
            return
        self.pretrained.drop(event.mimeData())

    # ---- closing ---------------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        asked = self.confirm_close and (self.document.is_dirty() or self.designer.is_dirty())
        if self.confirm_close and not self.maybe_discard(document=True, design=True):
            event.ignore()
            return
        self.training_panel.shutdown()
        self.tasks.cancel_all()
        # the user was asked: discarded edits leave no autosave to be offered for recovery next time
        self.designer.shutdown(discard=asked)
        self.settings.save_window(self)
        self.settings.sync()
        if asked or not self.document.is_dirty():
            self.projects.remove_autosave()
        super().closeEvent(event)


def _name_command(action, verb: str, command: str) -> None:
    """The Undo / Redo action's menu text and tooltip name the whole command; its toolbar text
    (icon text) stays the one word."""
    action.setText(f"&{verb} {command}".rstrip())
    action.setToolTip(f"{verb} {command}".rstrip() if command else verb)


def accept_as_copy(event) -> bool:
    """Accept a drag or drop as a copy (else a link) of what is dragged, never as a move; False
    when the source offers neither (the event is then ignored)."""
    possible = event.possibleActions()
    for action in (Qt.DropAction.CopyAction, Qt.DropAction.LinkAction):
        if possible & action:
            event.setDropAction(action)
            event.accept()
            return True
    event.ignore()
    return False
