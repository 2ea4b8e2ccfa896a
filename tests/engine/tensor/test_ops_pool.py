"""Max, average and adaptive average pooling against loop implementations, and their gradients."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Tensor, TensorError
from tests.engine.gradcheck import check_grads


def t64(a):
    return Tensor.from_data(a, dtype="float64")


def out_size(L, k, s, p, d, ceil):
    # PyTorch's pooling_output_shape
    num = L + 2 * p - d * (k - 1) - 1
    o = (math.ceil(num / s) if ceil else num // s) + 1
    if ceil and (o - 1) * s >= L + p:
        o -= 1
    return o


def ref_max_pool(x, k, s, p, d, ceil):
    """PyTorch's CPU scan: first valid position, then `val > max or isnan(val)`."""
    n = x.ndim - 2
    in_sp = x.shape[2:]
    out_sp = [out_size(in_sp[i], k[i], s[i], p[i], d[i], ceil) for i in range(n)]
    vals = np.zeros(x.shape[:2] + tuple(out_sp))
    idx = np.zeros(x.shape[:2] + tuple(out_sp), dtype=np.int64)
    for bc in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*map(range, out_sp)):
            ranges = []
            for i in range(n):
                start = o[i] * s[i] - p[i]
                ranges.append([start + j * d[i] for j in range(k[i]) if 0 <= start + j * d[i] < in_sp[i]])
            best, best_i = -np.inf, None
            for pos in itertools.product(*ranges):
                flat = int(np.ravel_multi_index(pos, in_sp))
                if best_i is None:
                    best_i = flat
                v = x[bc + pos]
                if v > best or np.isnan(v):
                    best, best_i = v, flat
            vals[bc + o], idx[bc + o] = best, best_i
    return vals, idx


def ref_avg_pool(x, k, s, p, include_pad, ceil):
    n = x.ndim - 2
    in_sp = x.shape[2:]
    out_sp = [out_size(in_sp[i], k[i], s[i], p[i], 1, ceil) for i in range(n)]
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for bc in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*map(range, out_sp)):
            total, padded_count, inner = 0.0, 1, []
            for i in range(n):
                start = o[i] * s[i] - p[i]
                end = min(start + k[i], in_sp[i] + p[i])
                padded_count *= end - start
                inner.append(range(max(start, 0), min(end, in_sp[i])))
            count = 0
            for pos in itertools.product(*inner):
                total += x[bc + pos]
                count += 1
            out[bc + o] = total / (padded_count if include_pad else count)
    return out


def ref_adaptive(x, out_sp):
    n = x.ndim - 2
    in_sp = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for o in itertools.product(*map(range, out_sp)):
        sl = tuple(
            slice(math.floor(o[i] * in_sp[i] / out_sp[i]), math.ceil((o[i] + 1) * in_sp[i] / out_sp[i])) for i in range(n)
        )
        out[(slice(None), slice(None)) + o] = x[(slice(None), slice(None)) + sl].mean(axis=tuple(range(2, 2 + n)))
    return out


def distinct(rng, shape):
    """Values at least 0.05 apart, so finite differences never change which one is the max."""
    return (rng.permutation(int(np.prod(shape))) * 0.05 - 1.0).reshape(shape)


MAX_CASES = [
    # spatial, kernel, stride, padding, dilation, ceil
    ((7,), (3,), (2,), (1,), (1,), False),
    ((8,), (2,), (2,), (0,), (1,), True),
    ((9,), (3,), (2,), (1,), (2,), True),
    ((5, 6), (2, 2), (2, 2), (0, 0), (1, 1), False),
    ((5, 6), (3, 2), (2, 1), (1, 1), (1, 1), True),
    ((7, 7), (3, 3), (2, 3), (1, 0), (2, 2), False),
    ((6, 5), (2, 3), (3, 2), (1, 1), (1, 1), True),
    ((4, 4), (3, 3), (1, 1), (1, 1), (1, 1), False),
    ((4, 6), (2, 2), (2, 2), (0, 0), (1, 1), False),  # windows tile the input
    ((6, 6), (3, 2), (3, 2), (0, 0), (1, 1), True),  # tiled, ceil_mode changes nothing
]


@pytest.mark.parametrize("case", MAX_CASES)
def test_max_pool_matches_loops(case):
    sp, k, s, p, d, ceil = case
    n = len(sp)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3) + sp)
    vals, idx = getattr(Tensor, f"max_pool{n}d_with_indices")(t64(x), k, s, p, d, ceil)
    rv, ri = ref_max_pool(x, k, s, p, d, ceil)
    assert vals.shape == rv.shape and idx.dtype == "int64"
    np.testing.assert_array_equal(vals.numpy(), rv)
    np.testing.assert_array_equal(idx.numpy(), ri)
    plain = getattr(Tensor, f"max_pool{n}d")(t64(x), k, s, p, d, ceil)
    np.testing.assert_array_equal(plain.numpy(), rv)


@pytest.mark.parametrize("case", MAX_CASES)
def test_max_pool_gradients(case):
    sp, k, s, p, d, ceil = case
    n = len(sp)
    x = distinct(np.random.default_rng(1), (2, 2) + sp)
    fn = getattr(Tensor, f"max_pool{n}d")
    check_grads(lambda x: fn(x, k, s, p, d, ceil), x)
    fi = getattr(Tensor, f"max_pool{n}d_with_indices")
    check_grads(lambda x: fi(x, k, s, p, d, ceil)[0], x)


def test_max_pool_known_values_and_ties():
    x = np.array([[1.0, 3.0, 2.0, 0.0], [4.0, 4.0, 1.0, 5.0], [0.0, 0.0, 7.0, 7.0], [9.0, 1.0, 7.0, 6.0]])
    v, i = t64(x[None, None]).max_pool2d_with_indices(2)
    np.testing.assert_array_equal(v.numpy()[0, 0], [[4.0, 5.0], [9.0, 7.0]])
    # ties keep the first position in scan order: 4.0 at (1, 0) -> 4; 7.0 at (2, 2) -> 10
    np.testing.assert_array_equal(i.numpy()[0, 0], [[4, 7], [12, 10]])
    # the gradient of a tie goes to that first position only
    xt = t64(x[None, None]).require_grad()
    g = xt.max_pool2d(2).sum().backward()
    expected = np.zeros((4, 4))
    expected[1, 0] = expected[1, 3] = expected[3, 0] = expected[2, 2] = 1.0
    np.testing.assert_array_equal(xt.grad(g).numpy()[0, 0], expected)


def test_max_pool_overlapping_windows_accumulate_gradient():
    x = np.array([[[0.0, 1.0, 5.0, 2.0, 0.5]]])
    xt = t64(x).require_grad()
    g = xt.max_pool1d(3, 1).sum().backward()  # 5.0 is the max of all three windows
    np.testing.assert_array_equal(xt.grad(g).numpy(), [[[0.0, 0.0, 3.0, 0.0, 0.0]]])


def test_max_pool_minus_infinity_windows_point_at_their_first_input_position():
    x = np.full((1, 1, 5, 5), -np.inf)
    x[0, 0, 3, 4] = 1.0
    x[0, 0, 0, 2] = np.nan
    for k, s, p, d, ceil in [(3, 2, 1, 1, False), (2, 2, 1, 2, True), (3, 1, 1, 1, True)]:
        v, i = t64(x).max_pool2d_with_indices(k, s, p, d, ceil)
        rv, ri = ref_max_pool(x, (k, k), (s, s), (p, p), (d, d), ceil)
        np.testing.assert_array_equal(v.numpy(), rv)
        np.testing.assert_array_equal(i.numpy(), ri)
        # the gradient follows the indices
        xt = t64(x).require_grad()
        out = xt.max_pool2d(k, s, p, d, ceil)
        probe = np.arange(1.0, 1.0 + out.numel()).reshape(out.shape)
        gx = xt.grad(out.backward(t64(probe))).numpy().reshape(-1)
        expected = np.zeros(25)
        np.add.at(expected, ri.reshape(-1), probe.reshape(-1))
        np.testing.assert_array_equal(gx, expected)


def test_max_pool_nan_wins_and_int_input():
    x = t64([[[1.0, np.nan, 3.0, 2.0]]])
    v, i = x.max_pool1d_with_indices(2)
    assert np.isnan(v.numpy()[0, 0, 0]) and v.numpy()[0, 0, 1] == 3.0
    assert i.numpy()[0, 0].tolist() == [1, 2]
    xi = Tensor.from_data([[[3, 1, 4, 1, 5, 9]]])
    vi, ii = xi.max_pool1d_with_indices(2, padding=1)
    assert vi.dtype == "int64" and vi.numpy()[0, 0].tolist() == [3, 4, 5, 9]
    assert ii.numpy()[0, 0].tolist() == [0, 2, 4, 5]


@pytest.mark.parametrize("case", MAX_CASES + [((9, 9), (3, 3), (3, 3), (0, 0), (1, 1), False),
                                             ((7, 10), (3, 5), (3, 5), (1, 2), (1, 1), True),
                                             ((8,), (7,), (7,), (3,), (1,), False)])
def test_max_pool_many_ties_and_nans_pick_what_pytorch_picks(case):
    # values from a tiny set: most windows hold ties (and some NaN), so every level of the
    # pairwise combination meets equal values; indices and the gradient must follow the scan
    sp, k, s, p, d, ceil = case
    n = len(sp)
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3, (2, 3) + sp).astype(np.float64)
    for with_nan in (False, True):
        if with_nan:
            x.reshape(-1)[rng.choice(x.size, max(1, x.size // 15), replace=False)] = np.nan
        vals, idx = getattr(Tensor, f"max_pool{n}d_with_indices")(t64(x), k, s, p, d, ceil)
        rv, ri = ref_max_pool(x, k, s, p, d, ceil)
        np.testing.assert_array_equal(vals.numpy(), rv)
        np.testing.assert_array_equal(idx.numpy(), ri)
        xt = t64(x).require_grad()
        out = getattr(Tensor, f"max_pool{n}d")(xt, k, s, p, d, ceil)
        probe = np.arange(1.0, 1.0 + out.numel()).reshape(out.shape)
        gx = xt.grad(out.backward(t64(probe))).numpy().reshape(2, 3, -1)
        expected = np.zeros((2, 3, int(np.prod(sp))))
        for b in range(2):
            for c in range(3):
                np.add.at(expected[b, c], ri[b, c].reshape(-1), probe[b, c].reshape(-1))
        np.testing.assert_array_equal(gx, expected)


def test_max_pool_by_blocks_of_images_gives_the_same(monkeypatch):
    # on NumPy the argmax tree runs a block of images at a time: one image per block
    from engine.tensor import ops_pool

    rng = np.random.default_rng(8)
    x = rng.integers(0, 3, (3, 2, 6, 7)).astype(np.float64)
    x[1, 0, 2, 3] = np.nan
    ref = [a.numpy() for a in t64(x).max_pool2d_with_indices((2, 3), (2, 2), (1, 1))]
    monkeypatch.setattr(ops_pool, "_POOL_BLOCK_BYTES", 1)
    got = [a.numpy() for a in t64(x).max_pool2d_with_indices((2, 3), (2, 2), (1, 1))]
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    rv, ri = ref_max_pool(x, (2, 3), (2, 2), (1, 1), (1, 1), False)
    np.testing.assert_array_equal(got[0], rv)
    np.testing.assert_array_equal(got[1], ri)
    # the backward scatter, a block of images at a time, follows the same indices
    x[1, 0, 2, 3] = 5.0
    xt = t64(x).require_grad()
    out = xt.max_pool2d((2, 3), (3, 3))  # windows apart: the scatter path
    probe = np.arange(1.0, 1.0 + out.numel()).reshape(out.shape)
    gx = xt.grad(out.backward(t64(probe))).numpy().reshape(3, 2, -1)
    _, ri = ref_max_pool(x, (2, 3), (3, 3), (0, 0), (1, 1), False)
    expected = np.zeros((3, 2, 42))
    for b in range(3):
        for c in range(2):
            np.add.at(expected[b, c], ri[b, c].reshape(-1), probe[b, c].reshape(-1))
    np.testing.assert_array_equal(gx, expected)


def test_max_pool_float32_stays_float32():
    x = Tensor.from_data(np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)).require_grad()
    out = x.max_pool2d(2)
    assert out.dtype == "float32"
    assert x.grad(out.sum().backward()).dtype == "float32"


AVG_CASES = [
    # spatial, kernel, stride, padding, count_include_pad, ceil
    ((7,), (3,), (2,), (1,), True, False),
    ((7,), (3,), (2,), (1,), False, True),
    ((8,), (4,), (3,), (2,), True, True),
    ((5, 6), (2, 2), (2, 2), (0, 0), True, False),
    ((5, 6), (3, 2), (2, 1), (1, 1), False, False),
    ((5, 6), (3, 3), (2, 2), (1, 1), True, True),
    ((6, 5), (2, 3), (3, 2), (1, 1), False, True),
]


@pytest.mark.parametrize("case", AVG_CASES)
def test_avg_pool_matches_loops(case):
    sp, k, s, p, include, ceil = case
    n = len(sp)
    x = np.random.default_rng(2).standard_normal((2, 3) + sp)
    y = getattr(Tensor, f"avg_pool{n}d")(t64(x), k, s, p, include, ceil)
    r = ref_avg_pool(x, k, s, p, include, ceil)
    assert y.shape == r.shape
    np.testing.assert_allclose(y.numpy(), r, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", AVG_CASES)
def test_avg_pool_gradients(case):
    sp, k, s, p, include, ceil = case
    n = len(sp)
    x = np.random.default_rng(3).standard_normal((1, 2) + sp)
    fn = getattr(Tensor, f"avg_pool{n}d")
    check_grads(lambda x: fn(x, k, s, p, include, ceil), x)


def test_avg_pool_known_values():
    x = t64(np.arange(16.0).reshape(1, 1, 4, 4))
    # 3x3 windows with padding 1: the corner window holds 0, 1, 4, 5 (sum 10)
    np.testing.assert_allclose(x.avg_pool2d(3, 1, 1).numpy()[0, 0, 0, 0], 10.0 / 9.0)
    np.testing.assert_allclose(x.avg_pool2d(3, 1, 1, count_include_pad=False).numpy()[0, 0, 0, 0], 10.0 / 4.0)
    np.testing.assert_allclose(x.avg_pool2d(2).numpy()[0, 0], [[2.5, 4.5], [10.5, 12.5]])


@pytest.mark.parametrize("in_sp,out_sp", [((5,), (3,)), ((7,), (7,)), ((4,), (6,)), ((5, 7), (3, 2)), ((6, 4), (4, 4)), ((3, 5), (5, 2))])
def test_adaptive_avg_pool_matches_loops_and_gradients(in_sp, out_sp):
    n = len(in_sp)
    x = np.random.default_rng(4).standard_normal((2, 2) + in_sp)
    fn = getattr(Tensor, f"adaptive_avg_pool{n}d")
    y = fn(t64(x), out_sp)
    np.testing.assert_allclose(y.numpy(), ref_adaptive(x, out_sp), rtol=1e-12, atol=1e-14)
    check_grads(lambda x: fn(x, out_sp), x)


def test_adaptive_avg_pool_known_values():
    # bins of 0..4 into 3: [0, 2), [1, 4), [3, 5)
    y = t64(np.arange(5.0).reshape(1, 1, 5)).adaptive_avg_pool1d(3)
    np.testing.assert_allclose(y.numpy()[0, 0], [0.5, 2.0, 3.5])
    y2 = Tensor.from_data(np.arange(16.0).reshape(1, 1, 4, 4)).adaptive_avg_pool2d((1, 1))
    assert y2.dtype == "float32"
    np.testing.assert_allclose(y2.numpy()[0, 0], [[7.5]])


@settings(max_examples=25, deadline=None)
@given(
    L=st.integers(2, 9), k=st.integers(1, 4), s=st.integers(1, 3), p=st.integers(0, 2),
    d=st.integers(1, 2), ceil=st.booleans(), seed=st.integers(0, 1000),
)
def test_pool1d_random_configurations(L, k, s, p, d, ceil, seed):
    if p > k // 2 or L + 2 * p < d * (k - 1) + 1:
        return
    x = np.random.default_rng(seed).standard_normal((1, 2, L))
    v, i = t64(x).max_pool1d_with_indices(k, s, p, d, ceil)
    rv, ri = ref_max_pool(x, (k,), (s,), (p,), (d,), ceil)
    np.testing.assert_array_equal(v.numpy(), rv)
    np.testing.assert_array_equal(i.numpy(), ri)
    if L + 2 * p >= k:
        for include in (True, False):
            a = t64(x).avg_pool1d(k, s, p, include, ceil)
            np.testing.assert_allclose(a.numpy(), ref_avg_pool(x, (k,), (s,), (p,), include, ceil), atol=1e-12)


def test_pool_errors():
    x = Tensor.zeros((1, 2, 5, 5))
    with pytest.raises(TensorError, match=r"max_pool2d: expected an input of rank 4 \[batch, channels, height, width\], got dims \[2, 5, 5\]"):
        Tensor.zeros((2, 5, 5)).max_pool2d(2)
    with pytest.raises(TensorError, match="max_pool2d: padding must be at most half the kernel size"):
        x.max_pool2d(2, padding=2)
    with pytest.raises(TensorError, match=r"avg_pool2d: the kernel .* is larger than the padded input"):
        x.avg_pool2d(7)
    with pytest.raises(TensorError, match="max_pool1d: kernel_size must be >= 1"):
        Tensor.zeros((1, 2, 5)).max_pool1d(0)
    with pytest.raises(TensorError, match="avg_pool1d: expected a float input, got int64"):
        Tensor.zeros((1, 2, 5), dtype="int64").avg_pool1d(2)
    with pytest.raises(TensorError, match="adaptive_avg_pool2d: output_size must be an int or a sequence of 2 ints"):
        x.adaptive_avg_pool2d((2, 2, 2))
    with pytest.raises(TensorError, match="ceil_mode must be a bool"):
        x.max_pool2d(2, ceil_mode="yes")
