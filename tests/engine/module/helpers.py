"""Small modules for the module-system tests (independent of engine.nn)."""
from __future__ import annotations

import math

from engine import Module, Param, Tensor
from engine.module import DisplaySettings, Flag, Initializer


class Counter:
    """An initializer that counts its calls and remembers the devices it ran on."""

    def __init__(self, shape, value=None):
        self.shape = tuple(shape)
        self.calls = 0
        self.devices = []
        self.value = value

    def __call__(self, device, require_grad):
        self.calls += 1
        self.devices.append(device)
        if self.value is None:
            t = Tensor.random(self.shape, ("normal", 0.0, 1.0), device=device)
        else:
            t = Tensor.full(self.shape, float(self.value), device=device)
        return t.require_grad() if require_grad else t

    def param(self, device=None, require_grad=True):
        return Param.uninitialized(self, device, require_grad, self.shape)


class Linear(Module):
    """A Linear like Burn's: weight [d_input, d_output], optional bias, inline display."""

    def __init__(self, d_input, d_output, bias=True, device=None):
        self.weight = Initializer.KaimingUniform(1 / math.sqrt(3), False).init_with(
            [d_input, d_output], fan_in=d_input, device=device)
        self.bias = (Initializer.KaimingUniform(1 / math.sqrt(3), False).init_with(
            [d_output], fan_in=d_input, device=device) if bias else None)
        self.d_input = d_input
        self.d_output = d_output

    def custom_settings(self):
        return DisplaySettings().with_new_line_after_attribute(False).optional()

    def custom_content(self, content):
        return (content.add("d_input", self.d_input).add("d_output", self.d_output)
                .add("bias", self.bias is not None).optional())

    def forward(self, x):
        y = x @ self.weight.val()
        return y if self.bias is None else y + self.bias.val()


class Dropout(Module):
    """A dropout-like module: its behaviour is a training Flag; active only for autodiff inputs."""

    def __init__(self, prob):
        self.prob = prob
        self.training = Flag(True)

    def custom_settings(self):
        return DisplaySettings().with_new_line_after_attribute(False).optional()

    def custom_content(self, content):
        return content.add("prob", self.prob).optional()

    def forward(self, x):
        if not self.training or self.prob == 0 or not x.is_autodiff():
            return x
        keep = Tensor.random(x.shape, ("bernoulli", 1 - self.prob), device=x.device)
        return x * keep.cast(x.dtype) * (1.0 / (1 - self.prob))


class Gelu(Module):
    def forward(self, x):
        return x


class Mlp(Module):
    def __init__(self, device=None):
        self.linear1 = Linear(3, 4, device=device)
        self.dropout = Dropout(0.5)
        self.linear2 = Linear(4, 2, device=device)

    def forward(self, x):
        return self.linear2.forward(self.dropout.forward(self.linear1.forward(x).relu()))
