"""Initializers: Burn's formulas, lazily applied."""
import math

import numpy as np
import pytest

from engine import Device
from engine.module import Initializer, rust_debug

DEV = Device("cpu:3")


@pytest.fixture(autouse=True)
def seeded():
    DEV.seed(7)
    yield
    DEV.seed(None)


def values(init, shape, **fans):
    p = init.init_with(shape, device=DEV, **fans)
    assert not p.is_initialized() and p.shape == tuple(shape)
    v = p.val()
    assert v.is_require_grad() and v.device is DEV
    return v.numpy().astype(np.float64)


def test_constant_ones_zeros():
    assert (values(Initializer.Constant(5.0), [2, 3]) == 5.0).all()
    assert (values(Initializer.Ones(), [4]) == 1.0).all()
    assert (values(Initializer.Zeros(), [2, 2]) == 0.0).all()


def test_uniform_and_normal():
    u = values(Initializer.Uniform(-2.0, 3.0), [20000])
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.05
    n = values(Initializer.Normal(1.0, 2.0), [20000])
    assert abs(n.mean() - 1.0) < 0.05 and abs(n.std() - 2.0) < 0.05


def test_kaiming_uniform_bound_uses_fan_in_or_fan_out():
    gain, fan_in, fan_out = 2.0, 50, 8
    w = values(Initializer.KaimingUniform(gain, False), [fan_in, fan_out * 100], fan_in=fan_in)
    bound = math.sqrt(3.0) * gain / math.sqrt(fan_in)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    w = values(Initializer.KaimingUniform(gain, True), [400, fan_out], fan_out=fan_out)
    bound = math.sqrt(3.0) * gain / math.sqrt(fan_out)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound


def test_kaiming_normal_std():
    w = values(Initializer.KaimingNormal(2.0, False), [100, 400], fan_in=100)
    assert abs(w.std() - 2.0 / 10.0) < 0.005 and abs(w.mean()) < 0.005


def test_xavier_uniform_and_normal():
    fan_in, fan_out = 30, 70
    w = values(Initializer.XavierUniform(1.5), [fan_in, fan_out * 50], fan_in=fan_in, fan_out=fan_out)
    bound = math.sqrt(3.0) * 1.5 * math.sqrt(2.0 / (fan_in + fan_out))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    w = values(Initializer.XavierNormal(1.5), [200, 300], fan_in=fan_in, fan_out=fan_out)
    assert abs(w.std() - 1.5 * math.sqrt(2.0 / 100)) < 0.005


def test_fans_are_required_where_the_formula_needs_them():
    with pytest.raises(ValueError, match="needs fan_in"):
        Initializer.KaimingUniform(1.0, False).init([2, 2])
    with pytest.raises(ValueError, match="needs fan_out"):
        Initializer.KaimingNormal(1.0, True).init_with([2, 2], fan_in=2)
    with pytest.raises(ValueError, match="needs fan_in and fan_out"):
        Initializer.XavierUniform(1.0).init_with([2, 2], fan_in=2)


@pytest.mark.parametrize("shape", [[3, 7], [7, 3], [4, 2, 3]])
def test_orthogonal_gives_orthonormal_rows_or_columns_times_gain(shape):
    w = values(Initializer.Orthogonal(2.0), shape).reshape(shape[0], -1) / 2.0
    rows, cols = w.shape
    gram = w @ w.T if rows <= cols else w.T @ w
    np.testing.assert_allclose(gram, np.eye(min(rows, cols)), atol=1e-5)


def test_orthogonal_needs_rank_two():
    with pytest.raises(ValueError, match="rank >= 2"):
        Initializer.Orthogonal(1.0).init([3]).val()


def test_initializers_print_as_rust_debug():
    assert rust_debug(Initializer.KaimingUniform(0.5, False)) == "KaimingUniform { gain: 0.5, fan_out_only: false }"
    assert rust_debug(Initializer.Zeros()) == "Zeros"
