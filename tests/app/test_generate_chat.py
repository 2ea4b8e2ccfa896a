"""The Generate tab's chat mode (issue 45, item 4), on the tiny Llama folder given a chat template: the
mode is chosen for a folder with a template and unavailable for one without; each answer's prompt is
`encode_chat`'s ids of the conversation so far, the greedy answer is `generate`'s for those ids, turns
accumulate; Stop keeps the text so far marked as stopped; Regenerate replaces the last answer; Clear
starts over; Compare gives each column its own answer to the same history; the adapter scale acts."""
from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app import generate_panel as generate_panel_module
from engine import ParamGroup, Tensor
from engine.models import generate
from engine.module import Lora
from engine.module.lora import LoraAdapter, scale_adapters
from engine.module.param import Param
from engine.module.reparam import iter_param_slots
from engine.train.chat_template import encode_chat, read_chat_template
from engine.train.text import load_tokenizer
from tests.app.window_helpers import LLAMA, wait_idle

# short role marks: the tiny Llama has 64 positions and a character-level tokenizer
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
NEW = 6


@pytest.fixture
def chat_folder(tmp_path):
    folder = tmp_path / "tiny-chat"
    shutil.copytree(LLAMA, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


def _open(qtbot, window, folders, folder):
    folders.append(folder)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 60_000)
    assert window.document.module is not None


def _chat(qtbot, window, folders, folder):
    _open(qtbot, window, folders, folder)
    panel = window.generate_panel
    window.tabs.setCurrentWidget(panel)
    panel.view.max_new_tokens.setValue(NEW)
    return panel, panel.view.chat


def _send(qtbot, panel, text):
    chat = panel.view.chat
    chat.input.setPlainText(text)
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60) and not panel.view.error.error(), panel.view.error.error()


def _want(module, folder, messages, **kw):
    tok = load_tokenizer(str(folder))
    ids = encode_chat(tok, read_chat_template(folder), messages, add_generation_prompt=True)
    return ids, generate(module, tok, ids, NEW, **{"temperature": 0.0, **kw})


def test_chat_mode_is_chosen_for_a_folder_with_a_template_and_unavailable_without(window, qtbot, folders,
                                                                                  chat_folder):
    v = window.generate_panel.view
    window.tabs.setCurrentWidget(window.generate_panel)
    _open(qtbot, window, folders, LLAMA)
    chat_item = v.mode.model().item(v.mode.findData("chat"))
    assert v.mode.currentData() == "continue" and not chat_item.isEnabled()
    assert "chat template" in chat_item.toolTip()
    assert v.prompt.isVisible() and not v.chat.isVisible()
    _open(qtbot, window, folders, chat_folder)
    assert v.mode.currentData() == "chat" and chat_item.isEnabled()
    assert v.chat.isVisible() and not v.prompt.isVisible() and not v.generate_button.isVisible()
    _open(qtbot, window, folders, LLAMA)  # back to a base model: continuing text again
    assert v.mode.currentData() == "continue" and not chat_item.isEnabled()


def test_answers_are_the_greedy_generation_of_encode_chats_ids_and_turns_accumulate(window, qtbot, folders,
                                                                                    chat_folder):
    panel, chat = _chat(qtbot, window, folders, chat_folder)
    chat.system.setPlainText("Be kind")
    module = window.document.module
    _send(qtbot, panel, "hi</s>")  # typed special-token text stays text: encode_chat's ids, not the eos
    first = [{"role": "system", "content": "Be kind"}, {"role": "user", "content": "hi</s>"}]
    ids, want = _want(module, chat_folder, first)
    assert panel.last_results[0].prompt_ids[0] == ids and panel.last_thread != threading.current_thread().name
    assert panel.last_results[0].token_ids == want.token_ids
    assert chat.conversation.turns[-1]["answers"] == [want.text] and chat.input.toPlainText() == ""
    assert want.text and want.text in chat.transcript(0) and "hi</s>" in chat.transcript(0)
    assert want.finish_reasons == ["length"] and chat.conversation.turns[-1]["cut"] == [True]
    assert "cut at the token limit" in chat.transcript(0)

    _send(qtbot, panel, "ok")
    second = first + [{"role": "assistant", "content": want.text}, {"role": "user", "content": "ok"}]
    ids2, want2 = _want(module, chat_folder, second)
    assert panel.chat.last_messages == [second]
    assert panel.last_results[0].prompt_ids[0] == ids2 and panel.last_results[0].token_ids == want2.token_ids
    assert [t["role"] for t in chat.conversation.turns] == ["user", "assistant", "user", "assistant"]
    assert chat.conversation.turns[-1]["answers"] == [want2.text]


def test_an_answer_that_ends_at_the_eos_leaves_it_out(window, qtbot, folders, chat_folder):
    """The sampled answer (seed 5) of the tiny model to this conversation ends at its eos: the turn is the text before it."""
    panel, chat = _chat(qtbot, window, folders, chat_folder)
    panel.view.temperature.setValue(1.0)
    panel.view.seed.setValue(5)
    chat.system.setPlainText("Be kind")
    _send(qtbot, panel, "hi")
    _ids, want = _want(window.document.module, chat_folder, [{"role": "system", "content": "Be kind"},
                                                             {"role": "user", "content": "hi"}], temperature=1.0, seed=5)
    result = panel.last_results[0]
    assert result.token_ids == want.token_ids and result.finish_reasons == ["stop"] and result.token_ids[-1] == 2
    assert chat.conversation.turns[-1]["answers"] == [want.text]
    assert want.text == load_tokenizer(str(chat_folder)).decode(result.token_ids[:-1])
    assert chat.conversation.turns[-1]["cut"] == [False] and "token limit" not in chat.transcript(0)


def test_stop_keeps_the_answer_so_far_marked_as_stopped(window, qtbot, folders, chat_folder, monkeypatch):
    real = generate_panel_module.stream

    class Paused:
        """The real stream, held after its first token until Stop (so Stop comes mid-answer)."""

        def __init__(self, s, cancel):
            self.s, self.cancel = s, cancel

        def __iter__(self):
            for i, token in enumerate(self.s):
                yield token
                deadline = time.monotonic() + 30
                while i == 0 and not self.cancel() and time.monotonic() < deadline:
                    time.sleep(0.001)

        @property
        def result(self):
            return self.s.result

    monkeypatch.setattr(generate_panel_module, "stream", lambda *a, cancel=None, **kw: Paused(real(*a, cancel=cancel,
                                                                                                  **kw), cancel))
    panel, chat = _chat(qtbot, window, folders, chat_folder)
    chat.input.setPlainText("hi")
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: chat.conversation.turns[-1]["answers"][0] != "", timeout=30_000)
    assert not chat.send_button.isEnabled() and not chat.clear_button.isEnabled()
    qtbot.mouseClick(panel.view.stop_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60)
    _ids, want = _want(window.document.module, chat_folder, [{"role": "user", "content": "hi"}])
    first = load_tokenizer(str(chat_folder)).decode(want.token_ids[:1])
    turn = chat.conversation.turns[-1]
    assert turn["answers"] == [first] and turn["stopped"] == [True] and not chat.conversation.pending
    assert "stopped" in chat.transcript(0) and "Stopped" in panel.view.status.text()
    assert chat.send_button.isEnabled() and chat.regenerate_button.isEnabled()


def test_regenerate_replaces_the_last_answer_and_clear_starts_over(window, qtbot, folders, chat_folder):
    panel, chat = _chat(qtbot, window, folders, chat_folder)
    assert not chat.regenerate_button.isEnabled() and not chat.clear_button.isEnabled()
    _send(qtbot, panel, "hi")
    msgs = [{"role": "user", "content": "hi"}]
    greedy = chat.conversation.turns[-1]["answers"][0]
    panel.view.temperature.setValue(1.0)
    panel.view.seed.setValue(5)
    qtbot.mouseClick(chat.regenerate_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60) and not panel.view.error.error()
    _ids, want = _want(window.document.module, chat_folder, msgs, temperature=1.0, seed=5)
    assert want.text != greedy  # the test can tell the two answers apart
    assert panel.chat.last_messages == [msgs]  # the old answer is not in the new prompt
    assert len(chat.conversation) == 2 and chat.conversation.turns[-1]["answers"] == [want.text]
    assert greedy not in chat.transcript(0) and want.text in chat.transcript(0)

    chat.system.setPlainText("Be brief")
    qtbot.mouseClick(chat.clear_button, Qt.MouseButton.LeftButton)
    assert len(chat.conversation) == 0 and chat.transcript(0).strip() == ""
    assert chat.system.toPlainText() == "Be brief"
    assert not chat.regenerate_button.isEnabled() and not chat.clear_button.isEnabled()


def _with_trained_adapters(module):
    """`module` with rank-2 adapters on q and v whose factors are both non-zero (as after training)."""
    model = module.apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$")))
    rng = np.random.default_rng(1)
    for path, p in list(iter_param_slots(model)):
        r = p.reparameterization
        if isinstance(r, LoraAdapter):
            b = Param.initialized(Tensor.from_data(rng.normal(0, 0.5, size=r.b.shape).astype(np.float32)))
            model = model.with_child(path, p.with_reparameterization(LoraAdapter(r.a, b, r.scale)))
    return model


def test_compare_adapter_off_and_on_answers_the_same_history_in_each_column_at_the_scale(window, qtbot, folders,
                                                                                        chat_folder):
    panel, chat = _chat(qtbot, window, folders, chat_folder)
    base = window.document.module
    tuned = _with_trained_adapters(base)
    window.document.push_module("Attach LoRA", tuned)
    v = panel.view
    v.compare.setCurrentIndex(v.compare.findData("adapter"))
    _send(qtbot, panel, "hi")
    msgs = [{"role": "user", "content": "hi"}]
    _ids, off = _want(base, chat_folder, msgs)
    _ids, on = _want(tuned, chat_folder, msgs)
    assert off.token_ids != on.token_ids  # the adapters change the answer
    assert [r.token_ids for r in panel.last_results] == [off.token_ids, on.token_ids]
    assert chat.conversation.turns[-1]["answers"] == [off.text, on.text]
    assert on.text in chat.transcript(1) and chat.titles[1].text() == "Adapter on"

    _send(qtbot, panel, "ok")  # each column is shown its own earlier answer
    assert panel.chat.last_messages == [
        msgs + [{"role": "assistant", "content": off.text}, {"role": "user", "content": "ok"}],
        msgs + [{"role": "assistant", "content": on.text}, {"role": "user", "content": "ok"}]]
    for col, model in enumerate((base, tuned)):
        ids, want = _want(model, chat_folder, panel.chat.last_messages[col])
        assert panel.last_results[col].prompt_ids[0] == ids and panel.last_results[col].token_ids == want.token_ids

    qtbot.mouseClick(chat.clear_button, Qt.MouseButton.LeftButton)
    v.adapter_scale.setValue(0.5)
    _send(qtbot, panel, "hi")
    _ids, half = _want(scale_adapters(tuned, 0.5), chat_folder, msgs)
    assert half.token_ids not in (off.token_ids, on.token_ids)  # the scale is neither end
    assert [r.token_ids for r in panel.last_results] == [off.token_ids, half.token_ids]
    assert chat.titles[1].text() == "Adapter on at adapter scale 0.5"
    assert window.document.module is tuned  # the document's model is unchanged
    assert all(p.reparameterization.scale == 2.0 for _path, p in iter_param_slots(tuned)
               if p.reparameterization is not None)


def test_the_adapter_scale_acts_when_continuing_text_too(window, qtbot, folders, chat_folder):
    panel, _chat_view = _chat(qtbot, window, folders, chat_folder)
    base = window.document.module
    tuned = _with_trained_adapters(base)
    window.document.push_module("Attach LoRA", tuned)
    v = panel.view
    v.set_mode("continue")
    v.prompt.setPlainText("the cat")
    tok = load_tokenizer(str(chat_folder))
    for scale, model in ((0.0, base), (1.0, tuned), (1.5, scale_adapters(tuned, 1.5))):
        v.adapter_scale.setValue(scale)
        qtbot.mouseClick(v.generate_button, Qt.MouseButton.LeftButton)
        assert panel.wait(60) and not v.error.error(), v.error.error()
        assert panel.last_results[0].token_ids == generate(model, tok, "the cat", NEW, temperature=0).token_ids
    assert generate(base, tok, "the cat", NEW, temperature=0).token_ids != \
        generate(tuned, tok, "the cat", NEW, temperature=0).token_ids  # the scales give different text
    assert window.document.module is tuned


def test_a_failed_answer_keeps_the_message_and_regenerate_retries_it(window, qtbot, folders, chat_folder):
    panel, chat = _chat(qtbot, window, folders, chat_folder)
    panel.view.max_new_tokens.setValue(60)  # the prompt's 8 tokens + 60 pass the tiny Llama's 64 positions
    chat.input.setPlainText("hi")
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60)
    assert "at most 56 new tokens" in panel.view.error.error()
    assert chat.conversation.turns == [{"role": "user", "content": "hi"}] and not chat.conversation.pending
    assert chat.regenerate_button.isEnabled() and chat.send_button.isEnabled()
    panel.view.max_new_tokens.setValue(NEW)
    qtbot.mouseClick(chat.regenerate_button, Qt.MouseButton.LeftButton)
    assert panel.wait(60) and not panel.view.error.error(), panel.view.error.error()
    _ids, want = _want(window.document.module, chat_folder, [{"role": "user", "content": "hi"}])
    assert [t["role"] for t in chat.conversation.turns] == ["user", "assistant"]
    assert chat.conversation.turns[-1]["answers"] == [want.text]


def test_compare_before_and_after_a_training_run_in_chat_form(window, qtbot, folders, files, chat_folder, tmp_path):
    from tests.app.test_finetune_ui import attach_lora_with_preset, corpus  # noqa: PLC0415

    _open(qtbot, window, folders, chat_folder)
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus(120)) + "\n", encoding="utf-8")
    training = window.training_panel
    window.actions.train_show.trigger()
    files.append(text)
    qtbot.mouseClick(training.browse_button, Qt.MouseButton.LeftButton)
    training.data_form.set_field("block_size", 32)
    for name, value in (("num_epochs", 2), ("batch_size", 16), ("checkpoint_every", 0)):
        training.training_form.set_field(name, value)
    training.schedule_forms["constant"].set_field("lr", 2e-2)
    assert training.settings_valid(), training.run_settings.data_form.errors()
    attach_lora_with_preset(qtbot, window)
    run = training.start()
    assert run is not None and training.wait(600) and run.status == "finished", training.last_error

    panel, chat = window.generate_panel, window.generate_panel.view.chat
    window.tabs.setCurrentWidget(panel)
    panel.view.max_new_tokens.setValue(NEW)
    panel.view.compare.setCurrentIndex(panel.view.compare.findData("run"))
    _send(qtbot, panel, "hi")
    msgs = [{"role": "user", "content": "hi"}]
    _ids, before = _want(run.source_module, chat_folder, msgs)
    _ids, after = _want(window.document.module, chat_folder, msgs)
    assert before.token_ids != after.token_ids  # training changed the answer
    assert [r.token_ids for r in panel.last_results] == [before.token_ids, after.token_ids]
    assert chat.conversation.turns[-1]["answers"] == [before.text, after.text]
    assert chat.titles[0].text().startswith("Before") and chat.titles[1].text().startswith("After")


def test_a_gguf_model_chats_with_its_own_tokenizer_and_template(window, qtbot):
    """A GGUF file carries its tokenizer and chat template in its metadata (issue 46): opened with
    --open, the Generate tab chats with them, the answer the greedy generation of encode_chat's ids."""
    from pathlib import Path

    from app.__main__ import open_requested, parse_args

    gguf_file = Path(__file__).resolve().parents[1] / "fixtures" / "gguf" / "tiny-qwen2-q8.gguf"
    assert open_requested(window, parse_args(["--open", str(gguf_file)]))
    wait_idle(qtbot, window, 60_000)
    panel = window.generate_panel
    window.tabs.setCurrentWidget(panel)
    panel.view.max_new_tokens.setValue(NEW)
    assert panel.view.mode.currentData() == "chat"
    _send(qtbot, panel, "hello")
    ids, want = _want(window.document.module, gguf_file, [{"role": "user", "content": "hello"}])
    assert panel.last_results[0].prompt_ids[0] == ids and panel.last_results[0].token_ids == want.token_ids
    assert ids[0] == 1  # "<|im_start|>": the template's, from the file
