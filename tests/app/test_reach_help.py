"""What a user reaches for (issue 48, item 14): Help ▸ User Guide shows the guide rendered; the
Generate tab shows the prompt it continued, then the continuation, told apart by their format."""
from __future__ import annotations

import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu

from app.main_window import USER_GUIDE
from tests.app.window_helpers import open_llama
from widgets.guide_view import GuideDialog

PROMPT = "the cat"


def test_help_user_guide_opens_the_guide_rendered(window, qtbot):
    help_menu = next(m for m in window.menuBar().findChildren(QMenu) if m.title() == "&Help")
    assert window.actions.user_guide in help_menu.actions()
    window.actions.user_guide.trigger()
    dialog = window.dialog
    assert isinstance(dialog, GuideDialog) and dialog.isVisible()
    text = USER_GUIDE.read_text(encoding="utf-8")
    wanted = [re.sub(r"[`*_]", "", h).strip() for h in re.findall(r"^#{1,3} (.+)$", text, re.M)]
    assert len(wanted) > 5
    shown = dialog.headings()
    # the Markdown is rendered: its headings are headings, without their '#'
    assert shown[0] == wanted[0] and set(wanted) <= {re.sub(r"[`*_]", "", h).strip() for h in shown}
    assert "## " not in dialog.browser.toPlainText()
    dialog.reject()


def test_a_missing_guide_is_named_in_the_dialog(qtbot, tmp_path):
    d = GuideDialog(tmp_path / "nope.md")
    qtbot.addWidget(d)
    assert "could not be read" in d.browser.toPlainText() and "nope.md" in d.browser.toPlainText()


def test_generate_echoes_the_prompt_then_the_continuation(window, qtbot, folders):
    open_llama(qtbot, window, folders)
    window.actions.generate_show.trigger()
    panel = window.generate_panel
    v = panel.view
    v.prompt.setPlainText(PROMPT)
    v.max_new_tokens.setValue(8)
    v.temperature.setValue(0.0)
    qtbot.mouseClick(v.generate_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60)
    assert not v.error.error(), v.error.error()
    continuation = v.text(0)
    assert continuation and continuation == panel.last_results[0].text  # what the model gave, alone
    pane = v.outputs[0]
    assert pane.toPlainText() == PROMPT + continuation == v.shown_text(0)  # the prompt, then the rest
    doc = pane.document()

    def fmt(position):  # the character format at a position in the pane
        from PySide6.QtGui import QTextCursor

        c = QTextCursor(doc)
        c.setPosition(position + 1)
        return c.charFormat()

    prompt_fmt, cont_fmt = fmt(0), fmt(len(PROMPT) + len(continuation) - 1)
    assert prompt_fmt.fontItalic() and not cont_fmt.fontItalic()
    assert prompt_fmt.foreground().color() != cont_fmt.foreground().color()
    assert fmt(len(PROMPT) - 1).fontItalic()  # the whole prompt, up to its last character
