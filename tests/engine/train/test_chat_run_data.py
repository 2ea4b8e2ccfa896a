"""Conversation data through a training run (issue 45 item 3): `make_data` tells a conversation
`.jsonl` (OpenAI messages, ShareGPT, Alpaca) from text, renders it with the chat template of the
tokenizer's folder, padded or packed, and the causal-lm step trains a packed batch to the loss of
the same conversations padded."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.models import from_pretrained
from engine.train.chat_data import load_conversation_data
from engine.train.chat_template import read_chat_template
from engine.train.conversations import conversation_file_format
from engine.train.data import DataLoader
from engine.train.learner import default_step
from engine.train.run_spec import DataSettings, make_data
from engine.train.text import TextDataError
from engine.train.tokenizer import load_tokenizer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CONVERSATIONS = FIXTURES / "conversations"
FORMATS = {"messages.jsonl": ("messages", 3), "sharegpt.jsonl": ("sharegpt", 2), "alpaca.jsonl": ("alpaca", 3)}


def chat_llama_folder(dest: Path) -> Path:
    """The tiny Llama fixture with a ChatML template (SmolLM2's) and 512 positions (the rotary
    encoding has no weights: the fixture's own weights serve)."""
    shutil.copytree(FIXTURES / "hf" / "llama-gqa", dest)
    config = json.loads((dest / "config.json").read_text())
    config["max_position_embeddings"] = 512
    (dest / "config.json").write_text(json.dumps(config))
    shutil.copy(FIXTURES / "chat_templates" / "smollm2-instruct.jinja", dest / "chat_template.jinja")
    return dest


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return chat_llama_folder(tmp_path_factory.mktemp("chat") / "tiny-chat-llama")


def test_conversation_files_are_told_from_text_by_their_first_record(tmp_path):
    for file, (fmt, _n) in FORMATS.items():
        assert conversation_file_format(CONVERSATIONS / file) == fmt
    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "hello"}\n')
    pc = tmp_path / "pc.jsonl"
    pc.write_text('{"prompt": "a", "completion": "b"}\n')
    plain = tmp_path / "p.txt"
    plain.write_text("hello\n")
    assert [conversation_file_format(p) for p in (text, pc, plain)] == [None, None, None]
    assert conversation_file_format(CONVERSATIONS) == "alpaca"  # a folder: its first .jsonl file


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("file", list(FORMATS))
def test_make_data_renders_each_format_with_the_folders_template(file, packing, folder):
    fmt, n = FORMATS[file]
    settings = DataSettings(task="causal-lm", file=str(CONVERSATIONS / file), tokenizer=str(folder), block_size=512,
                            packing=packing, valid_fraction=0.5)
    train, valid, kind, name = make_data(settings, seed=0)
    assert kind == "causal-lm" and name == file
    whole = load_conversation_data(CONVERSATIONS / file, read_chat_template(folder), load_tokenizer(folder), 512,
                                   packing=packing)
    got = train.target_tokens + (valid.target_tokens if valid is not None else 0)
    assert got == whole.target_tokens > 0  # the assistant's tokens only, none lost to the split
    assert (train.segment_ids is not None) == packing
    how = "packed into" if packing else "padded rows"
    assert train.note.startswith(f"conversation data ({fmt} format): {n} conversations, {whole.target_tokens} "
                                 f"assistant tokens learnt") and how in train.note


def test_truncation_is_counted_and_refusal_names_the_line(folder):
    settings = DataSettings(task="causal-lm", file=str(CONVERSATIONS / "messages.jsonl"), tokenizer=str(folder),
                            block_size=200, packing=True)
    with pytest.raises(TextDataError, match=r"messages\.jsonl, line 1: the conversation has 216 tokens"):
        make_data(settings, seed=0)
    settings.truncate = True
    train, _valid, _kind, _name = make_data(settings, seed=0)
    assert "2 conversations truncated at the block size" in train.note


def test_a_folder_without_a_chat_template_is_a_clear_error(tmp_path):
    plain = tmp_path / "base"
    shutil.copytree(FIXTURES / "hf" / "llama-gqa", plain)
    settings = DataSettings(task="causal-lm", file=str(CONVERSATIONS / "sharegpt.jsonl"), tokenizer=str(plain),
                            block_size=512)
    with pytest.raises(TextDataError, match=r"sharegpt\.jsonl: the file is conversation data \(sharegpt format\).*"
                                            r"tokenizer folder .*base has none.*instruct model"):
        make_data(settings, seed=0)


def test_the_causal_lm_step_on_a_packed_batch_gives_the_padded_loss(folder):
    model = from_pretrained(folder)
    args = (CONVERSATIONS / "messages.jsonl", read_chat_template(folder), load_tokenizer(folder), 512)
    padded, packed = load_conversation_data(*args), load_conversation_data(*args, packing=True)
    assert len(packed) == 2 and len(padded) == 3
    step = default_step("causal-lm")
    losses = []
    for data in (padded, packed):
        batch = next(iter(DataLoader(data, len(data), shuffle=False)))
        losses.append(float(step(model, batch).loss.numpy()))
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0])
    # the same packed rows without their segments (conversations seeing each other) give another loss
    batch = next(iter(DataLoader(packed, len(packed), shuffle=False)))
    batch.segment_ids = batch.position_ids = None
    assert abs(float(step(model, batch).loss.numpy()) - losses[0]) > 1e-4
    assert isinstance(batch.inputs, Tensor) and np.isfinite(losses).all()


def test_a_gguf_file_as_the_tokenizer_renders_with_its_own_template():
    """A model opened from a .gguf has its tokenizer and chat template in the file (issue 46): the run
    reads the file's, not a template in the folder beside it."""
    pytest.importorskip("gguf")
    gguf_file = FIXTURES / "gguf" / "tiny-qwen2-q8.gguf"
    settings = DataSettings(task="causal-lm", file=str(CONVERSATIONS / "messages.jsonl"), tokenizer=str(gguf_file),
                            block_size=512, packing=True, valid_fraction=0.5)
    train, valid, _kind, _name = make_data(settings, seed=0)
    whole = load_conversation_data(CONVERSATIONS / "messages.jsonl", read_chat_template(gguf_file),
                                   load_tokenizer(gguf_file), 512, packing=True)
    assert train.target_tokens + (valid.target_tokens if valid is not None else 0) == whole.target_tokens > 0
