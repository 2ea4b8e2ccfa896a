"""The compiled kernels (engine.tensor.cpu.jit, numba) against float64 references written here and
against the NumPy paths they replace: the exp they share, Gelu, layer norm's forward and
backward, the softmax cross entropy, attention's softmax, batch norm, relu's backward, the
convolution's col2im, the Winograd 3x3 convolution and Adam's update; the same bits at 1, 2 and 3 kernel
threads; and the NumPy paths when the kernels are switched off or numba is missing."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from engine import Tensor, nn
from engine.nn import _ops
from engine.tensor.cpu import activation as cpu_activation, attention as cpu_attention, conv as cpu_conv, norm as cpu_norm
from engine.tensor.cpu import jit, threads
from tests.engine.nn.test_cross_entropy_blocked import reference as _ce_reference
from tests.engine.nn.test_cross_entropy_blocked import run as _ce_run
from tests.engine.nn.test_gelu_f32 import _reference as _gelu_reference

needs_numba = pytest.mark.skipif(jit.kernels() is None, reason=f"compiled kernels unavailable: {jit.unavailable_reason()}")


class _Spy:
    """Stands in for the kernels' module: records the name of every kernel fetched from it."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.real, name)


@contextlib.contextmanager
def compiled(on: bool, n_threads: int | None = None):
    """The kernels on or off, at `n_threads` kernel threads; with more than one, these tests'
    small arrays go to the threads too (PARALLEL_MIN_BYTES lowered)."""
    old, old_threads, old_min = jit.set_enabled(on), threads.num_threads(), threads.PARALLEL_MIN_BYTES
    threads.set_num_threads(n_threads)
    if n_threads is not None and n_threads > 1:
        threads.PARALLEL_MIN_BYTES = 1 << 16
    try:
        yield
    finally:
        jit.set_enabled(old)
        threads.set_num_threads(old_threads)
        threads.PARALLEL_MIN_BYTES = old_min


# ---------------------------------------------------------------------- exp
@needs_numba
def test_exp_of_nonpositive_floats_is_within_two_ulp_of_float64():
    k = jit.kernels()
    x = np.concatenate([np.linspace(-87.33, 0.0, 1_000_003), -np.logspace(-30, 1.9, 10_001)]).astype(np.float32)
    out = np.empty_like(x)
    k.exp_nonpositive_array(x, out)
    ref = np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(out - ref) / ulp) <= 2.0


@needs_numba
def test_exp_edges_zero_flush_and_nan():
    k = jit.kernels()
    x = np.array([0.0, -0.0, -1e-38, -87.336, -87.34, -100.0, -np.inf, np.nan], np.float32)
    out = np.empty_like(x)
    k.exp_nonpositive_array(x, out)
    assert out[0] == 1.0 and out[1] == 1.0 and out[2] == 1.0
    assert out[3] == pytest.approx(np.exp(-87.336), rel=1e-6) and out[3] > 0
    assert list(out[4:7]) == [0.0, 0.0, 0.0]  # below 2^-126: flushed, as documented
    assert np.isnan(out[7])


# ---------------------------------------------------------------------- Gelu
@needs_numba
@pytest.mark.parametrize("n_threads", [1, 2])
def test_compiled_gelu_matches_float64_and_the_numpy_path(n_threads):
    n = 3 * cpu_activation.BLOCK * 7 + 123  # several blocks (threaded at 2), a ragged last one
    x = np.concatenate([np.linspace(-14, 14, n - 3), [0.0, np.nan, -1e-30]]).astype(np.float32)
    with compiled(True, n_threads):
        out, der = cpu_activation._gelu_f32(x)
    with compiled(False, n_threads):
        out_np, der_np = cpu_activation._gelu_f32(x)
    ref, dref = _gelu_reference(x)
    ok = ~np.isnan(x)
    assert np.abs(out - ref)[ok].max() < 5e-7 and np.abs(der - dref)[ok].max() < 1e-6
    assert np.isnan(out[-2]) and out[-3] == 0.0 and out[-1] == pytest.approx(-5e-31, rel=1e-6)
    # the same formula: the two paths differ by a few float32 roundings at most
    np.testing.assert_allclose(out[ok], out_np[ok], rtol=0, atol=3e-7)
    np.testing.assert_allclose(der[ok], der_np[ok], rtol=0, atol=5e-7)


# ---------------------------------------------------------------------- SiLU
@needs_numba
@pytest.mark.parametrize("n_threads", [1, 2])
def test_compiled_silu_matches_float64_the_numpy_path_and_finite_differences(n_threads):
    n = 3 * cpu_activation.BLOCK * 7 + 123  # several blocks (threaded at 2), a ragged last one
    x = np.concatenate([np.linspace(-30, 30, n - 7), [0.0, -0.0, np.nan, np.inf, -np.inf, 100.0, -100.0]])
    x = x.astype(np.float32)
    with compiled(True, n_threads):
        xt = Tensor.from_data(x).require_grad()
        y = _ops.silu(xt)
        g = np.linspace(-1, 1, n).astype(np.float32)
        gx = xt.grad((y * Tensor.from_data(g)).sum().backward()).numpy()
        out, der = cpu_activation._silu_f32(x)
    assert np.array_equal(y.numpy(), out, equal_nan=True)
    with compiled(False, n_threads), np.errstate(over="ignore", invalid="ignore"):
        out_np = _ops.silu(Tensor.from_data(x)).numpy()
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        s64 = 1.0 / (1.0 + np.exp(-x64))
        ref = x64 * s64
        dref = s64 * (1.0 + x64 * (1.0 - s64))
    ok = np.isfinite(x)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=4e-7, atol=1e-30)
    np.testing.assert_allclose(der[ok], dref[ok], rtol=2e-6, atol=3e-7)
    np.testing.assert_allclose(out[ok], out_np[ok], rtol=4e-7, atol=1e-30)
    np.testing.assert_allclose(gx, (g * der), rtol=0, atol=0)  # the backward is one product
    # the edges (0, -0, NaN, +-inf, +-100) give what the NumPy path gives, output and gradient
    edges = Tensor.from_data(x[-7:]).require_grad()
    with compiled(False, n_threads), np.errstate(over="ignore", invalid="ignore"):
        ye = _ops.silu(edges)
        ge = edges.grad(ye.sum().backward()).numpy()
    assert np.array_equal(out[-7:], ye.numpy(), equal_nan=True) and np.array_equal(der[-7:], ge, equal_nan=True)
    assert out[-4] == np.inf and out[-2] == 100.0 and der[-2] == 1.0
    assert out[-1] == pytest.approx(-100 * np.exp(-100.0), rel=1e-5)
    # the derivative is the gradient: central differences in float64 of the float32 function
    pick = np.linspace(0, n - 8, 41).astype(int)
    h = 1e-2
    up, _ = cpu_activation._silu_f32((x[pick] + np.float32(h)).astype(np.float32))
    dn, _ = cpu_activation._silu_f32((x[pick] - np.float32(h)).astype(np.float32))
    fd = (up.astype(np.float64) - dn) / (2 * h)
    np.testing.assert_allclose(der[pick], fd, rtol=2e-3, atol=2e-4)


# ---------------------------------------------------------------------- layer norm
def _layer_norm_reference(x, gamma, beta, g, eps, nred):
    """Forward and the gradients of x, gamma, beta in float64 (plain formulas)."""
    x, g = x.astype(np.float64), g.astype(np.float64)
    axes = tuple(range(x.ndim - nred, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * rstd
    gm = 1.0 if gamma is None else gamma.astype(np.float64)
    out = xhat * gm + (0.0 if beta is None else beta.astype(np.float64))
    gxh = g * gm
    gx = rstd * (gxh - gxh.mean(axis=axes, keepdims=True) - xhat * (gxh * xhat).mean(axis=axes, keepdims=True))
    lead = tuple(range(x.ndim - nred))
    return out, gx, (g * xhat).sum(axis=lead), g.sum(axis=lead)


def _layer_norm_run(x, gamma, beta, g, eps, nred):
    nd = x.ndim
    xt = Tensor.from_data(x).require_grad()
    gt = Tensor.from_data(gamma).require_grad() if gamma is not None else None
    bt = Tensor.from_data(beta).require_grad() if beta is not None else None
    affine = tuple(x.shape[nd - nred:])
    y = _ops.normalize(xt, tuple(range(nd - nred, nd)), eps, gt, bt, affine if gamma is not None or beta is not None else None)
    grads = (y * Tensor.from_data(g)).sum().backward()
    return (y.numpy(), xt.grad(grads).numpy(), gt.grad(grads).numpy() if gt is not None else None,
            bt.grad(grads).numpy() if bt is not None else None)


CASES = [((64, 32), 1, True, True), ((3, 5, 7), 1, True, False), ((4, 6, 10), 2, True, True),
         ((9, 48), 1, False, False), ((4096, 128), 1, True, True)]  # the last one: threaded blocks


@needs_numba
@pytest.mark.parametrize("shape,nred,with_gamma,with_beta", CASES)
def test_compiled_layer_norm_matches_float64_and_the_numpy_path(shape, nred, with_gamma, with_beta):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(np.float32)
    row = shape[len(shape) - nred:]
    gamma = (rng.standard_normal(row) + 1).astype(np.float32) if with_gamma else None
    beta = rng.standard_normal(row).astype(np.float32) if with_beta else None
    g = rng.standard_normal(shape).astype(np.float32)
    ref = _layer_norm_reference(x, gamma, beta, g, 1e-5, nred)
    with compiled(True, 2):
        got = _layer_norm_run(x, gamma, beta, g, 1e-5, nred)
    with compiled(False, 2):
        numpy_path = _layer_norm_run(x, gamma, beta, g, 1e-5, nred)
    n_rows = int(np.prod(shape[: len(shape) - nred]))
    for name, a, b, c in zip(("out", "dx", "dgamma", "dbeta"), got, numpy_path, ref):
        if c is None or (name == "dgamma" and gamma is None) or (name == "dbeta" and beta is None):
            continue
        scale = np.abs(c).max()
        tol = 2e-6 if name in ("out", "dx") else 2e-7 * np.sqrt(n_rows) * 4
        assert np.abs(a - c).max() <= tol * scale, name  # compiled vs float64
        assert np.abs(b - c).max() <= max(tol, 4e-6) * scale, name  # the NumPy path: the same answer


@needs_numba
def test_compiled_layer_norm_is_used_and_gives_the_same_bits_at_any_thread_count(monkeypatch):
    calls = []
    real = _ops._layer_norm_compiled
    monkeypatch.setattr(_ops, "_layer_norm_compiled", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4096, 128)).astype(np.float32)  # 2 MB: 16 blocks over the threads
    layer = nn.LayerNormConfig(128).init()
    g = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for n in (1, 2, 3):
        with compiled(True, n):
            xt = Tensor.from_data(x).require_grad()
            grads = (layer.forward(xt) * Tensor.from_data(g)).sum().backward()
            results.append((layer.forward(xt).numpy(), xt.grad(grads).numpy(), layer.gamma.val().grad(grads).numpy()))
    assert calls, "the layer norm did not take the compiled path"
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


def test_layer_norm_outside_the_compiled_kernels_cases_takes_the_numpy_path(monkeypatch):
    """float64, a non-contiguous input and gamma over another axis stay on the NumPy code."""
    seen = []
    real = _ops._layer_norm_compiled
    monkeypatch.setattr(_ops, "_layer_norm_compiled", lambda *a: seen.append(real(*a)) or seen[-1])
    x64 = np.random.default_rng(0).standard_normal((8, 16))
    y = _ops.normalize(Tensor.from_data(x64, dtype="float64"), (-1,), 1e-5)
    np.testing.assert_allclose(y.numpy().mean(axis=-1), 0.0, atol=1e-12)
    xt = Tensor.from_data(np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)).swap_dims(0, 1)
    _ops.normalize(xt, (-1,), 1e-5)
    assert all(r is None for r in seen)


# ---------------------------------------------------------------------- RMS norm
def _rms_run(x, gamma, g, need_x=True, need_g=True):
    xt = Tensor.from_data(x)
    gt = Tensor.from_data(gamma)
    xt = xt.require_grad() if need_x else xt
    gt = gt.require_grad() if need_g else gt
    y = _ops.rms_norm(xt, gt, 1e-5)
    grads = (y * Tensor.from_data(g)).sum().backward()
    return (y.numpy(), xt.grad(grads).numpy() if need_x else None, gt.grad(grads).numpy() if need_g else None)


@needs_numba
@pytest.mark.parametrize("shape,n_threads", [((64, 32), 1), ((3, 5, 7), 1), ((8, 128, 256), 2), ((4096, 128), 2)])
def test_compiled_rms_norm_matches_float64_and_the_numpy_path(shape, n_threads):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(np.float32)
    gamma = (rng.standard_normal(shape[-1]) + 1).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    x64, g64, gm = x.astype(np.float64), g.astype(np.float64), gamma.astype(np.float64)
    rstd = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = x64 * rstd
    gxh = g64 * gm
    ref = (xhat * gm, rstd * (gxh - xhat * (gxh * xhat).mean(axis=-1, keepdims=True)),
           (g64 * xhat).reshape(-1, shape[-1]).sum(axis=0))
    real = jit.kernels
    with compiled(True, n_threads):
        jit_spy = _Spy(real())
        try:
            jit.kernels = lambda: jit_spy
            got = _rms_run(x, gamma, g)
        finally:
            jit.kernels = real
        calls = jit_spy.calls
        only_gamma = _rms_run(x, gamma, g, need_x=False)
        only_x = _rms_run(x, gamma, g, need_g=False)
    assert "rms_norm" in calls and "rms_norm_backward" in calls
    with compiled(False, n_threads):
        want = _rms_run(x, gamma, g)
    for a, r, w, tol in zip(got, ref, want, (2e-6, 2e-5, 2e-5)):
        scale = np.abs(r).max()
        assert np.abs(a - r).max() <= tol * scale
        assert np.abs(a - w).max() <= tol * scale
    assert only_gamma[1] is None and np.array_equal(only_gamma[2], got[2]) and np.array_equal(only_gamma[0], got[0])
    assert only_x[2] is None and np.array_equal(only_x[1], got[1])
    with compiled(True, 1):  # the same bits on one thread as on two: fixed blocks, fixed sums
        assert all(np.array_equal(a, b) for a, b in zip(_rms_run(x, gamma, g), got))


@needs_numba
def test_rms_norm_outside_the_compiled_kernels_cases_takes_the_numpy_path(monkeypatch):
    seen = []
    monkeypatch.setattr(_ops, "_rms_norm_compiled", lambda *a: seen.append(a) or None)
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    out = _ops.rms_norm(Tensor.from_data(x), Tensor.from_data(np.ones(6, np.float32)), 1e-5).numpy()
    assert seen and np.allclose(out, x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5), atol=1e-6)
    monkeypatch.undo()
    for xv, gv in ((x.astype(np.float64), np.ones(6)), (x, np.ones((4, 1), np.float32)), (x[:, ::2], np.ones(3, np.float32))):
        assert _ops._rms_norm_compiled(Tensor.from_data(xv), xv, Tensor.from_data(gv), 1e-5) is None


# ---------------------------------------------------------------------- cross entropy
@needs_numba
@pytest.mark.parametrize("rows,classes,n_threads", [(33, 7, 1), (256, 1000, 1), (97, 30001, 2)])
def test_compiled_cross_entropy_matches_float64_and_the_numpy_path(rows, classes, n_threads):
    rng = np.random.default_rng(classes)
    x = (rng.standard_normal((rows, classes)) * 6).astype(np.float32)
    x[0, :] = -1e4  # a row far below: the shift keeps it finite
    x[1, 3] = 80.0  # one class dominating its row
    t = rng.integers(0, classes, rows)
    w = np.ones(rows, np.float32)
    w[::5] = 0.0  # pad rows
    denom = float(w.sum())
    with compiled(True, n_threads):
        loss, grad = _ce_run(x, t, w, denom)
    with compiled(False, n_threads):
        loss_np, grad_np = _ce_run(x, t, w, denom)
    ref_loss, ref_grad = _ce_reference(x, t, w, denom)
    assert loss == pytest.approx(ref_loss, rel=3e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=2e-5, atol=1e-9)
    assert np.all(grad[::5] == 0.0)
    assert loss == pytest.approx(loss_np, rel=3e-6)
    np.testing.assert_allclose(grad, grad_np, rtol=2e-5, atol=1e-9)


@needs_numba
def test_compiled_cross_entropy_propagates_nan():
    x = np.zeros((2, 5), np.float32)
    x[1, 2] = np.nan
    loss, grad = _ce_run(x, np.array([0, 1]), None, 2.0)
    assert np.isnan(loss) and np.isnan(grad[1]).all() and np.isfinite(grad[0]).all()


@needs_numba
def test_row_max_of_the_softmax_kernels_is_numpys_max_with_nan_inf_and_signed_zeros():
    # the kernels' running max is LLVM's `maximum` (vectorized): the same value as np.max in
    # every row, NaN wherever the row holds one, at any position in the row and its vector tail
    k = jit.kernels()
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((12, 1003)) * 5).astype(np.float32)
    x[1, 0] = np.nan
    x[2, 517] = np.nan
    x[3, -1] = np.nan
    x[4, :] = -np.inf
    x[5, 9] = np.inf
    x[6, :] = -0.0
    x[6, 400] = 0.0
    x[7, :] = -1e30
    x[7, 1002] = 3.0  # the maximum in the last element, past the vectorized part
    x[8, 0] = 40.0    # ... and in the first
    e = np.empty_like(x)
    m = np.empty(12, np.float32)
    tot = np.empty(12, np.float32)
    k.shifted_exp_rows(x, e, m, tot)
    want = np.max(x, axis=1)
    assert np.array_equal(m, want, equal_nan=True)
    assert np.array_equal(np.isnan(tot), np.isnan(want) | np.isinf(want))
    finite = np.isfinite(want)
    with np.errstate(invalid="ignore"):
        ref = np.exp((x[finite] - want[finite, None]).astype(np.float64))  # the float32 shift, as the kernel
    np.testing.assert_allclose(e[finite], ref, rtol=3e-7, atol=1e-38)
    np.testing.assert_allclose(tot[finite], ref.sum(axis=1), rtol=1e-6)
    # attention's softmax: a NaN score makes its row NaN and leaves the others as NumPy's
    sc = (rng.standard_normal((2, 3, 37)) * 4).astype(np.float32)
    sc[1, 2, 30] = np.nan
    got = sc.copy()
    k.attention_softmax(got, np.float32(0.5), np.zeros((0, 0), bool), np.float32(0.0), False)
    v = sc.astype(np.float64) * 0.5
    with np.errstate(invalid="ignore"):
        ref = np.exp(v - v.max(axis=-1, keepdims=True))
        ref /= ref.sum(axis=-1, keepdims=True)
    assert np.isnan(got[1, 2]).all()
    ok = np.ones((2, 3), bool)
    ok[1, 2] = False
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-6, atol=1e-9)


# ---------------------------------------------------------------------- where the arrays lie
def _layout_cases(rng):
    """Every kernel of one pass over rows or elements, with its arguments: arrays (the inputs
    filled, the outputs zeros) and scalars. Rows of 200 and 1100 elements: the vectorized body
    and its tail, and the cross entropy's whole 512-element runs."""
    f = np.float32

    def a(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(f)

    def z(*shape, dtype=f):
        return np.zeros(shape, dtype)

    r, p = 6, 1100
    # Gelu's coefficients in `_ops.gelu`'s order; only the bits' repeatability is asserted here
    coef = np.array([0.3275911 / np.sqrt(2), 0.127, -0.142, 0.711, -0.726, 0.531, -60.0, 0.3989423], f)
    mask = rng.random((5, 200)) < 0.2
    return {
        "silu": [a(r * p, scale=4), z(r * p), z(r * p)],
        "gelu": [a(r * p, scale=4), z(r * p), z(r * p), coef],
        "relu_grad": [a(r * p), a(r * p), z(r * p)],
        "layer_norm": [a(r, p), a(p), a(p), 1e-5, z(r, p), z(r, p), z(r)],
        "layer_norm_backward": [a(r, p), a(r, p), a(r), a(p), z(r, p), z(p, dtype=np.float64), z(p, dtype=np.float64)],
        "rms_norm": [a(r, p), a(p), 1e-6, z(r, p), z(r, p), z(r)],
        "rms_norm_backward": [a(r, p), a(r, p), a(r), a(p), z(r, p), z(p, dtype=np.float64)],
        "shifted_exp_rows": [a(r, p, scale=3), z(r, p), z(r), z(r)],
        "shifted_exp_rows (short rows)": [a(r, 200, scale=3), z(r, 200), z(r), z(r)],
        "scale_rows": [a(r, p), a(r), z(r, p)],
        "attention_softmax": [a(3, 5, 200, scale=3), f(0.125), mask, f(-1e30), False],
        "attention_softmax_backward": [a(3, 5, 200), a(3, 5, 200), z(3, 5), False, mask],
        "bn_centre": [a(2, 3, p), a(3), z(2, 3, p), z(2, 3)],
        "bn_scale": [a(2, 3, p), a(3), a(3), z(2, 3, p)],
        "bn_reduce": [a(2, 3, p), a(2, 3, p), z(2, 3), z(2, 3)],
        "bn_input_grad": [a(2, 3, p), a(2, 3, p), a(3), a(3), a(3), z(2, 3, p)],
        "adam_update": [a(r * p), a(r * p), a(r * p), np.abs(a(r * p)), z(r * p),
                        np.array([0.9, 0.1, 0.999, 0.001, 1e-8, -1e-3], f)],
    }


def _laid_out(arrays, gap: int, reverse: bool):
    """Copies of `arrays` one after another in one buffer, `gap` bytes apart (in reverse order
    when `reverse`): where malloc often puts a kernel's output, just past the end of its input."""
    sizes = [-(-x.nbytes // 16) * 16 for x in arrays]
    buf = np.zeros(sum(sizes) + gap * len(arrays) + 64, np.uint8)
    pos = (-buf.ctypes.data) % 64
    out = [None] * len(arrays)
    for i in (reversed(range(len(arrays))) if reverse else range(len(arrays))):
        view = buf[pos:pos + arrays[i].nbytes].view(arrays[i].dtype).reshape(arrays[i].shape)
        view[...] = arrays[i]
        out[i] = view
        pos += sizes[i] + gap
    return out


@needs_numba
def test_kernel_bits_do_not_depend_on_where_the_arrays_lie():
    # A loop that stores into one array and sums into a scalar is vectorized behind a run-time
    # overlap check; with the output a few hundred bytes past the input's end the check failed,
    # the scalar loop summed in another order, and one process's training steps differed in the
    # last bits (the cross entropy's row sums, batch norm's centred squares). Every kernel here
    # must give the same bits wherever its arrays lie.
    k = jit.kernels()
    for name, args in _layout_cases(np.random.default_rng(3)).items():
        fn = getattr(k, name.split(" ")[0])
        arrays = [i for i, v in enumerate(args) if isinstance(v, np.ndarray)]
        results = []
        for gap, reverse in [(4096, False)] + [(g, rev) for g in (0, 16, 48, 64, 128, 256, 400) for rev in (False, True)]:
            placed = _laid_out([args[i] for i in arrays], gap, reverse)
            call = list(args)
            for i, v in zip(arrays, placed):
                call[i] = v
            fn(*call)
            results.append([v.tobytes() for v in placed])
        for got in results[1:]:
            for j, (x, y) in enumerate(zip(got, results[0])):
                assert x == y, f"{name}: argument {arrays[j]} has other bits when the arrays lie elsewhere"


# ---------------------------------------------------------------------- switching off
def test_switched_off_or_without_numba_the_numpy_paths_run(monkeypatch):
    x = np.random.default_rng(2).standard_normal((64, 32)).astype(np.float32)
    with compiled(True):
        ref = nn.Gelu().forward(Tensor.from_data(x)).numpy()
    old = jit.set_enabled(False)
    try:
        assert jit.kernels() is None and not jit.enabled() and "switched off" in jit.unavailable_reason()
        np.testing.assert_allclose(nn.Gelu().forward(Tensor.from_data(x)).numpy(), ref, atol=3e-7)
    finally:
        jit.set_enabled(old)
    # numba missing: the import failed once, and every op keeps working on NumPy
    monkeypatch.setattr(jit, "_module", None)
    monkeypatch.setattr(jit, "_failure", "numba unavailable: No module named 'numba'")
    assert jit.kernels() is None and "numba" in jit.unavailable_reason()
    np.testing.assert_allclose(nn.Gelu().forward(Tensor.from_data(x)).numpy(), ref, atol=3e-7)
    y = nn.LayerNormConfig(32).init().forward(Tensor.from_data(x)).numpy()
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-5)


# ---------------------------------------------------------------------- attention's softmax
def _attention_run(q, k, v, g_ctx, g_w, **kw):
    from engine.nn._sdpa import scaled_dot_product_attention  # noqa: PLC0415

    qt, kt, vt = (Tensor.from_data(a).require_grad() for a in (q, k, v))
    w, c = scaled_dot_product_attention(qt, kt, vt, 1.0 / np.sqrt(q.shape[-1]), **kw)
    loss = (c * Tensor.from_data(g_ctx)).sum() + (w * Tensor.from_data(g_w)).sum()
    grads = loss.backward()
    return [w.numpy(), c.numpy()] + [t.grad(grads).numpy() for t in (qt, kt, vt)]


def _attention_reference(q, k, v, g_ctx, g_w, masked, quiet):
    """float64: weights, context and the gradients of q, k, v (plain formulas, GQA by repeat)."""
    q, k, v, g_ctx, g_w = (a.astype(np.float64) for a in (q, k, v, g_ctx, g_w))
    rep = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ kr.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if masked is not None:
        s = np.where(masked, -1.0e4, s)
    mx = s.max(axis=-1, keepdims=True)
    if quiet:
        mx = np.maximum(mx, 0.0)
    e = np.exp(s - mx)
    w = e / (e.sum(axis=-1, keepdims=True) + (np.exp(-mx) if quiet else 0.0))
    c = w @ vr
    dw = g_ctx @ vr.swapaxes(-1, -2) + g_w
    ds = w * (dw - (dw * w).sum(axis=-1, keepdims=True))
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds /= np.sqrt(q.shape[-1])
    dq = ds @ kr
    dk = (ds.swapaxes(-1, -2) @ q).reshape(k.shape[0], k.shape[1], rep, *k.shape[2:]).sum(axis=2)
    dv = (w.swapaxes(-1, -2) @ g_ctx).reshape(v.shape[0], v.shape[1], rep, *v.shape[2:]).sum(axis=2)
    return [w, c, dq, dk, dv]


@needs_numba
@pytest.mark.parametrize("case", ["none", "causal", "shared mask", "quiet causal", "gqa causal"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_compiled_attention_softmax_matches_float64_and_the_numpy_path(case, n_threads, monkeypatch):

    rng = np.random.default_rng(len(case))
    # 1.2 MB of scores in blocks of 4 rows of heads: the blocks go to the kernel threads at 2
    b, h, hk, s, d = (8, 4, 2, 96, 16) if case.startswith("gqa") else (8, 4, 4, 96, 16)
    q = rng.standard_normal((b, h, s, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, s, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, s, d)).astype(np.float32)
    g_ctx = rng.standard_normal((b, h, s, d)).astype(np.float32)
    g_w = rng.standard_normal((b, h, s, s)).astype(np.float32)
    kw, masked = {}, None
    if "causal" in case:
        kw["causal_offset"] = 0
        masked = np.triu(np.ones((s, s), bool), 1)
    if case == "shared mask":
        masked = rng.random((s, s)) < 0.3
        masked[:, 0] = False
        kw["mask"] = masked[None, None]
    if case.startswith("quiet"):
        kw["quiet"] = True
    monkeypatch.setattr(cpu_attention, "BLOCK_BYTES", 4 * s * s * 4)  # several blocks: threaded at 2
    spy = _Spy(jit.kernels())
    calls = spy.calls
    with compiled(True, n_threads):
        monkeypatch.setattr(jit, "kernels", lambda: spy)
        got = _attention_run(q, k, v, g_ctx, g_w, **kw)
        monkeypatch.setattr(jit, "kernels", lambda: spy.real)
    assert "attention_softmax" in calls and "attention_softmax_backward" in calls
    with compiled(False, n_threads):
        numpy_path = _attention_run(q, k, v, g_ctx, g_w, **kw)
    ref = _attention_reference(q, k, v, g_ctx, g_w, masked, kw.get("quiet", False))
    for name, a, b_, c in zip(("weights", "context", "dq", "dk", "dv"), got, numpy_path, ref):
        scale = np.abs(c).max()
        assert np.abs(a - c).max() <= 3e-6 * scale, name
        assert np.abs(a - b_).max() <= 3e-6 * scale, name
    if masked is not None:
        assert np.all(got[0][:, :, masked] == 0.0) if case != "quiet causal" else np.all(got[0][:, :, masked] < 1e-30)


@needs_numba
def test_attention_with_a_per_batch_mask_or_dropout_keeps_the_numpy_softmax(monkeypatch):
    from engine.nn import _sdpa  # noqa: PLC0415

    spy = _Spy(jit.kernels())
    calls = spy.calls
    monkeypatch.setattr(jit, "kernels", lambda: spy)
    rng = np.random.default_rng(0)
    q = Tensor.from_data(rng.standard_normal((2, 2, 8, 4)).astype(np.float32))
    pad = np.zeros((2, 1, 1, 8), bool)
    pad[1, :, :, 6:] = True  # a different mask per batch entry
    w, _ = _sdpa.scaled_dot_product_attention(q, q, q, 0.5, mask=pad)
    assert "attention_softmax" not in calls
    assert np.all(w.numpy()[1, :, :, 6:] == 0.0)
    np.testing.assert_allclose(w.numpy().sum(axis=-1), 1.0, rtol=1e-6)


# ---------------------------------------------------------------------- batch norm
def _batch_norm_run(x, g, n_threads, on):
    layer = nn.BatchNormConfig(x.shape[1]).init()
    layer.gamma = layer.gamma.map(lambda t: Tensor.from_data(np.linspace(0.5, 1.5, x.shape[1]).astype(np.float32)).require_grad())
    with compiled(on, n_threads):
        xt = Tensor.from_data(x).require_grad()
        y = layer.forward(xt)
        grads = (y * Tensor.from_data(g)).sum().backward()
        return y.numpy(), xt.grad(grads).numpy(), layer.gamma.val().grad(grads).numpy(), layer.beta.val().grad(grads).numpy()


def _batch_norm_reference(x, g, gamma, eps=1e-5):
    x, g = x.astype(np.float64), g.astype(np.float64)
    axes = (0, 2, 3)
    n = x.size / x.shape[1]
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * rstd
    gm = gamma.reshape(1, -1, 1, 1).astype(np.float64)
    gxh = g * gm
    gx = rstd * (gxh - gxh.sum(axis=axes, keepdims=True) / n - xhat * (gxh * xhat).sum(axis=axes, keepdims=True) / n)
    return xhat * gm, gx, (g * xhat).sum(axis=axes), g.sum(axis=axes)


@needs_numba
@pytest.mark.parametrize("n_threads", [1, 2])
def test_compiled_batch_norm_matches_float64_and_the_numpy_path(n_threads, monkeypatch):
    spy = _Spy(jit.kernels())
    calls = spy.calls
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((24, 8, 17, 19)) * 2 + 3).astype(np.float32)  # 0.25 MB blocks: several
    g = rng.standard_normal(x.shape).astype(np.float32)
    monkeypatch.setattr(cpu_norm, "BN_BLOCK_BYTES", 8 * 17 * 19 * 4 * 5)
    monkeypatch.setattr(jit, "kernels", lambda: spy)
    got = _batch_norm_run(x, g, n_threads, True)
    monkeypatch.setattr(jit, "kernels", lambda: spy.real)
    assert {"bn_centre", "bn_scale", "bn_reduce", "bn_input_grad"} <= set(calls)
    numpy_path = _batch_norm_run(x, g, n_threads, False)
    ref = _batch_norm_reference(x, g, np.linspace(0.5, 1.5, 8))
    for name, a, b_, c in zip(("out", "dx", "dgamma", "dbeta"), got, numpy_path, ref):
        scale = np.abs(c).max()
        assert np.abs(a - c).max() <= 1e-5 * scale, name
        assert np.abs(a - b_).max() <= 1e-5 * scale, name


def test_a_kernel_build_failure_leaves_the_numpy_paths(monkeypatch):
    """Not only a missing numba: a compile or cache error while loading is reported, not raised."""
    import builtins  # noqa: PLC0415

    real_import = builtins.__import__

    def failing(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and "_kernels" in fromlist:
            raise RuntimeError("cannot cache function: no locator available")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(jit, "_module", None)
    monkeypatch.setattr(jit, "_failure", None)
    monkeypatch.setattr(builtins, "__import__", failing)
    assert jit.kernels() is None
    assert "failed to build" in jit.unavailable_reason() and "no locator" in jit.unavailable_reason()
    monkeypatch.setattr(builtins, "__import__", real_import)
    x = Tensor.from_data(np.linspace(-3, 3, 12, dtype=np.float32))
    np.testing.assert_allclose(nn.Gelu().forward(x).numpy(), _gelu_reference(x.numpy())[0], atol=5e-7)


@needs_numba
@pytest.mark.parametrize("n_threads", [1, 2])
def test_compiled_relu_gradient_masks_as_the_numpy_product(n_threads, monkeypatch):
    from engine.tensor.cpu import threads as th  # noqa: PLC0415

    monkeypatch.setattr(th, "ELEMENTWISE_MIN_BYTES", 1 << 16)  # split over the threads at 2
    rng = np.random.default_rng(4)
    x_np = rng.standard_normal((64, 1000)).astype(np.float32)
    x_np[0, :4] = [0.0, -0.0, 1e-30, -1e-30]
    g_np = rng.standard_normal(x_np.shape).astype(np.float32)
    results = []
    for on in (True, False):
        with compiled(on, n_threads):
            x = Tensor.from_data(x_np).require_grad()
            grads = (x.relu() * Tensor.from_data(g_np)).sum().backward()
            results.append(x.grad(grads).numpy())
    assert np.array_equal(results[0], results[1])
    assert np.array_equal(results[0], np.where(x_np > 0, g_np, 0.0))


# ---------------------------------------------------------------------- convolution's col2im
def _conv_min_channels():
    from engine.tensor import ops_conv  # noqa: PLC0415

    return cpu_conv.CL_MIN_CHANNELS


def _conv_grads(x_np, w_np, g_np, **kw):
    x = Tensor.from_data(x_np).require_grad()
    w = Tensor.from_data(w_np).require_grad()
    grads = (x.conv2d(w, **kw) * Tensor.from_data(g_np)).sum().backward()
    return x.grad(grads).numpy(), w.grad(grads).numpy()


def _conv_grads_reference(x, w, g, stride=1, padding=0, dilation=1):
    """The input and weight gradients of conv2d in float64, one kernel offset at a time (einsum
    over the strided window of a zero-padded array), written here."""
    (sy, sx), (py, px), (dy, dx) = (np.broadcast_to(v, 2) for v in (stride, padding, dilation))
    x, w, g = (a.astype(np.float64) for a in (x, w, g))
    xpad = np.pad(x, ((0, 0), (0, 0), (py, py), (px, px)))
    gx, gw = np.zeros_like(xpad), np.zeros_like(w)
    oh, ow = g.shape[2:]
    for ky in range(w.shape[2]):
        for kx in range(w.shape[3]):
            win = (slice(None), slice(None), slice(ky * dy, ky * dy + sy * (oh - 1) + 1, sy),
                   slice(kx * dx, kx * dx + sx * (ow - 1) + 1, sx))
            gx[win] += np.einsum("boyx,oc->bcyx", g, w[:, :, ky, kx])
            gw[:, :, ky, kx] = np.einsum("boyx,bcyx->oc", g, xpad[win])
    return gx[:, :, py:py + x.shape[2], px:px + x.shape[3]], gw


@needs_numba
@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=(2, 1), padding=(2, 0)),
                                dict(stride=(1, 3), padding=(1, 2))])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_compiled_col2im_gives_the_input_gradient_of_float64(kw, n_threads, monkeypatch):
    rng = np.random.default_rng(11)
    # channels >= _CL_MIN_CHANNELS: the channels-last path, whose input gradient this is
    c = max(16, _conv_min_channels())
    x_np = rng.standard_normal((6, c, 11, 13)).astype(np.float32)
    w_np = rng.standard_normal((c + 3, c, 3, 2)).astype(np.float32)
    with compiled(False):
        shape = Tensor.from_data(x_np).conv2d(Tensor.from_data(w_np), **kw).shape
    g_np = rng.standard_normal(tuple(shape)).astype(np.float32)
    spy = _Spy(jit.kernels())
    with compiled(True, n_threads):
        monkeypatch.setattr(jit, "kernels", lambda: spy)
        got = _conv_grads(x_np, w_np, g_np, **kw)
        monkeypatch.setattr(jit, "kernels", lambda: spy.real)
    assert "col2im_add_2d" in spy.calls
    with compiled(False, n_threads):
        numpy_path = _conv_grads(x_np, w_np, g_np, **kw)
    ref = _conv_grads_reference(x_np, w_np, g_np, **kw)
    for a, b_, c in zip(got, numpy_path, ref):
        scale = np.abs(c).max()
        assert np.abs(a - c).max() <= 2e-6 * scale
        assert np.abs(a - b_).max() <= 2e-6 * scale


# ---------------------------------------------------------------------- Winograd F(2x2, 3x3)
_WINOGRAD_KERNELS = {"winograd_input", "winograd_output", "winograd_output_grad", "winograd_input_grad"}


def _pad_pairs(padding):
    """A 3x3 conv2d's padding argument (an int, (before, after) pairs or "same") as pairs."""
    if padding == "same":
        return ((1, 1), (1, 1))
    return ((padding, padding),) * 2 if isinstance(padding, int) else padding


def _conv_forward_reference(x, w, b, pads):
    """conv2d's output in float64 (einsum over NumPy's sliding windows), written here; `pads`
    as (before, after) pairs."""
    xpad = np.pad(x.astype(np.float64), ((0, 0), (0, 0)) + tuple(pads))
    win = np.lib.stride_tricks.sliding_window_view(xpad, (3, 3), axis=(2, 3))  # [B, C, OH, OW, 3, 3]
    out = np.einsum("bchwij,ocij->bohw", win, w.astype(np.float64))
    return out if b is None else out + b.astype(np.float64)[None, :, None, None]


def _conv_run(x_np, w_np, b_np, g_np, padding, need=("x", "w", "b")):
    x = Tensor.from_data(x_np).require_grad() if "x" in need else Tensor.from_data(x_np)
    w = Tensor.from_data(w_np).require_grad() if "w" in need else Tensor.from_data(w_np)
    b = None if b_np is None else Tensor.from_data(b_np).require_grad()
    y = x.conv2d(w, b, padding=padding)
    grads = (y * Tensor.from_data(g_np)).sum().backward()
    got = {"y": y.numpy()}
    for name, t in (("x", x), ("w", w), ("b", b)):
        if t is not None and name in need:
            got[name] = t.grad(grads).numpy()
    return got


def _winograd_case(case, seed=12):
    batch, c_in, c_out, h, w, padding, bias = case
    rng = np.random.default_rng(seed)
    x_np = rng.standard_normal((batch, c_in, h, w)).astype(np.float32)
    w_np = (rng.standard_normal((c_out, c_in, 3, 3)) * 0.3).astype(np.float32)
    b_np = rng.standard_normal(c_out).astype(np.float32) if bias else None
    ref_y = _conv_forward_reference(x_np, w_np, b_np, _pad_pairs(padding))
    g_np = rng.standard_normal(ref_y.shape).astype(np.float32)
    return x_np, w_np, b_np, g_np, ref_y


_WINOGRAD_CASES = [
    # batch, channels in, out, height, width, padding, bias
    (3, 16, 24, 13, 13, 0, True),  # 11x11 out: the last tile row and column half outside
    (2, 32, 16, 8, 10, 1, False),  # whole tiles, padded
    (5, 16, 17, 7, 6, ((0, 1), (2, 0)), True),  # asymmetric padding, odd channel count
    (1, 16, 16, 3, 3, 0, True),  # one output, one tile
    (4, 20, 16, 5, 9, "same", True),
    (2, 16, 16, 1, 1, 1, True),  # a 1x1 image padded: one tile, three quarters outside
]


@needs_numba
@pytest.mark.parametrize("case", _WINOGRAD_CASES)
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("one_image_runs", [False, True])
def test_winograd_conv2d_matches_float64_and_the_direct_path(case, n_threads, one_image_runs, monkeypatch):
    from engine.tensor import ops_conv  # noqa: PLC0415

    x_np, w_np, b_np, g_np, ref_y = _winograd_case(case)
    padding = case[5]
    if one_image_runs:  # every image its own run: several runs, shared among the threads
        monkeypatch.setattr(cpu_conv, "CL_CHUNK_BYTES", 1)
    spy = _Spy(jit.kernels())
    with compiled(True, n_threads):
        monkeypatch.setattr(jit, "kernels", lambda: spy)
        got = _conv_run(x_np, w_np, b_np, g_np, padding)
        monkeypatch.setattr(jit, "kernels", lambda: spy.real)
    assert _WINOGRAD_KERNELS <= set(spy.calls)
    with compiled(False, n_threads):  # the direct (channels-last NumPy) path
        direct = _conv_run(x_np, w_np, b_np, g_np, padding)
    ref_gx, ref_gw = _padded_grads_reference(x_np, w_np, g_np, _pad_pairs(padding))
    ref = {"y": ref_y, "x": ref_gx, "w": ref_gw}
    if b_np is not None:
        ref["b"] = g_np.astype(np.float64).sum(axis=(0, 2, 3))
    assert set(got) == set(ref)
    for name, want in ref.items():
        scale = np.abs(want).max()
        assert got[name].shape == want.shape, name
        assert np.abs(got[name] - want).max() <= 2e-6 * scale, name
        assert np.abs(got[name] - direct[name]).max() <= 2e-6 * scale, name


def _padded_grads_reference(x, w, g, pads):
    """`_conv_grads_reference` for (before, after) padding pairs: the input padded first."""
    (t, bt), (l, r) = pads
    xpad = np.pad(x, ((0, 0), (0, 0), (t, bt), (l, r)))
    gx, gw = _conv_grads_reference(xpad, w, g)
    return gx[:, :, t:t + x.shape[2], l:l + x.shape[3]], gw


@needs_numba
def test_winograd_conv2d_gives_the_same_bits_at_any_thread_count(monkeypatch):
    from engine.tensor import ops_conv  # noqa: PLC0415

    monkeypatch.setattr(cpu_conv, "CL_CHUNK_BYTES", 1)  # 7 runs of one image
    x_np, w_np, b_np, g_np, _ = _winograd_case((7, 16, 16, 9, 9, 1, True), seed=13)
    results = []
    for n in (1, 2, 3):
        with compiled(True, n):
            results.append(_conv_run(x_np, w_np, b_np, g_np, 1))
    for other in results[1:]:
        for name in results[0]:
            assert np.array_equal(results[0][name], other[name]), name


@needs_numba
@pytest.mark.parametrize("need", [("x",), ("w",)])
def test_winograd_conv2d_computes_only_the_gradients_asked_for(need, monkeypatch):
    x_np, w_np, _, g_np, ref_y = _winograd_case((3, 16, 16, 8, 7, 0, False), seed=14)
    spy = _Spy(jit.kernels())
    with compiled(True):
        monkeypatch.setattr(jit, "kernels", lambda: spy)
        got = _conv_run(x_np, w_np, None, g_np, 0, need=need)
        monkeypatch.setattr(jit, "kernels", lambda: spy.real)
    # one run of the 3 images: the input's tiles once in the forward, again in the backward only
    # for the weight gradient; the input gradient's transform only when it is asked for; the
    # input's channels-last copy once, in the forward (the backward reads it again)
    assert spy.calls.count("winograd_input") == (2 if need == ("w",) else 1)
    assert spy.calls.count("pad_channels_last") == 1
    assert ("winograd_input_grad" in spy.calls) == (need == ("x",))
    ref_gx, ref_gw = _conv_grads_reference(x_np, w_np, g_np)
    want = ref_gx if need == ("x",) else ref_gw
    assert np.abs(got[need[0]] - want).max() <= 2e-6 * np.abs(want).max()
    assert np.abs(got["y"] - ref_y).max() <= 2e-6 * np.abs(ref_y).max()


@needs_numba
@pytest.mark.parametrize("kw, dtype, c_in, groups, channels_last", [
    (dict(stride=2), np.float32, 16, 1, True),
    (dict(dilation=2), np.float32, 16, 1, True),
    (dict(), np.float64, 16, 1, False),
    (dict(), np.float32, 8, 1, False),  # few channels: the channel-major path
    (dict(), np.float32, 32, 2, False),
])
def test_other_convolutions_do_not_take_the_winograd_path(kw, dtype, c_in, groups, channels_last, monkeypatch):
    rng = np.random.default_rng(15)
    x = Tensor.from_data(rng.standard_normal((2, c_in, 9, 9)), dtype=dtype).require_grad()
    w = Tensor.from_data(rng.standard_normal((16, c_in // groups, 3, 3)), dtype=dtype).require_grad()
    assert x.dtype == w.dtype == np.dtype(dtype)
    spy = _Spy(jit.kernels())
    with compiled(True):
        monkeypatch.setattr(jit, "kernels", lambda: spy)
        x.conv2d(w, groups=groups, **kw).sum().backward()
    assert ("col2im_add_2d" in spy.calls) == channels_last  # (the spy sees the kernels fetched)
    assert not _WINOGRAD_KERNELS & set(spy.calls)


@needs_numba
@pytest.mark.parametrize("top, left", [(0, 0), (1, 1), (2, 0), (0, 3)])
def test_pad_channels_last_kernel_is_numpys_pad_and_moveaxis(top, left):
    rng = np.random.default_rng(16)
    x = rng.standard_normal((3, 5, 4, 7)).astype(np.float32)
    hp, wp = 4 + top + 2, 7 + left + 1  # more rows and columns after the image than the padding
    dst = np.full((3, hp, wp, 5), np.nan, np.float32)  # every element must be written
    jit.kernels().pad_channels_last(x, top, left, dst)
    want = np.pad(x, ((0, 0), (0, 0), (top, hp - 4 - top), (left, wp - 7 - left))).transpose(0, 2, 3, 1)
    assert np.array_equal(dst, want)


@needs_numba
@pytest.mark.parametrize("one_image_runs", [False, True])
def test_winograd_conv2d_bias_gradient_alone_and_beside_the_others(one_image_runs, monkeypatch):
    """The bias gradient is summed run by run inside the backward when the backward runs (the
    input's or the weight's gradient asked for), over the whole output gradient when only it is."""
    from engine.tensor import ops_conv  # noqa: PLC0415

    if one_image_runs:
        monkeypatch.setattr(cpu_conv, "CL_CHUNK_BYTES", 1)
    x_np, w_np, b_np, g_np, _ = _winograd_case((5, 16, 16, 7, 7, 1, True), seed=17)
    want = g_np.astype(np.float64).sum(axis=(0, 2, 3))
    for need in (("b",), ("x", "b"), ("w", "b")):
        spy = _Spy(jit.kernels())
        with compiled(True, 2):
            monkeypatch.setattr(jit, "kernels", lambda: spy)
            got = _conv_run(x_np, w_np, b_np, g_np, 1, need=need)
            monkeypatch.setattr(jit, "kernels", lambda: spy.real)
        assert ("winograd_output_grad" in spy.calls) == (need != ("b",)), need
        assert np.abs(got["b"] - want).max() <= 2e-6 * np.abs(want).max(), need


@needs_numba
def test_winograd_conv2d_of_no_images_gives_zero_weight_and_bias_gradients():
    x_np, w_np, b_np, g_np, _ = _winograd_case((0, 16, 16, 5, 5, 0, True))
    with compiled(True):
        got = _conv_run(x_np, w_np, b_np, g_np, 0)
    assert got["y"].shape == (0, 16, 3, 3) and got["x"].shape == (0, 16, 5, 5)
    assert np.array_equal(got["w"], np.zeros((16, 16, 3, 3), np.float32))
    assert np.array_equal(got["b"], np.zeros(16, np.float32))


@needs_numba
@pytest.mark.parametrize("weight_decay", [None, 0.01])
def test_adam_update_kernel_gives_the_numpy_paths_bits(monkeypatch, weight_decay):
    """Adam's fused update (one pass) against its nine NumPy passes: the same bits for the
    parameters and both moments over several steps, and the kernel is what the fused path ran."""
    from engine.optim import AdamConfig

    rng = np.random.default_rng(3)
    p0 = rng.standard_normal((37, 19)).astype(np.float32)
    grads = [rng.standard_normal(p0.shape).astype(np.float32) * s for s in (1.0, 1e-3, 30.0, 0.2, 1e-6)]

    def run(on):
        opt = AdamConfig(weight_decay=weight_decay).init().default
        spy = _Spy(jit.kernels())
        monkeypatch.setattr(jit, "kernels", (lambda: spy) if on else (lambda: None))
        p, state = p0.copy(), None
        for i, g in enumerate(grads):
            p, state = opt.step(1e-2 * (i + 1), p, g, state, np)
        monkeypatch.undo()
        return p, state, spy.calls

    p_k, s_k, calls = run(True)
    p_n, s_n, _ = run(False)
    assert calls.count("adam_update") == len(grads) - 1  # every step after the first
    np.testing.assert_array_equal(p_k, p_n)
    np.testing.assert_array_equal(s_k["momentum.moment_1"], s_n["momentum.moment_1"])
    np.testing.assert_array_equal(s_k["momentum.moment_2"], s_n["momentum.moment_2"])
    assert s_k["momentum.time"] == s_n["momentum.time"] == len(grads)
    assert not np.array_equal(p_k, p0)
    assert "_scratch" not in s_k and "_scratch" in s_n  # the fused steps need no scratch buffer


def _adam_reference(p, grads, lrs, beta_1=0.9, beta_2=0.999, eps=1e-5):
    """Adam as Kingma & Ba write it, in float64: p -= lr m_hat / (sqrt(v_hat) + eps)."""
    p, m, v = p.astype(np.float64), 0.0, 0.0
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = g.astype(np.float64)
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g * g
        p = p - lr * (m / (1 - beta_1**t)) / (np.sqrt(v / (1 - beta_2**t)) + eps)
    return p


@needs_numba
def test_adam_update_kernel_against_the_published_rule_and_torch():
    """The fused path over many steps of a real parameter against an independent float64 Adam
    (the textbook form; Burn's scaled epsilon is the same number), and against torch.optim.Adam
    where PyTorch is installed."""
    from engine.optim import AdamConfig

    rng = np.random.default_rng(5)
    p0 = rng.standard_normal((64, 33)).astype(np.float32)
    grads = [(rng.standard_normal(p0.shape) * 10.0 ** rng.uniform(-4, 1)).astype(np.float32) for _ in range(30)]
    lrs = [1e-2 * (0.95 ** i) for i in range(len(grads))]
    opt = AdamConfig().init().default
    spy = _Spy(jit.kernels())
    p, state = p0, None
    old = jit.kernels
    jit.kernels = lambda: spy
    try:
        for g, lr in zip(grads, lrs):
            p, state = opt.step(lr, p, g, state, np)
    finally:
        jit.kernels = old
    assert spy.calls.count("adam_update") == len(grads) - 1
    ref = _adam_reference(p0, grads, lrs)
    np.testing.assert_allclose(p, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    assert np.abs(p - p0).max() > 0.05  # it moved far enough (0.089) for the comparison to mean something
    torch = pytest.importorskip("torch", reason="PyTorch not installed: torch.optim.Adam comparison skipped")
    w = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    topt = torch.optim.Adam([w], lr=lrs[0], betas=(0.9, 0.999), eps=1e-5)
    for g, lr in zip(grads, lrs):
        topt.param_groups[0]["lr"] = lr
        w.grad = torch.from_numpy(g)
        topt.step()
    np.testing.assert_allclose(p, w.detach().numpy(), rtol=0, atol=2e-6 * np.abs(ref).max())
