"""The scale-out hand-off (issue 20, must-show 3): `export_training_script` writes a PyTorch +
transformers + peft training script whose first steps are Ember's.

Always run: the written script is valid Python that imports no Ember module; its config holds
what the Ember model and run say (LoRA targets as Hugging Face module names, r, alpha, the
frozen parameters by their Hugging Face / peft names, the optimizer's hyperparameters, the
batches); the initial adapter is the one Ember initialized; the token rows are Ember's; a base
whose weights changed in Ember is written beside the script, an unchanged one is referred to;
what the script cannot express is refused before anything is written.

Conversation data (issue 45 item 5): the export writes the rows Ember rendered with the chat
template (input ids, labels -100 but on the assistant's tokens, attention mask) and the script
trains on them, so `torchrun` continues the same chat fine-tune; the export is one atomic save.

Optional (skipped visibly without a Python that has torch + transformers + peft: this one, else
$EMBER_ORACLE_PYTHON, else /work/oracle-venv/bin/python): the script runs 5 steps on CPU
in a subprocess and its per-step losses equal Ember's Learner's on the same rows and initial
weights — step 1 to <= 1e-4, later steps to <= 1e-3 (both sides compute in float32, so sums
taken in another order differ by ~1e-7 relative; Adam's update divides by sqrt(v) and carries
those differences into the weights, then into later losses, but over 5 steps they stay near
1e-6: the tolerance leaves room for other BLAS builds). Also under `torchrun --nproc_per_node 2`
(DDP on CPU, gloo) and for DoRA + rsLoRA on prompt/completion data re-tokenized by the script.
The conversation run compares 5 steps to the same tolerances. The script runs in a subprocess of
that Python; Ember runs here.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import Device, Tensor, optim
from engine.models import PretrainedError, from_pretrained, load_peft_adapter
from engine.interop import export_training_script
from engine.module import Param, ParamGroup
from engine.module.lora import Lora, QLora
from engine.module.reparam import iter_param_slots
from engine.store import safetensors_io
from engine.train import Learner, TrainingConfig
from engine.train.chat_data import conversation_tokens, load_conversation_data
from engine.train.chat_template import ChatTemplate
from engine.train.conversations import read_conversations
from engine.train.run_spec import DataSettings
from engine.train.text import load_tokenizer, text_data_for_model

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FIXTURE = FIXTURES / "hf" / "llama-gqa"
CONVERSATIONS = FIXTURES / "conversations"  # OpenAI messages, ShareGPT and Alpaca records
QV = ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$")
FIRST_STEP_TOL = 1e-4
LATER_TOL = 1e-3


def corpus(path: Path, n=120, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    lines = [f"{rng.choice(['the cat', 'a dog', 'the bird'])} {rng.choice(['sat on', 'ran to', 'looked at'])} "
             f"{rng.choice(['the mat.', 'a box.', 'the log.'])}" for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def lora_qv_with_frozen_layer(seed=0):
    """The fixture Llama with LoRA (r 8, alpha 16) on every q/v projection, layer 0 frozen."""
    base = from_pretrained(FIXTURE)
    Device("cpu").seed(seed)
    model = base.apply_lora(Lora(8, 16.0, param_group=QV))
    return model.freeze_group(ParamGroup.from_regex(r"^layers\.0\."))


CONFIG = TrainingConfig(num_epochs=1, batch_size=4, seed=3, grad_accumulation=2, warmup_steps=2, max_grad_norm=1.0)
ADAMW = optim.AdamWConfig(weight_decay=0.01)


@pytest.fixture
def exported(tmp_path):
    model = lora_qv_with_frozen_layer()
    data = text_data_for_model(model, corpus(tmp_path / "corpus.txt"), load_tokenizer(FIXTURE), block_size=16,
                               per_line=True)
    out = export_training_script(model, tmp_path / "export", data=data, training_config=CONFIG, optimizer=ADAMW,
                                 lr=1e-2)
    return out, data


# ---------------------------------------------------------------------------------- always run
def test_the_script_is_python_that_imports_no_ember_module(exported):
    out, _ = exported
    source = out.script.read_text(encoding="utf-8")
    tree = ast.parse(compile(source, str(out.script), "exec", ast.PyCF_ONLY_AST))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= {"argparse", "json", "math", "os", "pathlib", "numpy", "torch", "safetensors",
                        "transformers", "peft", "tokenizers"}, imported
    assert "engine" not in imported and "import engine" not in source and "from engine" not in source
    assert {"torch", "transformers", "peft"} <= imported
    for launcher in ("torchrun --nproc_per_node", "accelerate launch", "WORLD_SIZE", "LOCAL_RANK",
                     "DistributedDataParallel"):
        assert launcher in source


def test_the_config_holds_what_the_ember_model_and_run_say(exported):
    out, data = exported
    cfg = json.loads(out.config_path.read_text(encoding="utf-8"))
    assert cfg == out.config
    assert cfg["model"]["base"] == str(FIXTURE.resolve())  # base weights unchanged: the folder it came from
    lora = cfg["lora"]
    assert lora["r"] == 8 and lora["lora_alpha"] == 16 and not lora["use_rslora"] and not lora["use_dora"]
    assert lora["target_modules"] == [f"model.layers.{i}.self_attn.{m}_proj" for i in (0, 1) for m in "qv"]
    # trainable: layer 1's factors only (layer 0 frozen, LoRA froze the base), by peft's names
    assert cfg["trainable_parameters"] == [f"model.layers.1.self_attn.{m}_proj.lora_{f}.weight"
                                           for m in "qv" for f in "AB"]
    frozen = set(cfg["frozen_parameters"])
    assert {f"model.layers.0.self_attn.{m}_proj.lora_{f}.weight" for m in "qv" for f in "AB"} <= frozen
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.layers.1.self_attn.q_proj.weight",
            "model.norm.weight"} <= frozen
    ember_trainable = sum(p.numel() for _, p in out.model.named_params() if p.is_require_grad())
    assert cfg["trainable_values"] == ember_trainable == 8 * (48 + 48) + 8 * (48 + 16)  # q: 48 -> 48, v: 48 -> 2 kv heads x 8
    assert cfg["optimizer"] == {"name": "AdamW", "betas": [0.9, 0.999], "eps": 1e-5, "weight_decay": 0.01,
                                "lr": 1e-2, "warmup_steps": 2, "max_grad_norm": 1.0}
    assert cfg["training"] == {"num_epochs": 1, "batch_size": 4, "valid_batch_size": 4, "grad_accumulation": 2,
                               "seed": 3, "shuffle": True, "drop_last": False}
    assert cfg["data"]["block_size"] == 16 and cfg["data"]["packing"] is True
    assert cfg["data"]["train_rows"] == len(data)


def test_the_rows_and_the_initial_adapter_are_embers(exported):
    out, data = exported
    buf = (out.folder / "tokens.safetensors").read_bytes()
    plan = {t.name: t for t in safetensors_io.plan(buf, len(buf), "tokens").tensors}
    for name, want in (("train_inputs", data.inputs), ("train_targets", data.targets)):
        t = plan[name]
        got = np.frombuffer(buf, np.int64, count=int(np.prod(t.shape)), offset=t.offset).reshape(t.shape)
        assert t.dtype == "I64" and np.array_equal(got, want)
    # the adapter in initial_adapter/ opens in Ember as the very factors the exported model holds
    reopened = load_peft_adapter(from_pretrained(FIXTURE), out.folder / "initial_adapter")
    mine = {p: v.val().numpy() for p, v in out.model.named_params() if ".lora." in p}
    theirs = {p: v.val().numpy() for p, v in reopened.named_params() if ".lora." in p}
    assert mine.keys() == theirs.keys() and len(mine) == 8
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
    assert any(np.abs(v).sum() > 0 for k, v in mine.items() if k.endswith(".a"))


def test_a_base_changed_in_ember_is_written_beside_the_script(tmp_path):
    base = from_pretrained(FIXTURE)
    path = "layers.1.mlp.down_proj.weight"
    param = dict(base.named_params())[path]
    doubled = param.val().numpy() * 2.0
    changed = base.with_child(path, Param.initialized(Tensor.from_data(doubled), id=param.id, active=True))
    Device("cpu").seed(1)
    model = changed.apply_lora(Lora(4, 8.0, param_group=QV))
    data = text_data_for_model(model, corpus(tmp_path / "c.txt", 20), load_tokenizer(FIXTURE), block_size=16,
                               per_line=True)
    out = export_training_script(model, tmp_path / "x", data=data, training_config=CONFIG, lr=1e-3)
    assert out.config["model"]["base"] == "base_model"
    copy = from_pretrained(tmp_path / "x" / "base_model")
    assert np.array_equal(dict(copy.named_params())[path].val().numpy(), doubled)
    assert (tmp_path / "x" / "base_model" / "tokenizer.json").is_file()
    assert not any(p.reparameterization for _, p in iter_param_slots(copy))
    # the same model read but unchanged refers to its folder
    Device("cpu").seed(1)
    same = from_pretrained(FIXTURE).apply_lora(Lora(4, 8.0, param_group=QV))
    same.forward(Tensor.from_data(data.inputs[:1]))  # reads every weight: still the stored values
    out2 = export_training_script(same, tmp_path / "y", data=data, training_config=CONFIG, lr=1e-3)
    assert out2.config["model"]["base"] == str(FIXTURE.resolve())
    assert not (tmp_path / "y" / "base_model").exists()


def test_lora_given_to_the_export_is_attached_and_returned(tmp_path):
    base = from_pretrained(FIXTURE)
    data = text_data_for_model(base, corpus(tmp_path / "c.txt", 20), load_tokenizer(FIXTURE), block_size=16,
                               per_line=True)
    out = export_training_script(base, tmp_path / "x", data=data, training_config=CONFIG, lr=1e-3,
                                 lora=Lora(4, 8.0, param_group=QV, use_rslora=True))
    assert out.config["lora"]["use_rslora"] and out.config["lora"]["r"] == 4
    assert sum(".lora." in p for p, _ in out.model.named_params()) == 8
    with pytest.raises(ValueError, match="already carries LoRA adapters"):
        export_training_script(out.model, tmp_path / "z", data=data, training_config=CONFIG, lora=Lora(4, 8.0))


def test_what_the_script_cannot_express_is_refused_before_writing(tmp_path):
    model = lora_qv_with_frozen_layer()
    data = text_data_for_model(model, corpus(tmp_path / "c.txt", 20), load_tokenizer(FIXTURE), block_size=16,
                               per_line=True)
    target = tmp_path / "x"
    cases = [
        (dict(optimizer=optim.AdamWConfig(cautious_weight_decay=True)), "cautious weight decay"),
        (dict(lr=optim.CosineAnnealingLrSchedulerConfig(1e-2, 10)), "expected a constant learning rate"),
        (dict(optimizer=optim.AdamConfig(grad_clipping=optim.GradientClippingConfig.value(1.0))),
         "per-tensor gradient clipping"),
        (dict(data=np.zeros((2, 3))), "data must be the training rows"),
        (dict(training_config=object()), "training_config must be a TrainingConfig"),
    ]
    for change, message in cases:
        kw = {**dict(data=data, training_config=CONFIG, lr=1e-3), **change}
        with pytest.raises((ValueError, TypeError), match=message):
            export_training_script(model, target, **kw)
        assert not target.exists()
    q = from_pretrained(FIXTURE).apply_qlora(QLora(Lora(4, 8.0, param_group=QV)))
    with pytest.raises(PretrainedError, match="QLoRA"):
        export_training_script(q, target, data=data, training_config=CONFIG)
    with pytest.raises(PretrainedError, match="known Hugging Face family"):
        from engine import nn
        export_training_script(nn.LinearConfig(2, 2).init(), target, data=data, training_config=CONFIG)
    assert not target.exists()


# ---------------------------------------------------------------------------------- optional: run it
def _run_script(cmd, cwd, timeout=600):
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", TQDM_DISABLE="1",
               OMP_NUM_THREADS="1", PYTHONPATH="")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@functools.lru_cache(maxsize=1)
def _find_torch_python() -> str | None:
    for python in (sys.executable, os.environ.get("EMBER_ORACLE_PYTHON"), "/work/oracle-venv/bin/python"):
        if python and Path(python).is_file():
            probe = subprocess.run([python, "-c", "import torch, transformers, peft, safetensors"],
                                   capture_output=True, timeout=300, env=dict(os.environ, PYTHONPATH=""))
            if probe.returncode == 0:
                return python
    return None


def _torch_side() -> str:
    """A Python with torch + transformers + peft to run the script with (skips visibly without one)."""
    python = _find_torch_python()
    if python is None:
        pytest.skip("no Python with torch + transformers + peft (this one, $EMBER_ORACLE_PYTHON or "
                    "/work/oracle-venv/bin/python): the exported script cannot run")
    return python


def _compare(ember, script, steps):
    assert len(script) == steps and len(ember) >= steps
    diffs = [abs(a - b) for a, b in zip(ember[:steps], script)]
    assert diffs[0] <= FIRST_STEP_TOL, (ember[:steps], script)
    assert max(diffs) <= LATER_TOL, (ember[:steps], script)
    return diffs


def test_the_script_reproduces_embers_first_five_steps(exported, tmp_path):
    python = _torch_side()
    out, data = exported
    result = Learner(out.model, ADAMW.init(), lr=1e-2, train=data, kind="causal-lm", config=CONFIG).run()
    assert result.status == "finished", result.error
    losses = tmp_path / "losses.json"
    _run_script([python, str(out.script), "--steps", "5", "--losses", str(losses), "--out",
                 str(tmp_path / "trained")], tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 5)
    print(f"Ember vs the exported script, 5 steps: |loss difference| {['%.1e' % d for d in diffs]}")
    assert (tmp_path / "trained" / "adapter_model.safetensors").is_file()


def test_the_script_under_torchrun_with_two_processes_gives_the_same_losses(exported, tmp_path):
    python = _torch_side()
    torchrun = Path(python).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip(f"no torchrun beside {python}")
    out, data = exported
    result = Learner(out.model, ADAMW.init(), lr=1e-2, train=data, kind="causal-lm", config=CONFIG).run()
    losses = tmp_path / "losses.json"
    _run_script([str(torchrun), "--nproc_per_node", "2", str(out.script), "--steps", "3", "--losses", str(losses),
                 "--out", str(tmp_path / "trained")], tmp_path)
    _compare(result.step_losses, json.loads(losses.read_text()), 3)


def test_dora_rslora_on_prompt_completion_rows_tokenized_by_the_script(tmp_path):
    python = _torch_side()
    rng = np.random.default_rng(4)
    lines = [json.dumps({"prompt": f"Q: {rng.choice(['cat', 'dog', 'bird'])}?",
                         "completion": f" A: the {rng.choice(['mat', 'box', 'log'])}."}) for _ in range(24)]
    (tmp_path / "qa.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    from engine.train.run_spec import DataSettings, make_data

    settings = DataSettings("causal-lm", str(tmp_path / "qa.jsonl"), tokenizer=str(FIXTURE), block_size=20,
                            packing=False, valid_fraction=0.25)
    base = from_pretrained(FIXTURE)
    Device("cpu").seed(2)
    model = base.apply_lora(Lora(4, 8.0, param_group=ParamGroup.from_regex(r"(query|value|down)\.weight$"),
                                 use_dora=True, use_rslora=True))
    cfg = TrainingConfig(num_epochs=2, batch_size=6, seed=5)
    train, valid, _, _ = make_data(settings, cfg.seed, model)
    assert (train.targets == -100).sum() > (train.inputs == 0).sum()  # prompts masked, not only pads
    sgd = optim.SgdConfig(momentum=optim.MomentumConfig(0.9, 0.1), weight_decay=1e-3)
    out = export_training_script(model, tmp_path / "x", data=(train, valid), data_settings=settings,
                                 training_config=cfg, optimizer=sgd, lr=0.05)
    assert out.config["lora"]["use_dora"] and out.config["lora"]["use_rslora"]
    assert out.config["data"]["valid_rows"] == len(valid)
    result = Learner(out.model, sgd.init(), lr=0.05, train=train, kind="causal-lm", config=cfg).run()
    assert result.status == "finished", result.error
    steps = len(result.step_losses)
    losses = tmp_path / "losses.json"
    proc = _run_script([python, str(out.script), "--tokenize", "--losses", str(losses), "--out",
                        str(tmp_path / "trained")], tmp_path)
    _compare(result.step_losses, json.loads(losses.read_text()), steps)
    assert "validation loss" in proc.stdout
    shutil.rmtree(tmp_path / "trained")


def test_modules_to_save_train_in_the_script_as_in_ember_for_20_adamw_steps(tmp_path):
    """Issue 47: LoRA on q/v with embed_tokens and lm_head trained whole (peft's modules_to_save),
    20 AdamW steps: the script's losses are Ember's, and its adapter carries the trained modules."""
    from engine.models.peft import peft_train_fully

    python = _torch_side()
    base = from_pretrained(FIXTURE)
    Device("cpu").seed(5)
    model = peft_train_fully(base.apply_lora(Lora(4, 8.0, param_group=QV)), ["embed_tokens", "lm_head"])
    data = text_data_for_model(model, corpus(tmp_path / "corpus.txt", n=200), load_tokenizer(FIXTURE), block_size=16,
                               per_line=True)
    cfg = TrainingConfig(num_epochs=2, batch_size=4, seed=3, warmup_steps=2, max_grad_norm=1.0)
    out = export_training_script(model, tmp_path / "export", data=data, training_config=cfg, optimizer=ADAMW,
                                 lr=5e-3)
    assert out.config["lora"]["modules_to_save"] == ["lm_head", "model.embed_tokens"]
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(out.config["trainable_parameters"])
    result = Learner(out.model, ADAMW.init(), lr=5e-3, train=data, kind="causal-lm", config=cfg).run()
    assert result.status == "finished", result.error
    losses = tmp_path / "losses.json"
    _run_script([python, str(out.script), "--steps", "20", "--losses", str(losses), "--out",
                 str(tmp_path / "trained")], tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 20)
    print(f"modules_to_save, Ember vs the exported script, 20 AdamW steps: max |loss difference| {max(diffs):.1e}")
    assert max(diffs) <= 1e-5  # measured 7.2e-7
    names = set(_safetensor_names(tmp_path / "trained" / "adapter_model.safetensors"))
    assert {"base_model.model.lm_head.weight", "base_model.model.model.embed_tokens.weight"} <= names


def _safetensor_names(path: Path) -> list[str]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return [k for k in json.loads(fh.read(n)) if k != "__metadata__"]


# ---------------------------------------------------------------------------------- conversations
CHAT_CONFIG = TrainingConfig(num_epochs=2, batch_size=3, seed=7, warmup_steps=1, max_grad_norm=1.0)


@pytest.fixture
def chat_export(tmp_path):
    """The fixture Llama (its positions raised to 512: the conversations render to up to 245 tokens
    with its tiny tokenizer, and packed rows hold several) with LoRA on q/v, and the committed conversations of the three formats
    rendered with SmolLM2's chat template: one padded row each, the loss on the assistant's turns."""
    folder = tmp_path / "llama"
    shutil.copytree(FIXTURE, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 512}))
    template = ChatTemplate((FIXTURES / "chat_templates" / "smollm2-instruct.jinja").read_text(), where="smollm2")
    tokenizer = load_tokenizer(folder)
    data = load_conversation_data(CONVERSATIONS, template, tokenizer, block_size=248)
    Device("cpu").seed(5)
    model = from_pretrained(folder).apply_lora(Lora(8, 16.0, param_group=QV))
    settings = DataSettings("causal-lm", str(CONVERSATIONS), tokenizer=str(folder), block_size=248, packing=False)
    out = export_training_script(model, tmp_path / "export", data=data, data_settings=settings,
                                 training_config=CHAT_CONFIG, optimizer=ADAMW, lr=5e-3)
    return out, data, template, tokenizer


def _tokens(folder: Path) -> dict[str, np.ndarray]:
    buf = (folder / "tokens.safetensors").read_bytes()
    out = {}
    for t in safetensors_io.plan(buf, len(buf), "tokens").tensors:
        assert t.dtype == "I64"
        out[t.name] = np.frombuffer(buf, np.int64, count=int(np.prod(t.shape)), offset=t.offset).reshape(t.shape)
    return out


def test_conversation_rows_are_written_with_their_assistant_masks_and_attention_masks(chat_export):
    out, data, template, tokenizer = chat_export
    d = out.config["data"]
    assert d["format"] == "conversations" and d["assistant_only"] is True
    assert d["conversation_format"] == "alpaca"  # the folder's first file, told by its first record
    assert d["train_rows"] == len(data) == 8 and d["block_size"] == 248 and d["packing"] is False
    assert d["train_target_tokens"] == data.target_tokens
    rows = _tokens(out.folder)
    assert sorted(rows) == ["train_attention_mask", "train_inputs", "train_targets"]
    np.testing.assert_array_equal(rows["train_inputs"], data.inputs)
    np.testing.assert_array_equal(rows["train_targets"], data.targets)
    np.testing.assert_array_equal(rows["train_attention_mask"], data.attention_mask)
    # row by row: the labels are the next tokens where the assistant speaks and -100 everywhere else
    # (system, user, the templates' headers, pads); the mask is 1 on the rendered conversation
    convs = read_conversations(CONVERSATIONS)
    for r, conv in enumerate(convs):
        row = conversation_tokens(conv, template, tokenizer)
        n = len(row.ids) - 1
        np.testing.assert_array_equal(rows["train_inputs"][r, :n], row.ids[:-1])
        want = np.where(row.learn[1:], row.ids[1:], -100)
        np.testing.assert_array_equal(rows["train_targets"][r, :n], want)
        assert (rows["train_targets"][r, n:] == -100).all() and 0 < (want != -100).sum() < n
        assert rows["train_attention_mask"][r].tolist() == [1] * n + [0] * (248 - n)


def test_plain_text_is_not_taken_for_conversations(exported, tmp_path):
    out, _ = exported
    assert out.config["data"]["format"] == "text" and "conversation_format" not in out.config["data"]
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"prompt": "Q", "completion": "A"}) + "\n")
    from engine.interop.training_script import data_file_format
    assert data_file_format(qa) is None and data_file_format(tmp_path / "corpus.txt") is None
    assert [data_file_format(CONVERSATIONS / f) for f in ("messages.jsonl", "sharegpt.jsonl", "alpaca.jsonl")] == [
        "messages", "sharegpt", "alpaca"]


def test_rows_the_script_cannot_run_as_ember_does_are_refused_before_writing(chat_export, tmp_path):
    out, data, _, _ = chat_export
    from engine.train.text import TextDataset
    mask = data.attention_mask[:, ::-1].copy()  # left padding: real positions after pads
    bad = TextDataset(data.inputs, data.targets, mask, data.block_size, False, "left", len(data))
    with pytest.raises(ValueError, match=r"row 0: expected an attention mask of ones then zeros \(right padding\)"):
        export_training_script(out.model, tmp_path / "bad", data=bad, training_config=CHAT_CONFIG, lr=1e-3)
    assert not (tmp_path / "bad").exists()


def test_a_second_export_replaces_the_first_whole_and_a_failed_one_leaves_it(chat_export, tmp_path, monkeypatch):
    out, data, _, _ = chat_export
    before = {p.relative_to(out.folder): p.read_bytes() for p in out.folder.rglob("*") if p.is_file()}
    from engine.interop import training_script

    def full_disk(path, arrays):
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(training_script, "_write_tokens", full_disk)
    with pytest.raises(PretrainedError, match="cannot write the training script: .*No space left"):
        export_training_script(out.model, out.folder, data=data, training_config=CHAT_CONFIG, lr=1e-3)
    after = {p.relative_to(out.folder): p.read_bytes() for p in out.folder.rglob("*") if p.is_file()}
    assert after == before  # the old export, untouched
    assert not [p for p in out.folder.parent.iterdir() if p.name.startswith(".export.")]
    monkeypatch.undo()
    Device("cpu").seed(9)
    other = from_pretrained(out.folder.parent / "llama").apply_lora(Lora(4, 8.0, param_group=QV))
    again = export_training_script(other, out.folder, data=data, training_config=CHAT_CONFIG, lr=1e-3)
    assert again.config["lora"]["r"] == 4
    saved = json.loads((out.folder / "initial_adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and sorted(p.name for p in (out.folder / "initial_adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((out.folder / "train_config.json").read_text()) == again.config
    assert not [p.name for p in out.folder.iterdir() if p.name.startswith(".")]


def test_the_script_continues_embers_chat_fine_tune_on_the_same_rows(chat_export, tmp_path):
    python = _torch_side()
    out, data, _, _ = chat_export
    result = Learner(out.model, ADAMW.init(), lr=5e-3, train=data, kind="causal-lm", config=CHAT_CONFIG).run()
    assert result.status == "finished", result.error
    losses = tmp_path / "losses.json"
    proc = _run_script([python, str(out.script), "--steps", "5", "--losses", str(losses), "--out",
                        str(tmp_path / "trained")], tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 5)
    print(f"Ember vs the exported script on conversations, 5 steps: |loss difference| {['%.1e' % d for d in diffs]}")
    assert "8 training rows of 248 tokens" in proc.stdout
    # the rows are Ember's rendering: the script refuses to make them again itself
    env = dict(os.environ, PYTHONPATH="", HF_HUB_OFFLINE="1")
    again = subprocess.run([python, str(out.script), "--tokenize", "--steps", "1"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, env=env)
    assert again.returncode != 0 and "--tokenize: the data are conversations" in again.stderr
    # the adapter Ember exported says task_type CAUSAL_LM: peft opens it as a causal LM's adapter
    assert json.loads((out.folder / "initial_adapter" / "adapter_config.json").read_text())["task_type"] == "CAUSAL_LM"
    code = ("import sys; from transformers import AutoModelForCausalLM; from peft import PeftModel; "
            "m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(sys.argv[1]), sys.argv[2]); "
            "print(type(m).__name__, m.peft_config['default'].task_type)")
    peft = _run_script([python, "-c", code, out.config["model"]["base"], str(out.folder / "initial_adapter")],
                       tmp_path)
    assert peft.stdout.split()[-2:] == ["PeftModelForCausalLM", "CAUSAL_LM"]


def _packed_rows(template, tokenizer, block: int):
    """The committed conversations packed first-fit into rows of `block` positions, each attending
    only to itself: `segment_ids` 1.. per conversation of a row, `position_ids` from 0 in each (the
    arrays Ember's packed conversation rows carry)."""
    from engine.train.text import TextDataset

    convs = [conversation_tokens(c, template, tokenizer) for c in read_conversations(CONVERSATIONS)]
    bins, room = [], []
    for i, row in enumerate(convs):
        k = len(row.ids) - 1
        at = next((b for b, r in enumerate(room) if r >= k), None)
        if at is None:
            bins.append([]), room.append(block)
            at = len(bins) - 1
        bins[at].append(i)
        room[at] -= k
    shape = (len(bins), block)
    x, y = np.zeros(shape, np.int64), np.full(shape, -100, np.int64)
    mask, seg, pos = np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    for r, members in enumerate(bins):
        at = 0
        for s, i in enumerate(members, start=1):
            row = convs[i]
            k = len(row.ids) - 1
            x[r, at:at + k], y[r, at:at + k] = row.inputs, row.targets
            mask[r, at:at + k], seg[r, at:at + k], pos[r, at:at + k] = 1, s, np.arange(k)
            at += k
    data = TextDataset(x, y, mask, block, True, "packed", len(convs), tokenizer)
    data.segment_ids, data.position_ids = seg, pos
    return data


def test_packed_conversations_train_in_the_script_as_each_on_its_own(chat_export, tmp_path):
    """Packed rows (several conversations a row, each attending only to itself) go to the script
    with their segments and positions. With the whole data set in every step, the loss and the
    gradient of a step are the same sums over the same targets whether the conversations are
    packed or one a row: the script on the packed rows takes Ember's steps on the padded ones."""
    out, data, template, tokenizer = chat_export
    packed = _packed_rows(template, tokenizer, 512)
    assert len(packed) < len(data) and packed.segment_ids.max() >= 3  # rows of several conversations
    assert packed.target_tokens == data.target_tokens
    whole = TrainingConfig(num_epochs=4, batch_size=len(packed), seed=7, warmup_steps=1, max_grad_norm=1.0)
    exp = export_training_script(out.model, tmp_path / "packed", data=packed, training_config=whole, optimizer=ADAMW,
                                 lr=5e-3)
    rows = _tokens(exp.folder)
    assert exp.config["data"]["packed_sequences"] is True
    np.testing.assert_array_equal(rows["train_segment_ids"], packed.segment_ids)
    np.testing.assert_array_equal(rows["train_position_ids"], packed.position_ids)
    python = _torch_side()
    ember = TrainingConfig(num_epochs=4, batch_size=len(data), seed=7, warmup_steps=1, max_grad_norm=1.0)
    result = Learner(exp.model, ADAMW.init(), lr=5e-3, train=data, kind="causal-lm", config=ember).run()
    assert result.status == "finished", result.error
    losses = tmp_path / "losses.json"
    _run_script([python, str(exp.script), "--losses", str(losses), "--out", str(tmp_path / "trained")], tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 4)
    print(f"Ember (one conversation a row) vs the script on packed rows, 4 steps: {['%.1e' % d for d in diffs]}")


def test_torchrun_with_two_processes_continues_the_chat_fine_tune(chat_export, tmp_path):
    python = _torch_side()
    torchrun = Path(python).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip(f"no torchrun beside {python}")
    out, data, _, _ = chat_export
    result = Learner(out.model, ADAMW.init(), lr=5e-3, train=data, kind="causal-lm", config=CHAT_CONFIG).run()
    losses = tmp_path / "losses.json"
    _run_script([str(torchrun), "--nproc_per_node", "2", str(out.script), "--steps", "3", "--losses", str(losses),
                 "--out", str(tmp_path / "trained")], tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 3)
    print(f"Ember vs torchrun --nproc_per_node 2 on conversations, 3 steps: {['%.1e' % d for d in diffs]}")


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_the_script_trains_a_gemma_as_ember_does(name, tmp_path):
    """Gemma 2 (soft-capped attention and logits, a sliding layer) and Gemma 3 (q/k norms, two rope bases):
    rows of 16 positions, past the fixtures' window of 4 (issue 47)."""
    python = _torch_side()
    Device("cpu").seed(0)
    model = from_pretrained(FIXTURES / "hf" / name).apply_lora(Lora(8, 16.0, param_group=QV))
    data = text_data_for_model(model, corpus(tmp_path / "corpus.txt"), load_tokenizer(FIXTURE), block_size=16,
                               per_line=True)
    out = export_training_script(model, tmp_path / "export", data=data, training_config=CONFIG, optimizer=ADAMW,
                                 lr=1e-2)
    result = Learner(out.model, ADAMW.init(), lr=1e-2, train=data, kind="causal-lm", config=CONFIG).run()
    assert result.status == "finished", result.error
    losses = tmp_path / "losses.json"
    _run_script([python, str(out.script), "--steps", "5", "--losses", str(losses), "--out",
                 str(tmp_path / "trained")], tmp_path)
    diffs = _compare(result.step_losses, json.loads(losses.read_text()), 5)
    print(f"{name}: Ember vs the exported script, 5 steps: |loss difference| {['%.1e' % d for d in diffs]}")
