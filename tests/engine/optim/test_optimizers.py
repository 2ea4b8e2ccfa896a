"""Optimizers against the published update rules on fixed numbers.

The model has one parameter `w = [1.0, -0.5, 2.0]`; step t's loss is `sum(w * G[t])`, so the
gradient of step t is exactly `G[t]`. Expected values below were worked out from the rules
(written next to them) with lr = 0.1, not produced by the code under test.
"""
import numpy as np
import pytest

from engine import Tensor
from engine.module import Module, Param, ParamGroup
from engine import optim
from engine.optim import (
    AdamConfig,
    AdamWConfig,
    GradientClippingConfig,
    GradientsParams,
    MomentumConfig,
    OptimizerRecord,
    SgdConfig,
    WeightDecayConfig,
)

P0 = [1.0, -0.5, 2.0]
G = [[0.5, -1.0, 2.0], [-1.0, 0.25, 2.0]]
LR = 0.1


class Vec(Module):
    def __init__(self, values=P0):
        self.w = Param(Tensor.from_data(values))
        self.frozen = Param(Tensor.from_data([3.0, -4.0])).set_require_grad(False)

    def forward(self, c):
        return (self.w.val() * Tensor.from_data(c)).sum() + self.frozen.val().sum()


def run(optimizer, steps=2, model=None):
    model = model or Vec()
    values = []
    for t in range(steps):
        grads = GradientsParams.from_grads(model.forward(G[t]).backward(), model)
        model = optimizer.step(LR, model, grads)
        values.append(model.w.val().numpy().astype(np.float64))
    return model, values


def close(got, expected):
    np.testing.assert_allclose(got, np.array(expected), rtol=2e-6, atol=1e-7)


def test_burn_defaults():
    a, w, m = AdamConfig(), AdamWConfig(), MomentumConfig()
    assert (a.beta_1, a.beta_2, a.epsilon, a.amsgrad, a.weight_decay) == (0.9, 0.999, 1e-5, False, None)
    assert (w.beta_1, w.beta_2, w.epsilon, w.weight_decay, w.cautious_weight_decay) == (0.9, 0.999, 1e-5, 1e-4, False)
    assert (m.momentum, m.dampening, m.nesterov) == (0.9, 0.1, False)
    s = SgdConfig()
    assert (s.weight_decay, s.momentum, s.gradient_clipping) == (None, None, None)


def test_plain_sgd():
    # p <- p - lr g
    _, v = run(SgdConfig().init())
    close(v[0], [0.95, -0.4, 1.8])
    close(v[1], [1.05, -0.425, 1.6])


def test_sgd_momentum_with_dampening():
    # v1 = g1; v2 = 0.9 v1 + (1 - 0.1) g2; p <- p - lr v
    # element 0: v2 = 0.45 - 0.9 = -0.45, p2 = 0.95 + 0.045 = 0.995
    _, v = run(SgdConfig(momentum=MomentumConfig(0.9, 0.1, False)).init())
    close(v[0], [0.95, -0.4, 1.8])
    close(v[1], [0.995, -0.3325, 1.44])


def test_sgd_nesterov():
    # direction = g + 0.9 v; element 0: step 1: 0.5 + 0.45 = 0.95 -> 0.905;
    # step 2: v = -0.45, direction = -1 - 0.405 = -1.405 -> 1.0455
    _, v = run(SgdConfig(momentum=MomentumConfig(0.9, 0.1, True)).init())
    close(v[0], [0.905, -0.31, 1.62])
    close(v[1], [1.0455, -0.27425, 1.096])


def test_sgd_momentum_and_weight_decay():
    # g <- g + 0.1 p, no dampening; element 0: g1 = 0.6 -> 0.94; g2 = -1 + 0.094 = -0.906,
    # v2 = 0.54 - 0.906 = -0.366 -> 0.9766
    _, v = run(SgdConfig(weight_decay=WeightDecayConfig(0.1), momentum=MomentumConfig(0.9, 0.0)).init())
    close(v[0], [0.94, -0.395, 1.78])
    close(v[1], [0.9766, -0.32155, 1.3642])


def test_adam():
    # m = 0.9 m + 0.1 g, v = 0.999 v + 0.001 g^2, p <- p - lr m_hat / (sqrt(v_hat) + 1e-5)
    # step 1: m_hat = g, sqrt(v_hat) = |g|: the step is lr * |g| / (|g| + 1e-5) (about lr)
    # element 0: 1 - 0.1 * 0.5 / 0.50001 = 0.90000199996
    _, v = run(AdamConfig().init())
    close(v[0], [0.90000199996, -0.40000099999, 1.9000004999975])
    # step 2, element 0: m = -0.055, v = 0.00124975; m_hat = -0.289473684, v_hat = 0.625187594
    close(v[1], [0.93661188965, -0.35305482711, 1.800000999995])


def test_adam_with_l2_weight_decay():
    # g <- g + 0.5 p before the moments
    _, v = run(AdamConfig(weight_decay=WeightDecayConfig(0.5)).init())
    close(v[0], [0.90000099999, -0.4000007999936, 1.9000003333322])
    close(v[1], [0.87717162172, -0.33602492204, 1.8000480062677])


def test_adamw_decoupled_decay():
    # p <- p (1 - lr 0.5) - lr m_hat / (sqrt(v_hat) + 1e-5); element 0 step 1: 0.95 - 0.099998 = 0.850002
    _, v = run(AdamWConfig(weight_decay=0.5).init())
    close(v[0], [0.85000199996, -0.37500099999, 1.8000004999975])
    close(v[1], [0.84411178965, -0.30930477711, 1.610000974995])


def test_amsgrad_differs_once_v_shrinks():
    # g = 2, then 0: after step 1 v = v_max = 0.004; step 2: v = 0.003996 < 0.004, so AMSGrad
    # divides by sqrt(0.004 / bc2) where Adam divides by sqrt(0.003996 / bc2)
    m_plain, m_ams = Vec([1.0]), Vec([1.0])
    o_plain, o_ams = AdamConfig(epsilon=1e-8).init(), AdamConfig(epsilon=1e-8, amsgrad=True).init()
    for g in ([2.0], [0.0]):
        m_plain = o_plain.step(LR, m_plain, GradientsParams.from_grads(m_plain.forward(g).backward(), m_plain))
        m_ams = o_ams.step(LR, m_ams, GradientsParams.from_grads(m_ams.forward(g).backward(), m_ams))
    # step 2 by hand: m = 0.18, m_hat = 0.18 / 0.19; bc2 = 0.001999
    # plain: v = 0.003996, AMSGrad: v = 0.004
    m_hat = 0.18 / 0.19
    plain = 0.9 - 0.1 * m_hat / (np.sqrt(0.003996 / 0.001999) + 1e-8)
    ams = 0.9 - 0.1 * m_hat / (np.sqrt(0.004 / 0.001999) + 1e-8)
    assert float(m_plain.w.val().numpy()[0]) == pytest.approx(plain, rel=1e-6)
    assert float(m_ams.w.val().numpy()[0]) == pytest.approx(ams, rel=1e-6)
    assert abs(plain - ams) > 1e-5


def test_frozen_parameters_are_untouched_and_ids_kept():
    model = Vec()
    opt = AdamConfig().init()
    new, _ = run(opt, model=model)
    assert new.frozen is model.frozen  # the very same parameter, bit for bit
    assert new.w.id == model.w.id and new.w.is_require_grad()
    np.testing.assert_array_equal(model.w.val().numpy(), np.array(P0, dtype=np.float32))  # receiver unchanged


def test_gradients_are_matched_by_id_not_position():
    a = Vec()
    grads = GradientsParams.from_grads(a.forward(G[0]).backward(), a)
    assert grads.ids() == [a.w.id] and grads.get(a.w.id).numpy().tolist() == G[0]
    # a different module with the same parameter id gets the gradient; another id does not
    other = Vec([0.0, 0.0, 0.0])
    same = other.map(_SetId(a.w.id))
    out = SgdConfig().init().step(LR, same, grads)
    close(out.w.val().numpy(), [-0.05, 0.1, -0.2])
    untouched = SgdConfig().init().step(LR, other, GradientsParams.from_grads(a.forward(G[0]).backward(), a))
    assert untouched.w is other.w


class _SetId(optim.base.ModuleMapper):
    def __init__(self, pid):
        self.pid = pid

    def map_float(self, p):
        return p.with_id(self.pid) if p.is_require_grad() else p


def test_gradient_clipping_applies_before_the_rule():
    # clip by value 0.6: g1 = [0.5, -0.6, 0.6]; plain SGD
    _, v = run(SgdConfig(gradient_clipping=GradientClippingConfig.value(0.6)).init(), steps=1)
    close(v[0], [0.95, -0.44, 1.94])
    opt = SgdConfig().init().with_grad_clipping(GradientClippingConfig.norm(1.0))
    _, v = run(opt, steps=1)  # |g1| = sqrt(0.25 + 1 + 4) = 2.2913
    close(v[0], np.array(P0) - LR * np.array(G[0]) / np.sqrt(5.25))


def test_group_rules_override_the_default():
    model = Vec()
    opt = SgdConfig().init().with_group(ParamGroup.from_path("w"), SgdConfig(momentum=MomentumConfig(0.9, 0.1, True)))
    _, v = run(opt, model=model)
    close(v[1], [1.0455, -0.27425, 1.096])


@pytest.mark.parametrize("make", [
    lambda: AdamConfig(amsgrad=True).init(),
    lambda: AdamWConfig(weight_decay=0.3).init(),
    lambda: SgdConfig(momentum=MomentumConfig(0.9, 0.1, True), weight_decay=0.05).init(),
])
def test_state_record_round_trips_through_burnpack(make, tmp_path):
    model, _ = run(opt := make(), steps=2)
    path = opt.save(tmp_path / "optim")
    assert path.suffix == ".bpk" and path.read_bytes()[:4] == b"NRUB"
    restored = make().load(path)
    record = OptimizerRecord.load(path)
    pid = model.w.id.val()
    names = {name for name, _, _ in record.tensors}
    assert all(name.startswith(f"{pid}.") for name in names)
    assert all(p == pid for _, _, p in record.tensors)
    assert record.paths == {str(pid): "w"} and record.scalars[f"{pid}.__rank"] == ("UInt", 1)
    # one more identical step from the original and from the restored optimizer
    g = GradientsParams.from_grads(model.forward([0.3, 0.3, -0.7]).backward(), model)
    g2 = GradientsParams.from_grads(model.forward([0.3, 0.3, -0.7]).backward(), model)
    a = opt.step(LR, model, g).w.val().numpy()
    b = restored.step(LR, model, g2).w.val().numpy()
    np.testing.assert_array_equal(a, b)


def test_burn_record_names():
    opt = AdamConfig().init()
    model, _ = run(opt, steps=2)
    record = opt.to_record()
    pid = model.w.id.val()
    assert sorted(n for n, _, _ in record.tensors) == [f"{pid}.momentum.moment_1", f"{pid}.momentum.moment_2"]
    assert record.scalars[f"{pid}.momentum.time"] == ("UInt", 2)
    sgd = SgdConfig(momentum=MomentumConfig()).init()
    model, _ = run(sgd, steps=1)
    assert [n for n, _, _ in sgd.to_record().tensors] == [f"{model.w.id.val()}.momentum.velocity"]


def test_updates_never_write_into_arrays_the_model_shares():
    model = Vec()
    clone = model.clone()
    before = clone.w.val().numpy()
    opt = AdamConfig().init()
    run(opt, steps=2, model=model)
    np.testing.assert_array_equal(clone.w.val().numpy(), before)


@pytest.mark.cuda
def test_adam_on_a_gpu_matches_the_cpu():
    from engine import available_devices, Device

    if not any(d.is_cuda for d in available_devices()):
        pytest.skip("no CUDA device here (CuPy with a GPU is needed)")
    dev = Device("cuda:0")
    cpu = Vec()
    gpu = cpu.fork(dev)
    _, v_cpu = run(AdamConfig().init(), model=cpu)
    opt = AdamConfig().init()
    model = gpu
    for t in range(2):
        c = Tensor.from_data(G[t], device=dev)
        loss = (model.w.val() * c).sum()
        model = opt.step(LR, model, GradientsParams.from_grads(loss.backward(), model))
    np.testing.assert_allclose(model.w.val().numpy(), v_cpu[1], rtol=1e-6)
    assert opt.to_record().tensors  # state comes back to the host for records
