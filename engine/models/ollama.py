"""Ollama Modelfiles: `write_modelfile` (`FROM` the GGUF, `ADAPTER` a GGUF LoRA adapter, the chat
`TEMPLATE` and its stop strings).

Ollama runs its own Go templates, not the Jinja chat template a GGUF carries, so the TEMPLATE is
chosen by recognising the Jinja template's format (`ollama_template`) from the markers each writes:

- ChatML (`<|im_start|>` ... `<|im_end|>`: Qwen2, Qwen2.5, Qwen3, SmolLM2);
- Llama 3 (`<|start_header_id|>` ... `<|eot_id|>`);
- Gemma (`<start_of_turn>` ... `<end_of_turn>`, the assistant's role written "model"; a system
  message goes before the first user message, as Gemma 3's template puts it);
- Phi-3 (`<|user|>` / `<|assistant|>` ... `<|end|>`);
- Mistral's `[INST] ... [/INST]` (with or without the spaces inside the brackets, as the template
  writes them; a system message before the last user message, as Mistral's templates put it).

The bos token is not in the TEMPLATE: llama.cpp adds it when the GGUF says so. A template none of
these is not guessed at: the Modelfile says so in a comment, and `template_warning` gives the
sentence the app shows (Ollama then uses the GGUF's own template if it knows it; the user checks).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..store.atomic import atomic_write_text
from .hf_folder import PretrainedError

__all__ = ["FORMATS", "ollama_template", "template_warning", "write_modelfile"]

_CHATML = ('{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}'
           '<|im_start|>assistant\n')
_LLAMA3 = ('{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>'
           '{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n')
_GEMMA = ('{{- $system := "" }}{{- range .Messages }}{{- if eq .Role "system" }}{{- $system = .Content }}'
          '{{- else if eq .Role "assistant" }}<start_of_turn>model\n{{ .Content }}<end_of_turn>\n'
          '{{- else }}<start_of_turn>{{ .Role }}\n{{ if $system }}{{ $system }}\n\n{{ $system = "" }}{{ end }}'
          '{{ .Content }}<end_of_turn>\n{{- end }}{{- end }}<start_of_turn>model\n')
_PHI3 = ('{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}'
         '<|assistant|>\n')


def _mistral(open_: str, close: str) -> str:
    return ('{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}'
            f'{{{{- if eq .Role "user" }}}}{open_}{{{{ if and $last $.System }}}}{{{{ $.System }}}}\n\n{{{{ end }}}}'
            f'{{{{ .Content }}}}{close}{{{{- else if eq .Role "assistant" }}}}{{{{ .Content }}}}</s>'
            '{{- end }}{{- end }}')


# name, the markers that must all be in the Jinja template, the stop strings
FORMATS = (
    ("ChatML", ("<|im_start|>", "<|im_end|>"), ("<|im_start|>", "<|im_end|>")),
    ("Llama 3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
     ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ("Gemma", ("<start_of_turn>", "<end_of_turn>"), ("<start_of_turn>", "<end_of_turn>")),
    ("Phi-3", ("<|user|>", "<|assistant|>", "<|end|>"), ("<|end|>", "<|user|>", "<|assistant|>")),
    ("Mistral [INST]", ("[INST]", "[/INST]"), ("[INST]", "[/INST]")),
)
_GO = {"ChatML": _CHATML, "Llama 3": _LLAMA3, "Gemma": _GEMMA, "Phi-3": _PHI3}


def _format(chat_template) -> tuple | None:
    if not isinstance(chat_template, str):
        return None
    return next((f for f in FORMATS if all(m in chat_template for m in f[1])), None)


def ollama_template(chat_template: str | None) -> tuple[str, list[str]] | None:
    """(an Ollama TEMPLATE, its stop strings) for a Jinja chat template of a known format (see this
    file's doc); None for another or none."""
    found = _format(chat_template)
    if found is None:
        return None
    name, _, stops = found
    if name == "Mistral [INST]":
        go = _mistral("[INST] " if "[INST] " in chat_template else "[INST]",
                      " [/INST]" if " [/INST]" in chat_template else "[/INST]")
    else:
        go = _GO[name]
    return go, list(stops)


def template_warning(chat_template: str | None) -> str:
    """Why the Modelfile has no TEMPLATE ('' when it has one): the sentence to show the user."""
    if _format(chat_template) is not None:
        return ""
    known = ", ".join(f[0] for f in FORMATS)
    what = "the model has no chat template" if not isinstance(chat_template, str) else \
        f"the model's chat template is not one Ember writes an Ollama TEMPLATE for ({known})"
    return (f"{what}: the Modelfile has no TEMPLATE, so Ollama uses the GGUF's own chat template only if it "
            f"recognises it; check its answers, and write a TEMPLATE if they run on or mix up the turns")


def write_modelfile(path, base, adapter=None, chat_template: str | None = None) -> Path:
    """An Ollama Modelfile at `path`: `FROM base`, `ADAPTER adapter` when given, the TEMPLATE and its
    stops (see `ollama_template`), or a comment saying why there is none. Written atomically;
    returns the path."""
    def quoted(p) -> str:
        text = str(Path(os.fspath(p)).resolve())
        return f'"{text}"' if any(c.isspace() for c in text) else text
    lines = [f"FROM {quoted(base)}"]
    if adapter is not None:
        lines.append(f"ADAPTER {quoted(adapter)}")
    template = ollama_template(chat_template)
    if template is not None:
        go, stops = template
        lines.append(f"# TEMPLATE: the {_format(chat_template)[0]} chat format, recognised from the model's chat "
                     f"template")
        lines.append(f'TEMPLATE """{go}"""')
        lines += [f'PARAMETER stop "{s}"' for s in stops]
    else:
        lines.append(f"# no TEMPLATE: {template_warning(chat_template)}")
    target = Path(os.fspath(path))
    try:
        atomic_write_text(target, "\n".join(lines) + "\n", error=PretrainedError)
    except OSError as exc:
        raise PretrainedError(f"cannot write the Modelfile: {exc.strerror or exc}", where=str(target)) from None
    return target
