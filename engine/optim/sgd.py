"""Stochastic gradient descent with optional weight decay and momentum (Burn's `SgdConfig`).

`SgdConfig(weight_decay=None, momentum=None, gradient_clipping=None)` as in Burn, where
`weight_decay` is a `WeightDecayConfig` (or a float penalty) and `momentum` a `MomentumConfig`
(momentum 0.9, dampening 0.1, nesterov off by default). Update:
`param <- param - lr * direction`, the direction being the (decayed) gradient passed through
momentum when configured.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import ModuleOptimizer, SimpleOptimizer
from .decay import MomentumConfig, WeightDecayConfig, as_weight_decay, decayed_grad


@dataclass
class SgdConfig:
    weight_decay: WeightDecayConfig | float | None = None
    momentum: MomentumConfig | None = None
    gradient_clipping: object = None  # GradientClippingConfig

    def build(self) -> "Sgd":
        return Sgd(as_weight_decay(self.weight_decay), self.momentum)

    def init(self) -> ModuleOptimizer:
        clip = self.gradient_clipping.init() if self.gradient_clipping is not None else None
        return ModuleOptimizer(self.build(), clip)


class Sgd(SimpleOptimizer):
    def __init__(self, weight_decay: WeightDecayConfig | None = None, momentum: MomentumConfig | None = None):
        self.penalty = weight_decay.penalty if weight_decay is not None else None
        self.momentum = momentum

    def step(self, lr, param, grad, state, xp):
        if self.penalty:
            grad = decayed_grad(self.penalty, param, grad, xp)
        neg_lr = -float(lr)
        m = self.momentum
        if m is None:
            new = xp.multiply(grad, neg_lr)
            new += param
            return new, (state if state is not None else {})
        mom = float(m.momentum)
        if state is None or "momentum.velocity" not in state:
            velocity = grad.copy()
            state = {"momentum.velocity": velocity}
        else:
            velocity = state["momentum.velocity"]
            scratch = state.get("_scratch")
            if scratch is None or scratch.shape != velocity.shape:
                scratch = state["_scratch"] = xp.empty_like(velocity)
            xp.multiply(grad, 1.0 - float(m.dampening), out=scratch)
            velocity *= mom
            velocity += scratch
        new = xp.multiply(velocity, neg_lr * mom if m.nesterov else neg_lr)
        if m.nesterov:
            scratch = state.get("_scratch")
            if scratch is None or scratch.shape != velocity.shape:
                scratch = state["_scratch"] = xp.empty_like(velocity)
            xp.multiply(grad, neg_lr, out=scratch)
            new += scratch
        new += param
        return new, state

    def __repr__(self) -> str:
        return f"Sgd(weight_decay={self.penalty}, momentum={self.momentum})"
