"""The float32 Gelu kernel (blocked A&S 7.1.26 Phi, derivative kept from the forward) against
SciPy's float64 erf: values and gradients, across block boundaries and with threads."""
import numpy as np
import pytest
import scipy.special as sp

from engine import Tensor, nn
from engine.nn import _ops
from engine.tensor import jit, threads


def _reference(x):
    x = x.astype(np.float64)
    cdf = sp.ndtr(x)
    return x * cdf, cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])  # engine.tensor.jit, or NumPy's passes
@pytest.mark.parametrize("n_threads", [1, 2])
def test_float32_gelu_and_gradient_match_float64_erf(n_threads, compiled, monkeypatch):
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 1 << 16)  # this size goes to the threads too
    old = threads.num_threads()
    threads.set_num_threads(n_threads)
    old_jit = jit.set_enabled(compiled)
    try:
        # a size that is not a multiple of the block, over several blocks (threaded when 2)
        n = 3 * _ops._GELU_BLOCK * 7 + 123
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
