"""GGUF files from the window (issue 46).

- File ▸ Open GGUF… (`ask_open`): a `.gguf` file chosen in a file dialog opens as File ▸ Open
  Pretrained opens a folder (`PretrainedActions.open_folder`: on a worker, lazily, the quantized
  weights kept in their blocks; a project reopens it with its edits).
- File ▸ Export ▸ GGUF… (`ask_export`, `export_gguf`): the model merged (LoRA folded in) as a GGUF
  file of a chosen type (`engine.models.gguf_export.save_gguf`: F16, BF16, Q8_0, Q4_0, …, or each
  weight's own type), written atomically on a worker, cancellable, with an Ollama Modelfile beside it
  (`<name>.Modelfile`: FROM the file, its template; a warning when its chat format is not recognised).
  A model opened from a Hugging Face folder is exported with its tokenizer.json converted
  (`engine.models.gguf_vocab`); one llama.cpp would tokenize otherwise keeps the action disabled, saying why.
- File ▸ Export ▸ GGUF LoRA Adapter… (`ask_export_lora`, `export_lora`): the LoRA adapters as a GGUF
  LoRA adapter llama.cpp applies over the GGUF the model was opened from, checked against it first,
  with an Ollama Modelfile beside it (`<name>.Modelfile`: FROM the base, ADAPTER the adapter).

Both exports are enabled only when they can run; a disabled action's tip says why (`refusal`,
`lora_refusal`), and a triggered one that cannot run says so in the status line.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtWidgets import QInputDialog, QMessageBox

from engine.models.gguf_export import EXPORT_TYPES, gguf_architecture
from engine.models.gguf_lora import save_gguf_lora
from engine.models.ollama import template_warning, write_modelfile
from engine.models.gguf_model import gguf_storage
from engine.models.hf_folder import PretrainedError
from engine.models.pretrained import pretrained_info
from engine.module.reparam import adapters_of

from .document import Document
from .host import Host
from .prompts import open_file, save_file
from .workers import BackgroundTask

GGUF_FILTER = "GGUF (*.gguf)"
EXPORT_TIP = "Write the model (LoRA merged) as a GGUF file llama.cpp, Ollama and LM Studio run"
LORA_TIP = "Write the LoRA adapters as a GGUF LoRA adapter llama.cpp applies over the original .gguf " \
           "(--lora), with an Ollama Modelfile"
# the choices of File ▸ Export ▸ GGUF…: label -> save_gguf's qtype
TYPE_CHOICES = {"F16 (half precision)": "F16", "BF16": "BF16", "Q8_0 (8-bit)": "Q8_0",
                "Q6_K (6-bit K-quant)": "Q6_K", "Q5_K_M (5-bit K-quant mix)": "Q5_K_M",
                "Q4_K_M (4-bit K-quant mix, llama.cpp's usual)": "Q4_K_M", "Q5_1": "Q5_1",
                "Q5_0": "Q5_0", "Q4_1": "Q4_1", "Q4_0 (4-bit)": "Q4_0", "F32": "F32",
                "Each weight's own type (unchanged blocks copied)": "source"}
assert set(TYPE_CHOICES.values()) == set(EXPORT_TYPES)


class GGUFActions:
    def __init__(self, document: Document, host: Host, *, open_path, export_action, lora_action):
        """`open_path(path)`: opens a .gguf as Open Pretrained does; the two Export actions are
        enabled here with a tip that says why not."""
        self.document = document
        self.host = host
        self.open_path = open_path
        self.export_action = export_action
        self.lora_action = lora_action
        self._checked = None  # (folder, vocab size, file stamps) -> why its tokenizer has no GGUF form

    # ---- opening ----------------------------------------------------------------------------------
    def ask_open(self):
        """File ▸ Open GGUF…: choose a .gguf file, then open it."""
        path = open_file(self.host.dialog_parent(), self.host.settings, "Open GGUF (llama.cpp, Ollama, LM Studio)",
                         f"{GGUF_FILTER};;All files (*)")
        return self.open_path(path) if path else None

    # ---- why not ----------------------------------------------------------------------------------
    def refusal(self) -> str:
        """Why File ▸ Export ▸ GGUF… cannot run now ('' when it can)."""
        module = self.document.module
        if module is None:
            return "no model is open"
        try:
            _, info = gguf_architecture(module)
        except PretrainedError as exc:
            return exc.reason
        if info.gguf is None and info.folder is not None:
            return self._tokenizer_refusal(Path(info.folder), int(info.config.vocab_size))
        return ""

    def _tokenizer_refusal(self, folder: Path, vocab_size: int) -> str:
        """Why a folder's tokenizer has no GGUF form ('' when it has), kept while its files are unchanged
        (the actions are updated often; tokenizer.json is read again only when it changed)."""
        from engine.models.gguf_vocab import folder_gguf_tokenizer  # noqa: PLC0415

        stamps = []
        for name in ("tokenizer.json", "tokenizer_config.json"):
            try:
                st = (folder / name).stat()
                stamps.append((st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append(None)
        key = (str(folder), vocab_size, tuple(stamps))
        if self._checked is None or self._checked[0] != key:
            try:
                folder_gguf_tokenizer(folder, vocab_size)
                why = ""
            except PretrainedError as exc:
                why = exc.reason
            self._checked = (key, why)
        return self._checked[1]

    def lora_refusal(self) -> str:
        """Why File ▸ Export ▸ GGUF LoRA Adapter… cannot run now ('' when it can)."""
        why = self.refusal()
        if why:
            return why
        if pretrained_info(self.document.module).gguf is None:
            return "the model was opened from a folder: a GGUF LoRA adapter applies over the .gguf the model was " \
                   "opened from (File ▸ Open GGUF…); export the merged model instead (File ▸ Export ▸ GGUF…)"
        if not adapters_of(self.document.module):
            return "the model has no LoRA adapters: attach them first (Model ▸ Attach LoRA…)"
        return ""

    def update_actions(self) -> None:
        for action, why, tip in ((self.export_action, self.refusal(), EXPORT_TIP),
                                 (self.lora_action, self.lora_refusal(), LORA_TIP)):
            action.setEnabled(not why)
            text = tip if not why else f"Not available: {why}"
            action.setToolTip(text)
            action.setStatusTip(text)

    def _suggested(self, suffix: str) -> str:
        info = pretrained_info(self.document.module)
        stem = Path(info.gguf).stem if info is not None and info.gguf is not None else \
            Path(info.folder).name if info is not None and info.folder is not None else "model"
        return f"{stem}{suffix}.gguf"

    # ---- merged -----------------------------------------------------------------------------------
    def ask_export(self) -> BackgroundTask | None:
        why = self.refusal()
        if why:
            self.host.status(f"Export GGUF: {why}")
            return None
        labels = list(TYPE_CHOICES)
        label, ok = QInputDialog.getItem(self.host.dialog_parent(), "Export GGUF", "Weight type of the matrices:",
                                         labels, 0, False)
        if not ok:
            return None
        path = save_file(self.host.dialog_parent(), self.host.settings, "Export GGUF", GGUF_FILTER,
                         self._suggested(f"-{TYPE_CHOICES[label]}"))
        return self.export_gguf(path, TYPE_CHOICES[label]) if path else None

    def export_gguf(self, path: str | Path, qtype: str = "F16") -> BackgroundTask | None:
        """Write the document's model merged as a GGUF file of `qtype`, on a worker (cancellable)."""
        from engine.models.gguf_export import save_gguf  # noqa: PLC0415

        w, module = self.host, self.document.module
        why = self.refusal()
        if why:
            w.error("Export GGUF", why)
            return None
        path = Path(path)
        started = time.perf_counter()

        def work(state):
            written = save_gguf(module, path, qtype, check=state.check_cancelled,
                                progress=lambda done, total: state.set_progress(done / total))
            chat = _chat_template(written)
            return written, write_modelfile(written.with_suffix(".Modelfile"), written, None, chat), chat

        def done(result) -> None:
            written, modelfile, chat = result
            w.status(f"Saved {written.name} ({qtype}, {written.stat().st_size / 2 ** 20:.1f} MiB, "
                     f"{time.perf_counter() - started:.1f} s) and {modelfile.name}: llama-cli -m {written.name}; "
                     f"ollama create NAME -f {modelfile.name}", 15000)
            self._warn_template(modelfile, chat)

        w.status(f"Exporting GGUF ({qtype}) to {path}…")
        return w.tasks.start(BackgroundTask(work, title=f"Exporting {path.name}"), done,
                             lambda f: w.error("Export GGUF failed", f"{path.name} was not written: {f.exception}",
                                               f.traceback), kind="export-gguf")

    # ---- adapter ----------------------------------------------------------------------------------
    def ask_export_lora(self) -> BackgroundTask | None:
        why = self.lora_refusal()
        if why:
            self.host.status(f"Export GGUF LoRA adapter: {why}")
            return None
        path = save_file(self.host.dialog_parent(), self.host.settings, "Export GGUF LoRA Adapter", GGUF_FILTER,
                         self._suggested("-lora"))
        return self.export_lora(path) if path else None

    def export_lora(self, path: str | Path) -> BackgroundTask | None:
        """Write the LoRA adapters as a GGUF LoRA adapter (checked against the base .gguf) and an Ollama
        Modelfile beside it, on a worker."""
        w, module = self.host, self.document.module
        why = self.lora_refusal()
        if why:
            w.error("Export GGUF LoRA adapter", why)
            return None
        path = Path(path)
        info = pretrained_info(module)
        base = info.gguf

        def work(state):
            written = save_gguf_lora(module, path, check=state.check_cancelled)
            chat = _chat_template(base)
            return written, write_modelfile(path.with_suffix(".Modelfile"), base, written, chat), chat

        def done(result) -> None:
            written, modelfile, chat = result
            w.status(f"Saved the GGUF LoRA adapter {written.name} and {modelfile.name}: llama-cli -m {base.name} "
                     f"--lora {written.name}; ollama create NAME -f {modelfile.name}", 15000)
            self._warn_template(modelfile, chat)

        w.status(f"Exporting the GGUF LoRA adapter to {path}…")
        return w.tasks.start(BackgroundTask(work, title=f"Exporting {path.name}"), done,
                             lambda f: w.error("Export GGUF LoRA adapter failed",
                                               f"{path.name} was not written: {f.exception}", f.traceback),
                             kind="export-gguf-lora")

    def _warn_template(self, modelfile: Path, chat_template: str | None) -> None:
        """A warning when the Modelfile has no TEMPLATE (its chat format was not recognised)."""
        why = template_warning(chat_template)
        if why:
            self.host.message(QMessageBox.Icon.Warning, "Ollama Modelfile without a template",
                              f"{modelfile.name}: {why}.")


def _chat_template(path) -> str | None:
    """The chat template in a GGUF file's metadata (None without one)."""
    from engine.store.gguf_file import open_gguf  # noqa: PLC0415

    with open_gguf(path) as f:
        chat = f.metadata.get("tokenizer.chat_template")
    return chat if isinstance(chat, str) else None


def quantized_summary(module) -> str:
    """'  ·  210 of 272 weights quantized (Q4_1 ×210, ...), 98.2 MB as stored' for a model opened from
    a GGUF ('' for any other)."""
    storage = gguf_storage(module)
    if not storage:
        return ""
    kinds: dict[str, int] = {}
    for _, qtype, _ in storage.values():
        kinds[qtype] = kinds.get(qtype, 0) + 1
    stored = sum(nbytes for _, _, nbytes in storage.values())
    shown = ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return f"GGUF {shown}; {stored / 1e6:.1f} MB as stored"
