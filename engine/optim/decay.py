"""Weight decay (an L2 penalty added to the gradient) and momentum, as Burn's
`WeightDecayConfig` and `MomentumConfig`.

- weight decay: `grad <- grad + penalty * param`.
- momentum (Burn's, PyTorch's): on the first step `velocity = grad`; afterwards
  `velocity = momentum * velocity + (1 - dampening) * grad`; the update direction is
  `grad + momentum * velocity` with Nesterov, else `velocity`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightDecayConfig:
    penalty: float

    def __post_init__(self):
        if self.penalty < 0:
            raise ValueError(f"WeightDecayConfig: penalty must be at least 0, got {self.penalty}")


@dataclass(frozen=True)
class MomentumConfig:
    momentum: float = 0.9
    dampening: float = 0.1
    nesterov: bool = False

    def __post_init__(self):
        if not 0.0 <= self.momentum:
            raise ValueError(f"MomentumConfig: momentum must be at least 0, got {self.momentum}")
        if not 0.0 <= self.dampening <= 1.0:
            raise ValueError(f"MomentumConfig: dampening must be between 0 and 1, got {self.dampening}")


def decayed_grad(penalty: float, param, grad, xp):
    """`grad + penalty * param` in a fresh array."""
    out = xp.multiply(param, penalty)
    out += grad
    return out


def as_weight_decay(value) -> WeightDecayConfig | None:
    if value is None or isinstance(value, WeightDecayConfig):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return WeightDecayConfig(float(value)) if value else None
    raise TypeError(f"weight_decay: expected a WeightDecayConfig, a float penalty or None, got {type(value).__name__}")
