"""Preview rows (issue 45 item 4): from the Training tab, a conversation data file's rows open in a
dialog that reads the file on a worker, picks a conversation, and shows its tokens trained or masked
exactly as training flags them."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.chat_row_dialog import ChatRowDialog, is_conversation_file
from app.theme import apply_theme
from engine.train.chat_data import conversation_tokens
from engine.train.chat_template import read_chat_template
from engine.train.conversations import read_conversations
from engine.train.text import load_tokenizer
from tests.app.window_helpers import LLAMA, wait_idle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CONVERSATIONS = FIXTURES / "conversations"


def _chat_folder(tmp_path) -> Path:
    folder = tmp_path / "chat-model"
    shutil.copytree(LLAMA, folder)
    shutil.copy(FIXTURES / "chat_templates" / "smollm2-instruct.jinja", folder / "chat_template.jinja")
    return folder


def test_conversation_files_are_told_from_text_files(tmp_path):
    assert is_conversation_file(str(CONVERSATIONS / "sharegpt.jsonl"))
    assert is_conversation_file(str(CONVERSATIONS / "alpaca.jsonl"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "completion": "b"}\n')
    assert not is_conversation_file(str(prompts)) and not is_conversation_file(str(tmp_path / "none.jsonl"))


def test_preview_rows_from_the_training_tab(window, qtbot, folders, files, tmp_path):
    folder = _chat_folder(tmp_path)
    folders.append(folder)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 60_000)
    panel = window.training_panel
    button = panel.run_settings.preview_rows_button
    text = tmp_path / "plain.txt"
    text.write_text("the cat sat.\n")
    files.append(text)
    qtbot.mouseClick(panel.browse_button, Qt.MouseButton.LeftButton)
    assert not button.isVisibleTo(panel)  # text data has no rows to preview
    data = CONVERSATIONS / "messages.jsonl"
    files.append(data)
    qtbot.mouseClick(panel.browse_button, Qt.MouseButton.LeftButton)
    assert button.isVisibleTo(panel)

    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    (dialog,) = panel.findChildren(ChatRowDialog)
    assert isinstance(dialog, ChatRowDialog) and dialog.wait_loaded(30) and not dialog.error.error()
    assert dialog.task.outcome == "finished"
    template, tokenizer = read_chat_template(folder), load_tokenizer(folder)
    convs = read_conversations(data)
    assert dialog.of_label.text() == f"of {len(convs)}" and dialog.picker.maximum() == len(convs)
    for n in (1, len(convs)):
        dialog.picker.setValue(n)
        learn = conversation_tokens(convs[n - 1], template, tokenizer).learn.tolist()
        assert [s == "trained" for _i, s, _b in dialog.view.chips()] == learn
    shots = os.environ.get("EMBER_SHOTS")
    if shots:  # a look at the dialog, in both themes
        dialog.picker.setValue(1)
        dialog.resize(1100, 560)
        dialog.view.inference_combo.setCurrentIndex(0)
        dialog.grab().save(str(Path(shots) / "preview-rows-light.png"))
        apply_theme(QApplication.instance(), "dark")
        QApplication.processEvents()
        dialog.grab().save(str(Path(shots) / "preview-rows-dark.png"))
    dialog.close()


def test_a_bad_record_is_named_by_file_and_line(qtbot, tmp_path):
    folder = _chat_folder(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
                   '{"messages": [{"role": "pirate", "content": "arr"}]}\n')
    dialog = ChatRowDialog(str(bad), str(folder))
    qtbot.addWidget(dialog)
    assert dialog.wait_loaded(30) and dialog.task.outcome == "failed"
    assert "bad.jsonl, line 2" in dialog.error.error() and "pirate" in dialog.error.error()
