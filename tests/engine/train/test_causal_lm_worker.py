"""The Training tab's worker runs a causal-lm RunSpec on a Hugging Face folder's model: the
pre-check uses the next-token loss (not mse), the text is checked against the model as it is
read, and a step limit counts optimizer steps when batches are accumulated."""
from pathlib import Path

import pytest

from engine import optim
from engine.models import from_pretrained
from engine.train import TrainingConfig
from engine.train.preflight import TrainingSetupError
from engine.train.run_spec import ConstantLrConfig, DataSettings, RunSpec
from engine.train.worker import RunControl, run_training

LLAMA = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-gqa"


class _State:
    def __init__(self):
        self.batches = []

    def set_partial_result(self, batch):
        self.batches.append(batch)


def _spec(text: Path, **training) -> RunSpec:
    cfg = dict(num_epochs=1, batch_size=4, device="cpu", seed=0)
    cfg.update(training)
    data = DataSettings("causal-lm", str(text), tokenizer=str(LLAMA), block_size=16)
    return RunSpec(data, "Adam", optim.AdamConfig(), "constant", ConstantLrConfig(1e-3), TrainingConfig(**cfg))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(f"the cat sat on the mat number {i}." for i in range(80)), encoding="utf-8")
    return path


def test_a_causal_lm_run_trains_through_the_worker(tmp_path, corpus):
    state = _State()
    run = tmp_path / "run"
    run.mkdir()
    out = run_training(state, RunControl(), from_pretrained(LLAMA), _spec(corpus, grad_accumulation=2),
                       str(run), max_steps=3)
    assert out.status in ("finished", "stopped"), (out.status, out.message, out.error)
    assert out.reached_max_steps and out.steps == 3  # optimizer steps, each of 2 micro-batches
    names = {type(e).__name__ for b in state.batches for e in b}
    assert "Failed" not in names


def test_a_tokenizer_larger_than_the_model_is_refused_before_training(tmp_path, corpus):
    from engine.models.llama import LlamaConfig, LlamaForCausalLM

    small = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises((TrainingSetupError, ValueError), match="the tokenizer does not match the model"):
        run_training(_State(), RunControl(), small, _spec(corpus), str(tmp_path), max_steps=1)

