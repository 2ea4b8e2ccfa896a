"""Optimizers as module mappers, learning-rate schedules and gradient clipping (Burn's
`burn::optim`).

    grads = optim.GradientsParams.from_grads(loss.backward(), model)
    model = optimizer.step(lr, model, grads)
"""
from .adam import Adam, AdamConfig
from .adamw import AdamW, AdamWConfig
from .base import ModuleOptimizer, OptimizerRecord, SimpleOptimizer
from .decay import MomentumConfig, WeightDecayConfig
from .grad_clipping import GradientClipping, GradientClippingConfig
from .grads import GradientsParams
from .lr_scheduler import (
    ConstantLr,
    CosineAnnealingLrSchedulerConfig,
    ExponentialLrSchedulerConfig,
    LinearLrSchedulerConfig,
    LrScheduler,
    LrSchedulerError,
    NoamLrSchedulerConfig,
    SequentialLrSchedulerConfig,
    StepLrSchedulerConfig,
    as_scheduler,
    linear_warmup,
)
from .sgd import Sgd, SgdConfig

__all__ = [
    "Adam",
    "AdamConfig",
    "AdamW",
    "AdamWConfig",
    "ConstantLr",
    "CosineAnnealingLrSchedulerConfig",
    "ExponentialLrSchedulerConfig",
    "GradientClipping",
    "GradientClippingConfig",
    "GradientsParams",
    "LinearLrSchedulerConfig",
    "LrScheduler",
    "LrSchedulerError",
    "ModuleOptimizer",
    "MomentumConfig",
    "NoamLrSchedulerConfig",
    "OptimizerRecord",
    "SequentialLrSchedulerConfig",
    "Sgd",
    "SgdConfig",
    "SimpleOptimizer",
    "StepLrSchedulerConfig",
    "WeightDecayConfig",
    "as_scheduler",
    "linear_warmup",
]
