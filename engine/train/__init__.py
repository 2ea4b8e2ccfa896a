"""Training: the loop the app drives (`Learner`), its events, metrics, losses, data sets and
the built-in tasks."""
from . import events
from .data import Batch, DataLoader, Dataset, InMemoryDataset
from .events import (
    CheckpointSaved,
    EpochMetrics,
    Event,
    Failed,
    Finished,
    LearningRate,
    Paused,
    Resumed,
    Started,
    StepLoss,
    Stopped,
    Throughput,
    ValidationMetrics,
)
from .data_files import DataFileError, load_csv, load_data_file, load_npz
from .learner import Learner, StepOutput, TrainingConfig, TrainingResult
from .losses import cross_entropy, mse_loss
from .metrics import AccuracyMetric, CustomMetric, LossMetric, Metric, TopKAccuracyMetric
from .tasks import TASKS, DataTask, build_task

__all__ = [
    "AccuracyMetric",
    "Batch",
    "CheckpointSaved",
    "CustomMetric",
    "DataFileError",
    "DataLoader",
    "DataTask",
    "Dataset",
    "EpochMetrics",
    "Event",
    "Failed",
    "Finished",
    "InMemoryDataset",
    "Learner",
    "LearningRate",
    "LossMetric",
    "Metric",
    "Paused",
    "Resumed",
    "Started",
    "StepLoss",
    "StepOutput",
    "Stopped",
    "TASKS",
    "Throughput",
    "TopKAccuracyMetric",
    "TrainingConfig",
    "TrainingResult",
    "ValidationMetrics",
    "build_task",
    "cross_entropy",
    "events",
    "load_csv",
    "load_data_file",
    "load_npz",
    "mse_loss",
]
