"""Rules that keep a module's values honest (issue 16): running state is never trainable,
`Param.map` keeps configured trainability for `train()`, one ParamId gives one value across live
clones and device moves (which stay lazy), tensor setters return new tensors, and LoRA freezes
running state so an adapter-only record holds everything training changed."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Device, Module, Param, Tensor, nn, optim
from engine.module import Lora, ModuleMapper, ParamGroup, trainable_summary
from engine.store import ModuleRecord

from .helpers import Counter

SRC = Device("cpu")
DST = Device("cpu:1")


class Net(Module):
    def __init__(self, device=None):
        self.fc = nn.LinearConfig(2, 3).init(device)
        self.norm = nn.BatchNormConfig(3).init(device)

    def forward(self, x):
        return self.norm.forward(self.fc.forward(x))


class Holder(Module):
    def __init__(self, p):
        self.p = p


def stats(model):
    return model.norm.running_mean.val().numpy().copy(), model.norm.running_var.val().numpy().copy()


# ------------------------------------------------------------------ running state (defect 2)
@pytest.mark.parametrize("how", ["freeze-unfreeze", "set_require_grad", "unfreeze_group", "set_group"])
def test_running_statistics_never_become_trainable(how):
    model = Net()
    group = ParamGroup.from_regex(r"norm\.")
    model = {
        "freeze-unfreeze": lambda m: m.freeze().unfreeze(),
        "set_require_grad": lambda m: m.set_require_grad(True),
        "unfreeze_group": lambda m: m.unfreeze_group(group),
        "set_group": lambda m: m.set_require_grad_group(group, True),
    }[how](model)
    assert not model.norm.running_mean.is_require_grad() and not model.norm.running_var.is_require_grad()
    assert model.norm.running_mean.is_running_state()
    assert model.norm.gamma.is_require_grad()
    summary = trainable_summary(model)
    assert model.num_params() == 9 + 12  # Burn's display counts the statistics
    assert f"trainable params: {9 + 6}" in str(summary).replace(",", "")


def test_an_sgd_step_with_batchnorm_in_inference_mode_leaves_the_statistics_alone():
    model = Net().unfreeze().freeze_group(ParamGroup.from_path("norm.training"))  # flag off: uses the stats
    assert not model.norm.training
    before = stats(model)
    x = Tensor.from_data(np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)).autodiff()
    loss = (model.forward(x) ** 2.0).mean()
    grads = optim.GradientsParams.from_grads(loss.backward(), model)
    assert model.norm.running_mean.id not in grads.ids()
    stepped = optim.SgdConfig().init().step(0.5, model, grads)
    after = stats(stepped)
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])
    assert not np.allclose(stepped.fc.weight.val().numpy(), model.fc.weight.val().numpy())


def test_running_state_survives_records_mappers_and_a_direct_setter_refuses():
    model = Net()
    record = model.into_record()
    assert "norm.running_mean" in record.names()
    loaded = Net().load_record(ModuleRecord.from_bytes(record.to_bytes())).unfreeze()
    assert loaded.norm.running_mean.is_running_state() and not loaded.norm.running_mean.is_require_grad()

    class Trainable(ModuleMapper):
        def map_float(self, param):
            return Param(param.val().detach().inner(), id=param.id)  # a brand-new trainable Param

    mapped = model.map(Trainable())
    assert mapped.norm.running_mean.is_running_state() and not mapped.norm.running_mean.is_require_grad()
    assert mapped.fc.weight.is_require_grad()
    with pytest.raises(Exception, match="running state"):
        model.norm.running_mean.set_require_grad(True)


# ------------------------------------------------------------------ Param.map and train() (defect 4)
class Clamp(ModuleMapper):
    """The Burn book's first Clamp mapper: no detach."""

    def map_float(self, param):
        return param.map(lambda t: t.clamp(-0.3, 0.3))


def test_train_after_a_plain_map_restores_trainability_and_the_optimizer_updates():
    model = Net().train()
    x = Tensor.from_data(np.random.default_rng(1).normal(size=(4, 2)).astype(np.float32)).autodiff()
    clamped = model.map(Clamp())
    assert clamped.fc.weight.is_active()
    trained = clamped.train()
    assert trained.fc.weight.is_require_grad()
    # a loss the batch norm after fc does not make invariant to fc's weights (the mean of squared
    # normalized outputs is ~1 whatever they are, so its gradient is ~0 and the step invisible)
    w = Tensor.from_data(np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32))
    loss = (trained.forward(x) * w).sum()
    grads = optim.GradientsParams.from_grads(loss.backward(), trained)
    assert trained.fc.weight.id in grads.ids()
    stepped = optim.SgdConfig().init().step(0.1, trained, grads)
    change = np.abs(stepped.fc.weight.val().numpy() - trained.fc.weight.val().numpy()).max()
    assert change > 1e-3, change


def test_train_keeps_a_recorded_transfer_so_gradients_still_reach_the_source():
    model = Holder(Param(Tensor.from_data([1.0, 2.0])))
    moved = model.to_device(DST).train()
    assert not moved.p.is_require_grad()
    grads = moved.p.val().sum().backward()
    np.testing.assert_array_equal(model.p.val().grad(grads).numpy(), [1.0, 1.0])


# ------------------------------------------------------------------ lazy values and live clones (defect 5)
@pytest.mark.parametrize("method", ["fork", "to_device"])
def test_moving_a_lazy_model_keeps_one_value_per_id_whoever_reads_first(method):
    model = Net(SRC)
    moved = getattr(model, method)(DST)
    assert not any(p.is_initialized() for p in moved.params())
    a = moved.into_record()  # the destination reads first
    b = model.into_record()
    assert a.names() == b.names()
    for name in a.names():
        np.testing.assert_array_equal(a[name].values(), b[name].values(), err_msg=name)
    for (path, p), (_, q) in zip(model.named_params(), moved.named_params()):
        assert p.id == q.id
        np.testing.assert_array_equal(p.val().numpy(), q.val().numpy(), err_msg=path)


def test_a_deep_copy_of_a_lazy_model_reads_the_same_values():
    import copy

    init = Counter([3])
    model = Holder(init.param())
    twin = copy.deepcopy(model)
    np.testing.assert_array_equal(twin.p.val().numpy(), model.p.val().numpy())
    assert init.calls == 1


_MOVE_7B = """
import resource, sys, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a regression fails here instead of filling memory
from engine.module import Lora, ParamGroup
from resources.examples import build_example

model = build_example("llama-7b")
edits = [model]
edits.append(edits[-1].freeze_group(ParamGroup.from_regex(r"^layers\\.0\\.")))
edits.append(edits[-1].no_grad_group(ParamGroup.from_regex(r"^lm_head\\.")))
edits.append(edits[-1].apply_lora(Lora(4, 8.0, param_group=ParamGroup.from_regex(r"^layers\\.31\\.self_attn\\.query"))))
tracemalloc.start()
moved = getattr(edits[-1], sys.argv[1])("cpu:1")
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
initialized = [path for path, p in moved.named_params() if p.is_initialized() and "lora" not in path]
initialized += [path for e in edits for path, p in e.named_params() if p.is_initialized() and "lora" not in path]
print(peak, len(initialized))
"""


@pytest.mark.parametrize("method", ["fork", "to_device"])
def test_moving_the_edited_7b_model_allocates_nothing(method):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", _MOVE_7B, method], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    peak, initialized = map(int, done.stdout.split())
    assert initialized == 0
    assert peak < 50_000_000, f"{method} allocated {peak} bytes"


# ------------------------------------------------------------------ tensor setters (defect 6)
def test_tensor_require_grad_setters_return_new_tensors():
    layer = nn.LinearConfig(2, 2).init()
    snapshot = layer.clone()
    t = layer.weight.val()
    off = t.set_require_grad(False)
    assert not off.is_require_grad() and t.is_require_grad()
    assert layer.weight.val().is_require_grad() and snapshot.weight.val().is_require_grad()
    plain = Tensor.from_data([1.0, 2.0])
    on = plain.require_grad()
    assert on.is_require_grad() and not plain.is_require_grad() and not plain.is_autodiff()
    assert on.require_grad() is on  # already a leaf: returned as it is


# ------------------------------------------------------------------ LoRA and running state (defect 8)
class SmallCnn(Module):
    def __init__(self):
        self.conv = nn.Conv2dConfig([1, 4], [3, 3]).init()
        self.norm = nn.BatchNormConfig(4).init()
        self.fc = nn.LinearConfig(4 * 6 * 6, 3).init()
        self.activation = nn.Relu()

    def forward(self, x):
        x = self.activation.forward(self.norm.forward(self.conv.forward(x)))
        return self.fc.forward(x.reshape(x.shape[0], -1))


def test_lora_freezes_running_state_so_the_adapters_hold_everything_training_changed():
    rng = np.random.default_rng(0)
    base = SmallCnn()
    base_record = base.into_record().to_bytes()
    lora = Lora(2, 4.0)
    model = base.apply_lora(lora).train()
    assert not model.norm.training  # the statistics stay those of the frozen base
    x = Tensor.from_data((rng.normal(size=(16, 1, 8, 8)) * 3 + 1).astype(np.float32))
    y = Tensor.from_data(rng.integers(0, 3, 16))
    ce = nn.CrossEntropyLossConfig().init()
    opt = optim.AdamConfig().init()
    before = stats(model)
    for _ in range(5):
        loss = ce.forward(model.forward(x.autodiff()), y)
        model = opt.step(1e-2, model, optim.GradientsParams.from_grads(loss.backward(), model))
    np.testing.assert_array_equal(stats(model)[0], before[0])
    adapters = model.valid().into_record_group(ParamGroup.from_regex(r"(^|\.)lora\.(a|b)$"))
    fresh = SmallCnn().load_record(ModuleRecord.from_bytes(base_record))
    restored = fresh.apply_lora(lora).valid().load_record(
        ModuleRecord.from_bytes(adapters.to_bytes()).allow_partial(True))
    out, ref = restored.forward(x).numpy(), model.valid().forward(x).numpy()
    assert np.abs(out - ref).max() < 1e-5
    assert np.abs(ref - fresh.valid().forward(x).numpy()).max() > 1e-3  # training did change the outputs
