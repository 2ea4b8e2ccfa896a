"""GGUF export of a model opened from a Hugging Face folder: its tokenizer.json converted to llama.cpp's
tokenizer keys (engine/models/gguf_vocab.py).

Default suite: the committed tiny Qwen2 chat model with a real byte-level BPE tokenizer
(tests/fixtures/hf/qwen2-bpe, made by make_bpe_fixture.py) exported; the keys read back; Ember's
tokenizer rebuilt from the written GGUF tokenizes the varied lines of test_gguf_smollm2.py as the
folder's tokenizer.json does; the tokenizers llama.cpp would tokenize otherwise refused, naming what
was found, with nothing written. With llama-cpp-python and transformers in the oracle venv (skipped,
saying so, without them): llama.cpp tokenizes those lines and the rendered chat prompt as
transformers does, and its greedy tokens after the prompt are Ember's on the same file (F16; for Q8_0,
whose activations llama.cpp quantizes too, its logits within 10 % and its first token among Ember's
top three). The same on the real
SmolLM2-135M-Instruct folder (~/.cache/ember/smollm2-135m-instruct, or $EMBER_SMOLLM2_FOLDER;
skipped without it), F16 and Q8_0.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from engine.models import from_pretrained  # noqa: E402
from engine.models.generate import generate  # noqa: E402
from engine.models.gguf_export import save_gguf  # noqa: E402
from engine.models.gguf_vocab import folder_gguf_tokenizer  # noqa: E402
from engine.models.hf_folder import PretrainedError  # noqa: E402
from engine.store.gguf_file import open_gguf  # noqa: E402
from engine.store.gguf_pre import LLAMA3_SPLIT  # noqa: E402
from engine.tensor import Tensor  # noqa: E402
from engine.train.gguf_tokenizer import gguf_chat_template, load_gguf_tokenizer  # noqa: E402
from engine.train.tokenizer import load_tokenizer  # noqa: E402
from tests.engine.models.test_gguf_export import ORACLE, needs_llama_cpp  # noqa: E402
from tests.engine.models.test_gguf_smollm2 import _texts  # noqa: E402

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
BPE = HF / "qwen2-bpe"
SMOLLM2 = Path(os.environ.get("EMBER_SMOLLM2_FOLDER", Path.home() / ".cache" / "ember" / "smollm2-135m-instruct"))
HERE = Path(__file__).resolve().parent
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def copy_edited(source: Path, tmp_path: Path, edit=None, name: str = "m") -> Path:
    """A copy of the fixture folder `source` whose tokenizer.json `edit(doc)` changed in place."""
    folder = tmp_path / name
    shutil.copytree(source, folder)
    if edit is not None:
        doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        edit(doc)
        (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def _copy(tmp_path: Path, edit=None, name: str = "m") -> Path:
    return copy_edited(BPE, tmp_path, edit, name)


def export_is_refused_leaving_the_target(folder: Path, tmp_path: Path, message: str) -> None:
    """Exporting the folder's model as GGUF over an existing file is refused with `message`,
    naming its tokenizer.json, and the file is left as it was."""
    model = from_pretrained(folder)
    target = tmp_path / "keep.gguf"
    target.write_bytes(b"old")
    with pytest.raises(PretrainedError, match=message) as err:
        save_gguf(model, target, "F16")
    assert err.value.where == str(folder / "tokenizer.json")
    assert target.read_bytes() == b"old"


# ---------------------------------------------------------------------------------- the keys
def test_the_fixture_s_tokenizer_becomes_llama_cpp_s_keys_and_tokenizes_as_before(tmp_path):
    out = save_gguf(from_pretrained(BPE), tmp_path / "bpe.gguf", "F16")
    doc = json.loads((BPE / "tokenizer.json").read_text(encoding="utf-8"))
    size = len(doc["model"]["vocab"])
    with open_gguf(out) as f:
        meta = f.metadata
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen2"
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    assert len(tokens) == len(types) == 384 > size  # the model's rows: ids the tokenizer lacks are padding
    assert tokens[size:] == [f"[PAD{i}]" for i in range(size, 384)] and set(types[size:]) == {5}
    by_text = {t: i for i, t in enumerate(tokens)}
    specials = [by_text[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert [types[i] for i in specials] == [3, 3, 3] and set(types[:size]) - {3} == {1}
    assert list(meta["tokenizer.ggml.merges"]) == [m if isinstance(m, str) else " ".join(m)
                                                   for m in doc["model"]["merges"]]
    assert meta["tokenizer.ggml.eos_token_id"] == by_text["<|im_end|>"]
    assert meta["tokenizer.ggml.padding_token_id"] == by_text["<|endoftext|>"]
    assert "tokenizer.ggml.bos_token_id" not in meta
    assert meta["tokenizer.ggml.add_bos_token"] is False and meta["tokenizer.ggml.add_eos_token"] is False
    assert meta["tokenizer.chat_template"] == (BPE / "chat_template.jinja").read_text(encoding="utf-8")
    assert meta["general.name"] == "qwen2-bpe"
    # Ember's tokenizer rebuilt from the GGUF keys tokenizes as the folder's tokenizer.json
    theirs, ours = load_tokenizer(BPE), load_gguf_tokenizer(out)
    texts = _texts()
    assert [ours.encode(t) for t in texts] == [theirs.encode(t) for t in texts]


def test_llama_3_s_design_and_a_bos_adding_template_are_recognised(tmp_path):
    def llama3(doc):
        doc["normalizer"] = None
        doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA3_SPLIT
        doc["model"]["ignore_merges"] = True
        doc["post_processor"] = {"type": "TemplateProcessing", "special_tokens": {},
                                 "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                            {"Sequence": {"id": "A", "type_id": 0}}], "pair": []}
    folder = _copy(tmp_path, llama3)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["bos_token"] = "<|im_start|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    meta = folder_gguf_tokenizer(folder, 384).metadata
    assert meta["tokenizer.ggml.pre"] == "llama-bpe"
    assert meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["tokenizer.ggml.tokens"][meta["tokenizer.ggml.bos_token_id"]] == "<|im_start|>"
    config["add_bos_token"] = False  # tokenizer_config.json's word wins, as in llama.cpp's converter
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert folder_gguf_tokenizer(folder, 384).metadata["tokenizer.ggml.add_bos_token"] is False


def _sentencepiece(doc):
    doc["model"]["byte_fallback"] = True


def _unknown_split(doc):
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\s+"


def _ignore_merges(doc):
    doc["model"]["ignore_merges"] = True


def _lowercase(doc):
    doc["normalizer"] = {"type": "Lowercase"}


def _lstrip(doc):
    doc["added_tokens"][1]["lstrip"] = True


def _unigram(doc):
    doc["model"]["type"] = "Unigram"


def _bert(doc):
    doc["post_processor"] = {"type": "BertProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1]}


@pytest.mark.parametrize("edit, message", [
    (_sentencepiece, "byte-fallback BPE lacks 256 of the 256 byte tokens"),
    (_unknown_split, "pre-tokenizer \\(split\\(.*is not one whose llama.cpp name Ember knows"),
    (_ignore_merges, "ignore_merges=True, but llama.cpp's 'qwen2'"),
    (_lowercase, "normalizer .*Lowercase.* has no llama.cpp form"),
    (_lstrip, "added token '<\\|im_start\\|>' has lstrip"),
    (_unigram, "expected a BPE tokenizer .* found 'Unigram'"),
    (_bert, "post-processor 'BertProcessing' has no llama.cpp form"),
])
def test_a_tokenizer_llama_cpp_would_tokenize_otherwise_is_refused_and_nothing_is_written(tmp_path, edit, message):
    export_is_refused_leaving_the_target(_copy(tmp_path, edit), tmp_path, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.gguf", "m"]


def test_folders_without_a_convertible_tokenizer_are_refused_naming_it(tmp_path):
    with pytest.raises(PretrainedError, match="SentencePiece-style BPE \\(a Metaspace pre-tokenizer"):
        save_gguf(from_pretrained(HF / "llama-gqa"), tmp_path / "x.gguf")  # Llama 2's design (word-level here)
    with pytest.raises(PretrainedError, match="expected a tokenizer.json in the model's folder"):
        save_gguf(from_pretrained(HF / "qwen2"), tmp_path / "x.gguf")
    folder = _copy(tmp_path)
    model = from_pretrained(folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.model").write_bytes(b"")
    with pytest.raises(PretrainedError, match="it has a SentencePiece tokenizer.model"):
        save_gguf(model, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


# ---------------------------------------------------------------------------------- llama.cpp
def _llama_cpp_tokens(gguf: Path, folder: Path, texts: list[str], tmp_path: Path, as_file: bool = False) -> dict:
    (tmp_path / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    run = subprocess.run([str(ORACLE), str(HERE / "llama_cpp_tokenize_oracle.py"), str(gguf), str(folder),
                          str(tmp_path / "texts.json")] + (["file"] if as_file else []),
                         capture_output=True, text=True, timeout=600)
    if run.returncode != 0 and "No module named" in run.stderr:
        pytest.skip(f"the oracle venv lacks a package: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _llama_cpp_greedy(gguf: Path, prompt: list[int], count: int) -> dict:
    run = subprocess.run([str(ORACLE), str(HERE / "llama_cpp_oracle.py"), str(gguf), json.dumps(prompt), str(count)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _check_with_llama_cpp(folder: Path, qtype: str, tmp_path: Path, count: int, extra=()) -> None:
    out = save_gguf(from_pretrained(folder), tmp_path / f"{folder.name}-{qtype}.gguf", qtype)
    chat = gguf_chat_template(out).render(QUESTION, add_generation_prompt=True).text
    texts = _texts() + list(extra) + [chat]
    ref = _llama_cpp_tokens(out, folder, texts, tmp_path)
    same = sum(a == b for a, b in zip(ref["llama_cpp"], ref["transformers"]))
    print(f"\n{folder.name} {qtype}: llama.cpp tokenizes {same} of {len(texts)} lines "
          f"({sum(map(len, ref['transformers']))} tokens) as transformers")
    assert ref["llama_cpp"] == ref["transformers"]
    assert chat == ref["chat"]  # the chat template went into the file unchanged
    prompt = load_gguf_tokenizer(out).encode(chat)
    assert prompt == ref["transformers"][-1]
    model = from_pretrained(out)
    ours = generate(model, None, prompt, count, temperature=0.0, eos_token_id=[]).token_ids
    theirs = _llama_cpp_greedy(out, prompt, count)
    logits = model.forward(Tensor.from_data(np.array([prompt]), dtype="int64")).numpy()[0, -1]
    gap = np.linalg.norm(np.array(theirs["logits"]) - logits) / np.linalg.norm(logits)
    print(f"{folder.name} {qtype}: llama.cpp's {count} greedy tokens {theirs['ids']}, Ember's {ours}; "
          f"their logits after the prompt within {gap:.2e} of Ember's (relative norm)")
    if qtype == "F16":
        assert theirs["ids"] == ours
    else:  # llama.cpp multiplies Q8_0 blocks by Q8_0-quantized activations: close logits, near-ties may flip
        assert gap <= 0.1 and theirs["ids"][0] in np.argsort(-logits)[:3]


@needs_llama_cpp
@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_llama_cpp_tokenizes_and_answers_the_exported_fixture_as_transformers_and_ember(tmp_path, qtype):
    _check_with_llama_cpp(BPE, qtype, tmp_path, 16)


def _gpt2(doc):
    doc["normalizer"] = None
    doc["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _smollm(doc):
    _gpt2(doc)
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, doc["pre_tokenizer"]]}


def _llama3_bos(doc):
    doc["normalizer"] = None
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA3_SPLIT
    doc["model"]["ignore_merges"] = True
    doc["post_processor"] = {"type": "TemplateProcessing", "special_tokens": {"<|im_start|>": {
        "id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}]}


@needs_llama_cpp
@pytest.mark.parametrize("edit, pre", [(_gpt2, "gpt-2"), (_smollm, "smollm"), (_llama3_bos, "llama-bpe")])
def test_llama_cpp_tokenizes_each_recognised_design_as_transformers(tmp_path, edit, pre):
    """The fixture's vocabulary and merges under each other pre-tokenizer Ember recognises (and a
    post-processor adding a bos token): llama.cpp, given the name Ember chose, splits as transformers
    running that tokenizer.json (not AutoTokenizer, which gives a Qwen2 folder Qwen2's pre-tokenizer
    whatever its file says)."""
    folder = _copy(tmp_path, edit)
    if pre == "llama-bpe":
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|im_start|>"}))
    out = save_gguf(from_pretrained(folder), tmp_path / "t.gguf", "F16")
    with open_gguf(out) as f:
        assert f.metadata["tokenizer.ggml.pre"] == pre
        assert f.metadata["tokenizer.ggml.add_bos_token"] is (pre == "llama-bpe")
    texts = _texts()
    ref = _llama_cpp_tokens(out, folder, texts, tmp_path, as_file=True)
    assert all(ids[0] == 1 for ids in ref["transformers"]) is (pre == "llama-bpe")
    same = sum(a == b for a, b in zip(ref["llama_cpp"], ref["transformers"]))
    print(f"\n{pre}: llama.cpp tokenizes {same} of {len(texts)} lines as transformers")
    assert ref["llama_cpp"] == ref["transformers"]
    assert [load_gguf_tokenizer(out).encode(t) for t in texts] == ref["transformers"]


@needs_llama_cpp
@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").is_file(), reason=f"no SmolLM2 folder at {SMOLLM2} "
                                                                       f"(set EMBER_SMOLLM2_FOLDER)")
@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_llama_cpp_tokenizes_and_answers_the_exported_smollm2_folder_as_transformers_and_ember(tmp_path, qtype):
    _check_with_llama_cpp(SMOLLM2, qtype, tmp_path, 12)


def test_a_malformed_tokenizer_json_is_a_pretrained_error_never_a_crash(tmp_path):
    import copy
    import random

    base = json.loads((BPE / "tokenizer.json").read_text(encoding="utf-8"))
    base["post_processor"] = {"type": "TemplateProcessing", "special_tokens": {}, "pair": [],
                              "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}]}

    def places(node, at=()):
        yield at
        items = node.items() if isinstance(node, dict) else enumerate(node[:3]) if isinstance(node, list) else ()
        for k, v in items:
            if k != "vocab":
                yield from places(v, at + (k,))
    where = [p for p in places(base) if p]
    junk = [None, 1, -1, "x", [], {}, [1, 2], {"a": 1}, True, 1.5]
    rng = random.Random(47)
    folder = _copy(tmp_path)
    refused = 0
    for _ in range(300):
        doc = copy.deepcopy(base)
        at = rng.choice(where)
        node = doc
        for k in at[:-1]:
            node = node[k]
        node[at[-1]] = rng.choice(junk)
        (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
        try:
            folder_gguf_tokenizer(folder, 384)
        except PretrainedError as exc:
            assert exc.where in (str(folder / "tokenizer.json"), str(folder))
            refused += 1
    assert refused > 100  # most mutations break something llama.cpp needs
