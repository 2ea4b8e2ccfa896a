"""Per-module gradient norms while a run trains: `module_grad_norms(model, grads)` (the L2 norm
of the gradients below each module; None for a frozen one) and `GradTap`, the optimizer
wrapper that samples them every `GRAD_NORM_S` seconds before an update."""
from __future__ import annotations

import math
import time
from typing import Callable

from ..tensor import raw

GRAD_NORM_S = 0.25  # gradient norms are sampled at most this often


def module_grad_norms(model, grads) -> dict[str, float | None]:
    """L2 norm of the gradients of the float parameters below each module that has some, in
    the model's module order; None for a module none of whose parameters got a gradient."""
    module_paths = [p for p, _ in model.named_modules()]
    known = set(module_paths)
    sums: dict[str, float] = {}
    seen: set[str] = set()
    for path, param in model.named_params():
        if param.kind != "float":
            continue
        owners = [""]
        parts = path.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in known:
                owners.append(prefix)
        g = grads.get(param.id)
        sq = None
        if g is not None:
            a = raw.array(g).ravel()
            xp = g.device.xp
            sq = float(xp.vdot(a, a))
        for o in owners:
            seen.add(o)
            if sq is not None:
                sums[o] = sums.get(o, 0.0) + sq
    return {p: (math.sqrt(sums[p]) if p in sums else None) for p in module_paths if p in seen}


class GradTap:
    """Wraps the optimizer: every `every_s` seconds, before an update, reports the per-module
    gradient norms through `emit(norms)`. Everything else is the wrapped optimizer's."""

    def __init__(self, inner, emit: Callable[[dict], None], every_s: float = GRAD_NORM_S):
        self.inner = inner
        self.emit = emit
        self.every_s = every_s
        self._last = -math.inf

    def step(self, lr, model, grads):
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self.emit(module_grad_norms(model, grads))
        return self.inner.step(lr, model, grads)

    def load(self, path, device=None):
        self.inner = self.inner.load(path, device)
        return self

    def __getattr__(self, name):
        return getattr(self.inner, name)
