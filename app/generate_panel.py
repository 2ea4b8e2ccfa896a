"""The Generate tab: continue a prompt with the document's language model, tokens streaming in
from a worker thread, and compare two models on the same prompt and seed, side by side.

- The tokenizer is the open model's folder's `tokenizer.json` (`engine.train.text.load_tokenizer`,
  read on the worker the first time and kept for that folder); a model whose folder has none
  (a script, a GGUF or checkpoint folder) is told so above the view, with a button to pick a folder
  that has one (`widgets.tokenizer_folder_picker`); the pick is remembered for that model's source.
- Generate starts a `BackgroundTask` (app.workers) through the window's `TaskRunner` (kind "generate": a new
  generation replaces a running one); it iterates `engine.models.generate.stream` and sends each
  token's text back as a partial result, which the view appends to its pane. Stop cancels the
  task: the stream checks it before each step, and the text so far stays.
- When a model from another folder opens, the sampling boxes take the defaults of its
  generation_config.json (`engine.models.generate.generation_defaults`: temperature, top-k, top-p,
  repetition penalty, max new tokens; greedy where it does not sample), or the view's `DEFAULTS`
  for a model without one.
- Compare: "before / after the last training run" generates with the model the run started from
  (`TrainingRun.source_module`) and then the document's model; "adapter off / on" with the
  document's model without its LoRA adapters (`detach_reparameterization`, on the worker) and then
  with them. Both columns use the same settings and seed, so any difference is the models'.
- The adapter scale (llama.cpp's `--lora-scaled`) multiplies every LoRA adapter's delta of a
  column's model on the worker (`engine.module.lora.scale_adapters`: a copy, the document's model
  is unchanged); "adapter off" stays the base.
- Chat mode (app.generate_chat, for a folder with a chat template, chosen when such a model opens):
  each column's prompt is its own history rendered with the template and encoded with
  `encode_chat` on the worker; the same columns, settings and Stop as above.
"""
from __future__ import annotations

import threading
from typing import Any

from PySide6.QtWidgets import QVBoxLayout, QWidget

from engine.models.generate import GenerationError, estimate_generation, generation_defaults, stream
from engine.module import memory
from engine.module.lora import scale_adapters
from engine.module.tree import params as tree_params
from engine.train.chat_template import encode_chat
from engine.train.text import load_tokenizer
from widgets.generate_view import GenerateView
from widgets.tokenizer_folder_picker import TokenizerFolderPicker

from .document import Document
from .generate_chat import ChatSession
from .host import Host
from .training_panel import TrainingPanel, tokenizer_folder
from .workers import BackgroundTask


def has_adapters(module: Any) -> bool:
    return module is not None and any(p.reparameterization is not None for _path, p in tree_params(module))


class _Later:
    """A column's model made on the worker (a copy without adapters, say)."""

    def __init__(self, fn):
        self.fn = fn


def _generate_columns(state, columns, tokenizer, folder: str, settings: dict):
    """The worker: each column's model (made here when it is a function; its adapters scaled by
    `adapter_scale`) continues the prompt, or answers its conversation (`settings["chats"][column]`,
    rendered with `settings["template"]`); every token's text goes back as `(column, text)`.
    Returns (tokenizer, results, thread name)."""
    tok = tokenizer if tokenizer is not None else load_tokenizer(folder)
    results = []
    scale = float(settings.get("adapter_scale", 1.0))
    for col, (_title, model) in enumerate(columns):
        if isinstance(model, _Later):
            model = model.fn()
        if scale != 1.0 and has_adapters(model):
            model = scale_adapters(model, scale)
        prompt = settings["prompt"]
        if settings.get("chats") is not None:
            prompt = encode_chat(tok, settings["template"], settings["chats"][col], add_generation_prompt=True)
        s = stream(model, tok, prompt, settings["max_new_tokens"], settings["temperature"],
                   settings["top_k"], settings["top_p"], settings["seed"], cancel=state.is_cancelled,
                   repetition_penalty=settings.get("repetition_penalty", 1.0))
        for token in s:
            if token.text:
                state.set_partial_result((col, token.text))
        results.append(s.result)
        if state.is_cancelled():
            break
    return tok, results, threading.current_thread().name


class GeneratePanel(QWidget):
    def __init__(self, document: Document, host: Host, training: TrainingPanel, parent=None):
        """`training`: the Training tab, whose runs 'before / after the last training run' compares."""
        super().__init__(parent)
        self.setObjectName("generate-panel")
        self.host = host
        self.document = document
        self.training = training
        self.view = GenerateView()
        self.tokenizer_picker = TokenizerFolderPicker()
        self.tokenizer_picker.folder_chosen.connect(self.set_tokenizer_folder)
        self.tokenizer_picker.hide()
        self.chosen_tokenizers: dict[str, str] = {}  # a model source's key -> the tokenizer folder picked for it
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tokenizer_picker)
        layout.addWidget(self.view)
        self.task: BackgroundTask | None = None
        self._tokenizer = None
        self._tokenizer_folder = ""
        self.last_results: list = []  # the GenerationResults of the last generation, a column each
        self.last_thread = ""  # the thread the last generation ran on (never the GUI thread)
        self.view.generate_requested.connect(self.generate)
        self.view.stop_requested.connect(self.stop)
        self._on_end = None  # the running task's ending for its caller: on_end(kind, results)
        self.chat = ChatSession(self)
        self._defaults_for: Any = ()  # the folder whose generation defaults the boxes hold (() : none yet)
        self.document.model_changed.connect(self._update_enabled)
        self._update_enabled()

    # ---- state ----------------------------------------------------------------------------------
    def _source_key(self) -> str:
        source = getattr(self.document, "source", None)
        return f"{type(source).__name__}:{getattr(source, 'path', '')}" if source is not None else ""

    def folder(self) -> str:
        """The tokenizer's folder: the model's own, else the one picked for this model ('' : none)."""
        return tokenizer_folder(getattr(self.document, "source", None)) or \
            self.chosen_tokenizers.get(self._source_key(), "")

    def set_tokenizer_folder(self, folder: str) -> None:
        """Generate with the tokenizer of `folder` (holding tokenizer.json) for the open model."""
        self.chosen_tokenizers[self._source_key()] = folder
        self._update_enabled()

    def _take_defaults(self, module) -> None:
        """A model from another folder than the last one: the boxes take its generation defaults."""
        from engine.models import pretrained_info  # noqa: PLC0415

        info = pretrained_info(module) if module is not None else None
        key = str(info.folder) if info is not None else None
        if module is None or key == self._defaults_for:
            return
        self._defaults_for = key
        try:
            defaults = generation_defaults(module)
        except GenerationError as exc:  # a broken generation_config.json: say so, keep the usual defaults
            defaults = {}
            self.view.error.show_error(f"The model's generation settings were not used: {exc}")
        self.view.set_defaults(defaults)

    def _update_enabled(self) -> None:
        module = self.document.module
        self._take_defaults(module)
        self.tokenizer_picker.setVisible(False)
        self.chat.take_template(module)
        if module is None:
            self.view.set_can_generate(False, "Open a language model (File ▸ Open Pretrained…) to generate text.")
        elif not self.folder():
            self.tokenizer_picker.set_message("This model has no tokenizer.json beside it, and generation needs its "
                                              "tokenizer: choose the folder that holds it (the base model's Hugging "
                                              "Face folder, say).")
            self.tokenizer_picker.show()
            self.view.set_can_generate(False, "Generation needs the model's tokenizer: choose a folder holding "
                                              "tokenizer.json above.")
        else:
            self.view.set_can_generate(True)
            if self.task is None:
                self.view.set_status("")

    def is_running(self) -> bool:
        return self.task is not None

    def last_run(self):
        """The newest run of the open document that trained (finished or stopped with steps)."""
        panel = self.training
        for run in reversed(panel.runs):
            if run.generation == panel.generation and run.outcome is not None and run.outcome.steps > 0 \
                    and run.status in ("finished", "stopped"):
                return run
        return None

    def _columns(self, compare: str) -> list[tuple[str, Any]] | str:
        module = self.document.module
        if compare == "run":
            run = self.last_run()
            if run is None:
                return "No training run of this model yet: train it on the Training tab, then compare."
            after = "After: the document's model" + (" (trained)" if module is run.outcome.model else "")
            return [(f"Before: the model {run.name} started from", run.source_module), (after, module)]
        if compare == "adapter":
            if not has_adapters(module):
                return "The model has no LoRA adapters: attach them (Model ▸ Attach LoRA…) to compare."
            return [("Adapter off (the base weights)", _Later(module.detach_reparameterization)),
                    ("Adapter on", module)]
        return [("The document's model", module)]

    # ---- commands -------------------------------------------------------------------------------
    def generate(self, settings: dict | None = None) -> BackgroundTask | None:
        """Continue the prompt with the chosen model(s) on a worker; None when it cannot start."""
        settings = dict(settings if settings is not None else self.view.settings())
        v = self.view
        v.error.show_error(None)
        if not self.ready():
            return None
        if not settings["prompt"].strip():
            v.error.show_error("Type a prompt to continue.")
            return None
        columns = self.columns_for(settings)
        if columns is None:
            return None
        v.set_columns(self.titles(columns, settings), echo=settings["prompt"])  # the prompt, then what follows
        return self.start(columns, settings, v.append, "Stopped: the text so far is kept.")

    def ready(self) -> bool:
        """Whether a model and its tokenizer are there to generate with (else the view says why)."""
        if self.document.module is None or not self.folder():
            self._update_enabled()
            return False
        return True

    def columns_for(self, settings: dict):
        """The columns `settings["compare"]` asks for, or None (the view says why: nothing to
        compare, or not enough memory)."""
        v = self.view
        columns = self._columns(settings.get("compare", "none"))
        if isinstance(columns, str):
            v.error.show_error(columns)
            return None
        refusal = self._refusal(columns, settings)
        if refusal:
            v.error.show_error(f"Not enough memory: {refusal}. Nothing was generated; the model was left as it was.")
            v.set_status("Refused: not enough memory.")
            return None
        return columns

    @staticmethod
    def titles(columns, settings: dict) -> list[str]:
        """The columns' titles, the adapter scale named where it acts."""
        scale = float(settings.get("adapter_scale", 1.0))
        return [title + (f" at adapter scale {scale:g}" if scale != 1.0 and not isinstance(model, _Later)
                         and has_adapters(model) else "") for title, model in columns]

    def start(self, columns, settings: dict, partial, stopped: str, on_end=None) -> BackgroundTask:
        """The worker started on `columns`: `partial(column, text)` for each token's text, the status
        `stopped` when Stop ends it, and `on_end(kind, results)` once it ends ("finished" with the
        GenerationResults, "stopped" or "failed" with None)."""
        v = self.view
        folder = self.folder()
        tokenizer = self._tokenizer if self._tokenizer_folder == folder else None
        v.set_running(True)
        v.set_status("Generating…")
        task = BackgroundTask(_generate_columns, columns, tokenizer, folder, settings, title="Generating text")
        self._on_end = on_end
        task.partial.connect(lambda part: partial(*part))
        task.cancelled.connect(lambda t=task: self._ended(t, stopped))
        # a result dropped because the model changed meanwhile ends the generation too
        task.done.connect(lambda t=task: self._ended(t, "The model changed while it generated; the text shown is "
                                                        "what it gave."))
        self.task = task
        module = self.document.module
        self.host.tasks.start(task, lambda out, t=task, f=folder: self._finished(t, f, out),
                                lambda failure, t=task: self._failed(t, failure), kind="generate",
                                valid_while=lambda: self.document.module is module,
                                dropped="The model changed while it generated; the text is what it gave.")
        return task

    def _refusal(self, columns, settings: dict) -> str:
        """Why the columns' models cannot generate in the memory available ('' when they fit):
        `estimate_generation` from shapes (a row of at least one prompt token; the worker's
        stream checks again with the prompt's tokens). A column made on the worker is a copy of
        the document's model without its adapters, estimated as that model."""
        available = memory.available_memory()
        for _title, model in columns:
            model = self.document.module if isinstance(model, _Later) else model
            try:
                estimate = estimate_generation(model, 1, 1, int(settings["max_new_tokens"]))
            except (GenerationError, TypeError, ValueError):  # not a causal LM: the worker says so
                continue
            refusal = estimate.refusal(available)
            if refusal:
                return refusal
        return ""

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.view.set_status("Stopping after the current token…")

    def _ended(self, task: BackgroundTask, text: str, kind: str = "stopped", results=None) -> None:
        if self.task is task:
            self.task = None
            on_end, self._on_end = self._on_end, None
            if on_end is not None:
                on_end(kind, results)
            self.view.set_running(False)
            self.view.set_status(text)

    def _finished(self, task: BackgroundTask, folder: str, out) -> None:
        tokenizer, results, thread = out
        self._tokenizer, self._tokenizer_folder = tokenizer, folder
        self.last_results, self.last_thread = results, thread
        parts = [f"{r.new_tokens} tokens in {r.seconds:.2f} s ({r.tokens_per_second:,.1f} tokens/s, "
                 f"{r.finish_reasons[0]})" for r in results]
        self._ended(task, "Done: " + "; ".join(parts), "finished", results)

    def _failed(self, task: BackgroundTask, failure) -> None:
        exc = failure.exception
        message = str(exc) if isinstance(exc, (ValueError, OSError, memory.NotEnoughMemory)) else \
            f"{type(exc).__name__}: {exc}"
        self.view.error.show_error(f"Generation failed: {message}")
        self._ended(task, "Failed.", "failed")

    def wait(self, timeout: float = 60.0) -> bool:
        """For tests: process events until no generation runs; False on timeout."""
        import time  # noqa: PLC0415

        from PySide6.QtWidgets import QApplication  # noqa: PLC0415

        deadline = time.monotonic() + timeout
        while self.task is not None and time.monotonic() < deadline:
            QApplication.processEvents()
            time.sleep(0.002)
        QApplication.processEvents()
        return self.task is None


