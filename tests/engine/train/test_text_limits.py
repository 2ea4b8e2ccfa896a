"""Issue 43, items 7 and 11 (text data): the tokenizer is given bounded pieces of text, so a long
line cannot abort the process; the memory a data set needs is checked before it is built;
tokenizing costs tens of bytes per input byte, not hundreds; a panic in the tokenizers library, a
jsonl line with a 5,000-digit integer or deep nesting are errors of the project's own types; a
jsonl string may hold U+2028. Memory is measured in subprocesses (RSS, RLIMIT_AS), never time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.module import memory
from engine.train import text, tokenizer
from engine.train.text import (
    IGNORE_INDEX,
    TextDataError,
    TextDataTooLarge,
    TokenizerError,
    load_text_data,
    load_tokenizer,
    read_documents,
)
from tests.engine.train.test_text import word_tokenizer, write

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "hf" / "llama-gqa"
WORDS = ("the", "cat", "sat", "on", "mat", "dog", "ran", "to", "a", "log")


def sentence_lines(n_chars: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 30))))
        lines.append(line)
        size += len(line) + 1
    return lines


class SpyTokenizer:
    """Stands in for the `tokenizers.Tokenizer` of a TextTokenizer and records what each call got."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[list[int]] = []  # per call: the length of each text

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in ("encode", "encode_batch", "encode_batch_fast"):
            return attr

        def recorded(texts, *args, **kwargs):
            self.calls.append([len(t) for t in ([texts] if isinstance(texts, str) else texts)])
            return attr(texts, *args, **kwargs)
        return recorded


@pytest.fixture
def words(tmp_path):
    return load_tokenizer(word_tokenizer(tmp_path / "wtok"))


def spied(tok):
    tok.tokenizer = SpyTokenizer(tok.tokenizer)
    return tok.tokenizer


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter at the repository root (so `tests.limits` imports)."""
    env = {**os.environ, "RUST_BACKTRACE": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)


# ---- item 7: bounded pieces, bounded memory -------------------------------------------------------
def test_the_tokenizer_never_gets_more_than_a_piece_of_a_long_line(tmp_path):
    tok = load_tokenizer(FIXTURE)
    spy = spied(tok)
    line = " ".join(sentence_lines(3 * text.MAX_PIECE_CHARS + 1000))  # one line of ~200 k characters
    p = write(tmp_path / "one-line.txt", line + "\n" + "\n".join(sentence_lines(2 * text.CHUNK_CHARS, seed=1)))
    data = load_text_data(p, tok, block_size=64, per_line=True)
    longest = max(n for call in spy.calls for n in call)
    assert longest <= text.MAX_PIECE_CHARS
    assert max(sum(call) for call in spy.calls) <= text.CHUNK_CHARS + text.MAX_PIECE_CHARS
    assert len(spy.calls) >= 4  # the 720 k characters went in several calls, not one
    # the cut goes before a space, so the rows begin with the tokens of the uncut line
    reference = load_tokenizer(FIXTURE)
    whole = np.asarray(reference.encode(line) + [reference.eos_id])
    rows = (len(whole) - 1) // 64
    assert rows > 1000
    assert np.array_equal(data.inputs[:rows].ravel(), whole[:rows * 64])
    assert np.array_equal(data.targets[:rows].ravel(), whole[1:rows * 64 + 1])


def test_documents_cut_into_pieces_give_the_rows_of_whole_documents(tmp_path, monkeypatch):
    """Tiny caps (a piece of 40 characters, calls of 100) against the default ones: the same rows,
    packed and padded, text and prompt/completion."""
    folder = word_tokenizer(tmp_path / "tok", words=WORDS)
    lines = [" ".join(np.random.default_rng(i).choice(WORDS, size=3 + i % 25)) for i in range(200)]
    p = write(tmp_path / "c.txt", "\n".join(lines))
    pc = write(tmp_path / "pc.jsonl", "\n".join(json.dumps({"prompt": a, "completion": " " + b})
                                                for a, b in zip(lines[::2], lines[1::2])))
    cases = [(p, dict(block_size=16)), (p, dict(block_size=16, per_line=True)),
             (p, dict(packing=False, per_line=True)), (pc, dict(packing=False)), (pc, dict(block_size=8))]
    expected = [load_text_data(path, load_tokenizer(folder), **kw) for path, kw in cases]
    monkeypatch.setattr(text, "MAX_PIECE_CHARS", 40)
    monkeypatch.setattr(text, "CHUNK_CHARS", 100)
    for (path, kw), want in zip(cases, expected):
        tok = load_tokenizer(folder)
        spy = spied(tok)
        got = load_text_data(path, tok, **kw)
        assert max(n for call in spy.calls for n in call) <= 40
        for name in ("inputs", "targets", "attention_mask"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), (path.name, kw, name)
        assert got.target_tokens == want.target_tokens > 0


def test_a_piece_without_white_space_is_cut_at_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "MAX_PIECE_CHARS", 50)
    tok = load_tokenizer(FIXTURE)
    spy = spied(tok)
    data = load_text_data(write(tmp_path / "w.txt", "x" * 175), tok, block_size=8)
    assert [n for call in spy.calls for n in call] == [50, 50, 50, 25]
    learnt = data.targets[data.targets != IGNORE_INDEX]
    assert tok.decode(learnt).replace(" ", "") == "x" * 175  # every character is in the rows, once


def test_a_corpus_larger_than_memory_is_refused_before_it_is_tokenized(tmp_path, monkeypatch):
    tok = load_tokenizer(FIXTURE)
    spy = spied(tok)
    p = write(tmp_path / "big.txt", "\n".join(sentence_lines(8 * text.CHUNK_CHARS)))
    free = text.TOKENIZER_WORKING_BYTES + 2 * 10**6  # 2 MB besides the tokenizer's reserve
    monkeypatch.setattr(memory, "available_memory", lambda: free)
    with pytest.raises(TextDataTooLarge) as e:
        load_text_data(p, tok, block_size=64)
    message = str(e.value)
    assert message.startswith(f"{p}: loading big.txt needs about ") and " MB available; refused" in message
    assert "rows of inputs, targets and masks" in message and "projected from the" in message
    assert isinstance(e.value, TextDataError) and isinstance(e.value, memory.NotEnoughMemory)
    assert sum(map(sum, spy.calls)) < p.stat().st_size / 2  # refused long before the end of the file


def test_nothing_is_tokenized_without_the_tokenizers_working_memory(tmp_path, monkeypatch):
    tok = load_tokenizer(FIXTURE)
    spy = spied(tok)
    monkeypatch.setattr(memory, "available_memory", lambda: text.TOKENIZER_WORKING_BYTES - 1)
    with pytest.raises(TextDataTooLarge, match=r"small.txt: loading small.txt needs about 67.1 MB .*the tokenizer's "
                                               r"working memory 67.1 MB\), but this machine has 67.1 MB available; "
                                               r"refused: nothing can be tokenized"):
        load_text_data(write(tmp_path / "small.txt", "the cat sat"), tok, block_size=4)
    assert spy.calls == []


def test_padded_rows_larger_than_memory_are_refused_before_they_are_made(tmp_path, monkeypatch):
    """Few tokens, but one long document makes every padded row long: the rows are checked once
    their count and width are known."""
    words = load_tokenizer(word_tokenizer(tmp_path / "tok"))
    p = write(tmp_path / "pad.txt", " ".join(["a"] * 4000) + "\n" + "\n".join(["b c"] * 2000))
    monkeypatch.setattr(memory, "available_memory", lambda: text.TOKENIZER_WORKING_BYTES + 50 * 10**6)
    with pytest.raises(TextDataTooLarge, match=r"pad.txt: loading pad.txt needs about 384.\d MB .*2001 rows of 4001 "
                                               r"positions"):
        load_text_data(p, words, packing=False, per_line=True)
    monkeypatch.setattr(memory, "available_memory", lambda: 500 * 10**6)
    assert load_text_data(p, words, packing=False, per_line=True).inputs.shape == (2001, 4001)


MEASURE = """
import resource, sys
def _peak():  # this process's own peak RSS (VmHWM): ru_maxrss keeps the parent's peak across exec
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
import numpy as np
from engine.train.text import load_text_data, load_tokenizer
tok = load_tokenizer({fixture!r})
rng = np.random.default_rng(0)
words = np.array({words!r})
lines = [" ".join(rng.choice(words, size=int(k))) for k in rng.integers(3, 30, size={lines})]
path = {path!r}
open(path, "w").write("\\n".join(lines))
size = len(open(path, "rb").read())
before = _peak()
data = load_text_data(path, tok, block_size=64, per_line={per_line})
after = _peak()
print((after - before) / size, data.inputs.size / size)
"""


@pytest.mark.parametrize("per_line", [False, True])
def test_tokenizing_costs_tens_of_bytes_per_input_byte(tmp_path, per_line):
    """Peak RSS growth while loading a 1.8 MB corpus, per input byte. Before: 250 (one document)
    and 115 (per line), from the library's full encodings and Python lists of the whole corpus at
    once. Now ~40 (~31 at 4 MB, where fixed costs weigh less): the rows themselves (int64 inputs,
    targets and mask: 24 bytes a position; the fixture's tokenizer gives 0.65 tokens a byte),
    the uint32 ids, the text."""
    code = MEASURE.format(fixture=str(FIXTURE), words=list(WORDS), lines=30_000, path=str(tmp_path / "c.txt"),
                          per_line=per_line)
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    per_byte, positions_per_byte = map(float, done.stdout.split())
    assert positions_per_byte > 0.5  # the rows hold what was read
    assert per_byte < 60, per_byte


LONG_LINE = """
import resource, sys
from tests.limits import address_space_growth_limit
from engine.train.text import TextDataError, load_text_data, load_tokenizer
tok = load_tokenizer({fixture!r})
words = ["the", "cat", "sat", "on", "a", "log"]
path = {path!r}
with open(path, "w") as f:  # one line, no line break
    f.write(" ".join(words[i % 6] + words[i % 5] for i in range({n_words})))
with address_space_growth_limit({limit}):
    try:
        data = load_text_data(path, tok, block_size=64)
        print("loaded", len(data))
    except TextDataError as e:
        print("refused", type(e).__name__, e)
"""


def long_line_under_a_limit(tmp_path, n_words: int, limit: int) -> subprocess.CompletedProcess:
    code = LONG_LINE.format(fixture=str(FIXTURE), path=str(tmp_path / "line.txt"), n_words=n_words, limit=limit)
    return run_python(code, timeout=600)


def test_a_long_line_under_an_address_space_limit_loads_or_is_refused_cleanly(tmp_path):
    """A 3.2 MB line with 600 MB of address space to grow: before, the tokenizer got the whole
    line, needed ~750 MB and aborted the process (SIGABRT, 'memory allocation of ... bytes failed');
    now it is tokenized in pieces (~120 MB) and loads."""
    done = long_line_under_a_limit(tmp_path, 550_000, 600 * 2**20)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("loaded"), done.stdout


def test_a_long_line_beyond_the_limit_is_refused_by_the_memory_check(tmp_path):
    """The same line with 150 MB to grow: refused (TextDataTooLarge: by the memory check, or, where
    the address space runs out in NumPy first, from its MemoryError); the process does not abort."""
    done = long_line_under_a_limit(tmp_path, 550_000, 150 * 2**20)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(f"refused TextDataTooLarge {tmp_path / 'line.txt'}: "), done.stdout
    assert "use a smaller file, or a machine with more memory" in done.stdout.lower()


@pytest.mark.slow
def test_a_20_mb_line_under_a_2_gb_limit(tmp_path):
    """The issue's case: a 20 MB single line under a 2 GB RLIMIT_AS (measured: loads, 27 bytes of
    peak RSS per input byte; before, SIGABRT)."""
    done = long_line_under_a_limit(tmp_path, 3_400_000, 2 * 2**30)  # 20.1 MB
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(("loaded", "refused TextDataTooLarge")), done.stdout


# ---- item 11: the library's panics, jsonl ------------------------------------------------------------
def catastrophic_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer whose pre-tokenizer splits on `(a+)+$`: on 'aaa…a!' Oniguruma's
    backtracking hits its retry limit and the library panics (a BaseException)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "</s>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+$"), "isolated")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return folder


def test_a_panic_of_the_tokenizers_library_is_a_tokenizer_error(tmp_path):
    tok = load_tokenizer(catastrophic_tokenizer(tmp_path / "tok"))
    assert tok.encode("aaa b") == [0]  # the pattern is fine on short text
    with pytest.raises(TokenizerError) as e:
        tok.encode("a" * 40 + "!")
    assert str(e.value).startswith(f"{tmp_path / 'tok' / 'tokenizer.json'}: the tokenizers library failed encoding")
    assert "panic" in str(e.value) and "retry-limit" in str(e.value)
    p = write(tmp_path / "a.txt", "a b\n" + "a" * 40 + "!\n")
    with pytest.raises(TokenizerError, match=r"tokenizer.json: the tokenizers library failed on .*a.txt \(a panic"):
        load_text_data(p, tok, block_size=4)


def test_jsonl_lines_split_at_line_feeds_only(tmp_path):
    """JSON Lines ends a record at "\\n" only: raw U+2028, U+2029 and U+0085 are valid inside a
    JSON string (str.splitlines() cut the line there: 'Unterminated string')."""
    inner = "a\u2028b\u2029c\x85d"
    p = write(tmp_path / "u.jsonl", '{"text": "' + inner + '"}\r\n\n{"text": "f"}\n')
    docs = read_documents(p)
    assert [(d.line, d.text) for d in docs] == [(1, inner), (3, "f")]
    t = write(tmp_path / "u.txt", "a\u2028b\nc\r\n\nd")  # per line, a .txt file counts lines as the error messages do
    assert [(d.line, d.text) for d in read_documents(t, per_line=True)] == [(1, "a\u2028b"), (2, "c"), (4, "d")]


@pytest.mark.parametrize("line, found", [
    ('{"text": "a", "n": ' + "9" * 5000 + "}", r"found an integer of more digits than Python converts"),
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", r"found JSON nested deeper than Python's recursion limit"),
])
def test_jsonl_values_python_will_not_convert_name_the_line(tmp_path, words, line, found):
    p = write(tmp_path / "n.jsonl", '{"text": "a b"}\n' + line + "\n")
    with pytest.raises(TextDataError, match=rf"n.jsonl, line 2: expected a JSON object, {found}"):
        load_text_data(p, words, block_size=4)


@pytest.mark.parametrize("value", ["9" * 5000, "[" * 100_000 + "]" * 100_000])
def test_tokenizer_config_values_python_will_not_convert_are_named(tmp_path, value):
    folder = word_tokenizer(tmp_path / "tok", config=False)
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>", "x": ' + value + "}")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: expected JSON, found (an integer|JSON nested)"):
        load_tokenizer(folder)


def test_a_lone_surrogate_escape_is_named_as_such(tmp_path, words):
    """json.loads makes "\\ud800" a str that no encoder takes: the tokenizer said 'TextEncodeInput
    must be Union[...]' (a TokenizerError about the data), a special token a raw UnicodeEncodeError."""
    p = write(tmp_path / "s.jsonl", '{"text": "a b"}\n{"text": "a \\ud800 b"}\n')
    with pytest.raises(TextDataError, match=r"s.jsonl, line 2: field 'text': expected text, found the escape "
                                            r"\\ud800 at character 2, half of a surrogate pair"):
        load_text_data(p, words, block_size=4)
    folder = word_tokenizer(tmp_path / "tok", config=False)
    (folder / "tokenizer_config.json").write_text('{"eos_token": "\\udfff"}')
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: eos_token: expected a token string, found "):
        load_tokenizer(folder)


BIG_TOKENIZER = """
import json, sys
from pathlib import Path
from tests.limits import address_space_growth_limit
from engine.train.text import TokenizerError, load_tokenizer
folder = Path({folder!r})
folder.mkdir()
vocab = {{f"t{{i}}": i for i in range(300_000)}}
(folder / "tokenizer.json").write_text(json.dumps({{"version": "1.0", "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {{"type": "Whitespace"}}, "post_processor": None, "decoder": None,
    "model": {{"type": "WordLevel", "unk_token": "t0", "vocab": vocab}}}}))
del vocab
with address_space_growth_limit(40 * 2**20):
    try:
        print("loaded", load_tokenizer(folder).vocab_size)
    except TokenizerError as e:
        print("refused", type(e).__name__, e)
"""


def test_a_tokenizer_larger_than_memory_is_refused_before_the_library_reads_it(tmp_path):
    """A 5.7 MB tokenizer.json (300,000 words) with 40 MB of address space to grow: the library
    needs ~60 MB for it and, before, aborted the process ('memory allocation of ... bytes failed')."""
    done = run_python(BIG_TOKENIZER.format(folder=str(tmp_path / "big")))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(f"refused TokenizerTooLarge {tmp_path / 'big' / 'tokenizer.json'}: reading "
                                  f"tokenizer.json needs about "), done.stdout
    assert "the library's vocabulary and merges" in done.stdout and "available; refused" in done.stdout


def test_a_tokenizer_is_read_when_its_memory_is_there(tmp_path, monkeypatch):
    size = (FIXTURE / "tokenizer.json").stat().st_size
    need = (2 + tokenizer.TOKENIZER_BYTES_PER_FILE_BYTE) * size + text.TOKENIZER_WORKING_BYTES
    monkeypatch.setattr(memory, "available_memory", lambda: need)
    assert load_tokenizer(FIXTURE).vocab_size == 128
    monkeypatch.setattr(memory, "available_memory", lambda: need - 1)
    with pytest.raises(text.TokenizerTooLarge) as e:
        load_tokenizer(FIXTURE)
    assert isinstance(e.value, TokenizerError) and isinstance(e.value, memory.NotEnoughMemory)
