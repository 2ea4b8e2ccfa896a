"""The Generate tab takes a model's own generation settings (issue 45, item 2): opening a folder whose
generation_config.json samples sets the sampling boxes to its temperature, top-k (transformers' 50
where the file names none), top-p, repetition penalty and max new tokens, and Generate uses them
(the repetition penalty included); a folder whose file does not sample, or that has none, gets the
usual greedy defaults."""
from __future__ import annotations

import json
import shutil

from PySide6.QtCore import Qt

from engine.models import generate
from engine.train.text import load_tokenizer
from widgets.generate_view import DEFAULTS
from tests.app.window_helpers import LLAMA, wait_idle


def _open(qtbot, window, folders, folder):
    folders.append(folder)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 60_000)
    assert window.document.module is not None


def _boxes(v) -> dict:
    return {"max_new_tokens": v.max_new_tokens.value(), "temperature": round(v.temperature.value(), 2),
            "top_k": v.top_k.value(), "top_p": round(v.top_p.value(), 2),
            "repetition_penalty": round(v.repetition_penalty.value(), 2)}


def test_the_generate_tab_takes_the_folders_generation_defaults(window, qtbot, folders, tmp_path):
    sampled = tmp_path / "sampled"
    shutil.copytree(LLAMA, sampled)
    (sampled / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.7, "top_p": 0.9,
        "repetition_penalty": 1.3, "max_new_tokens": 20}))
    panel = window.generate_panel
    v = panel.view
    assert _boxes(v) == DEFAULTS
    _open(qtbot, window, folders, sampled)
    assert _boxes(v) == {"max_new_tokens": 20, "temperature": 0.7, "top_k": 50, "top_p": 0.9,
                         "repetition_penalty": 1.3}

    v.prompt.setPlainText("the cat")
    v.seed.setValue(3)
    qtbot.mouseClick(v.generate_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60) and not v.error.error(), v.error.error()
    want = generate(window.document.module, load_tokenizer(str(sampled)), "the cat", 20, temperature=0.7, top_k=50,
                    top_p=0.9, seed=3, repetition_penalty=1.3)
    assert panel.last_results[0].token_ids == want.token_ids
    assert want.token_ids != generate(window.document.module, load_tokenizer(str(sampled)), "the cat", 20,
                                      temperature=0.7, top_k=50, top_p=0.9, seed=3).token_ids  # the penalty counts

    _open(qtbot, window, folders, LLAMA)  # its generation_config.json names tokens only: greedy
    assert _boxes(v) == DEFAULTS
    bare = tmp_path / "bare"
    shutil.copytree(LLAMA, bare)
    (bare / "generation_config.json").unlink()
    _open(qtbot, window, folders, sampled)
    _open(qtbot, window, folders, bare)
    assert _boxes(v) == DEFAULTS
