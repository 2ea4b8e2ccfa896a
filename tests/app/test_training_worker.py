"""The Training tab's worker through the app's thread (`app.workers.BackgroundTask`, driven with
pytest-qt): a first layer's training behaviour, NaN weights reported as a failed run."""
import numpy as np
import pytest

from engine import optim
from engine.train import TrainingConfig, build_task
from engine.train.run_spec import ConstantLrConfig, DataSettings, RunSpec
from engine.train.worker import RunControl, run_training


# ---- through the app's worker (a BackgroundTask on its own thread, driven with pytest-qt) -------------------
def worker_run(qtbot, model, data: DataSettings, run_dir, lr=1e-9, **training):
    from app.workers import BackgroundTask

    cfg = dict(num_epochs=2, batch_size=16, device="cpu", seed=4)
    max_steps = training.pop("max_steps", None)
    cfg.update(training)
    run_spec = RunSpec(data, "SGD", optim.SgdConfig(), "constant", ConstantLrConfig(lr), TrainingConfig(**cfg))
    run_dir.mkdir()  # the panel makes the run folder
    task = BackgroundTask(run_training, RunControl(), model, run_spec, str(run_dir), max_steps=max_steps)
    with qtbot.waitSignal(task.done, timeout=60_000):
        task.start()
    assert task.outcome == "finished", f"the worker task ended {task.outcome}: {task.result}"
    return task.result


def flag_file(tmp_path, name, n=400):
    from tests.engine.train.flag_models import flag_data

    x, y = flag_data(name, n, seed=5)
    path = tmp_path / f"{name}.npz"
    np.savez(path, x=x, y=y)
    return DataSettings("file", str(path), 0.2)


@pytest.mark.parametrize("name", ["batch_norm", "dropout", "gaussian_noise"])
def test_the_worker_trains_a_first_layer_flag_behaviour(qtbot, tmp_path, name):
    # the model's first layer gets the batch itself: the worker's training batches must be
    # autodiff for its training behaviour to apply, and its validation must not apply it
    from tests.engine.train.flag_models import FlagNet, Tap, flag_layer

    tap = Tap()
    model = FlagNet(flag_layer(name), tap)
    out = worker_run(qtbot, model, flag_file(tmp_path, name), tmp_path / "run")
    assert out.status == "finished" and out.steps == 40, out.error
    train = np.concatenate(tap.arrays("train"))
    valid = np.concatenate(tap.arrays("valid"))  # the pre-check's two items, then two validations
    assert train.shape == (640, 2) and len(valid) >= 2 * 80  # two validations (and the pre-check's forwards)
    if name == "batch_norm":
        bn = out.model.layer
        assert np.allclose(bn.running_mean.val().numpy(), [3.0, -2.0], atol=0.3)
        assert np.allclose(bn.running_var.val().numpy(), [4.0, 0.25], rtol=0.3)
        for batch in tap.arrays("train"):  # normalized with its own statistics (lr 1e-9: gamma 1, beta 0)
            assert np.allclose(batch.mean(axis=0), 0.0, atol=1e-4)
        last = valid[-80:]  # the running statistics: a batch of 16 is not centred on its own mean
        assert not np.allclose(last[:16].mean(axis=0), 0.0, atol=1e-4)
        assert np.array_equal(model.layer.running_mean.val().numpy(), [0.0, 0.0])  # the document's model
    elif name == "dropout":
        assert set(np.unique(train)) == {0.0, 2.0}
        assert np.array_equal(valid, np.ones_like(valid))
    else:
        assert not np.isin(train, [1.0]).any() and 0.4 < (train - 1.0).std() < 0.6
        assert np.array_equal(valid, np.ones_like(valid))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("max_steps", [None, 6])
def test_the_worker_reports_a_run_with_nan_weights_as_failed(qtbot, tmp_path, max_steps):
    # 64 items, 16 a batch, no validation: the loss stays finite, the last update makes 's' NaN
    from tests.engine.train.models import NanGradAt

    task = build_task("spirals", n_train=80, n_valid=8)
    path = tmp_path / "spirals.npz"
    np.savez(path, x=task.train.inputs, y=task.train.targets)
    last = 8 if max_steps is None else max_steps
    out = worker_run(qtbot, NanGradAt(last), DataSettings("file", str(path), 0.2), tmp_path / "run", lr=0.1,
                     max_steps=max_steps, checkpoint_every=1, checkpoint_dir="(run folder)")
    assert out.status == "failed", "NaN weights must not be a finished run"
    assert "parameter 's' is nan" in out.message and out.weights == ""
    assert not (tmp_path / "run" / "trained.bpk").exists()


def test_the_worker_waits_between_two_steps_while_the_gui_holds_the_gate(tmp_path):
    """The app's policy on the engine's hook: while the Training tab paints (the gate held), each
    step waits for it, at most GUI_WAIT_S (app/training_run.py)."""
    import time

    from app.training_run import GUI_WAIT_S, GuiGate
    from resources.examples import build_example
    from tests.engine.train.test_worker import _State, spec

    gate = GuiGate()
    gate.hold()
    gate.hold()
    gate.release()
    assert gate.is_held()  # holds nest: the paint inside a redraw does not free it early
    waits = []
    gate.wait = lambda timeout, wait=gate.wait: waits.append(timeout) or wait(timeout)
    started = time.perf_counter()
    out = run_training(_State(), RunControl(gate.between_steps), build_example("spirals"), spec(num_epochs=1),
                       str(tmp_path), max_steps=4)
    assert out.status == "finished" and out.steps == 4
    assert waits == [GUI_WAIT_S] * 4  # each step waited, at most GUI_WAIT_S
    assert time.perf_counter() - started >= 4 * GUI_WAIT_S
    gate.release()
    assert not gate.is_held() and gate.wait(0)
    gate.between_steps()  # a free gate: no wait
    assert waits == [GUI_WAIT_S] * 4 + [0]


def test_a_training_run_owns_its_worker_and_record_without_the_panel(qtbot, tmp_path):
    """A run has one owner (app/training_run.py): started, paused or stopped through it, it applies
    its worker's events to its history and writes its own run.json; the Training tab only listens."""
    import json

    from app.training_run import TrainingRun
    from engine.train.run_history import RunHistory
    from resources.examples import build_example
    from tests.engine.train.test_worker import spec

    run = TrainingRun("1: spirals", tmp_path, spec(num_epochs=1), RunHistory("1: spirals", str(tmp_path)),
                      build_example("spirals"))
    batches = []
    run.events.connect(batches.append)
    with qtbot.waitSignal(run.finished, timeout=60_000) as finished:
        run.start("the source", 3, None, 3)
    out = finished.args[0]
    assert run.outcome is out and out.steps == 3 and out.status == "finished"  # max_steps ends the run there
    assert (run.source, run.generation) == ("the source", 3)
    assert batches and run.history.global_step == 3  # applied before the run told its listeners
    assert json.loads((tmp_path / "run.json").read_text())["name"] == "1: spirals"
