"""Models for the training-flag tests: a probe that records what a layer handed on, by phase.

`Probe` keeps its own training flag, so it knows whether it runs in a training model or in a
`valid()` one without looking at its input (whose autodiff association is what is under test),
and writes what it receives into a shared `Tap` (a plain attribute: every transition of the
module keeps the same object)."""
import numpy as np

from engine import nn
from engine.module import Flag, Module


class Tap:
    def __init__(self):
        self.seen = {"train": [], "valid": []}

    def arrays(self, phase: str) -> list[np.ndarray]:
        return self.seen[phase]


class Probe(Module):
    def __init__(self, tap: Tap):
        self.tap = tap
        self.training = Flag(True)

    def forward(self, x):
        self.tap.seen["train" if self.training else "valid"].append(x.numpy())
        return x


class FlagNet(Module):
    """`layer -> probe -> Linear(d_in, d_out)`: the layer is the model's first."""

    def __init__(self, layer, tap: Tap, d_in: int = 2, d_out: int = 2, device=None):
        self.layer = layer
        self.probe = Probe(tap)
        self.head = nn.LinearConfig(d_in, d_out).init(device)

    def forward(self, x):
        return self.head.forward(self.probe.forward(self.layer.forward(x)))


def flag_layer(name: str):
    """A fresh layer, by name, of every built-in layer whose training behaviour is a flag."""
    return FLAG_LAYERS[name]().init()


FLAG_LAYERS = {  # name -> config factory
    "batch_norm": lambda: nn.BatchNormConfig(2),
    "dropout": lambda: nn.DropoutConfig(0.5),
    "gaussian_noise": lambda: nn.GaussianNoiseConfig(0.5),
}


def flag_data(name: str, n: int, seed: int):
    """Inputs `[n, 2]` and class targets: ones for dropout and noise (so what the layer did is
    plain to see), a shifted and scaled Gaussian for batch norm."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(np.int64)
    if name == "batch_norm":
        x = np.stack([3.0 + 2.0 * rng.standard_normal(n), -2.0 + 0.5 * rng.standard_normal(n)], axis=1)
    else:
        x = np.ones((n, 2))
    return x.astype(np.float32), y
