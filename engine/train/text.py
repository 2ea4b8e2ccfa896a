"""Text data for causal language models: a folder's tokenizer, text files, blocks of token ids.

```python
tok = load_tokenizer("my-llama")                      # tokenizer.json through the `tokenizers` library
data = text_data_for_model(model, "corpus.txt", tok, block_size=64, per_line=True)
data.inputs, data.targets, data.attention_mask      # int64 [rows, 64] each
```

- `load_tokenizer(folder)` (`engine/train/tokenizer.py`): the folder's `tokenizer.json`, read by the `tokenizers` library
  (nothing here splits or merges text itself), with the special tokens named in
  `tokenizer_config.json` (or `special_tokens_map.json`; ids in `config.json` as a last
  resort): `pad_id`, `eos_id`, `bos_id`, `unk_id` (None when a folder names none).
- Documents (`read_documents(path, per_line=False)`): a `.txt` file is one document, or one
  per non-blank line with `per_line=True`; a folder of `.txt` / `.jsonl` files gives each
  file's documents in name order; a `.jsonl` file has one JSON object a line, with a `text`
  field or `prompt` and `completion` fields (the first record decides which; every line
  must then have them). Lines end at "\n" only (JSON Lines; a "\r" before it is dropped), so a
  JSON string may hold U+2028 or U+0085 and line numbers are an editor's.
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

Bounded memory: the tokenizer is given at most `MAX_PIECE_CHARS` (65,536) characters of one
text and about `CHUNK_CHARS` (65,536) a call, and its ids go straight into uint32 arrays. A
longer document (a long line, a whole `.txt` file) is cut into pieces just before a space
that follows a word (else before other white space, else at the cap): each piece is encoded
on its own, the first with the special tokens, so byte-level BPE, Metaspace and white-space
tokenizers give the tokens of the uncut text (a cut at a line break or inside a word may give
other tokens there). Loading costs ~30 bytes of peak memory per input byte (the int64 rows are
24 bytes a position). What the rows will need (`ROW_BYTES_PER_POSITION`, 48 bytes a position:
three int64 arrays, copied once more by a train/validation split), with the ids still to read
and `TOKENIZER_WORKING_BYTES` (64 MiB) kept free for the tokenizer, is checked against
`memory.available_memory()` before each call to the tokenizer (projected from the tokens so
far) and again once the rows' count and width are known: a file that does not fit is refused
with `TextDataTooLarge` (a `TextDataError` and a `NotEnoughMemory`) before the rows are made,
and before the tokenizer runs out of memory (a failed allocation in the Rust library aborts
the process; the check is what keeps it from getting there).

Every problem is a `TextDataError` (a `DataFileError`) naming the file, the line where one
applies, what was expected and what was found: an empty file, bytes that are not UTF-8, a
jsonl line that is not JSON or lacks the field, a token id the model has no embedding for
(`vocab_size`: the tokenizer does not match the model), a row longer than the model's
positions (`max_positions`), a JSON value Python will not convert (an integer of more than
4,300 digits, nesting deeper than the recursion limit); a tokenizer the library cannot read,
or a failure of the library while it encodes, is a `TokenizerError`: a Rust panic included
(`pyo3_runtime.PanicException`, a BaseException). A catastrophic pre-tokenizer regex is bounded
by Oniguruma's retry limit (a search gives up after 10 million backtracking steps, ~0.4 s),
which the library reports as a panic: a `TokenizerError` naming tokenizer.json and the lines.
A tokenizer.json is read only when the memory its structures take (~`TOKENIZER_BYTES_PER_FILE_BYTE`
bytes a byte of the file) is available (`TokenizerTooLarge`, a `TokenizerError` and a
`NotEnoughMemory`), as the library would abort the process where it is not.
"""
from __future__ import annotations

import json
import re
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..module import memory
from .data import InMemoryDataset
from .data_files import DataFileError
from .losses import IGNORE_INDEX
from .tokenizer import (_SURROGATE, TOKENIZER_WORKING_BYTES, TextTokenizer, TokenizerError, TokenizerTooLarge,
                        _json_value, _library_message, load_tokenizer)

__all__ = [
    "IGNORE_INDEX", "Document", "TextDataError", "TextDataTooLarge", "TextDataset", "TextTokenizer", "TokenizerError",
    "TokenizerTooLarge", "check_fits", "load_text_data", "load_tokenizer", "model_limits", "read_documents",
    "text_data_for_model",
]

TEXT_SUFFIXES = (".txt", ".jsonl")
# The tokenizer is given at most this many characters at once: a longer document (a line, a
# jsonl field, a whole .txt file) is cut into pieces of at most this length before the tokenizer
# sees it (see `_pieces`). The library's working memory is ~200 bytes per character and it
# aborts the process when an allocation fails, so what it gets must be bounded.
MAX_PIECE_CHARS = 1 << 16
# Characters per call to the tokenizer (pieces of many documents encoded together)
CHUNK_CHARS = 1 << 16
# What a token costs once tokenized: its uint32 id and learn flag while the file is read (5
# bytes), then the rows: inputs, targets and attention mask, int64 each (24 bytes a position),
# twice, since a train/validation split copies them.
STREAM_BYTES_PER_TOKEN = 5
ROW_BYTES_PER_POSITION = 2 * 3 * 8


class TextDataError(DataFileError):
    """A text data file cannot be used; the message names the file, the line, expected vs found."""


class TextDataTooLarge(TextDataError, memory.NotEnoughMemory):
    """The token rows of a text file would need more memory than the machine has: says how much."""


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
            docs.extend(Document(str(f), n, text=line.removesuffix("\r"))
                        for n, line in enumerate(text.split("\n"), start=1) if line.strip())
        else:
            docs.append(Document(str(f), None, text=text))
    return docs


def _jsonl_documents(f: Path, text: str, fields: str) -> list[Document]:
    docs = []
    chosen = None if fields == "auto" else fields
    first_line = None
    # JSON Lines: records end at "\n" only (a "\r" before it is JSON white space); a string may
    # hold U+2028 or U+0085 raw, which str.splitlines() would take for line ends
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = _json_value(line)
        except json.JSONDecodeError as e:
            raise TextDataError(f, f"expected a JSON object, found invalid JSON ({e.msg} at column {e.colno})",
                                line=n) from None
        except ValueError as e:
            raise TextDataError(f, f"expected a JSON object, found {e}", line=n) from None
        if not isinstance(record, dict):
            raise TextDataError(f, f"expected a JSON object, found a JSON {type(record).__name__}", line=n)
        if chosen is None:
            if "text" in record:
                chosen = "text"
            elif "prompt" in record and "completion" in record:
                chosen = "prompt-completion"
            else:
                chat = next((k for k in ("messages", "conversations", "instruction") if k in record), None)
                hint = (f": a {chat!r} record is conversation data, read with the model's chat template "
                        f"(engine.train.chat_data.load_conversation_data)" if chat else "")
                raise TextDataError(f, f"expected a 'text' field, or 'prompt' and 'completion' fields, found "
                                       f"keys {sorted(record)}{hint}", line=n)
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
                                       f"{type(record[name]).__name__} {_json_excerpt(record[name])}", line=n)
            bad = _SURROGATE.search(record[name])
            if bad is not None:
                raise TextDataError(f, f"field {name!r}: expected text, found the escape \\u{ord(bad.group()):04x} "
                                       f"at character {bad.start()}, half of a surrogate pair and no character by "
                                       f"itself", line=n)
        if chosen == "text":
            docs.append(Document(str(f), n, text=record["text"]))
        else:
            if not record["completion"]:
                raise TextDataError(f, "field 'completion': expected text to learn, found an empty string", line=n)
            docs.append(Document(str(f), n, prompt=record["prompt"], completion=record["completion"]))
    return docs


def _json_excerpt(value) -> str:
    try:
        return json.dumps(value)[:40]
    except (RecursionError, ValueError):  # nesting json.loads just took, an int too long to write
        return "(too deep or too long to show)"


# ---------------------------------------------------------------------------------- tokens and blocks
# A long document is cut just before a space that follows a word, so each later piece begins
# with the space the tokenizer saw before that word in the whole text: byte-level BPE (GPT-2's
# "Ġword"), Metaspace ("▁word", prepended or not) and white-space splitting then give the tokens
# of the uncut text. Without such a space it is cut before other white space (a line break: a
# Metaspace tokenizer then adds a "▁" at the cut), and without any at the length cap.
_LAST_SPACE = re.compile(r"(?s).*\S(?= )")
_LAST_WHITE_SPACE = re.compile(r"(?s).*\S(?=\s)")


def _pieces(text: str, cap: int | None = None):
    """`text` in pieces of at most `cap` (default `MAX_PIECE_CHARS`) characters, cut as said above."""
    cap = MAX_PIECE_CHARS if cap is None else cap
    start, n = 0, len(text)
    while n - start > cap:
        stop = start + cap  # endpos stop + 1: text[stop] may be the space the cut goes before
        m = _LAST_SPACE.match(text, start, stop + 1) or _LAST_WHITE_SPACE.match(text, start, stop + 1)
        end = m.end() if m is not None else stop
        yield text[start:end]
        start = end
    yield text[start:]


@dataclass
class Tokens:
    """The documents' token ids back to back (`ids` uint32; each document ends with eos when the
    tokenizer has one), `learn` (False on prompt tokens) and where each document ends in `ids`."""

    ids: np.ndarray
    learn: np.ndarray
    ends: np.ndarray  # int64 [documents]

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start = int(self.ends[i - 1]) if i else 0
        return self.ids[start:int(self.ends[i])], self.learn[start:int(self.ends[i])]


def _doc_chars(doc: Document) -> int:
    return len(doc.text) if doc.text is not None else len(doc.prompt) + len(doc.completion)


def _too_large(source, parts: dict[str, int], available: int, how: str) -> TextDataTooLarge:
    estimate = memory.MemoryEstimate(f"loading {Path(str(source)).name}", parts)
    return TextDataTooLarge(source, f"{estimate.refusal(available)}: {how}. Use a smaller file, or a machine "
                                    f"with more memory")


def _check_stream(source, count: int, chars: int, total_chars: int) -> None:
    """Refuse the file when what is left to allocate (the ids not read yet, the rows, the
    tokenizer's working memory) is more than the machine has now (`memory.available_memory()`):
    the tokens so far, `count` from the first `chars` characters, are projected over all."""
    available = memory.available_memory()
    if available is None:
        return
    projected = max(count, int(count / chars * total_chars)) if chars else 0
    held = count * STREAM_BYTES_PER_TOKEN
    parts = {"token ids while reading": projected * STREAM_BYTES_PER_TOKEN,
             "rows of inputs, targets and masks (int64; twice, for the train/validation split)":
                 projected * ROW_BYTES_PER_POSITION,
             "the tokenizer's working memory": TOKENIZER_WORKING_BYTES}
    if sum(parts.values()) - held > available:
        how = (f"about {projected} tokens, projected from the {count} tokens of the first {chars} of its "
               f"{total_chars} characters" if chars else "nothing can be tokenized")
        raise _too_large(source, parts, available + held, how)


def tokenize_documents(docs, tokenizer: TextTokenizer, vocab_size: int | None = None,
                       check_memory: bool = False, source=None) -> Tokens:
    """Every document's ids, encoded in chunks of about `CHUNK_CHARS` characters, a document in
    pieces of at most `MAX_PIECE_CHARS` (`_pieces`). A text is encoded with the tokenizer's special
    tokens (its first piece), a prompt likewise, its completion without; each document then ends
    with eos. Ids are checked against `vocab_size`; with `check_memory`, the file is refused with
    `TextDataTooLarge` before the first call and after each one where the tokens so far,
    projected over the characters left, need more than the machine has (`_check_stream`)."""
    docs = list(docs)
    source = source if source is not None else (docs[0].file if docs else "the text")
    eos = tokenizer.eos_id
    total_chars = sum(_doc_chars(d) for d in docs) or 1
    ends = np.zeros(len(docs), dtype=np.int64)
    id_chunks: list[np.ndarray] = []
    learn_chunks: list[np.ndarray] = []
    state = {"count": 0, "chars": 0}
    batch: list[tuple] = []  # (piece or None at a document's end, with special tokens, learnt, document)

    def flush():
        if not batch:
            return
        first, last = docs[batch[0][3]], docs[batch[-1][3]]
        where = f"on {first.file}" + (f", lines {first.line}-{last.line}" if first.line is not None else "")
        encoded = {}
        for special in (True, False):
            texts = [b[0] for b in batch if b[0] is not None and b[1] is special]
            if texts:
                encoded[special] = iter(tokenizer.encode_ids(texts, special, where))
        flat: list[int] = []
        owners = array("q")  # per piece: (its first position in the chunk, its document)
        not_learnt = []
        for piece, special, learn, i in batch:
            start = len(flat)
            owners.extend((start, i))
            if piece is None:
                if eos is not None:
                    flat.append(eos)
                ends[i] = state["count"] + len(flat)
                continue
            flat.extend(next(encoded[special]))
            if not learn:
                not_learnt.append((start, len(flat)))
        chunk = np.array(flat, dtype=np.uint32)  # the library's ids are u32
        del flat
        if vocab_size is not None and chunk.size and int(chunk.max()) >= vocab_size:
            at = int(np.argmax(chunk >= vocab_size))
            bad = int(chunk[at])
            starts = np.asarray(owners, dtype=np.int64).reshape(-1, 2)
            doc = docs[int(starts[np.searchsorted(starts[:, 0], at, side="right") - 1, 1])]
            raise TextDataError(
                doc.file, f"the tokenizer {tokenizer.path} gives the token id {bad} "
                          f"({tokenizer.id_to_token(bad)!r}), but the model has {vocab_size} token embeddings "
                          f"(expected ids 0..{vocab_size - 1}): the tokenizer does not match the model",
                line=doc.line)
        learnt = np.ones(len(chunk), dtype=bool)
        for a, b in not_learnt:
            learnt[a:b] = False
        id_chunks.append(chunk)
        learn_chunks.append(learnt)
        state["count"] += len(chunk)
        state["chars"] += sum(len(b[0]) for b in batch if b[0] is not None)
        batch.clear()
        if check_memory:
            _check_stream(source, state["count"], state["chars"], total_chars)

    if check_memory:
        _check_stream(source, 0, 0, total_chars)
    size = 0
    for i, doc in enumerate(docs):
        parts = [(doc.text, True, True)] if doc.text is not None else \
            [(doc.prompt, True, False), (doc.completion, False, True)]
        for text, special, learn in parts:
            for k, piece in enumerate(_pieces(text)):
                batch.append((piece, special and k == 0, learn, i))
                size += len(piece)
                if size >= CHUNK_CHARS:
                    flush()
                    size = 0
        batch.append((None, False, True, i))
    flush()
    ids = np.concatenate(id_chunks) if id_chunks else np.zeros(0, dtype=np.uint32)
    id_chunks.clear()
    learn = np.concatenate(learn_chunks) if learn_chunks else np.zeros(0, dtype=bool)
    return Tokens(ids, learn, ends)


def check_rows_fit(source, tokens: Tokens, rows: int, block_size: int) -> None:
    """Refuse rows that do not fit in what the machine has now (the ids are already read)."""
    need = rows * block_size * ROW_BYTES_PER_POSITION
    available = memory.available_memory()
    if available is not None and need > available:
        raise _too_large(source, {"rows of inputs, targets and masks (int64; twice, for the train/validation "
                                  "split)": need}, available,
                         f"{rows} rows of {block_size} positions from {len(tokens.ids)} tokens")


def _packed_rows(tokens: Tokens, block_size: int, pad_id: int):
    """The stream cut into rows of `block_size + 1` ids that overlap by one, shifted: inputs
    ids[:-1], targets ids[1:] (IGNORE_INDEX where not learnt); the last row right-padded."""
    n = len(tokens.ids) - 1  # positions with a target
    rows = -(-max(n, 0) // block_size)
    inputs = np.full(rows * block_size, pad_id, dtype=np.int64)
    targets = np.full(rows * block_size, IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros(rows * block_size, dtype=np.int64)
    if n > 0:
        inputs[:n] = tokens.ids[:-1]
        targets[:n] = tokens.ids[1:]
        targets[:n][~tokens.learn[1:]] = IGNORE_INDEX
        mask[:n] = 1
    return inputs.reshape(rows, block_size), targets.reshape(rows, block_size), mask.reshape(rows, block_size)


def padded_rows(windows, block_size: int, pad_id: int):
    """One row per (ids, learn) window, shifted as `_packed_rows`, right-padded to `block_size`."""
    n = len(windows)
    inputs = np.full((n, block_size), pad_id, dtype=np.int64)
    targets = np.full((n, block_size), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((n, block_size), dtype=np.int64)
    for r, (ids, learn) in enumerate(windows):
        k = len(ids) - 1
        inputs[r, :k] = ids[:-1]
        targets[r, :k] = ids[1:]
        targets[r, :k][~learn[1:]] = IGNORE_INDEX
        mask[r, :k] = 1
    return inputs, targets, mask


class TextDataset(InMemoryDataset):
    """Rows of token ids: `inputs` and `targets` int64 `[rows, block_size]` (targets shifted by
    one, `IGNORE_INDEX` where nothing is learnt), `attention_mask` (1: a real input position).
    Rows holding several sequences each attending only to itself (packed conversations) also
    have `segment_ids` (int64, 1.. per sequence of the row, 0 on pads) and `position_ids` (each
    sequence's positions from 0): the DataLoader puts them in its batches for the model."""

    def __init__(self, inputs, targets, attention_mask, block_size: int, packing: bool, name: str = "text",
                 documents: int = 0, tokenizer: TextTokenizer | None = None, segment_ids=None, position_ids=None):
        super().__init__(inputs, targets, name)
        self.segment_ids = None if segment_ids is None else np.asarray(segment_ids)
        self.position_ids = None if position_ids is None else np.asarray(position_ids)
        self.attention_mask = np.asarray(attention_mask)
        self.block_size = int(block_size)
        self.packing = bool(packing)
        self.documents = int(documents)
        self.tokenizer = tokenizer

    def extras(self) -> dict:
        if self.segment_ids is None:
            return {}
        return {"segment_ids": self.segment_ids, "position_ids": self.position_ids}

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
            extra = {k: v[idx] for k, v in self.extras().items()}
            parts.append(TextDataset(self.inputs[idx], self.targets[idx], self.attention_mask[idx], self.block_size,
                                     self.packing, self.name + label, self.documents, self.tokenizer, **extra))
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
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_id or 0)
    try:
        docs = read_documents(p, per_line=per_line, fields=fields)
        tokens = tokenize_documents(docs, tokenizer, vocab_size, check_memory=True, source=p)
        if vocab_size is not None and pad_id >= vocab_size:
            raise TextDataError(tokenizer.path, f"the pad token id {pad_id} is out of range for the model's "
                                                f"{vocab_size} token embeddings: the tokenizer does not match the "
                                                f"model")
        if packing:
            T = int(block_size)
            check_rows_fit(p, tokens, -(-max(len(tokens.ids) - 1, 0) // T), T)
            inputs, targets, mask = _packed_rows(tokens, T, pad_id)
            keep = (targets != IGNORE_INDEX).any(axis=1)  # a row with nothing to learn is dropped
            if not keep.all():
                inputs, targets, mask = inputs[keep], targets[keep], mask[keep]
        else:
            inputs, targets, mask, T = _document_rows(p, docs, tokens, block_size, truncate, max_positions, limit,
                                                      pad_id)
    except MemoryError as e:
        if isinstance(e, TextDataTooLarge):
            raise
        raise TextDataTooLarge(p, f"the token rows of {p.name} did not fit in memory ({_library_message(e)}): use a "
                                  f"smaller file, or a machine with more memory") from None
    if not len(inputs):
        raise TextDataError(p, "expected text with at least one token to learn, found none after tokenizing")
    return TextDataset(inputs, targets, mask, T, packing, p.name, len(docs), tokenizer)


def _document_rows(p, docs, tokens: Tokens, block_size, truncate: bool, max_positions, limit: str, pad_id: int):
    """One row per document (padding): (inputs, targets, mask, block size)."""
    lengths = np.diff(tokens.ends, prepend=0)
    if block_size is None:
        longest = int(np.argmax(lengths))
        T = int(lengths[longest]) - 1
        if max_positions is not None and T > max_positions:
            doc = docs[longest]
            raise TextDataError(
                doc.file, f"the document has {T + 1} tokens, {T} positions after the shift, more than {limit}: "
                          f"set a block size of at most {max_positions} (with truncation), or pack the text "
                          f"into blocks", line=doc.line)
    else:
        T = int(block_size)
    windows = []
    for i, doc in enumerate(docs):
        ids, learn = tokens.document(i)
        if len(ids) - 1 > T:
            if not truncate:
                room = f" (the model allows up to {max_positions})" if max_positions is not None else ""
                raise TextDataError(
                    doc.file, f"the document has {len(ids)} tokens, {len(ids) - 1} positions after the shift, "
                              f"more than the block size {T}: raise the block size{room}, truncate longer "
                              f"documents, or pack the text into blocks", line=doc.line)
            ids, learn = ids[:T + 1], learn[:T + 1]
        if len(ids) >= 2 and learn[1:].any():  # a row with nothing to learn is dropped
            windows.append((ids, learn))
    check_rows_fit(p, tokens, len(windows), max(T, 1))
    inputs, targets, mask = padded_rows(windows, max(T, 1), pad_id)
    return inputs, targets, mask, T


def text_data_for_model(model, path, tokenizer: TextTokenizer, **options) -> TextDataset:
    """`load_text_data` with the model's vocabulary size and positions as the limits."""
    vocab, positions = model_limits(model)
    options.setdefault("vocab_size", vocab)
    options.setdefault("max_positions", positions)
    return load_text_data(path, tokenizer, **options)


def takes_packed(model) -> bool:
    """Whether `model.forward` takes packed sequences (`segment_ids`, `position_ids`)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "segment_ids" in params and "position_ids" in params


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
    if getattr(dataset, "segment_ids", None) is not None and not takes_packed(model):
        raise TextDataError(name, f"the rows pack several sequences, each attending only to itself, which needs a "
                                  f"model whose forward takes segment_ids and position_ids (the Llama family, "
                                  f"GPT-2); {type(model).__name__} does not: turn packing off")
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
