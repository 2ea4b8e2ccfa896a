"""Generating or training with a model larger than memory is refused up front, as edits and
exports are (issue 43, item 12): Generate on a 7 B folder ran 28 s into a MemoryError, a forward
aborted the process. The estimates read shapes only; the refusals run under an address-space
limit, so a regression that starts allocating the 7 B model fails instead of filling memory."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine import optim
from engine.models import from_pretrained, generate
from engine.models.generate import estimate_generation, stream
from engine.models.llama import weight_map
from engine.module import memory
from engine.module.memory import NotEnoughMemory
from engine.store import safetensors_io
from engine.train import TrainingConfig
from engine.train.preflight import estimate_training, optimizer_state_copies
from engine.train.run_spec import ConstantLrConfig, DataSettings, RunSpec
from engine.train.worker import RunControl, run_training
from resources.examples import build_example
from tests.limits import address_space_growth_limit

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
GIB = 2 ** 30


def llama_7b_folder(folder: Path) -> Path:
    """meta-llama/Llama-2-7b-hf as a folder: its config.json, a model.safetensors whose header
    names every BF16 tensor and whose data is a sparse hole (13.5 GB apparent, nothing on disk),
    and the tiny fixture's tokenizer.json (its ids are inside the 32000 of the vocabulary)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = build_example("llama-7b")
    wmap = weight_map(model.config)
    specs = []
    for path, p in model.named_params():
        rule, name = wmap.find(path)
        shape = rule.stored_shape(p.shape)
        specs.append((name, "BF16", shape, 2 * int(p.numel())))
    head = safetensors_io.header(specs, {"format": "pt"})
    with open(folder / "model.safetensors", "wb") as f:
        f.write(head)
        f.truncate(len(head) + sum(s[3] for s in specs))
    (folder / "config.json").write_text(json.dumps(model.config.to_json()))
    shutil.copy(HF / "llama-gqa" / "tokenizer.json", folder / "tokenizer.json")
    return folder


def _initialized(model) -> int:
    return sum(p.is_initialized() for _, p in model.named_params())


@pytest.fixture
def eight_gib(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 8 * GIB)  # an 8 GiB machine


# ---- generation ----------------------------------------------------------------------------------
def test_generate_refuses_a_7b_folder_before_reading_a_weight(tmp_path, eight_gib):
    folder = llama_7b_folder(tmp_path / "llama-2-7b")
    with address_space_growth_limit(2 * GIB):
        model = from_pretrained(folder)
        with pytest.raises(NotEnoughMemory) as info:
            generate(model, None, [1, 2, 3], max_new_tokens=16)
        with pytest.raises(NotEnoughMemory):
            stream(model, None, [[1, 2, 3], [4, 5, 6]], max_new_tokens=16)  # refused when made
    text = str(info.value)
    assert text.startswith("Generation needs about 28.0 GB (parameters to initialize 27.0 GB, initializer working "
                           "arrays 1.0 GB, key/value cache "), text
    assert text.endswith("but this machine has 8.6 GB available; refused"), text
    assert _initialized(model) == 0


def test_generate_refuses_the_lazy_7b_example_too(eight_gib):
    with address_space_growth_limit(2 * GIB):
        model = build_example("llama-7b")
        with pytest.raises(NotEnoughMemory, match=r"Generation needs about 28\.0 GB"):
            generate(model, None, [1, 2, 3], max_new_tokens=4, temperature=0)
    assert _initialized(model) == 0


def test_the_generation_estimate_counts_weights_cache_and_work_and_its_bound_is_the_one_applied(monkeypatch):
    model = from_pretrained(HF / "llama-gqa")  # 2 layers, 2 kv heads of 8, 45552 float32 parameters
    est = estimate_generation(model, batch=2, prompt_length=5, max_new_tokens=3)
    assert est.parts["parameters to initialize"] == 45552 * 4
    assert est.parts["initializer working arrays"] == 2 * 128 * 48 * 4  # twice the largest (the embedding, the head)
    assert est.parts["key/value cache"] == 2 * 2 * 2 * 2 * 8 * (5 + 3) * 4  # k and v, layers, rows, heads, dim
    assert est.parts["adapters folded into their weights"] == 0 and est.parts["working arrays"] > 0
    monkeypatch.setattr(memory, "available_memory", lambda: est.total - 1)
    with pytest.raises(NotEnoughMemory):
        generate(model, None, [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], max_new_tokens=3, temperature=0)
    assert _initialized(model) == 0
    monkeypatch.setattr(memory, "available_memory", lambda: est.total)  # exactly enough: it runs
    out = generate(model, None, [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], max_new_tokens=3, temperature=0)
    assert [len(ids) for ids in out.ids] == [3, 3]
    # once the weights exist they are not counted again
    assert estimate_generation(model, 2, 5, 3).parts["parameters to initialize"] == 0


def test_generation_and_training_count_lazy_weights_by_the_one_initialize_estimate():
    model = from_pretrained(HF / "llama-gqa")  # lazy: 45552 float32 parameters, the largest 128 x 48
    init = memory.estimate_initialize(model)
    assert init.parts == {"parameters to initialize": 45552 * 4, "initializer working arrays": 2 * 128 * 48 * 4}
    for est in (estimate_generation(model, 1, 4, 2), estimate_training(model, optim.AdamConfig(), 2, 4)):
        assert {k: est.parts[k] for k in init.parts} == init.parts
    generate(model, None, [1, 2, 3], max_new_tokens=1, temperature=0)  # initializes them
    assert memory.estimate_initialize(model).total == 0


# ---- training ------------------------------------------------------------------------------------
class _State:
    def __init__(self):
        self.batches = []

    def set_partial_result(self, batch):
        self.batches.append(batch)


def _text_spec(tmp_path, tokenizer_folder, optimizer=None, batch_size=8, block_size=128) -> RunSpec:
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat\n" * 200)
    data = DataSettings(task="causal-lm", file=str(text), tokenizer=str(tokenizer_folder), block_size=block_size)
    return RunSpec(data, "Adam", optimizer or optim.AdamConfig(), "constant", ConstantLrConfig(1e-3),
                   TrainingConfig(num_epochs=1, batch_size=batch_size, device="cpu"))


def test_a_training_run_of_a_7b_folder_is_refused_before_its_data_or_weights(tmp_path, eight_gib, monkeypatch):
    import engine.train.worker as worker

    folder = llama_7b_folder(tmp_path / "llama-2-7b")
    read = []
    monkeypatch.setattr(worker, "make_data", lambda *a, **k: read.append(a) or pytest.fail("the data was read"))
    with address_space_growth_limit(2 * GIB):
        model = from_pretrained(folder)
        with pytest.raises(NotEnoughMemory) as info:
            run_training(_State(), RunControl(), model, _text_spec(tmp_path, folder), str(tmp_path / "run"))
    text = str(info.value)
    assert text.startswith("Training needs about 151.6 GB (parameters to initialize 27.0 GB, initializer working "
                           "arrays 1.0 GB, gradients 27.0 GB, optimizer state 53.9 GB, updated weights 27.0 GB, "
                           "activations 15.8 GB)"), text
    assert "8.6 GB available; refused" in text
    assert not read and _initialized(model) == 0


def test_the_training_estimate_counts_trainable_parameters_and_the_optimizers_state():
    from engine.module import ParamGroup

    model = build_example("spirals")
    total = sum(p.numel() for _, p in model.named_params()) * 4
    fc2 = sum(p.numel() for path, p in model.named_params() if path.startswith("fc2.")) * 4
    frozen = model.freeze_group(ParamGroup.from_regex(r"^fc2\."))
    est = estimate_training(frozen, optim.AdamConfig(), batch_size=64)
    assert est.parts["gradients"] == est.parts["updated weights"] == total - fc2
    assert est.parts["optimizer state"] == 2 * (total - fc2)
    assert "activations" not in est.parts  # not a transformer: its activations are not estimated
    assert optimizer_state_copies(optim.AdamConfig(amsgrad=True)) == 3
    assert optimizer_state_copies(optim.AdamWConfig()) == 2
    assert optimizer_state_copies(optim.SgdConfig(momentum=optim.MomentumConfig(0.9))) == 1
    assert optimizer_state_copies(optim.SgdConfig()) == 0
    # a transformer's activations grow with the batch and the sequence
    llama = from_pretrained(HF / "llama-gqa")
    small = estimate_training(llama, optim.SgdConfig(), 2, 16).parts["activations"]
    assert estimate_training(llama, optim.SgdConfig(), 4, 16).parts["activations"] == 2 * small
    assert estimate_training(llama, optim.SgdConfig(), 2, 32).parts["activations"] > 2 * small


def test_a_small_run_that_fits_trains(tmp_path, monkeypatch):
    folder = HF / "llama-gqa"
    spec = _text_spec(tmp_path, folder, optim.SgdConfig(), batch_size=4, block_size=16)
    model = from_pretrained(folder)
    from engine.train.preflight import estimate_run

    need = estimate_run(model, spec).total
    monkeypatch.setattr(memory, "available_memory", lambda: need - 1)
    with pytest.raises(NotEnoughMemory):
        run_training(_State(), RunControl(), model, spec, str(tmp_path / "refused"))
    # the step's estimate plus what the text reader checks for itself against the same memory
    # (the tokenizer's working memory, the corpus's rows)
    from engine.train.text import TOKENIZER_WORKING_BYTES
    monkeypatch.setattr(memory, "available_memory", lambda: need + TOKENIZER_WORKING_BYTES + 2 ** 24)
    (tmp_path / "run").mkdir()
    out = run_training(_State(), RunControl(), model, spec, str(tmp_path / "run"), max_steps=2)
    assert out.status == "finished" and out.steps == 2
