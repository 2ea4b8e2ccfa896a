"""The Ollama Modelfile's TEMPLATE (engine/models/ollama.py): the chat format recognised from the real
chat templates of the families Ember runs (tests/fixtures/chat_templates), the Go template's turns
and generation prompt as the Jinja template renders them, and an unknown format left without a
TEMPLATE, saying so in the file and in the warning."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.models.ollama import ollama_template, template_warning, write_modelfile
from engine.train.chat_template import ChatTemplate

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
USER = [{"role": "user", "content": "hi there"}]


def _jinja(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _render(name: str, messages, prompt: bool) -> str:
    return ChatTemplate(_jinja(name), SPECIAL, where=name).render(messages, add_generation_prompt=prompt).text


def _turn(go: str, role: str, content: str) -> str:
    """The body of a simple Go template's `range .Messages` for one message."""
    body = go.split("{{- range .Messages }}", 1)[1].rsplit("end }}", 1)[0].rsplit("{{", 1)[0]
    return body.replace("{{ .Role }}", role).replace("{{ .Content }}", content)


@pytest.mark.parametrize("name, fmt, prompt", [
    ("smollm2-instruct", "ChatML", "<|im_start|>assistant\n"),
    ("qwen2.5-instruct", "ChatML", "<|im_start|>assistant\n"),
    ("qwen3-0.6b", "ChatML", "<|im_start|>assistant\n"),
    ("llama-3.2-instruct", "Llama 3", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("phi-3.5-mini-instruct", "Phi-3", "<|assistant|>\n"),
    ("gemma-2-it", "Gemma", "<start_of_turn>model\n"),
])
def test_each_family_s_format_is_recognised_with_its_turns_and_generation_prompt(tmp_path, name, fmt, prompt):
    go, stops = ollama_template(_jinja(name))
    assert go.endswith(prompt)
    rendered = _render(name, USER, True)
    assert rendered.endswith(prompt)  # the Go template's generation prompt is the Jinja one
    conversation = _render(name, USER + [{"role": "assistant", "content": "ok"}], False)
    assert all(s in conversation for s in stops[:2])  # the turn markers Ollama stops at are the template's
    if fmt != "Gemma":
        assert _turn(go, "user", "hi there") in rendered
    else:  # the assistant's role is written "model"; a system message opens the first user turn
        assert "<start_of_turn>user\nhi there<end_of_turn>\n" in rendered
        assert "<start_of_turn>model\n{{ .Content }}<end_of_turn>\n" in go and "{{ $system }}\n\n" in go
    text = write_modelfile(tmp_path / "M", tmp_path / "m.gguf", None, _jinja(name)).read_text()
    assert f"# TEMPLATE: the {fmt} chat format" in text and f'TEMPLATE """{go}"""' in text
    assert [line for line in text.splitlines() if line.startswith("PARAMETER stop")] == \
        [f'PARAMETER stop "{s}"' for s in stops]
    assert template_warning(_jinja(name)) == ""


def test_mistral_s_inst_keeps_the_template_s_spacing():
    nemo = _render("mistral-nemo-instruct-2407", USER, True)
    go, stops = ollama_template(_jinja("mistral-nemo-instruct-2407"))
    assert "[INST]hi there[/INST]" in nemo and "[INST]{{" in go and "}}[/INST]" in go
    assert stops == ["[INST]", "[/INST]"]
    v01 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}"
           "{% endif %}{% endfor %}")
    go01, _ = ollama_template(v01)
    assert "[INST] {{" in go01 and "}} [/INST]" in go01
    assert ChatTemplate(v01, SPECIAL).render(USER).text == "<s>[INST] hi there [/INST]"


@pytest.mark.parametrize("template", [_jinja("zephyr-7b-beta"), "{{ messages }}", None])
def test_an_unknown_format_gets_no_template_a_comment_and_a_warning(tmp_path, template):
    assert ollama_template(template) is None
    why = template_warning(template)
    assert ("no chat template" if template is None else "not one Ember writes an Ollama TEMPLATE for") in why
    text = write_modelfile(tmp_path / "M", tmp_path / "m.gguf", None, template).read_text()
    assert not any(line.startswith(("TEMPLATE", "PARAMETER")) for line in text.splitlines())
    assert f"# no TEMPLATE: {why}" in text
