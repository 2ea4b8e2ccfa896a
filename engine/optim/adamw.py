"""AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, as Burn's `AdamWConfig`.

Defaults are Burn's: `beta_1=0.9, beta_2=0.999, epsilon=1e-5, weight_decay=1e-4,
cautious_weight_decay=False`. At step `t`:

    m, v as Adam;  update = (m / (1 - beta_1^t)) / (sqrt(v / (1 - beta_2^t)) + epsilon)
    param <- param * (1 - lr * weight_decay) - lr * update

With `cautious_weight_decay`, the decay is skipped where the parameter's sign differs from
the first moment's (arXiv:2510.12402), as Burn does.
"""
from __future__ import annotations

from dataclasses import dataclass

from .adam import adaptive_moments
from .base import ModuleOptimizer, SimpleOptimizer


@dataclass
class AdamWConfig:
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-5
    weight_decay: float = 1e-4
    cautious_weight_decay: bool = False
    grad_clipping: object = None  # GradientClippingConfig

    def build(self) -> "AdamW":
        return AdamW(self.beta_1, self.beta_2, self.epsilon, self.weight_decay, self.cautious_weight_decay)

    def init(self) -> ModuleOptimizer:
        clip = self.grad_clipping.init() if self.grad_clipping is not None else None
        return ModuleOptimizer(self.build(), clip)


class AdamW(SimpleOptimizer):
    def __init__(self, beta_1=0.9, beta_2=0.999, epsilon=1e-5, weight_decay=1e-4, cautious=False):
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.weight_decay = float(weight_decay)
        self.cautious = bool(cautious)

    def step(self, lr, param, grad, state, xp):
        lr = float(lr)
        state, s = adaptive_moments(state, grad, self.beta_1, self.beta_2, xp)
        t = state["momentum.time"]
        m = state["momentum.moment_1"]
        # s = sqrt(v / bc2) + eps, then m / bc1 / s
        xp.multiply(state["momentum.moment_2"], 1.0 / (1.0 - self.beta_2**t), out=s)
        xp.sqrt(s, out=s)
        s += self.epsilon
        xp.divide(m, s, out=s)
        new = xp.multiply(s, -lr / (1.0 - self.beta_1**t))
        decay = lr * self.weight_decay
        if decay == 0.0:
            new += param
        elif self.cautious:
            differ = (param >= 0) != (m >= 0)
            new += param
            new -= xp.where(differ, 0.0, param * decay).astype(new.dtype, copy=False)
        else:
            xp.multiply(param, 1.0 - decay, out=s)  # the scratch is free again
            new += s
        return new, state

    def __repr__(self) -> str:
        return (f"AdamW(beta_1={self.beta_1}, beta_2={self.beta_2}, epsilon={self.epsilon}, "
                f"weight_decay={self.weight_decay}, cautious_weight_decay={self.cautious})")
