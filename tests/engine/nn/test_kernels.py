"""The fused kernels of engine.nn._ops: values against NumPy / math closed forms, gradients
against finite differences."""
import math

import numpy as np
import pytest

from engine import Tensor
from engine.nn import _ops
from engine.tensor.cpu import norm as cpu_norm
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(7)
# keep away from the kinks (0, +-lambda, +-3, 6 ...) where finite differences are meaningless
X = np.array([[-4.1, -2.7, -1.3, -0.45], [0.35, 0.8, 1.7, 6.6], [-0.2, 2.6, 3.4, -3.3]])


def _ref_scalar(f):
    return np.vectorize(f)


REFERENCES = {
    "gelu": (_ops.gelu, lambda v: v * 0.5 * (1 + math.erf(v / math.sqrt(2)))),
    "relu6": (_ops.relu6, lambda v: min(max(v, 0.0), 6.0)),
    "leaky_relu": (lambda t: _ops.leaky_relu(t, 0.01), lambda v: v if v >= 0 else 0.01 * v),
    "elu": (lambda t: _ops.elu(t, 1.5), lambda v: v if v > 0 else 1.5 * (math.exp(v) - 1)),
    "celu": (lambda t: _ops.celu(t, 2.0), lambda v: max(0, v) + min(0, 2.0 * (math.exp(v / 2.0) - 1))),
    "selu": (_ops.selu, lambda v: 1.0507009873554805 * (v if v > 0 else 1.6732632423543772 * (math.exp(v) - 1))),
    "hard_sigmoid": (lambda t: _ops.hard_sigmoid(t, 0.2, 0.5), lambda v: max(0.0, min(1.0, 0.2 * v + 0.5))),
    "silu": (_ops.silu, lambda v: v / (1 + math.exp(-v))),
    "hard_swish": (_ops.hard_swish, lambda v: v * min(max(v + 3, 0), 6) / 6),
    "mish": (_ops.mish, lambda v: v * math.tanh(math.log1p(math.exp(v)))),
    "softplus": (lambda t: _ops.softplus(t, 2.0), lambda v: math.log1p(math.exp(2.0 * v)) / 2.0),
    "softsign": (_ops.softsign, lambda v: v / (1 + abs(v))),
    "log_sigmoid": (_ops.log_sigmoid, lambda v: math.log(1 / (1 + math.exp(-v)))),
    "hard_shrink": (lambda t: _ops.hard_shrink(t, 0.5), lambda v: v if abs(v) > 0.5 else 0.0),
    "soft_shrink": (lambda t: _ops.soft_shrink(t, 0.5, 0.25), lambda v: v - 0.25 if v > 0.5 else (v + 0.25 if v < -0.5 else 0.0)),
    "tanhshrink": (_ops.tanhshrink, lambda v: v - math.tanh(v)),
    "thresholded_relu": (lambda t: _ops.thresholded_relu(t, 1.0), lambda v: v if v > 1.0 else 0.0),
    "hardtanh": (lambda t: _ops.hardtanh(t, -1.0, 2.0), lambda v: min(max(v, -1.0), 2.0)),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_activation_values_and_grads(name):
    fn, ref = REFERENCES[name]
    got = fn(Tensor.from_data(X, dtype="float64")).numpy()
    np.testing.assert_allclose(got, _ref_scalar(ref)(X), rtol=1e-12, atol=1e-12)
    check_grads(fn, X)


def test_activations_keep_float32():
    x = Tensor.from_data(X.astype(np.float32)).require_grad()
    for name, (fn, _) in REFERENCES.items():
        y = fn(x)
        assert y.dtype == x.dtype, name
        g = y.sum().backward()
        assert x.grad(g).numpy().dtype == np.float32, name


def test_softplus_is_stable_for_large_inputs():
    y = _ops.softplus(Tensor.from_data([1000.0, -1000.0]), 1.0).numpy()
    np.testing.assert_allclose(y, [1000.0, 0.0])


@pytest.mark.parametrize("channels", [1, 3])
def test_prelu(channels):
    x = RNG.standard_normal((2, 3, 4))
    alpha = np.array([0.25]) if channels == 1 else np.array([0.1, 0.5, -0.3])
    got = _ops.prelu(Tensor.from_data(x, dtype="float64"), Tensor.from_data(alpha, dtype="float64")).numpy()
    a = alpha.reshape(1, -1, 1)
    np.testing.assert_allclose(got, np.where(x >= 0, x, a * x))
    check_grads(_ops.prelu, x, alpha)


def test_prelu_rejects_alpha_not_matching_channels():
    with pytest.raises(ValueError, match=r"alpha of dims \[1\] or \[channels\]"):
        _ops.prelu(Tensor.zeros([2, 3, 4]), Tensor.zeros([4]))


@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3), (3,)])
def test_linear(shape):
    x = RNG.standard_normal(shape)
    w = RNG.standard_normal((3, 4))
    b = RNG.standard_normal(4)
    got = _ops.linear(Tensor.from_data(x, dtype="float64"), Tensor.from_data(w, dtype="float64"),
                      Tensor.from_data(b, dtype="float64")).numpy()
    ref = np.einsum("...i,io->...o", x, w) + b
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    check_grads(_ops.linear, x, w, b)
    check_grads(lambda a, c: _ops.linear(a, c), x, w)


def test_linear_mismatch_names_both_dims():
    with pytest.raises(ValueError, match=r"d_input 3 .*input dims \[2, 5\]"):
        _ops.linear(Tensor.zeros([2, 5]), Tensor.zeros([3, 4]))


def _norm_ref(x, axes, eps):
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    return (x - m) / np.sqrt(v + eps)


@pytest.mark.parametrize("axes,pshape", [((-1,), (1, 1, 4)), ((0, 2), (1, 3, 1))])
def test_normalize(axes, pshape):
    x = RNG.standard_normal((2, 3, 4)) * 3 + 1
    n = pshape[1] if pshape[1] != 1 else pshape[2]
    g = RNG.standard_normal(n)
    b = RNG.standard_normal(n)

    def fn(xt, gt, bt):
        return _ops.normalize(xt, axes, 1e-5, gt, bt, pshape)

    got = fn(*(Tensor.from_data(a, dtype="float64") for a in (x, g, b))).numpy()
    np.testing.assert_allclose(got, _norm_ref(x, axes, 1e-5) * g.reshape(pshape) + b.reshape(pshape), rtol=1e-10)
    check_grads(fn, x, g, b)
    check_grads(lambda xt: _ops.normalize(xt, axes, 1e-5), x)


@pytest.mark.parametrize("axes,pshape", [((0, 2, 3), (1, 3, 1, 1)), ((-1,), (5,)), ((2, 3), (1, 1, 4, 5))])
@pytest.mark.parametrize("grad_of", ["x", "gamma", "beta", "gamma+beta"])
def test_normalize_partial_gradients_and_float32(axes, pshape, grad_of):
    # each gradient alone (the others not tracked) equals the full float64 gradient, and a
    # float32 input stays float32 in the output and in every gradient
    x = RNG.standard_normal((2, 3, 4, 5)) * 2 + 0.5
    n = int(np.prod(pshape))
    gam, bet = RNG.standard_normal(n) + 1, RNG.standard_normal(n)
    up = RNG.standard_normal(x.shape)

    def run(dtype, tracked):
        ts = [Tensor.from_data(a, dtype=dtype) for a in (x, gam, bet)]
        ts = [t.require_grad() if name in tracked else t for t, name in zip(ts, ("x", "gamma", "beta"))]
        out = _ops.normalize(ts[0], axes, 1e-5, ts[1], ts[2], pshape)
        grads = out.backward(Tensor.from_data(up, dtype=dtype))
        return out, {name: t.grad(grads) for t, name in zip(ts, ("x", "gamma", "beta")) if name in tracked}

    _, full = run("float64", {"x", "gamma", "beta"})
    tracked = set(grad_of.split("+"))
    _, part = run("float64", tracked)
    assert set(part) == tracked
    for name, g in part.items():
        np.testing.assert_allclose(g.numpy(), full[name].numpy(), rtol=1e-12, atol=1e-12)
    out32, g32 = run("float32", {"x", "gamma", "beta"})
    assert out32.dtype == "float32" and all(g.dtype == "float32" for g in g32.values())
    for name, g in g32.items():
        np.testing.assert_allclose(g.numpy(), full[name].numpy(), rtol=2e-4, atol=2e-5)


def test_batch_norm_blocks_give_the_same_result(monkeypatch):
    # batch norm on NumPy runs a block of images at a time: blocks of one image (and an uneven
    # last block) give what one block of the whole batch gives
    x = RNG.standard_normal((5, 3, 4, 2)) * 2 + 0.5
    gam, bet, up = RNG.standard_normal(3) + 1, RNG.standard_normal(3), RNG.standard_normal(x.shape)

    def run():
        ts = [Tensor.from_data(a, dtype="float64").require_grad() for a in (x, gam, bet)]
        stats = {}
        out = _ops.normalize(ts[0], (0, 2, 3), 1e-5, ts[1], ts[2], (1, 3, 1, 1), stats)
        grads = out.backward(Tensor.from_data(up, dtype="float64"))
        return [out.numpy(), stats["mean"], stats["var"]] + [t.grad(grads).numpy() for t in ts]

    whole = run()
    for block_bytes in (1, 2 * 3 * 8 * 8):  # one image per block; two images, then one
        monkeypatch.setattr(cpu_norm, "BN_BLOCK_BYTES", block_bytes)
        for got, want in zip(run(), whole):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(whole[0], _norm_ref(x, (0, 2, 3), 1e-5) * gam.reshape(1, 3, 1, 1) + bet.reshape(1, 3, 1, 1),
                               rtol=1e-10)


def test_rms_norm():
    x = RNG.standard_normal((2, 3, 5))
    g = RNG.standard_normal(5)
    got = _ops.rms_norm(Tensor.from_data(x, dtype="float64"), Tensor.from_data(g, dtype="float64"), 1e-5).numpy()
    ref = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    check_grads(lambda a, b: _ops.rms_norm(a, b, 1e-5), x, g)


@pytest.mark.parametrize("log_probs", [True, False])
def test_softmax_cross_entropy(log_probs):
    logits = RNG.standard_normal((4, 5))
    if not log_probs:
        logits = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    T = RNG.random((4, 5))
    got = _ops.softmax_cross_entropy(Tensor.from_data(logits, dtype="float64"), T, 3.0, log_probs=log_probs).numpy()
    if log_probs:
        lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    else:
        lp = np.log(logits)
    assert got.shape == (1,)
    np.testing.assert_allclose(got[0], -(T * lp).sum() / 3.0, rtol=1e-12)
    check_grads(lambda t: _ops.softmax_cross_entropy(t, T, 3.0, log_probs=log_probs), logits)
