"""Small models the training tests share."""
from engine import nn
from engine.module import Module


class MLP(Module):
    def __init__(self, device=None, d_in=2, hidden=64, d_out=2, dropout=0.0):
        self.fc1 = nn.LinearConfig(d_in, hidden).init(device)
        self.fc2 = nn.LinearConfig(hidden, hidden).init(device)
        self.fc3 = nn.LinearConfig(hidden, d_out).init(device)
        self.dropout = nn.DropoutConfig(dropout).init()
        self.act = nn.Relu()

    def forward(self, x):
        x = self.dropout.forward(self.act.forward(self.fc1.forward(x)))
        x = self.dropout.forward(self.act.forward(self.fc2.forward(x)))
        return self.fc3.forward(x)


class Countdown:
    """A plain attribute (every transition of the module shares it): counts training forwards."""

    def __init__(self, at: int):
        self.at = at
        self.calls = 0


class NanGradAt(Module):
    """A linear classifier with a scale `s = 0` that only its `at`-th training forward uses, as
    `0 * sqrt(s)`: that forward's output and loss are what they would have been (finite), but
    the gradient of `s` is `0 * 0.5 / sqrt(0)`, NaN, so that step's update makes `s` NaN."""

    def __init__(self, at: int, device=None):
        from engine import Param, Tensor

        self.fc = nn.LinearConfig(2, 2).init(device)
        self.s = Param(Tensor.zeros([1], device=device))
        self.counter = Countdown(at)

    def forward(self, x):
        out = self.fc.forward(x)
        if self.s.is_require_grad():  # a training forward: valid() turns it off
            self.counter.calls += 1
            if self.counter.calls == self.counter.at:
                out = out + self.s.val().sqrt() * 0.0
        return out
