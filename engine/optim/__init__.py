"""Optimizers as module mappers, learning-rate schedules and gradient clipping (Burn's
`burn::optim`).

    grads = optim.GradientsParams.from_grads(loss.backward(), model)
    model = optimizer.step(lr, model, grads)
"""
from .grad_clipping import GradientClipping, GradientClippingConfig
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

__all__ = [
    "ConstantLr",
    "CosineAnnealingLrSchedulerConfig",
    "ExponentialLrSchedulerConfig",
    "GradientClipping",
    "GradientClippingConfig",
    "LinearLrSchedulerConfig",
    "LrScheduler",
    "LrSchedulerError",
    "NoamLrSchedulerConfig",
    "SequentialLrSchedulerConfig",
    "StepLrSchedulerConfig",
    "as_scheduler",
    "linear_warmup",
]
