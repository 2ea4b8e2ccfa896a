"""The Generate tab's chat mode: a system prompt, the conversation so far as a transcript of user and
assistant turns (one transcript a column when two models are compared), a message box, Send,
Regenerate and Clear.

The widget only asks and shows: `send_requested(text)`, `regenerate_requested()`,
`clear_requested()`; the app keeps the `Conversation` (`view.conversation`) up to date and the
view shows it (`refresh()`), streaming an answer's text in with `append(column, text)`.

A `Conversation` holds the turns: a user turn is its text; an assistant turn holds one answer per
column (each compared model answers the same history with its own words), whether each was
stopped before its end (Stop) and whether each was cut at the token limit. `messages(column)` is what column `column`'s model is shown next: the system
prompt (when there is one), the user turns, and that column's own earlier answers (a turn answered
by fewer columns gives its first column's answer).
"""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy, QTextBrowser, QVBoxLayout,
                               QWidget)

from .common import titled_columns

COLUMNS = 2  # the most models compared side by side


class Conversation:
    """The turns of a chat (see the module docstring); plain data, no Qt."""

    def __init__(self):
        self.turns: list[dict] = []  # {"role": "user", "content"} or {"role": "assistant", "answers", "stopped"}
        self.pending = False  # the last assistant turn is being generated

    def __len__(self) -> int:
        return len(self.turns)

    def add_user(self, text: str) -> None:
        self.turns.append({"role": "user", "content": text})

    def begin_answer(self, columns: int) -> None:
        """An assistant turn for `columns` models, empty until their text comes in."""
        self.turns.append({"role": "assistant", "answers": [""] * columns, "stopped": [False] * columns,
                           "cut": [False] * columns})
        self.pending = True

    def append(self, column: int, text: str) -> None:
        if self.pending:
            self.turns[-1]["answers"][column] += text

    def end_answer(self, texts: list[str] | None = None, stopped: bool = False, cut: list[bool] | None = None) -> None:
        """The pending answer is final: `texts` (a column each) replace what was streamed where given;
        `stopped` marks every column as stopped before its end (the text so far is kept); `cut` (a
        column each) marks the answers that reached the token limit before the model ended them."""
        if not self.pending:
            return
        turn = self.turns[-1]
        for i, text in enumerate(texts or []):
            if text is not None and i < len(turn["answers"]):
                turn["answers"][i] = text
        if stopped:
            turn["stopped"] = [True] * len(turn["answers"])
        for i, flag in enumerate(cut or []):
            if i < len(turn["cut"]):
                turn["cut"][i] = bool(flag)
        self.pending = False

    def drop_answer(self) -> None:
        """The last assistant turn removed (a failed generation, or before regenerating it)."""
        if self.turns and self.turns[-1]["role"] == "assistant":
            self.turns.pop()
        self.pending = False

    def can_regenerate(self) -> bool:
        return bool(self.turns) and not self.pending

    def clear(self) -> None:
        self.turns.clear()
        self.pending = False

    def messages(self, column: int = 0, system: str = "") -> list[dict]:
        """The conversation as `column`'s model sees it (role / content messages)."""
        out = [{"role": "system", "content": system}] if system.strip() else []
        for turn in self.turns:
            if turn["role"] == "user":
                out.append({"role": "user", "content": turn["content"]})
            elif not (self.pending and turn is self.turns[-1]):
                answers = turn["answers"]
                out.append({"role": "assistant", "content": answers[min(column, len(answers) - 1)]})
        return out


_USER = "margin: 6px 2px 2px 48px; padding: 6px; background: palette(alternate-base); border-radius: 6px;"
_BOT = "margin: 6px 48px 2px 2px; padding: 6px;"


def _turn_html(role: str, text: str, note: str = "") -> str:
    who = "You" if role == "user" else "Assistant"
    body = html.escape(text).replace("\n", "<br>") if text else ""
    extra = f' <span style="color: gray;"><i>{html.escape(note)}</i></span>' if note else ""
    style = _USER if role == "user" else _BOT
    return f'<div style="{style}"><b>{who}</b>{extra}<br>{body}</div>'


class Transcript(QTextBrowser):
    """A column's transcript; one showing its end keeps showing it when resized (the latest answer
    stays in view when the window gets smaller)."""

    def resizeEvent(self, event):  # noqa: N802 (Qt's name)
        bar = self.verticalScrollBar()
        at_end = bar.value() >= bar.maximum()
        super().resizeEvent(event)
        if at_end:
            bar.setValue(bar.maximum())


class ChatView(QWidget):
    send_requested = Signal(str)
    regenerate_requested = Signal()
    clear_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("chat-view")
        self.conversation = Conversation()
        self.system = QPlainTextEdit()
        self.system.setObjectName("system-prompt")
        self.system.setPlaceholderText("System prompt (optional): how the assistant should behave…")
        self.system.setMaximumHeight(2 * self.system.fontMetrics().lineSpacing() + 14)  # two lines: room for the chat
        self.system.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

        def transcript(i: int) -> Transcript:
            t = Transcript()
            t.setObjectName(f"chat-transcript-{i}")
            t.setOpenLinks(False)
            t.setMinimumHeight(80)
            return t

        self.columns, self.titles, self.transcripts = titled_columns(COLUMNS, transcript, "chat")
        self.columns.setObjectName("chat-columns")

        self.input = QPlainTextEdit()
        self.input.setObjectName("chat-input")
        self.input.setPlaceholderText("A message… (Ctrl+Enter sends)")
        self.input.setMaximumHeight(3 * self.input.fontMetrics().lineSpacing() + 14)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("chat-send")
        self.send_button.setShortcut("Ctrl+Return")
        self.send_button.clicked.connect(self._on_send)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setObjectName("chat-regenerate")
        self.regenerate_button.setToolTip("Answer the last message again (the last answer is replaced)")
        self.regenerate_button.clicked.connect(self.regenerate_requested.emit)
        self.clear_button = QPushButton("Clear")
        self.clear_button.setObjectName("chat-clear")
        self.clear_button.setToolTip("Start a new conversation (the system prompt stays)")
        self.clear_button.clicked.connect(self.clear_requested.emit)

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addWidget(self.clear_button)
        buttons.addStretch(1)
        entry = QHBoxLayout()
        entry.addWidget(self.input, 1)
        entry.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("System prompt"))
        layout.addWidget(self.system)
        layout.addWidget(self.columns, 1)
        layout.addLayout(entry)
        self._running = False
        self._can_send = True
        self.set_columns(["Assistant"])

    # ---- what the user asked ------------------------------------------------------------------
    def system_prompt(self) -> str:
        return self.system.toPlainText()

    def _on_send(self) -> None:
        self.send_requested.emit(self.input.toPlainText())

    # ---- what the app shows -------------------------------------------------------------------
    def set_columns(self, titles: list[str]) -> None:
        """One transcript a title (one or two); the conversation is kept and shown in each."""
        self._shown = max(1, min(len(titles), COLUMNS))
        for i, title in enumerate(self.titles):
            on = i < self._shown
            title.setText(titles[i] if on and i < len(titles) else "")
            title.parentWidget().setVisible(on)
        self.refresh()

    def refresh(self) -> None:
        """Every shown transcript redrawn from the conversation."""
        for c in range(self._shown):
            parts = []
            for turn in self.conversation.turns:
                if turn["role"] == "user":
                    parts.append(_turn_html("user", turn["content"]))
                else:
                    i = min(c, len(turn["answers"]) - 1)
                    pending = self.conversation.pending and turn is self.conversation.turns[-1]
                    note = "stopped" if turn["stopped"][i] else "cut at the token limit" if turn["cut"][i] else \
                        "…" if pending else ""
                    parts.append(_turn_html("assistant", turn["answers"][i], note))
            view = self.transcripts[c]
            view.setHtml("".join(parts))
            view.moveCursor(QTextCursor.MoveOperation.End)
            view.ensureCursorVisible()
        self._update_buttons()

    def append(self, column: int, text: str) -> None:
        """Streamed text of the pending answer of `column`: into the conversation and its transcript."""
        self.conversation.append(column, text)
        if column < self._shown:
            view = self.transcripts[column]
            cursor = view.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(text)
            view.setTextCursor(cursor)
            view.ensureCursorVisible()

    def transcript(self, column: int = 0) -> str:
        return self.transcripts[column].toPlainText()

    def set_running(self, running: bool) -> None:
        self._running = bool(running)
        self._update_buttons()

    def set_can_send(self, ok: bool, why: str = "") -> None:
        self._can_send = bool(ok)
        self.send_button.setToolTip("" if ok else why)
        self._update_buttons()

    def _update_buttons(self) -> None:
        idle = not self._running
        self.send_button.setEnabled(idle and self._can_send)
        self.regenerate_button.setEnabled(idle and self._can_send and self.conversation.can_regenerate())
        self.clear_button.setEnabled(idle and len(self.conversation) > 0)
