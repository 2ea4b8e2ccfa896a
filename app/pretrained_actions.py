"""Hugging Face checkpoint folders from the window: File ▸ Open Pretrained… and folders dropped on
the window open one as the document's model (source kind "pretrained", so a project saves and
reopens it with its edits); File ▸ Export ▸ Hugging Face Folder… writes the current model back
with `engine.models.save_pretrained`, merging LoRA/QLoRA adapters into a copy first.

Opening reads only headers (`from_pretrained` is lazy) but still runs on a worker, like every
load; a folder that holds no supported model shows the engine's `PretrainedError` text (the file,
the architecture found, the supported ones) and leaves the document as it was. The Qt-free parts
are in `app.core.opening` (`load_pretrained`, `save_pretrained`, `hugging_face_names`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from PySide6.QtWidgets import QFileDialog

from engine.models.peft import save_peft_adapter
from engine.module import memory
from engine.module.tree import params as tree_params

from .core import edits, opening
from .core.project import PROJECT_SUFFIX
from .core.schema import Edit, PretrainedSource
from .document import Document
from .host import Host
from .prompts import Button, OutputFolderDialog, ask_question
from .workers import BackgroundTask

EXPORT_TIP = "Write the model as a Hugging Face folder (config.json + model.safetensors) that transformers loads; " \
             "LoRA adapters are merged into a copy first"
PEFT_TIP = "Write the LoRA adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) " \
           "that peft loads on the same base model"
# what a dropped file may be (anything else is refused with this list)
DROPPABLE = "a Hugging Face model folder, a GGUF file (.gguf), a project (.ember.json), a model script (.py) or " \
            "a checkpoint (.bpk, .safetensors)"


class _ReplayFailed(Exception):
    """The folder opened but a project's edits did not replay on it."""


class PretrainedActions:
    def __init__(self, document: Document, host: Host, *, export_action, peft_action,
                 hf_names: Callable[[], dict], open_path: Callable[[str], bool]):
        """`export_action` / `peft_action`: File ▸ Export ▸ Hugging Face Folder / PEFT Adapter (enabled
        here, with a tip that says why not); `hf_names()`: the open model's Hugging Face names ({}
        unless a known family's); `open_path(entry)`: File ▸ Open of a dropped project, script or
        checkpoint."""
        self.host = host
        self.document = document
        self.settings = host.settings
        self.export_action = export_action
        self.peft_action = peft_action
        self.hf_names = hf_names
        self.open_path = open_path

    # ---- opening ----------------------------------------------------------------------------------
    def _start_folder(self) -> str:
        return self.settings.last_folder() if self.settings is not None else str(Path.home())

    def ask_open(self) -> BackgroundTask | None:
        """File ▸ Open Pretrained…: choose a folder, then open it (asking about unsaved work)."""
        folder = QFileDialog.getExistingDirectory(self.host.dialog_parent(), "Open Pretrained (a Hugging Face model folder)",
                                                  self._start_folder())
        if not folder:
            return None
        self.settings.remember_folder(Path(folder).parent)  # next time: beside this model's folder
        return self.open_folder(folder)

    def open_folder(self, folder: str | Path, *, edits_: list[Edit] | None = None, contracts_: dict | None = None,
                    project_path: Path | None = None, dirty: bool = False, runs_: list | None = None,
                    ask: bool = True) -> BackgroundTask | None:
        """Open a Hugging Face folder on a worker, replay `edits_` (a project's) and make it the
        document's model. `ask`: ask about unsaved work first (a project's open already did)."""
        w = self.host
        if ask and not w.maybe_discard(document=True):
            return None
        path = Path(folder).expanduser()
        source = PretrainedSource(str(path.resolve()) if path.exists() else str(path))
        replayed = list(edits_ or [])
        from_project = project_path is not None or edits_ is not None

        def work(state):
            module = opening.load_pretrained(source.path, check=state.check_cancelled)  # Cancel stops it
            state.set_progress(0.5)
            try:
                return edits.replay(module, replayed, state.check_cancelled) if replayed else module
            except edits.EditError as e:
                raise _ReplayFailed(str(e)) from e

        def loaded(module: Any) -> None:
            self.document.set_model(module, source, edits=edits_, contracts=contracts_, project_path=project_path,
                                    runs=runs_, dirty=dirty)
            if not from_project:
                self.settings.add_recent(source.path)
            w.status(f"Opened {Path(source.path).name}: {type(module).__name__}, "
                     f"{self.document.stats.total.counts.total:,} parameters, read lazily")

        def failed(failure) -> None:
            exc = failure.exception
            if isinstance(exc, _ReplayFailed):
                w.error("Open project", f"the model opened, but replaying its edits failed: {exc}")
            elif isinstance(exc, opening.OpenError):
                w.error("Open pretrained", exc.message, exc.details)
            else:
                w.error("Open pretrained", f"{source.path}: {type(exc).__name__}: {exc}", failure.traceback)

        # unsaved work was asked about before this started; a model edited meanwhile is newer work
        # than the open, so the result is dropped rather than replacing it unasked
        doc, was, step = self.document, self.document.module, self.document.undo_stack.index()
        return w.tasks.start(BackgroundTask(work, title=f"Opening {path.name}"), loaded, failed, kind="open",
                             valid_while=lambda: doc.module is was and doc.undo_stack.index() == step,
                             dropped=f"Opening {path.name}: the open model was changed meanwhile, so it was kept "
                                     f"and {path.name} was not opened.")

    # ---- drops ------------------------------------------------------------------------------------
    @staticmethod
    def dropped_paths(mime) -> list[Path]:
        """The local files and folders a drag carries."""
        if mime is None or not mime.hasUrls():
            return []
        return [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]

    def accepts(self, mime) -> bool:
        return bool(self.dropped_paths(mime))

    def drop(self, mime) -> bool:
        """Open what was dropped on the window (the first item): a folder (or its config.json) as a
        Hugging Face model; a project, script or checkpoint as File ▸ Open would; anything else
        is refused, saying what is expected."""
        paths = self.dropped_paths(mime)
        if not paths:
            return False
        path = paths[0]
        folder = opening.pretrained_folder_of(path)
        if folder is not None:
            return self.open_folder(folder) is not None
        name = path.name.lower()
        if name.endswith(PROJECT_SUFFIX) or path.suffix.lower() in (".py", ".bpk", ".safetensors"):
            # as File ▸ Open does: a project or script opens (asking about unsaved work), a
            # checkpoint opens the dialog that asks for its architecture
            opened = self.open_path(str(path))
            return bool(opened) or path.suffix.lower() in (".bpk", ".safetensors")
        self.host.error("Open", f"{path}: cannot open a dropped {path.suffix or 'file'}: expected {DROPPABLE}")
        return False

    # ---- export -----------------------------------------------------------------------------------
    def update_action(self) -> None:
        """Enable Export ▸ Hugging Face Folder for a model of a known family; else say why."""
        action = self.export_action
        # the window's Hugging Face names of this model, made once per change (a known family has them)
        names = self.hf_names()
        why = "" if names and self.document.module is not None else opening.save_pretrained_refusal(self.document.module)
        action.setEnabled(not why)
        tip = EXPORT_TIP if not why else f"Not available: {why}"
        action.setToolTip(tip)
        action.setStatusTip(tip)
        peft = self.peft_action
        why = self.peft_refusal()
        peft.setEnabled(not why)
        tip = PEFT_TIP if not why else f"Not available: {why}"
        peft.setToolTip(tip)
        peft.setStatusTip(tip)

    def peft_refusal(self) -> str:
        """Why File ▸ Export ▸ PEFT Adapter… cannot run now ('' when it can)."""
        module = self.document.module
        if module is None:
            return "no model is open"
        if not self.hf_names():
            why = opening.save_pretrained_refusal(module)
            return (f"a PEFT adapter names the modules of a known Hugging Face family; {why}" if why else
                    "a PEFT adapter names the modules of a model opened from a Hugging Face folder")
        if not self.document.stats.total.reparameterized:
            return "the model has no LoRA adapters: attach them first (Model ▸ Attach LoRA…)"
        return ""

    def ask_export_peft(self) -> BackgroundTask | None:
        why = self.peft_refusal()
        if why:
            self.host.status(f"Export PEFT adapter: {why}")
            return None
        folder = OutputFolderDialog.choose(self.host.dialog_parent(), self.settings,
                                           "Export PEFT Adapter (choose or make a folder)")
        return self.export_peft(folder) if folder else None

    def export_peft(self, folder: str | Path) -> BackgroundTask | None:
        """Write the document's LoRA adapters as a PEFT adapter folder, on a worker."""
        w, module = self.host, self.document.module
        why = self.peft_refusal()
        if why:
            w.error("Export PEFT adapter", why)
            return None
        folder = Path(folder)
        if folder.is_file():
            w.error("Export PEFT adapter", f"{folder}: a file, expected a folder to write into")
            return None
        if (folder / "adapter_config.json").exists():
            answer = ask_question(w.dialog_parent(), "Replace the adapter in this folder?",
                                  f"{folder} already holds a PEFT adapter (adapter_config.json). Replace it?",
                                  Button.Yes | Button.Cancel, Button.Cancel)
            if answer != Button.Yes:
                return None
        info = _info(module)
        base = str(info.folder) if info is not None and info.folder is not None else None
        started = time.perf_counter()

        def work(state):
            return save_peft_adapter(module, folder, base_model_name_or_path=base)

        def done(written) -> None:
            w.status(f"Saved the PEFT adapter {written} ({time.perf_counter() - started:.1f} s): "
                     f"PeftModel.from_pretrained(base, folder) loads it", 15000)

        w.status(f"Exporting the PEFT adapter to {folder}…")
        return w.tasks.start(BackgroundTask(work, title=f"Exporting the PEFT adapter {folder.name}"), done,
                             lambda f: w.error("Export PEFT adapter failed", str(f.exception), f.traceback),
                             kind="export-peft")

    def ask_export(self) -> BackgroundTask | None:
        module = self.document.module
        why = opening.save_pretrained_refusal(module)
        if why:
            self.host.status(f"Export Hugging Face folder: {why}")
            return None
        folder = OutputFolderDialog.choose(self.host.dialog_parent(), self.settings,
                                           "Export Hugging Face Folder (choose or make a folder)")
        return self.export_folder(folder) if folder else None

    def export_folder(self, folder: str | Path) -> BackgroundTask | None:
        """Write the document's model to `folder` on a worker; adapters are merged into a copy."""
        w, module = self.host, self.document.module
        why = opening.save_pretrained_refusal(module)
        if why:
            w.error("Export Hugging Face folder", why)
            return None
        folder = Path(folder)
        info = _info(module)
        if info is not None and info.folder is not None and folder.resolve() == Path(info.folder).resolve():
            w.error("Export Hugging Face folder", f"{folder}: this is the folder the open model reads its weights "
                    "from (lazily); choose another folder")
            return None
        if folder.is_file():
            w.error("Export Hugging Face folder", f"{folder}: a file, expected a folder to write into")
            return None
        if (folder / "config.json").exists() or any(folder.glob("model*.safetensors")):
            answer = ask_question(w.dialog_parent(), "Replace the model in this folder?",
                                  f"{folder} already holds a model (config.json, model files). Replace it?",
                                  Button.Yes | Button.Cancel, Button.Cancel)
            if answer != Button.Yes:
                return None
        merged = self.document.stats.total.reparameterized
        estimate = export_estimate(module, bool(merged))
        refusal = estimate.refusal(memory.available_memory()) if estimate.total else ""
        if refusal:
            what = "Merging the LoRA adapters for the export: " if merged else ""
            w.error("Not enough memory", f"{what}{refusal}. Nothing was written.")
            w.status(f"Export Hugging Face folder: refused, it needs about {memory.size_text(estimate.total)}")
            return None
        note = (f"the LoRA adapters of {merged} weight(s) are merged into a copy (the open model keeps them)"
                if merged else "")
        w.status(f"Exporting to {folder}" + (f": {note}" if note else "") + "…")
        started = time.perf_counter()

        def done(result) -> None:
            written, n = result
            extra = f"; LoRA of {n} weight(s) merged into the saved weights, the open model keeps its adapters" \
                if n else ""
            w.status(f"Saved the Hugging Face folder {written} ({time.perf_counter() - started:.1f} s{extra})", 15000)

        return w.tasks.start(
            BackgroundTask(lambda state: opening.save_pretrained(module, folder, state.set_progress),
                           title=f"Exporting {folder.name}" + (" (merging LoRA into a copy)" if merged else "")),
            done, lambda f: w.error("Export failed", str(f.exception), f.traceback), kind="export-pretrained")


def export_estimate(module, merged: bool) -> memory.MemoryEstimate:
    """What writing `module` as a Hugging Face folder allocates before the first byte is written:
    the lazy parameters that no file backs (a model built from a config, such as the llama-7b
    example) are initialized to be saved; merging LoRA initializes lazy bases and makes plain
    weights (`estimate_materialize`). A model read lazily from a folder reads each tensor from
    its file as it is written."""
    parts: dict[str, int] = {}
    if merged:
        parts.update(memory.estimate_materialize(module).parts)
    if _info(module) is None:  # not from a folder: nothing backs its lazy parameters
        unbacked = sum(memory.param_bytes(p) for _path, p in tree_params(module)
                       if not p.is_initialized() and not (merged and p.reparameterization is not None))
        parts["parameters to initialize (no file backs them)"] = unbacked
    return memory.MemoryEstimate("The Hugging Face export", parts)


def _info(module):
    try:
        from engine.models import pretrained_info  # noqa: PLC0415

        return pretrained_info(module)
    except Exception:  # noqa: BLE001
        return None
