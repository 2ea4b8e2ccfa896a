"""Module-owned training behaviour under the training loop: a layer with a training flag
(batch norm, dropout, Gaussian noise) behaves as its flag says when `Learner` drives it, also
as the model's first layer, whose input is the batch itself. Training batches are associated
with autodiff (Burn's rule: dropout and the other flag behaviours need an autodiff input);
validation runs a `valid()` model on plain batches."""
import inspect

import numpy as np
import pytest

from engine import Module, Tensor, nn, optim
from engine.module import ParamGroup
from engine.train import DataLoader, InMemoryDataset, Learner, StepOutput, TrainingConfig, ValidationMetrics, cross_entropy

from .flag_models import FLAG_LAYERS, FlagNet, Tap, flag_data, flag_layer


def flag_learner(name, tap, epochs=1, n_train=256, n_valid=64, batch_size=32, lr=0.0, edit=None):
    x, y = flag_data(name, n_train, seed=1)
    xv, yv = flag_data(name, n_valid, seed=2)
    model = FlagNet(flag_layer(name), tap)
    if edit is not None:
        model = edit(model)
    return Learner(model, optim.SgdConfig().init(), lr=lr, train=InMemoryDataset(x, y), valid=InMemoryDataset(xv, yv),
                   config=TrainingConfig(num_epochs=epochs, batch_size=batch_size, shuffle=False, seed=3)), x, xv


def test_every_built_in_flag_layer_is_covered():
    owners = set()
    for cls in vars(nn).values():
        if isinstance(cls, type) and issubclass(cls, Module) and "Flag(" in inspect.getsource(cls.__init__):
            owners.add(cls.__name__)
    assert owners == {"BatchNorm", "Dropout", "GaussianNoise"}, "add the new layer to FLAG_LAYERS"
    assert {type(flag_layer(name)).__name__ for name in FLAG_LAYERS} == owners


def test_a_first_layer_batch_norm_updates_its_running_statistics_in_training():
    tap = Tap()
    learner, x, xv = flag_learner("batch_norm", tap)  # lr 0: gamma 1, beta 0 throughout
    result = learner.run()
    assert result.status == "finished", result.error
    bn = result.model.layer
    # running = running * (1 - momentum) + batch * momentum over the (unshuffled) batches
    mean, var = np.zeros(2), np.ones(2)
    for start in range(0, len(x), 32):
        b = x[start:start + 32].astype(np.float64)
        mean = mean * 0.9 + b.mean(axis=0) * 0.1
        var = var * 0.9 + b.var(axis=0) * 0.1
    assert np.allclose(bn.running_mean.val().numpy(), mean, rtol=1e-4, atol=1e-5)
    assert np.allclose(bn.running_var.val().numpy(), var, rtol=1e-4, atol=1e-5)
    # training: each batch normalized with its own statistics
    train = tap.arrays("train")
    assert len(train) == 8
    for out in train:
        assert np.allclose(out.mean(axis=0), 0.0, atol=1e-4)
        assert np.allclose(out.var(axis=0), 1.0, atol=1e-3)
    # validation: the running statistics, and the batches leave them alone
    valid = np.concatenate(tap.arrays("valid"))
    expected = (xv - mean) / np.sqrt(var + 1e-5)
    assert np.allclose(valid, expected, rtol=1e-4, atol=1e-4)


def test_a_first_layer_dropout_drops_in_training_only():
    tap = Tap()
    result = flag_learner("dropout", tap)[0].run()
    assert result.status == "finished", result.error
    train = np.concatenate(tap.arrays("train"))
    assert set(np.unique(train)) == {0.0, 2.0}  # dropped, the rest scaled by 1 / (1 - 0.5)
    assert 0.4 < (train == 0).mean() < 0.6
    valid = np.concatenate(tap.arrays("valid"))
    assert valid.shape == (64, 2) and np.array_equal(valid, np.ones((64, 2), np.float32))


def test_first_layer_gaussian_noise_is_added_in_training_only():
    tap = Tap()
    result = flag_learner("gaussian_noise", tap)[0].run()
    assert result.status == "finished", result.error
    noise = np.concatenate(tap.arrays("train")) - 1.0
    assert noise.shape == (256, 2) and abs(noise.mean()) < 0.1 and 0.4 < noise.std() < 0.6
    valid = np.concatenate(tap.arrays("valid"))
    assert np.array_equal(valid, np.ones((64, 2), np.float32))


@pytest.mark.parametrize("name", ["dropout", "gaussian_noise"])
def test_frozen_flag_layers_stay_off_in_training(name):
    # freeze() configures the flag off: the loop's train() must not turn it on again
    tap = Tap()
    learner, x, _ = flag_learner(name, tap, edit=lambda m: m.freeze_group(ParamGroup.from_regex(r"^layer\.")))
    assert learner.run().status == "finished"
    assert np.array_equal(np.concatenate(tap.arrays("train")), x)


def test_a_batch_norm_classifier_learns_under_the_learner():
    # the case: features far from zero, BatchNorm(2) -> Linear(2, 2), 5 epochs of Adam
    rng = np.random.default_rng(0)

    def make(n):
        y = rng.integers(0, 2, n)
        x = np.stack([100 + (2 * y - 1) * 1.0 + rng.normal(0, 0.5, n), -50 + rng.normal(0, 1, n)], 1)
        return InMemoryDataset(x.astype(np.float32), y)

    class Net(Module):
        def __init__(self, device=None):
            self.bn = nn.BatchNormConfig(2).init(device)
            self.fc = nn.LinearConfig(2, 2).init(device)

        def forward(self, x):
            return self.fc.forward(self.bn.forward(x))

    events = []
    result = Learner(Net, optim.AdamConfig().init(), lr=0.01, train=make(800), valid=make(200),
                     config=TrainingConfig(num_epochs=5, batch_size=32), listeners=[events.append]).run()
    assert result.status == "finished", result.error
    assert np.allclose(result.model.bn.running_mean.val().numpy(), [100.0, -50.0], rtol=0.05)
    final = [e for e in events if isinstance(e, ValidationMetrics)][-1].metrics
    assert final["accuracy"] >= 0.9, final


def test_training_batches_are_autodiff_and_validation_batches_plain():
    seen = []

    def step(model, batch):
        seen.append(("train" if model.probe.training else "valid", batch.inputs.is_autodiff(),
                     batch.targets.is_autodiff()))
        out = model.forward(batch.inputs)
        return StepOutput(cross_entropy(out, batch.targets), out, batch.targets)

    learner, _, _ = flag_learner("dropout", Tap(), n_train=64, n_valid=32)
    learner.step_fn = learner.valid_step_fn = step
    assert learner.run().status == "finished"
    assert set(seen) == {("train", True, True), ("valid", False, False)}


def test_the_data_loader_makes_autodiff_batches_on_request():
    data = InMemoryDataset(np.zeros((4, 2), np.float32), np.zeros(4, np.int64))
    plain = next(iter(DataLoader(data, 2)))
    assert not plain.inputs.is_autodiff() and not plain.targets.is_autodiff()
    ad = next(iter(DataLoader(data, 2, autodiff=True)))
    assert ad.inputs.is_autodiff() and ad.targets.is_autodiff()
    assert not ad.inputs.is_require_grad()  # associated with autodiff, no gradient kept
    assert isinstance(ad.inputs, Tensor) and ad.targets.dtype == plain.targets.dtype
