"""ONNX in and out of the window, and the traced graph of the open model.

- File ▸ Open ONNX… (`ask_open`, `open_onnx`; also `--open file.onnx` and a dropped file): the file
  is imported on a worker (`engine.design.import_onnx`); unsaved work is asked about only once the
  import succeeded, then the design opens in the designer with its weights (a build loads them) and
  the import report (every ONNX node and what it became) is shown. A file that cannot be imported
  shows the error (the node named, every unsupported op listed) and changes nothing.
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
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QMessageBox

from engine.design import OnnxExportError, export_onnx, import_onnx, shape_check, trace_model
from engine.design.onnx_import import OnnxImportError
from engine.module import contracts, memory
from engine.tensor.device import default_device

from .contract_check import SHAPES_ONLY_FROM, default_example_input
from .core import opening
from .core.schema import DesignSource
from .prompts import open_file, save_file
from .workers import Task

if TYPE_CHECKING:
    from .main_window import MainWindow

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
    def __init__(self, window: "MainWindow"):
        self.window = window
        self.document = window.document
        self.last_report = None  # the ImportReport of the last ONNX file opened
        self.last_export: Path | None = None
        self._graph_for = None  # id of the model the graph shows (or is being traced for)
        self.graph_task = None

    # ---- example input --------------------------------------------------------------------------
    def input_text(self) -> str:
        w, doc = self.window, self.document
        text = w.contract_editor.input.text().strip()
        if not text:
            if isinstance(doc.source, opening.ExampleSource):
                text = "example"
            else:
                text = default_example_input(doc.contract_for("", doc.module), doc.module)
        return text

    # ---- open -----------------------------------------------------------------------------------
    def ask_open(self, *_args) -> None:
        path = open_file(self.window, self.window.settings, "Open ONNX", ONNX_FILTER)
        if path:
            self.open_onnx(path)

    def open_onnx(self, path) -> Task:
        w = self.window
        path = Path(path)

        def done(imported):
            self._opened(imported, path)

        def failed(f):
            exc = getattr(f, "exception", None)
            report = getattr(exc, "report", None)
            details = report.text() if report is not None else getattr(f, "traceback", "")
            w.error("Open ONNX", f"{path.name} cannot be imported: {f}\nNothing was changed.", details)

        return w.tasks.start(Task(lambda _state: import_onnx(path), title=f"Importing {path.name}"), done, failed, kind="onnx-open")

    def _opened(self, imported, path: Path) -> bool:
        w = self.window
        if not w.maybe_discard(document=True, design=True):
            w.status(f"{path.name}: not opened (kept what is open)")
            return False
        self.last_report = imported.report
        w.designer.open_imported(imported, path)
        w.tabs.setCurrentWidget(w.designer)
        if w.designer.analysis.ok:
            w.designer.build(ask=False)
        w.message(QMessageBox.Icon.Information, "ONNX import",
                  f"{path.name}: {len(imported.design.nodes())} design nodes from "
                  f"{len(imported.report.mapping)} ONNX nodes; the details list what each became.",
                  imported.report.text())
        return True

    # ---- export ---------------------------------------------------------------------------------
    def ask_export(self, *_args) -> None:
        w, doc = self.window, self.document
        if doc.module is None:
            return
        name = (doc.title.rstrip(" *").split(" — ")[0] or "model").replace(" ", "_").replace("/", "_").lower()
        path = save_file(w, w.settings, "Export ONNX", ONNX_FILTER, f"{name}.onnx")
        if path:
            self.export_onnx(path)

    def export_onnx(self, path, input_text: str | None = None) -> Task | None:
        w, doc = self.window, self.document
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
            w.contract_dock.show()
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

        return w.tasks.start(Task(lambda _state: export_onnx(module, path, inputs), title=f"Exporting {path.name}"), done, failed,
                             kind="onnx-export")

    # ---- the graph of the open model ------------------------------------------------------------
    def model_changed(self) -> None:
        self._graph_for = None
        if self.window.designer.graph_shown():
            self.refresh_graph()

    def refresh_graph(self) -> Task | None:
        """Trace the open model (on a worker) for the Graph page, unless it shows it already."""
        w, doc = self.window, self.document
        view = w.designer.graph
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
            view.select_path(w.tree.selected_path())

        def failed(f):
            self._graph_for = None
            view.set_message(f"No graph: the trace failed: {f}")

        task = Task(work, title="Tracing the model's graph")
        self.graph_task = w.tasks.start(task, done, failed, kind="graph", valid_while=lambda: doc.module is module,
                                        dropped="The model changed while its graph was traced.")
        return self.graph_task


def is_design_source(source) -> bool:
    return isinstance(source, DesignSource)
