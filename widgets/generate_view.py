"""The Generate panel's view: a prompt, the sampling settings (max new tokens, temperature, top-k,
top-p, repetition penalty, seed), what to compare, the adapter scale, Generate and Stop, and one or
two output panes side by side. In chat mode (`set_mode("chat")`, offered where `set_chat_available`
says the model has a chat template) the prompt and the panes give way to a `ChatView`
(widgets.chat_view: a system prompt, the conversation, a message box, Send / Regenerate / Clear).

The widget only asks and shows: `generate_requested(settings)` with
`{"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed",
"compare", "adapter_scale", "mode"}` (top-k 0 and top-p 1 mean off: None), `stop_requested()`; `set_defaults(values)` puts
the sampling boxes to a model's defaults (`DEFAULTS` where it gives none); the app streams text into the panes
(`append(column, text)`), titles them (`set_columns`) and says what is going on (`set_status`).
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPlainTextEdit, QPushButton, QSizePolicy, QSpinBox, QSplitter, QVBoxLayout, QWidget)
from PySide6.QtCore import Qt

from .chat_view import ChatView
from .common import ErrorLabel, monospace_font, titled_columns

# the sampling boxes' values when the model gives none (greedy, 32 new tokens)
DEFAULTS = {"max_new_tokens": 32, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "repetition_penalty": 1.0}

COMPARE = [("none", "Current model only"), ("run", "Before / after the last training run"),
           ("adapter", "Adapter off / on")]

MODES = [("continue", "Continue text"), ("chat", "Chat")]


class GenerateView(QWidget):
    generate_requested = Signal(dict)
    stop_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("generate-view")
        self.prompt = QPlainTextEdit()
        self.prompt.setObjectName("prompt")
        self.prompt.setPlaceholderText("A prompt to continue…")
        self.prompt.setFont(monospace_font())
        self.prompt.setMinimumHeight(48)
        self.prompt.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

        def spin(name, lo, hi, value, tip):
            w = QSpinBox()
            w.setObjectName(name)
            w.setRange(lo, hi)
            w.setValue(value)
            w.setToolTip(tip)
            return w

        def dspin(name, lo, hi, value, step, tip):
            w = QDoubleSpinBox()
            w.setObjectName(name)
            w.setRange(lo, hi)
            w.setDecimals(2)
            w.setSingleStep(step)
            w.setValue(value)
            w.setToolTip(tip)
            return w

        self.max_new_tokens = spin("max-new-tokens", 1, 4096, DEFAULTS["max_new_tokens"],
                                   "new tokens at most (fewer at a stop token)")
        self.temperature = dspin("temperature", 0.0, 10.0, DEFAULTS["temperature"], 0.1,
                                 "0: greedy (the most likely token each step)")
        self.top_k = spin("top-k", 0, 100_000, DEFAULTS["top_k"], "sample among the k most likely tokens; 0: off")
        self.top_p = dspin("top-p", 0.01, 1.0, DEFAULTS["top_p"], 0.05,
                           "sample among the most likely tokens holding this much probability; 1: off")
        self.repetition_penalty = dspin("repetition-penalty", 0.01, 10.0, DEFAULTS["repetition_penalty"], 0.05,
                                        "above 1: tokens already in the text are less likely; 1: off")
        self.seed = spin("seed", 0, 2**31 - 1, 0, "the same seed gives the same text")
        self.compare = QComboBox()
        self.compare.setObjectName("compare")
        for key, label in COMPARE:
            self.compare.addItem(label, key)
        self.compare.setToolTip("Generate the same prompt with two models, side by side")
        self.mode = QComboBox()
        self.mode.setObjectName("generate-mode")
        for key, label in MODES:
            self.mode.addItem(label, key)
        self.mode.setToolTip("Continue a text, or chat with a model that has a chat template")
        self.mode.currentIndexChanged.connect(self._show_mode)
        self.adapter_scale = dspin("adapter-scale", 0.0, 2.0, 1.0, 0.1,
                                   "how strongly the LoRA adapters act: 0 the base model, 1 as trained, 2 twice")
        self.chat = ChatView()
        self.chat.setVisible(False)
        self.generate_button = QPushButton("Generate")
        self.generate_button.setObjectName("generate")
        self.generate_button.clicked.connect(self._on_generate)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stop-generation")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested.emit)
        self.status = QLabel("")
        self.status.setObjectName("generate-status")
        self.status.setWordWrap(True)
        self.error = ErrorLabel()
        self.error.setObjectName("generate-error")

        settings = QGroupBox("Sampling")
        grid = QGridLayout(settings)
        grid.setContentsMargins(6, 6, 6, 6)
        for i, (label, w) in enumerate((("max new tokens", self.max_new_tokens), ("temperature", self.temperature),
                                        ("top-k", self.top_k), ("top-p", self.top_p),
                                        ("repetition penalty", self.repetition_penalty), ("seed", self.seed))):
            grid.addWidget(QLabel(label), i // 3, 2 * (i % 3))
            grid.addWidget(w, i // 3, 2 * (i % 3) + 1)
            w.setMinimumWidth(90)
        grid.setColumnStretch(6, 1)  # the boxes keep their size; the row's room goes to the right
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Mode", self.mode)
        form.addRow("Compare", self.compare)
        form.addRow("Adapter scale", self.adapter_scale)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        buttons = QHBoxLayout()
        buttons.addWidget(self.generate_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)

        def output(i: int) -> QPlainTextEdit:
            out = QPlainTextEdit()
            out.setObjectName(f"output-{i}")
            out.setReadOnly(True)
            out.setFont(monospace_font())
            out.setMinimumHeight(60)
            return out

        self.output_split, self.titles, self.outputs = titled_columns(2, output, "output")
        self.output_split.setObjectName("generate-outputs")

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        self.prompt_label = QLabel("Prompt")
        tl.addWidget(self.prompt_label)
        tl.addWidget(self.prompt, 1)
        tl.addWidget(settings)
        tl.addLayout(form)
        tl.addLayout(buttons)
        tl.addWidget(self.status)
        tl.addWidget(self.error)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(self.output_split)
        split.addWidget(self.chat)
        split.setCollapsible(0, False)
        split.setCollapsible(1, False)
        split.setCollapsible(2, False)
        split.setStretchFactor(2, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([240, 600])  # a few lines of prompt; the outputs get the room
        self.split = split
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(split)
        self.set_columns(["Output"])

    # ---- what the user asked ------------------------------------------------------------------
    def settings(self) -> dict:
        top_k = self.top_k.value()
        top_p = self.top_p.value()
        return {"prompt": self.prompt.toPlainText(), "max_new_tokens": self.max_new_tokens.value(),
                "temperature": self.temperature.value(), "top_k": top_k or None,
                "top_p": None if top_p >= 1.0 else top_p, "repetition_penalty": self.repetition_penalty.value(),
                "seed": self.seed.value(),
                "compare": self.compare.currentData(), "adapter_scale": self.adapter_scale.value(),
                "mode": self.mode.currentData()}

    def set_defaults(self, values: dict) -> None:
        """The sampling boxes set to `values` (keys of `DEFAULTS`; a missing key takes `DEFAULTS`'),
        each clamped to its box's range."""
        boxes = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_k": self.top_k,
                 "top_p": self.top_p, "repetition_penalty": self.repetition_penalty}
        for key, box in boxes.items():
            value = values.get(key, DEFAULTS[key])
            box.setValue(type(box.value())(min(max(value, box.minimum()), box.maximum())))

    def set_mode(self, mode: str) -> None:
        """"continue" or "chat" (where it is available)."""
        self.mode.setCurrentIndex(self.mode.findData(mode))

    def set_chat_available(self, ok: bool, why: str = "") -> None:
        """Whether chat mode can be chosen (a model with a chat template); off, the mode goes back
        to continuing text and the chat entry says `why`."""
        item = self.mode.model().item(self.mode.findData("chat"))
        item.setEnabled(bool(ok))
        item.setToolTip("" if ok else why)
        if not ok and self.mode.currentData() == "chat":
            self.set_mode("continue")

    def _show_mode(self) -> None:
        chat = self.mode.currentData() == "chat"
        for w in (self.prompt_label, self.prompt, self.generate_button, self.output_split):
            w.setVisible(not chat)
        self.chat.setVisible(chat)
        # without the prompt the settings need only their own height: the transcript gets the rest
        total = max(sum(self.split.sizes()), self.height(), 600)
        top = self.split.widget(0).minimumSizeHint().height() if chat else 240
        self.split.setSizes([top, 0, total - top] if chat else [top, total - top, 0])

    def _on_generate(self) -> None:
        self.generate_requested.emit(self.settings())

    # ---- what the app shows -------------------------------------------------------------------
    def set_columns(self, titles: list[str], echo: str = "") -> None:
        """One pane a title (one or two); the panes are cleared. `echo`: the prompt being
        continued, shown first in each pane in its own format (dimmed, italic) so the
        continuation that follows reads on from it and is told apart."""
        self._echo_len = len(echo)
        for i, (title, out) in enumerate(zip(self.titles, self.outputs)):
            on = i < len(titles)
            title.setText(titles[i] if on else "")
            out.clear()
            title.parentWidget().setVisible(on)
            if echo:
                cursor = out.textCursor()
                cursor.insertText(echo, self.echo_format())
                out.setTextCursor(cursor)
            out.setToolTip("The prompt (dimmed, italic), then the model's continuation" if echo else "")

    def echo_format(self) -> QTextCharFormat:
        """The prompt's format in the panes: the palette's placeholder colour, italic."""
        f = QTextCharFormat()
        f.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        f.setFontItalic(True)
        return f

    def append(self, column: int, text: str) -> None:
        out = self.outputs[column]
        cursor = out.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text, QTextCharFormat())  # the continuation: the pane's own format
        out.setTextCursor(cursor)

    def text(self, column: int) -> str:
        """The continuation the model gave in `column` (without the prompt shown before it)."""
        return self.outputs[column].toPlainText()[self._echo_len:]

    def shown_text(self, column: int) -> str:
        """Everything the pane shows: the prompt, then the continuation."""
        return self.outputs[column].toPlainText()

    def set_running(self, running: bool) -> None:
        self.generate_button.setEnabled(not running and self._can_generate)
        self.stop_button.setEnabled(running)
        self.chat.set_running(running)

    _can_generate = True
    _echo_len = 0  # characters of the prompt echoed at the start of each pane

    def set_can_generate(self, ok: bool, why: str = "") -> None:
        self._can_generate = bool(ok)
        self.generate_button.setEnabled(ok and not self.stop_button.isEnabled())
        self.generate_button.setToolTip("" if ok else why)
        self.chat.set_can_send(ok, why)
        if not ok and why:
            self.set_status(why)

    def set_status(self, text: str) -> None:
        self.status.setText(text)
