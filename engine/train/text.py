"""Text data for causal language models: a folder's tokenizer, text files, blocks of token ids.

```python
tok = load_tokenizer("my-llama")                      # tokenizer.json through the `tokenizers` library
data = text_data_for_model(model, "corpus.txt", tok, block_size=64, per_line=True)
data.inputs, data.targets, data.attention_mask      # int64 [rows, 64] each
```

- `load_tokenizer(folder)`: the folder's `tokenizer.json`, read by the `tokenizers` library
  (nothing here splits or merges text itself), with the special tokens named in
  `tokenizer_config.json` (or `special_tokens_map.json`; ids in `config.json` as a last
  resort): `pad_id`, `eos_id`, `bos_id`, `unk_id` (None when a folder names none).
- Documents (`read_documents(path, per_line=False)`): a `.txt` file is one document, or one
  per non-blank line with `per_line=True`; a folder of `.txt` / `.jsonl` files gives each
  file's documents in name order; a `.jsonl` file has one JSON object a line, with a `text`
  field or `prompt` and `completion` fields (the first record decides which; every line
  must then have them).
- Tokens: each document is encoded with the tokenizer's own special tokens (Llama's `<s>`
  in front) and ends with the eos token. A prompt is encoded with them, its completion
  without (appended to the prompt's ids), then eos.
- Blocks (`block_size` = positions per row): with `packing=True` the documents are joined
  into one stream and cut into rows of `block_size + 1` ids that overlap by one, so every
  token after the first is a target exactly once; the last row is padded. With
  `packing=False` each document is one row, right-padded to the block size (by default the
  longest document's length); `attention_mask` is 1 on real input positions, 0 on pads.
  A row with no target to learn (all prompt) is left out.
- The causal shift: a row's inputs are `ids[:-1]`, its targets `ids[1:]`. A target is
  `IGNORE_INDEX` (-100) where nothing is learnt: a pad, and, for prompt/completion data, a
  token of the prompt. `losses.causal_lm_loss` (the `"causal-lm"` kind's loss) averages over
  the other targets only.

Padding is on the right, so under causal attention no real token attends to a pad: the
logits at the real positions are those of the unpadded document, with or without the mask.

Every problem is a `TextDataError` (a `DataFileError`) naming the file, the line where one
applies, what was expected and what was found: an empty file, bytes that are not UTF-8, a
jsonl line that is not JSON or lacks the field, a token id the model has no embedding for
(`vocab_size`: the tokenizer does not match the model), a row longer than the model's
positions (`max_positions`); a tokenizer the library cannot read is a `TokenizerError`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import InMemoryDataset
from .files import DataFileError
from .losses import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX", "Document", "TextDataError", "TextDataset", "TextTokenizer", "TokenizerError",
    "check_fits", "load_text_data", "load_tokenizer", "model_limits", "read_documents", "text_data_for_model",
]

MAX_TOKENIZER_BYTES = 512 * 2 ** 20  # a tokenizer.json larger than this is refused before reading
MAX_CONFIG_BYTES = 16 * 2 ** 20  # tokenizer_config.json / special_tokens_map.json / config.json
TEXT_SUFFIXES = (".txt", ".jsonl")


class TextDataError(DataFileError):
    """A text data file cannot be used; the message names the file, the line, expected vs found."""


class TokenizerError(DataFileError):
    """A tokenizer folder cannot be used; the message names the file and what is wrong."""


# ---------------------------------------------------------------------------------- tokenizer
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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts, add_special_tokens: bool = True) -> list[list[int]]:
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[str]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).tokens)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

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
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise error(path, f"expected UTF-8 JSON, found undecodable bytes at offset {e.start}") from None
    except json.JSONDecodeError as e:
        raise error(path, f"expected JSON, found invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def _token_text(value):
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def load_tokenizer(folder) -> TextTokenizer:
    """The tokenizer of a model folder (or a `tokenizer.json` path), through `tokenizers`."""
    from tokenizers import Tokenizer

    p = Path(folder).expanduser()
    path = p if p.is_file() else p / "tokenizer.json"
    folder = path.parent
    if not path.is_file():
        found = sorted(q.name for q in folder.iterdir())[:20] if folder.is_dir() else []
        raise TokenizerError(path, "expected a tokenizer.json (the `tokenizers` library's format), found none"
                             + (f"; the folder holds {found}" if folder.is_dir() else ""))
    size = path.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise TokenizerError(path, f"expected a tokenizer of at most {MAX_TOKENIZER_BYTES} bytes, found {size} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(path, f"expected UTF-8 JSON, found undecodable bytes at offset {e.start}") from None
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the library's own message says what it could not read
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TokenizerError(path, f"the tokenizers library cannot read it: {first}") from None

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


# ---------------------------------------------------------------------------------- documents
@dataclass
class Document:
    """One document: `text`, or a `prompt` and its `completion`; where it came from."""

    file: str
    line: int | None  # None: the whole file is the document
    text: str | None = None
    prompt: str | None = None
    completion: str | None = None


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TextDataError(path, f"expected UTF-8 text, found the byte 0x{data[e.start]:02x} that is not UTF-8 "
                                  f"at byte offset {e.start}", line=line) from None


def _text_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(q for q in path.iterdir() if q.is_file() and q.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise TextDataError(path, f"expected a folder of {' or '.join(TEXT_SUFFIXES)} files, found none")
        return files
    if not path.is_file():
        raise TextDataError(path, "file not found")
    if path.suffix.lower() not in TEXT_SUFFIXES:
        raise TextDataError(path, f"expected a .txt or .jsonl file, found extension {path.suffix or '(none)'!r}")
    return [path]


def read_documents(path, per_line: bool = False, fields: str = "auto") -> list[Document]:
    """The documents of a `.txt` / `.jsonl` file, or of every such file in a folder.

    `fields` (jsonl): "auto" (the first record decides), "text", or "prompt-completion"."""
    if fields not in ("auto", "text", "prompt-completion"):
        raise ValueError(f"read_documents: fields must be 'auto', 'text' or 'prompt-completion', got {fields!r}")
    docs: list[Document] = []
    for f in _text_files(Path(path).expanduser()):
        raw = f.read_bytes()
        text = _decode(f, raw)
        if not text.strip():
            raise TextDataError(f, "expected text, found an empty file" if not text else
                                   "expected text, found only white space")
        if f.suffix.lower() == ".jsonl":
            docs.extend(_jsonl_documents(f, text, fields))
        elif per_line:
            docs.extend(Document(str(f), n, text=line) for n, line in enumerate(text.splitlines(), start=1)
                        if line.strip())
        else:
            docs.append(Document(str(f), None, text=text))
    return docs


def _jsonl_documents(f: Path, text: str, fields: str) -> list[Document]:
    docs = []
    chosen = None if fields == "auto" else fields
    first_line = None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TextDataError(f, f"expected a JSON object, found invalid JSON ({e.msg} at column {e.colno})",
                                line=n) from None
        if not isinstance(record, dict):
            raise TextDataError(f, f"expected a JSON object, found a JSON {type(record).__name__}", line=n)
        if chosen is None:
            if "text" in record:
                chosen = "text"
            elif "prompt" in record and "completion" in record:
                chosen = "prompt-completion"
            else:
                raise TextDataError(f, f"expected a 'text' field, or 'prompt' and 'completion' fields, found "
                                       f"keys {sorted(record)}", line=n)
            first_line = n
        names = ("text",) if chosen == "text" else ("prompt", "completion")
        as_on = f" (as on line {first_line})" if first_line is not None and first_line != n else ""
        for name in names:
            if name not in record:
                want = "a 'text' field" if chosen == "text" else "'prompt' and 'completion' fields"
                raise TextDataError(f, f"expected {want}{as_on}, found no {name!r} among keys {sorted(record)}",
                                    line=n)
            if not isinstance(record[name], str):
                raise TextDataError(f, f"field {name!r}: expected a string, found "
                                       f"{type(record[name]).__name__} {json.dumps(record[name])[:40]}", line=n)
        if chosen == "text":
            docs.append(Document(str(f), n, text=record["text"]))
        else:
            if not record["completion"]:
                raise TextDataError(f, "field 'completion': expected text to learn, found an empty string", line=n)
            docs.append(Document(str(f), n, prompt=record["prompt"], completion=record["completion"]))
    return docs


# ---------------------------------------------------------------------------------- tokens and blocks
def _where(doc: Document) -> dict:
    return {"path": doc.file, "line": doc.line}


def tokenize_documents(docs, tokenizer: TextTokenizer, vocab_size: int | None = None):
    """Per document: (ids int64, learn bool): learn is False on prompt tokens. Each document
    ends with eos (when the tokenizer has one); ids are checked against `vocab_size`."""
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    texts = [d.text if d.text is not None else d.prompt for d in docs]
    heads = tokenizer.encode_batch(texts, add_special_tokens=True)
    tails_of = [i for i, d in enumerate(docs) if d.text is None]
    tails = dict(zip(tails_of, tokenizer.encode_batch([docs[i].completion for i in tails_of],
                                                       add_special_tokens=False)))
    out = []
    for i, (doc, head) in enumerate(zip(docs, heads)):
        if doc.text is not None:
            ids = np.asarray(head + eos, dtype=np.int64)
            learn = np.ones(len(ids), dtype=bool)
        else:
            tail = tails[i] + eos
            ids = np.asarray(head + tail, dtype=np.int64)
            learn = np.concatenate([np.zeros(len(head), dtype=bool), np.ones(len(tail), dtype=bool)])
        if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
            bad = int(ids[int(np.argmax(ids >= vocab_size))])
            raise TextDataError(
                doc.file, f"the tokenizer {tokenizer.path} gives the token id {bad} "
                          f"({tokenizer.id_to_token(bad)!r}), but the model has {vocab_size} token embeddings "
                          f"(expected ids 0..{vocab_size - 1}): the tokenizer does not match the model",
                line=doc.line)
        out.append((ids, learn))
    return out


def _rows_from(windows, block_size: int, pad_id: int):
    """Shift each (ids, learn) window into a row: inputs ids[:-1], targets ids[1:] (IGNORE_INDEX
    where not learnt); rows right-padded to `block_size`."""
    n = len(windows)
    inputs = np.full((n, block_size), pad_id, dtype=np.int64)
    targets = np.full((n, block_size), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((n, block_size), dtype=np.int64)
    for r, (ids, learn) in enumerate(windows):
        k = len(ids) - 1
        inputs[r, :k] = ids[:-1]
        targets[r, :k] = np.where(learn[1:], ids[1:], IGNORE_INDEX)
        mask[r, :k] = 1
    return inputs, targets, mask


class TextDataset(InMemoryDataset):
    """Rows of token ids: `inputs` and `targets` int64 `[rows, block_size]` (targets shifted by
    one, `IGNORE_INDEX` where nothing is learnt), `attention_mask` (1: a real input position)."""

    def __init__(self, inputs, targets, attention_mask, block_size: int, packing: bool, name: str = "text",
                 documents: int = 0, tokenizer: TextTokenizer | None = None):
        super().__init__(inputs, targets, name)
        self.attention_mask = np.asarray(attention_mask)
        self.block_size = int(block_size)
        self.packing = bool(packing)
        self.documents = int(documents)
        self.tokenizer = tokenizer

    @property
    def target_tokens(self) -> int:
        """How many targets the loss counts (not pads, not prompt tokens)."""
        return int((self.targets != IGNORE_INDEX).sum())

    def split(self, fraction: float, seed: int = 0):
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split: fraction must be between 0 and 1 (exclusive), got {fraction}")
        order = np.random.default_rng(seed).permutation(len(self))
        k = int(round(fraction * len(self)))
        parts = []
        for idx, label in ((order[:k], f"[:{k}]"), (order[k:], f"[{k}:]")):
            parts.append(TextDataset(self.inputs[idx], self.targets[idx], self.attention_mask[idx], self.block_size,
                                     self.packing, self.name + label, self.documents, self.tokenizer))
        return parts[0], parts[1]

    def __repr__(self) -> str:
        how = "packed" if self.packing else "padded"
        return (f"TextDataset({self.name!r}, {len(self)} rows of {self.block_size} tokens, {how}, "
                f"{self.target_tokens} target tokens from {self.documents} documents)")


def model_limits(model) -> tuple[int | None, int | None]:
    """(vocab size, max positions) of a language model: from its config (`vocab_size`;
    `max_position_embeddings` or `n_positions`), else the vocabulary from its first
    Embedding; None where it cannot be told."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if vocab is None and hasattr(model, "named_modules"):
        for _, m in model.named_modules():
            weight = getattr(m, "weight", None)
            if type(m).__name__ == "Embedding" and weight is not None:
                vocab = int(weight.shape[0])
                break
    return (int(vocab) if vocab else None), (int(positions) if positions else None)


def load_text_data(path, tokenizer: TextTokenizer, block_size: int | None = None, packing: bool = True,
                   per_line: bool = False, truncate: bool = False, fields: str = "auto",
                   vocab_size: int | None = None, max_positions: int | None = None) -> TextDataset:
    """Token rows for causal-LM training from a text file (see the module docstring).

    `block_size`: positions per row (required with packing; without, the longest document's
    length). `truncate` (padding): cut a longer document to the block size instead of
    refusing it. `vocab_size` / `max_positions`: the model's, to refuse ids it has no
    embedding for and rows longer than its positions."""
    p = Path(path).expanduser()
    if block_size is not None and (int(block_size) != block_size or block_size < 1):
        raise ValueError(f"block_size: expected a positive whole number of positions, found {block_size!r}")
    limit = f"the model's {max_positions} positions (max_position_embeddings)"
    if block_size is not None and max_positions is not None and block_size > max_positions:
        raise TextDataError(p, f"block size {block_size} is longer than {limit}: choose a block size of at most "
                               f"{max_positions}")
    if packing and block_size is None:
        raise ValueError("load_text_data: packing needs a block size (positions per row)")
    docs = read_documents(p, per_line=per_line, fields=fields)
    seqs = tokenize_documents(docs, tokenizer, vocab_size)
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_id or 0)
    if vocab_size is not None and pad_id >= vocab_size:
        raise TextDataError(tokenizer.path, f"the pad token id {pad_id} is out of range for the model's "
                                            f"{vocab_size} token embeddings: the tokenizer does not match the model")
    if packing:
        ids = np.concatenate([s[0] for s in seqs])
        learn = np.concatenate([s[1] for s in seqs])
        T = int(block_size)
        windows = [(ids[s:s + T + 1], learn[s:s + T + 1]) for s in range(0, max(len(ids) - 1, 0), T)]
    else:
        windows = []
        longest = max(range(len(seqs)), key=lambda i: len(seqs[i][0]))
        if block_size is None:
            T = len(seqs[longest][0]) - 1
            if max_positions is not None and T > max_positions:
                doc = docs[longest]
                raise TextDataError(
                    doc.file, f"the document has {T + 1} tokens, {T} positions after the shift, more than {limit}: "
                              f"set a block size of at most {max_positions} (with truncation), or pack the text "
                              f"into blocks", line=doc.line)
        else:
            T = int(block_size)
        for doc, (ids, learn) in zip(docs, seqs):
            if len(ids) - 1 > T:
                if not truncate:
                    room = f" (the model allows up to {max_positions})" if max_positions is not None else ""
                    raise TextDataError(
                        doc.file, f"the document has {len(ids)} tokens, {len(ids) - 1} positions after the shift, "
                                  f"more than the block size {T}: raise the block size{room}, truncate longer "
                                  f"documents, or pack the text into blocks", line=doc.line)
                ids, learn = ids[:T + 1], learn[:T + 1]
            windows.append((ids, learn))
    windows = [w for w in windows if len(w[0]) >= 2 and w[1][1:].any()]  # a row with nothing to learn is dropped
    if not windows:
        raise TextDataError(p, "expected text with at least one token to learn, found none after tokenizing")
    inputs, targets, mask = _rows_from(windows, T, pad_id)
    return TextDataset(inputs, targets, mask, T, packing, p.name, len(docs), tokenizer)


def text_data_for_model(model, path, tokenizer: TextTokenizer, **options) -> TextDataset:
    """`load_text_data` with the model's vocabulary size and positions as the limits."""
    vocab, positions = model_limits(model)
    options.setdefault("vocab_size", vocab)
    options.setdefault("max_positions", positions)
    return load_text_data(path, tokenizer, **options)


def check_fits(model, dataset, name: str | None = None) -> None:
    """Refuse token rows the model cannot take, before anything trains: an id (input or
    target) at or past its vocabulary, rows longer than its positions. The `"causal-lm"`
    kind of the Learner checks its data sets with this (data loaded without the model's
    limits, by `make_data` without a model, are checked here)."""
    vocab, positions = model_limits(model)
    inputs = np.asarray(dataset.inputs)
    targets = np.asarray(dataset.targets)
    name = name or getattr(dataset, "name", "the data")
    if inputs.dtype.kind not in "iu" or targets.dtype.kind not in "iu":
        raise TextDataError(name, f"expected integer token ids as inputs and targets, found {inputs.dtype} and "
                                  f"{targets.dtype}")
    if positions is not None and inputs.ndim == 2 and inputs.shape[1] > positions:
        raise TextDataError(name, f"rows of {inputs.shape[1]} positions are longer than the model's {positions} "
                                  f"positions (max_position_embeddings): choose a block size of at most {positions}")
    if vocab is None:
        return
    for what, ids in (("input", inputs), ("target", np.where(targets == IGNORE_INDEX, 0, targets))):
        if ids.size and (int(ids.max()) >= vocab or int(ids.min()) < 0):
            bad = np.argwhere((ids >= vocab) | (ids < 0))[0]
            token = int(ids[tuple(bad)])
            raise TextDataError(name, f"row {int(bad[0])}, position {int(bad[-1])}: {what} token id {token} is out of "
                                      f"range for the model's {vocab} token embeddings (expected ids 0..{vocab - 1}): "
                                      f"the tokenizer does not match the model")
