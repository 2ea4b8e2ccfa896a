"""The designer: palette, canvas and configuration form wired to a design, with undo.

`DesignerPanel` holds the design being edited. The widgets only emit what the user asked for;
every edit here becomes a `DesignCommand` on the undo stack (the design's data before and after,
so undo / redo swap snapshots). After each edit the design is analysed again (shapes with named
axes, errors at the node) and the views are refreshed.

- Build turns the design into an engine Module (`engine.design.build_model`): `model_built`
  carries it with its project source, and with a document the panel makes it the document's model.
- Files: `save` / `open_design` (.ember.json, atomic); `export_python` / `export_rust`.
- Autosave: every few seconds while there are unsaved edits, a copy goes to the autosave folder;
  after a crash `recoverable()` lists what was left and `recover()` brings it back.
- Copy / paste use the system clipboard (JSON); keys are handled by the canvas (see
  `widgets.designer.canvas.KEYS`).

The main window puts the panel in its "Graph / Designer" tab (`MainWindow._build_central`).
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from PySide6.QtCore import QMimeData, QStandardPaths, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QUndoCommand, QUndoStack
from PySide6.QtWidgets import (QFileDialog, QLabel, QMessageBox, QSplitter, QStackedWidget, QToolBar, QToolButton,
                               QMenu, QVBoxLayout, QWidget)

from engine.design import (SAMPLES, BuildError, Design, DesignError, DesignFileError, Recovery, analyze, auto_layout,
                           build_model, design_source, discard_autosave, list_autosaves, read_design, save_design,
                           write_autosave)
from engine.interop import ExportError, export_python, export_rust
from engine.design.files import autosave_path
from widgets.designer.canvas import DesignCanvas
from widgets.designer.config_form import ConfigForm
from widgets.designer.palette import Palette
from widgets.model_graph import ModelGraphView

from .core.schema import DesignSource
from .prompts import open_file, save_file

__all__ = ["DesignerPanel", "DesignCommand", "default_autosave_dir", "FRAGMENT_MIME"]

FRAGMENT_MIME = "application/x-ember-design-fragment"
DESIGN_FILTER = "Ember designs (*.ember.json);;All files (*)"
AUTOSAVE_MS = 3000


def default_autosave_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".ember") / "autosave"


class DesignCommand(QUndoCommand):
    """One edit of the design: its data before and after. Moves of the same nodes merge."""

    MOVE_ID = 4242

    def __init__(self, panel: "DesignerPanel", text: str, before: dict, after: dict,
                 select_after: list[str] | None = None, move_key: tuple | None = None):
        super().__init__(text)
        self.panel = panel
        self.before, self.after = before, after
        self.select_before = panel.canvas.selected_nodes()
        self.select_after = select_after
        self.move_key = move_key

    def redo(self) -> None:
        self.panel._apply(self.after, self.select_after)

    def undo(self) -> None:
        self.panel._apply(self.before, self.select_before)

    def id(self) -> int:
        return self.MOVE_ID if self.move_key is not None else -1

    def mergeWith(self, other) -> bool:
        if not isinstance(other, DesignCommand) or other.move_key != self.move_key or self.move_key is None:
            return False
        self.after = other.after
        return True


class DesignerPanel(QWidget):
    """Palette | canvas | form, with a toolbar and a status line, around one design."""

    design_changed = Signal()
    dirty_changed = Signal(bool)
    model_built = Signal(object, dict)
    message = Signal(str)
    graph_requested = Signal()  # the Graph page was shown: the window traces the open model for it

    def __init__(self, document=None, undo_stack: QUndoStack | None = None, autosave_dir=None,
                 autosave_ms: int = AUTOSAVE_MS, parent=None):
        super().__init__(parent)
        self.setObjectName("designer-panel")
        self.document = document
        self.undo_stack = undo_stack if undo_stack is not None else QUndoStack(self)
        self.autosave_dir = Path(autosave_dir) if autosave_dir is not None else default_autosave_dir()
        self.session = f"design-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.design = Design("Model")
        self.analysis = analyze(self.design)
        self.path: Path | None = None
        self._saved = self.design.to_dict()
        self._autosaved: dict | None = None
        self._was_dirty = False
        self.last_model = None
        self.weights = None  # an imported ONNX file's record: a build loads it (`open_imported`)
        self.weights_from: str | None = None
        # asked before the design (design=True) or the document (document=True) is replaced;
        # the main window puts its own `maybe_discard` here. True: go on; False: change nothing.
        self.confirm_discard = self._confirm_discard
        self.settings = None  # the window's (file dialogs start in the last folder used)

        self.palette = Palette()
        self.canvas = DesignCanvas()
        self.form = ConfigForm()
        self.graph = ModelGraphView()  # the traced graph of any open model (app/onnx_actions.py)
        self.status = QLabel("")
        self.status.setObjectName("designer-status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.toolbar = self._make_toolbar()
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.palette)
        split.addWidget(self.canvas)
        split.addWidget(self.form)
        split.setStretchFactor(1, 1)
        split.setSizes([190, 700, 280])
        # the canvas is the working area: never squeezed away; the palette and the node editor can
        # be dragged shut (and open again) at the splitter's handles
        split.setChildrenCollapsible(True)
        split.setCollapsible(1, False)
        self.splitter = split
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toolbar)
        self.pages = QStackedWidget()
        self.pages.addWidget(split)
        self.pages.addWidget(self.graph)
        # the status line is the design's (its last build, save or error): hidden over the graph page
        self.pages.currentChanged.connect(lambda index: self.status.setVisible(index == 0))
        layout.addWidget(self.pages, 1)
        layout.addWidget(self.status)

        self.palette.kind_activated.connect(self.add_node)
        self.canvas.kind_dropped.connect(self.drop_node)
        self.canvas.connect_requested.connect(self.connect_ports)
        self.canvas.nodes_moved.connect(self.move_nodes)
        self.canvas.selection_changed.connect(self._selection_changed)
        self.canvas.command_requested.connect(self.run_command)
        self.canvas.connection_refused.connect(self._say)
        self.form.field_edited.connect(self.set_field)
        self.form.rename_requested.connect(self.rename_node)

        self.autosave_timer = QTimer(self)
        self.autosave_timer.setInterval(max(int(autosave_ms), 50))
        self.autosave_timer.timeout.connect(self.autosave)
        self.autosave_timer.start()
        self._refresh()

    # ------------------------------------------------------------------ toolbar
    def _make_toolbar(self) -> QToolBar:
        tb = QToolBar("Designer")
        tb.setObjectName("designer-toolbar")

        def act(name, text, slot, tip):
            a = QAction(text, self)
            a.setObjectName(f"designer.{name}")
            a.setToolTip(tip)
            # triggered(bool) must not reach a slot's optional first parameter (build's device)
            a.triggered.connect(lambda _checked=False, fn=slot: fn())
            tb.addAction(a)
            setattr(self, f"action_{name}", a)
            return a

        act("new", "New", self.new_design, "Start an empty design")
        act("open", "Open…", self.ask_open, "Open a design (.ember.json)")
        act("save", "Save", lambda: self.save() if self.path else self.ask_save_as(), "Save the design")
        act("save_as", "Save As…", self.ask_save_as, "Save the design under a new name")
        samples = QToolButton()
        samples.setText("Samples")
        samples.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(samples)
        for name in SAMPLES:
            menu.addAction(name, lambda n=name: self.load_sample(n))
        samples.setMenu(menu)
        tb.addWidget(samples)
        tb.addSeparator()
        # the toolbar buttons keep one word whatever the command (a growing label shifted Build and
        # Fit under the pointer); the tooltip names the command
        self.action_undo = self.undo_stack.createUndoAction(self, "Undo")
        self.action_undo.setIconText("Undo")
        self.action_redo = self.undo_stack.createRedoAction(self, "Redo")
        self.action_redo.setIconText("Redo")
        self._name_commands()
        self.undo_stack.indexChanged.connect(self._name_commands)
        tb.addAction(self.action_undo)
        tb.addAction(self.action_redo)
        tb.addSeparator()
        act("arrange", "Arrange", self.arrange, "Lay the graph out by topological generations (Ctrl+Shift+R)")
        act("fit", "Fit", self.canvas_fit, "Fit the design in view (Ctrl+0)")
        tb.addSeparator()
        act("build", "Build", self.build, "Build the design into the model (Ctrl+B)")
        act("export_python", "Export Python…", self.ask_export_python, "Export an Ember Module subclass (.py)")
        act("export_rust", "Export Rust…", self.ask_export_rust, "Export a Burn #[derive(Module)] struct (.rs)")
        tb.addSeparator()
        graph = act("graph", "Model Graph", lambda: self.show_graph(self.action_graph.isChecked()),
                    "Show the traced graph of the open model (module boxes that expand into their ops, a shape "
                    "on every edge) instead of the design's canvas")
        graph.setCheckable(True)
        return tb

    def _name_commands(self, *_):
        undo, redo = self.undo_stack.undoText(), self.undo_stack.redoText()
        self.action_undo.setToolTip(f"Undo {undo} (Ctrl+Z on the canvas)" if undo else "Undo the last design edit "
                                                                                        "(Ctrl+Z on the canvas)")
        self.action_redo.setToolTip(f"Redo {redo} (Ctrl+Shift+Z on the canvas)" if redo else "Redo (Ctrl+Shift+Z "
                                                                                            "on the canvas)")

    def show_graph(self, on: bool = True) -> None:
        """The Graph page (the open model's traced graph) or the design's canvas."""
        self.action_graph.setChecked(on)
        self.pages.setCurrentIndex(1 if on else 0)
        if on:
            self.graph_requested.emit()

    def graph_shown(self) -> bool:
        return self.pages.currentIndex() == 1 and self.isVisible()

    def canvas_fit(self) -> None:
        self.canvas.fit()

    # ------------------------------------------------------------------ applying edits
    def edit(self, text: str, fn, select_after: list[str] | None = None, move_key: tuple | None = None):
        """Run `fn(design_copy)` and push the result as one undoable step; a `DesignError` is shown
        at the node (and in the status line) and changes nothing. Returns fn's result, or None."""
        before = self.design.to_dict()
        trial = Design.from_dict(before)
        try:
            result = fn(trial)
        except DesignError as e:
            self._say(str(e), node=getattr(e, "node", None))
            return None
        after = trial.to_dict()
        if after == before:
            return result
        if callable(select_after):
            select_after = select_after(result)
        self.undo_stack.push(DesignCommand(self, text, before, after, select_after, move_key))
        return result if result is not None else True

    def _apply(self, data: dict, select: list[str] | None) -> None:
        self.design.load(data)
        self._refresh(select)

    def _refresh(self, select: list[str] | None = None) -> None:
        self.analysis = analyze(self.design)
        self.canvas.show_design(self.design, self.analysis, [n for n in (select or []) if n in self.design]
                                if select is not None else None)
        self._selection_changed(self.canvas.selected_nodes())
        self._update_status()
        dirty = self.is_dirty()
        if dirty != self._was_dirty:
            self._was_dirty = dirty
            self.dirty_changed.emit(dirty)
        self.design_changed.emit()

    def _update_status(self) -> None:
        a = self.analysis
        if a.ok:
            outs = ", ".join(f"{n} {t.text()}" for n, t in a.output_shapes().items())
            try:
                params = build_model(self.design, analysis=a).num_params()
                count = f" · {params:,} parameters"
            except BuildError:
                count = ""
            self.status.setText(f"✓ {len(self.design)} nodes · outputs: {outs}{count}")
            self.status.setStyleSheet("")
        else:
            msgs = a.messages() or ["waiting for inputs"]
            more = f" (and {len(msgs) - 1} more)" if len(msgs) > 1 else ""
            self.status.setText(f"⚠ {msgs[0]}{more}")
            self.status.setStyleSheet("color: #d04437;")

    def _say(self, text: str, node: str | None = None) -> None:
        self.status.setText(f"⚠ {text}")
        self.status.setStyleSheet("color: #d04437;")
        if node is not None and node == self.form.node:
            self.form.node_error.show_error(text)
        self.message.emit(text)

    def _selection_changed(self, names: list[str]) -> None:
        if len(names) == 1 and names[0] in self.design:
            n = names[0]
            self.form.set_node(n, self.design.spec(n), self.design.config(n), self.analysis.nodes.get(n))
        else:
            self.form.clear()

    # ------------------------------------------------------------------ edits the views ask for
    def add_node(self, kind: str, name: str | None = None, config: dict | None = None, position=None,
                 after: str | None = None) -> str | None:
        """Add a node; while exactly one node is selected (or `after` is given) the new node is
        connected after it. The new node becomes the selection."""
        if after is None:
            sel = self.canvas.selected_nodes()
            after = sel[0] if len(sel) == 1 else None
        pos = position if position is not None else self.canvas.new_node_position()

        def fn(d: Design):
            new = d.add_node(kind, name, config, pos)
            if after is not None and after in d and d.output_ports(after) and d.input_ports(new):
                d.connect(after, d.output_ports(after)[0], new, d.input_ports(new)[0])
            return new

        return self.edit(f"Add {kind}", fn, select_after=lambda new: [new])

    def drop_node(self, kind: str, x: float, y: float) -> str | None:
        """A kind dragged from the palette and dropped on the canvas: a new node, unconnected, where
        it was dropped (its top-left corner at (x, y))."""
        def fn(d: Design):
            return d.add_node(kind, None, None, (x, y))

        return self.edit(f"Add {kind}", fn, select_after=lambda new: [new])

    def connect_ports(self, src: str, src_port: str, dst: str, dst_port: str) -> bool:
        return bool(self.edit(f"Connect {src} → {dst}", lambda d: d.connect(src, src_port, dst, dst_port),
                              select_after=[dst]))

    def set_field(self, node: str, field: str, value: Any) -> bool:
        ok = bool(self.edit(f"Set {node}.{field}", lambda d: d.set_field(node, field, value), select_after=[node]))
        if not ok and node in self.design:  # put the form back to the design's value
            self._selection_changed(self.canvas.selected_nodes())
        return ok

    def rename_node(self, old: str, new: str) -> bool:
        before = self.design.to_dict()
        trial = Design.from_dict(before)
        try:
            trial.rename_node(old, new)
        except DesignError as e:
            self.form.show_name_error(str(e))
            self._say(str(e))
            return False
        return bool(self.edit(f"Rename {old} → {new}", lambda d: d.rename_node(old, new), select_after=[new]))

    def move_nodes(self, moved: dict) -> None:
        def fn(d: Design):
            for n, pos in moved.items():
                if n in d:
                    d.set_position(n, pos)

        self.edit("Move", fn, select_after=self.canvas.selected_nodes(), move_key=tuple(sorted(moved)))

    def delete_selection(self) -> bool:
        nodes = self.canvas.selected_nodes()
        edges = [e for e in self.canvas.selected_edges() if e[0] not in nodes and e[2] not in nodes]
        if not nodes and not edges:
            return False

        def fn(d: Design):
            for e in edges:
                d.disconnect(*e)
            for n in nodes:
                d.remove_node(n)

        what = ", ".join(nodes) if nodes else f"{len(edges)} connection{'s' if len(edges) > 1 else ''}"
        return bool(self.edit(f"Delete {what}", fn, select_after=[]))

    def arrange(self) -> None:
        self.edit("Arrange", lambda d: auto_layout(d) and None, select_after=self.canvas.selected_nodes())
        self.canvas.fit()

    # ------------------------------------------------------------------ clipboard
    def copy_selection(self) -> bool:
        nodes = self.canvas.selected_nodes()
        if not nodes:
            return False
        frag = self.design.fragment(nodes)
        mime = QMimeData()
        text = json.dumps(frag)
        mime.setData(FRAGMENT_MIME, text.encode("utf-8"))
        mime.setText(text)
        QGuiApplication.clipboard().setMimeData(mime)
        return True

    def cut_selection(self) -> bool:
        return self.copy_selection() and self.delete_selection()

    def paste(self) -> list[str]:
        mime = QGuiApplication.clipboard().mimeData()
        raw = None
        if mime is not None and mime.hasFormat(FRAGMENT_MIME):
            raw = bytes(mime.data(FRAGMENT_MIME)).decode("utf-8")
        elif mime is not None and mime.hasText():
            raw = mime.text()
        try:
            frag = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            frag = None
        if not isinstance(frag, dict) or frag.get("ember") != "design-fragment":
            self._say("the clipboard holds no design nodes (copy nodes in the designer first)")
            return []
        return self.edit("Paste", lambda d: d.paste(frag), select_after=lambda names: names) or []

    def duplicate(self) -> list[str]:
        nodes = self.canvas.selected_nodes()
        if not nodes:
            return []
        frag = self.design.fragment(nodes)
        return self.edit("Duplicate", lambda d: d.paste(frag), select_after=lambda names: names) or []

    def run_command(self, command: str) -> None:
        actions = {
            "delete": self.delete_selection, "undo": self.undo_stack.undo, "redo": self.undo_stack.redo,
            "copy": self.copy_selection, "cut": self.cut_selection, "paste": self.paste,
            "duplicate": self.duplicate, "arrange": self.arrange, "build": self.build,
            "search": self.palette.focus_search, "rename": self.form.focus_name,
        }
        fn = actions.get(command)
        if fn is not None:
            fn()

    # ------------------------------------------------------------------ build and export
    def build(self, device=None, *, ask: bool = True):
        """The design as an engine Module (or None, with the problems in the status line). With a
        document, the model replaces the document's: unsaved changes to it are asked about first
        (`ask=False`: the caller asked already)."""
        try:
            model = build_model(self.design, device, analysis=self.analysis)
        except BuildError as e:
            self._say("cannot build: " + "; ".join(e.messages[:3]) + (" …" if len(e.messages) > 3 else ""))
            return None
        loaded = ""
        if self.weights is not None:  # an imported file's weights: every layer whose tensors still fit
            model, loaded = self._load_weights(model)
        if ask and self.document is not None and not self.confirm_discard(document=True, design=False):
            return None
        source = design_source(self.design)
        if self.path is not None:
            source = {**source, "path": str(self.path)}
        self.last_model = model
        self.model_built.emit(model, source)
        if self.document is not None:
            self.document.set_model(model, DesignSource(source))
        self.status.setText(f"✓ built {self.design.name}: {model.num_params():,} parameters{loaded}")
        self.status.setStyleSheet("")
        return model

    def _load_weights(self, model):
        """The imported weights loaded into `model`: every tensor whose parameter is still there
        with the same shape (a layer replaced or resized since keeps its fresh initialization); the
        status line says how many were loaded."""
        from engine.store.record import ModuleRecord  # noqa: PLC0415

        shapes = {path: tuple(p.shape) for path, p in model.named_params()}
        kept = [e for name, e in self.weights.items() if shapes.get(name) == tuple(e.shape)]
        try:
            model = model.load_record(ModuleRecord(kept).allow_partial().allow_unused())
        except Exception as e:  # noqa: BLE001 - said in the status line; the model keeps its initialization
            self._say(f"the weights of {self.weights_from} were not loaded: {e}")
            return model, ""
        return model, f" ({len(kept)} of {len(self.weights)} tensors from {self.weights_from})"

    def export_python(self, path) -> Path | None:
        return self._export(path, export_python, ".py")

    def export_rust(self, path) -> Path | None:
        return self._export(path, export_rust, ".rs")

    def _export(self, path, fn, suffix: str) -> Path | None:
        try:
            code = fn(self.design, self.analysis)
        except ExportError as e:
            self._say(str(e).replace("\n  ", " "))
            return None
        path = Path(path)
        if path.suffix != suffix:
            path = path.with_name(path.name + suffix)
        from engine.design.files import write_atomic  # noqa: PLC0415

        write_atomic(path, code)
        self.status.setText(f"✓ exported {path.name}")
        self.status.setStyleSheet("")
        return path

    def ask_export_python(self) -> None:
        path = save_file(self, self.settings, "Export Python", "Python (*.py)", f"{self.design.name.lower()}.py")
        if path:
            self.export_python(path)

    def ask_export_rust(self) -> None:
        path = save_file(self, self.settings, "Export Rust (Burn)", "Rust (*.rs)", f"{self.design.name.lower()}.rs")
        if path:
            self.export_rust(path)

    # ------------------------------------------------------------------ files
    def open_imported(self, imported, onnx_path) -> None:
        """Show an imported ONNX file's design with its weights, which a build loads. Not dirty
        until edited (the file holds it; Save asks for a design file). The caller asked about
        unsaved edits."""
        self._discard_own_autosave()
        self.set_design(imported.design)
        self.weights = imported.record
        self.weights_from = Path(onnx_path).name

    def set_design(self, design: Design, path=None, *, dirty: bool = False) -> None:
        """Show `design` (the undo history starts over)."""
        self.undo_stack.clear()
        self.weights = self.weights_from = None
        if hasattr(self, "pages"):
            self.show_graph(False)
        self.design = design
        self.path = Path(path) if path else None
        self._saved = design.to_dict() if not dirty else {}
        self._autosaved = None
        self._refresh([])
        self.canvas.fit()

    def new_design(self) -> bool:
        if not self.confirm_discard(document=False, design=True):
            return False
        self.set_design(Design("Model"))
        return True

    def load_sample(self, name: str) -> bool:
        if not self.confirm_discard(document=False, design=True):
            return False
        self.set_design(SAMPLES[name](), dirty=True)
        return True

    def open_design(self, path, *, ask: bool = True) -> bool:
        """Open a design file (unsaved edits of the current design are asked about first;
        `ask=False`: the caller asked already)."""
        try:
            design = read_design(path)
        except DesignFileError as e:
            self._say(str(e))
            return False
        if ask and not self.confirm_discard(document=False, design=True):
            return False
        self._discard_own_autosave()
        self.set_design(design, path)
        return True

    def save(self, path=None) -> Path | None:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("save: no path (use save(path) or Save As)")
        try:
            written = save_design(self.design, target)
        except OSError as e:
            self._say(f"cannot write {target}: {e.strerror or e}")
            return None
        self.path = written
        self._saved = self.design.to_dict()
        self._discard_own_autosave()
        self._refresh(self.canvas.selected_nodes())
        self.status.setText(f"✓ saved {written.name}")
        self.status.setStyleSheet("")
        return written

    def ask_open(self) -> None:
        path = open_file(self, self.settings, "Open Design", DESIGN_FILTER)
        if path:
            self.open_design(path)

    def ask_save_as(self) -> None:
        path = save_file(self, self.settings, "Save Design", DESIGN_FILTER)
        if path:
            self.save(path)

    def is_dirty(self) -> bool:
        return self.design.to_dict() != self._saved

    def save_or_ask(self) -> bool:
        """Save to the design's file, or ask for one (Save As); True when it was written."""
        if self.path is None:
            path = save_file(self, self.settings, "Save Design", DESIGN_FILTER)
            if not path:
                return False
            return self.save(path) is not None
        return self.save() is not None

    def maybe_discard_design(self) -> bool:
        """Save / Discard / Cancel when the design has unsaved edits; True when it may be replaced."""
        if not self.is_dirty():
            return True
        from .prompts import ask_save_discard  # noqa: PLC0415

        return ask_save_discard(self, "Unsaved design",
                                f"The design {self.design.name!r} has unsaved changes. Save them first?",
                                self.save_or_ask)

    def _confirm_discard(self, document: bool = False, design: bool = False) -> bool:
        """Without a window: the design is asked about here; a dirty document can only be kept or
        discarded (saving a project is the window's)."""
        if design and not self.maybe_discard_design():
            return False
        if document and self.document is not None and self.document.is_dirty():
            from .prompts import ask_save_discard  # noqa: PLC0415

            return ask_save_discard(self, "Unsaved changes", "The open model has unsaved changes; building "
                                    "the design replaces it. Discard them?")
        return True

    # ------------------------------------------------------------------ autosave and recovery
    def autosave_file(self) -> Path:
        return autosave_path(self.autosave_dir, self.session)

    def autosave(self) -> bool:
        """Write the unsaved design to the autosave folder if it changed since the last copy."""
        if not self.is_dirty():
            return False
        data = self.design.to_dict()
        if data == self._autosaved:
            return False
        try:
            write_autosave(self.autosave_dir, self.session, self.design, self.path)
        except OSError:
            return False
        self._autosaved = data
        return True

    def _discard_own_autosave(self) -> None:
        discard_autosave(self.autosave_file())
        self._autosaved = None

    def recoverable(self) -> list[Recovery]:
        """Autosaves left by editing sessions that ended without saving (a crash), newest first."""
        return [r for r in list_autosaves(self.autosave_dir) if r.path != self.autosave_file()]

    def recover(self, recovery: Recovery) -> bool:
        """Bring back a recovered design as unsaved edits (of its original file, if it had one)."""
        try:
            design = recovery.design()
        except DesignFileError as e:
            self._say(str(e))
            return False
        self.set_design(design, recovery.original, dirty=True)
        discard_autosave(recovery.path)
        self.autosave()
        return True

    def offer_recovery(self) -> bool:
        """Ask whether to recover the newest autosave left by a crash (call once at start-up)."""
        found = self.recoverable()
        if not found:
            return False
        r = found[0]
        answer = QMessageBox.question(self, "Recover design",
                                      f"Ember closed without saving {r.describe()}.\nRecover those edits?",
                                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Discard)
        if answer == QMessageBox.StandardButton.Yes:
            return self.recover(r)
        discard_autosave(r.path)
        return False

    def shutdown(self, discard: bool = False) -> None:
        """A clean end of the session: no autosave is left behind for recovery (unsaved edits keep
        theirs unless `discard`: the user was asked and chose to discard them)."""
        self.autosave_timer.stop()
        if discard or not self.is_dirty():
            self._discard_own_autosave()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
