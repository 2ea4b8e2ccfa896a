"""Issue 20, text data: a folder's tokenizer (through the `tokenizers` library) encodes as
transformers does; documents from .txt / .jsonl; packing, padding, the causal shift and the
masks, by hand on small cases; bad input named by file and line, expected and found."""
import json
from pathlib import Path

import numpy as np
import pytest

from engine.tensor import Tensor
from engine.train import load_csv
from engine.train.text import (
    IGNORE_INDEX,
    TextDataError,
    TokenizerError,
    load_text_data,
    load_tokenizer,
    model_limits,
    read_documents,
    text_data_for_model,
)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-gqa"
X = IGNORE_INDEX


def word_tokenizer(folder: Path, words=("a", "b", "c", "d", "e", "f"), config=True) -> Path:
    """A word-level tokenizer built with the tokenizers library: <pad> 0, <s> 1, </s> 2, <unk> 3,
    then one id per word (4, 5, ...); `<s>` is put in front of every encoding."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({w: 4 + i for i, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if config:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"pad_token": "<pad>", "bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>",
             "unk_token": "<unk>"}))
    return folder


@pytest.fixture
def words(tmp_path):
    return load_tokenizer(word_tokenizer(tmp_path / "tok"))


def write(path: Path, text) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ---- the tokenizer ------------------------------------------------------------------------------
def test_the_fixture_tokenizer_encodes_and_decodes_as_transformers_did():
    expected = json.loads((FIXTURE / "tokenizer_expected.json").read_text())
    tok = load_tokenizer(FIXTURE)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == expected["vocab_size"] == 128 and tok.model_max_length == 64
    for case in expected["single"]:
        assert tok.encode(case["text"]) == case["input_ids"], case["text"]
        assert tok.tokens(case["text"]) == case["tokens"]
        assert tok.decode(case["input_ids"]) == case["decoded"]
    padded = expected["batch_padded"]
    ids = tok.encode_batch(padded["texts"])
    width = max(map(len, ids))
    assert [row + [tok.pad_id] * (width - len(row)) for row in ids] == padded["input_ids"]
    assert [[1] * len(row) + [0] * (width - len(row)) for row in ids] == padded["attention_mask"]


def test_special_tokens_from_special_tokens_map_and_a_file_path(tmp_path):
    folder = word_tokenizer(tmp_path / "t", config=False)
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": "<pad>"}))
    tok = load_tokenizer(folder / "tokenizer.json")
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 2, None)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: eos_token: expected a token of "
                                             r"tokenizer.json's vocabulary, found '<eos>'"):
        load_tokenizer(folder)


def test_a_tokenizer_the_library_cannot_read_is_named(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    write(bad / "tokenizer.json", json.dumps({"version": "1.0", "model": {"type": "NoSuchModel"}}))
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(bad)
    assert str(bad / "tokenizer.json") in str(e.value) and "the tokenizers library cannot read it" in str(e.value)
    write(bad / "tokenizer.json", "{not json")
    with pytest.raises(TokenizerError, match="cannot read it"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="expected a tokenizer.json"):
        load_tokenizer(tmp_path / "nowhere")


# ---- documents ----------------------------------------------------------------------------------
def test_documents_per_file_per_line_folders_and_jsonl(tmp_path):
    write(tmp_path / "a.txt", "a b\n\nc\n")
    assert [d.text for d in read_documents(tmp_path / "a.txt")] == ["a b\n\nc\n"]
    docs = read_documents(tmp_path / "a.txt", per_line=True)
    assert [(d.text, d.line) for d in docs] == [("a b", 1), ("c", 3)]
    write(tmp_path / "b.jsonl", '{"text": "d e"}\n\n{"text": "f", "id": 3}\n')
    docs = read_documents(tmp_path)  # a folder: every .txt / .jsonl file, in name order
    assert [(Path(d.file).name, d.line, d.text) for d in docs] == [
        ("a.txt", None, "a b\n\nc\n"), ("b.jsonl", 1, "d e"), ("b.jsonl", 3, "f")]
    write(tmp_path / "pc.jsonl", '{"prompt": "a b", "completion": "c"}\n')
    (d,) = read_documents(tmp_path / "pc.jsonl")
    assert (d.prompt, d.completion, d.text) == ("a b", "c", None)


# ---- packing, padding, the shift and the masks ------------------------------------------------------
def test_packing_joins_documents_with_eos_and_shifts_by_one(tmp_path, words):
    # ids per line: <s> a b </s> = 1 4 5 2 ; <s> c </s> = 1 6 2 ; <s> d e f </s> = 1 7 8 9 2
    p = write(tmp_path / "c.txt", "a b\nc\nd e f\n")
    data = load_text_data(p, words, block_size=4, per_line=True)
    # stream: 1 4 5 2 1 6 2 1 7 8 9 2 (12 ids): rows of 5 ids overlapping by one
    np.testing.assert_array_equal(data.inputs, [[1, 4, 5, 2], [1, 6, 2, 1], [7, 8, 9, 0]])
    np.testing.assert_array_equal(data.targets, [[4, 5, 2, 1], [6, 2, 1, 7], [8, 9, 2, X]])
    np.testing.assert_array_equal(data.attention_mask, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    assert data.inputs.dtype == np.int64 and data.targets.dtype == np.int64
    assert data.target_tokens == 11 and data.documents == 3 and data.packing


def test_padding_one_row_per_document_with_an_attention_mask(tmp_path, words):
    p = write(tmp_path / "c.txt", "a b\nc\nd e f\n")
    data = load_text_data(p, words, packing=False, per_line=True)  # block: the longest (5 ids) - 1
    np.testing.assert_array_equal(data.inputs, [[1, 4, 5, 0], [1, 6, 0, 0], [1, 7, 8, 9]])
    np.testing.assert_array_equal(data.targets, [[4, 5, 2, X], [6, 2, X, X], [7, 8, 9, 2]])
    np.testing.assert_array_equal(data.attention_mask, [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    wide = load_text_data(p, words, block_size=6, packing=False, per_line=True)
    np.testing.assert_array_equal(wide.inputs[1], [1, 6, 0, 0, 0, 0])
    np.testing.assert_array_equal(wide.targets[1], [6, 2, X, X, X, X])
    cut = load_text_data(p, words, block_size=2, packing=False, per_line=True, truncate=True)
    np.testing.assert_array_equal(cut.inputs, [[1, 4], [1, 6], [1, 7]])
    np.testing.assert_array_equal(cut.targets, [[4, 5], [6, 2], [7, 8]])


def test_prompt_tokens_are_not_learnt(tmp_path, words):
    p = write(tmp_path / "pc.jsonl", '{"prompt": "a b", "completion": "c d"}\n{"prompt": "e", "completion": "f"}\n')
    # <s> a b | c d </s> = 1 4 5 | 6 7 2 ; <s> e | f </s> = 1 8 | 9 2
    data = load_text_data(p, words, packing=False)
    np.testing.assert_array_equal(data.inputs, [[1, 4, 5, 6, 7], [1, 8, 9, 0, 0]])
    np.testing.assert_array_equal(data.targets, [[X, X, 6, 7, 2], [X, 9, 2, X, X]])
    np.testing.assert_array_equal(data.attention_mask, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    packed = load_text_data(p, words, block_size=3)
    # stream 1 4 5 6 7 2 1 8 9 2, learnt: the completions and their eos
    np.testing.assert_array_equal(packed.inputs, [[1, 4, 5], [6, 7, 2], [1, 8, 9]])
    np.testing.assert_array_equal(packed.targets, [[X, X, 6], [7, 2, X], [X, 9, 2]])


def test_split_keeps_the_rows_and_their_masks(tmp_path, words):
    p = write(tmp_path / "c.txt", "\n".join(["a b c", "d", "e f", "a", "b c d e"]) + "\n")
    data = load_text_data(p, words, packing=False, per_line=True)
    train, valid = data.split(0.6, seed=1)
    assert (len(train), len(valid)) == (3, 2)
    rows = {tuple(r) for r in data.inputs}
    for part in (train, valid):
        for x, m in zip(part.inputs, part.attention_mask):
            assert tuple(x) in rows
            k = int(np.flatnonzero((data.inputs == x).all(axis=1))[0])
            np.testing.assert_array_equal(m, data.attention_mask[k])


def test_right_padding_leaves_the_logits_of_real_tokens_unchanged(tmp_path):
    from engine.models import from_pretrained

    model = from_pretrained(FIXTURE).valid()
    tok = load_tokenizer(FIXTURE)
    p = write(tmp_path / "c.txt", "the cat sat on the mat.\na dog.\n")
    data = text_data_for_model(model, p, tok, packing=False, per_line=True)
    padded = model.forward(Tensor.from_data(data.inputs)).numpy()
    masked = model.forward(Tensor.from_data(data.inputs), Tensor.from_data(data.attention_mask)).numpy()
    for r in range(len(data)):
        k = int(data.attention_mask[r].sum())
        alone = model.forward(Tensor.from_data(data.inputs[r:r + 1, :k])).numpy()[0]
        np.testing.assert_allclose(padded[r, :k], alone, atol=1e-5)
        np.testing.assert_allclose(masked[r, :k], alone, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------------------
def test_ids_the_model_has_no_embedding_for_name_the_line(tmp_path, words):
    p = write(tmp_path / "c.txt", "a b\nc f\n")  # f is id 9
    with pytest.raises(TextDataError) as e:
        load_text_data(p, words, block_size=4, per_line=True, vocab_size=8)
    msg = str(e.value)
    assert msg.startswith(f"{p}, line 2: ") and "token id 9 ('f')" in msg and "8 token embeddings" in msg
    assert "the tokenizer does not match the model" in msg and e.value.line == 2


def test_the_fixture_tokenizer_against_a_smaller_model(tmp_path):
    from engine import nn

    tok = load_tokenizer(FIXTURE)
    small = nn.EmbeddingConfig(40, 8).init()
    assert model_limits(small) == (40, None)
    p = write(tmp_path / "c.txt", "the cat\n")
    with pytest.raises(TextDataError, match=r"c.txt, line 1: .*token id 58 \('▁the'\).*40 token embeddings"):
        text_data_for_model(small, p, tok, block_size=4, per_line=True)


def test_empty_and_non_utf8_files(tmp_path, words):
    with pytest.raises(TextDataError, match=r"e.txt: expected text, found an empty file"):
        load_text_data(write(tmp_path / "e.txt", ""), words, block_size=4)
    with pytest.raises(TextDataError, match=r"w.txt: expected text, found only white space"):
        load_text_data(write(tmp_path / "w.txt", "\n  \n"), words, block_size=4)
    with pytest.raises(TextDataError) as e:
        load_text_data(write(tmp_path / "l.txt", b"a b\nc \xff d\n"), words, block_size=4)
    assert str(e.value) == (f"{tmp_path / 'l.txt'}, line 2: expected UTF-8 text, found the byte 0xff that is not "
                            f"UTF-8 at byte offset 6")


def test_jsonl_lines_that_are_not_json_or_lack_the_field(tmp_path, words):
    p = write(tmp_path / "d.jsonl", '{"text": "a"}\n{"text": "b"\n')
    with pytest.raises(TextDataError, match=r"d.jsonl, line 2: expected a JSON object, found invalid JSON"):
        load_text_data(p, words, block_size=4)
    p = write(tmp_path / "d.jsonl", '{"text": "a"}\n\n{"txt": "b"}\n')
    with pytest.raises(TextDataError, match=r"d.jsonl, line 3: expected a 'text' field \(as on line 1\), found no "
                                            r"'text' among keys \['txt'\]"):
        load_text_data(p, words, block_size=4)
    p = write(tmp_path / "d.jsonl", '{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(TextDataError, match=r"line 2: expected 'prompt' and 'completion' fields \(as on line 1\)"):
        load_text_data(p, words, block_size=4)
    p = write(tmp_path / "d.jsonl", '{"body": "a"}\n')
    with pytest.raises(TextDataError, match=r"line 1: expected a 'text' field, or 'prompt' and 'completion' fields, "
                                            r"found keys \['body'\]"):
        load_text_data(p, words, block_size=4)
    p = write(tmp_path / "d.jsonl", '[1, 2]\n')
    with pytest.raises(TextDataError, match=r"line 1: expected a JSON object, found a JSON list"):
        load_text_data(p, words, block_size=4)
    p = write(tmp_path / "d.jsonl", '{"text": 7}\n')
    with pytest.raises(TextDataError, match=r"line 1: field 'text': expected a string, found int 7"):
        load_text_data(p, words, block_size=4)


def test_rows_longer_than_the_model_positions_say_the_limit(tmp_path, words):
    p = write(tmp_path / "c.txt", "a b c d e f a b c d\nc\n")
    with pytest.raises(TextDataError, match=r"c.txt: block size 16 is longer than the model's 8 positions "
                                            r"\(max_position_embeddings\): choose a block size of at most 8"):
        load_text_data(p, words, block_size=16, max_positions=8)
    with pytest.raises(TextDataError, match=r"c.txt, line 1: the document has 12 tokens, 11 positions after the "
                                            r"shift, more than the model's 8 positions .*set a block size of at most 8"):
        load_text_data(p, words, packing=False, per_line=True, max_positions=8)
    with pytest.raises(TextDataError, match=r"line 1: the document has 12 tokens, 11 positions after the shift, more "
                                            r"than the block size 6: raise the block size \(the model allows up to 8\)"):
        load_text_data(p, words, block_size=6, packing=False, per_line=True, max_positions=8)
    assert load_text_data(p, words, block_size=8, per_line=True, max_positions=8).inputs.shape == (2, 8)


def test_the_model_is_unchanged_by_data_that_does_not_fit(tmp_path):
    from engine.models import from_pretrained

    model = from_pretrained(FIXTURE)
    before = {k: p.val().numpy().copy() for k, p in model.named_params()}
    p = write(tmp_path / "c.txt", "the cat\n")
    with pytest.raises(TextDataError, match="at most 64"):
        text_data_for_model(model, p, load_tokenizer(FIXTURE), block_size=65)
    assert all(np.array_equal(before[k], p.val().numpy()) for k, p in model.named_params())


# ---- integer inputs stay integer --------------------------------------------------------------------
def test_csv_token_ids_stay_int64_and_decimals_stay_float(tmp_path):
    ds = load_csv(write(tmp_path / "ids.csv", "t0,t1,label\n5,7,1\n3,-2,0\n"))
    assert ds.inputs.dtype == np.int64 and ds.inputs.tolist() == [[5, 7], [3, -2]]
    ds = load_csv(write(tmp_path / "f.csv", "x0,x1,label\n5,7.0,1\n3,2,0\n"))
    assert ds.inputs.dtype == np.float32
