"""The float32 Gelu kernel (blocked A&S 7.1.26 Phi, derivative kept from the forward) against
SciPy's float64 erf: values and gradients, across block boundaries and with threads."""
import numpy as np
import pytest
import scipy.special as sp

from engine import Tensor, nn
from engine.nn import _ops
from engine.tensor.cpu import activation as cpu_activation
from engine.tensor.cpu import jit, threads


def _reference(x):
    x = x.astype(np.float64)
    cdf = sp.ndtr(x)
    return x * cdf, cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])  # engine.tensor.cpu.jit, or NumPy's passes
@pytest.mark.parametrize("n_threads", [1, 2])
def test_float32_gelu_and_gradient_match_float64_erf(n_threads, compiled, monkeypatch):
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 1 << 16)  # this size goes to the threads too
    old = threads.num_threads()
    threads.set_num_threads(n_threads)
    old_jit = jit.set_enabled(compiled)
    try:
        # a size that is not a multiple of the block, over several blocks (threaded when 2)
        n = 3 * cpu_activation.BLOCK * 7 + 123
        x_np = np.concatenate([np.linspace(-12, 12, n - 4), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
        x_np = x_np.reshape(-1, 1)  # a non-flat shape comes back as it went in
        x = Tensor.from_data(x_np).require_grad()
        y = nn.Gelu().forward(x)
        g_np = np.random.default_rng(0).standard_normal(x_np.shape).astype(np.float32)
        grads = (y * Tensor.from_data(g_np)).sum().backward()
        ref, dref = _reference(x_np)
        assert y.dtype == x.dtype and y.shape == x.shape
        assert np.abs(y.numpy() - ref).max() < 5e-7  # SciPy's float32 erf was within 3.9e-7 here
        assert np.abs(x.grad(grads).numpy() - g_np * dref).max() < 2e-6
        np.testing.assert_allclose(y.numpy()[-4:, 0], [0.0, 0.0, 5e-31, -5e-31], rtol=1e-5, atol=0)  # Phi(0) = 1/2
    finally:
        threads.set_num_threads(old)
        jit.set_enabled(old_jit)


def test_float32_gelu_nan_propagates():
    y = nn.Gelu().forward(Tensor.from_data(np.array([np.nan, 1.0], np.float32))).numpy()
    assert np.isnan(y[0]) and abs(y[1] - 0.8413447) < 1e-6


def _reference_derivative(x):
    """Phi(x) + x phi(x) in float64, x phi(x) taken as its limit 0 at +-inf."""
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        term = np.where(np.isinf(x), 0.0, x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi))
    return sp.ndtr(x) + term


_HUGE = [1e30, -1e30, np.inf, -np.inf, 1e24, -1e24, 1e20, -1e20, 3e38, -3e38, 11.0, -11.0, 13.5, -13.5, 30.0, -30.0]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_float32_gelu_derivative_is_1_and_0_for_huge_and_infinite_inputs(n_threads, compiled, monkeypatch):
    """x phi(x) -> 0 as |x| grows: the derivative is 1 far right (and at inf), 0 far left (and
    at -inf). The exponent's floor (-60, for speed) made it x * 3.5e-27: 3494 at x = 1e30, 1.0034933
    at 1e24, +-inf at +-inf. Huge values in every block, among ordinary ones, at 1 and 2 threads."""
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 1 << 16)
    old = threads.num_threads()
    threads.set_num_threads(n_threads)
    old_jit = jit.set_enabled(compiled)
    try:
        n = 3 * cpu_activation.BLOCK + 77
        x_np = np.linspace(-8, 8, n).astype(np.float32)
        at = (np.arange(0, n - len(_HUGE), cpu_activation.BLOCK // 2)[:, None] + np.arange(len(_HUGE))).ravel()
        x_np[at] = np.resize(np.array(_HUGE, np.float32), at.size)  # each twice a block
        x = Tensor.from_data(x_np).require_grad()
        with np.errstate(all="ignore"):  # inf * 0 in the forward at -inf, as x * Phi(x) is
            grads = nn.Gelu().forward(x).sum().backward()
        der = x.grad(grads).numpy()
    finally:
        threads.set_num_threads(old)
        jit.set_enabled(old_jit)
    ref = _reference_derivative(x_np)
    assert np.abs(der - ref).max() < 2e-6, (x_np[np.abs(der - ref).argmax()], der[np.abs(der - ref).argmax()])
    big = np.abs(x_np) >= 1e20
    assert big.sum() == 7 * 10
    np.testing.assert_array_equal(der[big], np.where(x_np[big] > 0, 1.0, 0.0))


def test_float64_gelu_derivative_at_infinity_is_1_and_0():
    x_np = np.array([np.inf, -np.inf, 1e300, -1e300, 40.0, -40.0, 0.5])
    x = Tensor.from_data(x_np, dtype="float64").require_grad()
    with np.errstate(all="ignore"):
        grads = nn.Gelu().forward(x).sum().backward()
    der = x.grad(grads).numpy()
    np.testing.assert_array_equal(der[:6], [1.0, 0.0, 1.0, 0.0, 1.0, 0.0])  # was NaN at +-inf
    assert der[6] == pytest.approx(_reference_derivative(x_np[6:])[0], rel=1e-14)
