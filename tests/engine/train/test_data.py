"""Dataset and DataLoader: batching, the last partial batch, seeded per-epoch shuffling."""
import numpy as np
import pytest

from engine import Tensor
from engine.train import DataLoader, Dataset, InMemoryDataset


def make(n=10):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.int64)
    return InMemoryDataset(x, y)


def test_batches_cover_every_item_once_with_a_last_partial_batch():
    loader = DataLoader(make(10), batch_size=4, shuffle=True, seed=3)
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert len(loader) == 3
    seen = np.concatenate([b.targets.numpy() for b in batches])
    assert sorted(seen.tolist()) == list(range(10))
    for b in batches:  # inputs stay paired with their targets
        np.testing.assert_array_equal(b.inputs.numpy()[:, 0], b.targets.numpy() * 2)
        assert isinstance(b.inputs, Tensor) and b.inputs.dtype == "float32" and b.targets.dtype == "int64"


def test_drop_last_and_no_shuffle():
    loader = DataLoader(make(10), batch_size=4, shuffle=False, drop_last=True)
    batches = list(loader)
    assert len(loader) == 2 and [b.targets.numpy().tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_depends_only_on_seed_and_epoch():
    a = DataLoader(make(50), batch_size=50, seed=7)
    b = DataLoader(make(50), batch_size=50, seed=7)
    c = DataLoader(make(50), batch_size=50, seed=8)
    order = lambda l, e: (l.set_epoch(e), next(iter(l)).targets.numpy().tolist())[1]  # noqa: E731
    assert order(a, 1) == order(b, 1)
    assert order(a, 1) != order(a, 2)  # a new order each epoch
    assert order(a, 2) == order(b, 2)
    assert order(a, 1) != order(c, 1)
    # epoch 3 after epochs 1 and 2 equals epoch 3 straight away (what resuming needs)
    fresh = DataLoader(make(50), batch_size=50, seed=7)
    assert order(a, 3) == order(fresh, 3)


def test_generic_dataset_is_stacked_item_by_item():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.array([i], dtype=np.float32), np.array(i * i)

    batches = list(DataLoader(Squares(), batch_size=2, shuffle=False))
    assert [b.targets.numpy().tolist() for b in batches] == [[0, 1], [4, 9], [16]]
    assert batches[0].inputs.shape == (2, 1)


def test_split_is_disjoint_and_complete():
    a, b = make(20).split(0.25, seed=1)
    assert len(a) == 5 and len(b) == 15
    assert sorted(np.concatenate([a.targets, b.targets]).tolist()) == list(range(20))


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="inputs have 3.*targets have 2"):
        InMemoryDataset(np.zeros((3, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(make(), batch_size=0)
