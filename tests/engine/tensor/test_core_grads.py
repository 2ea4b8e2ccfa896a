"""Gradients of the core operations (elementwise, reductions, softmax family, matmul, shape
ops, cast, to_device) against central finite differences in float64, over hypothesis shapes
with broadcasting, size-1 and empty axes; forward values against NumPy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special as sps
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine import Tensor, TensorError
from engine.tensor import where
from tests.engine.tensor._grads import DEVICES, grads

SETTINGS = settings(max_examples=20, deadline=None)


def t64(a, device="cpu"):
    return Tensor.from_data(np.asarray(a, dtype=np.float64), device=device, dtype="float64")


def normal(shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def away_from_zero(shape, seed=0, lo=0.5, hi=2.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)


def positive(shape, seed=0, lo=0.5, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape)


def shapes(min_dims=0, max_dims=3, min_side=0, max_side=3):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


two_broadcastable = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3)
three_broadcastable = hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=0, max_side=3)


# ====================================================================== binary elementwise
BINARY = {
    "add": (lambda a, b: a + b, np.add, normal, normal),
    "sub": (lambda a, b: a - b, np.subtract, normal, normal),
    "mul": (lambda a, b: a * b, np.multiply, normal, normal),
    "div": (lambda a, b: a / b, np.divide, normal, away_from_zero),
    "pow": (lambda a, b: a**b, np.power, positive, normal),
    "maximum": (lambda a, b: a.maximum(b), np.maximum, normal, normal),
    "minimum": (lambda a, b: a.minimum(b), np.minimum, normal, normal),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting_values_and_grads(name):
    fn, ref, gen_a, gen_b = BINARY[name]

    @SETTINGS
    @given(shp=two_broadcastable, seed=st.integers(0, 1000))
    def run(shp, seed):
        (sa, sb), result = shp.input_shapes, shp.result_shape
        a, b = gen_a(sa, seed), gen_b(sb, seed + 1)
        out = fn(t64(a), t64(b))
        assert out.shape == result
        np.testing.assert_allclose(out.numpy(), ref(a, b), rtol=1e-14, atol=0)
        grads(fn, a, b)

    run()


SCALAR = {
    "add": (lambda a: a + 2.5, normal),
    "radd": (lambda a: 2.5 + a, normal),
    "sub": (lambda a: a - 1.5, normal),
    "rsub": (lambda a: 1.5 - a, normal),
    "mul": (lambda a: a * -1.5, normal),
    "rmul": (lambda a: -1.5 * a, normal),
    "div": (lambda a: a / 3.0, normal),
    "rdiv": (lambda a: 3.0 / a, away_from_zero),
    "pow_int": (lambda a: a**3, normal),
    "pow_frac": (lambda a: a**2.5, positive),
    "pow_zero": (lambda a: a**0.0, normal),
    "powf": (lambda a: a.powf(-1.5), positive),
    "maximum": (lambda a: a.maximum(0.1), away_from_zero),
    "minimum": (lambda a: a.minimum(0.1), away_from_zero),
}


@pytest.mark.parametrize("name", sorted(SCALAR))
@SETTINGS
@given(shape=shapes(), seed=st.integers(0, 1000))
def test_tensor_scalar_grads(name, shape, seed):
    fn, gen = SCALAR[name]
    grads(fn, gen(shape, seed))


def test_scalar_operands_keep_float32_and_reject_other_types():
    x = Tensor.from_data([1.0, 2.0])
    assert (x * np.float64(2.0)).dtype == "float32"
    assert (x * 2.0).dtype == "float32" and (2.0 / x).dtype == "float32"
    with pytest.raises(TypeError, match="add: expected a Tensor or a number, got str"):
        x + "a"
    with pytest.raises(TensorError, match=r"add: shapes cannot be broadcast together: dims \[2\] and dims \[3\]"):
        x + Tensor.zeros((3,))


# ====================================================================== unary elementwise
def _clamp_safe(shape, seed=0):
    x = normal(shape, seed)
    near = np.abs(np.abs(x) - 0.5) < 1e-3
    return np.where(near, x + 0.01, x)


UNARY = {
    "exp": (lambda a: a.exp(), np.exp, normal),
    "log": (lambda a: a.log(), np.log, positive),
    "log1p": (lambda a: a.log1p(), np.log1p, lambda s, k: positive(s, k, -0.5, 2.0)),
    "sqrt": (lambda a: a.sqrt(), np.sqrt, positive),
    "rsqrt": (lambda a: a.rsqrt(), lambda x: 1 / np.sqrt(x), positive),
    "abs": (lambda a: a.abs(), np.abs, away_from_zero),
    "sign": (lambda a: a.sign(), np.sign, away_from_zero),
    "neg": (lambda a: -a, np.negative, normal),
    "square": (lambda a: a.square(), np.square, normal),
    "recip": (lambda a: a.recip(), np.reciprocal, away_from_zero),
    "tanh": (lambda a: a.tanh(), np.tanh, lambda s, k: normal(s, k, 3.0)),
    "sigmoid": (lambda a: a.sigmoid(), sps.expit, lambda s, k: normal(s, k, 10.0)),
    "erf": (lambda a: a.erf(), sps.erf, normal),
    "sin": (lambda a: a.sin(), np.sin, normal),
    "cos": (lambda a: a.cos(), np.cos, normal),
    "relu": (lambda a: a.relu(), lambda x: np.maximum(x, 0), away_from_zero),
    "clamp": (lambda a: a.clamp(-0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), _clamp_safe),
    "clamp_min": (lambda a: a.clamp_min(-0.5), lambda x: np.maximum(x, -0.5), _clamp_safe),
    "clamp_max": (lambda a: a.clamp_max(0.5), lambda x: np.minimum(x, 0.5), _clamp_safe),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@SETTINGS
@given(shape=shapes(), seed=st.integers(0, 1000))
def test_unary_values_and_grads(name, shape, seed):
    fn, ref, gen = UNARY[name]
    x = gen(shape, seed)
    np.testing.assert_allclose(fn(t64(x)).numpy(), ref(x), rtol=1e-13, atol=1e-300)
    grads(fn, x)


def test_sigmoid_is_stable_for_large_inputs_in_float32():
    x = Tensor.from_data([-1000.0, -80.0, 0.0, 80.0, 1000.0])
    y = x.sigmoid().numpy()
    assert y.dtype == np.float32 and np.all(np.isfinite(y))
    np.testing.assert_allclose(y, sps.expit(np.array([-1000.0, -80.0, 0.0, 80.0, 1000.0])).astype(np.float32), rtol=1e-6)


def test_clamp_without_bounds_is_an_error():
    with pytest.raises(TensorError, match="clamp: expected at least one of min and max"):
        Tensor.zeros((2,)).clamp()


# ====================================================================== where / mask_fill
@SETTINGS
@given(shp=three_broadcastable, seed=st.integers(0, 1000))
def test_where_broadcasting_values_and_grads(shp, seed):
    sm, sa, sb = shp.input_shapes
    mask = np.random.default_rng(seed).random(sm) < 0.5
    a, b = normal(sa, seed), normal(sb, seed + 1)
    m = Tensor.from_data(mask)
    out = where(m, t64(a), t64(b))
    np.testing.assert_array_equal(out.numpy(), np.where(mask, a, b))
    grads(lambda x, y: where(m, x, y), a, b)
    grads(lambda x: where(m, x, 0.5), a)
    grads(lambda y: where(m, -2.0, y), b)
    # mask_fill(mask, value): value where mask, else self; mask_where(mask, other): other where mask
    grads(lambda y: y.mask_fill(m, 3.0), b)
    grads(lambda x, y: y.mask_where(m, x), a, b)


def test_where_with_the_same_tensor_on_both_sides():
    x = np.array([1.0, 2.0, 3.0])
    m = Tensor.from_data([True, False, True])
    xt = t64(x).require_grad()
    g = where(m, xt, xt).sum().backward()
    np.testing.assert_array_equal(xt.grad(g).numpy(), [1.0, 1.0, 1.0])


def test_where_errors():
    x = Tensor.zeros((2,))
    with pytest.raises(TensorError, match="where: expected a bool mask, got float32"):
        where(Tensor.zeros((2,)), x, x)
    with pytest.raises(TensorError, match="where: expected at least one of the two value operands to be a tensor"):
        where(Tensor.from_data([True, False]), 1.0, 2.0)


def test_comparisons_return_bool_without_graph():
    x = t64([1.0, 2.0, 3.0]).require_grad()
    for out in (x > 2.0, x >= 2.0, x < 2.0, x <= 2.0, x.equal(2.0), x.not_equal(x)):
        assert out.dtype == "bool" and not out.is_tracked()
    np.testing.assert_array_equal((x > 1.5).numpy(), [False, True, True])


# ====================================================================== reductions
@st.composite
def reduce_case(draw, nonempty_axis=False, nonempty_all=False):
    shape = draw(shapes(min_dims=0 if not nonempty_axis else 1))
    rank = len(shape)
    dim = None
    if rank and draw(st.booleans()):
        dim = draw(st.integers(-rank, rank - 1))
    keepdim = draw(st.booleans())
    if nonempty_axis:
        if dim is None:
            shape = tuple(max(s, 1) for s in shape)
        else:
            shape = tuple(max(s, 1) if i == dim % rank else s for i, s in enumerate(shape))
    if nonempty_all:
        shape = tuple(max(s, 1) for s in shape)
    return shape, dim, keepdim, draw(st.integers(0, 1000))


def _np_reduce(fn, x, dim, keepdim):
    if dim is None:
        return fn(x)
    return fn(x, axis=dim, keepdims=keepdim)


@SETTINGS
@given(case=reduce_case())
def test_sum_values_and_grads(case):
    shape, dim, keepdim, seed = case
    x = normal(shape, seed)
    out = t64(x).sum(dim, keepdim=keepdim)
    np.testing.assert_allclose(out.numpy(), _np_reduce(np.sum, x, dim, keepdim), rtol=1e-13, atol=1e-13)
    grads(lambda a: a.sum(dim, keepdim=keepdim), x)


@SETTINGS
@given(case=reduce_case(nonempty_axis=True))
def test_mean_values_and_grads(case):
    shape, dim, keepdim, seed = case
    x = normal(shape, seed)
    out = t64(x).mean(dim, keepdim=keepdim)
    np.testing.assert_allclose(out.numpy(), _np_reduce(np.mean, x, dim, keepdim), rtol=1e-13, atol=1e-13)
    grads(lambda a: a.mean(dim, keepdim=keepdim), x)


@pytest.mark.parametrize("op", ["max", "min"])
@SETTINGS
@given(case=reduce_case(nonempty_all=True))
def test_max_min_values_and_grads(op, case):
    shape, dim, keepdim, seed = case
    x = normal(shape, seed)
    out = getattr(t64(x), op)(dim, keepdim=keepdim)
    np.testing.assert_array_equal(out.numpy(), _np_reduce(getattr(np, op), x, dim, keepdim))
    grads(lambda a: getattr(a, op)(dim, keepdim=keepdim), x)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_along_a_non_empty_dim_of_an_empty_tensor(op):
    x = t64(np.zeros((1, 0))).require_grad()
    out = getattr(x, op)(0)
    assert out.shape == (0,)
    g = out.sum().backward()
    assert x.grad(g).shape == (1, 0)


def test_max_min_of_empty_is_an_error_and_argmax_matches_numpy():
    with pytest.raises(TensorError, match=r"max: cannot reduce an empty tensor \(dims \[0, 2\]\)"):
        Tensor.zeros((0, 2)).max()
    x = normal((3, 4), 1)
    np.testing.assert_array_equal(t64(x).argmax(1).numpy(), x.argmax(1))
    np.testing.assert_array_equal(t64(x).argmin(0, keepdim=True).numpy(), x.argmin(0, keepdims=True))
    assert int(t64(x).argmax().item()) == int(x.argmax())
    assert t64(x).argmax(1).dtype == "int64"


@SETTINGS
@given(case=reduce_case(nonempty_axis=True), with_zeros=st.booleans())
def test_prod_values_and_grads(case, with_zeros):
    shape, dim, keepdim, seed = case
    x = normal(shape, seed)
    if with_zeros and x.size:
        x.reshape(-1)[:: max(1, x.size // 2)] = 0.0  # exact zeros: the rule must not divide by x
    out = t64(x).prod(dim, keepdim=keepdim)
    np.testing.assert_allclose(out.numpy(), _np_reduce(np.prod, x, dim, keepdim), rtol=1e-13, atol=1e-13)
    grads(lambda a: a.prod(dim, keepdim=keepdim), x)


def test_prod_over_an_empty_axis_has_an_empty_gradient():
    x = t64(np.zeros((2, 0))).require_grad()
    np.testing.assert_array_equal(x.prod(1).numpy(), [1.0, 1.0])
    g = x.prod(1).sum().backward()
    assert x.grad(g).shape == (2, 0)


@SETTINGS
@given(case=reduce_case(nonempty_all=True), correction=st.sampled_from([0, 1]))
def test_var_values_and_grads(case, correction):
    shape, dim, keepdim, seed = case
    x = normal(shape, seed)
    n = x.size if dim is None else x.shape[dim]
    if n <= correction:
        return
    out = t64(x).var(dim, keepdim=keepdim, correction=correction)
    expect = np.var(x, ddof=correction) if dim is None else np.var(x, axis=dim, keepdims=keepdim, ddof=correction)
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-12, atol=1e-13)
    grads(lambda a: a.var(dim, keepdim=keepdim, correction=correction), x)


# ====================================================================== softmax family
@st.composite
def softmax_case(draw):
    shape = draw(shapes(min_dims=1))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    shape = tuple(max(s, 1) if i == dim % len(shape) else s for i, s in enumerate(shape))
    return shape, dim, draw(st.integers(0, 1000))


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@SETTINGS
@given(case=softmax_case(), keepdim=st.booleans())
def test_softmax_family_values_and_grads(case, keepdim):
    shape, dim, seed = case
    x = normal(shape, seed, 3.0)
    np.testing.assert_allclose(t64(x).softmax(dim).numpy(), _np_softmax(x, dim), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t64(x).log_softmax(dim).numpy(), np.log(_np_softmax(x, dim)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        t64(x).logsumexp(dim, keepdim=keepdim).numpy(), sps.logsumexp(x, axis=dim, keepdims=keepdim), rtol=1e-12, atol=1e-12
    )
    # quiet softmax: an extra zero logit in the denominator
    ext = np.concatenate([x, np.zeros(x.shape[:dim % x.ndim] + (1,) + x.shape[dim % x.ndim + 1 :])], axis=dim)
    quiet = np.take(_np_softmax(ext, dim), np.arange(x.shape[dim]), axis=dim)
    np.testing.assert_allclose(t64(x).quiet_softmax(dim).numpy(), quiet, rtol=1e-12, atol=1e-15)
    grads(lambda a: a.softmax(dim), x)
    grads(lambda a: a.log_softmax(dim), x)
    grads(lambda a: a.logsumexp(dim, keepdim=keepdim), x)
    grads(lambda a: a.quiet_softmax(dim), x)


def test_softmax_family_large_logits_stay_finite():
    x = Tensor.from_data([[1000.0, 0.0, -1000.0]])
    for out in (x.softmax(1), x.log_softmax(1), x.logsumexp(1), x.quiet_softmax(1)):
        assert np.all(np.isfinite(out.numpy()))
    np.testing.assert_allclose(x.logsumexp(1).numpy(), [1000.0])


# ====================================================================== matmul
@st.composite
def matmul_case(draw):
    shp = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, min_side=0, max_side=2))
    ba, bb = shp.input_shapes
    n, k, m = draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
    return ba + (n, k), bb + (k, m), draw(st.integers(0, 1000))


@SETTINGS
@given(case=matmul_case())
def test_matmul_batch_broadcasting_values_and_grads(case):
    sa, sb, seed = case
    a, b = normal(sa, seed), normal(sb, seed + 1)
    out = t64(a) @ t64(b)
    np.testing.assert_allclose(out.numpy(), np.matmul(a, b), rtol=1e-12, atol=1e-12)
    grads(lambda x, y: x.matmul(y), a, b)


def test_matmul_errors():
    with pytest.raises(TensorError, match=r"matmul: inner dimensions differ: dims \[2, 3\] @ \[4, 5\]"):
        Tensor.zeros((2, 3)) @ Tensor.zeros((4, 5))
    with pytest.raises(TensorError, match="matmul: expected tensors of rank >= 2"):
        Tensor.zeros((3,)) @ Tensor.zeros((3, 2))
    with pytest.raises(TensorError, match="matmul: batch axes cannot be broadcast"):
        Tensor.zeros((2, 1, 3)) @ Tensor.zeros((3, 3, 2))


# ====================================================================== shape operations
@SETTINGS
@given(shape=shapes(min_dims=1, max_dims=4), data=st.data())
def test_shape_ops_values_and_grads(shape, data):
    x = normal(shape)
    rank = len(shape)
    # reshape with -1
    if x.size:
        target = (-1,) + shape[1:] if data.draw(st.booleans()) else (x.size,)
        np.testing.assert_array_equal(t64(x).reshape(target).numpy(), x.reshape(target))
        grads(lambda a: a.reshape(target), x)
    perm = data.draw(st.permutations(range(rank)))
    np.testing.assert_array_equal(t64(x).permute(perm).numpy(), x.transpose(perm))
    grads(lambda a: a.permute(*perm), x)
    d1, d2 = data.draw(st.integers(-rank, rank - 1)), data.draw(st.integers(-rank, rank - 1))
    np.testing.assert_array_equal(t64(x).swap_dims(d1, d2).numpy(), np.swapaxes(x, d1, d2))
    grads(lambda a: a.swap_dims(d1, d2), x)
    if rank >= 2:
        np.testing.assert_array_equal(t64(x).transpose().numpy(), np.swapaxes(x, -1, -2))
        grads(lambda a: a.transpose(), x)
    s = data.draw(st.integers(0, rank - 1))
    e = data.draw(st.integers(s, rank - 1))
    flat = x.reshape(shape[:s] + (int(np.prod(shape[s : e + 1])),) + shape[e + 1 :])
    np.testing.assert_array_equal(t64(x).flatten(s, e).numpy(), flat)
    grads(lambda a: a.flatten(s, e), x)
    u = data.draw(st.integers(-(rank + 1), rank))
    np.testing.assert_array_equal(t64(x).unsqueeze(u).numpy(), np.expand_dims(x, u))
    grads(lambda a: a.unsqueeze(u), x)
    ones = [i for i, n in enumerate(shape) if n == 1]
    if ones:
        q = data.draw(st.sampled_from(ones))
        np.testing.assert_array_equal(t64(x).squeeze(q).numpy(), np.squeeze(x, q))
        grads(lambda a: a.squeeze(q), x)
    np.testing.assert_array_equal(t64(x).squeeze().numpy(), np.squeeze(x))
    grads(lambda a: a.squeeze(), x)


@SETTINGS
@given(shape=shapes(min_dims=0, max_dims=3), data=st.data())
def test_expand_values_and_grads(shape, data):
    lead = tuple(data.draw(st.lists(st.integers(0, 3), max_size=2)))
    target = lead + tuple(data.draw(st.sampled_from([n, -1] if n != 1 else [0, 1, 3, -1])) for n in shape)
    x = normal(shape)
    concrete = lead + tuple(n if t == -1 else t for n, t in zip(shape, target[len(lead) :]))
    np.testing.assert_array_equal(t64(x).expand(target).numpy(), np.broadcast_to(x, concrete))
    grads(lambda a: a.expand(*target), x)


def test_shape_op_errors():
    x = Tensor.zeros((2, 3))
    with pytest.raises(TensorError, match=r"reshape: dims \[2, 3\] \(6 elements\) cannot become \[4, 2\] \(8 elements\)"):
        x.reshape(4, 2)
    with pytest.raises(TensorError, match=r"reshape: expected sizes >= 0 and at most one -1, got \[-1, -1\]"):
        x.reshape(-1, -1)
    with pytest.raises(TensorError, match=r"permute: expected a permutation of \[0, 1\], got \[0, 0\]"):
        x.permute(0, 0)
    with pytest.raises(TensorError, match="squeeze: axis 0 has size 2, expected 1"):
        x.squeeze(0)
    with pytest.raises(TensorError, match=r"expand: axis 1 of size 3 cannot become 4"):
        x.expand(2, 4)
    with pytest.raises(TensorError, match="flatten: start_dim 1 comes after end_dim 0"):
        x.flatten(1, 0)


def test_expand_rejects_minus_one_in_a_new_axis_clearly():
    with pytest.raises(TensorError, match="expand"):
        Tensor.zeros((2, 3)).expand(-1, 2, 3)


# ====================================================================== cast and to_device
def test_cast_float_chain_passes_gradients_in_each_dtype():
    x = Tensor.from_data([1.0, 2.0, 3.0]).require_grad()  # float32
    w = t64([0.5, -2.0, 4.0])
    y = x.cast("float64") * w
    assert y.dtype == "float64"
    g = y.sum().backward()
    gx = x.grad(g)
    assert gx.dtype == "float32"
    np.testing.assert_array_equal(gx.numpy(), np.array([0.5, -2.0, 4.0], dtype=np.float32))
    same = t64([1.0])
    assert same.cast("float64") is same
    grads(lambda a: a.cast("float64") * 2.0, [1.0, -3.0])


def test_cast_to_int_cuts_the_graph():
    x = Tensor.from_data([1.7, -2.2]).require_grad()
    i = x.cast("int64")
    assert i.dtype == "int64" and not i.is_tracked()
    np.testing.assert_array_equal(i.numpy(), [1, -2])
    assert i.cast("float32").dtype == "float32"


@pytest.mark.parametrize("device", DEVICES)
def test_to_device_round_trip_grads(device):
    x = normal((2, 3))
    grads(lambda a: (a.to_device("cpu:1") * 3.0).exp().to_device(device), x, device=device)
    grads(lambda a, b: (a.to_device("cpu:1") @ b.to_device("cpu:1")).to_device(device), x, normal((3, 2), 1), device=device)


# ====================================================================== a few composite graphs, on each device
@pytest.mark.parametrize("device", DEVICES)
def test_composite_grads_on_device(device):
    a, b = normal((2, 3, 4)), normal((1, 4, 2), 1)
    grads(lambda x, y: (x @ y).tanh().sum(1).log_softmax(-1), a, b, device=device)
    grads(lambda x: (x.sigmoid() * x.erf()).mean(2, keepdim=True).max(0), a, device=device)
    grads(lambda x, y: where(x > 0.0, x * 2.0, y.sum(2, keepdim=True) ** 2), a, normal((1, 3, 2), 2), device=device)
    grads(lambda x: x.permute(2, 0, 1).reshape(4, -1).softmax(0).clamp(0.01, 0.9).prod(1), a, device=device)
    grads(lambda x: (x.expand(3, 2, 3, 4) - x.unsqueeze(0)).square().flatten(0, 1).sum(), a, device=device)


def test_reused_tensor_accumulates_gradients():
    x = normal((3,))
    g = grads(lambda a: a * a + a.exp() * a, x)[0]
    assert g.shape == (3,)
    xt = t64(x).require_grad()
    grad = (xt * xt + xt.exp() * xt).sum().backward()
    np.testing.assert_allclose(xt.grad(grad).numpy(), 2 * x + np.exp(x) * (x + 1), rtol=1e-13)


def test_accumulation_never_writes_into_a_gradient_shared_by_two_parents():
    # s's gradient is a sum (an array backward allocated); add's rule then hands that one
    # array to both a and b. A later contribution to a (through exp, reached after s) must
    # not be added into it in place, or b's gradient changes too. The rank-0 case must not
    # lose a contribution to an immutable scalar.
    for shape in [(2, 3), ()]:
        a = Tensor.from_data(np.full(shape, 0.5), dtype="float64").require_grad()
        b = Tensor.from_data(np.full(shape, -0.5), dtype="float64").require_grad()
        s = a + b
        out = (a.exp() + (s * 2.0 + s)).sum()
        g = out.backward()
        np.testing.assert_allclose(a.grad(g).numpy(), np.full(shape, np.exp(0.5) + 3.0), rtol=1e-15)
        np.testing.assert_array_equal(b.grad(g).numpy(), np.full(shape, 3.0))
        # three contributions to one node: the third is added to the sum of the first two
        x = Tensor.from_data(np.full(shape, 0.5), dtype="float64").require_grad()
        g = (x * 2.0 + x * 3.0 + x * 5.0).sum().backward()
        np.testing.assert_array_equal(x.grad(g).numpy(), np.full(shape, 10.0))


def test_math_constants_exact():
    # erf's derivative uses 2/sqrt(pi): compare one point with the closed form
    x = t64([0.3]).require_grad()
    g = x.erf().sum().backward()
    assert x.grad(g).item() == pytest.approx(2 / math.sqrt(math.pi) * math.exp(-0.09), rel=1e-15)
