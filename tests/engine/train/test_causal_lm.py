"""Issue 20, the causal-LM task in the training loop: the masked next-token loss against a
NumPy reference, gradient accumulation equal to one big batch, the warm-up's values, clipping
by the global norm, perplexity and tokens/s in the events, the RunSpec wiring, and the tiny
Llama of the fixtures fine-tuned with LoRA on q/v until its loss on the corpus halves."""
import math
import time
from pathlib import Path

import numpy as np
import pytest

from engine import Device, nn, optim
from engine.autodiff import no_recording
from engine.models import from_pretrained
from engine.module.group import ParamGroup
from engine.module.lora import Lora, apply_lora
from engine.optim import GradientsParams
from engine.tensor import Tensor
from engine.train import Learner, TrainingConfig, build_task, events as ev
from engine.train.losses import IGNORE_INDEX, causal_lm_loss
from engine.train.run_spec import ConstantLrConfig, DataSettings, RunSpec, make_data
from engine.train.text import TextDataError, TextDataset, load_tokenizer, text_data_for_model

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-gqa"
X = IGNORE_INDEX


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_the_masked_loss_and_its_gradient_equal_a_numpy_reference():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
    targets = np.array([[3, X, 7, 0, X], [X, X, 10, 2, 5]], dtype=np.int64)
    x = Tensor.from_data(logits).require_grad()
    loss = causal_lm_loss(x, Tensor.from_data(targets))
    keep = targets != X
    lp = log_softmax(logits.astype(np.float64))
    ref = -lp[keep, targets[keep]].mean()
    assert abs(float(loss) - ref) < 1e-6
    grad = x.grad(loss.backward()).numpy()
    want = np.exp(lp)
    want[keep, targets[keep]] -= 1.0
    want = want * keep[..., None] / keep.sum()
    np.testing.assert_allclose(grad, want, atol=1e-6)
    # the engine's CrossEntropyLoss with -100 as its pad token gives the same mean over kept rows
    ce = nn.CrossEntropyLossConfig(pad_tokens=[X]).init()
    same = ce.forward(Tensor.from_data(logits.reshape(10, 11)), Tensor.from_data(targets.reshape(10)))
    assert abs(float(same) - float(loss)) < 1e-6
    none = causal_lm_loss(Tensor.from_data(logits), Tensor.from_data(np.full((2, 5), X)))
    assert float(none) == 0.0


def corpus(n=300, seed=0) -> list[str]:
    rng = np.random.default_rng(seed)
    subjects = ["the cat", "the dog", "a bird", "the fish"]
    verbs = ["sat on", "looked at", "ran to"]
    objects = ["the mat.", "the log.", "a box."]
    return [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}" for _ in range(n)]


def padded_rows(tmp_path, lines):
    p = tmp_path / "rows.txt"
    p.write_text("\n".join(lines) + "\n")
    model = from_pretrained(FIXTURE)
    return text_data_for_model(model, p, load_tokenizer(FIXTURE), packing=False, per_line=True)


def one_sgd_step(data, batch_size, accumulation, max_grad_norm=None):
    """The fixture Llama after one SGD step (lr 1: the update is minus the gradient), and the step's loss."""
    model = from_pretrained(FIXTURE)
    before = {k: p.val().numpy().copy() for k, p in model.named_params()}
    cfg = TrainingConfig(num_epochs=1, batch_size=batch_size, shuffle=False, grad_accumulation=accumulation,
                         max_grad_norm=max_grad_norm)
    result = Learner(model, optim.SgdConfig().init(), lr=1.0, train=data, kind="causal-lm", config=cfg).run()
    assert result.status == "finished", result.error
    assert len(result.step_losses) == 1
    after = dict(result.model.named_params())
    return {k: after[k].val().numpy() - before[k] for k in before}, result.step_losses[0]


def test_accumulated_micro_batches_give_the_gradient_of_one_big_batch(tmp_path):
    # rows of very different lengths: micro-batches keep 4 and 26 target tokens
    lines = ["a cat.", "the dog.", "the cat sat on the mat and the dog ran to a box.",
             "a small model learns very fast, but the large one is slow!"]
    data = padded_rows(tmp_path, lines)
    kept = (data.targets != X).sum(axis=1)
    assert kept[:2].sum() * 3 < kept[2:].sum()
    big, big_loss = one_sgd_step(data, 4, 1)
    acc, acc_loss = one_sgd_step(data, 2, 2)
    assert abs(acc_loss - big_loss) < 1e-6
    for k in big:
        np.testing.assert_allclose(acc[k], big[k], atol=1e-6, err_msg=k)
    # and a mean of the two micro-batches' means would not be the same
    model = from_pretrained(FIXTURE).train()
    parts = []
    for rows in (slice(0, 2), slice(2, 4)):
        out = model.forward(Tensor.from_data(data.inputs[rows]).autodiff())
        loss = causal_lm_loss(out, Tensor.from_data(data.targets[rows]))
        g = GradientsParams.from_grads(loss.backward(), model)
        parts.append({k: g.get(p.id).numpy() for k, p in model.named_params()})
    worst = max(float(np.abs(-(parts[0][k] + parts[1][k]) / 2 - big[k]).max()) for k in big)
    assert worst > 1e-4


def test_clipping_scales_all_gradients_together_to_the_global_norm(tmp_path):
    data = padded_rows(tmp_path, ["the cat sat on the mat.", "a dog ran to a box."])
    free, _ = one_sgd_step(data, 2, 1)
    norm = math.sqrt(sum(float((d.astype(np.float64) ** 2).sum()) for d in free.values()))
    assert norm > 0.05
    clipped, _ = one_sgd_step(data, 2, 1, max_grad_norm=0.05)
    coef = 0.05 / (norm + 1e-6)
    for k in free:
        np.testing.assert_allclose(clipped[k], free[k] * coef, atol=1e-7, err_msg=k)
    after = math.sqrt(sum(float((d.astype(np.float64) ** 2).sum()) for d in clipped.values()))
    assert abs(after - 0.05) < 1e-5
    loose, _ = one_sgd_step(data, 2, 1, max_grad_norm=norm * 2)  # above the norm: unchanged
    for k in free:
        np.testing.assert_allclose(loose[k], free[k], atol=1e-7)
    with pytest.raises(ValueError, match="max_grad_norm must be greater than 0"):
        TrainingConfig(max_grad_norm=0.0)


def lr_events(lr, warmup, steps):
    task = build_task("spirals", n_train=steps * 4, n_valid=4)
    seen = []
    Learner(nn.LinearConfig(2, 2).init(), optim.SgdConfig().init(), lr=lr, task=task,
            config=TrainingConfig(num_epochs=1, batch_size=4, warmup_steps=warmup),
            listeners=[lambda e: seen.append(e.lr) if isinstance(e, ev.LearningRate) else None]).run()
    return seen


def test_the_warm_up_is_linear_then_the_schedule_given():
    np.testing.assert_allclose(lr_events(0.1, 4, 6), [0.025, 0.05, 0.075, 0.1, 0.1, 0.1], rtol=1e-12)
    linear = optim.LinearLrSchedulerConfig(0.1, 0.0, 10)
    np.testing.assert_allclose(lr_events(linear, 2, 5), [0.05, 0.1, 0.1, 0.09, 0.08], rtol=1e-9)
    np.testing.assert_allclose(lr_events(ConstantLrConfig(0.2), 0, 2), [0.2, 0.2])
    with pytest.raises(ValueError, match="no initial learning rate to warm up to"):
        lr_events(optim.NoamLrSchedulerConfig(1.0), 3, 2)


def test_events_carry_perplexity_and_tokens_per_second_and_count_optimizer_steps(tmp_path):
    data = padded_rows(tmp_path, corpus(10))
    seen = []
    cfg = TrainingConfig(num_epochs=1, batch_size=2, grad_accumulation=2, shuffle=False)
    result = Learner(from_pretrained(FIXTURE), optim.AdamConfig().init(), lr=1e-3, train=data, valid=data,
                     kind="causal-lm", config=cfg, listeners=[seen.append]).run()
    assert result.status == "finished", result.error
    started = next(e for e in seen if isinstance(e, ev.Started))
    assert started.steps_per_epoch == 3  # 5 batches of 2 rows, 2 batches a step
    assert len([e for e in seen if isinstance(e, ev.StepLoss)]) == 3
    for kind in (ev.EpochMetrics, ev.ValidationMetrics):
        m = next(e for e in seen if isinstance(e, kind)).metrics
        assert set(m) == {"loss", "perplexity", "accuracy", "tokens_per_second"}
        assert abs(m["perplexity"] - math.exp(m["loss"])) < 1e-9 * m["perplexity"]
        assert m["tokens_per_second"] > 0 and 0.0 <= m["accuracy"] <= 1.0
    # the validation loss is the mean over every kept token of the set, whatever the batches
    with no_recording():
        out = result.model.valid().forward(Tensor.from_data(data.inputs))
        whole = float(causal_lm_loss(out, Tensor.from_data(data.targets)))
    valid = next(e for e in seen if isinstance(e, ev.ValidationMetrics)).metrics
    assert abs(valid["loss"] - whole) < 1e-5


def test_a_run_spec_chooses_causal_lm_with_its_text_settings(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("\n".join(corpus(40)) + "\n")
    settings = DataSettings("causal-lm", str(p), 0.25, tokenizer=str(FIXTURE), block_size=16, packing=True)
    spec = RunSpec(settings, "Adam", optim.AdamConfig(), "constant", ConstantLrConfig(1e-3),
                   TrainingConfig(num_epochs=1, grad_accumulation=2, warmup_steps=3, max_grad_norm=1.0))
    back = RunSpec.from_json(spec.to_json())
    assert back == spec and back.training.grad_accumulation == 2 and back.data.block_size == 16
    model = from_pretrained(FIXTURE)
    train, valid, kind, name = make_data(back.data, seed=0, model=model)
    assert kind == "causal-lm" and name == "c.txt" and isinstance(train, TextDataset)
    assert train.inputs.shape[1] == 16 and len(train) + len(valid) == len(make_data(back.data, 0)[0]) + len(
        make_data(back.data, 0)[1])
    too_long = DataSettings("causal-lm", str(p), tokenizer=str(FIXTURE), block_size=100)
    with pytest.raises(TextDataError, match="block size 100 is longer than the model's 64 positions"):
        make_data(too_long, seed=0, model=model)
    with pytest.raises(ValueError, match="tokenizer: the task is 'causal-lm'"):
        DataSettings("causal-lm", str(p))
    with pytest.raises(ValueError, match="expected a .txt or .jsonl file for causal-lm"):
        DataSettings("causal-lm", str(FIXTURE / "config.json"), tokenizer=str(FIXTURE))


def test_lora_on_q_v_fine_tunes_the_tiny_llama_until_its_corpus_loss_halves(tmp_path):
    """Must-show 1, first half: from_pretrained, LoRA on the query/value projections, the
    Learner with warm-up and clipping, a generated corpus of short repetitive sentences."""
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(corpus(300)) + "\n")
    base = from_pretrained(FIXTURE)
    Device("cpu").seed(0)  # the adapters' `a` factors are drawn from the device's generator
    lora = Lora(8, 16.0).set_param_group(ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$"))
    model = apply_lora(base, lora)
    trainable = [k for k, prm in model.named_params() if prm.is_require_grad()]
    assert len(trainable) == 8 and all(".lora." in k and (".query." in k or ".value." in k) for k in trainable)
    data = text_data_for_model(model, p, load_tokenizer(FIXTURE), block_size=32, per_line=True)

    def corpus_loss(m):
        with no_recording():
            out = m.valid().forward(Tensor.from_data(data.inputs))
            return float(causal_lm_loss(out, Tensor.from_data(data.targets)))

    frozen = {k: prm.val().numpy().copy() for k, prm in model.named_params() if not prm.is_require_grad()}
    before = corpus_loss(model)
    cfg = TrainingConfig(num_epochs=5, batch_size=16, seed=0, warmup_steps=5, max_grad_norm=1.0)
    started = time.perf_counter()
    result = Learner(model, optim.AdamConfig().init(), lr=2e-2, train=data, kind="causal-lm", config=cfg).run()
    seconds = time.perf_counter() - started
    assert result.status == "finished", result.error
    after = corpus_loss(result.model)
    assert after < before / 2, (before, after, seconds)
    trained = dict(result.model.named_params())
    assert all(np.array_equal(frozen[k], trained[k].val().numpy()) for k in frozen)  # only the adapters moved
    perplexity = result.history[-1]["train"]["perplexity"]
    assert perplexity < math.exp(before)


def test_the_learner_refuses_ids_past_the_models_vocabulary_before_any_step(tmp_path):
    from engine.models.llama import LlamaConfig, LlamaForCausalLM
    from engine.train.text import load_text_data

    p = tmp_path / "c.txt"
    p.write_text("the cat sat on the mat.\n")
    data = load_text_data(p, load_tokenizer(FIXTURE), block_size=8, per_line=True)  # no limits given
    small = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=16))
    before = {k: prm.val().numpy().copy() for k, prm in small.named_params()}
    seen = []
    result = Learner(small, optim.SgdConfig().init(), lr=1.0, train=data, kind="causal-lm",
                     config=TrainingConfig(num_epochs=1, batch_size=2), listeners=[seen.append]).run()
    assert result.status == "failed"
    failed = next(e for e in seen if isinstance(e, ev.Failed))
    assert "c.txt: row 0, position 1: input token id 58 is out of range for the model's 40 token embeddings" in \
        failed.message and "the tokenizer does not match the model" in failed.message
    assert not any(isinstance(e, ev.StepLoss) for e in seen)
    assert all(np.array_equal(before[k], prm.val().numpy()) for k, prm in result.model.named_params())
    long_rows = load_text_data(p, load_tokenizer(FIXTURE), block_size=32, per_line=True)
    big = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, max_position_embeddings=16))
    result = Learner(big, optim.SgdConfig().init(), lr=1.0, train=long_rows, kind="causal-lm",
                     config=TrainingConfig(num_epochs=1, batch_size=2)).run()
    assert result.status == "failed" and "choose a block size of at most 16" in result.error


def test_a_resumed_run_continues_the_warm_up(tmp_path):
    task = build_task("spirals", n_train=16, n_valid=4)

    def run(epochs, resume=None):
        seen = []
        cfg = TrainingConfig(num_epochs=epochs, batch_size=4, warmup_steps=6, checkpoint_every=1,
                             checkpoint_dir=str(tmp_path / "ck"), resume_from=resume)
        Learner(nn.LinearConfig(2, 2).init(), optim.SgdConfig().init(), lr=0.6, task=task, config=cfg,
                listeners=[lambda e: seen.append(e.lr) if isinstance(e, ev.LearningRate) else None]).run()
        return seen

    whole = run(3)
    np.testing.assert_allclose(whole[:7], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.6], rtol=1e-12)
    np.testing.assert_allclose(run(3, str(tmp_path / "ck" / "epoch-1")), whole[4:], rtol=1e-12)
