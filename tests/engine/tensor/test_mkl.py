"""MKL's products behind `threads.matmul` (engine/tensor/cpu/mkl.py).

The planning of a call (which layout, leading dimensions and batch strides MKL is told) runs
everywhere: a reference executor rebuilds, from the plan alone, the matrices MKL would read and
checks them against the operands, then computes the product with NumPy into the output the plan
names. The calls themselves need the `mkl` wheel (the `mkl` extra) and skip without it.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from numpy.lib.array_utils import byte_bounds
from numpy.lib.stride_tricks import as_strided

import engine  # noqa: F401  (configures OpenBLAS before NumPy's products run)
from engine import Tensor
from engine.tensor.cpu import mkl, threads

NO_TRANS, TRANS = 111, 112
HAVE_MKL = mkl.library_path() is not None
needs_mkl = pytest.mark.skipif(not HAVE_MKL, reason="the mkl wheel is not installed (pip install ember-studio[mkl])")


def _view(x, ptr, trans, rows, cols, ld, count=1, stride=0):
    """The [count, rows, cols] matrices a row-major BLAS reads from `ptr` (which must be x's
    first element) with this layout; every element must lie within x's own memory."""
    assert ptr == x.ctypes.data, "the plan must point at the operand's first element"
    item = x.itemsize
    if trans == NO_TRANS:
        v = as_strided(x, (count, rows, cols), (stride * item, ld * item, item), writeable=False)
    else:
        assert trans == TRANS
        v = as_strided(x, (count, cols, rows), (stride * item, ld * item, item), writeable=False).transpose(0, 2, 1)
    lo, hi = byte_bounds(x)
    vlo, vhi = byte_bounds(v)
    assert lo <= vlo and vhi <= hi, "the plan reads memory outside the operand"
    return v


def execute(plan, a, b):
    """Run a plan with NumPy: check the matrices it reads are a's and b's, write the product."""
    routine, out, args = plan
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    count = int(np.prod(batch)) if batch else 1
    m, n = a.shape[-2], b.shape[-1]
    want_a = np.broadcast_to(a, batch + a.shape[-2:]).reshape(count, *a.shape[-2:])
    want_b = np.broadcast_to(b, batch + b.shape[-2:]).reshape(count, *b.shape[-2:])
    if routine == "gemm":
        ta, tb, rows, n_, k, alpha, pa, lda, pb, ldb, beta, pc, ldc = args
        assert (alpha, beta, n_, ldc) == (1.0, 0.0, n, n)
        va = _view(a, pa, ta, rows, k, lda)[0]
        vb = _view(b, pb, tb, k, n, ldb)[0]
        if rows == m * count and count > 1:  # a stack folded into one tall matrix, b shared
            np.testing.assert_array_equal(va.reshape(count, m, k), want_a)
            np.testing.assert_array_equal(vb, want_b[0])
            assert all(np.array_equal(want_b[0], x) for x in want_b)
        else:
            assert count == 1 and rows == m
            np.testing.assert_array_equal(va, want_a[0])
            np.testing.assert_array_equal(vb, want_b[0])
        assert pc == out.ctypes.data and out.flags.c_contiguous
        out.reshape(rows, n)[...] = va @ vb
    else:
        assert routine == "batch"
        ta, tb, m_, n_, k, alpha, pa, lda, sa, pb, ldb, sb, beta, pc, ldc, sc, count_ = args
        assert (m_, n_, count_, ldc, sc, alpha, beta) == (m, n, count, n, m * n, 1.0, 0.0)
        va = _view(a, pa, ta, m, k, lda, count, sa)
        vb = _view(b, pb, tb, k, n, ldb, count, sb)
        np.testing.assert_array_equal(va, want_a)
        np.testing.assert_array_equal(vb, want_b)
        assert pc == out.ctypes.data and out.flags.c_contiguous
        out.reshape(count, m, n)[...] = va @ vb
    return out


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(mkl, "MKL_MIN_WORK", 0)
    monkeypatch.setattr(mkl, "MKL_MIN_ITEM_WORK", 0)


def _operands():
    """(name, a, b) covering the layouts the engine's products come in."""
    rng = np.random.default_rng(7)

    def r(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)

    big = r(12, 20)
    cases = [
        ("c @ c", r(5, 7), r(7, 3)),
        ("a^T @ c (weight gradient)", r(7, 5).T, r(7, 3)),
        ("c @ b^T (input gradient)", r(5, 7), r(3, 7).T),
        ("a^T @ b^T", r(7, 5).T, r(3, 7).T),
        ("row block of a wider matrix (ld > cols)", big[:5, 2:9], r(7, 3)),
        ("column block, transposed, ld > rows", big[2:9, 1:6].T, big[:7, 10:13]),
        ("one row", r(1, 7), r(7, 3)),
        ("one column out", r(5, 7), r(7, 1)),
        ("strided single row", big[3:4, ::2][:, :7], r(7, 3)),
        ("float64", r(5, 7, dtype=np.float64), r(7, 3, dtype=np.float64)),
        ("stack @ stack", r(4, 5, 7), r(4, 7, 3)),
        ("stack @ matrix (one tall product)", r(4, 5, 7), r(7, 3)),
        ("stack of transposes @ matrix", r(4, 7, 5).transpose(0, 2, 1), r(7, 3)),
        ("matrix @ stack (a broadcast)", r(5, 7), r(4, 7, 3)),
        ("a broadcast_to stack (stride 0) @ matrix", np.broadcast_to(r(5, 7), (4, 5, 7)), r(7, 3)),
        ("size-1 batch axes", r(1, 4, 1, 5, 7), r(1, 4, 1, 7, 3)),
        ("stack of transposed views (attention's q @ k^T)", r(2, 3, 5, 7), r(2, 3, 3, 7).transpose(0, 1, 3, 2)),
        ("every other matrix of a stack", r(8, 5, 7)[::2], r(4, 7, 3)),
    ]
    return cases


def _uncollapsible():
    """(name, a, b) whose batch axes do not collapse to one stride per operand: NumPy's."""
    rng = np.random.default_rng(8)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    return [
        ("broadcast batch axes", r(2, 1, 5, 7), r(1, 3, 7, 3)),
        ("one stack broadcast over the outer batch axis", r(1, 4, 5, 7), r(3, 4, 7, 3)),
        ("heads of a [b, s, h, d] array", r(2, 5, 3, 7).transpose(0, 2, 1, 3), r(2, 3, 7, 4)),
    ]


@pytest.mark.parametrize("name,a,b", _operands(), ids=[c[0] for c in _operands()])
def test_a_plan_reads_exactly_the_operands_and_gives_numpys_product(name, a, b, any_size):
    plan = mkl.plan(a, b)
    assert plan is not None, name
    out = execute(plan, a, b)
    np.testing.assert_allclose(out, np.matmul(a.astype(np.float64), b.astype(np.float64)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,a,b", _uncollapsible(), ids=[c[0] for c in _uncollapsible()])
def test_batch_axes_that_do_not_collapse_stay_numpys(name, a, b, any_size):
    assert mkl.plan(a, b) is None, name


def test_a_stack_on_one_matrix_is_one_tall_product_and_other_stacks_one_batched_call(any_size):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 5, 7), dtype=np.float32), rng.standard_normal((7, 3), dtype=np.float32)
    routine, _, args = mkl.plan(a, b)
    assert routine == "gemm" and args[2] == 20
    routine, _, args = mkl.plan(a, np.stack([b] * 4))
    assert routine == "batch" and args[-1] == 4


def test_a_given_output_is_written_in_place(any_size):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 4, 6), dtype=np.float32), rng.standard_normal((3, 6, 5), dtype=np.float32)
    out = np.empty((3, 4, 5), np.float32)
    routine, got, _ = mkl.plan(a, b, out)
    assert got is out
    execute((routine, got, _), a, b)
    np.testing.assert_allclose(out, a @ b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("why,make", [
    ("integer operands", lambda r: (np.ones((4, 4), np.int64), np.ones((4, 4), np.int64), None)),
    ("mixed dtypes", lambda r: (r((4, 4)), r((4, 4)).astype(np.float64), None)),
    ("negative strides", lambda r: (r((4, 4))[::-1], r((4, 4)), None)),
    ("no unit stride in the matrix", lambda r: (r((4, 8))[:, ::2], r((4, 4)), None)),
    ("a broadcast (stride 0) inside the matrix", lambda r: (np.broadcast_to(r((1, 4)), (4, 4)), r((4, 4)), None)),
    ("inner dimensions differ", lambda r: (r((4, 5)), r((4, 4)), None)),
    ("an empty product", lambda r: (r((0, 4)), r((4, 4)), None)),
    ("k = 0", lambda r: (r((4, 0)), r((0, 4)), None)),
    ("a one-dimensional operand", lambda r: (r((4,)), r((4, 4)), None)),
    ("batch axes that cannot broadcast", lambda r: (r((2, 4, 4)), r((3, 4, 4)), None)),
    ("an output that is not C-contiguous", lambda r: (r((4, 4)), r((4, 4)), np.empty((4, 4), np.float32).T)),
    ("an output of another dtype", lambda r: (r((4, 4)), r((4, 4)), np.empty((4, 4), np.float64))),
    ("an output of another shape", lambda r: (r((4, 4)), r((4, 4)), np.empty((4, 5), np.float32))),
])
def test_products_mkl_cannot_take_as_they_are_stay_numpys(why, make, any_size):
    rng = np.random.default_rng(2)
    a, b, out = make(lambda shape: rng.standard_normal(shape).astype(np.float32))
    assert mkl.plan(a, b, out) is None, why


def test_an_output_that_overlaps_an_operand_stays_numpys(any_size):
    a = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    b = np.eye(4, dtype=np.float32)
    assert mkl.plan(a, b, a) is None  # np.matmul copies what it must; MKL would read what it wrote


def test_small_products_stay_openblas():
    rng = np.random.default_rng(4)
    # [2048, 32] @ [32, 16]: 2^20 multiply-adds, under MKL_MIN_WORK
    assert mkl.plan(rng.standard_normal((2048, 32), dtype=np.float32), rng.standard_normal((32, 16), dtype=np.float32)) is None
    assert mkl.plan(rng.standard_normal((2048, 32), dtype=np.float32), rng.standard_normal((32, 32), dtype=np.float32)) is not None
    # a stack of 64 items of 2^19 each: 2^25 in all, but each under MKL_MIN_ITEM_WORK
    assert mkl.plan(rng.standard_normal((64, 128, 32), dtype=np.float32), rng.standard_normal((64, 32, 128), dtype=np.float32)) is None


def test_ember_blas_chooses_and_says_why(monkeypatch):
    try:
        monkeypatch.setenv("EMBER_BLAS", "openblas")
        mkl._reset_for_tests()
        assert not mkl.active() and "EMBER_BLAS=openblas" in mkl.describe()
        monkeypatch.setenv("EMBER_BLAS", "mkl")
        monkeypatch.setattr(mkl, "library_path", lambda: None)
        mkl._reset_for_tests()
        with pytest.warns(RuntimeWarning, match=r"EMBER_BLAS=mkl: the mkl wheel is not installed"):
            assert not mkl.active()
        monkeypatch.setenv("EMBER_BLAS", "fastest")
        mkl._reset_for_tests()
        with pytest.warns(RuntimeWarning, match=r"EMBER_BLAS='fastest': expected 'auto', 'mkl' or 'openblas'"):
            mkl.active()
        a = np.ones((64, 64), np.float32)
        np.testing.assert_array_equal(threads.matmul(a, a), np.full((64, 64), 64, np.float32))
    finally:
        monkeypatch.undo()
        mkl._reset_for_tests()


# ---------------------------------------------------------------------- with the mkl wheel
@pytest.fixture
def with_mkl(monkeypatch):
    monkeypatch.setenv("EMBER_BLAS", "mkl")
    mkl._reset_for_tests()
    assert mkl.active(), mkl.describe()
    yield
    monkeypatch.undo()
    mkl._reset_for_tests()


@needs_mkl
@pytest.mark.parametrize("name,a,b", _operands() + _uncollapsible(), ids=[c[0] for c in _operands() + _uncollapsible()])
def test_mkl_gives_the_product_of_every_layout(name, a, b, with_mkl, any_size):
    got = mkl.matmul(a, b)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tol = 1e-12 if a.dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    assert got.dtype == a.dtype and got.shape == ref.shape


@needs_mkl
def test_mkl_runs_sequential_and_the_same_bits_at_any_alignment_and_from_several_threads(with_mkl):
    with open("/proc/self/maps") as f:
        assert "libiomp5" not in f.read()  # the sequential layer: no OpenMP runtime loaded
    rng = np.random.default_rng(5)
    a0, b = rng.standard_normal((300, 200), dtype=np.float32), rng.standard_normal((200, 70), dtype=np.float32)
    ref = mkl.matmul(a0, b)
    for offset in range(16):
        buf = np.empty(a0.size + 16, np.float32)
        a = buf[offset:offset + a0.size].reshape(a0.shape)
        a[...] = a0
        np.testing.assert_array_equal(mkl.matmul(a, b), ref)
    results = [None] * 4

    def work(i):
        results[i] = [mkl.matmul(a0, b) for _ in range(20)]

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for rs in results:
        for r in rs:
            np.testing.assert_array_equal(r, ref)


@needs_mkl
def test_the_engines_products_and_their_gradients_through_mkl(with_mkl):
    """A linear layer's forward and both gradients, and the Winograd convolution (its 16 stacked
    products), against float64 references, with MKL taking the products."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((512, 96), dtype=np.float32)
    w = rng.standard_normal((96, 80), dtype=np.float32)
    g = rng.standard_normal((512, 80), dtype=np.float32)
    assert mkl.plan(x, w) is not None and mkl.plan(x.T, g) is not None and mkl.plan(g, w.T) is not None
    xt, wt = Tensor.from_data(x).require_grad(), Tensor.from_data(w).require_grad()
    y = xt @ wt
    grads = (y * Tensor.from_data(g)).sum().backward()
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), g.astype(np.float64)
    np.testing.assert_allclose(y.numpy(), x64 @ w64, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(xt.grad(grads).numpy(), g64 @ w64.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(wt.grad(grads).numpy(), x64.T @ g64, rtol=1e-5, atol=1e-3)

    from engine.tensor import ops_conv  # noqa: PLC0415
    xi = rng.standard_normal((64, 64, 13, 13), dtype=np.float32)  # Winograd, runs of images
    wi = (rng.standard_normal((64, 64, 3, 3)) * 0.1).astype(np.float32)
    calls = []
    real = mkl.plan

    def spy(*args, **kw):
        p = real(*args, **kw)
        calls.append(p is not None)
        return p

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mkl, "plan", spy)
        out = ops_conv.conv2d(Tensor.from_data(xi), Tensor.from_data(wi)).numpy()
    assert any(calls), "the convolution's stacked products did not reach MKL"  # [16, 360, 64] @ [16, 64, 64]
    from numpy.lib.stride_tricks import sliding_window_view  # noqa: PLC0415
    win = sliding_window_view(xi.astype(np.float64), (3, 3), axis=(2, 3))
    ref = np.tensordot(win, wi.astype(np.float64), axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
