"""ONNX in and out of the window, and the traced graph of the open model.

- File ▸ Open ONNX… (`ask_open`, `open_onnx`; also `--open file.onnx` and a dropped file): the file
  is imported on a worker (`engine.design.import_onnx`); unsaved work is asked about only once the
  import succeeded, then the design opens in the designer with its weights (a build loads them) and
  the import report (every ONNX node and what it became) is shown. A file that cannot be imported
  shows the error (the node named, every unsupported op listed) and changes nothing. The document's
  source is then an `OnnxSource` (the file and the SHA-256 of its bytes), so a project saved after
  it reopens the file's design with the file's weights (`open_source`, on a worker), then replays
  the edits made since; a missing or changed file is refused, naming it, and nothing changes. A
  model built from the design after it was edited holds weights no project can name: Save Project
  refuses it (`save_refusal`) and suggests Export ▸ ONNX….
- File ▸ Export ▸ ONNX… (`ask_export`, `export_onnx`): any open model, traced on a worker with the
  contract editor's example input (the example's own batch for an example); LoRA / QLoRA are
  materialized on a copy by the exporter. A model whose parameters are not allocated is refused
  with an estimate when allocating them would not fit in memory.
- The Graph page of the Graph / Designer tab (`refresh_graph`): the open model traced on a worker
  (shapes only, no parameter allocated, when its lazy parameters are large) and drawn by
  `widgets.model_graph.ModelGraphView`; traced only while the page is shown.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from PySide6.QtWidgets import QMessageBox

from engine.design import shape_check
from engine.interop import export_onnx, trace_model
from engine.module import contracts, memory
from engine.tensor.device import default_device

from .contract_check import SHAPES_ONLY_FROM, default_example_input
from .core import edits, opening
from .core.schema import DesignSource, Edit, OnnxSource
from .designer_panel import DesignerPanel
from .document import Document
from .host import Host
from .prompts import open_file, save_file
from .workers import BackgroundTask

__all__ = ["OnnxActions", "ONNX_FILTER", "model_inputs"]

ONNX_FILTER = "ONNX models (*.onnx);;All files (*)"


def model_inputs(module, source, text: str) -> list:
    """The example input batch `text` describes (the contract editor's syntax: `[2, 784]`,
    `int[2, 16]`, or `example`); ValueError saying what was expected."""
    try:
        spec = contracts.parse_example_input(text)
    except contracts.ContractSyntaxError as e:
        raise ValueError(f"the example input {text!r} cannot be read: {e}") from None
    devices = module.devices()
    device = devices[0] if devices else default_device()
    if spec == contracts.EXAMPLE:
        x = opening.example_input(source, 2, device)
        if x is None:
            raise ValueError("the model has no example_input(); give the input's shape in the Shape Contract "
                             "dock (for example [2, 784])")
        return [x]
    return contracts.make_example_input(spec, device)


class OnnxActions:
    def __init__(self, document: Document, host: Host, *, designer: DesignerPanel, contract_editor, contract_dock,
                 selected_path: Callable[[], str | None], show_designer: Callable[[], None]):
        """`designer`: the Graph / Designer tab (an import opens there, the Graph page draws the
        trace); `contract_editor` and its `contract_dock`: the example input, shown when it is
        wrong; `selected_path()`: the tree's selection; `show_designer()` brings its tab forward."""
        self.host = host
        self.document = document
        self.designer = designer
        self.contract_editor = contract_editor
        self.contract_dock = contract_dock
        self.selected_path = selected_path
        self.show_designer = show_designer
        self.last_report = None  # the ImportReport of the last ONNX file opened
        self.last_export: Path | None = None
        self._graph_for = None  # id of the model the graph shows (or is being traced for)
        self.graph_task = None

    # ---- example input --------------------------------------------------------------------------
    def input_text(self) -> str:
        doc = self.document
        text = self.contract_editor.input.text().strip()
        if not text:
            if isinstance(doc.source, opening.ExampleSource):
                text = "example"
            else:
                text = default_example_input(doc.contract_for("", doc.module), doc.module)
        return text

    # ---- open -----------------------------------------------------------------------------------
    def ask_open(self, *_args) -> None:
        path = open_file(self.host.dialog_parent(), self.host.settings, "Open ONNX", ONNX_FILTER)
        if path:
            self.open_onnx(path)

    def open_onnx(self, path) -> BackgroundTask:
        w = self.host
        path = Path(path)

        def done(result):
            imported, digest = result
            self._opened(imported, path, digest)

        def failed(f):
            exc = getattr(f, "exception", None)
            report = getattr(exc, "report", None)
            details = report.text() if report is not None else getattr(f, "traceback", "")
            w.error("Open ONNX", f"{path.name} cannot be imported: {f}\nNothing was changed.", details)

        return w.tasks.start(BackgroundTask(lambda _state: opening.import_onnx_file(path), title=f"Importing {path.name}"), done,
                             failed, kind="onnx-open")

    def _opened(self, imported, path: Path, digest: str | None = None) -> bool:
        w, designer, doc = self.host, self.designer, self.document
        if not w.maybe_discard(document=True, design=True):
            w.status(f"{path.name}: not opened (kept what is open)")
            return False
        self.last_report = imported.report
        designer.open_imported(imported, path)
        self.show_designer()
        if designer.analysis.ok:
            model = designer.build(ask=False)
            if model is not None and digest is not None and doc.module is model:
                # the model is the file's design with the file's weights: a project names the file
                doc.source = OnnxSource(str(path.resolve()), digest)
                doc.source_changed.emit()
        w.message(QMessageBox.Icon.Information, "ONNX import",
                  f"{path.name}: {len(imported.design.nodes())} design nodes from "
                  f"{len(imported.report.mapping)} ONNX nodes; the details list what each became.",
                  imported.report.text())
        return True

    # ---- projects ---------------------------------------------------------------------------------
    def open_source(self, source: OnnxSource, *, edits_: list[Edit] | None = None, contracts_: dict | None = None,
                    project_path: Path | None = None, dirty: bool = False, runs_: list | None = None) -> BackgroundTask:
        """Open a project's ONNX source: the file imported again on a worker (the same import as
        File ▸ Open ONNX…, its SHA-256 checked against the project's), its design built with its
        weights, then `edits_` replayed. A missing, changed or unimportable file, or an edit that
        fails, shows the error naming the project and the file; the document is left as it was.
        The caller asked about unsaved work."""
        w, doc = self.host, self.document
        replayed = list(edits_ or [])
        where = f"{project_path}: " if project_path is not None else ""
        imported_of = []

        def work(state):
            module, imported = opening.load_onnx(source.path, source.sha256)
            imported_of.append(imported)
            state.set_progress(0.5)
            try:
                return edits.replay(module, replayed, state.check_cancelled) if replayed else module
            except edits.EditError as e:
                state.check_cancelled()
                raise _ReplayFailed(str(e)) from e

        def loaded(module: Any) -> None:
            if not self.designer.is_dirty():  # the designer shows the file's design, as Open ONNX does
                self.designer.open_imported(imported_of[0], Path(source.path))
            doc.set_model(module, source, edits=edits_, contracts=contracts_, project_path=project_path,
                          runs=runs_, dirty=dirty)
            self.last_report = imported_of[0].report
            w.status(f"Opened {Path(source.path).name} with its weights"
                     + (f" and {len(replayed)} edit(s)" if replayed else ""))

        def failed(failure) -> None:
            exc = failure.exception
            if isinstance(exc, _ReplayFailed):
                w.error("Open project", f"{where}the model opened, but replaying its edits failed: {exc}\n"
                                        "Nothing was changed.")
            elif isinstance(exc, opening.OpenError):
                w.error("Open project", f"{where}source: {exc.message}\nNothing was changed.", exc.details)
            else:
                w.error("Open project", f"{where}source: {source.path}: {type(exc).__name__}: {exc}\n"
                                        "Nothing was changed.", failure.traceback)

        name = Path(project_path).name if project_path is not None else Path(source.path).name
        was, step = doc.module, doc.undo_stack.index()
        return w.tasks.start(BackgroundTask(work, title=f"Opening {Path(source.path).name}"), loaded, failed, kind="open",
                             valid_while=lambda: doc.module is was and doc.undo_stack.index() == step,
                             dropped=f"Opening {name}: the open model was changed meanwhile, so it was kept and "
                                     f"{name} was not opened.")

    def save_refusal(self) -> str:
        """Why the open model cannot be saved as a project ('' when it can): one built from an
        imported ONNX file's design after that design was edited holds the file's weights where
        they still fit, and a project (which replays the design) would rebuild it without them."""
        doc, designer = self.document, self.designer
        if not isinstance(doc.source, DesignSource) or designer.weights is None or doc.module is None \
                or doc.module is not designer.last_model:
            return ""
        return (f"the open model was built from the design of {designer.weights_from} with that file's weights, and "
                "a project replays a design with freshly initialized weights, so they would be lost. Export the "
                "model with File ▸ Export ▸ ONNX… and open that file (a project saved then keeps its weights), or "
                f"open {designer.weights_from} again and save the project before editing its design.")

    # ---- export ---------------------------------------------------------------------------------
    def ask_export(self, *_args) -> None:
        w, doc = self.host, self.document
        if doc.module is None:
            return
        name = (doc.title.rstrip(" *").split(" — ")[0] or "model").replace(" ", "_").replace("/", "_").lower()
        path = save_file(w.dialog_parent(), w.settings, "Export ONNX", ONNX_FILTER, f"{name}.onnx")
        if path:
            self.export_onnx(path)

    def export_onnx(self, path, input_text: str | None = None) -> BackgroundTask | None:
        w, doc = self.host, self.document
        module = doc.module
        if module is None:
            return None
        path = Path(path)
        if path.suffix != ".onnx":
            path = path.with_name(path.name + ".onnx")
        text = input_text if input_text is not None else self.input_text()
        try:
            inputs = model_inputs(module, doc.source, text)
        except (ValueError, opening.OpenError) as e:
            self.contract_dock.show()
            w.error("Export ONNX", f"{e}")
            return None
        lazy = shape_check.unallocated_bytes(module)
        if lazy > SHAPES_ONLY_FROM:
            try:
                memory.MemoryEstimate("The ONNX export", {"parameters to allocate": lazy,
                                                          "the file's initializers": lazy}
                                      ).check(memory.available_memory())
            except memory.NotEnoughMemory as e:
                w.error("Export ONNX", f"{e}\nNothing was written.")
                return None

        def done(written):
            self.last_export = Path(written)
            w.status(f"Exported {Path(written).name} ({Path(written).stat().st_size:,} bytes)")
            w.message(QMessageBox.Icon.Information, "Export ONNX", f"Wrote {written}")

        def failed(f):
            w.error("Export ONNX", f"{path.name} was not written: {f}", getattr(f, "traceback", ""))

        return w.tasks.start(BackgroundTask(lambda _state: export_onnx(module, path, inputs), title=f"Exporting {path.name}"), done, failed,
                             kind="onnx-export")

    # ---- the graph of the open model ------------------------------------------------------------
    def model_changed(self) -> None:
        self._graph_for = None
        if self.designer.graph_shown():
            self.refresh_graph()

    def refresh_graph(self) -> BackgroundTask | None:
        """Trace the open model (on a worker) for the Graph page, unless it shows it already."""
        w, doc = self.host, self.document
        view = self.designer.graph
        module = doc.module
        if module is None:
            self._graph_for = None
            view.set_message("No model open: open an example, a script, a pretrained model or an ONNX file.")
            return None
        if self._graph_for == id(module):
            return None
        self._graph_for = id(module)
        try:
            inputs = model_inputs(module, doc.source, self.input_text())
        except (ValueError, opening.OpenError) as e:
            view.set_message(f"No graph: {e}")
            return None
        shapes_only = shape_check.unallocated_bytes(module) > SHAPES_ONLY_FROM
        view.set_message("Tracing the model…")

        def work(_state):
            if shapes_only:
                return trace_model(module, inputs, shape_only=True), True
            try:
                return trace_model(module, inputs), False
            except Exception:  # noqa: BLE001 - a forward the full trace cannot follow: shapes only
                return trace_model(module, inputs, shape_only=True), True

        def done(result):
            trace, shapes = result
            view.set_trace(trace, "shapes only" if shapes else "")
            view.select_path(self.selected_path())

        def failed(f):
            self._graph_for = None
            view.set_message(f"No graph: the trace failed: {f}")

        task = BackgroundTask(work, title="Tracing the model's graph")
        self.graph_task = w.tasks.start(task, done, failed, kind="graph", valid_while=lambda: doc.module is module,
                                        dropped="The model changed while its graph was traced.")
        return self.graph_task


class _ReplayFailed(Exception):
    """A project's edits failed to replay after its ONNX file was imported."""
