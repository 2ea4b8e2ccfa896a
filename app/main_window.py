"""The main window: the module tree, the central tabs and the inspector around one document.

Widgets emit what the user asked for; this window turns it into document changes (undo
commands through `Document.push_module`), runs long work on `Task`s, and refreshes every view
when the document says `model_changed`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, QTimer
from shiboken6 import isValid
from PySide6.QtGui import QIcon, QKeySequence
from PySide6.QtWidgets import (QApplication, QDockWidget, QFileDialog, QLabel, QMainWindow, QMessageBox, QTabWidget,
                               QToolBar)

from engine import available_devices
from engine.tensor.device import default_device
from engine.module.tree import FieldKind, find
from widgets.checkpoint_dialog import CheckpointDialog
from widgets.contract_editor import ContractEditor
from widgets.device_selector import DeviceSelector
from widgets.display_panel import DisplayPanel
from widgets.group_dialog import GroupDialog
from widgets.inspector import Inspector
from widgets.lora_dialog import LoraDialog
from widgets.module_tree import CONTRACT, ModuleTree
from widgets.task_progress import TaskProgress

from .designer_panel import install_designer, open_design_in_window
from .training_panel import install as install_training
from . import checkpoints, contracts, edits, opening
from .actions import Actions
from .document import PROJECT_SUFFIX, Document, ProjectError, read_project, write_json_atomic
from .settings import Settings
from .theme import apply_theme
from .workers import Task

SCRIPT_FILTER = "Python model scripts (*.py);;All files (*)"
PROJECT_FILTER = f"Ember projects (*{PROJECT_SUFFIX});;All files (*)"
EXPORT_FILTER = "Burnpack (*.bpk);;Safetensors, PyTorch layout (*.safetensors)"
AUTOSAVE_MS = 30_000


ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons" / "app"


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
        self.running_tasks: list[Task] = []
        self.last_message: QMessageBox | None = None
        self.dialog = None  # the open LoRA / group / checkpoint dialog, if any
        self.setObjectName("ember-main-window")
        self.setWindowIcon(app_icon())
        self.resize(1400, 860)
        self.actions = Actions(self)
        self._build_central()
        self._build_docks()
        self._build_toolbar()
        self._build_status()
        self._build_menus()
        self._connect()
        self._layout_restored = self.settings.restore_window(self)
        self.set_theme(self.settings.theme())
        self.autosave_timer = QTimer(self)
        self.autosave_timer.setInterval(AUTOSAVE_MS)
        self.autosave_timer.timeout.connect(self.autosave)
        self.autosave_timer.start()
        data_dir = self.settings.data_dir()
        self.designer = install_designer(self, autosave_dir=None if data_dir is None else data_dir / "autosave")
        self.training_panel = install_training(self)
        self.training_panel.grad_norms_changed.connect(self.tree.model.set_grad_norms)
        self._on_model_changed()

    # ---- layout --------------------------------------------------------------------------------
    def _build_central(self) -> None:
        self.tabs = QTabWidget()
        self.tabs.setObjectName("center-tabs")
        self.display = DisplayPanel()
        self.tabs.addTab(self.display, "Display")
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
        self.tree = ModuleTree()
        self.tree.model.set_contract_provider(self._contract_info)
        self.inspector = Inspector()
        self.contract_editor = ContractEditor()
        self.contract_editor.set_validators(self._validate_contract, self._validate_example_input)
        left, right = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
        self.tree_dock = self._dock("dock.tree", "Module Tree", self.tree, left)
        self.inspector_dock = self._dock("dock.inspector", "Inspector", self.inspector, right)
        self.contract_dock = self._dock("dock.contract", "Shape Contract", self.contract_editor, right)

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
        self.task_progress = TaskProgress()
        self.statusBar().addWidget(self.summary_label, 1)
        self.statusBar().addPermanentWidget(self.message_label)
        self.statusBar().addPermanentWidget(self.task_progress)

    def _build_menus(self) -> None:
        a = self.actions
        bar = self.menuBar()
        m = bar.addMenu("&File")
        self.examples_menu = m.addMenu("Open &Example")
        self.examples_menu.aboutToShow.connect(self._fill_examples_menu)
        m.addAction(a.open_script)
        m.addAction(a.open_checkpoint)
        m.addAction(a.open_project)
        self.recent_menu = m.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
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
        for depth in range(1, 6):
            act = self.depth_menu.addAction(f"Depth {depth}")
            act.triggered.connect(lambda _=False, d=depth: self.tree.expand_to_depth(d))
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
        stack = doc.undo_stack
        a.undo.triggered.connect(stack.undo)
        a.redo.triggered.connect(stack.redo)
        stack.canUndoChanged.connect(a.undo.setEnabled)
        stack.canRedoChanged.connect(a.redo.setEnabled)
        stack.undoTextChanged.connect(lambda t: a.undo.setText(f"&Undo {t}".rstrip()))
        stack.redoTextChanged.connect(lambda t: a.redo.setText(f"&Redo {t}".rstrip()))
        stack.indexChanged.connect(self._on_index_changed)
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
        a.find.triggered.connect(self._focus_filter)
        a.expand_all.triggered.connect(self.tree.expand_all)
        a.collapse_all.triggered.connect(self.tree.view.collapseAll)
        # files
        a.open_script.triggered.connect(self.ask_open_script)
        a.open_checkpoint.triggered.connect(self.ask_open_checkpoint)
        a.open_project.triggered.connect(self.ask_open_project)
        a.save_project.triggered.connect(self.save_project)
        a.save_project_as.triggered.connect(self.save_project_as)
        a.import_checkpoint.triggered.connect(self.ask_import_checkpoint)
        a.export_whole.triggered.connect(lambda: self.ask_export("whole"))
        a.export_adapters.triggered.connect(lambda: self.ask_export("adapters"))
        a.export_materialized.triggered.connect(lambda: self.ask_export("materialized"))
        # model edits
        a.freeze.triggered.connect(lambda: self.group_op("freeze", self.current_path()))
        a.unfreeze.triggered.connect(lambda: self.group_op("unfreeze", self.current_path()))
        a.no_grad.triggered.connect(lambda: self.group_op("no_grad", self.current_path()))
        a.param_group.triggered.connect(self.open_group_dialog)
        a.attach_lora.triggered.connect(lambda: self.open_lora_dialog(self.current_path()))
        a.detach_lora.triggered.connect(self.detach_lora)
        a.materialize.triggered.connect(lambda: self.apply_edit({"op": "materialize"}))
        a.fork.triggered.connect(lambda: self.move_to(self.device_selector.device(), fork=True))
        a.transfer.triggered.connect(lambda: self.move_to(self.device_selector.device(), fork=False))
        a.check_contracts.triggered.connect(lambda: self.run_check(self.contract_editor.input.text()))
        # widgets
        self.tree.selection_changed.connect(self._show_selection)
        self.tree.trainable_toggled.connect(lambda path, on: self.group_op("unfreeze" if on else "freeze", path))
        self.tree.op_requested.connect(lambda op, path: self.group_op(op, path))
        self.tree.lora_requested.connect(self.open_lora_dialog)
        self.tree.contract_requested.connect(self._edit_contract)
        self.device_selector.fork_requested.connect(lambda d: self.move_to(d, fork=True))
        self.device_selector.transfer_requested.connect(lambda d: self.move_to(d, fork=False))
        self.contract_editor.contract_applied.connect(doc.set_contract)
        self.contract_editor.contract_reset.connect(lambda path: doc.set_contract(path, None))
        self.contract_editor.check_requested.connect(self.run_check)
        self.task_progress.cancel_requested.connect(self.cancel_tasks)
        # the document
        doc.model_changed.connect(self._on_model_changed)
        doc.contracts_changed.connect(self._on_contracts_changed)
        doc.check_changed.connect(self._on_check_changed)
        doc.dirty_changed.connect(lambda _d: self._update_title())
        doc.source_changed.connect(self._update_title)

    # ---- views follow the document ------------------------------------------------------------------
    def _on_model_changed(self) -> None:
        module = self.document.module
        self.tree.set_module(module)
        stats = self.tree.model.stats
        self.summary_label.setText(str(stats.total.counts) if module is not None else "No model open.")
        self.device_selector.set_model_devices(stats.total.devices if module is not None else [])
        self._show_selection(self.tree.selected_path())
        self._update_actions()

    def _on_index_changed(self, _index: int) -> None:
        if isValid(self.document.undo_stack):  # not while the window is being torn down
            self._update_actions()

    def _update_actions(self) -> None:
        has = self.document.module is not None
        for action in self.actions.model_actions:
            action.setEnabled(has)
        self.device_selector.set_enabled_actions(has)
        st = self.tree.model.stats.total
        self.actions.materialize.setEnabled(has and st.reparameterized > 0)
        self.actions.export_adapters.setEnabled(has and st.reparameterized > 0)
        self.actions.detach_lora.setEnabled(self._last_lora_index() is not None)

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
        self.inspector.set_selection(module, path, self.tree.model.stats)
        self._show_contract(path, found)

    def _show_contract(self, path: str, found) -> None:
        if found is None or found[0] not in (FieldKind.MODULE, FieldKind.REPARAMETERIZATION):
            self.contract_editor.set_target(None, None, None, False)
        else:
            doc_text = contracts.docstring_contract(found[1])
            edited = self.document.contracts.get(path)
            self.contract_editor.set_target(path, edited or doc_text, doc_text, edited is not None)
        self._show_check_result()
        root_contract = self.document.contracts.get("") or contracts.docstring_contract(self.document.module)
        default = "example" if (self.document.source or {}).get("kind") == "example" else \
            contracts.example_input_text(root_contract, self.document.module)
        self.contract_editor.set_example_input(default)

    def _on_contracts_changed(self) -> None:
        self.tree.model.refresh_column(CONTRACT)
        path = self.tree.selected_path()
        if self.document.module is not None:
            self._show_contract(path or "", find(self.document.module, path or ""))

    def _on_check_changed(self) -> None:
        self.tree.model.refresh_column(CONTRACT)
        self._show_check_result()

    def _show_check_result(self) -> None:
        r = self.document.check_result
        if r is None:
            self.contract_editor.show_result(None, "", "")
            return
        if r.ok:
            shapes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in r.output_shapes)
            self.contract_editor.show_result(True, f"✓ every contract held; output {shapes}", r.flow_text())
        else:
            where = r.failure.path if r.failure else "the model"
            self.contract_editor.show_result(False, f"✗ {where or '(the whole model)'}: {r.error}",
                                             r.error + "\n\nshapes up to the failure:\n" + r.flow_text())

    def _contract_info(self, path: str, module: Any) -> tuple[str | None, str, str]:
        text = self.document.contracts.get(path) or contracts.docstring_contract(module)
        r = self.document.check_result
        if r is None or path not in r.nodes:
            return text, "", ""
        node = r.nodes[path]
        return text, node.status, node.message

    def _update_title(self) -> None:
        self.setWindowTitle(f"{self.document.title} — Ember")

    def _focus_filter(self) -> None:
        self.tree_dock.show()
        self.tree.filter_edit.setFocus()
        self.tree.filter_edit.selectAll()

    # ---- messages ------------------------------------------------------------------------------------
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
        self.message_timer.start(ms)

    # ---- edits ---------------------------------------------------------------------------------------
    def apply_edit(self, edit: dict) -> bool:
        """Perform an edit on the document's module as one undoable step; errors go to a dialog and
        change nothing."""
        module = self.document.module
        if module is None:
            return False
        if edits.edit_cost_bytes(module, edit) > edits.HEAVY_EDIT_BYTES:
            self._apply_edit_in_background(module, edit)
            return True
        try:
            after = edits.apply_edit(module, edit)
        except Exception as e:  # noqa: BLE001 - the engine's message, shown; the model is unchanged
            self.error("Edit failed", f"{edits.describe(edit)} failed: {type(e).__name__}: {e}")
            return False
        self.document.push_module(edits.describe(edit), after, edit)
        self.status(edits.describe(edit))
        return True

    def _apply_edit_in_background(self, module, edit: dict) -> Task:
        """A long edit (a move that copies gigabytes, QLoRA packing) on a worker thread: the
        window stays responsive, and the result becomes one undoable step when it arrives, unless
        the model was changed meanwhile (then it is dropped and the status bar says so)."""
        text = edits.describe(edit)

        def done(after):
            if self.document.module is not module:
                self.status(f"{text}: the model changed while it ran; the result was dropped.")
                return
            self.document.push_module(text, after, edit)
            self.status(text)

        def failed(f):
            self.error("Edit failed", f"{text} failed: {f}")

        self.status(f"{text}…")
        return self.start_task(Task(lambda state: edits.apply_edit(module, edit), title=text), done, failed)

    def group_op(self, op: str, path: str, spec: dict | None = None) -> bool:
        group = spec if spec is not None else edits.subtree_group(path)
        return self.apply_edit({"op": op, "group": group})

    def move_to(self, device: str, fork: bool) -> bool:
        if not device:
            return False
        return self.apply_edit({"op": "fork" if fork else "to_device", "device": device})

    def _last_lora_index(self) -> int | None:
        stack = self.document.undo_stack
        for i in range(stack.index() - 1, -1, -1):
            edit = getattr(stack.command(i), "edit", None)
            if edit and edit.get("op") == "lora":
                return i
        return None

    def detach_lora(self) -> None:
        """Detach = undo back to before the last LoRA attachment (redo attaches it again)."""
        i = self._last_lora_index()
        if i is None:
            self.status("No LoRA attachment to detach in this session's history.")
            return
        undone = self.document.undo_stack.index() - i
        self.document.undo_stack.setIndex(i)
        self.status(f"LoRA detached ({undone} step(s) undone; Redo attaches it again)")

    def open_group_dialog(self) -> GroupDialog | None:
        if self.document.module is None:
            return None
        path = self.current_path()
        dialog = GroupDialog(self.document.module, self,
                             mode="regex" if path else "all",
                             text=edits.subtree_group(path).get("pattern", ""))
        dialog.group_chosen.connect(lambda op, spec: self.group_op(op, path, spec))
        return self._open_dialog(dialog)

    def open_lora_dialog(self, path: str = "") -> LoraDialog | None:
        if self.document.module is None:
            return None
        spec = edits.subtree_group(path)
        dialog = LoraDialog(self.document.module, self, group_mode=spec["kind"], group_text=spec.get("pattern", ""))
        dialog.lora_chosen.connect(self.apply_edit)
        return self._open_dialog(dialog)

    def _open_dialog(self, dialog):
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(lambda _r: setattr(self, "dialog", None) if self.dialog is dialog else None)
        self.dialog = dialog
        dialog.open()
        return dialog

    def _edit_contract(self, path: str) -> None:
        self.tree.select_path(path)
        self.contract_dock.show()
        self.contract_dock.raise_()
        self.contract_editor.edit.setFocus()
        self.contract_editor.edit.selectAll()

    # ---- contracts -------------------------------------------------------------------------------
    @staticmethod
    def _validate_contract(text: str) -> str | None:
        try:
            contracts.parse_contract(text)
        except contracts.ContractSyntaxError as e:
            return str(e)
        return None

    def _validate_example_input(self, text: str) -> str | None:
        try:
            spec = contracts.parse_example_input(text)
        except contracts.ContractSyntaxError as e:
            return str(e)
        if spec == contracts.EXAMPLE and (self.document.source or {}).get("kind") != "example":
            return "'example' needs a model opened from the examples; give shapes such as [2, 784]"
        return None

    def run_check(self, input_text: str) -> Task | None:
        """Run the example input through the model with checks at every module boundary, on a worker."""
        module = self.document.module
        if module is None:
            return None
        err = self._validate_example_input(input_text)
        if err:
            self.contract_editor.input_error.show_error(err)
            self.contract_dock.show()
            return None
        spec = contracts.parse_example_input(input_text)
        devices = module.devices()
        device = devices[0] if devices else default_device()
        source = self.document.source
        modules = list(module.named_modules())
        wanted = {p: (self.document.contracts.get(p) or contracts.docstring_contract(m)) for p, m in modules}
        wanted = {p: t for p, t in wanted.items() if t}
        bad = {p: self._validate_contract(t) for p, t in wanted.items()}
        bad = {p: e for p, e in bad.items() if e}
        if bad:
            path, e = next(iter(bad.items()))
            self.error("Check", f"the contract of {path or 'the model'} cannot be read: {e}")
            return None

        def work(state):
            if spec == contracts.EXAMPLE:
                inputs = [opening.example_input(source, 2, device)]
                if inputs[0] is None:
                    raise ValueError(f"the example {source.get('name')!r} has no example_input(); give shapes")
            else:
                inputs = contracts.make_example_input(spec, device)
            return contracts.check(module, inputs, wanted, modules, checkpoint=state.check_cancelled)

        def done(result):
            if self.document.module is not module:
                self.status("The model changed while it was being checked; the result was dropped.")
                return
            self.document.set_check_result(result)
            if result.failure is not None:
                self.tree.select_path(result.failure.path)
                self.contract_dock.show()
            self.status("Check: every contract held" if result.ok else f"Check failed at "
                        f"{result.failure.path if result.failure else 'the model'}")

        self.contract_editor.show_result(None, "Checking…", "")
        return self.start_task(Task(work, title="Checking shape contracts"), done,
                               lambda f: self.error("Check failed", str(f), f.traceback))

    # ---- tasks ----------------------------------------------------------------------------------------
    def start_task(self, task: Task, on_finished: Callable[[Any], None],
                   on_failed: Callable[[Any], None] | None = None) -> Task:
        self.running_tasks.append(task)
        self.task_progress.begin(task.title)
        task.progress.connect(self.task_progress.set_progress)
        task.status.connect(self.task_progress.set_status)
        task.finished.connect(on_finished)
        task.failed.connect(on_failed or (lambda f: self.error(task.title, str(f), f.traceback)))
        task.cancelled.connect(lambda: self.status(f"{task.title}: cancelled"))
        task.done.connect(lambda: self._task_done(task))
        return task.start()

    def _task_done(self, task: Task) -> None:
        if task in self.running_tasks:
            self.running_tasks.remove(task)
        if not self.running_tasks:
            self.task_progress.end()

    def cancel_tasks(self) -> None:
        for task in self.running_tasks:
            task.cancel()

    # ---- opening ---------------------------------------------------------------------------------------
    def _fill_examples_menu(self) -> None:
        self.examples_menu.clear()
        names = opening.list_examples()
        for name in names:
            act = self.examples_menu.addAction(name)
            act.setObjectName(f"example:{name}")
            act.setToolTip(opening.describe_example(name))
            act.triggered.connect(lambda _=False, n=name: self.open_example(n))
        if not names:
            self.examples_menu.addAction("(no examples installed)").setEnabled(False)

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        files = self.settings.recent_files()
        for entry in files:
            act = self.recent_menu.addAction(entry)
            act.triggered.connect(lambda _=False, e=entry: self.open_path(e))
        if files:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear Recent").triggered.connect(self.settings.clear_recent)
        else:
            self.recent_menu.addAction("(none)").setEnabled(False)

    def _set_model(self, module: Any, source: dict, **kw) -> None:
        self.document.set_model(module, source, **kw)

    def open_example(self, name: str) -> bool:
        try:
            module = opening.load_example(name)
        except opening.OpenError as e:
            self.error("Open example", e.message, e.details)
            return False
        self._set_model(module, {"kind": "example", "name": name})
        self.status(f"Opened the example {name}")
        return True

    def open_script(self, spec: str) -> bool:
        """Open `path.py[:factory]`; a script that raises shows its traceback and changes nothing."""
        try:
            source = opening.source_for_script(spec)
            module = opening.load_script(source["path"], source["factory"])
        except opening.OpenError as e:
            self.error("Open model script", e.message, e.details)
            return False
        self._set_model(module, source)
        self.settings.add_recent(f"{source['path']}:{source['factory']}")
        self.status(f"Opened {Path(source['path']).name}:{source['factory']}()")
        return True

    def open_path(self, entry: str) -> bool:
        """Open what a recent-files entry or `--open` names: a project, a script, or a checkpoint
        (which needs an architecture: the dialog asks)."""
        text = str(entry)
        if text.endswith(PROJECT_SUFFIX):
            return self.open_project(text)
        path, _factory = opening.split_script_spec(text)
        if path.suffix.lower() in (".bpk", ".safetensors"):
            dialog = self.ask_open_checkpoint()
            dialog.path.setText(str(path))
            return False
        return self.open_script(text)

    def ask_open_script(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open Model Script", "", SCRIPT_FILTER)
        if path:
            self.open_script(path)

    def ask_open_project(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open Project", "", PROJECT_FILTER)
        if path:
            self.open_project(path)

    def ask_open_checkpoint(self) -> CheckpointDialog:
        dialog = CheckpointDialog(self, examples=opening.list_examples(), title="Open Checkpoint into Architecture")
        dialog.chosen.connect(self._open_checkpoint_choice)
        return self._open_dialog(dialog)

    def _open_checkpoint_choice(self, choice: dict) -> None:
        arch = choice["architecture"]
        if arch["kind"] == "script":
            arch = opening.source_for_script(arch["spec"])
        source = {"kind": "checkpoint", "path": choice["path"], "architecture": arch,
                  "allow_partial": choice["allow_partial"]}
        self.open_source(source)

    def open_source(self, source: dict, *, edits_: list[dict] | None = None, contracts_: dict | None = None,
                    project_path: Path | None = None, dirty: bool = False) -> bool:
        """Make the model a source describes, replay `edits_`, and show it. A checkpoint source
        loads on a worker; the window stays responsive."""
        kind = source.get("kind")
        try:
            base = opening.build(source["architecture"] if kind == "checkpoint" else source)
        except opening.OpenError as e:
            self.error("Open", e.message, e.details)
            return False

        def finish(module):
            try:
                module = edits.replay(module, edits_ or [])
            except edits.EditError as e:
                self.error("Open project", f"the model opened, but replaying its edits failed: {e}")
                return
            self._set_model(module, source, edits=edits_, contracts=contracts_, project_path=project_path,
                            dirty=dirty)

        if kind != "checkpoint":
            finish(base)
            return True
        path, partial = source["path"], source.get("allow_partial", False)

        def loaded(result):
            module, report = result
            finish(module)
            if not report.complete:
                self.message(QMessageBox.Icon.Warning, "Checkpoint loaded partially", report.summary(),
                             "\n".join(report.lines()))

        self.start_task(Task(lambda state: checkpoints.load(base, path, partial, state.set_progress),
                             title=f"Loading {Path(path).name}"), loaded, self._load_failed)
        return True

    def _load_failed(self, failure) -> None:
        exc = failure.exception
        lines = []
        for attr, label in (("missing", "missing"), ("unused", "unused"), ("mismatched", "mismatched")):
            for row in getattr(exc, attr, []) or []:
                lines.append(f"{label:10} " + "  ".join(str(x) for x in row))
        self.error("Checkpoint not loaded", f"{exc}" if not lines else f"{type(exc).__name__}: the checkpoint does "
                   f"not fit the model; nothing was changed.", "\n".join(lines) or failure.traceback)

    # ---- projects -------------------------------------------------------------------------------------
    def open_project(self, path: str | Path) -> bool:
        try:
            data = read_project(path)
        except ProjectError as e:
            self.error("Open project", str(e))
            return False
        if data["source"].get("kind") == "design":
            ok = open_design_in_window(self, path)
            if ok:
                self.settings.add_recent(str(Path(path).resolve()))
            return ok
        ok = self.open_source(data["source"], edits_=data["edits"], contracts_=data["contracts"],
                              project_path=Path(path))
        if ok:
            self.settings.add_recent(str(Path(path).resolve()))
            self.offer_recovery(Path(path))
        return ok

    def save_project(self) -> bool:
        if self.document.project_path is None:
            return self.save_project_as()
        return self._save_to(self.document.project_path)

    def save_project_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(self, "Save Project", "", PROJECT_FILTER)
        return bool(path) and self._save_to(Path(path))

    def _save_to(self, path: Path) -> bool:
        if self.document.module is None:
            return False
        try:
            written = self.document.save_project(path)
        except OSError as e:
            self.error("Save project", f"cannot write {path}: {e.strerror or e}")
            return False
        self._remove_autosave()
        self.settings.add_recent(str(written.resolve()))
        self.status(f"Saved {written}")
        return True

    def autosave_path(self) -> Path:
        own = self.document.autosave_path()
        return own if own is not None else self._untitled_autosave()

    def autosave(self) -> bool:
        """Keep a copy of an unsaved document beside it (recovered after a crash)."""
        doc = self.document
        if doc.module is None or not doc.is_dirty():
            return False
        try:
            write_json_atomic(self.autosave_path(), doc.project_data())
        except OSError:
            return False
        return True

    def offer_recovery(self, project_path: Path | None = None) -> QMessageBox | None:
        """After a crash: offer the autosave of `project_path` (or of the untitled document) when it
        is newer than the project. Recover opens it unsaved; Discard deletes it."""
        project_path = Path(project_path) if project_path else None
        auto = project_path.with_name(project_path.name + ".autosave") if project_path else \
            self._untitled_autosave()
        if not auto.is_file():
            return None
        if project_path is not None and project_path.is_file() and \
                auto.stat().st_mtime <= project_path.stat().st_mtime:
            return None
        try:
            data = read_project(auto)
        except ProjectError:
            return None
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(auto.stat().st_mtime))
        box = QMessageBox(QMessageBox.Icon.Question, "Recover unsaved changes?",
                          f"Ember kept unsaved changes to {project_path.name if project_path else 'an untitled model'} "
                          f"from {when} ({len(data['edits'])} edit(s)). Recover them?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Discard, self)
        box.setObjectName("recovery")
        box.button(QMessageBox.StandardButton.Yes).setText("Recover")

        def answered(button):
            if box.buttonRole(button) == QMessageBox.ButtonRole.YesRole:
                self.open_source(data["source"], edits_=data["edits"], contracts_=data["contracts"],
                                 project_path=project_path, dirty=True)
            else:
                auto.unlink(missing_ok=True)

        box.buttonClicked.connect(answered)
        box.open()
        self.last_message = box
        return box

    def _untitled_autosave(self) -> Path:
        return Path(self.settings.q.fileName()).parent / "untitled.ember.json.autosave"

    def _remove_autosave(self) -> None:
        try:
            self.autosave_path().unlink()
        except (FileNotFoundError, OSError):
            pass

    # ---- checkpoints ------------------------------------------------------------------------------------
    def ask_import_checkpoint(self) -> CheckpointDialog | None:
        if self.document.module is None:
            return None
        dialog = CheckpointDialog(self, examples=None, title="Import Checkpoint")
        dialog.chosen.connect(lambda c: self.import_checkpoint(c["path"], c["allow_partial"]))
        return self._open_dialog(dialog)

    def import_checkpoint(self, path: str, allow_partial: bool) -> Task | None:
        module = self.document.module
        if module is None:
            return None

        def loaded(result):
            new, report = result
            if self.document.module is not module:
                self.status("The model changed while the checkpoint loaded; the load was dropped.")
                return
            edit = {"op": "load", "path": str(Path(path).resolve()), "allow_partial": allow_partial}
            self.document.push_module(edits.describe(edit), new, edit)
            self.status(f"{Path(path).name}: {report.summary()}")
            if not report.complete:
                self.message(QMessageBox.Icon.Warning, "Checkpoint loaded partially", report.summary(),
                             "\n".join(report.lines()))

        return self.start_task(Task(lambda state: checkpoints.load(module, path, allow_partial, state.set_progress),
                                    title=f"Loading {Path(path).name}"), loaded, self._load_failed)

    def ask_export(self, kind: str) -> Task | None:
        if self.document.module is None:
            return None
        path, _ = QFileDialog.getSaveFileName(self, f"Export {kind}", "", EXPORT_FILTER)
        return self.export_checkpoint(path, kind) if path else None

    def export_checkpoint(self, path: str, kind: str) -> Task | None:
        module = self.document.module
        if module is None:
            return None
        started = time.perf_counter()
        return self.start_task(
            Task(lambda state: checkpoints.export(module, path, kind, state.set_progress), title=f"Saving {Path(path).name}"),
            lambda written: self.status(f"Saved {written} ({kind}, {time.perf_counter() - started:.1f} s)"),
            lambda f: self.error("Export failed", str(f.exception), f.traceback))

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

    def show_about(self) -> None:
        self.message(QMessageBox.Icon.Information, "About Ember",
                     "<b>Ember</b><br>Design, inspect and fine-tune neural networks built on Burn's module "
                     "system, in Python.")

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._layout_restored:  # first start: give the tree room for its columns
            self._layout_restored = True
            QTimer.singleShot(0, self._default_dock_sizes)

    def _default_dock_sizes(self) -> None:
        """The first-start layout: wide docks around the display, narrow ones around the canvas."""
        w = self.width()
        current = self.tabs.currentWidget()
        if current is self.display:
            tree, inspector = 0.46, 0.27
        elif current is getattr(self, "training_panel", None):
            tree, inspector = 0.14, 0.17
        else:
            tree, inspector = 0.24, 0.18
        self.resizeDocks([self.tree_dock, self.inspector_dock], [int(w * tree), int(w * inspector)],
                         Qt.Orientation.Horizontal)

    # ---- closing ---------------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        if self.confirm_close and self.document.is_dirty():
            answer = QMessageBox.question(
                self, "Unsaved changes", "Save the project before closing?",
                QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard
                | QMessageBox.StandardButton.Cancel)
            if answer == QMessageBox.StandardButton.Cancel or (
                    answer == QMessageBox.StandardButton.Save and not self.save_project()):
                event.ignore()
                return
        self.training_panel.shutdown()
        self.cancel_tasks()
        self.designer.shutdown()
        self.settings.save_window(self)
        self.settings.sync()
        if not self.document.is_dirty():
            self._remove_autosave()
        super().closeEvent(event)
