"""GGUF export of a model opened from a Hugging Face folder with a SentencePiece-style tokenizer.json
(Llama 2, Mistral v0.1, TinyLlama, Gemma: BPE with byte fallback, '▁' for spaces) as llama.cpp's
"llama" tokenizer (engine/models/gguf_spm.py).

Default suite: the committed tiny Llama chat model with a Llama-2-style tokenizer
(tests/fixtures/hf/llama-spm) and the tiny Gemma one with Gemma's layout (gemma-spm), both made by
make_spm_fixture.py, exported; the keys read back (scores,
byte / unknown / control types, add_space_prefix); Ember's tokenizer rebuilt from the written GGUF
tokenizes the varied lines of test_gguf_smollm2.py (and lines with special tokens inside) as the
folder's tokenizer.json does, for the Llama 2 layout and those putting no space before the text
(Gemma's normalizer, a Metaspace); the tokenizers llama.cpp would tokenize otherwise refused, naming what was found, with
nothing written. With llama-cpp-python and transformers in the oracle venv (skipped, saying so,
without them): llama.cpp tokenizes those lines and the rendered chat prompt as transformers does,
and its greedy tokens after the prompt are Ember's on the same F16 file (Llama and Gemma).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from engine.models import from_pretrained  # noqa: E402
from engine.models.gguf_export import save_gguf  # noqa: E402
from engine.store.gguf_file import open_gguf  # noqa: E402
from engine.train.gguf_tokenizer import load_gguf_tokenizer  # noqa: E402
from engine.train.tokenizer import load_tokenizer  # noqa: E402
from tests.engine.models.test_gguf_export import needs_llama_cpp  # noqa: E402
from tests.engine.models.test_gguf_hf_tokenizer import (  # noqa: E402
    _check_with_llama_cpp, _llama_cpp_tokens, copy_edited, export_is_refused_leaving_the_target)
from tests.engine.models.test_gguf_smollm2 import _texts  # noqa: E402

SPM = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-spm"
GEMMA = SPM.parent / "gemma-spm"
SP = SPM.parent / "llama-sp"
SPACE = "\u2581"
SPECIAL_LINES = ["<s>Hello</s> world <s> x", "a</s>b", " <s> leading", "</s>", "[INST] hi [/INST]",
                 "<start_of_turn>user\n hi<end_of_turn>\n<bos> x", "<eos><pad><unk>", "call <tool> now<tool>x"]


def _copy(tmp_path: Path, edit=None, name: str = "m") -> Path:
    return copy_edited(SPM, tmp_path, edit, name)


def _metaspace(doc):  # '▁' for spaces, none put before the text
    doc["normalizer"] = None
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "never", "split": False}


def _gemma(doc):  # spaces become '▁', none is put before the text
    doc["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}


def _user_defined(doc):  # an added token not marked special (user-defined for llama.cpp), found in any text
    doc["added_tokens"].append({"id": 739, "content": "<tool>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": False})


def test_the_fixture_s_tokenizer_becomes_llama_cpp_s_sentencepiece_keys(tmp_path):
    out = save_gguf(from_pretrained(SPM), tmp_path / "spm.gguf", "F16")
    doc = json.loads((SPM / "tokenizer.json").read_text(encoding="utf-8"))
    vocab, merges = doc["model"]["vocab"], doc["model"]["merges"]
    with open_gguf(out) as f:
        meta = f.metadata
    assert meta["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in meta
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    scores = [float(s) for s in meta["tokenizer.ggml.scores"]]
    assert len(tokens) == len(types) == len(scores) == 768 > len(vocab)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)] and set(types[3:259]) == {6}
    assert set(types[259:len(vocab)]) == {1} and set(types[len(vocab):]) == {5}
    # a token's score: minus the rank of the first merge making it; llama.cpp's best-score-first joins
    # are then transformers' first-listed-first merges
    first = {}
    for rank, (a, b) in enumerate(merges):
        first.setdefault(a + b, len(first) + 1)
    assert all(scores[vocab[t]] == -r for t, r in first.items())
    assert all(scores[i] == 0.0 for i, t in enumerate(tokens) if t not in first)
    assert meta["tokenizer.ggml.add_space_prefix"] is True
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"],
            meta["tokenizer.ggml.unknown_token_id"]) == (1, 2, 0)
    assert meta["tokenizer.ggml.add_bos_token"] is True and meta["tokenizer.ggml.add_eos_token"] is False
    assert meta["tokenizer.chat_template"] == (SPM / "chat_template.jinja").read_text(encoding="utf-8")


def test_the_gemma_fixture_s_tokenizer_puts_no_space_before_the_text(tmp_path):
    out = save_gguf(from_pretrained(GEMMA), tmp_path / "gemma.gguf", "F16")
    with open_gguf(out) as f:
        meta = f.metadata
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    assert tokens[:6] == ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    assert types[:6] == [3, 3, 3, 2, 3, 3] and set(types[6:262]) == {6}
    assert meta["tokenizer.ggml.add_space_prefix"] is False and meta["tokenizer.ggml.add_bos_token"] is True
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"],
            meta["tokenizer.ggml.padding_token_id"], meta["tokenizer.ggml.unknown_token_id"]) == (2, 1, 0, 3)


@pytest.mark.parametrize("edit, space", [(None, True), (_metaspace, False), (_gemma, False), ("gemma", False),
                                         (_user_defined, True)])
def test_ember_s_tokenizer_of_the_written_file_tokenizes_as_the_folder_s(tmp_path, edit, space):
    folder = GEMMA if edit == "gemma" else _copy(tmp_path, edit)
    out = save_gguf(from_pretrained(folder), tmp_path / "spm.gguf", "F16")
    with open_gguf(out) as f:
        assert f.metadata["tokenizer.ggml.add_space_prefix"] is space
    theirs, ours = load_tokenizer(folder), load_gguf_tokenizer(out)
    texts = _texts() + SPECIAL_LINES
    assert [ours.encode(t) for t in texts] == [theirs.encode(t) for t in texts]
    if edit is _user_defined:
        with open_gguf(out) as f:
            assert f.metadata["tokenizer.ggml.token_type"][739] == 4
        assert 739 in ours.encode("call <tool> now")


def test_a_real_sentencepiece_model_s_export_tokenizes_as_the_sentencepiece_library(tmp_path):
    """llama-sp: a tokenizer.model trained by the sentencepiece library and transformers' conversion of it;
    sentencepiece-expected.json holds the library's own ids for the lines."""
    ref = json.loads((SP / "sentencepiece-expected.json").read_text(encoding="utf-8"))
    assert ref["texts"] == _texts()
    want = [[1] + ids for ids in ref["ids"]]
    out = save_gguf(from_pretrained(SP), tmp_path / "sp.gguf", "F16")
    assert [load_tokenizer(SP).encode(t) for t in ref["texts"]] == want  # the folder's tokenizer.json
    assert [load_gguf_tokenizer(out).encode(t) for t in ref["texts"]] == want


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes):
    """(field number, value) of a protobuf message: bytes for length-delimited fields, int or float else."""
    import struct

    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        kind = tag & 7
        if kind == 0:
            value, at = _varint(data, at)
        elif kind == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        elif kind == 5:
            value, at = struct.unpack("<f", data[at:at + 4])[0], at + 4
        else:
            assert kind == 1, f"wire type {kind}"
            value, at = data[at:at + 8], at + 8
        yield tag >> 3, value


def test_the_export_s_tokens_types_and_score_order_are_the_sentencepiece_model_s(tmp_path):
    """The tokenizer.model beside llama-sp's tokenizer.json (sentencepiece's ModelProto: pieces are field 1,
    each with its text 1, score 2 and type 3), read here without the library: the export, made from
    tokenizer.json alone, has its pieces, their types, and scores ordering the pieces llama.cpp joins
    as sentencepiece's scores order them."""
    pieces = []
    for number, value in _fields((SP / "tokenizer.model").read_bytes()):
        if number == 1:
            fields = dict(_fields(value))
            pieces.append((fields[1].decode("utf-8"), fields.get(2, 0.0), fields.get(3, 1)))
    out = save_gguf(from_pretrained(SP), tmp_path / "sp.gguf", "F16")
    with open_gguf(out) as f:
        tokens, types = list(f.metadata["tokenizer.ggml.tokens"]), list(f.metadata["tokenizer.ggml.token_type"])
        scores = [float(x) for x in f.metadata["tokenizer.ggml.scores"]]
    assert len(pieces) == len(tokens) == 640
    assert tokens == [p[0] for p in pieces] and types == [p[2] for p in pieces]
    joined = [i for i, s in enumerate(scores) if s < 0]  # the tokens some merge makes
    assert len(joined) > 300
    assert sorted(joined, key=lambda i: -scores[i]) == sorted(joined, key=lambda i: -pieces[i][1])


def _first(doc):
    _metaspace(doc)
    doc["pre_tokenizer"]["prepend_scheme"] = "first"


def _always(doc):
    _metaspace(doc)
    doc["pre_tokenizer"]["prepend_scheme"] = "always"


def _split(doc):
    _metaspace(doc)
    doc["pre_tokenizer"]["split"] = True


def _one_merge_a_token(doc):  # what the tokenizers library's trainer writes: one merge a token
    made = {}
    for m in doc["model"]["merges"]:
        made.setdefault(m[0] + m[1], m)
    doc["model"]["merges"] = list(made.values())


def _scattered(doc):
    merges = doc["model"]["merges"]
    twice = next(i for i in range(1, len(merges)) if merges[i][0] + merges[i][1] == merges[i - 1][0] + merges[i - 1][1])
    merges.append(merges.pop(twice))


def _no_byte(doc):
    del doc["model"]["vocab"]["<0x0A>"]


def _normalized(doc):
    doc["added_tokens"][1]["normalized"] = True


def _nfkc(doc):
    doc["normalizer"]["normalizers"].insert(0, {"type": "NFKC"})


def _no_fallback(doc):
    doc["model"]["byte_fallback"] = False


@pytest.mark.parametrize("edit, message", [
    (_first, "prepend_scheme 'first'.*llama.cpp puts one there and after every special token"),
    (_always, "prepend_scheme 'always'\\) puts no '▁' before a text that starts with a space"),
    (_split, "splits the text at spaces"),
    (_one_merge_a_token, "merges lack .* which llama.cpp's SentencePiece tokenizer would join"),
    (_scattered, "merges making .* are not listed together"),
    (_no_byte, "lacks 1 of the 256 byte tokens \\(first <0x0A>\\)"),
    (_normalized, "added token '<s>' is matched in the normalized text"),
    (_nfkc, "normalizer step .*NFKC.* has no llama.cpp form"),
    (_no_fallback, "SentencePiece-style BPE \\(a normalizer putting '▁' for spaces\\) without byte fallback"),
])
def test_a_sentencepiece_tokenizer_llama_cpp_would_tokenize_otherwise_is_refused(tmp_path, edit, message):
    export_is_refused_leaving_the_target(_copy(tmp_path, edit), tmp_path, message)


# ---------------------------------------------------------------------------------- llama.cpp
@needs_llama_cpp
@pytest.mark.parametrize("folder", [SPM, GEMMA], ids=["llama", "gemma"])
def test_llama_cpp_tokenizes_and_answers_the_exported_fixture_as_transformers_and_ember(tmp_path, folder):
    _check_with_llama_cpp(folder, "F16", tmp_path, 16, SPECIAL_LINES)


@needs_llama_cpp
@pytest.mark.parametrize("edit, space", [(_metaspace, False), (_gemma, False), (_user_defined, True)])
def test_llama_cpp_tokenizes_each_space_layout_as_transformers(tmp_path, edit, space):
    folder = _copy(tmp_path, edit)
    out = save_gguf(from_pretrained(folder), tmp_path / "t.gguf", "F16")
    texts = _texts() + SPECIAL_LINES
    ref = _llama_cpp_tokens(out, folder, texts, tmp_path, as_file=True)
    same = sum(a == b for a, b in zip(ref["llama_cpp"], ref["transformers"]))
    print(f"\n{edit.__name__}, add_space_prefix {space}: llama.cpp tokenizes {same} of {len(texts)} lines as transformers")
    assert ref["llama_cpp"] == ref["transformers"]
    assert [load_gguf_tokenizer(out).encode(t) for t in texts] == ref["transformers"]


@needs_llama_cpp
def test_llama_cpp_tokenizes_a_real_sentencepiece_model_s_export_as_the_sentencepiece_library(tmp_path):
    ref = json.loads((SP / "sentencepiece-expected.json").read_text(encoding="utf-8"))
    want = [[1] + ids for ids in ref["ids"]]
    out = save_gguf(from_pretrained(SP), tmp_path / "sp.gguf", "F16")
    got = _llama_cpp_tokens(out, SP, ref["texts"], tmp_path, as_file=True)
    same = sum(a == b for a, b in zip(got["llama_cpp"], want))
    print(f"\nllama-sp: llama.cpp tokenizes {same} of {len(want)} lines ({sum(map(len, want))} tokens) as "
          f"sentencepiece {ref['sentencepiece']}")
    assert got["llama_cpp"] == want and got["transformers"] == want
