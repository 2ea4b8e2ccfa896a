"""Activation layers: values against closed forms, gradients against finite differences."""
import math

import numpy as np
import pytest

from engine import Tensor, nn
from engine.module.init import Initializer
from engine.module.param import Param
from tests.engine.gradcheck import check_grads

X = np.array([[-4.1, -2.7, -1.3, -0.45], [0.35, 0.8, 1.7, 6.6], [-0.2, 2.6, 3.4, -3.3]])


def sig(v):
    return 1 / (1 + math.exp(-v))


LAYERS = {
    "Gelu": (nn.Gelu(), lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2)))),
    "Relu": (nn.Relu(), lambda v: max(v, 0.0)),
    "Relu6": (nn.Relu6(), lambda v: min(max(v, 0.0), 6.0)),
    "Selu": (nn.Selu(), lambda v: 1.0507009873554805 * (v if v > 0 else 1.6732632423543772 * (math.exp(v) - 1))),
    "Sigmoid": (nn.Sigmoid(), sig),
    "Tanh": (nn.Tanh(), math.tanh),
    "SiLU": (nn.SiLU(), lambda v: v * sig(v)),
    "HardSwish": (nn.HardSwish(), lambda v: v * min(max(v + 3, 0), 6) / 6),
    "Mish": (nn.Mish(), lambda v: v * math.tanh(math.log(1 + math.exp(v)))),
    "Softsign": (nn.Softsign(), lambda v: v / (1 + abs(v))),
    "LogSigmoid": (nn.LogSigmoid(), lambda v: math.log(sig(v))),
    "Tanhshrink": (nn.Tanhshrink(), lambda v: v - math.tanh(v)),
    "LeakyRelu": (nn.LeakyReluConfig(0.1).init(), lambda v: v if v >= 0 else 0.1 * v),
    "Elu": (nn.EluConfig(0.7).init(), lambda v: v if v > 0 else 0.7 * (math.exp(v) - 1)),
    "Celu": (nn.CeluConfig(2.0).init(), lambda v: max(0, v) + min(0, 2.0 * (math.exp(v / 2) - 1))),
    "HardSigmoid": (nn.HardSigmoidConfig().init(), lambda v: max(0.0, min(1.0, 0.2 * v + 0.5))),
    "Hardtanh": (nn.HardtanhConfig(-2.0, 2.0).init(), lambda v: min(max(v, -2.0), 2.0)),
    "Softplus": (nn.SoftplusConfig(2.0).init(), lambda v: math.log(1 + math.exp(2 * v)) / 2),
    "HardShrink": (nn.HardShrinkConfig().init(), lambda v: v if abs(v) > 0.5 else 0.0),
    "SoftShrink": (nn.SoftShrinkConfig().init(), lambda v: v - 0.5 if v > 0.5 else (v + 0.5 if v < -0.5 else 0.0)),
    "ThresholdedRelu": (nn.ThresholdedReluConfig().init(), lambda v: v if v > 1.0 else 0.0),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_activation_layer(name):
    layer, ref = LAYERS[name]
    out = layer.forward(Tensor.from_data(X, dtype="float64")).numpy()
    np.testing.assert_allclose(out, np.vectorize(ref)(X), rtol=1e-12, atol=1e-12)
    check_grads(layer.forward, X)


def test_burn_reference_values():
    f = Tensor.from_data
    np.testing.assert_allclose(nn.LeakyReluConfig().init().forward(f([[0.4410, -0.2507]])).numpy(), [[0.4410, -0.002507]], rtol=1e-5)
    np.testing.assert_allclose(nn.HardSigmoidConfig().init().forward(f([[0.4410, -0.2507]])).numpy(), [[0.5882, 0.44986]], rtol=1e-4)
    np.testing.assert_allclose(nn.SoftplusConfig().init().forward(f([[0.0, 1.0, -1.0]])).numpy(), [[0.6931, 1.3133, 0.3133]], atol=1e-4)
    np.testing.assert_allclose(nn.CeluConfig().init().forward(f([[0.5, -0.5, -1.0]])).numpy(), [[0.5, -0.393469, -0.632121]], atol=1e-6)
    np.testing.assert_allclose(nn.HardSwish().forward(f([[3.0, -3.0], [0.0, 1.0]])).numpy(), [[3.0, 0.0], [0.0, 0.6666667]], atol=1e-6)
    np.testing.assert_array_equal(nn.SoftShrinkConfig().init().forward(f([[0.5, -0.5, -1.0], [8.0, 0.3, 0.0]])).numpy(),
                                  [[0.0, 0.0, -0.5], [7.5, 0.0, 0.0]])


@pytest.mark.parametrize("num_parameters", [1, 3])
def test_prelu_layer(dev64, num_parameters):
    m = nn.PReluConfig(num_parameters=num_parameters).init(dev64)
    np.testing.assert_array_equal(m.alpha.val().numpy(), [0.25] * num_parameters)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4))
    a = rng.standard_normal(num_parameters)
    ref = np.where(x >= 0, x, x * a.reshape((1, -1, 1) if num_parameters > 1 else 1))

    def f(xt, at):
        m.alpha = Param(at)
        return m.forward(xt)

    np.testing.assert_allclose(f(Tensor.from_data(x, device=dev64), Tensor.from_data(a, device=dev64)).numpy(), ref)
    check_grads(f, x, a, device=dev64)


def test_glu(dev64):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 3))
    ref = x[:, :3] / (1 + np.exp(-x[:, 3:]))
    np.testing.assert_allclose(nn.GLU(1).forward(Tensor.from_data(x, device=dev64)).numpy(), ref, rtol=1e-12)
    check_grads(nn.GLU(-2).forward, x, device=dev64)
    with pytest.raises(ValueError, match="must have an even size, got 3"):
        nn.GLU(2).forward(Tensor.zeros([2, 6, 3]))


def test_swiglu(dev64):
    m = nn.SwiGluConfig(3, 4).init(dev64)
    assert m.linear_inner.bias is None
    rng = np.random.default_rng(4)
    x, wi, wo = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def f(xt, a, b):
        m.linear_inner.weight, m.linear_outer.weight = Param(a), Param(b)
        return m.forward(xt)

    h = x @ wi
    ref = h / (1 + np.exp(-h)) * (x @ wo)
    dev = dev64
    np.testing.assert_allclose(f(*(Tensor.from_data(v, device=dev) for v in (x, wi, wo))).numpy(), ref, rtol=1e-12)
    check_grads(f, x, wi, wo, device=dev64)
    # Burn's own check: constant 0.5 weights
    const = nn.SwiGluConfig(3, 3, initializer=Initializer.Constant(0.5)).init()
    out = const.forward(Tensor.from_data([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])).numpy()
    np.testing.assert_allclose(out, [[8.5732] * 3, [56.2189] * 3], rtol=1e-4)


def test_activation_config_by_name():
    assert str(nn.ActivationConfig("Gelu").init()) == "Gelu"
    assert str(nn.ActivationConfig.of(nn.LeakyReluConfig(0.2)).init()) == "LeakyRelu {negative_slope: 0.2}"
    with pytest.raises(ValueError, match="unknown activation 'Nope'"):
        nn.ActivationConfig("Nope").init()
