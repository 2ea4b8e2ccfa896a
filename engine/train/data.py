"""Data sets and the DataLoader.

A `Dataset` has a length and gives items by index; an item is a tuple of arrays (inputs,
targets). `InMemoryDataset` holds whole arrays and is what the built-in tasks and the file
loaders produce: the loader then gathers a batch with one fancy-index per array instead of
stacking items one by one.

`DataLoader(dataset, batch_size, shuffle=True, seed=0)` yields `Batch(inputs, targets)` of
tensors on a device. Shuffling is seeded per epoch (`loader.set_epoch(e)`; the order of epoch
`e` depends only on `(seed, e)`), so a run resumed at epoch `e` sees the very batches the
uninterrupted run saw. The last partial batch is kept unless `drop_last=True`.

`autodiff=True` makes training batches: inputs and targets associated with autodiff (no
gradient kept), as Burn's training batches live on the autodiff backend. Layers apply their
training behaviour (dropout, batch-norm statistics, noise) only to autodiff inputs, so a model
whose first layer is one of them needs such batches; `Learner` trains on them and validates
on plain ones. A loop of your own calls `inputs.autodiff()` (or uses `autodiff=True`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Dataset:
    """Base data set: override `__len__` and `__getitem__` (returning a tuple of arrays)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index):
        raise NotImplementedError

    def arrays(self):
        """The whole data as a tuple of arrays when it is held in memory, else None."""
        return None

    def extras(self) -> dict:
        """Arrays besides inputs and targets, by the `Batch` field they fill (`segment_ids`,
        `position_ids` of packed token rows), with the same first axis; gathered into each
        batch as int64 tensors (never autodiff). Only in-memory data sets have them."""
        return {}


class InMemoryDataset(Dataset):
    """Inputs and targets as arrays with the same first axis."""

    def __init__(self, inputs, targets, name: str = "data"):
        inputs = np.asarray(inputs)
        targets = np.asarray(targets)
        if inputs.shape[:1] != targets.shape[:1]:
            raise ValueError(
                f"{name}: inputs and targets must have the same number of items: "
                f"inputs have {inputs.shape[0] if inputs.ndim else 'no'} (shape {list(inputs.shape)}), "
                f"targets have {targets.shape[0] if targets.ndim else 'no'} (shape {list(targets.shape)})"
            )
        self.inputs = inputs
        self.targets = targets
        self.name = name

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]

    def arrays(self):
        return self.inputs, self.targets

    def split(self, fraction: float, seed: int = 0) -> tuple["InMemoryDataset", "InMemoryDataset"]:
        """Two disjoint data sets: a seeded random `fraction` of the items, and the rest."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split: fraction must be between 0 and 1 (exclusive), got {fraction}")
        order = np.random.default_rng(seed).permutation(len(self))
        k = int(round(fraction * len(self)))
        a, b = order[:k], order[k:]
        return (
            InMemoryDataset(self.inputs[a], self.targets[a], f"{self.name}[:{k}]"),
            InMemoryDataset(self.inputs[b], self.targets[b], f"{self.name}[{k}:]"),
        )

    def __repr__(self) -> str:
        return (
            f"InMemoryDataset({self.name!r}, {len(self)} items, inputs {list(self.inputs.shape[1:])} "
            f"{self.inputs.dtype}, targets {list(self.targets.shape[1:])} {self.targets.dtype})"
        )


@dataclass
class Batch:
    inputs: object  # Tensor
    targets: object  # Tensor
    segment_ids: object = None  # Tensor [batch, seq]: packed sequences (see engine.train.text.TextDataset)
    position_ids: object = None  # Tensor [batch, seq]: each packed sequence's positions from 0

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator for one epoch of one run: depends only on (seed, epoch)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch)]))


class DataLoader:
    """Batches of a data set as tensors on `device`.

    Float inputs become the device's default float dtype; integer targets stay int64 (class
    indices), float targets become float. With `autodiff=True` both are associated with
    autodiff (training batches); otherwise they are plain (validation, inference).
    """

    def __init__(self, dataset: Dataset, batch_size: int = 32, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, device=None, autodiff: bool = False):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size!r}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.device = device
        self.autodiff = bool(autodiff)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self) -> np.ndarray:
        n = len(self.dataset)
        if self.shuffle:
            return epoch_rng(self.seed, self.epoch).permutation(n)
        return np.arange(n)

    def __iter__(self):
        from ..tensor import Tensor

        order = self.order()
        arrays = self.dataset.arrays()
        n = len(order)
        stop = n - n % self.batch_size if self.drop_last else n
        contiguous = not self.shuffle
        for start in range(0, stop, self.batch_size):
            idx = order[start:start + self.batch_size]
            if arrays is not None:
                if contiguous:
                    x, y = (a[start:start + len(idx)] for a in arrays[:2])
                else:
                    x, y = (a[idx] for a in arrays[:2])
            else:
                items = [self.dataset[int(i)] for i in idx]
                x = np.stack([np.asarray(it[0]) for it in items])
                y = np.stack([np.asarray(it[1]) for it in items])
            ad = self.autodiff
            extra = {}
            if arrays is not None:
                rows = slice(start, start + len(idx)) if contiguous else idx
                extra = {k: _to_tensor(Tensor, a[rows], self.device) for k, a in self.dataset.extras().items()}
            yield Batch(_to_tensor(Tensor, x, self.device, ad), _to_tensor(Tensor, y, self.device, ad), **extra)


def _to_tensor(Tensor, arr, device, autodiff: bool = False):
    arr = np.asarray(arr)
    if arr.dtype.kind in "iu":
        t = Tensor.from_data(arr.astype(np.int64, copy=False), device=device)
    else:
        t = Tensor.from_data(arr, device=device)
    return t.autodiff() if autodiff else t
