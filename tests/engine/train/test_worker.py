"""The Training tab's worker side without windows (`engine.train.worker` and what it uses):
per-module gradient norms against a hand computation, the optimizer tap, run specs in JSON,
the data / model pre-check, checkpoints."""
import math
import threading
import time

import numpy as np
import pytest

from engine import Tensor, optim
from engine.optim import GradientsParams
from engine.train import TrainingConfig, build_task, cross_entropy
from engine.train.grad_norms import GradTap, module_grad_norms
from engine.train.preflight import TrainingSetupError, preflight
from engine.train.run_folder import latest_checkpoint
from engine.train.run_spec import ConstantLrConfig, DataSettings, RunSpec, make_data
from engine.train.worker import RunControl, run_training
from resources.examples import build_example


def grads_of(model, n=16):
    task = build_task("spirals", n_train=n, n_valid=2)
    x = Tensor.from_data(task.train.inputs)
    y = Tensor.from_data(task.train.targets)
    model = model.train()
    loss = cross_entropy(model.forward(x), y)
    return model, GradientsParams.from_grads(loss.backward(), model)


def test_module_norms_are_the_l2_norms_of_the_gradients_below():
    model, grads = grads_of(build_example("spirals"))
    norms = module_grad_norms(model, grads)
    assert list(norms) == ["", "fc1", "fc2", "fc3"]  # module order; Relu has no parameters
    by_path = {path: np.asarray(grads.get(p.id).numpy(), dtype=np.float64) for path, p in model.named_params()}
    for mod in ("fc1", "fc2", "fc3"):
        expected = math.sqrt(sum((by_path[f"{mod}.{k}"] ** 2).sum() for k in ("weight", "bias")))
        assert norms[mod] == pytest.approx(expected, rel=1e-5)
    assert norms[""] == pytest.approx(math.sqrt(sum(norms[m] ** 2 for m in ("fc1", "fc2", "fc3"))), rel=1e-6)


def test_frozen_modules_have_no_norm():
    from engine.module import ParamGroup

    frozen = build_example("spirals").freeze_group(ParamGroup.from_regex(r"^fc2\."))
    model, grads = grads_of(frozen)
    norms = module_grad_norms(model, grads)
    assert norms["fc2"] is None and norms["fc1"] > 0 and norms[""] > 0


def test_the_tap_reports_at_most_every_interval_and_delegates():
    model, grads = grads_of(build_example("spirals"))
    seen = []
    opt = optim.AdamConfig().init()
    tap = GradTap(opt, seen.append, every_s=3600)
    new = tap.step(1e-3, model, grads)
    assert len(seen) == 1 and set(seen[0]) == {"", "fc1", "fc2", "fc3"}
    model2, grads2 = grads_of(new)
    tap.step(1e-3, model2, grads2)
    assert len(seen) == 1  # within the interval: not sampled again
    assert tap.states is opt.states and tap.has_gradient_clipping() is False  # the optimizer's own
    assert tap.to_record().tensors  # Adam state after two steps


def test_tap_load_keeps_the_wrapper(tmp_path):
    model, grads = grads_of(build_example("spirals"))
    opt = optim.AdamConfig().init()
    tap = GradTap(opt, lambda n: None)
    tap.step(1e-3, model, grads)
    path = tap.save(tmp_path / "opt.bpk")
    fresh = GradTap(optim.AdamConfig().init(), lambda n: None)
    assert fresh.load(path) is fresh and len(fresh.inner.states) == len(opt.states)


def spec(**training):
    cfg = dict(num_epochs=2, batch_size=64, checkpoint_every=1, checkpoint_dir="(run folder)", device="cpu")
    cfg.update(training)
    return RunSpec(DataSettings("spirals"), "SGD",
                   optim.SgdConfig(momentum=optim.MomentumConfig(0.8), gradient_clipping=optim.GradientClippingConfig.norm(1.0)),
                   "cosine", optim.CosineAnnealingLrSchedulerConfig(0.05, 100), TrainingConfig(**cfg))


def test_run_specs_survive_json():
    import json

    s = spec()
    back = RunSpec.from_json(json.loads(json.dumps(s.to_json())))
    assert back == s
    assert s.describe() == "spirals · SGD lr 0.05"


def test_data_settings_check_the_file(tmp_path):
    with pytest.raises(ValueError, match="give a .npz or .csv"):
        DataSettings("file")
    with pytest.raises(ValueError, match="does not exist"):
        DataSettings("file", str(tmp_path / "nope.csv"))
    with pytest.raises(ValueError, match="expected one of"):
        DataSettings("cifar")
    (tmp_path / "d.csv").write_text("a,b,label\n" + "\n".join(f"{i},{i % 3},{i % 2}" for i in range(20)))
    train, valid, kind, name = make_data(DataSettings("file", str(tmp_path / "d.csv"), 0.25), seed=0)
    assert (len(train), len(valid), kind, name) == (15, 5, "classification", "d.csv")


def test_preflight_names_the_module_and_the_shapes():
    model = build_example("spirals")
    sine = build_task("noisy-sine", n_train=8, n_valid=2)
    with pytest.raises(TrainingSetupError) as err:
        preflight(model, sine.train, "regression", "auto", None, "noisy-sine")
    text = str(err.value)
    assert "the data set noisy-sine (inputs [1] float32 per item, targets [1] float32)" in text
    assert "does not fit the model: at fc1:" in text and "expected 2, got 1" in text
    spirals = build_task("spirals", n_train=8, n_valid=2)
    with pytest.raises(TrainingSetupError, match=r"does not fit the mse loss: the model outputs \[2, 2\], "
                                                 r"the targets are \[2\]"):
        preflight(model, spirals.train, "regression", "mse", None, "spirals")
    preflight(model, spirals.train, "classification", "auto", None, "spirals")  # fits


class _State:
    def __init__(self):
        self.batches = []

    def set_partial_result(self, batch):
        self.batches.append(batch)


def test_a_worker_run_writes_checkpoints_and_batches_its_events(tmp_path):
    state = _State()
    model = build_example("spirals")
    out = run_training(state, RunControl(), model, spec(), str(tmp_path))
    assert out.status == "finished" and out.steps == 64 and out.global_step == 64
    assert latest_checkpoint(tmp_path)[0] == 2
    events = [e for b in state.batches for e in b]
    assert len(state.batches) < len(events) / 4  # batched, not one signal per event
    assert sum(type(e).__name__ == "StepLoss" for e in events) == 64
    assert any(type(e).__name__ == "GradNorms" for e in events)
    assert out.model is not model and out.train_seconds > 0


def test_max_steps_stops_after_exactly_that_many(tmp_path):
    out = run_training(_State(), RunControl(), build_example("spirals"), spec(num_epochs=1), str(tmp_path),
                       max_steps=40)
    assert out.status == "finished" and out.steps == 40 and out.reached_max_steps


def test_a_pause_asked_before_the_loop_exists_is_honoured(tmp_path):
    control = RunControl()
    control.pause()
    state = _State()
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", run_training(state, control, build_example("spirals"),
                                                                           spec(), str(tmp_path))))
    t.start()
    t.join(1.0)
    assert t.is_alive()  # paused before its first step
    events = [type(e).__name__ for b in state.batches for e in b]
    assert "Paused" in events and "StepLoss" not in events
    control.stop()
    t.join(10)
    assert box["out"].status == "stopped" and box["out"].steps == 0


def test_a_stop_asked_before_the_loop_starts_is_not_lost(tmp_path, monkeypatch):
    control = RunControl()
    control.stop()
    out = run_training(_State(), control, build_example("spirals"), spec(), str(tmp_path))
    assert out.status == "stopped" and out.steps == 0
    # between attaching the learner and its run() (which clears its stop flag)
    from engine.train import Learner

    control = RunControl()
    original = Learner.run

    def run_after_a_stop(self):
        control.stop()
        return original(self)

    monkeypatch.setattr(Learner, "run", run_after_a_stop)
    out = run_training(_State(), control, build_example("spirals"), spec(), str(tmp_path))
    assert out.status == "stopped" and out.steps == 0


def test_partial_checkpoint_folders_are_not_resumed_from(tmp_path):
    (tmp_path / "epoch-3.partial").mkdir()
    (tmp_path / "epoch-5").mkdir()  # incomplete: no files
    assert latest_checkpoint(tmp_path) is None
    run_training(_State(), RunControl(), build_example("spirals"), spec(num_epochs=1), str(tmp_path))
    assert latest_checkpoint(tmp_path)[0] == 1


def test_constant_lr_config_checks_its_value():
    with pytest.raises(ValueError, match="lr: the learning rate must be greater than 0, found 0"):
        ConstantLrConfig(0.0)
    assert ConstantLrConfig(0.1).init().step() == 0.1


def test_runs_from_a_lazy_document_start_from_the_documents_values(tmp_path):
    """The worker forks the lazy document model without reading it first; the fork, a second
    run and the document itself all see one value per parameter id."""
    model = build_example("spirals")
    assert not any(p.is_initialized() for p in model.params())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = run_training(_State(), RunControl(), model, spec(num_epochs=1), str(tmp_path / "a"), max_steps=1)
    second = run_training(_State(), RunControl(), model, spec(num_epochs=1), str(tmp_path / "b"), max_steps=1)
    assert first.status == second.status == "finished"
    for (path, a), (_, b) in zip(first.model.named_params(), second.model.named_params()):
        np.testing.assert_array_equal(a.val().numpy(), b.val().numpy(), err_msg=path)  # same start, same step
    fresh = model.fork("cpu")
    for (path, p), (_, q) in zip(model.named_params(), fresh.named_params()):
        np.testing.assert_array_equal(p.val().numpy(), q.val().numpy(), err_msg=path)


def test_the_worker_calls_the_between_steps_hook_once_a_step(tmp_path):
    """The engine's neutral hook (the app's GUI waits there while it paints: app/training_run.py)."""
    calls = []
    out = run_training(_State(), RunControl(lambda: calls.append(threading.current_thread())),
                       build_example("spirals"), spec(num_epochs=1), str(tmp_path), max_steps=4)
    assert out.status == "finished" and out.steps == 4
    assert len(calls) == 4  # one call between each two steps, the last step's included
    assert all(t is threading.current_thread() for t in calls)  # run_training's thread (here: this one)
