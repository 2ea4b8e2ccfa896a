"""Checkpoints: a run resumed from its checkpoint reproduces the uninterrupted run's losses."""
import json

import numpy as np
import pytest

from engine import optim
from engine.train import CheckpointSaved, Learner, TrainingConfig, build_task
from engine.train.checkpoint import CheckpointError

from .models import MLP


def make_learner(tmp_path, listeners=(), **cfg):
    return Learner(lambda d: MLP(d, dropout=0.1), optim.AdamConfig().init(),
                   lr=optim.CosineAnnealingLrSchedulerConfig(0.01, 20),
                   task=build_task("spirals", n_train=192, n_valid=64),
                   config=TrainingConfig(num_epochs=4, batch_size=32, seed=11, checkpoint_every=2,
                                         checkpoint_dir=str(tmp_path), **cfg),
                   listeners=listeners)


def test_resumed_run_reproduces_the_uninterrupted_losses(tmp_path):
    events = []
    full = make_learner(tmp_path / "a", listeners=[events.append]).run()
    assert full.status == "finished", full.error
    saved = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [e.epoch for e in saved] == [2, 4]
    ckpt = tmp_path / "a" / "epoch-2"
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.bpk", "optimizer.bpk", "scheduler.bpk", "training.json"]
    progress = json.loads((ckpt / "training.json").read_text())
    assert progress["epoch"] == 2 and progress["global_step"] == 12

    resumed = make_learner(tmp_path / "b", resume_from=str(ckpt)).run()
    assert resumed.status == "finished", resumed.error
    assert len(resumed.step_losses) == len(full.step_losses) == 24
    assert resumed.step_losses[12:] == full.step_losses[12:]  # bit for bit
    assert resumed.history == full.history
    for (name, a), (_, b) in zip(full.model.named_params(), resumed.model.named_params()):
        np.testing.assert_array_equal(a.val().numpy(), b.val().numpy(), err_msg=name)


def test_a_missing_file_is_named(tmp_path):
    make_learner(tmp_path).run()
    (tmp_path / "epoch-2" / "optimizer.bpk").unlink()
    with pytest.raises(CheckpointError, match=r"missing \['optimizer.bpk'\]"):
        make_learner(tmp_path / "x").resume_from(tmp_path / "epoch-2")


def _save(path, value, optimizer=None):
    from engine import Tensor, nn
    from engine.train.checkpoint import save_checkpoint

    model = nn.LinearConfig(2, 2).init()
    model.weight = model.weight.map(lambda _: Tensor.full([2, 2], value))
    sched = optim.CosineAnnealingLrSchedulerConfig(0.1, 5).init()
    return save_checkpoint(path, model, optimizer or optim.AdamConfig().init(), sched, {"epoch": value})


def _weight(folder):
    from engine.store import ModuleRecord

    return float(ModuleRecord.load(folder / "model.bpk")["weight"].array[0, 0])


def test_saving_over_a_checkpoint_replaces_it_whole(tmp_path):
    target = tmp_path / "epoch-1"
    _save(target, 1.0)
    _save(target, 2.0)
    assert _weight(target) == 2.0
    assert json.loads((target / "training.json").read_text()) == {"epoch": 2.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-1"]


def test_a_failed_save_over_a_checkpoint_keeps_the_old_one(tmp_path):
    target = tmp_path / "epoch-1"
    _save(target, 1.0)

    class Broken:
        def save(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _save(target, 2.0, optimizer=Broken())
    assert _weight(target) == 1.0
    assert sorted(p.name for p in target.iterdir()) == ["model.bpk", "optimizer.bpk", "scheduler.bpk", "training.json"]


def test_a_crash_between_the_renames_leaves_both_checkpoints_whole(tmp_path, monkeypatch):
    from pathlib import Path

    target = tmp_path / "epoch-1"
    _save(target, 1.0)
    real_rename = Path.rename

    def rename(self, dst):
        if self.name == "epoch-1.partial":  # the crash: after the old one moved aside
            raise KeyboardInterrupt
        return real_rename(self, dst)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        _save(target, 2.0)
    assert _weight(tmp_path / "epoch-1.old") == 1.0
    assert _weight(tmp_path / "epoch-1.partial") == 2.0
