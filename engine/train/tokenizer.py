"""A model folder's tokenizer: its `tokenizer.json` through the `tokenizers` library, with the
folder's special-token ids (`load_tokenizer`, `TextTokenizer`).

The special tokens are those `tokenizer_config.json` names (or `special_tokens_map.json`; ids in
`config.json` as a last resort): `pad_id`, `eos_id`, `bos_id`, `unk_id` (None when a folder names
none). A tokenizer.json is read only when the memory its structures take
(~`TOKENIZER_BYTES_PER_FILE_BYTE` bytes a byte of the file) is available (`TokenizerTooLarge`, a
`TokenizerError` and a `NotEnoughMemory`), as the library would abort the process where it is
not. A tokenizer the library cannot read, or a failure of the library while it encodes, is a
`TokenizerError`: a Rust panic included (`pyo3_runtime.PanicException`, a BaseException). Text
data made with it: `engine/train/text.py`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..module import memory
from .data_files import DataFileError

__all__ = ["TextTokenizer", "TokenizerError", "TokenizerTooLarge", "load_tokenizer"]

MAX_TOKENIZER_BYTES = 512 * 2 ** 20  # a tokenizer.json larger than this is refused before reading
MAX_CONFIG_BYTES = 16 * 2 ** 20  # tokenizer_config.json / special_tokens_map.json / config.json
# Kept free for the tokenizer while it encodes a chunk (its encodings, its threads' malloc
# arenas): a Rust allocation that fails aborts the process, so the check stops short of it
TOKENIZER_WORKING_BYTES = 64 * 2 ** 20
# The library's structures per byte of a tokenizer.json it reads (measured: 9.3-11.5 for
# vocabularies of 1-3 M tokens)
TOKENIZER_BYTES_PER_FILE_BYTE = 14
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads makes a lone "\\ud800" a str no encoder takes


class TokenizerError(DataFileError):
    """A tokenizer folder cannot be used; the message names the file and what is wrong."""


class TokenizerTooLarge(TokenizerError, memory.NotEnoughMemory):
    """Reading a tokenizer.json would need more memory than the machine has: says how much."""


def _is_panic(e: BaseException) -> bool:
    """The tokenizers library's `pyo3_runtime.PanicException` (a Rust panic: a BaseException)."""
    return type(e).__name__ == "PanicException"


def _library_message(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return first or type(e).__name__


@dataclass
class TextTokenizer:
    """A `tokenizers.Tokenizer` with the folder's special-token ids."""

    tokenizer: object  # tokenizers.Tokenizer
    path: str  # the tokenizer.json it was read from
    pad_id: int | None = None
    eos_id: int | None = None
    bos_id: int | None = None
    unk_id: int | None = None
    model_max_length: int | None = None

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce: 0 .. vocab_size - 1 (added tokens included)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def _call(self, what: str, method, *args, **kwargs):
        """A call into the library; its failures, a Rust panic included (a catastrophic regex of a
        pre-tokenizer ends in Oniguruma's retry limit and a `PanicException`), are TokenizerErrors."""
        try:
            return method(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the library's own message says what failed
            raise TokenizerError(self.path, f"the tokenizers library failed {what}: {_library_message(e)}") from None
        except BaseException as e:
            if not _is_panic(e):
                raise
            raise TokenizerError(self.path, f"the tokenizers library failed {what} (a panic in the library: "
                                            f"{_library_message(e)})") from None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._call("encoding text", self.tokenizer.encode, text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts, add_special_tokens: bool = True) -> list[list[int]]:
        return [list(ids) for ids in self.encode_ids(list(texts), add_special_tokens, "encoding text")]

    def encode_ids(self, texts: list[str], add_special_tokens: bool, what: str) -> list[list[int]]:
        """Each text's ids, without the offsets and tokens of a full encoding (less memory)."""
        method = getattr(self.tokenizer, "encode_batch_fast", None) or self.tokenizer.encode_batch
        return [e.ids for e in self._call(what, method, texts, add_special_tokens=add_special_tokens)]

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[str]:
        return list(self._call("encoding text", self.tokenizer.encode, text,
                               add_special_tokens=add_special_tokens).tokens)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._call("decoding ids", self.tokenizer.decode, [int(i) for i in ids],
                          skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str | None:
        return self.tokenizer.id_to_token(int(i))

    def __repr__(self) -> str:
        return (f"TextTokenizer({self.path!r}, {self.vocab_size} tokens, pad {self.pad_id}, bos {self.bos_id}, "
                f"eos {self.eos_id}, unk {self.unk_id})")


def _read_json_file(path: Path, limit: int, error=TokenizerError):
    size = path.stat().st_size
    if size > limit:
        raise error(path, f"expected a JSON file of at most {limit} bytes, found {size} bytes")
    try:
        return _json_value(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise error(path, f"expected UTF-8 JSON, found undecodable bytes at offset {e.start}") from None
    except json.JSONDecodeError as e:
        raise error(path, f"expected JSON, found invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except ValueError as e:
        raise error(path, f"expected JSON, found {e}") from None


def _json_value(text: str):
    """`json.loads`, where what Python refuses besides bad syntax is a ValueError that says what
    was found: nesting deeper than the recursion limit (a RecursionError), an integer of more
    digits than `sys.get_int_max_str_digits()` allows (a plain ValueError)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ValueError("JSON nested deeper than Python's recursion limit allows") from None
    except ValueError as e:
        if "digits" in str(e):
            raise ValueError(f"an integer of more digits than Python converts ({_library_message(e)})") from None
        raise


def _token_text(value):
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict (not
    a lone surrogate escape such as "\\ud800", which is no text)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value and not _SURROGATE.search(value) else None


def tokenizer_memory(action: str, size: int, working: bool) -> memory.MemoryEstimate:
    """What making a tokenizer from `size` characters of tokenizer.json text allocates: the text,
    the library's structures and, with `working`, the tokenizer's working memory."""
    parts = {"its text": 2 * size, "the library's vocabulary and merges": TOKENIZER_BYTES_PER_FILE_BYTE * size}
    if working:
        parts["the tokenizer's working memory"] = TOKENIZER_WORKING_BYTES
    return memory.MemoryEstimate(action, parts)


def load_tokenizer(folder) -> TextTokenizer:
    """The tokenizer of a model folder (or a `tokenizer.json` path, or a GGUF file: its metadata's,
    `engine.train.gguf_tokenizer`), through `tokenizers`."""
    from tokenizers import Tokenizer

    p = Path(folder).expanduser()
    if p.suffix.lower() == ".gguf" and p.is_file():
        from .gguf_tokenizer import load_gguf_tokenizer  # noqa: PLC0415 - it builds on this module

        return load_gguf_tokenizer(p)
    path = p if p.is_file() else p / "tokenizer.json"
    folder = path.parent
    if not path.is_file():
        found = sorted(q.name for q in folder.iterdir())[:20] if folder.is_dir() else []
        raise TokenizerError(path, "expected a tokenizer.json (the `tokenizers` library's format), found none"
                             + (f"; the folder holds {found}" if folder.is_dir() else ""))
    size = path.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise TokenizerError(path, f"expected a tokenizer of at most {MAX_TOKENIZER_BYTES} bytes, found {size} bytes")
    refusal = tokenizer_memory(f"reading {path.name}", size, working=True).refusal(memory.available_memory())
    if refusal:  # the library aborts the process when an allocation fails
        raise TokenizerTooLarge(path, f"{refusal}: use a machine with more memory")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(path, f"expected UTF-8 JSON, found undecodable bytes at offset {e.start}") from None
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the library's own message says what it could not read
        raise TokenizerError(path, f"the tokenizers library cannot read it: {_library_message(e)}") from None
    except BaseException as e:
        if not _is_panic(e):
            raise
        raise TokenizerError(path, f"the tokenizers library cannot read it (a panic in the library: "
                                   f"{_library_message(e)})") from None

    special: dict[str, object] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        f = folder / name
        if f.is_file():
            data = _read_json_file(f, MAX_CONFIG_BYTES)
            if not isinstance(data, dict):
                raise TokenizerError(f, f"expected a JSON object, found {type(data).__name__}")
            for key in ("pad_token", "eos_token", "bos_token", "unk_token", "model_max_length"):
                if data.get(key) is not None:
                    special[key] = (data[key], f)
    ids: dict[str, int | None] = {}
    for key in ("pad", "eos", "bos", "unk"):
        entry = special.get(f"{key}_token")
        if entry is None:
            ids[key] = None
            continue
        value, source = entry
        token = _token_text(value)
        if token is None:
            raise TokenizerError(source, f"{key}_token: expected a token string, found {value!r}")
        i = tok.token_to_id(token)
        if i is None:
            raise TokenizerError(source, f"{key}_token: expected a token of {path.name}'s vocabulary, found "
                                         f"{token!r}, which it does not have")
        ids[key] = int(i)
    config = folder / "config.json"  # the model's ids, for a folder whose tokenizer files name none
    if any(v is None for v in ids.values()) and config.is_file():
        try:
            data = _read_json_file(config, MAX_CONFIG_BYTES)
        except TokenizerError:
            data = None
        if isinstance(data, dict):
            for key in ids:
                v = data.get(f"{key}_token_id")
                if ids[key] is None and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < tok.get_vocab_size(True):
                    ids[key] = v
    max_len = None
    if "model_max_length" in special:
        v = special["model_max_length"][0]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 10 ** 12:
            max_len = int(v)
    return TextTokenizer(tok, str(path), ids["pad"], ids["eos"], ids["bos"], ids["unk"], max_len)
