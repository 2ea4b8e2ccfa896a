"""The training loop: learning, events, pause / resume / stop from another thread, seeds,
non-finite losses, frozen layers."""
import math
import threading
import time

import numpy as np
import pytest

from engine import Tensor, optim
from engine.module import ParamGroup
from engine.train import (
    CustomMetric,
    EpochMetrics,
    Failed,
    Finished,
    LearningRate,
    Learner,
    Paused,
    Resumed,
    Started,
    StepLoss,
    StepOutput,
    Stopped,
    Throughput,
    TopKAccuracyMetric,
    TrainingConfig,
    ValidationMetrics,
    build_task,
    cross_entropy,
)

from .models import MLP, NanGradAt


def spiral_learner(epochs=25, seed=1, listeners=(), model=MLP, **cfg):
    return Learner(model, optim.AdamConfig().init(), lr=0.01, task=build_task("spirals", seed=0),
                   config=TrainingConfig(num_epochs=epochs, batch_size=64, seed=seed, **cfg), listeners=listeners)


def test_mlp_reaches_97_percent_on_two_spirals():
    events = []
    result = spiral_learner(listeners=[events.append]).run()
    assert result.status == "finished", result.error
    final = [e for e in events if isinstance(e, ValidationMetrics)][-1].metrics
    assert final["accuracy"] >= 0.97, final
    # learning happened: the first epoch was far from it
    first = [e for e in events if isinstance(e, ValidationMetrics)][0].metrics
    assert first["accuracy"] < 0.9


def test_events_in_order_with_counts():
    events = []
    learner = spiral_learner(epochs=2, listeners=[events.append], throughput_interval=0.0)
    learner.run()
    steps = math.ceil(2000 / 64)
    assert isinstance(events[0], Started) and events[0].steps_per_epoch == steps and events[0].total_epochs == 2
    assert isinstance(events[-1], Finished) and events[-1].epochs == 2
    losses = [e for e in events if isinstance(e, StepLoss)]
    assert [(e.epoch, e.step) for e in losses] == [(ep, s) for ep in (1, 2) for s in range(1, steps + 1)]
    assert [e.global_step for e in losses] == list(range(1, 2 * steps + 1))
    lrs = [e for e in events if isinstance(e, LearningRate)]
    assert len(lrs) == len(losses) and {e.lr for e in lrs} == {0.01}
    tp = [e for e in events if isinstance(e, Throughput)]
    assert tp and all(e.items_per_second > 0 and e.steps_per_second > 0 for e in tp)
    kinds = [type(e) for e in events if isinstance(e, (EpochMetrics, ValidationMetrics))]
    assert kinds == [EpochMetrics, ValidationMetrics] * 2
    train1 = [e for e in events if isinstance(e, EpochMetrics)][0].metrics
    assert train1["loss"] == pytest.approx(
        sum(e.loss * (64 if e.step < steps else 2000 - 64 * (steps - 1)) for e in losses[:steps]) / 2000, rel=1e-6)


def test_scheduler_drives_the_learning_rate():
    lrs = []
    learner = Learner(MLP, optim.SgdConfig().init(), lr=optim.StepLrSchedulerConfig(0.1, 10, 0.5),
                      task=build_task("spirals", n_train=320, n_valid=32),
                      config=TrainingConfig(num_epochs=1, batch_size=16),
                      listeners=[lambda e: isinstance(e, LearningRate) and lrs.append(e.lr)])
    learner.run()
    assert lrs == pytest.approx([0.1] * 10 + [0.05] * 10)


def test_same_seed_same_losses_other_seed_other_losses():
    def losses(seed):
        return Learner(lambda d: MLP(d, dropout=0.2), optim.AdamConfig().init(), lr=0.01,
                       task=build_task("spirals", n_train=256, n_valid=64),
                       config=TrainingConfig(num_epochs=2, batch_size=32, seed=seed)).run().step_losses

    a, b, c = losses(5), losses(5), losses(6)
    assert len(a) == 16 and a == b
    assert a != c


def test_pause_resume_stop_from_another_thread():
    events, lock = [], threading.Lock()
    reached = threading.Event()
    paused = threading.Event()

    def listen(e):
        with lock:
            events.append(e)
        if isinstance(e, StepLoss) and e.global_step == 5:
            reached.set()
        if isinstance(e, Paused):
            paused.set()

    learner = spiral_learner(epochs=1000, listeners=[listen])
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("result", learner.run()))
    worker.start()
    assert reached.wait(30)
    learner.pause()
    assert paused.wait(30)
    with lock:
        n = sum(isinstance(e, StepLoss) for e in events)
    time.sleep(0.3)
    with lock:
        assert sum(isinstance(e, StepLoss) for e in events) == n  # no step while paused
    assert learner.state == "paused" and learner.is_paused
    learner.resume()
    deadline = time.time() + 30
    while time.time() < deadline:
        with lock:
            if sum(isinstance(e, StepLoss) for e in events) > n + 3:
                break
        time.sleep(0.01)
    learner.stop()
    worker.join(30)
    assert not worker.is_alive()
    result = out["result"]
    assert result.status == "stopped" and learner.state == "stopped"
    kinds = [type(e) for e in events]
    assert Resumed in kinds and kinds[-1] is Stopped
    stopped = events[-1]
    last = [e for e in events if isinstance(e, StepLoss)][-1]
    # between two steps: right after the last one, or, when that one ended its epoch and the
    # stop was seen before the next epoch's first step, at step 0 of the next epoch (the CI dry
    # run of 58624ee met that case: Stopped(2, 0) after StepLoss(1, 32), the epoch's last step)
    after_last = [(last.epoch, last.step)]
    if last.step == last.steps_per_epoch:
        after_last.append((last.epoch + 1, 0))
    assert (stopped.epoch, stopped.step) in after_last
    assert len(result.step_losses) == last.global_step


def test_stop_ends_a_pause():
    learner = spiral_learner(epochs=1000)
    started = threading.Event()
    learner.subscribe(lambda e: isinstance(e, StepLoss) and started.set())
    t = threading.Thread(target=learner.run)
    t.start()
    assert started.wait(30)
    learner.pause()
    time.sleep(0.1)
    learner.stop()
    t.join(30)
    assert not t.is_alive() and learner.state == "stopped"


def test_nan_loss_stops_the_run_and_says_where():
    events = []
    calls = {"n": 0}

    def step(model, batch):
        calls["n"] += 1
        out = model.forward(batch.inputs)
        loss = cross_entropy(out, batch.targets)
        if calls["n"] == 8:  # epoch 2, step 3 with 5 steps an epoch
            loss = loss * float("nan")
        return StepOutput(loss, out, batch.targets)

    learner = Learner(MLP, optim.SgdConfig().init(), lr=0.01, task=build_task("spirals", n_train=80, n_valid=16),
                      config=TrainingConfig(num_epochs=5, batch_size=16), step=step,
                      valid_step=lambda m, b: StepOutput(cross_entropy(m.forward(b.inputs), b.targets)),
                      listeners=[events.append])
    result = learner.run()
    assert result.status == "failed"
    failed = events[-1]
    assert isinstance(failed, Failed) and (failed.epoch, failed.step) == (2, 3)
    assert failed.loss_name == "training loss" and math.isnan(failed.value)
    assert "epoch 2, step 3" in failed.message and "nan" in failed.message
    assert len(result.step_losses) == 7  # the bad step was not applied


def test_infinite_named_loss_part_is_named():
    def step(model, batch):
        out = model.forward(batch.inputs)
        ce = cross_entropy(out, batch.targets)
        penalty = (model.fc1.weight.val() * 0.0).sum() + float("inf")
        return StepOutput(ce + penalty, out, batch.targets, losses={"cross_entropy": ce, "penalty": penalty})

    events = []
    Learner(MLP, optim.SgdConfig().init(), task=build_task("spirals", n_train=32, n_valid=8),
            config=TrainingConfig(num_epochs=1, batch_size=16), step=step, listeners=[events.append]).run()
    assert events[-1].loss_name == "training loss 'penalty'" and events[-1].value == math.inf
    assert "epoch 1, step 1" in events[-1].message


def test_an_exception_becomes_a_failed_event():
    def step(model, batch):
        raise RuntimeError("out of cheese")

    events = []
    result = Learner(MLP, optim.SgdConfig().init(), task=build_task("spirals", n_train=32, n_valid=8),
                     config=TrainingConfig(num_epochs=1, batch_size=16), step=step, listeners=[events.append]).run()
    assert result.status == "failed" and "out of cheese" in events[-1].message and "Traceback" in result.error


def test_frozen_layer_is_bit_identical_after_training():
    model = MLP().freeze_group(ParamGroup.from_regex(r"^fc1\."))
    w0 = model.fc1.weight.val().numpy()
    b0 = model.fc1.bias.val().numpy()
    w2 = model.fc2.weight.val().numpy()
    result = Learner(model, optim.AdamWConfig().init(), lr=0.01, task=build_task("spirals", n_train=256, n_valid=64),
                     config=TrainingConfig(num_epochs=3, batch_size=32)).run()
    assert result.status == "finished", result.error
    trained = result.model
    assert trained.fc1.weight.val().numpy().tobytes() == w0.tobytes()
    assert trained.fc1.bias.val().numpy().tobytes() == b0.tobytes()
    assert not np.array_equal(trained.fc2.weight.val().numpy(), w2)


def test_user_metrics_and_regression():
    mae = CustomMetric("mae", lambda o, t: float(np.abs(o - t).mean()), higher_is_better=False)
    events = []
    task = build_task("noisy-sine", n_train=512, n_valid=128)
    result = Learner(lambda d: MLP(d, d_in=1, hidden=32, d_out=1), optim.AdamConfig().init(), lr=0.01, task=task,
                     config=TrainingConfig(num_epochs=30, batch_size=32, seed=2), metrics=lambda: [mae],
                     listeners=[events.append]).run()
    final = [e for e in events if isinstance(e, ValidationMetrics)][-1].metrics
    assert set(final) == {"loss", "mae"}
    assert final["loss"] < 0.03  # the noise alone is 0.01


def test_top_k_metric_in_the_loop():
    events = []
    Learner(MLP, optim.AdamConfig().init(), lr=0.01, task=build_task("spirals", n_train=64, n_valid=32),
            config=TrainingConfig(num_epochs=1, batch_size=32), metrics=[TopKAccuracyMetric(2)],
            listeners=[events.append]).run()
    assert events[-1].metrics["top2_accuracy"] == 1.0  # two classes: always in the top two


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="checkpoint_dir"):
        TrainingConfig(checkpoint_every=2)
    with pytest.raises(ValueError, match="num_epochs"):
        TrainingConfig(num_epochs=0)


def test_the_loop_trains_where_the_model_lives():
    from engine import Device

    model = MLP(Device("cpu:2"))
    result = Learner(model, optim.SgdConfig().init(), task=build_task("spirals", n_train=32, n_valid=8),
                     config=TrainingConfig(num_epochs=1, batch_size=16)).run()
    assert result.status == "finished", result.error
    assert [str(d) for d in result.model.devices()] == ["cpu:2"]


def test_a_stop_asked_before_the_run_starts_is_honoured_and_then_used_up():
    learner = Learner(MLP, optim.SgdConfig().init(), task=build_task("spirals", n_train=32, n_valid=8),
                      config=TrainingConfig(num_epochs=1, batch_size=16))
    learner.stop()  # e.g. the user pressed Stop while the worker thread was starting
    first = learner.run()
    assert first.status == "stopped" and first.step_losses == []
    second = learner.run()  # the request was used up by the first run
    assert second.status == "finished" and len(second.step_losses) == 2


NAN_WARNING = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def nan_grad_learner(at, epochs=2, listeners=()):
    # 4 steps an epoch, no validation set: nothing but the parameters shows the NaN
    task = build_task("spirals", n_train=64, n_valid=8)
    return Learner(NanGradAt(at), optim.SgdConfig().init(), lr=0.1, train=task.train,
                   config=TrainingConfig(num_epochs=epochs, batch_size=16), listeners=listeners)


@NAN_WARNING
def test_a_nan_gradient_in_the_last_step_fails_the_run_though_the_loss_is_finite():
    events = []
    result = nan_grad_learner(at=8, listeners=[events.append]).run()
    assert all(math.isfinite(x) for x in result.step_losses) and len(result.step_losses) == 8
    assert math.isnan(result.model.s.val().numpy()[0])  # the rig did what it says
    assert result.status == "failed", "a model with NaN weights must not be called finished"
    assert not any(isinstance(e, Finished) for e in events)
    failed = events[-1]
    assert isinstance(failed, Failed) and (failed.epoch, failed.step) == (2, 4)
    assert failed.param == "s" and failed.loss_name is None and math.isnan(failed.value)
    assert "parameter 's' is nan" in failed.message and "epoch 2" in failed.message
    assert "global steps 5-8" in failed.message and result.error == failed.message


@NAN_WARNING
def test_non_finite_parameters_fail_the_epoch_before_validation_and_checkpoint(tmp_path):
    events = []
    task = build_task("spirals", n_train=64, n_valid=8)
    result = Learner(NanGradAt(4), optim.SgdConfig().init(), lr=0.1, task=task, listeners=[events.append],
                     config=TrainingConfig(num_epochs=3, batch_size=16, checkpoint_every=1,
                                           checkpoint_dir=str(tmp_path))).run()
    assert result.status == "failed" and events[-1].param == "s" and (events[-1].epoch, events[-1].step) == (1, 4)
    assert not any(isinstance(e, (ValidationMetrics, Finished)) for e in events)
    assert not list(tmp_path.iterdir())  # no checkpoint of the broken model
    assert len(result.step_losses) == 4


@NAN_WARNING
def test_a_run_stopped_with_non_finite_parameters_fails():
    learner = None

    def stop_after_3(e):
        if isinstance(e, StepLoss) and e.global_step == 3:
            learner.stop()

    learner = nan_grad_learner(at=3, epochs=5, listeners=[stop_after_3])
    result = learner.run()
    assert result.status == "failed" and len(result.step_losses) == 3
    assert "parameter 's' is nan" in result.error and "stopped at epoch 1, step 3" in result.error


@NAN_WARNING
def test_a_nan_loss_after_a_nan_update_names_the_parameter():
    # the NaN reaches the loss one step later: the report says which parameter went first
    class UsesS(NanGradAt):
        def forward(self, x):
            out = super().forward(x)
            return out + self.s.val() * 0.0 if self.counter.calls > self.counter.at else out

    result = Learner(UsesS(2), optim.SgdConfig().init(), lr=0.1, train=build_task("spirals", n_train=64).train,
                     config=TrainingConfig(num_epochs=1, batch_size=16)).run()
    assert result.status == "failed" and "training loss is nan at epoch 1, step 3" in result.error
    assert "parameter 's' was already nan" in result.error


def test_the_parameter_check_never_initializes_a_lazy_parameter():
    from engine.train.learner import first_non_finite_param

    model = MLP()
    assert first_non_finite_param(model) is None
    assert not all(p.is_initialized() for _, p in model.named_params())  # never initialized by the check


def test_a_model_that_is_not_finite_before_training_is_refused():
    from engine import Param

    model = NanGradAt(at=0)
    model.s = Param(Tensor.from_data(np.array([np.inf], np.float32)))
    events = []
    result = Learner(model, optim.SgdConfig().init(), train=build_task("spirals", n_train=32).train,
                     config=TrainingConfig(num_epochs=1, batch_size=16), listeners=[events.append]).run()
    assert result.status == "failed" and result.step_losses == []
    assert [type(e) for e in events] == [Failed] and events[0].param == "s" and events[0].value == math.inf
    assert "parameter 's' is inf before the first step" in result.error
