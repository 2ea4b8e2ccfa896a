"""GradientsParams: the gradients of one backward pass, keyed by parameter id.

`GradientsParams.from_grads(loss.backward(), model)` visits the model's float parameters and
takes each one's gradient out of the `Gradients` (Burn's `from_grads` consumes them too). A
parameter that does not require grad, or is still uninitialized, has none. An optimizer then
matches gradients to parameters by id, so a model whose parameters were moved, cloned or
reordered is still updated correctly.
"""
from __future__ import annotations

import math

from ..module.visitor import ModuleVisitor
from ..tensor import Tensor
from ..tensor.raw import array, wrap


class _Collect(ModuleVisitor):
    __slots__ = ("grads", "out", "only")

    def __init__(self, grads, out, only):
        self.grads = grads
        self.out = out
        self.only = only

    def visit_float(self, param) -> None:
        if not param.is_initialized():
            return
        if self.only is not None and param.id not in self.only:
            return
        g = param.base().grad_remove(self.grads)
        if g is not None:
            self.out._by_id[param.id] = g


class GradientsParams:
    """Gradients (Tensors) by `ParamId`."""

    __slots__ = ("_by_id",)

    def __init__(self):
        self._by_id: dict = {}

    @staticmethod
    def from_grads(grads, module) -> "GradientsParams":
        """Take every parameter's gradient out of `grads` (a `Gradients`)."""
        return GradientsParams.from_module(grads, module)

    @staticmethod
    def from_module(grads, module) -> "GradientsParams":
        out = GradientsParams()
        module.visit(_Collect(grads, out, None))
        return out

    @staticmethod
    def from_params(grads, module, ids) -> "GradientsParams":
        """Only the gradients of the parameters whose ids are in `ids`."""
        out = GradientsParams()
        module.visit(_Collect(grads, out, set(ids)))
        return out

    def get(self, id):
        return self._by_id.get(id)

    def remove(self, id):
        return self._by_id.pop(id, None)

    def register(self, id, grad: Tensor) -> None:
        """Set (or replace) the gradient of parameter `id`."""
        if not isinstance(grad, Tensor):
            raise TypeError(f"GradientsParams.register: expected a Tensor gradient, got {type(grad).__name__}")
        self._by_id[id] = grad

    def ids(self) -> list:
        return list(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def is_empty(self) -> bool:
        return not self._by_id

    def __contains__(self, id) -> bool:
        return id in self._by_id

    def global_norm(self) -> float:
        """The L2 norm of all gradients together."""
        total = 0.0
        for g in self._by_id.values():
            a = array(g)
            total += float((a.astype("float64") ** 2).sum())
        return math.sqrt(total)

    def clip_grad_norm_global(self, max_norm: float) -> float:
        """Scale all gradients together so that their global L2 norm is at most `max_norm`
        (PyTorch's `clip_grad_norm_`); returns the norm before clipping."""
        norm = self.global_norm()
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for k, g in self._by_id.items():
                a = array(g)
                self._by_id[k] = wrap(a * a.dtype.type(coef), g.device)
        return norm

    def __repr__(self) -> str:
        return f"GradientsParams({len(self)} tensors)"
