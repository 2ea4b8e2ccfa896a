"""A run's settings besides the model: where the data comes from, the loss, the optimizer, the
learning-rate schedule and the training config (`RunSpec`, saved in the run folder as
`run.json`), and what they make: the data sets (`make_data`) and the training step of a
chosen loss (`make_step`).

    spec = RunSpec(DataSettings("spirals"), "Adam", optim.AdamConfig(), "constant", ConstantLrConfig(1e-2),
                   TrainingConfig(num_epochs=2))
    assert RunSpec.from_json(spec.to_json()) == spec
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import optim
from .config_json import from_dict, to_dict
from .files import load_data_file
from .learner import StepOutput, TrainingConfig
from .losses import cross_entropy, mse_loss
from .tasks import TASKS, build_task

FILE_TASK = "file"
LOSSES = ("auto", "cross-entropy", "mse")


@dataclass
class DataSettings:
    """Where the data comes from and which loss to train with."""

    task: str = "spirals"  # a built-in task, or "file"
    file: str = ""  # a .npz (arrays x, y) or .csv (target in the last column) when task is "file"
    valid_fraction: float = 0.2  # of a file's items, held out for validation
    loss: str = "auto"  # auto: cross-entropy for class targets, mse otherwise

    def __post_init__(self):
        choices = (*TASKS, FILE_TASK)
        if self.task not in choices:
            raise ValueError(f"task: expected one of {list(choices)}, found {self.task!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {list(LOSSES)}, found {self.loss!r}")
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
        task = Path(self.data.file).name if self.data.task == FILE_TASK else self.data.task
        return f"{task} · {self.optimizer}" + (f" lr {lr:g}" if lr else f" {self.schedule}")


def make_data(settings: DataSettings, seed: int):
    """(train, valid, kind, description) for the data settings."""
    if settings.task == FILE_TASK:

        data = load_data_file(Path(settings.file).expanduser())
        train, valid = data.split(1.0 - settings.valid_fraction, seed=seed)
        kind = "classification" if data.targets.dtype.kind in "iu" else "regression"
        return train, valid, kind, Path(settings.file).name
    task = build_task(settings.task, seed=seed)
    return task.train, task.valid, task.kind, task.name


def make_step(loss: str):
    """The training step for a chosen loss (None: the loop's default for the task's kind)."""
    if loss == "auto":
        return None
    fn = cross_entropy if loss == "cross-entropy" else mse_loss

    def step(model, batch):
        output = model.forward(batch.inputs)
        return StepOutput(fn(output, batch.targets), output, batch.targets)

    return step
