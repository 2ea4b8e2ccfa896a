"""Conversation data on the Training tab (issue 45 items 3 and 4): a tiny Llama folder with a chat
template, a ShareGPT file chosen through Browse… is detected as conversations, packed, trained for
a couple of steps; the run says how many conversations and assistant tokens it learnt. A model
folder without tokenizer.json says so where the tokenizer is chosen and takes a tokenizer folder
the user picks; a folder without a chat template is named before and by the run."""
from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtCore import Qt

from tests.app.window_helpers import wait_idle
from tests.engine.train.test_chat_run_data import chat_llama_folder

CONVERSATIONS = Path(__file__).resolve().parents[1] / "fixtures" / "conversations"


def open_folder(qtbot, window, folders, folder):
    folders.append(folder)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 60_000)
    assert window.document.module is not None


def choose_data(qtbot, window, files, path):
    panel = window.training_panel
    window.actions.train_show.trigger()
    files.append(path)
    qtbot.mouseClick(panel.browse_button, Qt.MouseButton.LeftButton)
    return panel


def test_conversations_are_detected_packed_and_trained_on_the_training_tab(window, qtbot, folders, files,
                                                                           tmp_path):
    folder = chat_llama_folder(tmp_path / "tiny-chat")
    open_folder(qtbot, window, folders, folder)
    panel = choose_data(qtbot, window, files, CONVERSATIONS / "sharegpt.jsonl")
    form = panel.data_form
    assert form.field_widget("task").currentText() == "causal-lm"
    assert form.field_widget("tokenizer").text() == str(folder)
    note = panel.run_settings.data_note
    assert note.isVisible() and "conversations (ShareGPT format) detected" in note.text(), note.text()
    assert "chat template of chat_template.jinja" in note.text() and "assistant's turns only" in note.text()
    assert form.field_widget("truncate").isVisible()  # truncate or refuse, the user's choice
    form.set_field("block_size", 512)
    form.set_field("packing", True)
    form.set_field("valid_fraction", 0.5)
    for name, value in (("num_epochs", 2), ("batch_size", 1), ("checkpoint_every", 0)):
        panel.training_form.set_field(name, value)
    assert panel.settings_valid(), panel.run_settings.data_form.errors()
    run = panel.start(max_steps=2)
    assert run is not None, panel.last_error
    assert panel.wait(300)
    assert run.status != "failed" and run.history.global_step >= 1, panel.last_error
    # the run read the file: 2 conversations packed into one row; the data note says so
    assert run.data_note.startswith("conversation data (sharegpt format): 2 conversations, "), run.data_note
    assert "assistant tokens learnt, packed into 1 row of 512 positions" in run.data_note
    assert note.text() == run.data_note
    assert len(run.history.losses) == 2 and all(0.0 < x < 20.0 for x in run.history.losses), run.history.losses
    assert run.status in ("finished", "stopped")


def test_a_folder_without_a_tokenizer_says_so_and_takes_a_chosen_tokenizer_folder(window, qtbot, folders, files,
                                                                                  tmp_path):
    chat = chat_llama_folder(tmp_path / "tiny-chat")
    bare = tmp_path / "no-tokenizer"
    shutil.copytree(chat, bare)
    (bare / "tokenizer.json").unlink()
    open_folder(qtbot, window, folders, bare)
    panel = choose_data(qtbot, window, files, CONVERSATIONS / "messages.jsonl")
    settings = panel.run_settings
    assert panel.data_form.field_widget("task").currentText() == "causal-lm"  # not a CSV column error
    assert settings.tokenizer_note.isVisible()
    assert f"The model folder {bare} has no tokenizer.json: choose a tokenizer folder" in settings.tokenizer_note.text()
    assert settings.tokenizer_button.isVisible() and not panel.settings_valid()
    assert "choose a tokenizer folder with a chat template" in settings.data_note.text()
    folders.append(chat)
    qtbot.mouseClick(settings.tokenizer_button, Qt.MouseButton.LeftButton)
    assert panel.data_form.field_widget("tokenizer").text() == str(chat)
    assert settings.tokenizer_note.text() == f"Tokenizer: {chat}"
    assert panel.settings_valid(), panel.run_settings.data_form.errors()
    assert "OpenAI messages format" in settings.data_note.text()


def test_a_tokenizer_folder_without_a_chat_template_is_named_before_and_by_the_run(window, qtbot, folders, files,
                                                                                   tmp_path):
    folder = chat_llama_folder(tmp_path / "tiny-base")
    (folder / "chat_template.jinja").unlink()
    open_folder(qtbot, window, folders, folder)
    panel = choose_data(qtbot, window, files, CONVERSATIONS / "alpaca.jsonl")
    assert f"the tokenizer folder {folder} has no usable chat template" in panel.run_settings.data_note.text()
    panel.data_form.set_field("block_size", 512)
    panel.training_form.set_field("checkpoint_every", 0)
    model = window.document.module
    run = panel.start(max_steps=1)
    assert run is not None, panel.last_error
    assert panel.wait(120)
    assert run.status == "failed"
    assert "alpaca.jsonl: the file is conversation data (alpaca format)" in panel.last_error, panel.last_error
    assert f"the tokenizer folder {folder} has none" in panel.last_error
    assert window.document.module is model
