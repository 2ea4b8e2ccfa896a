"""What the Training tab says about causal-lm data before a run: the open model's tokenizer folder
(or that it has none), and what a chosen `.txt` / `.jsonl` file holds from its first record: text,
prompt/completion, or conversations (OpenAI messages, ShareGPT, Alpaca) rendered with the chat
template of the tokenizer's folder. Bounded reads, on the GUI thread; the counts (conversations,
assistant tokens learnt, conversations truncated) come from the run once it has read the file."""
from __future__ import annotations

import json
from pathlib import Path

from engine.train.chat_template import ChatTemplateError, read_chat_template
from engine.train.conversations import conversation_file_format

from .core.schema import PretrainedSource, Source

DETECT_BYTES = 1 << 20  # the data note reads at most this much of a .jsonl file (its first record)
FORMAT_NAMES = {"messages": "OpenAI messages", "sharegpt": "ShareGPT", "alpaca": "Alpaca"}


def tokenizer_folder(source: Source | None) -> str:
    """The folder of a model opened from a Hugging Face folder with a tokenizer.json, or the GGUF
    file a model was opened from (its metadata holds the tokenizer); '' else."""
    if isinstance(source, PretrainedSource):
        folder = Path(source.path).expanduser()
        if (folder / "tokenizer.json").is_file() or (folder.suffix.lower() == ".gguf" and folder.is_file()):
            return str(folder)
    return ""


def missing_tokenizer(source: Source | None) -> str:
    """For a model opened from a Hugging Face folder without a tokenizer.json: what to say where
    the tokenizer is chosen ('' for any other model)."""
    if isinstance(source, PretrainedSource) and not tokenizer_folder(source):
        return (f"The model folder {Path(source.path).expanduser()} has no tokenizer.json: choose a tokenizer "
                f"folder (the Hugging Face folder of the model it was made from) to train on text or "
                f"conversations.")
    return ""


def chat_template_note(tokenizer: str) -> str:
    """Whether the tokenizer folder has a chat template, for a conversation file."""
    if not str(tokenizer or "").strip():
        return "choose a tokenizer folder with a chat template"
    folder = Path(tokenizer).expanduser()
    folder = folder.parent if folder.is_file() and folder.suffix.lower() != ".gguf" else folder  # a GGUF holds its own
    try:
        template = read_chat_template(folder)
    except (ChatTemplateError, OSError) as e:
        return (f"but the tokenizer folder {folder} has no usable chat template ({e}): choose the folder of a model "
                f"with one (an instruct model)")
    return f"rendered with the chat template of {Path(template.where).name}"


def describe_text_file(path: str, per_line: bool = True, tokenizer: str = "") -> str:
    """What a causal-lm data file holds, from its first record: text documents, prompt/completion
    records whose loss is on the completions, or conversations whose loss is on the assistant's
    turns (with whether `tokenizer`'s folder has the chat template they need). Problems are not
    reported here: the run names them with the file and the line."""
    p = Path(path).expanduser()
    if not p.is_file():
        return ""
    if p.suffix.lower() == ".txt":
        return ("plain text: one document per non-blank line" if per_line else
                "plain text: the whole file is one document")
    if p.suffix.lower() != ".jsonl":
        return ""
    chat = conversation_file_format(p)
    if chat is not None:
        return (f"jsonl conversations ({FORMAT_NAMES[chat]} format) detected: {chat_template_note(tokenizer)}; the "
                f"loss is on the assistant's turns only. The run counts the conversations and the assistant "
                f"tokens learnt when it reads the file.")
    try:
        with p.open("rb") as f:
            head = f.read(DETECT_BYTES)
        first = next((line for line in head.decode("utf-8", errors="replace").splitlines() if line.strip()), "")
        record = json.loads(first)
    except (OSError, ValueError):
        return "jsonl: the first record could not be read (the run will say where)"
    if not isinstance(record, dict):
        return ""
    if "text" in record:
        return "jsonl with a 'text' field: each record is a document"
    if "prompt" in record and "completion" in record:
        return ("jsonl with 'prompt' and 'completion' fields detected: the loss is on the completions only "
                "(the prompt's tokens are masked)")
    return (f"jsonl: expected a 'text' field, 'prompt' and 'completion', or a conversation ('messages', "
            f"'conversations', or 'instruction' and 'output'); the first record has {sorted(record)}")
