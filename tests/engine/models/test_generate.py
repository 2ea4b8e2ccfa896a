"""engine.models.generate: greedy generation with the key/value cache equals transformers' greedy
`generate` on the committed tiny folders (tests/fixtures/hf/<folder>/generate_expected.json, made
by tests/fixtures/hf/make_generate_fixtures.py) and equals recomputing the whole sequence each step;
the cache's logits equal the full forward's at every step; sampling is seeded; top-k / top-p as
transformers defines them; stop tokens and strings; left-padded batches; streaming and
cancelling; the errors a user can hit."""
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn
from engine.autodiff.tape import no_recording
from engine.models import from_pretrained, generate
from engine.models.generate import GenerationError, stream, warp_logits

tokenizers = pytest.importorskip("tokenizers")

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
FOLDERS = ["llama-gqa", "llama-tied", "mistral", "qwen2", "gpt2"]
_MODELS = {}


def _model(name):
    if name not in _MODELS:
        _MODELS[name] = from_pretrained(HF / name)
    return _MODELS[name]


class _Tok:
    """A tokenizer as engine.train.text.TextTokenizer presents one: the folder's special ids."""

    def __init__(self, folder, eos_id=2, pad_id=0):
        self.tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.eos_id, self.pad_id = eos_id, pad_id

    def encode(self, text):
        return self.tokenizer.encode(text).ids

    def decode(self, ids, skip_special_tokens=True):
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _tok():
    return _Tok(HF / "llama-gqa")


@pytest.mark.parametrize("name", FOLDERS)
def test_greedy_equals_transformers_generate(name):
    exp = json.loads((HF / name / "generate_expected.json").read_text())
    model = _model(name)
    tok = _tok() if name == "llama-gqa" else None
    assert len(exp["cases"]) == 4
    for case in exp["cases"]:
        batched = case.get("batch", False)
        if tok is not None:  # the text, encoded by the folder's tokenizer, is the prompt transformers had
            prompt = case["text"]
            assert [tok.encode(t) for t in (prompt if batched else [prompt])] == case["prompt_ids"]
        else:
            prompt = case["prompt_ids"] if batched else case["prompt_ids"][0]
        r = generate(model, tok, prompt, exp["max_new_tokens"], temperature=0, stop=[exp["eos_token_id"]])
        assert r.ids == case["new_ids"], (name, case)
        for ids, reason in zip(r.ids, r.finish_reasons):
            assert reason == ("stop" if ids[-1] == exp["eos_token_id"] else "length")
        if tok is not None:
            assert r.texts == [tok.decode(ids) for ids in case["new_ids"]]


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2", "gpt2"])
def test_greedy_with_cache_equals_recomputing_the_sequence(name):
    model = _model(name)
    for prompt in ([5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11]):
        cached = generate(model, None, prompt, 30, temperature=0)
        full = generate(model, None, prompt, 30, temperature=0, use_cache=False)
        assert cached.token_ids == full.token_ids
        assert len(cached.token_ids) == 30 and cached.finish_reasons == ["length"]


def _step_logits(model, n_layers, ids, steps, mask=None):
    """(cached, full) logits of the last position at each step of feeding `ids` then `steps`."""
    model = model.valid()
    cache = nn.KVCache.layers(n_layers)
    seq = np.asarray(ids, dtype=np.int64)
    got, want = [], []
    with no_recording():
        out = model.forward(Tensor.from_data(seq), mask, cache=cache).numpy()
        full = model.forward(Tensor.from_data(seq), mask).numpy()
        np.testing.assert_allclose(out, full, atol=1e-5, rtol=0)  # the prompt: every position
        for t in steps:
            nxt = np.full((seq.shape[0], 1), t, dtype=np.int64)
            seq = np.concatenate([seq, nxt], axis=1)
            if mask is not None:
                mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
            got.append(model.forward(Tensor.from_data(nxt), mask, cache=cache).numpy()[:, -1])
            want.append(model.forward(Tensor.from_data(seq), mask).numpy()[:, -1])
    assert all(c.length == seq.shape[1] for c in cache)
    return np.stack(got), np.stack(want)


@pytest.mark.parametrize("name", FOLDERS)
def test_cache_logits_equal_full_forward_at_every_step(name):
    model = _model(name)
    n_layers = len(model.layers) if hasattr(model, "layers") else len(model.h)
    steps = [int(t) for t in np.random.default_rng(0).integers(3, 128, 20)]
    got, want = _step_logits(model, n_layers, [[5, 6, 7, 8]], steps)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    if name != "gpt2":  # a padded batch (rotary positions numbered alike on both paths)
        mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=np.int64)
        got, want = _step_logits(model, n_layers, [[0, 0, 7, 8], [5, 6, 7, 8]], steps[:8], mask)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama-gqa", "llama-tied", "gpt2"])
def test_the_head_is_the_parameter_itself_and_gives_the_forwards_last_logits(name):
    # the language-model head is multiplied as the parameter stores it (a transposed view of
    # the file's [vocab, hidden] tensor, or the tied embedding's): copying it to C order cost
    # 65 ms a call on the benchmark Llama, a millisecond per token of a 64-token generation
    from engine.models.generate import _Head, _inference_model
    from engine.tensor import raw

    model = _inference_model(_model(name))
    head = _Head(model)
    param = model.lm_head.weight if model.lm_head is not None else (
        model.embed_tokens.weight if hasattr(model, "embed_tokens") else model.wte.weight)
    assert np.shares_memory(head.weight, raw.array(param.val()))
    vocab = head.weight.shape[1]
    assert head.weight.shape[0] < vocab  # [hidden, vocab], also for the tied table
    ids = Tensor.from_data(np.array([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]], dtype=np.int64))
    with no_recording():
        got = head(ids, None, None)
        want = model.forward(ids).numpy()[:, -1, :]
    assert got.shape == (2, vocab)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_left_padded_batch_gives_each_row_what_it_gives_alone():
    tok = _tok()
    texts = ["hello", "the model is a large one", "a"]
    model = _model("llama-gqa")
    batch = generate(model, tok, texts, 16, temperature=0)
    assert batch.batched and len(batch.text) == 3
    for i, t in enumerate(texts):
        alone = generate(model, tok, t, 16, temperature=0)
        assert batch.ids[i] == alone.token_ids and batch.texts[i] == alone.text
        assert batch.prompt_ids[i] == tok.encode(t)
    gpt2 = _model("gpt2")  # learned positions: a row's count its real tokens
    rows = [[5, 6], [9, 8, 7, 6, 5, 4], [40, 41, 42]]
    batch = generate(gpt2, None, rows, 12, temperature=0)
    assert batch.ids == [generate(gpt2, None, r, 12, temperature=0).token_ids for r in rows]


def test_seeded_sampling_is_reproducible():
    model, tok = _model("llama-gqa"), _tok()
    a = generate(model, tok, "hello world", 24, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    b = generate(model, tok, "hello world", 24, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    c = generate(model, tok, "hello world", 24, temperature=0.9, top_k=40, top_p=0.95, seed=8)
    assert a.text == b.text and a.token_ids == b.token_ids
    assert c.token_ids != a.token_ids
    greedy = generate(model, tok, "hello world", 24, temperature=0)
    assert a.token_ids != greedy.token_ids  # it did sample


def test_top_k_1_equals_greedy():
    model = _model("gpt2")
    greedy = generate(model, None, [5, 6, 7], 20, temperature=0)
    for seed in (0, 1):
        assert generate(model, None, [5, 6, 7], 20, temperature=1.3, top_k=1, seed=seed).token_ids == greedy.token_ids


def test_warp_logits_top_p_top_k_temperature_on_a_hand_made_distribution():
    p = np.array([0.05, 0.5, 0.15, 0.3])
    logits = np.log(p)
    keep = lambda x: set(np.flatnonzero(np.isfinite(x)).tolist())  # noqa: E731
    # top_p: a token goes once the tokens above it hold top_p (transformers' TopPLogitsWarper)
    assert keep(warp_logits(logits, top_p=0.75)) == {1, 3}  # 0.5 + 0.3 hold 0.75: 0.15 and 0.05 go
    assert keep(warp_logits(logits, top_p=0.85)) == {1, 3, 2}
    assert keep(warp_logits(logits, top_p=0.45)) == {1}  # 0.5 alone holds 0.45
    assert keep(warp_logits(logits, top_p=0.55)) == {1, 3}
    assert keep(warp_logits(logits, top_p=0.01)) == {1}  # at least one token stays
    assert keep(warp_logits(logits, top_p=1.0)) == {0, 1, 2, 3}
    kept = warp_logits(logits, top_p=0.75)
    np.testing.assert_allclose(kept[[1, 3]], logits[[1, 3]])  # kept logits unchanged
    # top_k keeps the k largest, ties with the k-th included
    assert keep(warp_logits(logits, top_k=2)) == {1, 3}
    assert keep(warp_logits(np.array([1.0, 2.0, 2.0, 0.0]), top_k=2)) == {1, 2}
    assert keep(warp_logits(np.array([1.0, 2.0, 1.0, 0.0]), top_k=2)) == {0, 1, 2}
    # temperature divides before top_p: a flatter distribution keeps more
    assert keep(warp_logits(logits, temperature=4.0, top_p=0.75)) == {1, 2, 3}
    np.testing.assert_allclose(warp_logits(logits, temperature=2.0), logits / 2.0)
    # batched rows are warped one by one
    two = warp_logits(np.stack([logits, logits[::-1]]), top_p=0.75)
    assert keep(two[0]) == {1, 3} and keep(two[1]) == {0, 2}


def test_sampling_draws_only_from_the_nucleus():
    model = _model("gpt2")
    with no_recording():
        logits = model.valid().forward(Tensor.from_data(np.array([[5, 6, 7]]))).numpy()[0, -1]
    nucleus = set(np.flatnonzero(np.isfinite(warp_logits(logits, top_p=0.3))).tolist())
    firsts = {generate(model, None, [5, 6, 7], 1, top_p=0.3, seed=s).token_ids[0] for s in range(30)}
    assert firsts <= nucleus and len(nucleus) < 128


def test_stop_tokens_and_strings():
    model, tok = _model("llama-gqa"), _tok()
    # eos by default (the tokenizer's eos_id): transformers' answer for this prompt ends at eos 2
    r = generate(model, tok, "the quick brown fox", 24, temperature=0)
    assert r.token_ids == [29, 2] and r.finish_reasons == ["stop"]
    greedy = generate(model, tok, "hello world", 24, temperature=0)
    assert greedy.finish_reasons == ["length"] and len(greedy.token_ids) == 24
    stop_id = greedy.token_ids[5]
    first = greedy.token_ids.index(stop_id)
    r = generate(model, tok, "hello world", 24, temperature=0, stop=[stop_id])
    assert r.token_ids == greedy.token_ids[:first + 1] and r.finish_reasons == ["stop"]
    # a string that is one token stops at that token; a longer one once the text holds it
    piece = tok.tokenizer.id_to_token(stop_id)
    assert generate(model, tok, "hello world", 24, temperature=0, stop=piece).token_ids == r.token_ids
    words = greedy.text.split()
    target = words[2]
    r = generate(model, tok, "hello world", 24, temperature=0, stop=[target])
    assert target in r.text and r.finish_reasons == ["stop"]
    assert target not in tok.decode(r.token_ids[:-1])  # the token completing it is the last one
    assert r.token_ids == greedy.token_ids[:len(r.token_ids)]
    # a batch: each row stops on its own
    b = generate(model, tok, ["the quick brown fox", "hello world"], 24, temperature=0)
    assert b.ids == [[29, 2], greedy.token_ids] and b.finish_reasons == ["stop", "length"]


def test_streaming_callback_and_cancel():
    model, tok = _model("llama-gqa"), _tok()
    whole = generate(model, tok, "hello world", 20, temperature=0)
    s = stream(model, tok, "hello world", 20, temperature=0)
    tokens = list(s)
    assert [t.id for t in tokens] == whole.token_ids and [t.step for t in tokens] == list(range(20))
    assert "".join(t.text for t in tokens) == whole.text and s.result.token_ids == whole.token_ids
    seen = []
    r = generate(model, tok, "hello world", 20, temperature=0, on_token=seen.append)
    assert [t.id for t in seen] == r.token_ids and "".join(t.text for t in seen) == r.text
    # cancel: a callable checked before each step
    count = []
    r = generate(model, tok, "hello world", 20, temperature=0, on_token=count.append, cancel=lambda: len(count) >= 3)
    assert r.token_ids == whole.token_ids[:3] and r.finish_reasons == ["cancelled"] and r.cancelled
    # or a threading.Event set from another thread (here: by the callback)
    ev = threading.Event()
    r = generate(model, tok, "hello world", 20, temperature=0, cancel=ev, on_token=lambda t: t.step == 4 and ev.set())
    assert r.token_ids == whole.token_ids[:5] and r.cancelled
    # a consumer that stops iterating closes the stream: the result keeps what came
    s = stream(model, tok, "hello world", 20, temperature=0)
    for t in s:
        if t.step == 1:
            break
    s.close()
    assert s.result.token_ids == whole.token_ids[:2] and s.result.finish_reasons == ["cancelled"]


def test_generation_runs_on_a_worker_thread_and_records_nothing():
    model = _model("gpt2").train()  # autodiff on: generate uses valid() and records nothing
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", generate(model, None, [5, 6, 7], 10, temperature=0)))
    t.start()
    t.join()
    assert out["r"].token_ids == generate(_model("gpt2"), None, [5, 6, 7], 10, temperature=0).token_ids
    assert out["r"].new_tokens == 10 and out["r"].tokens_per_second > 0


def test_errors():
    model, tok = _model("llama-gqa"), _tok()
    with pytest.raises(GenerationError, match="empty"):
        generate(model, tok, "", 5)
    with pytest.raises(GenerationError, match="empty"):
        generate(model, tok, [], 5)
    with pytest.raises(GenerationError, match="prompt 1 is empty"):
        generate(model, tok, ["hi", ""], 5)
    with pytest.raises(GenerationError, match="no tokens"):
        generate(model, tok, [[5], []], 5)
    with pytest.raises(GenerationError, match="70 tokens, longer than the model's 64 positions"):
        generate(model, tok, [5] * 70, 5)
    with pytest.raises(GenerationError, match="max_new_tokens 60 would pass the model's 64 positions after the "
                                              "prompt's 10 tokens: at most 54 new tokens"):
        generate(model, tok, [5] * 10, 60)
    assert len(generate(model, tok, [5] * 10, 54, temperature=0, stop=[]).token_ids) <= 54  # the limit itself runs
    with pytest.raises(GenerationError, match="outside the model's vocabulary 0..127"):
        generate(model, tok, [5, 300], 5)
    with pytest.raises(GenerationError, match="no tokenizer"):
        generate(model, None, "hello", 5)
    with pytest.raises(GenerationError, match="max_new_tokens must be a positive int"):
        generate(model, tok, "hello", 0)
    with pytest.raises(GenerationError, match="temperature"):
        generate(model, tok, "hello", 5, temperature=-1)
    with pytest.raises(GenerationError, match="top_k"):
        generate(model, tok, "hello", 5, top_k=0)
    with pytest.raises(GenerationError, match="top_p"):
        generate(model, tok, "hello", 5, top_p=1.5)
    with pytest.raises(GenerationError, match="expected a causal language model"):
        generate(nn.LinearConfig(2, 2).init(), tok, "hello", 5)
    gpt2 = _model("gpt2")
    with pytest.raises(GenerationError, match="at most 4 new tokens"):
        generate(gpt2, None, [5] * 60, 5)


@pytest.mark.slow
def test_after_lora_fine_tuning_generation_continues_a_training_prompt_as_the_corpus_does(tmp_path):
    """Must-show 1, second half: the tiny Llama of the fixtures, LoRA on the attention's four
    projections, trained on a generated corpus (each subject always continues the same way) with
    a cosine-annealed learning rate until its loss falls by half; greedy generation then
    continues each subject as the corpus does, each token ahead of the next-best by a clear
    margin, and a seeded sample repeats."""
    from engine import Device, optim
    from engine.module.group import ParamGroup
    from engine.module.lora import Lora, apply_lora
    from engine.train import Learner, TrainingConfig
    from engine.train.losses import causal_lm_loss
    from engine.train.text import load_tokenizer, text_data_for_model

    endings = {"the cat": "sat on the mat.", "the dog": "ran to the log.", "a bird": "looked at a box."}
    subjects = list(endings)
    lines = [f"{s} {endings[s]}" for s in np.random.default_rng(0).choice(subjects, 200)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    tok = load_tokenizer(HF / "llama-gqa")
    Device("cpu").seed(0)  # the adapters' `a` factors
    lora = Lora(16, 32.0).set_param_group(ParamGroup.from_regex(r"self_attn\.(query|key|value|output)\.weight$"))
    model = apply_lora(from_pretrained(HF / "llama-gqa"), lora)
    data = text_data_for_model(model, tmp_path / "corpus.txt", tok, block_size=32, per_line=True)

    def corpus_loss(m):
        with no_recording():
            return float(causal_lm_loss(m.valid().forward(Tensor.from_data(data.inputs)), Tensor.from_data(data.targets)))

    before = [generate(model, tok, s, 16, temperature=0).text for s in subjects]
    assert all(b.strip() != endings[s] for b, s in zip(before, subjects))
    loss_before = corpus_loss(model)
    # LoRA on q/v alone stalls at a loss of 0.4-0.6 (the corpus's floor is ~0.12) with " on" and
    # "." after "the cat sat" within a logit of each other; and at a constant lr 1e-2 Adam's path
    # wanders, so that NumPy's passes and the compiled kernels (last bits apart) ended at losses of
    # 0.26 and 0.18, one of them continuing "a bird" with "log.". On all four projections, with
    # the lr annealed to 1e-4, both reach 0.168 and every expected token leads by 3+ logits.
    cfg = TrainingConfig(num_epochs=30, batch_size=8, seed=0, warmup_steps=5, max_grad_norm=1.0)
    steps = cfg.num_epochs * -(-len(data.inputs) // cfg.batch_size)
    lr = optim.lr_scheduler.CosineAnnealingLrSchedulerConfig(1e-2, steps, 1e-4)
    result = Learner(model, optim.AdamConfig().init(), lr=lr, train=data, kind="causal-lm", config=cfg).run()
    assert result.status == "finished", result.error
    trained = result.model
    assert corpus_loss(trained) < loss_before / 2
    for s in subjects:
        r = generate(trained, tok, s, 16, temperature=0)
        assert r.text.strip() == endings[s] and r.finish_reasons == ["stop"]  # then eos, as every line ends
        prompt, ids = tok.encode(s), tok.encode(f"{s} {endings[s]}")
        with no_recording():
            logits = trained.valid().forward(Tensor.from_data(np.array([ids]))).numpy()[0]
        for i in range(len(prompt) - 1, len(ids) - 1):  # the logits that choose each expected token
            rest = np.delete(logits[i], ids[i + 1])
            assert logits[i, ids[i + 1]] - rest.max() > 1.0, (s, i)
    for s in subjects:
        a = generate(trained, tok, s, 16, temperature=0.5, top_p=0.6, seed=3)
        assert generate(trained, tok, s, 16, temperature=0.5, top_p=0.6, seed=3).text == a.text


@pytest.mark.parametrize("adapter", ["llama-lora-qv", "llama-dora"])
def test_an_adapted_model_generates_as_its_merged_weights_and_stays_unchanged(adapter):
    from engine.models import load_peft_adapter

    model = load_peft_adapter(from_pretrained(HF / "llama-gqa"), HF.parent / "peft" / adapter)  # peft-written
    tuned = generate(model, None, [5, 6, 7], 20, temperature=0)
    assert tuned.token_ids == generate(model.materialize(), None, [5, 6, 7], 20, temperature=0).token_ids
    assert tuned.token_ids != generate(_model("llama-gqa"), None, [5, 6, 7], 20, temperature=0).token_ids
    assert model.layers[0].self_attn.query.weight.reparameterization is not None  # the model is unchanged


def test_generate_is_callable_whichever_import_comes_first():
    import subprocess
    import sys

    code = ("import engine.models.generate\n"  # the submodule first: Python sets engine.models.generate to it
            "from engine.models import from_pretrained, generate\n"
            f"m = from_pretrained({str(HF / 'gpt2')!r})\n"
            "print(generate(m, None, [5, 6, 7], 3, temperature=0).token_ids)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[3]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(generate(_model("gpt2"), None, [5, 6, 7], 3, temperature=0).token_ids)
