"""File ▸ Import ▸ PEFT Adapter…: attach the LoRA adapters of a PEFT adapter folder
(adapter_config.json + adapter_model.safetensors, as peft's `save_pretrained` writes it) to the open
model, on a worker, as one undoable edit the project file replays (`PeftEdit`).

The engine (`engine.models.peft.load_peft_adapter`) checks the folder before it changes anything:
a missing file, an adapter for another base model or architecture (a module the model lacks, a
shape that does not fit), an unsupported option; each is a `PretrainedError` naming the file and
the tensor, shown here as a refusal, and the model stays as it was."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from engine.models.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from engine.module.tree import params
from engine.store.errors import RecordError

from .core import edits
from .core.schema import PeftEdit
from .document import Document
from .host import Host
from .workers import BackgroundTask

TITLE = "Import PEFT Adapter"


class PeftImportActions:
    def __init__(self, document: Document, host: Host):
        self.host = host
        self.document = document

    def ask_import(self) -> BackgroundTask | None:
        """Choose an adapter folder, then load it onto the open model."""
        if self.document.module is None:
            return None
        settings = self.host.settings
        start = settings.last_folder() if settings is not None else str(Path.home())
        folder = QFileDialog.getExistingDirectory(
            self.host.dialog_parent(), f"{TITLE} (a folder with {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})", start)
        if not folder:
            return None
        if settings is not None:
            settings.remember_folder(Path(folder).parent)
        return self.import_adapter(folder)

    def import_adapter(self, folder: str | Path) -> BackgroundTask | None:
        w, module = self.host, self.document.module
        if module is None:
            return None
        path = Path(folder).expanduser()
        edit = PeftEdit(str(path.resolve()) if path.exists() else str(path))

        def work(state):
            state.check_cancelled()
            return edits.apply_edit(module, edit)

        def loaded(new) -> None:
            self.document.push_module(edits.describe(edit), new, edit)
            adapted = sum(1 for _path, p in params(new) if p.reparameterization is not None)
            w.status(f"Loaded the PEFT adapter {path.name}: {adapted} weight(s) adapted; undo removes it")

        def failed(failure) -> None:
            exc = failure.exception
            if isinstance(exc, RecordError):  # the engine's refusal names the file and the tensor
                w.error(TITLE, f"{exc}\n\nThe model was not changed.")
            else:
                w.error(TITLE, f"{path}: {type(exc).__name__}: {exc}\n\nThe model was not changed.", failure.traceback)

        return w.tasks.start(BackgroundTask(work, title=f"Loading adapter {path.name}"), loaded, failed,
                             kind="import-peft",
                             valid_while=lambda: self.document.module is module,
                             dropped="The model changed while the adapter loaded; the load was dropped.")
