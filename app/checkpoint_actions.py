"""Checkpoints from the window: import weights into the open model (one undo step, with a report
of what did not fit) and export it whole, as adapters only or materialized, on a worker
(`app.core.checkpoints` does the work)."""
from __future__ import annotations

import time
from pathlib import Path
from PySide6.QtWidgets import QFileDialog, QMessageBox

from widgets.checkpoint_dialog import CheckpointDialog

from .core import checkpoints, edits
from .core.schema import LoadEdit
from .document import Document
from .host import Host
from .prompts import save_file
from .workers import BackgroundTask

EXPORT_FILTER = "Burnpack (*.bpk);;Safetensors, PyTorch layout (*.safetensors)"


def show_partial_load(host: Host, report: checkpoints.LoadReport) -> None:
    """A warning listing what a partial load left out (nothing when it was complete)."""
    if not report.complete:
        host.message(QMessageBox.Icon.Warning, "Checkpoint loaded partially", report.summary(),
                       "\n".join(report.lines()))


def show_load_failure(host: Host, failure, where: str = "") -> None:
    """A checkpoint that did not load: the rows that did not fit, or the traceback. `where`
    names the project that names the checkpoint (`<project>: `), '' for none."""
    exc = failure.exception
    lines = []
    for attr in ("missing", "unused", "mismatched"):
        for row in getattr(exc, attr, []) or []:
            lines.append(f"{attr:10} " + "  ".join(str(x) for x in row))
    if getattr(exc, "matched_nothing", False):  # a partial load that would have loaded nothing
        text = f"{exc}. Nothing was changed."
    elif lines:
        text = f"{type(exc).__name__}: the checkpoint does not fit the model; nothing was changed."
    else:
        text = f"{exc}"
    if where:
        text = f"{where}source.path: {text}"
    host.error("Checkpoint not loaded", text, "\n".join(lines) or failure.traceback)


def adapters_only(path) -> bool:
    """Whether the checkpoint at `path` holds LoRA factors only (every name ends in lora.a or
    lora.b); False when it cannot be read (the load then says why)."""
    from engine.store import ModuleRecord  # noqa: PLC0415

    try:
        names = ModuleRecord.load(path, adapter=checkpoints.adapter_for(path)).names()
    except Exception:  # noqa: BLE001 - the real load reports it
        return False
    return bool(names) and all(n.endswith(("lora.a", "lora.b")) for n in names)


class CheckpointActions:
    def __init__(self, document: Document, host: Host):
        self.host = host
        self.document = document

    def ask_import(self) -> CheckpointDialog | None:
        if self.document.module is None:
            return None
        dialog = CheckpointDialog(self.host.dialog_parent(), examples=None, title="Import Checkpoint")
        if self.host.settings is not None:
            dialog.start_folder = self.host.settings.last_folder()
        dialog.chosen.connect(lambda c: self.import_checkpoint(c["path"], c["allow_partial"]))
        return self.host.open_dialog(dialog)

    def import_checkpoint(self, path: str, allow_partial: bool) -> BackgroundTask | None:
        w, module = self.host, self.document.module
        if module is None:
            return None

        def work(state):
            # a file of LoRA factors only (…lora.a / …lora.b) fits no model whole: load it partially
            partial = allow_partial or adapters_only(path)
            new, report = checkpoints.load(module, path, partial, state.set_progress)
            return new, report, partial and not allow_partial

        def loaded(result):
            new, report, adapters = result
            edit = LoadEdit(str(Path(path).resolve()), allow_partial or adapters)
            self.document.push_module(edits.describe(edit), new, edit)
            w.status(f"{Path(path).name}: {report.summary()}")
            if adapters:
                w.message(QMessageBox.Icon.Information, "Adapters loaded",
                          f"{Path(path).name} holds LoRA adapters only (…lora.a / …lora.b): they were loaded "
                          f"partially, the model's other weights kept. {report.summary()}.",
                          "\n".join(report.lines()))
            else:
                show_partial_load(w, report)

        return w.tasks.start(BackgroundTask(work, title=f"Loading {Path(path).name}"), loaded, lambda f: show_load_failure(w, f),
                             kind="import-checkpoint",  # a second import replaces a running one
                             valid_while=lambda: self.document.module is module,
                             dropped="The model changed while the checkpoint loaded; the load was dropped.")

    def ask_export(self, kind: str) -> BackgroundTask | None:
        if self.document.module is None:
            return None
        path = save_file(self.host.dialog_parent(), self.host.settings, f"Export {kind}", EXPORT_FILTER)
        return self.export_checkpoint(path, kind) if path else None

    def export_checkpoint(self, path: str, kind: str) -> BackgroundTask | None:
        w, module = self.host, self.document.module
        if module is None:
            return None
        started = time.perf_counter()
        return w.tasks.start(
            BackgroundTask(lambda state: checkpoints.export(module, path, kind, state.set_progress), title=f"Saving {Path(path).name}"),
            lambda written: w.status(f"Saved {written} ({kind}, {time.perf_counter() - started:.1f} s)"),
            lambda f: w.error("Export failed", str(f.exception), f.traceback))
