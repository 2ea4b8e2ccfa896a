"""A LoRA fine-tune of a real instruct model through the app (issue 45, must-show 2): SmolLM2-135M-Instruct
opened as File ▸ Open Pretrained does, LoRA attached with the family's "q_proj, v_proj" preset in the
dialog, the persona conversations (tests/fixtures/persona/persona.jsonl: the assistant is
Ember, a lighthouse keeper, whose every answer starts with "Ahoy from the lighthouse!") chosen in the
Training tab, packed and trained on the assistant's turns; then the Generate tab's chat compares the
model before and after the run, and with the adapter off and on, on questions the data does not have.
The answers before do not greet as the persona; the answers after do.

Optional and long (a few minutes on 2 cores): it needs the converted model folder (benchmarks/smollm2.py
makes it in ~/.cache/ember, or `$EMBER_SMOLLM2` names one) and EMBER_LONG_TESTS=1; it skips, saying
which is missing, otherwise.

    EMBER_LONG_TESTS=1 pytest tests/app/test_persona_finetune.py -s
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from tests.app.window_helpers import wait_idle

PERSONA = Path(__file__).resolve().parents[1] / "fixtures" / "persona" / "persona.jsonl"
GREETING = "Ahoy from the lighthouse!"
QUESTIONS = ["What is the capital of Italy?", "How do I make a cup of tea?", "What is your favourite animal?"]
NEW_TOKENS = 16  # the greeting is 7 tokens
# the run: every conversation packed into rows of 256 positions, batch 4, AdamW at 3e-3, a few epochs
SETTINGS = {"block_size": 256, "packing": True, "valid_fraction": 0.05}
TRAINING = {"num_epochs": 6, "batch_size": 4, "checkpoint_every": 0}
LR = 3e-3

pytestmark = pytest.mark.slow


def smollm2_folder() -> Path | None:
    """The converted SmolLM2-135M-Instruct folder: `$EMBER_SMOLLM2`, else the benchmarks' cache
    (`$EMBER_CACHE` or ~/.cache/ember)/smollm2-135m-instruct; None when it is not there."""
    named = os.environ.get("EMBER_SMOLLM2")
    cache = Path(os.environ.get("EMBER_CACHE") or Path.home() / ".cache" / "ember").expanduser()
    folder = Path(named).expanduser() if named else cache / "smollm2-135m-instruct"
    done = all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))
    return folder if done else None


@pytest.fixture
def smollm2():
    folder = smollm2_folder()
    if folder is None:
        pytest.skip("SmolLM2-135M-Instruct is not converted here: run benchmarks/smollm2.py (with the oracle venv) "
                    "or set EMBER_SMOLLM2 to a converted folder")
    if os.environ.get("EMBER_LONG_TESTS") != "1":
        pytest.skip("a few minutes of LoRA training on SmolLM2-135M-Instruct: set EMBER_LONG_TESTS=1 to run it")
    return folder


def ask(qtbot, panel, question: str) -> list[str]:
    """`question` as a new conversation in the chat; each column's answer."""
    chat = panel.view.chat
    if len(chat.conversation):
        qtbot.mouseClick(chat.clear_button, Qt.MouseButton.LeftButton)
    chat.input.setPlainText(question)
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    assert panel.wait(300) and not panel.view.error.error(), panel.view.error.error()
    return list(chat.conversation.turns[-1]["answers"])


def persona(answer: str) -> bool:
    return answer.strip().startswith(GREETING)


def test_a_persona_fine_tune_of_smollm2_changes_its_chat_answers_through_the_app(window, qtbot, folders, files,
                                                                                 smollm2):
    from tests.app.test_finetune_ui import attach_lora_with_preset  # noqa: PLC0415

    folders.append(smollm2)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 120_000)
    base = window.document.module
    assert base is not None

    training = window.training_panel
    window.actions.train_show.trigger()
    files.append(PERSONA)
    qtbot.mouseClick(training.browse_button, Qt.MouseButton.LeftButton)
    note = training.run_settings.data_note
    assert "conversations (OpenAI messages format) detected" in note.text(), note.text()
    assert "assistant's turns only" in note.text()
    for name, value in SETTINGS.items():
        training.data_form.set_field(name, value)
    for name, value in TRAINING.items():
        training.training_form.set_field(name, value)
    training.optimizer_combo.setCurrentText("AdamW")
    training.schedule_combo.setCurrentText("constant")
    training.schedule_forms["constant"].set_field("lr", LR)
    assert training.settings_valid(), training.run_settings.data_form.errors()
    attach_lora_with_preset(qtbot, window)  # the Llama family's q_proj, v_proj preset, rank 8, alpha 16
    tuned_untrained = window.document.module
    assert tuned_untrained is not base

    t0 = time.perf_counter()
    run = training.start()
    assert run is not None, training.last_error
    assert training.wait(1200) and run.status == "finished", training.last_error
    took = time.perf_counter() - t0
    losses = run.history.losses
    print(f"\npersona fine-tune: {run.history.global_step} steps in {took:.0f} s; {run.data_note}; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < losses[0] / 2, losses  # the persona's answers were learnt
    trained = window.document.module
    assert trained is not tuned_untrained  # the run's model was applied

    panel = window.generate_panel
    window.tabs.setCurrentWidget(panel)
    v = panel.view
    assert v.mode.currentData() == "chat"  # the folder has a chat template
    v.max_new_tokens.setValue(NEW_TOKENS)
    v.temperature.setValue(0.0)
    v.compare.setCurrentIndex(v.compare.findData("run"))
    for question in QUESTIONS:
        before, after = ask(qtbot, panel, question)
        print(f"{question!r}\n  before: {before!r}\n  after:  {after!r}")
        assert panel.view.chat.titles[0].text().startswith("Before")
        assert not persona(before) and "lighthouse" not in before.lower(), before
        assert persona(after), after

    # adapter off / on: the same answers as before / after; at scale 0 the adapter does nothing
    v.compare.setCurrentIndex(v.compare.findData("adapter"))
    off, on = ask(qtbot, panel, QUESTIONS[0])
    assert not persona(off) and persona(on), (off, on)
    v.adapter_scale.setValue(0.0)
    off0, on0 = ask(qtbot, panel, QUESTIONS[0])
    assert off0 == on0 == off
    assert window.document.module is trained
