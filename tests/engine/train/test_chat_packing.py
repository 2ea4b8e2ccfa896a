"""Packing conversations (issue 45 item 3): several conversations in one row, each attending only
to itself (a block-diagonal causal mask) with its positions restarting at 0, so that a packed row's
logits and gradients are those of its conversations trained one by one."""
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn
from engine.models import from_pretrained
from engine.models.llama import LlamaConfig, build
from engine.train.chat_data import load_conversation_data, pack_rows
from engine.train.chat_template import ChatTemplate
from engine.train.data import DataLoader
from engine.train.losses import IGNORE_INDEX, cross_entropy
from engine.train.text import TextDataError, check_fits
from engine.train.tokenizer import load_tokenizer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HF = FIXTURES / "hf"
CONVERSATIONS = FIXTURES / "conversations"


def test_the_segment_mask_is_block_diagonal_and_positions_restart_at_each_segment():
    seg = np.array([[1, 1, 1, 2, 2, 3, 0, 0]])
    m = nn.generate_segment_mask(seg).numpy()[0]
    for i in range(8):
        for j in range(8):
            assert m[i, j] == (seg[0, i] != seg[0, j])
    assert nn.segment_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    with pytest.raises(ValueError, match=r"segment_ids: expected int \[batch_size, seq_length\]"):
        nn.generate_segment_mask(np.zeros((2, 3), dtype=np.float32))


def test_pack_rows_puts_every_sequence_whole_in_one_row_that_fits():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=60).tolist()
    bins = pack_rows(lengths, 32)
    seen = sorted(i for b in bins for i in b)
    assert seen == list(range(60))  # each once, never split
    assert all(sum(lengths[i] for i in b) <= 32 for b in bins)
    assert len(bins) < 60 and len(bins) >= -(-sum(lengths) // 32)
    with pytest.raises(ValueError, match="33 positions does not fit a row of 32"):
        pack_rows([3, 33], 32)


def _packed_case(rng, lengths, block, vocab):
    seqs = [rng.integers(3, vocab, size=n) for n in lengths]
    row = np.zeros(block, dtype=np.int64)
    seg = np.zeros(block, dtype=np.int64)
    pos = np.zeros(block, dtype=np.int64)
    at = 0
    for k, s in enumerate(seqs, start=1):
        row[at:at + len(s)], seg[at:at + len(s)], pos[at:at + len(s)] = s, k, np.arange(len(s))
        at += len(s)
    return seqs, row[None], seg[None], pos[None]


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2", "gpt2"])
def test_packed_logits_equal_each_conversations_own(name):
    model = from_pretrained(HF / name).valid()  # GPT-2's dropout off
    vocab = model.config.vocab_size
    seqs, row, seg, pos = _packed_case(np.random.default_rng(1), [9, 13, 6], 32, vocab)
    packed = model.forward(Tensor.from_data(row), position_ids=Tensor.from_data(pos),
                           segment_ids=Tensor.from_data(seg)).numpy()[0]
    # positions derived from the segments when not given (the pads, one run, then count on)
    derived = model.forward(Tensor.from_data(row), segment_ids=Tensor.from_data(seg)).numpy()[0]
    np.testing.assert_array_equal(packed[:28], derived[:28])
    at, worst = 0, 0.0
    for s in seqs:
        alone = model.forward(Tensor.from_data(s[None])).numpy()[0]
        worst = max(worst, float(np.abs(packed[at:at + len(s)] - alone).max()))
        at += len(s)
    assert worst < 1e-5
    # without the segments the later conversations see the earlier ones: the logits differ
    plain = model.forward(Tensor.from_data(row)).numpy()[0]
    assert np.abs(plain[9:22] - packed[9:22]).max() > 1e-3


def _grads(model, loss):
    grads = loss.backward()
    return {name: p.val().grad(grads).numpy() for name, p in model.named_params()}


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2"])  # (GPT-2's dropout would draw differently)
def test_the_packed_rows_gradient_is_the_sum_of_the_conversations(name):
    model = from_pretrained(HF / name).train()
    vocab = model.config.vocab_size
    seqs, row, seg, pos = _packed_case(np.random.default_rng(2), [8, 12, 7], 30, vocab)
    targets = np.full_like(row, IGNORE_INDEX)
    at = 0
    for s in seqs:
        targets[0, at:at + len(s) - 1] = s[1:]
        at += len(s)
    n_total = int((targets != IGNORE_INDEX).sum())
    logits = model.forward(Tensor.from_data(row).autodiff(), position_ids=Tensor.from_data(pos),
                           segment_ids=Tensor.from_data(seg))
    packed = _grads(model, cross_entropy(logits, Tensor.from_data(targets), IGNORE_INDEX) * float(n_total))
    total = None
    for s in seqs:
        out = model.forward(Tensor.from_data(s[None, :-1]).autodiff())
        g = _grads(model, cross_entropy(out, Tensor.from_data(s[None, 1:]), IGNORE_INDEX) * float(len(s) - 1))
        total = g if total is None else {k: total[k] + g[k] for k in total}
    for k in packed:
        scale = max(1.0, float(np.abs(total[k]).max()))
        assert np.abs(packed[k] - total[k]).max() < 1e-5 * scale, k


@pytest.fixture(scope="module")
def chatml():
    return ChatTemplate((FIXTURES / "chat_templates" / "smollm2-instruct.jinja").read_text(),
                        where="smollm2-instruct.jinja")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(HF / "llama-gqa")


@pytest.mark.parametrize("file", ["messages.jsonl", "sharegpt.jsonl", "alpaca.jsonl"])
def test_packed_conversation_rows_hold_the_padded_rows_targets(file, chatml, tokenizer):
    path = CONVERSATIONS / file
    padded = load_conversation_data(path, chatml, tokenizer, block_size=512)
    packed = load_conversation_data(path, chatml, tokenizer, block_size=512, packing=True)
    assert len(packed) < len(padded) and packed.packing and packed.segment_ids is not None
    assert packed.target_tokens == padded.target_tokens
    # each conversation is one segment run: its inputs, targets and positions from 0, as its padded row has them
    got = []
    for r in range(len(packed)):
        for k in range(1, int(packed.segment_ids[r].max()) + 1):
            at = packed.segment_ids[r] == k
            assert packed.position_ids[r][at].tolist() == list(range(int(at.sum())))
            got.append((packed.inputs[r][at].tolist(), packed.targets[r][at].tolist()))
        assert (packed.attention_mask[r] == (packed.segment_ids[r] > 0)).all()
    want = [(padded.inputs[r][padded.attention_mask[r] == 1].tolist(),
             padded.targets[r][padded.attention_mask[r] == 1].tolist()) for r in range(len(padded))]
    assert sorted(got) == sorted(want)


def test_packing_refuses_or_truncates_a_conversation_longer_than_the_block(chatml, tokenizer):
    path = CONVERSATIONS / "messages.jsonl"
    with pytest.raises(TextDataError, match=r"messages\.jsonl, line 1.*215 positions.*more than the block size 200"):
        load_conversation_data(path, chatml, tokenizer, block_size=200, packing=True)
    data = load_conversation_data(path, chatml, tokenizer, block_size=200, packing=True, truncate=True)
    assert data.truncated == 2 and data.inputs.shape[1] == 200  # 215 and 245 positions cut, 154 kept whole
    assert len(data) == 3 and (data.position_ids < 200).all()


def test_batches_carry_the_segments_and_models_without_them_are_refused(chatml, tokenizer):
    data = load_conversation_data(CONVERSATIONS / "messages.jsonl", chatml, tokenizer, block_size=512, packing=True)
    train, valid = data.split(0.5, seed=0)
    assert train.segment_ids.shape == train.inputs.shape
    batch = next(iter(DataLoader(data, 2, shuffle=True, seed=3)))
    order = DataLoader(data, 2, shuffle=True, seed=3).order()[:2]
    np.testing.assert_array_equal(batch.segment_ids.numpy(), data.segment_ids[order])
    np.testing.assert_array_equal(batch.position_ids.numpy(), data.position_ids[order])
    llama = build(LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=8, intermediate_size=8,
                              num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=512))
    check_fits(llama, data)  # the Llama family takes them
    plain = nn.EmbeddingConfig(200, 4).init()
    with pytest.raises(TextDataError, match="forward takes segment_ids.*Embedding does not: turn packing off"):
        check_fits(plain, data)
