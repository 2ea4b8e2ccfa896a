"""Indexing operations (engine/tensor/indices.py and the ops_slice, ops_join, ops_gather,
ops_pad, ops_triangle and ops_dropout files beside it): forward values against NumPy, gradients
against central finite differences, index checks and error messages."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import engine
from engine import Device, DeviceError, Tensor, TensorError, TensorIndexError, cat, stack
from tests.engine.tensor._grads import DEVICES, grads

SETTINGS = settings(max_examples=20, deadline=None)


def shapes(min_dims=1, max_dims=3, min_side=0, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def t64(a, device="cpu"):
    return Tensor.from_data(np.asarray(a, dtype=np.float64), device=device, dtype="float64")


def ti(a, device="cpu"):
    return Tensor.from_data(np.asarray(a, dtype=np.int64), device=device)


# ====================================================================== __getitem__ and slice
@SETTINGS
@given(data=st.data(), shape=shapes(max_dims=3))
def test_getitem_matches_numpy_and_grads(data, shape):
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    x = rand(shape)
    out = t64(x)[key]
    np.testing.assert_array_equal(out.numpy(), x[key])
    assert out.shape == x[key].shape
    grads(lambda a: a[key], x)


def test_getitem_negative_steps_and_grad_of_repeated_use():
    x = rand((4, 5))
    np.testing.assert_array_equal(t64(x)[::-2, 1:-1:2].numpy(), x[::-2, 1:-1:2])
    # the same element read twice accumulates
    g = grads(lambda a: a[1, 2] * a[1, 2] + a[1:2, 2:3].sum(), x)[0]
    assert np.count_nonzero(g) == 1 and g[1, 2] != 0


def test_getitem_errors_and_iteration():
    t = Tensor.from_data(np.arange(6.0).reshape(2, 3))
    with pytest.raises(TensorIndexError, match=r"index: index 2 is out of range for dim 0 of size 2"):
        t[2]
    with pytest.raises(TensorIndexError, match=r"index -4 is out of range for dim 1 of size 3"):
        t[0, -4]
    with pytest.raises(IndexError):  # TensorIndexError is an IndexError as well
        t[5]
    with pytest.raises(TensorIndexError, match="too many indices for a tensor of rank 2"):
        t[0, 0, 0]
    with pytest.raises(TensorIndexError, match="at most one Ellipsis"):
        t[..., ...]
    with pytest.raises(TypeError, match="select\\(\\)/gather\\(\\)"):
        t[[0, 1]]
    with pytest.raises(TensorError, match="step cannot be zero"):
        t[::0]
    rows = list(t)  # legacy iteration stops at the IndexError
    assert [r.tolist() for r in rows] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@st.composite
def shape_and_ranges(draw):
    shape = draw(shapes(max_dims=3))
    ranges = []
    for size in shape[: draw(st.integers(0, len(shape)))]:
        kind = draw(st.sampled_from(["pair", "range", "slice", "int", "none", "neg", "step"]))
        a = draw(st.integers(0, size))
        b = draw(st.integers(a, size))
        if kind == "pair":
            ranges.append((a, b))
        elif kind == "range":
            ranges.append(range(a, b))
        elif kind == "slice":
            ranges.append(slice(a, b))
        elif kind == "int" and size > 0:
            ranges.append(draw(st.integers(-size, size - 1)))
        elif kind == "neg":
            ranges.append((a - size, b - size if b < size else None))
        elif kind == "step":
            ranges.append((a, b, draw(st.integers(1, 3))))
        else:
            ranges.append(None)
    return shape, ranges


def _numpy_ranges(shape, ranges):
    key = []
    for size, r in zip(shape, ranges):
        if r is None:
            key.append(slice(None))
        elif isinstance(r, int):
            i = r % size
            key.append(slice(i, i + 1))
        elif isinstance(r, (range, slice)):
            key.append(slice(r.start, r.stop, r.step))
        else:
            key.append(slice(*r))
    return tuple(key)


@SETTINGS
@given(sr=shape_and_ranges())
def test_slice_matches_numpy_and_grads(sr):
    shape, ranges = sr
    x = rand(shape)
    expect = x[_numpy_ranges(shape, ranges)]
    out = t64(x).slice(ranges)
    assert out.rank == len(shape)  # Burn's slice keeps the rank
    np.testing.assert_array_equal(out.numpy(), expect)
    grads(lambda a: a.slice(ranges), x)


def test_slice_is_strict_where_python_clamps():
    t = Tensor.zeros((3, 4))
    with pytest.raises(TensorIndexError, match=r"slice: range end 5 is out of range for dim 1 of size 4"):
        t.slice([None, (0, 5)])
    with pytest.raises(TensorIndexError, match=r"slice: range start -4 is out of range for dim 0 of size 3"):
        t.slice([(-4, 2)])
    with pytest.raises(TensorError, match=r"slice: expected start <= end for dim 0, found range 2\.\.1"):
        t.slice([(2, 1)])
    with pytest.raises(TensorError, match="expected a positive step for dim 1, found -1"):
        t.slice([None, (0, 4, -1)])
    with pytest.raises(TensorError, match="expected at most 2 ranges"):
        t.slice([None, None, None])
    with pytest.raises(TensorIndexError, match="index 3 is out of range for dim 0 of size 3"):
        t.slice([3])
    with pytest.raises(TypeError, match="a \\(start, end\\) pair"):
        t.slice([(0, 1, 2, 3)])


@SETTINGS
@given(sr=shape_and_ranges(), seed=st.integers(0, 100), broadcast=st.booleans())
def test_slice_assign_matches_numpy_and_grads(sr, seed, broadcast):
    shape, ranges = sr
    x = rand(shape, seed)
    key = _numpy_ranges(shape, ranges)
    region = x[key].shape
    vshape = tuple(1 if broadcast and i % 2 == 0 else s for i, s in enumerate(region))
    v = rand(vshape, seed + 1)
    expect = x.copy()
    expect[key] = v
    xt = t64(x)
    out = xt.slice_assign(ranges, t64(v))
    np.testing.assert_array_equal(out.numpy(), expect)
    np.testing.assert_array_equal(xt.numpy(), x)  # the input is untouched
    grads(lambda a, b: a.slice_assign(ranges, b), x, v)


def test_slice_assign_number_errors_and_slice_fill():
    x = rand((3, 4))
    expect = x.copy()
    expect[1:, :2] = 7.0
    np.testing.assert_array_equal(t64(x).slice_assign([(1, 3), (0, 2)], 7.0).numpy(), expect)
    np.testing.assert_array_equal(t64(x).slice_fill([(1, 3), (0, 2)], 7.0).numpy(), expect)
    g = grads(lambda a: a.slice_fill([(1, 3), (0, 2)], 7.0) * 3.0, x)[0]
    assert np.all(g[1:, :2] == 0) and np.all(g[0] != 0)
    with pytest.raises(TensorError, match=r"slice_assign: expected values with dims \[2, 2\].*found dims \[3, 2\]"):
        t64(x).slice_assign([(1, 3), (0, 2)], t64(np.zeros((3, 2))))
    with pytest.raises(TensorError, match="slice_assign: expected values of dtype float64, found dims \\[2, 2\\] float32"):
        t64(x).slice_assign([(1, 3), (0, 2)], Tensor.zeros((2, 2)))
    with pytest.raises(DeviceError, match="slice_assign.*cpu.*cpu:1"):
        t64(x).slice_assign([(1, 3), (0, 2)], t64(np.zeros((2, 2)), device="cpu:1"))


@SETTINGS
@given(shape=shapes(), data=st.data())
def test_narrow_matches_numpy_and_grads(shape, data):
    d = data.draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[d]
    start = data.draw(st.integers(0, size))
    length = data.draw(st.integers(0, size - start))
    x = rand(shape)
    key = (slice(None),) * (d % len(shape)) + (slice(start, start + length),)
    np.testing.assert_array_equal(t64(x).narrow(d, start, length).numpy(), x[key])
    grads(lambda a: a.narrow(d, start, length), x)


def test_narrow_errors():
    t = Tensor.zeros((2, 5))
    assert t.narrow(1, -2, 2).shape == (2, 2)
    with pytest.raises(TensorIndexError, match=r"narrow: expected 0 <= length <= 2 \(start 3, dim 1 of size 5\), found length 3"):
        t.narrow(1, 3, 3)
    with pytest.raises(TensorIndexError, match="narrow: start 6 is out of range for dim 1 of size 5"):
        t.narrow(1, 6, 0)
    with pytest.raises(TensorError, match="narrow: dim 2 is out of range for a tensor of rank 2"):
        t.narrow(2, 0, 1)


# ====================================================================== chunk / split
@SETTINGS
@given(shape=shapes(max_side=7), data=st.data())
def test_chunk_and_split_sizes_and_grads(shape, data):
    d = data.draw(st.integers(0, len(shape) - 1))
    n = data.draw(st.integers(1, 5))
    size = shape[d]
    x = rand(shape)
    pieces = t64(x).chunk(n, d)
    step = -(-size // n) if size else 0
    expect = [min(step, size - s) for s in range(0, size, step)] if size else [0]
    assert [p.shape[d] for p in pieces] == expect
    assert len(pieces) <= n
    np.testing.assert_array_equal(cat(pieces, d).numpy(), x)
    split = t64(x).split(n, d)
    want = [min(n, size - s) for s in range(0, size, n)] if size else [0]
    assert [p.shape[d] for p in split] == want
    np.testing.assert_array_equal(cat(split, d).numpy(), x)

    def weighted(a):  # each piece scaled differently, so a wrong routing shows
        return cat([p * float(i + 1) for i, p in enumerate(a.chunk(n, d))], d)

    grads(weighted, x)


def test_split_with_sizes_and_errors():
    x = rand((2, 6))
    parts = t64(x).split([1, 0, 5], 1)
    assert [p.shape for p in parts] == [(2, 1), (2, 0), (2, 5)]
    np.testing.assert_array_equal(parts[2].numpy(), x[:, 1:])
    assert [p.shape for p in t64(x).split_with_sizes([4, 2], 1)] == [(2, 4), (2, 2)]
    grads(lambda a: cat([p * float(i + 2) for i, p in enumerate(a.split([2, 3, 1], 1))], 1), x)
    with pytest.raises(TensorError, match=r"split: expected non-negative sizes summing to 6 .* found \[2, 2\]"):
        t64(x).split([2, 2], 1)
    with pytest.raises(TensorError, match="split: expected a split size >= 1, found 0"):
        t64(x).split(0, 1)
    with pytest.raises(TensorError, match="chunk: expected chunks >= 1, found 0"):
        t64(x).chunk(0, 1)


# ====================================================================== cat / stack
@st.composite
def cat_case(draw):
    base = list(draw(shapes(max_dims=3)))
    d = draw(st.integers(0, len(base) - 1))
    k = draw(st.integers(1, 3))
    sizes = [draw(st.integers(0, 3)) for _ in range(k)]
    return [tuple(base[:d] + [s] + base[d + 1 :]) for s in sizes], d


@SETTINGS
@given(case=cat_case(), neg=st.booleans())
def test_cat_matches_numpy_and_grads(case, neg):
    shps, d = case
    xs = [rand(s, i) for i, s in enumerate(shps)]
    dim = d - len(shps[0]) if neg else d
    out = cat([t64(a) for a in xs], dim)
    np.testing.assert_array_equal(out.numpy(), np.concatenate(xs, axis=d))
    assert Tensor.cat([t64(a) for a in xs], dim).shape == out.shape
    assert engine.tensor.cat is cat
    grads(lambda *ts: cat(list(ts), dim), *xs)


@SETTINGS
@given(shape=shapes(min_dims=0, max_dims=3), k=st.integers(1, 3), data=st.data())
def test_stack_matches_numpy_and_grads(shape, k, data):
    d = data.draw(st.integers(-(len(shape) + 1), len(shape)))
    xs = [rand(shape, i) for i in range(k)]
    out = stack([t64(a) for a in xs], d)
    np.testing.assert_array_equal(out.numpy(), np.stack(xs, axis=d))
    grads(lambda *ts: Tensor.stack(list(ts), d), *xs)


def test_cat_stack_errors():
    a = Tensor.zeros((2, 3))
    with pytest.raises(TensorError, match=r"cat: expected dims matching \[2, 3\] except along dim 0, found dims \[2, 4\] float32 on cpu at position 1"):
        cat([a, Tensor.zeros((2, 4))], 0)
    with pytest.raises(TensorError, match="cat: expected every tensor of dtype float32 \\(as the first\\), found dims \\[2, 3\\] float64"):
        cat([a, Tensor.zeros((2, 3), dtype="float64")], 0)
    with pytest.raises(TensorError, match="cat: expected every tensor of rank 2"):
        cat([a, Tensor.zeros((6,))], 0)
    with pytest.raises(TensorError, match="cat: expected at least one tensor"):
        cat([], 0)
    with pytest.raises(TypeError, match="cat: expected a list of tensors, found a single Tensor"):
        cat(a, 0)
    with pytest.raises(DeviceError, match=r"cat: tensors are on different devices: cpu .* and cpu:1"):
        cat([a, Tensor.zeros((2, 3), device="cpu:1")], 0)
    with pytest.raises(TensorError, match=r"stack: expected every tensor with dims \[2, 3\]"):
        stack([a, Tensor.zeros((3, 2))], 0)
    with pytest.raises(TensorError, match="stack: dim 4 is out of range for a result of rank 3"):
        stack([a, a], 4)


def test_joining_keeps_device_and_autodiff_state():
    a = Tensor.ones((2,), device="cpu:1")
    b = Tensor.ones((2,), device="cpu:1").require_grad()
    out = cat([a, b])
    assert out.device is Device("cpu:1") and out.is_autodiff() and out.is_tracked()
    plain = stack([a, a])
    assert not plain.is_autodiff() and not plain.is_tracked()
    g = out.sum().backward()
    assert a.grad(g) is None
    np.testing.assert_array_equal(b.grad(g).numpy(), [1.0, 1.0])


# ====================================================================== gather / scatter_add
@st.composite
def along_case(draw, smaller=True):
    shape = draw(shapes(max_dims=3, min_side=1))
    d = draw(st.integers(0, len(shape) - 1))
    ishape = []
    for a, s in enumerate(shape):
        if a == d:
            ishape.append(draw(st.integers(0, 4)))
        else:
            ishape.append(draw(st.integers(0, s)) if smaller else s)
    seed = draw(st.integers(0, 1000))
    idx = np.random.default_rng(seed).integers(0, shape[d], size=ishape)
    return shape, d, idx


def _gather_ref(x, d, idx):
    out = np.empty(idx.shape)
    for p in np.ndindex(*idx.shape):
        q = list(p)
        q[d] = idx[p]
        out[p] = x[tuple(q)]
    return out


def _scatter_ref(x, d, idx, v):
    out = x.copy()
    for p in np.ndindex(*idx.shape):
        q = list(p)
        q[d] = idx[p]
        out[tuple(q)] += v[p]
    return out


@SETTINGS
@given(case=along_case())
def test_gather_matches_loop_and_grads(case):
    shape, d, idx = case
    x = rand(shape)
    out = t64(x).gather(d, ti(idx))
    np.testing.assert_array_equal(out.numpy(), _gather_ref(x, d, idx))
    grads(lambda a: a.gather(d, ti(idx)), x)


@SETTINGS
@given(case=along_case(), seed=st.integers(0, 100))
def test_scatter_add_matches_loop_and_grads(case, seed):
    shape, d, idx = case
    x = rand(shape, seed)
    v = rand(idx.shape, seed + 1)
    out = t64(x).scatter_add(d, ti(idx), t64(v))
    np.testing.assert_allclose(out.numpy(), _scatter_ref(x, d, idx, v), rtol=1e-12, atol=1e-12)
    grads(lambda a, b: a.scatter_add(d, ti(idx), b), x, v)
    # Burn's name for it
    np.testing.assert_array_equal(t64(x).scatter(d, ti(idx), t64(v)).numpy(), out.numpy())


def test_scatter_add_accumulates_repeats_in_large_inputs():
    rng = np.random.default_rng(3)
    x = np.zeros((50, 8))
    idx = rng.integers(0, 50, size=(400, 8))
    v = rng.standard_normal((400, 8))
    expect = x.copy()
    for p in np.ndindex(*idx.shape):
        expect[idx[p], p[1]] += v[p]
    out = t64(x).scatter_add(0, ti(idx), t64(v)).numpy()
    np.testing.assert_allclose(out, expect, rtol=1e-12, atol=1e-12)


def test_gather_scatter_index_errors():
    x = Tensor.zeros((2, 3))
    with pytest.raises(TensorIndexError, match=r"gather: index 3 is out of range for dim 1 of size 3 \(expected 0 <= index < 3"):
        x.gather(1, ti([[0, 3]]))
    with pytest.raises(TensorIndexError, match="gather: index -1 is out of range for dim 0 of size 2"):
        x.gather(0, ti([[-1, 0, 0]]))
    with pytest.raises(TensorError, match=r"gather: expected indices of rank 2 .* found indices dims \[3\]"):
        x.gather(1, ti([0, 1, 2]))
    with pytest.raises(TensorError, match="gather: expected an int tensor for indices, found dims \\[1, 1\\] float32"):
        x.gather(1, Tensor.zeros((1, 1)))
    with pytest.raises(TensorError, match="axis 0 has 3 > 2"):
        x.gather(1, ti(np.zeros((3, 1), dtype=np.int64)))
    with pytest.raises(DeviceError, match="gather.*cpu.*cpu:1"):
        x.gather(1, ti([[0]], device="cpu:1"))
    with pytest.raises(TensorIndexError, match="scatter_add: index 5 is out of range for dim 1 of size 3"):
        x.scatter_add(1, ti([[5]]), Tensor.ones((1, 1)))
    with pytest.raises(TensorError, match=r"scatter_add: expected values with the indices' dims \[1, 1\], found dims \[1, 2\]"):
        x.scatter_add(1, ti([[0]]), Tensor.ones((1, 2)))
    with pytest.raises(TensorError, match="scatter_add: expected values of dtype float32, found .*float64"):
        x.scatter_add(1, ti([[0]]), Tensor.ones((1, 1), dtype="float64"))


# ====================================================================== select / select_assign
@SETTINGS
@given(shape=shapes(max_dims=3, min_side=1), data=st.data())
def test_select_matches_numpy_and_grads(shape, data):
    d = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.integers(0, 5))
    idx = np.asarray(data.draw(st.lists(st.integers(0, shape[d] - 1), min_size=n, max_size=n)), dtype=np.int64)
    x = rand(shape)
    np.testing.assert_array_equal(t64(x).select(d, ti(idx)).numpy(), np.take(x, idx, axis=d))
    np.testing.assert_array_equal(t64(x).index_select(d, idx.tolist()).numpy(), np.take(x, idx, axis=d))
    grads(lambda a: a.select(d, ti(idx)), x)


@SETTINGS
@given(shape=shapes(max_dims=3, min_side=1), data=st.data())
def test_select_assign_adds_and_grads(shape, data):
    d = data.draw(st.integers(0, len(shape) - 1))
    n = data.draw(st.integers(0, 5))
    idx = np.asarray(data.draw(st.lists(st.integers(0, shape[d] - 1), min_size=n, max_size=n)), dtype=np.int64)
    x = rand(shape)
    vshape = shape[:d] + (n,) + shape[d + 1 :]
    v = rand(vshape, 1)
    expect = np.moveaxis(x.copy(), d, 0)
    np.add.at(expect, idx, np.moveaxis(v, d, 0))
    expect = np.moveaxis(expect, 0, d)
    xt = t64(x)
    np.testing.assert_allclose(xt.select_assign(d, ti(idx), t64(v)).numpy(), expect, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(xt.numpy(), x)  # input untouched
    grads(lambda a, b: a.select_assign(d, ti(idx), b), x, v)


def test_select_errors():
    x = Tensor.zeros((4, 2))
    with pytest.raises(TensorIndexError, match=r"select: index 4 is out of range for dim 0 of size 4 \(expected 0 <= index < 4; indices dims \[2\]\)"):
        x.select(0, ti([1, 4]))
    with pytest.raises(TensorIndexError, match="select: index -1 is out of range for dim 1 of size 2"):
        x.select(1, [-1])
    with pytest.raises(TensorError, match=r"select: expected 1-D indices, found indices dims \[1, 1\]"):
        x.select(0, ti([[1]]))
    with pytest.raises(TensorError, match=r"select_assign: expected values with dims \[2, 2\], found dims \[1, 2\]"):
        x.select_assign(0, ti([0, 1]), Tensor.ones((1, 2)))
    with pytest.raises(TensorIndexError, match="select_assign: index 9 is out of range for dim 0 of size 4"):
        x.select_assign(0, ti([9]), Tensor.ones((1, 2)))


# ====================================================================== one_hot
@SETTINGS
@given(shape=shapes(min_dims=0, max_dims=2), k=st.integers(1, 5), seed=st.integers(0, 100))
def test_one_hot_matches_eye(shape, k, seed):
    idx = np.random.default_rng(seed).integers(0, k, size=shape)
    out = ti(idx).one_hot(k)
    assert out.dtype == "int64" and out.shape == shape + (k,)
    np.testing.assert_array_equal(out.numpy(), np.eye(k, dtype=np.int64)[idx])
    f = ti(idx).one_hot(k, dtype="float32")
    assert f.dtype == "float32" and f.kind == "float"


def test_one_hot_errors():
    with pytest.raises(TensorIndexError, match=r"one_hot: class index 3 is out of range for num_classes 3"):
        ti([0, 3]).one_hot(3)
    with pytest.raises(TensorIndexError, match="class index -1"):
        ti([-1]).one_hot(3)
    with pytest.raises(TensorError, match="one_hot: expected an int tensor of class indices, found dims \\[2\\] float32"):
        Tensor.zeros((2,)).one_hot(3)


# ====================================================================== repeat / pad / flip
@SETTINGS
@given(shape=shapes(max_dims=3, max_side=3), data=st.data())
def test_repeat_matches_tile_and_grads(shape, data):
    reps = data.draw(st.lists(st.integers(0, 3), min_size=0, max_size=len(shape)))
    x = rand(shape)
    full = list(reps) + [1] * (len(shape) - len(reps))
    np.testing.assert_array_equal(t64(x).repeat(reps).numpy(), np.tile(x, full))
    grads(lambda a: a.repeat(reps), x)
    d = data.draw(st.integers(0, len(shape) - 1))
    times = data.draw(st.integers(0, 3))
    tile = [1] * len(shape)
    tile[d] = times
    np.testing.assert_array_equal(t64(x).repeat_dim(d, times).numpy(), np.tile(x, tile))
    grads(lambda a: a.repeat_dim(d, times), x)


def test_repeat_errors():
    with pytest.raises(TensorError, match=r"repeat: expected at most 2 repeat counts .* found \[1, 2, 3\]"):
        Tensor.zeros((2, 2)).repeat([1, 2, 3])
    with pytest.raises(TensorError, match="repeat: expected non-negative repeat counts"):
        Tensor.zeros((2, 2)).repeat([-1])


@st.composite
def pad_case(draw, mode):
    shape = draw(shapes(max_dims=3, min_side=1 if mode != "constant" else 0))
    k = draw(st.integers(1, len(shape)))
    pads = []
    for i in range(k):
        size = shape[len(shape) - 1 - i]
        hi = 3 if mode == "constant" else (size - 1 if mode == "reflect" else 3)
        pads += [draw(st.integers(0, hi)), draw(st.integers(0, hi))]
    return shape, pads


def _np_pad_width(shape, pads):
    width = [(0, 0)] * len(shape)
    for i in range(len(pads) // 2):
        width[len(shape) - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    return width


@pytest.mark.parametrize("mode,np_mode", [("constant", "constant"), ("reflect", "reflect"), ("replicate", "edge")])
def test_pad_matches_numpy_and_grads(mode, np_mode):
    @SETTINGS
    @given(case=pad_case(mode))
    def run(case):
        shape, pads = case
        x = rand(shape)
        kw = {"constant_values": 1.5} if mode == "constant" else {}
        expect = np.pad(x, _np_pad_width(shape, pads), mode=np_mode, **kw)
        out = t64(x).pad(pads, mode, value=1.5)
        np.testing.assert_array_equal(out.numpy(), expect)
        grads(lambda a: a.pad(pads, mode, value=1.5), x)

    run()


def test_pad_burn_style_value_and_errors():
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(t64(x).pad((1, 1, 0, 1), 9.0).numpy(), np.pad(x, [(0, 1), (1, 1)], constant_values=9.0))
    np.testing.assert_array_equal(t64(x).pad((2, 2), "edge").numpy(), np.pad(x, [(0, 0), (2, 2)], mode="edge"))
    with pytest.raises(TensorError, match=r"pad: reflect padding \(3, 0\) of dim 1 needs pads smaller than its size 3"):
        t64(x).pad((3, 0), "reflect")
    with pytest.raises(TensorError, match="pad: expected an even number of pads, at most 4"):
        t64(x).pad((1, 1, 1))
    with pytest.raises(TensorError, match="pad: expected non-negative pads"):
        t64(x).pad((-1, 1))
    with pytest.raises(TensorError, match="pad: expected mode 'constant', 'reflect' or 'replicate', found 'wrap'"):
        t64(x).pad((1, 1), "wrap")


@SETTINGS
@given(shape=shapes(min_dims=1, max_dims=3), data=st.data())
def test_flip_matches_numpy_and_grads(shape, data):
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a: a % len(shape), max_size=len(shape)))
    x = rand(shape)
    np.testing.assert_array_equal(t64(x).flip(dims).numpy(), np.flip(x, axis=tuple(dims)) if dims else x)
    grads(lambda a: a.flip(dims), x)


def test_flip_errors():
    with pytest.raises(TensorError, match=r"flip: expected distinct dims, found \[0, -2\]"):
        Tensor.zeros((2, 2)).flip([0, -2])


# ====================================================================== triangles
@SETTINGS
@given(shape=shapes(min_dims=2, max_dims=3), diagonal=st.integers(-3, 3))
def test_tril_triu_match_numpy_and_grads(shape, diagonal):
    x = rand(shape)
    np.testing.assert_array_equal(t64(x).tril(diagonal).numpy(), np.tril(x, diagonal))
    np.testing.assert_array_equal(t64(x).triu(diagonal).numpy(), np.triu(x, diagonal))
    grads(lambda a: a.tril(diagonal), x)
    grads(lambda a: a.triu(diagonal), x)


def test_triangle_masks_follow_burn():
    # Burn's documented example: tril_mask([3, 3], 0) is true strictly above the diagonal
    np.testing.assert_array_equal(
        Tensor.tril_mask((3, 3), 0).numpy(),
        [[False, True, True], [False, False, True], [False, False, False]],
    )
    for offset in (-1, 0, 2):
        x = rand((2, 3, 4))
        m = engine.tensor.tril_mask((2, 3, 4), offset)
        np.testing.assert_array_equal(t64(x).mask_fill(m, 0.0).numpy(), np.tril(x, offset))
        m = engine.tensor.triu_mask((3, 4), offset, device="cpu:1")
        assert m.device is Device("cpu:1") and m.dtype == "bool"
        np.testing.assert_array_equal(~m.numpy(), np.triu(np.ones((3, 4)), offset) == 1)
        d = Tensor.diag_mask((3, 4), offset).numpy()
        np.testing.assert_array_equal(~d, np.eye(3, 4, offset, dtype=bool))
    with pytest.raises(TensorError, match="tril: expected a tensor of rank >= 2, found dims \\[3\\]"):
        Tensor.zeros((3,)).tril()


# ====================================================================== dropout
def test_dropout_statistics_scale_and_seeding():
    dev = Device("cpu:2")
    dev.seed(11)
    x = Tensor.ones((200, 100), device=dev)
    y = x.dropout(0.3).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    assert y.dtype == np.float32
    dev.seed(11)
    np.testing.assert_array_equal(x.dropout(0.3).numpy(), y)  # the mask comes from the device's generator
    assert x.dropout(0.0) is x
    assert np.all(x.dropout(1.0).numpy() == 0)
    with pytest.raises(TensorError, match="dropout: expected a probability 0 <= prob <= 1, found 1.5"):
        x.dropout(1.5)
    with pytest.raises(TensorError, match="dropout: expected a float tensor, found dims \\[2\\] int64"):
        ti([1, 2]).dropout(0.5)


@pytest.mark.parametrize("prob", [0.25, 0.75])
def test_dropout_gradient_goes_through_the_mask(prob):
    dev = Device("cpu:3")
    x = rand((5, 6))

    def fn(a):
        dev.seed(5)  # the same mask at every evaluation, so finite differences see one function
        return a.to_device(dev).dropout(prob).to_device("cpu")

    g = grads(fn, x)[0]
    dev.seed(5)
    y = t64(x, device=dev).dropout(prob).numpy()
    assert np.all((g == 0) == (y == 0))


# ====================================================================== other devices (CUDA where present)
@pytest.mark.parametrize("device", DEVICES)
def test_index_grads_on_device(device):
    x = rand((3, 4))
    idx = np.array([[0, 2, 2, 1], [1, 1, 0, 0]])
    grads(lambda a: a[1:, ::2] * 2.0, x, device=device)
    grads(lambda a: a.gather(0, ti(idx, device)), x, device=device)
    grads(lambda a, b: a.scatter_add(0, ti(idx, device), b), x, rand((2, 4), 1), device=device)
    grads(lambda a: a.select(1, ti([3, 0, 3], device)), x, device=device)
    grads(lambda a, b: cat([a, b], 0), x, rand((2, 4)), device=device)
    grads(lambda a: a.pad((1, 2, 2, 1), "reflect"), x, device=device)
    grads(lambda a: a.repeat([2, 1]).flip([0]).triu(1), x, device=device)
