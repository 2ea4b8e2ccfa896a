"""The reparameterization mechanism (engine.module.reparam), exercised with a custom technique
written only with the public API: weight normalization, `w = g * v / ||v||` per output column."""
import numpy as np
import pytest

from engine import Device, Tensor, nn, optim
from engine.module import Module, ModuleMapper, Param, ParamGroup
from engine.module.reparam import (
    Reparameterization,
    ReparameterizationError,
    Reparameterizer,
    iter_param_slots,
    materialize,
)
from engine.store import ModuleRecord
from tests.engine.gradcheck import check_grads


# ---------------------------------------------------------------------------------- a custom technique
class WeightNorm(Reparameterization):
    """Trainable magnitude `g` [d_out]; the base is the direction `v` [d_in, d_out]."""

    NAME = "weight_norm"

    def __init__(self, g: Param):
        self.g = g

    def apply(self, base):
        norm = (base * base).sum(0, keepdim=True).sqrt()
        return base / norm * self.g.val().reshape(1, -1)


class WeightNormalize(Reparameterizer):
    def __init__(self, group=None):
        self.group = group or ParamGroup.all()
        self.offered = []

    def reparameterize(self, path, param):
        self.offered.append((path, param.kind, tuple(param.shape)))
        if param.rank != 2 or not self.group.matches(param.id, path):
            return param, None
        v = param.base()
        g = (v * v).sum(0).sqrt().detach()
        return param, WeightNorm(Param(g))


class Mlp(Module):
    def __init__(self, device=None, d_in=3, d_hidden=5, d_out=2):
        self.fc1 = nn.LinearConfig(d_input=d_in, d_output=d_hidden).init(device)
        self.fc2 = nn.LinearConfig(d_input=d_hidden, d_output=d_out).init(device)
        self.steps = Param(Tensor.from_data(np.array([1, 2], np.int64), device=device))

    def forward(self, x):
        return self.fc2.forward(self.fc1.forward(x).relu())


def _x(device=None, n=7, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return Tensor.from_data(rng.standard_normal((n, d)).astype(np.float32), device=device)


# ---------------------------------------------------------------------------------- applying
def test_every_float_parameter_is_offered_with_its_path():
    m = Mlp()
    wn = WeightNormalize()
    m.apply_reparameterization(wn)
    assert wn.offered == [
        ("fc1.weight", "float", (3, 5)),
        ("fc1.bias", "float", (5,)),
        ("fc2.weight", "float", (5, 2)),
        ("fc2.bias", "float", (2,)),
    ]  # the int parameter `steps` is not offered


def test_attached_state_materializes_val_and_base_stays_the_stored_base():
    m = Mlp()
    r = m.apply_reparameterization(WeightNormalize())
    w = r.fc1.weight
    assert isinstance(w.reparameterization, WeightNorm)
    assert w.id == m.fc1.weight.id
    np.testing.assert_array_equal(w.base().numpy(), m.fc1.weight.val().numpy())
    np.testing.assert_allclose(w.val().numpy(), m.fc1.weight.val().numpy(), rtol=1e-6, atol=1e-7)
    # change g: val() follows, base() does not
    doubled = r.fc1.weight.reparameterization.g.map(lambda t: t * 2.0)
    w2 = w.with_reparameterization(WeightNorm(doubled))
    np.testing.assert_allclose(w2.val().numpy(), 2 * m.fc1.weight.val().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(w2.base().numpy(), m.fc1.weight.val().numpy())
    # the receiver is unchanged
    assert m.fc1.weight.reparameterization is None
    np.testing.assert_allclose(r.forward(_x()).numpy(), m.forward(_x()).numpy(), rtol=1e-5, atol=1e-6)


def test_reparameterization_parameters_take_part_in_traversal():
    m = Mlp().apply_reparameterization(WeightNormalize())
    paths = [p for p, _ in m.named_params()]
    assert paths == ["fc1.weight", "fc1.weight.weight_norm.g", "fc1.bias", "fc2.weight",
                     "fc2.weight.weight_norm.g", "fc2.bias", "steps"]
    assert m.num_params() == 15 + 5 + 5 + 10 + 2 + 2 + 2
    g = m.fc1.weight.reparameterization.g
    assert g.id != m.fc1.weight.id

    class Scale(ModuleMapper):
        def __init__(self):
            self.seen = []
            self.path = []

        def enter_module(self, name, ct):
            self.path.append(name)

        def exit_module(self, name, ct):
            self.path.pop()

        def map_float(self, param):
            self.seen.append(".".join(self.path))
            return param.map(lambda t: t * 3.0)

    sc = Scale()
    m3 = m.map(sc)
    assert "fc1.weight.weight_norm.g" in sc.seen
    # scaling both v and g by 3 scales the effective weight by 3 (v's scale cancels)
    np.testing.assert_allclose(m3.fc1.weight.val().numpy(), 3 * m.fc1.weight.val().numpy(), rtol=1e-5)
    assert isinstance(m3.fc1.weight.reparameterization, WeightNorm)


def test_group_limits_where_the_reparameterization_is_attached():
    m = Mlp().apply_reparameterization(WeightNormalize(ParamGroup.from_predicate("fc2")))
    assert m.fc1.weight.reparameterization is None
    assert isinstance(m.fc2.weight.reparameterization, WeightNorm)


def test_gradients_reach_base_and_state_and_match_finite_differences():
    m = Mlp().apply_reparameterization(WeightNormalize())
    loss = (m.forward(_x()) ** 2).mean()
    grads = loss.backward()
    assert m.fc1.weight.base().grad(grads) is not None
    assert m.fc1.weight.reparameterization.g.val().grad(grads) is not None

    rng = np.random.default_rng(3)

    def fn(v, g):
        return WeightNorm(Param.initialized(g)).apply(v)

    check_grads(fn, rng.standard_normal((4, 3)), rng.uniform(0.5, 2.0, 3))


def test_optimizer_updates_state_and_keeps_the_structure():
    m = Mlp().apply_reparameterization(WeightNormalize())
    opt = optim.SgdConfig().init()
    g0 = m.fc1.weight.reparameterization.g.val().numpy()
    grads = optim.GradientsParams.from_grads((m.forward(_x()) ** 2).mean().backward(), m)
    m2 = opt.step(0.1, m, grads)
    r = m2.fc1.weight.reparameterization
    assert isinstance(r, WeightNorm) and r.g.id == m.fc1.weight.reparameterization.g.id
    assert not np.array_equal(r.g.val().numpy(), g0)


def test_device_moves_take_the_state_along():
    m = Mlp().apply_reparameterization(WeightNormalize())
    expected = m.forward(_x()).numpy()  # initializes every parameter on the source first
    dst = Device("cpu:1")
    moved = m.fork(dst)
    assert moved.devices() == [dst]
    assert moved.fc1.weight.reparameterization.g.device == dst
    out = moved.forward(_x(dst))
    assert out.device == dst
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    moved2 = m.to_device(dst)
    assert moved2.fc2.weight.reparameterization.g.device == dst


def test_records_store_and_restore_the_state():
    src = Mlp().apply_reparameterization(WeightNormalize())
    src = src.map(_Perturb("weight_norm.g"))  # make g differ from the fresh one
    rec = src.into_record()
    assert "fc1.weight.weight_norm.g" in rec.names()
    rec = ModuleRecord.from_bytes(rec.to_bytes())
    dst = Mlp().apply_reparameterization(WeightNormalize()).load_record(rec)
    x = _x()
    np.testing.assert_array_equal(dst.forward(x).numpy(), src.forward(x).numpy())
    assert dst.fc1.weight.reparameterization.g.id == src.fc1.weight.reparameterization.g.id


class _Perturb(ModuleMapper):
    """Adds seeded noise to every float parameter whose path ends with `suffix`."""

    def __init__(self, suffix, scale=0.5, seed=1):
        self.suffix = suffix
        self.scale = scale
        self.rng = np.random.default_rng(seed)
        self.path = []

    def enter_module(self, name, ct):
        self.path.append(name)

    def exit_module(self, name, ct):
        self.path.pop()

    def map_float(self, param):
        if not ".".join(self.path).endswith(self.suffix):
            return param
        noise = self.rng.standard_normal(param.shape).astype(np.float32) * self.scale
        return param.map(lambda t: (t + Tensor.from_data(noise, device=t.device)).detach())


# ---------------------------------------------------------------------------------- nesting, contract
def test_nesting_is_refused_with_the_paths():
    m = Mlp().apply_reparameterization(WeightNormalize())
    with pytest.raises(ReparameterizationError, match=r"cannot be nested.*'fc1\.weight' \(WeightNorm\)"):
        m.apply_reparameterization(WeightNormalize())
    # after materialize() it is allowed again
    again = m.materialize().apply_reparameterization(WeightNormalize())
    assert isinstance(again.fc1.weight.reparameterization, WeightNorm)


def test_a_reparameterizer_breaking_the_contract_gets_a_clear_error():
    class NotATuple(Reparameterizer):
        def reparameterize(self, path, param):
            return param

    class NotAModule(Reparameterizer):
        def reparameterize(self, path, param):
            return param, "scale by two"

    class NestedBase(Reparameterizer):
        def reparameterize(self, path, param):
            return param.with_reparameterization(WeightNorm(Param(Tensor.ones([1])))), None

    class NestedState(Reparameterizer):
        def reparameterize(self, path, param):
            inner = Param(Tensor.ones([param.shape[-1]])).with_reparameterization(WeightNorm(Param(Tensor.ones([1]))))
            return param, WeightNorm(inner)

    with pytest.raises(ReparameterizationError, match=r"must return \(base_param, .*Param for 'fc1.weight'"):
        Mlp().apply_reparameterization(NotATuple())
    with pytest.raises(ReparameterizationError, match=r"a Reparameterization .* it returned str"):
        Mlp().apply_reparameterization(NotAModule())
    with pytest.raises(ReparameterizationError, match="already has a reparameterization"):
        Mlp().apply_reparameterization(NestedBase())
    with pytest.raises(ReparameterizationError, match=r"own parameter 'g' is reparameterized"):
        Mlp().apply_reparameterization(NestedState())
    with pytest.raises(TypeError, match="expects a Reparameterizer"):
        Mlp().apply_reparameterization(object())


def test_default_reparameterizer_changes_nothing():
    m = Mlp()
    r = m.apply_reparameterization(Reparameterizer())
    assert [p for p, _ in r.named_params()] == [p for p, _ in m.named_params()]
    assert all(p.reparameterization is None for _, p in iter_param_slots(r))


# ---------------------------------------------------------------------------------- materialize
def test_materialize_folds_into_plain_weights_and_keeps_the_original():
    src = Mlp().apply_reparameterization(WeightNormalize()).map(_Perturb("weight_norm.g"))
    merged = src.materialize()
    x = _x()
    np.testing.assert_allclose(merged.forward(x).numpy(), src.forward(x).numpy(), rtol=1e-6, atol=1e-6)
    assert [p for p, _ in merged.named_params()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "steps"]
    assert merged.fc1.weight.reparameterization is None
    assert merged.fc1.weight.id == src.fc1.weight.id
    np.testing.assert_allclose(merged.fc1.weight.val().numpy(), src.fc1.weight.val().numpy(), rtol=1e-7)
    # the base trained before, so the merged weight does too, as a fresh leaf
    assert merged.fc1.weight.is_require_grad()
    grads = merged.forward(x).sum().backward()
    assert merged.fc1.weight.val().grad(grads) is not None
    assert src.fc1.weight.reparameterization.g.val().grad(grads) is None
    # the original keeps its structure
    assert isinstance(src.fc1.weight.reparameterization, WeightNorm)
    assert materialize(src).num_params() == src.num_params() - 7


def test_materialize_leaves_lazy_parameters_lazy():
    class Lazy(Module):
        def __init__(self):
            self.w = Param.uninitialized(lambda d, rg: Tensor.ones([2, 3], device=d), None, True, (2, 3))
            self.u = Param.uninitialized(lambda d, rg: Tensor.ones([3, 2], device=d), None, True, (3, 2))

    m = Lazy().apply_reparameterization(WeightNormalize(ParamGroup.from_path("w")))
    assert not m.u.is_initialized()
    merged = m.materialize()
    assert not merged.u.is_initialized()
    np.testing.assert_allclose(merged.w.val().numpy(), np.ones((2, 3)), rtol=1e-6)


def test_validation_keeps_state_separate():
    m = Mlp().apply_reparameterization(WeightNormalize())
    v = m.valid()
    assert isinstance(v.fc1.weight.reparameterization, WeightNorm)
    assert not v.fc1.weight.reparameterization.g.is_autodiff()
    assert "fc1.weight.weight_norm.g" in v.into_record().names()
    np.testing.assert_allclose(v.forward(_x()).numpy(), m.forward(_x()).numpy(), rtol=1e-6)
