"""Conversation data: `.jsonl` records of a chat, read into messages of `role` and `content`.

Three formats, detected from a record's keys as `text` and `prompt` / `completion` records are
(engine.train.text):

- OpenAI style: `{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}`
- ShareGPT: `{"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}` (also
  the roles by their own names: `user`, `assistant`)
- Alpaca: `{"instruction": ..., "input": ..., "output": ...}`: a user turn of the instruction (and
  "\\n\\n" and the input where the input is not empty), then the assistant's turn, the output.

Every record must be of one format (a record with keys of two is refused), each message must have
a known role and text, and an assistant turn must have text to learn: the errors are
`TextDataError`s naming the file and line. Rendering with the model's chat template and the
assistant-only mask are `engine.train.chat_data`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .text import TextDataError, _decode, _json_excerpt, _text_files
from .tokenizer import _SURROGATE, _json_value

__all__ = ["Conversation", "CONVERSATION_FORMATS", "read_conversations", "conversation_format",
           "conversation_file_format"]

DETECT_BYTES = 1 << 20  # conversation_file_format reads at most this much of a file (its first record)

CONVERSATION_FORMATS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
}
ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


@dataclass
class Conversation:
    """One conversation: its messages (`{"role", "content"}`), the file and line it came from."""

    file: str
    line: int
    messages: list[dict]
    format: str


def conversation_format(record: dict) -> str | None:
    """The conversation format a JSON record's keys say ("messages", "sharegpt", "alpaca"), or None."""
    found = [name for name, keys in CONVERSATION_FORMATS.items() if all(k in record for k in keys)]
    return found[0] if len(found) == 1 else (None if not found else "mixed")


def conversation_file_format(path) -> str | None:
    """The conversation format of a `.jsonl` file (or of a folder's first `.jsonl` file) from its
    first record ("messages", "sharegpt", "alpaca"), or None: not a .jsonl file, a first record
    that is not a conversation or cannot be read (reading the whole file says why). Reads at most
    `DETECT_BYTES` (1 MiB)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = next(iter(sorted(q for q in p.iterdir() if q.is_file() and q.suffix.lower() == ".jsonl")), p)
    if not p.is_file() or p.suffix.lower() != ".jsonl":
        return None
    try:
        with p.open("rb") as f:
            head = f.read(DETECT_BYTES)
        first = next((line for line in head.decode("utf-8-sig", errors="replace").split("\n") if line.strip()), "")
        record = _json_value(first)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or "text" in record or ("prompt" in record and "completion" in record):
        return None
    found = conversation_format(record)
    return found if found in CONVERSATION_FORMATS else None


def read_conversations(path) -> list[Conversation]:
    """The conversations of a `.jsonl` file (or of every `.jsonl` file in a folder)."""
    out: list[Conversation] = []
    for f in _text_files(Path(path).expanduser()):
        if f.suffix.lower() != ".jsonl":
            raise TextDataError(f, f"expected a .jsonl file of conversations, found extension {f.suffix!r}")
        text = _decode(f, f.read_bytes())
        for n, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                out.append(_conversation(f, n, _record(f, n, line)))
        if not any(c.file == str(f) for c in out):
            raise TextDataError(f, "expected conversation records, found an empty file")
    return out


def _record(f: Path, n: int, line: str) -> dict:
    try:
        record = _json_value(line)
    except ValueError as e:
        raise TextDataError(f, f"expected a JSON object, found invalid JSON ({getattr(e, 'msg', e)})", line=n) from None
    if not isinstance(record, dict):
        raise TextDataError(f, f"expected a JSON object, found a JSON {type(record).__name__}", line=n)
    return record


def _text(f: Path, n: int, value, what: str) -> str:
    if not isinstance(value, str):
        raise TextDataError(f, f"{what}: expected a string, found {type(value).__name__} {_json_excerpt(value)}",
                            line=n)
    bad = _SURROGATE.search(value)
    if bad is not None:
        raise TextDataError(f, f"{what}: expected text, found the escape \\u{ord(bad.group()):04x} at character "
                               f"{bad.start()}, half of a surrogate pair and no character by itself", line=n)
    return value


def _conversation(f: Path, n: int, record: dict) -> Conversation:
    kind = conversation_format(record)
    if kind is None:
        raise TextDataError(f, f"expected a conversation: a 'messages' list (OpenAI), a 'conversations' list "
                               f"(ShareGPT), or 'instruction' and 'output' fields (Alpaca), found keys "
                               f"{sorted(record)}", line=n)
    if kind == "mixed":
        kinds = [name for name, keys in CONVERSATION_FORMATS.items() if all(k in record for k in keys)]
        raise TextDataError(f, f"expected one conversation format per record, found the keys of {' and '.join(kinds)} "
                               f"({sorted(record)})", line=n)
    if kind == "alpaca":
        instruction = _text(f, n, record["instruction"], "field 'instruction'")
        extra = _text(f, n, record.get("input", ""), "field 'input'")
        user = instruction + "\n\n" + extra if extra else instruction
        messages = [{"role": "user", "content": user},
                    {"role": "assistant", "content": _text(f, n, record["output"], "field 'output'")}]
        if "system" in record:
            messages.insert(0, {"role": "system", "content": _text(f, n, record["system"], "field 'system'")})
    else:
        key = CONVERSATION_FORMATS[kind][0]
        turns = record[key]
        if not isinstance(turns, list) or not turns:
            raise TextDataError(f, f"field {key!r}: expected a non-empty list of turns, found "
                                   f"{_json_excerpt(turns)}", line=n)
        role_key, text_key = ("role", "content") if kind == "messages" else ("from", "value")
        messages = []
        for i, turn in enumerate(turns):
            where = f"{key}[{i}]"
            if not isinstance(turn, dict):
                raise TextDataError(f, f"{where}: expected an object, found {_json_excerpt(turn)}", line=n)
            if role_key not in turn:
                raise TextDataError(f, f"{where}: expected a {role_key!r} key, found keys {sorted(turn)}", line=n)
            if text_key not in turn:
                raise TextDataError(f, f"{where}: expected a {text_key!r} key, found keys {sorted(turn)}", line=n)
            role = turn[role_key]
            known = ROLES if kind == "messages" else tuple(SHAREGPT_ROLES)
            if role not in known:
                raise TextDataError(f, f"{where}: expected a {role_key!r} of {', '.join(known)}, found "
                                       f"{_json_excerpt(role)}", line=n)
            role = role if kind == "messages" else SHAREGPT_ROLES[role]
            messages.append({"role": role, "content": _text(f, n, turn[text_key], f"{where}.{text_key}")})
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and not m["content"].strip():
            raise TextDataError(f, f"turn {i} (assistant): expected text to learn, found "
                                   f"{'an empty string' if not m['content'] else 'only white space'}", line=n)
    return Conversation(str(f), n, messages, kind)
