"""Built-in tasks that need nothing downloaded: each makes its own data from a seed.

| name | kind | inputs | targets |
|---|---|---|---|
| `spirals` | classification, 2 classes | float32 `[n, 2]` points of two interleaved spirals | int64 `[n]` |
| `noisy-sine` | regression | float32 `[n, 1]`, x in [-pi, pi] | float32 `[n, 1]`, sin(x) + noise |
| `digits` | classification, 10 classes | float32 `[n, 28, 28]`, MNIST-normalized | int64 `[n]` |
| `copy` | sequence classification | int64 `[n, seq_length]` tokens | int64 `[n, seq_length]`: the input (or reversed) |

`digits` are drawn from the built-in stroke font (`stroke_digits.py`) with small random
shifts, rotations, sizes and stroke widths, and scaled as the MNIST models expect:
`((pixel / 255) - 0.1307) / 0.3081`.

`build_task(name, seed=0, **options)` returns a `DataTask` with `train` and `valid` data sets;
`TASKS` lists the names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .data import InMemoryDataset

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


@dataclass
class DataTask:
    """A built-in task's data: training and validation sets, their kind and, for classes, how
    many (a data set to train on, not a thread)."""

    name: str
    kind: str  # "classification" | "regression" | "causal-lm" (token rows, engine.train.text)
    train: InMemoryDataset
    valid: InMemoryDataset
    num_classes: int | None = None
    description: str = ""
    options: dict = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.inputs.shape[1:])

    def __repr__(self) -> str:
        return (
            f"DataTask({self.name!r}, {self.kind}, train {len(self.train)}, valid {len(self.valid)}, "
            f"inputs {list(self.input_shape)}" + (f", {self.num_classes} classes)" if self.num_classes else ")")
        )


def _spiral_points(n: int, rng, noise: float, turns: float):
    labels = np.arange(n, dtype=np.int64) % 2
    rng.shuffle(labels)
    t = np.sqrt(rng.uniform(0.0, 1.0, n)) * turns * 2.0 * np.pi
    r = t / (turns * 2.0 * np.pi)  # radius in [0, 1]
    angle = t + np.pi * labels
    pts = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1)
    pts = pts + rng.normal(0.0, noise, pts.shape)
    return pts.astype(np.float32), labels


def spirals(seed: int = 0, n_train: int = 2000, n_valid: int = 500, noise: float = 0.02, turns: float = 1.5) -> DataTask:
    """Two interleaved spirals in the unit disc; class = which spiral."""
    rng = np.random.default_rng(seed)
    xt, yt = _spiral_points(n_train, rng, noise, turns)
    xv, yv = _spiral_points(n_valid, rng, noise, turns)
    return DataTask("spirals", "classification", InMemoryDataset(xt, yt, "spirals/train"),
                InMemoryDataset(xv, yv, "spirals/valid"), 2, "two interleaved spirals",
                dict(seed=seed, n_train=n_train, n_valid=n_valid, noise=noise, turns=turns))


def noisy_sine(seed: int = 0, n_train: int = 1000, n_valid: int = 200, noise: float = 0.1) -> DataTask:
    """y = sin(x) + N(0, noise) for x uniform in [-pi, pi]."""
    rng = np.random.default_rng(seed)

    def make(n):
        x = rng.uniform(-np.pi, np.pi, (n, 1))
        y = np.sin(x) + rng.normal(0.0, noise, (n, 1))
        return x.astype(np.float32), y.astype(np.float32)

    xt, yt = make(n_train)
    xv, yv = make(n_valid)
    return DataTask("noisy-sine", "regression", InMemoryDataset(xt, yt, "noisy-sine/train"),
                InMemoryDataset(xv, yv, "noisy-sine/valid"), None, "sin(x) with Gaussian noise",
                dict(seed=seed, n_train=n_train, n_valid=n_valid, noise=noise))


@lru_cache(maxsize=4)
def _digit_images(n: int, seed: int, max_shift: float, max_rotation: float):
    from .stroke_digits import render_digits

    images, labels = render_digits(n, seed=seed, max_shift=max_shift, max_rotation=max_rotation)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def digits(seed: int = 0, n_train: int = 3000, n_valid: int = 600, max_shift: float = 2.0,
           max_rotation: float = 12.0) -> DataTask:
    """Digits 0-9 from the built-in stroke font at 28x28, MNIST-normalized."""
    def make(n, split_seed):
        images, labels = _digit_images(n, split_seed, max_shift, max_rotation)
        return ((images.astype(np.float32) / 255.0) - MNIST_MEAN) / MNIST_STD, np.array(labels)

    # each split is balanced on its own; the two never share a sample's random draws
    xt, yt = make(n_train, seed * 2)
    xv, yv = make(n_valid, seed * 2 + 1)
    return DataTask("digits", "classification",
                InMemoryDataset(xt, yt, "digits/train"),
                InMemoryDataset(xv, yv, "digits/valid"), 10,
                "digits 0-9 drawn from the built-in stroke font with random shifts and rotations",
                dict(seed=seed, n_train=n_train, n_valid=n_valid, max_shift=max_shift, max_rotation=max_rotation))


def copy_task(seed: int = 0, n_train: int = 2000, n_valid: int = 200, seq_length: int = 8, vocab_size: int = 10,
              reverse: bool = False) -> DataTask:
    """Random token sequences; the target at each position is the input token there (or,
    with `reverse`, the token at the mirrored position), so a model must route tokens."""
    if vocab_size < 2 or seq_length < 1:
        raise ValueError(f"copy_task: expected vocab_size >= 2 and seq_length >= 1, got {vocab_size}, {seq_length}")
    rng = np.random.default_rng(seed)

    def make(n):
        x = rng.integers(0, vocab_size, (n, seq_length), dtype=np.int64)
        y = x[:, ::-1].copy() if reverse else x.copy()
        return x, y

    xt, yt = make(n_train)
    xv, yv = make(n_valid)
    return DataTask("copy", "classification", InMemoryDataset(xt, yt, "copy/train"),
                InMemoryDataset(xv, yv, "copy/valid"), vocab_size,
                "copy (or reverse) a sequence of tokens",
                dict(seed=seed, n_train=n_train, n_valid=n_valid, seq_length=seq_length, vocab_size=vocab_size,
                     reverse=reverse))


_BUILDERS = {"spirals": spirals, "noisy-sine": noisy_sine, "digits": digits, "copy": copy_task}
TASKS = tuple(_BUILDERS)


def build_task(name: str, seed: int = 0, **options) -> DataTask:
    key = name.strip().lower().replace("_", "-")
    if key == "sine":
        key = "noisy-sine"
    builder = _BUILDERS.get(key)
    if builder is None:
        raise ValueError(f"unknown task {name!r}: expected one of {list(TASKS)}")
    try:
        return builder(seed=seed, **options)
    except TypeError as e:
        raise TypeError(f"task {name!r}: {e}") from None
