"""Issue 18: checkpoints kept (the last N), a full disk leaves no half-written folder and says
so, and a data file's integer inputs / targets are fitted to the model."""
import errno

import numpy as np
import pytest

from engine import nn
from engine.train.checkpoint import describe_os_error, prune_checkpoints, save_checkpoint
from engine.train.data import InMemoryDataset
from engine.train.learner import TrainingConfig
from engine.train.run_spec import DataSettings, fit_file_data


def test_prune_keeps_the_newest_and_zero_keeps_all(tmp_path):
    for e in range(1, 6):
        (tmp_path / f"epoch-{e}").mkdir()
    assert prune_checkpoints(tmp_path, 0) == []
    assert len(list(tmp_path.iterdir())) == 5
    prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-4", "epoch-5"]
    with pytest.raises(ValueError, match="keep_checkpoints"):
        TrainingConfig(keep_checkpoints=-1)


def test_a_full_disk_leaves_no_partial_checkpoint(tmp_path):
    class Full:
        def into_record(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path / "epoch-1", Full(), None, None, {})
    assert list(tmp_path.iterdir()) == []
    assert describe_os_error(info.value) == "the disk is full (No space left on device)"


def test_integer_inputs_stay_integer_for_an_embedding_and_become_float_for_a_linear(tmp_path):
    x = np.arange(20, dtype=np.int64).reshape(10, 2) % 5
    y = np.arange(10, dtype=np.int64) % 3
    ds = InMemoryDataset(x, y)
    emb = nn.EmbeddingConfig(5, 4).init()
    train, _, kind, note = fit_file_data(emb, ds, ds, _auto())
    assert train.inputs.dtype == np.int64 and "int64" in note
    lin = nn.LinearConfig(2, 3).init()
    train, _, kind, note = fit_file_data(lin, ds, ds, _auto())
    assert train.inputs.dtype == np.float32 and kind == "classification" and "inferred" in note
    one = nn.LinearConfig(2, 1).init()  # too narrow for 3 classes: numbers
    train, _, kind, note = fit_file_data(one, ds, ds, _auto())
    assert kind == "regression" and train.targets.shape == (10, 1) and train.targets.dtype == np.float32


def _auto():
    """Settings of a file run (no file on disk needed: the checks of __post_init__ are skipped)."""
    s = object.__new__(DataSettings)
    s.task, s.file, s.valid_fraction, s.loss, s.kind = "file", "x.npz", 0.2, "auto", "auto"
    return s


def test_a_typed_file_with_a_built_in_task_is_refused():
    with pytest.raises(ValueError, match="a data file is given"):
        DataSettings("spirals", "/tmp/data.csv")
