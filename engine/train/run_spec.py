"""A run's settings besides the model: where the data comes from, the loss, the optimizer, the
learning-rate schedule and the training config (`RunSpec`, saved in the run folder as
`run.json`), and what they make: the data sets (`make_data`) and the training step of a
chosen loss (`make_step`). The task `"causal-lm"` reads a text file with a folder's tokenizer
(`DataSettings.tokenizer`, `block_size`, `packing`, `per_line`, `truncate`; `engine.train.text`),
or a conversation file (OpenAI `messages`, ShareGPT, Alpaca `.jsonl`, told from its first record)
rendered with the chat template of the tokenizer's folder, the loss on the assistant's tokens
(`engine.train.chat_data`; packed conversations attend only to themselves), and trains with the
Learner's `"causal-lm"` kind; `make_data(settings, seed, model)` checks the
text against the model's vocabulary and positions.

    spec = RunSpec(DataSettings("spirals"), "Adam", optim.AdamConfig(), "constant", ConstantLrConfig(1e-2),
                   TrainingConfig(num_epochs=2))
    assert RunSpec.from_json(spec.to_json()) == spec
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import optim
import numpy as np

from .config_json import from_dict, to_dict
from .data import InMemoryDataset
from .data_files import load_data_file
from .learner import StepOutput, TrainingConfig
from .losses import cross_entropy, mse_loss
from .tasks import TASKS, build_task

FILE_TASK = "file"
CAUSAL_LM_TASK = "causal-lm"  # next-token prediction on a text file, tokenized by a folder's tokenizer
LOSSES = ("auto", "cross-entropy", "mse")
KINDS = ("auto", "classification", "regression")
MAX_INFERRED_CLASSES = 100  # integer targets with more distinct values are read as numbers (regression)


@dataclass
class DataSettings:
    """Where the data comes from and which loss to train with."""

    task: str = "spirals"  # a built-in task, or "file"
    file: str = ""  # a .npz (arrays x, y) or .csv (target in the last column) when task is "file"
    valid_fraction: float = 0.2  # of a file's items, held out for validation
    loss: str = "auto"  # auto: cross-entropy for class targets, mse otherwise
    kind: str = "auto"  # a file's targets: classification, regression, or inferred (auto)
    # causal-lm: `file` is a .txt / .jsonl file (or a folder of them), tokenized with `tokenizer`
    tokenizer: str = ""  # a folder with tokenizer.json (the model's folder)
    block_size: int = 128  # positions per row
    packing: bool = True  # documents joined with eos and cut into blocks; False: one padded row each
    per_line: bool = True  # a .txt file: one document per line (False: the whole file is one)
    truncate: bool = False  # padding: cut a document longer than the block size (False: refuse it)

    def __post_init__(self):
        choices = (*TASKS, FILE_TASK, CAUSAL_LM_TASK)
        if self.task not in choices:
            raise ValueError(f"task: expected one of {list(choices)}, found {self.task!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {list(LOSSES)}, found {self.loss!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {list(KINDS)}, found {self.kind!r}")
        if self.task == CAUSAL_LM_TASK:
            self._check_text()
            return
        if self.task != FILE_TASK and self.file.strip():
            # never train on data the user did not choose: a typed file with a built-in task is ambiguous
            raise ValueError(f"file: a data file is given but the built-in data {self.task!r} is chosen: choose "
                             f"'file' to train on {Path(self.file).name!r}, or clear the data file")
        if self.task == FILE_TASK:
            if not self.file:
                raise ValueError("file: the task is 'file': give a .npz or .csv file")
            p = Path(self.file).expanduser()
            if p.suffix.lower() not in (".npz", ".csv", ".tsv", ".txt"):
                raise ValueError(f"file: expected a .npz or .csv file, found {p.name!r}")
            if not p.is_file():
                raise ValueError(f"file: {p} does not exist")
            if not 0.0 < self.valid_fraction < 1.0:
                raise ValueError(f"valid_fraction: expected a fraction between 0 and 1, found {self.valid_fraction}")


    def _check_text(self) -> None:
        if not self.file:
            raise ValueError("file: the task is 'causal-lm': give a .txt or .jsonl file (or a folder of them)")
        p = Path(self.file).expanduser()
        if not p.exists():
            raise ValueError(f"file: {p} does not exist")
        if p.is_file() and p.suffix.lower() not in (".txt", ".jsonl"):
            raise ValueError(f"file: expected a .txt or .jsonl file for causal-lm, found {p.name!r}")
        if not self.tokenizer:
            raise ValueError("tokenizer: the task is 'causal-lm': give the folder holding tokenizer.json")
        t = Path(self.tokenizer).expanduser()
        if not (t.is_file() or (t / "tokenizer.json").is_file()):
            raise ValueError(f"tokenizer: expected a folder holding tokenizer.json, found no {t / 'tokenizer.json'}")
        if isinstance(self.block_size, bool) or int(self.block_size) != self.block_size or self.block_size < 1:
            raise ValueError(f"block_size: expected a positive whole number of positions, found {self.block_size!r}")
        if self.loss != "auto" or self.kind != "auto":
            raise ValueError(f"loss / kind: causal-lm trains with its own next-token loss: expected 'auto', found "
                             f"{self.loss!r} / {self.kind!r}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ValueError(f"valid_fraction: expected a fraction between 0 and 1, found {self.valid_fraction}")


@dataclass
class ConstantLrConfig:
    """A constant learning rate (Burn's `ConstantLr`)."""

    lr: float = 1e-2

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr: the learning rate must be greater than 0, found {self.lr}")

    def init(self):
        return optim.ConstantLr(self.lr)


OPTIMIZERS: dict[str, type] = {"Adam": optim.AdamConfig, "AdamW": optim.AdamWConfig, "SGD": optim.SgdConfig}
SCHEDULES: dict[str, tuple[type, dict]] = {
    "constant": (ConstantLrConfig, {}),
    "linear": (optim.LinearLrSchedulerConfig, dict(initial_lr=1e-2, final_lr=1e-4, num_iters=1000)),
    "cosine": (optim.CosineAnnealingLrSchedulerConfig, dict(initial_lr=1e-2, num_iters=1000)),
    "step": (optim.StepLrSchedulerConfig, dict(initial_lr=1e-2, step_size=500, gamma=0.5)),
    "exponential": (optim.ExponentialLrSchedulerConfig, dict(initial_lr=1e-2, gamma=0.999)),
    "noam": (optim.NoamLrSchedulerConfig, dict(factor=1.0, warmup_steps=200, model_size=64)),
}
OPTIMIZER_TYPES = {"grad_clipping": optim.GradientClippingConfig | None,
                   "gradient_clipping": optim.GradientClippingConfig | None}


@dataclass
class RunSpec:
    """Everything a run needs besides the model; saved in the run folder as `run.json`."""

    data: DataSettings
    optimizer: str
    optimizer_config: Any
    schedule: str
    schedule_config: Any
    training: TrainingConfig  # device as a string; checkpoint_dir / resume_from set per run

    def to_json(self) -> dict:
        t = to_dict(self.training)
        t["device"] = str(self.training.device) if self.training.device is not None else None
        return {"data": to_dict(self.data), "optimizer": self.optimizer,
                "optimizer_config": to_dict(self.optimizer_config), "schedule": self.schedule,
                "schedule_config": to_dict(self.schedule_config), "training": t}

    @staticmethod
    def from_json(d: dict) -> "RunSpec":
        opt_cls = OPTIMIZERS[d["optimizer"]]
        sched_cls = SCHEDULES[d["schedule"]][0]
        return RunSpec(from_dict(DataSettings, d["data"]), d["optimizer"],
                       from_dict(opt_cls, d["optimizer_config"], OPTIMIZER_TYPES), d["schedule"],
                       from_dict(sched_cls, d["schedule_config"]), from_dict(TrainingConfig, d["training"]))

    def describe(self) -> str:
        lr = getattr(self.schedule_config, "lr", None) or getattr(self.schedule_config, "initial_lr", None)
        task = Path(self.data.file).name if self.data.task in (FILE_TASK, CAUSAL_LM_TASK) else self.data.task
        return f"{task} · {self.optimizer}" + (f" lr {lr:g}" if lr else f" {self.schedule}")


def make_data(settings: DataSettings, seed: int, model=None):
    """(train, valid, kind, description) for the data settings. For causal-lm, `model` (when
    given) sets the limits the text is checked against: its vocabulary and positions."""
    if settings.task == CAUSAL_LM_TASK:
        from .conversations import conversation_file_format
        from .text import load_text_data, load_tokenizer, model_limits

        path = Path(settings.file).expanduser()
        vocab, positions = model_limits(model) if model is not None else (None, None)
        tokenizer = load_tokenizer(settings.tokenizer)
        chat = conversation_file_format(path)
        if chat is not None:
            data = _conversation_data(path, chat, settings, tokenizer, vocab, positions)
        else:
            data = load_text_data(path, tokenizer, int(settings.block_size), packing=settings.packing,
                                  per_line=settings.per_line, truncate=settings.truncate, vocab_size=vocab,
                                  max_positions=positions)
        if len(data) < 2:
            return data, None, CAUSAL_LM_TASK, path.name
        train, valid = data.split(1.0 - settings.valid_fraction, seed=seed)
        if getattr(data, "note", ""):  # what a conversation file held, before the split
            train.note = data.note
        return train, valid, CAUSAL_LM_TASK, path.name
    if settings.task == FILE_TASK:
        path = Path(settings.file).expanduser()
        options = {"kind": settings.kind} if path.suffix.lower() in (".csv", ".tsv", ".txt") else {}
        data = load_data_file(path, **options)
        train, valid = data.split(1.0 - settings.valid_fraction, seed=seed)
        kind = "classification" if data.targets.dtype.kind in "iu" else "regression"
        return train, valid, kind, path.name
    task = build_task(settings.task, seed=seed)
    return task.train, task.valid, task.kind, task.name


def _conversation_data(path: Path, chat: str, settings: DataSettings, tokenizer, vocab, positions):
    """A conversation file (`chat`: its format) rendered with the chat template of the tokenizer's
    folder: padded or packed as `settings.packing` says. The dataset's `note` says what it holds."""
    from .chat_data import describe_conversation_data, load_conversation_data
    from .chat_template import ChatTemplateError, read_chat_template
    from .text import TextDataError

    folder = Path(settings.tokenizer).expanduser()
    folder = folder.parent if folder.is_file() and folder.suffix.lower() != ".gguf" else folder  # a GGUF holds its own
    try:
        template = read_chat_template(folder)
    except ChatTemplateError as e:
        raise TextDataError(path, f"the file is conversation data ({chat} format), rendered with the model's chat "
                                  f"template, but the tokenizer folder {folder} has none ({e}): choose the folder "
                                  f"of a model with a chat template (an instruct model), or use text or "
                                  f"prompt/completion data") from None
    data = load_conversation_data(path, template, tokenizer, int(settings.block_size), truncate=settings.truncate,
                                  vocab_size=vocab, max_positions=positions, packing=settings.packing)
    data.note = describe_conversation_data(data, chat)
    return data


def _as_regression(ds):
    y = ds.targets
    y = y.astype(np.float32)[:, None] if y.ndim == 1 else y.astype(np.float32)
    return InMemoryDataset(ds.inputs, y, ds.name)


def _as_float_inputs(ds):
    return InMemoryDataset(ds.inputs.astype(np.float32), ds.targets, ds.name)


def fit_file_data(model, train, valid, settings: DataSettings, device=None):
    """Fit a data file to the model: (train, valid, kind, note).

    - Integer inputs stay int64 when the model takes them (its first layer an Embedding: token
      ids); a model whose first layer wants floats (a `DTypeError`) gets them as float32.
    - The targets' kind: the user's choice (`settings.kind`), or inferred: integer targets with
      at most `MAX_INFERRED_CLASSES` distinct values whose largest class the model's output
      width can hold are class labels (classification); others are numbers (regression). A
      loss chosen by name decides too (mse: regression; cross-entropy: classification).
    `note` says what was chosen or inferred, and why, for the user to see."""
    from ..autodiff import no_recording
    from ..tensor import DTypeError
    from .data import DataLoader

    notes = []
    output = None
    if len(train):
        vmodel = model.valid() if hasattr(model, "valid") else model

        def probe(ds):
            batch = next(iter(DataLoader(ds, min(2, len(ds)), shuffle=False, device=device)))
            with no_recording():
                return vmodel.forward(batch.inputs)

        if train.inputs.dtype.kind in "iu":
            try:
                output = probe(train)
                notes.append("integer inputs kept as int64 (the model takes indices)")
            except DTypeError:
                train, valid = _as_float_inputs(train), _as_float_inputs(valid)
                notes.append("integer inputs read as float32 (the model's first layer takes floats)")
            except Exception:  # noqa: BLE001 - the preflight reports data that does not fit
                output = None
        if output is None:
            try:
                output = probe(train)
            except Exception:  # noqa: BLE001 - the preflight reports it with the module
                output = None
    y = train.targets
    integer = y.dtype.kind in "iu"
    width = int(output.shape[-1]) if output is not None and len(output.shape) else None
    chosen = settings.kind
    if chosen == "auto" and settings.loss != "auto":
        chosen = "regression" if settings.loss == "mse" else "classification"
        how = f"chosen by the loss {settings.loss}"
    else:
        how = "chosen in the data settings"
    if chosen == "auto":
        both = np.concatenate([np.ravel(y), np.ravel(valid.targets)]) if integer else None
        if not integer:
            chosen, why = "regression", "the targets are not whole numbers"
        else:
            distinct = int(np.unique(both).size)
            classes = int(both.max()) + 1 if both.size else 0
            if distinct > MAX_INFERRED_CLASSES:
                chosen, why = "regression", f"the targets take {distinct} distinct values (more than " \
                                            f"{MAX_INFERRED_CLASSES} classes)"
            elif width is not None and classes > width:
                chosen, why = "regression", (f"the targets are whole numbers up to {classes - 1}, but the model "
                                             f"outputs {width} value(s), too few for {classes} classes")
            else:
                chosen, why = "classification", (f"the targets are whole numbers with {distinct} distinct "
                                                 f"values" + (f" and the model outputs {width}" if width else ""))
        how = f"inferred: {why}"
    if chosen == "regression" and integer:
        train, valid = _as_regression(train), _as_regression(valid)
    notes.insert(0, f"targets read as {chosen} ({how})")
    return train, valid, chosen, "; ".join(notes)


def make_step(loss: str):
    """The training step for a chosen loss (None: the loop's default for the task's kind)."""
    if loss == "auto":
        return None
    fn = cross_entropy if loss == "cross-entropy" else mse_loss

    def step(model, batch):
        output = model.forward(batch.inputs)
        return StepOutput(fn(output, batch.targets), output, batch.targets)

    return step
