"""A rendered training row, token by token, beside what the model is given at inference.

Left: the conversation as training renders it (`engine.train.chat_preview.RowPreview`), each token a
chip: green where the loss trains on it (the assistant's tokens), grey where it is masked, special
tokens in bold violet; neighbouring tokens alternate two shades so their edges show. Hovering a
token shows its index, id, vocabulary string and state. Right: an inference rendering of the same
messages (a choice of them), and in both panes the words where the two renderings differ are
marked in orange (⁁ where one has text the other lacks). Text is selectable; both panes scroll. Colours follow the palette (light or dark).
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, Qt, Signal
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QSplitter, QTextEdit, QToolTip,
                               QVBoxLayout, QWidget)

from engine.train.chat_preview import RowPreview, differing_spans

from .common import ErrorLabel, monospace_font

TOKEN_PROPERTY = QTextFormat.Property.UserProperty + 1  # the token index a character belongs to
STATE_PROPERTY = QTextFormat.Property.UserProperty + 2  # "trained" | "masked"

# (light, dark) theme colours: two shades per state, the special tokens' text, the differences
_COLOURS = {
    "trained": (("#c6ebc9", "#a9dcae"), ("#1e4a2a", "#2a5e37")),
    "masked": (("#ececec", "#dadada"), ("#36383c", "#43464b")),
    "special": ("#6a1fd1", "#c9a6ff"),
    "differs": ("#ffb347", "#b8621b"),
}


MISSING = "⁁"  # shown (marked) where the other rendering has text that this one lacks


def _is_dark(widget: QWidget) -> bool:
    return widget.palette().color(widget.backgroundRole()).lightness() < 128


def _shown(text: str) -> str:
    """A token's text as the pane shows it: a line break gets a visible mark before it."""
    return text.replace("\n", "↵\n")


class _Pane(QTextEdit):
    """A read-only, selectable, scrolling text pane whose tooltip names the token under the mouse."""

    def __init__(self, describe, parent=None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.setFont(monospace_font())
        self.describe = describe  # (document position) -> tooltip text or ""

    def position_at(self, point: QPoint) -> int:
        """The document position of the character under `point` (viewport coordinates)."""
        cursor = self.cursorForPosition(point)
        pos = cursor.position()
        if point.x() < self.cursorRect(cursor).x() and pos > 0:
            pos -= 1
        return pos

    def viewportEvent(self, event):  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.ToolTip:
            text = self.describe(self.position_at(event.pos()))
            if text:
                QToolTip.showText(event.globalPos(), text, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


def _swatch(text: str, background: str, foreground: str = "", bold: bool = False) -> QLabel:
    label = QLabel(text)
    style = f"background: {background}; padding: 1px 6px; border-radius: 3px;"
    if foreground:
        style += f" color: {foreground};"
    if bold:
        style += " font-weight: bold;"
    label.setStyleSheet(style)
    return label


class ChatRowView(QWidget):
    """`show_row(preview)`; `inference_combo` picks the inference rendering shown on the right."""

    inference_changed = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("chat-row-view")
        self.preview: RowPreview | None = None
        self.counts = QLabel("")
        self.counts.setObjectName("chat-row-counts")
        self.counts.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.legend = QHBoxLayout()
        self.error = ErrorLabel()
        self.training = _Pane(self._describe_training)
        self.training.setObjectName("chat-row-training")
        self.inference = _Pane(lambda _pos: "")
        self.inference.setObjectName("chat-row-inference")
        self.inference_combo = QComboBox()
        self.inference_combo.setObjectName("chat-row-inference-choice")
        self.inference_combo.currentIndexChanged.connect(self._show_inference)
        self.difference_note = QLabel("")
        self.difference_note.setWordWrap(True)
        self._token_starts: list[int] = []  # document position where each shown token starts
        self.training_differs: list[tuple[int, int]] = []  # character spans of the row text marked
        self.inference_differs: list[tuple[int, int]] = []  # character spans of the rendering marked

        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(QLabel("<b>Training row</b> — what the loss sees"))
        lv.addWidget(self.training)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        rv.addWidget(QLabel("<b>At inference</b> — what the model is given"))
        rv.addWidget(self.inference_combo)
        rv.addWidget(self.inference)
        rv.addWidget(self.difference_note)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.counts)
        top.addStretch(1)
        top.addLayout(self.legend)
        layout.addLayout(top)
        layout.addWidget(self.error)
        layout.addWidget(split, 1)
        self._fill_legend()

    # ---- colours --------------------------------------------------------------------------------
    def _colour(self, name: str):
        return _COLOURS[name][1 if _is_dark(self) else 0]

    def _fill_legend(self) -> None:
        while self.legend.count():
            item = self.legend.takeAt(0)
            if item.widget() is not None:
                item.widget().setParent(None)  # gone now, not after the event loop's turn
        text = self.palette().color(self.foregroundRole()).name()
        self.legend.addWidget(_swatch("trained", self._colour("trained")[0], text))
        self.legend.addWidget(_swatch("masked", self._colour("masked")[0], text))
        self.legend.addWidget(_swatch("special token", self._colour("masked")[0], self._colour("special"), bold=True))
        self.legend.addWidget(_swatch("differs", self._colour("differs"), text))
        for i in range(self.legend.count()):
            self.legend.itemAt(i).widget().setVisible(True)  # added to a shown widget: shown explicitly

    def changeEvent(self, event):  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._fill_legend()
            if self.preview is not None:
                self.show_row(self.preview)

    # ---- content --------------------------------------------------------------------------------
    def show_row(self, preview: RowPreview) -> None:
        """Show `preview`; the inference choice stays where it was when there is one as far."""
        self.preview = preview
        keep = max(0, self.inference_combo.currentIndex())
        self.inference_combo.blockSignals(True)
        self.inference_combo.clear()
        for r in preview.inference:
            self.inference_combo.addItem(r.label)
        self.inference_combo.setCurrentIndex(min(keep, len(preview.inference) - 1))
        self.inference_combo.blockSignals(False)
        self.error.show_error(f"Training refuses this conversation: {preview.error}" if preview.error else None)
        rows = preview.tokens
        if rows is None:
            self.counts.setText(f"No tokens: training refuses this conversation ({len(preview.text):,} characters "
                                f"rendered)")
        else:
            n, t, s = len(rows.ids), preview.trained, int(preview.special.sum())
            pct = 100.0 * t / n if n else 0.0
            self.counts.setText(f"{n:,} tokens · {t:,} trained ({pct:.1f} %) · {n - t:,} masked · {s:,} special")
        self._show_inference(self.inference_combo.currentIndex())

    def _show_inference(self, index: int) -> None:
        preview = self.preview
        if preview is None:
            return
        rendering = preview.inference[index] if 0 <= index < len(preview.inference) else None
        if rendering is None or rendering.error:
            self.training_differs, self.inference_differs = [], []
            self.inference.setPlainText(rendering.error if rendering is not None else "")
            self.difference_note.setText("The template would not render this." if rendering is not None else "")
        else:
            self.training_differs, self.inference_differs = differing_spans(preview.text, rendering.text)
            self._fill_plain(self.inference, rendering.text, self.inference_differs)
            n = sum(b - a for a, b in self.inference_differs) + sum(b - a for a, b in self.training_differs)
            self.difference_note.setText(
                "The same text as the training row, up to where it ends." if not n else
                f"{len(self.training_differs)} place(s) differ ({n:,} characters, "
                f"marked orange): what the model is trained on is not what it is given here.")
        self._fill_training()
        self.inference_changed.emit(index)

    def _differs_format(self, fmt: QTextCharFormat) -> None:
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        fmt.setUnderlineColor(QColor(self._colour("differs")))

    def _fill_plain(self, pane: QTextEdit, text: str, differs) -> None:
        pane.clear()
        cursor = QTextCursor(pane.document())
        plain, marked = QTextCharFormat(), QTextCharFormat()
        marked.setBackground(QColor(self._colour("differs")))
        pos = 0
        for a, b in differs:
            cursor.insertText(_shown(text[pos:a]), plain)
            cursor.insertText(_shown(text[a:b]) if b > a else MISSING, marked)
            pos = b
        cursor.insertText(_shown(text[pos:]), plain)
        pane.moveCursor(QTextCursor.MoveOperation.Start)

    def _fill_training(self) -> None:
        preview, pane = self.preview, self.training
        self._token_starts = []
        if preview.tokens is None:
            self._fill_plain(pane, preview.text, self.training_differs)
            return
        pane.clear()
        rows, text = preview.tokens, preview.text
        differs = [False] * (len(text) + 1)
        missing = sorted(a for a, b in self.training_differs if a == b)
        marked = QTextCharFormat()
        marked.setBackground(QColor(self._colour("differs")))
        for a, b in self.training_differs:
            differs[a:b] = [True] * (b - a)
        special_colour = QColor(self._colour("special"))
        cursor = QTextCursor(pane.document())
        shown = 0  # characters of the text shown so far
        for i, (start, end) in enumerate(rows.offsets.tolist()):
            start = max(start, shown)
            if start > shown:  # characters no token covers (none with the tokenizers here)
                cursor.insertText(_shown(text[shown:start]), QTextCharFormat())
            piece = text[start:end] if end > start else ""
            state = "trained" if rows.learn[i] else "masked"
            fmt = QTextCharFormat()
            fmt.setBackground(QColor(self._colour(state)[i % 2]))
            fmt.setProperty(TOKEN_PROPERTY, i)
            fmt.setProperty(STATE_PROPERTY, state)
            if preview.special[i]:
                fmt.setForeground(special_colour)
                fmt.setFontWeight(QFont.Weight.Bold)
            if piece and any(differs[start:end]):
                self._differs_format(fmt)
            while missing and missing[0] <= start:  # the other rendering has text here that this row lacks
                cursor.insertText(MISSING, marked)
                missing.pop(0)
            self._token_starts.append(cursor.position())
            cursor.insertText(_shown(piece) if piece else "◌", fmt)  # a token with no characters of its own
            shown = max(shown, end)
        if shown < len(text):
            cursor.insertText(_shown(text[shown:]), QTextCharFormat())
        if missing:  # at the end of the row
            cursor.insertText(MISSING, marked)
        pane.moveCursor(QTextCursor.MoveOperation.Start)

    # ---- reading back (hover, tests) --------------------------------------------------------------
    def token_at(self, position: int) -> int | None:
        """The token index the character at document `position` of the training pane belongs to."""
        cursor = QTextCursor(self.training.document())
        if not 0 <= position < self.training.document().characterCount() - 1:
            return None
        cursor.setPosition(position + 1)
        value = cursor.charFormat().property(TOKEN_PROPERTY)
        return int(value) if value is not None else None

    def describe_token(self, i: int) -> str:
        preview = self.preview
        rows = preview.tokens
        a, b = rows.offsets[i].tolist()
        state = "trained" if rows.learn[i] else "masked"
        kind = ", special token" if preview.special[i] else ""
        return (f"token {i + 1} of {len(rows.ids)}: id {int(rows.ids[i])}, {preview.pieces[i]!r}\n"
                f"text {preview.text[a:b]!r} (characters {a}–{b}) — {state}{kind}")

    def _describe_training(self, position: int) -> str:
        i = self.token_at(position)
        return self.describe_token(i) if i is not None and self.preview is not None else ""

    def chips(self) -> list[tuple[int, str, bool]]:
        """Each token chip as the training pane holds it: (token index, "trained" | "masked",
        special), read from the pane's character formats."""
        out = []
        doc = self.training.document()
        block = doc.begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                fmt = fragment.charFormat()
                index = fmt.property(TOKEN_PROPERTY)
                if index is not None and (not out or out[-1][0] != index):
                    out.append((int(index), fmt.property(STATE_PROPERTY), fmt.fontWeight() == QFont.Weight.Bold))
                it += 1
            block = block.next()
        return out

    def token_at_point(self, point: QPoint) -> int | None:
        """The token under `point` of the training pane's viewport."""
        return self.token_at(self.training.position_at(point))

    def token_position(self, i: int) -> int:
        return self._token_starts[i]

