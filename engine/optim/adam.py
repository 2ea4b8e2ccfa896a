"""Adam (Kingma & Ba) with optional AMSGrad and L2 weight decay, as Burn's `AdamConfig`.

Defaults are Burn's: `beta_1=0.9, beta_2=0.999, epsilon=1e-5, amsgrad=False`, no weight decay,
no clipping. At step `t` (from 1), with `g` the gradient (plus `penalty * param` when weight
decay is set):

    m = beta_1 m + (1 - beta_1) g            v = beta_2 v + (1 - beta_2) g^2
    m_hat = m / (1 - beta_1^t)               v_hat = v / (1 - beta_2^t)   (AMSGrad: max over steps of v)
    param <- param - lr * m_hat / (sqrt(v_hat) + epsilon)

computed as Burn does: `m * sqrt(1-beta_2^t)/(1-beta_1^t) / (sqrt(v) + epsilon sqrt(1-beta_2^t))`.
State fields (record names): `momentum.time`, `momentum.moment_1`, `momentum.moment_2`,
`momentum.max_moment_2` (AMSGrad).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..tensor import cpu
from .base import ModuleOptimizer, SimpleOptimizer
from .decay import WeightDecayConfig, as_weight_decay, decayed_grad


@dataclass
class AdamConfig:
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-5
    amsgrad: bool = False
    weight_decay: WeightDecayConfig | float | None = None
    grad_clipping: object = None  # GradientClippingConfig

    def build(self) -> "Adam":
        wd = as_weight_decay(self.weight_decay)
        return Adam(self.beta_1, self.beta_2, self.epsilon, self.amsgrad, wd.penalty if wd else None)

    def init(self) -> ModuleOptimizer:
        clip = self.grad_clipping.init() if self.grad_clipping is not None else None
        return ModuleOptimizer(self.build(), clip)


def adaptive_moments(state, grad, beta_1, beta_2, xp, amsgrad=False):
    """Advance Adam's moments in `state` (created on the first call); returns (state, scratch)."""
    if state is None or "momentum.moment_1" not in state:
        m = xp.multiply(grad, 1.0 - beta_1)
        v = xp.multiply(grad, grad)
        v *= 1.0 - beta_2
        state = {"momentum.time": 1, "momentum.moment_1": m, "momentum.moment_2": v}
        if amsgrad:
            state["momentum.max_moment_2"] = v.copy()
        scratch = state["_scratch"] = xp.empty_like(m)
        return state, scratch
    m = state["momentum.moment_1"]
    v = state["momentum.moment_2"]
    scratch = state.get("_scratch")
    if scratch is None or scratch.shape != m.shape:
        scratch = state["_scratch"] = xp.empty_like(m)
    xp.multiply(grad, 1.0 - beta_1, out=scratch)
    m *= beta_1
    m += scratch
    xp.multiply(grad, grad, out=scratch)
    scratch *= 1.0 - beta_2
    v *= beta_2
    v += scratch
    if amsgrad:
        mx = state.get("momentum.max_moment_2")
        if mx is None:
            state["momentum.max_moment_2"] = v.copy()
        else:
            xp.maximum(mx, v, out=mx)
    state["momentum.time"] = int(state["momentum.time"]) + 1
    return state, scratch


def _fused_kernel(xp, param, grad, state):
    """`cpu._kernels.adam_update` (the CPU door's compiled kernels) when the step can be that one pass: float32 NumPy arrays of one
    shape, C-contiguous, the moments writable, numba there; else None (the NumPy passes, nine
    over memory, make the step)."""
    m, v = state.get("momentum.moment_1"), state.get("momentum.moment_2")
    if xp is not np or not all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous
                               and a.shape == param.shape for a in (param, grad, m, v)):
        return None
    if not (m.flags.writeable and v.flags.writeable):
        return None
    k = cpu.kernels()
    return None if k is None else k.adam_update


class Adam(SimpleOptimizer):
    def __init__(self, beta_1=0.9, beta_2=0.999, epsilon=1e-5, amsgrad=False, penalty=None):
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.amsgrad = bool(amsgrad)
        self.penalty = penalty

    def step(self, lr, param, grad, state, xp):
        if self.penalty:
            grad = decayed_grad(self.penalty, param, grad, xp)
        kernel = None if self.amsgrad or state is None else _fused_kernel(xp, param, grad, state)
        if kernel is not None:  # after the first step: one compiled pass, the same bits
            t = int(state["momentum.time"]) + 1
            bc2_sqrt, factor = self._corrections(t)
            # each constant rounded to float32 as NumPy rounds a Python float met with float32 arrays
            c = np.array([self.beta_1, 1.0 - self.beta_1, self.beta_2, 1.0 - self.beta_2,
                          self.epsilon * bc2_sqrt, -float(lr) * factor], np.float32)
            new = np.empty_like(param)
            kernel(param.reshape(-1), grad.reshape(-1), state["momentum.moment_1"].reshape(-1),
                   state["momentum.moment_2"].reshape(-1), new.reshape(-1), c)
            state["momentum.time"] = t
            state.pop("_scratch", None)  # the NumPy passes' buffer, which this path never needs
            return new, state
        state, s = adaptive_moments(state, grad, self.beta_1, self.beta_2, xp, self.amsgrad)
        bc2_sqrt, factor = self._corrections(state["momentum.time"])
        v = state["momentum.max_moment_2"] if self.amsgrad else state["momentum.moment_2"]
        xp.sqrt(v, out=s)
        s += self.epsilon * bc2_sqrt
        xp.divide(state["momentum.moment_1"], s, out=s)
        new = xp.multiply(s, -float(lr) * factor)
        new += param
        return new, state

    def _corrections(self, t: int) -> tuple[float, float]:
        """Burn's bias corrections at step `t`: sqrt(1 - beta_2^t) and that over 1 - beta_1^t."""
        bc2_sqrt = math.sqrt(1.0 - self.beta_2**t)
        return bc2_sqrt, bc2_sqrt / (1.0 - self.beta_1**t)

    def __repr__(self) -> str:
        return (f"Adam(beta_1={self.beta_1}, beta_2={self.beta_2}, epsilon={self.epsilon}, "
                f"amsgrad={self.amsgrad}, weight_decay={self.penalty})")
