"""A model folder without tokenizer.json (issue 45 item 4): the Generate tab says so and lets the user
pick a folder that has one; a folder without one is refused with what it holds; the pick is
remembered for that model, and generation uses that tokenizer."""
from __future__ import annotations

import shutil

from PySide6.QtCore import Qt

from engine.models import generate
from engine.train.text import load_tokenizer
from tests.app.window_helpers import LLAMA, wait_idle


def _open(qtbot, window, folders, folder):
    folders.append(folder)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 60_000)
    assert window.document.module is not None


def test_a_folder_without_a_tokenizer_lets_the_user_pick_one(window, qtbot, folders, tmp_path):
    bare = tmp_path / "no-tokenizer"
    shutil.copytree(LLAMA, bare)
    (bare / "tokenizer.json").unlink()
    panel = window.generate_panel
    v, picker = panel.view, panel.tokenizer_picker
    _open(qtbot, window, folders, bare)
    assert picker.isVisibleTo(panel) and "no tokenizer.json" in picker.message.text()
    assert not v.generate_button.isEnabled() and panel.folder() == ""

    # a folder without tokenizer.json is refused, saying what it holds
    folders.append(tmp_path)
    qtbot.mouseClick(picker.button, Qt.MouseButton.LeftButton)
    assert "expected tokenizer.json in" in picker.error.error() and "no-tokenizer" in picker.error.error()
    assert not v.generate_button.isEnabled() and picker.isVisibleTo(panel)

    folders.append(LLAMA)
    qtbot.mouseClick(picker.button, Qt.MouseButton.LeftButton)
    assert not picker.isVisibleTo(panel) and v.generate_button.isEnabled()
    assert panel.folder() == str(LLAMA)

    v.prompt.setPlainText("the cat")
    v.max_new_tokens.setValue(6)
    qtbot.mouseClick(v.generate_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60) and not v.error.error(), v.error.error()
    s = v.settings()
    want = generate(window.document.module, load_tokenizer(str(LLAMA)), "the cat", 6, temperature=s["temperature"],
                    top_k=s["top_k"], top_p=s["top_p"], seed=s["seed"], repetition_penalty=s["repetition_penalty"])
    assert panel.last_results[0].token_ids == want.token_ids

    # another model, then this one again: the pick is remembered for it
    _open(qtbot, window, folders, LLAMA)
    assert not picker.isVisibleTo(panel) and panel.folder() == str(LLAMA)
    _open(qtbot, window, folders, bare)
    assert panel.folder() == str(LLAMA) and not picker.isVisibleTo(panel) and v.generate_button.isEnabled()
