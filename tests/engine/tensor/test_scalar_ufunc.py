"""engine.tensor.scalar_ufunc: maximum / minimum against a scalar through a cached constant row
give NumPy's results bit for bit (NaN, signed zeros, ragged tails, every float dtype), and ReLU
(which uses it) equals NumPy's maximum on a large tensor, forward and backward."""
import numpy as np
import pytest

from engine import Tensor
from engine.tensor import scalar_ufunc
from engine.tensor.scalar_ufunc import ROW, maximum_scalar, minimum_scalar


@pytest.mark.parametrize("shape", [(5,), (3, ROW), (ROW + 1,), (64, 64, 11, 11), (1024, 688)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_equals_numpy_bit_for_bit(shape, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::97] = np.nan
    flat[1::89] = -0.0
    flat[2::101] = np.inf
    for c in (0.0, -1.5, 2.0):
        for ours, theirs in ((maximum_scalar, np.maximum), (minimum_scalar, np.minimum)):
            got, want = ours(x, c), theirs(x, dtype(c))
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(got, want, equal_nan=True)
            assert np.array_equal(np.signbit(got), np.signbit(want))
            out = np.empty_like(x)
            assert ours(x, c, out=out) is out and np.array_equal(out, want, equal_nan=True)


def test_in_place_strided_and_nan_constant_fall_back():
    x = np.random.default_rng(1).standard_normal((4 * ROW,)).astype(np.float32)
    want = np.maximum(x, np.float32(0.5))
    y = x.copy()
    maximum_scalar(y, 0.5, out=y)  # in place, as the GELU kernel calls it
    assert np.array_equal(y, want)
    s = x[::2]
    assert np.array_equal(maximum_scalar(s, 0.5), np.maximum(s, np.float32(0.5)))
    assert np.isnan(maximum_scalar(x, float("nan"))).all()
    ints = np.arange(-ROW, ROW)
    assert np.array_equal(maximum_scalar(ints, 0), np.maximum(ints, 0))


def test_the_constant_row_is_used_and_read_only():
    scalar_ufunc._rows.clear()
    x = np.linspace(-3, 3, 3 * ROW + 7, dtype=np.float32)
    maximum_scalar(x, 0.0)
    row = scalar_ufunc._rows[(np.dtype(np.float32).str, 0.0)]
    assert row.shape == (ROW,) and not row.flags.writeable and (row == 0).all()


def test_relu_forward_and_backward_on_a_large_tensor():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 64, 11, 11)).astype(np.float32)
    x.reshape(-1)[::1000] = -0.0
    g = rng.standard_normal(x.shape).astype(np.float32)
    xt = Tensor.from_data(x).require_grad()
    out = xt.relu()
    assert np.array_equal(out.numpy(), np.maximum(x, np.float32(0)))
    grads = out.backward(Tensor.from_data(g))
    assert np.array_equal(xt.grad(grads).numpy(), g * (x > 0))
