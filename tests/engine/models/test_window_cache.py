"""Generation with a sliding window's bounded key/value cache (issue 47): the windowed layers of
Mistral, Qwen2 (`use_sliding_window`), Gemma 2 and Gemma 3 keep only their last `window - 1`
positions, the global layers every position, and generation stays exact far past the window.

The fixtures are tests/fixtures/hf/{gemma2,gemma3,mistral-swa,qwen2-swa} (window 4, made with
transformers by make_window_fixtures.py). The references are transformers' greedy tokens of a
left-padded batch 50 tokens past its prompts (greedy_batch.npz, `--batch-greedy`) and Ember's
forward without a cache (every position recomputed, checked against transformers' logits with a
left-padded mask in test_gemma.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn
from engine.autodiff.tape import no_recording
from engine.models import from_pretrained
from engine.models.generate import estimate_generation, generate

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
WINDOWED = ["gemma2", "gemma3", "mistral-swa", "qwen2-swa"]


def _exp(name):
    with np.load(HF / name / "expected.npz") as data:
        return {k: data[k] for k in data.files}


def _batch(name):
    """greedy_batch.npz: three prompts of 5, 3 and 1 tokens (one left-padded batch whose first row is
    expected.npz's prompt) and transformers' greedy continuation of each, 50 new tokens with its cache."""
    with np.load(HF / name / "greedy_batch.npz") as d:
        rows = [r[m.astype(bool)].tolist() for r, m in zip(d["input_ids"], d["attention_mask"])]
        return rows, d["greedy"][:, d["input_ids"].shape[1]:].tolist()


def _longer(name, tmp_path, positions):
    """The fixture with `max_position_embeddings` raised (rope and weights unchanged)."""
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = positions
    (folder / "config.json").write_text(json.dumps(cfg))
    return from_pretrained(folder)


def _step_by_step(model, rows, steps):
    """Greedy decoding of the left-padded `rows` as `generate` runs it (a prompt pass, then one
    token a step, the rotary positions counted from each row's first real token), each step's
    last logits with the caches and from the forward without one over the whole sequence; and per
    step each layer's held positions, held key elements and buffer bytes."""
    model = model.valid()
    width = max(len(r) for r in rows)
    b = len(rows)
    ids = np.zeros((b, width), dtype=np.int64)
    mask = np.zeros((b, width + steps), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    mask[:, width:] = 1
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    caches = nn.KVCache.layers(len(model.layers), capacity=width + steps)
    seq, feed, out = ids, ids, []
    with no_recording():
        for step in range(steps):
            n = seq.shape[1]
            cached = model.forward(Tensor.from_data(feed), mask[:, :n], caches,
                                   Tensor.from_data(pos[:, n - feed.shape[1]:n])).numpy()[:, -1]
            full = model.forward(Tensor.from_data(seq), mask[:, :n], None, Tensor.from_data(pos[:, :n])).numpy()[:, -1]
            held = [(c.length, c.held, int(np.prod(c.keys.shape)), c.nbytes) for c in caches]
            out.append((cached, full, held))
            feed = np.argmax(full, axis=-1).astype(np.int64).reshape(b, 1)
            seq = np.concatenate([seq, feed], axis=1)
    return out


# ---------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", WINDOWED)
def test_cached_greedy_equals_transformers_and_the_uncached_for_a_left_padded_batch(name):
    """50 new tokens (55 positions, the window 4) of a left-padded batch: with the bounded cache every
    row equals transformers' greedy tokens and Ember's generation without a cache."""
    rows, want = _batch(name)
    assert [len(r) for r in rows] == [5, 3, 1] and [len(w) for w in want] == [50, 50, 50]
    assert want[0][:10] == _exp(name)["greedy"][0, 5:].tolist()  # the unpadded row: expected.npz's greedy
    model = from_pretrained(HF / name)
    cached = generate(model, None, rows, 50, temperature=0.0, eos_token_id=[])
    full = generate(model, None, rows, 50, temperature=0.0, eos_token_id=[], use_cache=False)
    assert cached.ids == want
    assert full.ids == want


@pytest.mark.parametrize("name", WINDOWED)
def test_every_step_s_logits_equal_the_forward_without_a_cache(name):
    """The last position's logits of each of 40 steps of a left-padded batch, with the caches and
    from the whole sequence without one, agree within 1e-5."""
    rows, _ = _batch(name)
    for step, (cached, full, _held) in enumerate(_step_by_step(from_pretrained(HF / name), rows, 40)):
        np.testing.assert_allclose(cached, full, atol=1e-5, rtol=0, err_msg=f"step {step}")


# ---------------------------------------------------------------------------------- bounded memory
@pytest.mark.parametrize("name", WINDOWED)
def test_windowed_layers_hold_at_most_the_window_while_global_layers_grow(name):
    """Counted in elements: after every step a windowed layer holds min(length, window - 1)
    positions (rows x kv heads x positions x head_dim key elements) and its buffer stops growing;
    a global layer holds every position."""
    rows, _ = _batch(name)
    model = from_pretrained(HF / name)
    windows = [layer.self_attn.window for layer in model.layers]
    cfg = model.config
    per_position = len(rows) * cfg.num_key_value_heads * cfg.head_dim
    records = _step_by_step(model, rows, 40)
    for step, (_c, _f, held) in enumerate(records):
        for w, (length, n, elements, _nbytes) in zip(windows, held):
            assert length == 5 + step
            assert n == (length if w is None else min(length, w - 1))
            assert elements == n * per_position
    last = records[-1][2]
    settled = records[10][2]
    for w, now, then in zip(windows, last, settled):
        if w is not None:
            assert now[3] == then[3]  # the windowed buffer's bytes: the same at steps 10 and 39
        else:
            assert now[3] >= now[0] * per_position * 2 * 4  # keys and values, float32, every position


def test_two_hundred_tokens_with_a_bounded_cache(tmp_path):
    """Gemma 3 (local, global, local layers; two rope bases) with its positions raised to 256:
    200 greedy tokens of a left-padded batch equal the generation without a cache, and after 200
    steps its local layers hold 3 positions each where its global layer holds 204."""
    model = _longer("gemma3", tmp_path, 256)
    rows, want = _batch("gemma3")
    cached = generate(model, None, rows[:2], 200, temperature=0.0, eos_token_id=[])
    full = generate(model, None, rows[:2], 200, temperature=0.0, eos_token_id=[], use_cache=False)
    assert cached.ids == full.ids and cached.ids[0][:50] == want[0]
    held = _step_by_step(model, rows[:2], 200)[-1][2]
    assert [(length, n) for length, n, _e, _b in held] == [(204, 3), (204, 204), (204, 3)]


def test_the_memory_estimate_counts_a_window_s_bounded_buffer():
    """estimate_generation: a windowed layer's cache is at most 2 * (window - 1) + prompt positions,
    a global layer's every position (Gemma 2: one of each, window 4)."""
    model = from_pretrained(HF / "gemma2")
    cfg = model.config
    per_position = 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # keys and values, float32
    est = estimate_generation(model, batch=1, prompt_length=5, max_new_tokens=50)
    assert est.parts["key/value cache"] == per_position * ((2 * 3 + 5) + 55)
