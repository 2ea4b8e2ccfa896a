"""engine.tensor.raw: the internal Tensor API the kernels, optimizers and parameters use."""
import numpy as np

from engine import Tensor, no_recording
from engine.tensor import raw


def test_array_and_wrap_share_the_values():
    t = Tensor.from_data([1.0, 2.0])
    a = raw.array(t)
    assert isinstance(a, np.ndarray) and a.tolist() == [1.0, 2.0]
    assert raw.array(t) is a  # no copy
    w = raw.wrap(a, t.device)
    assert raw.array(w) is a and w.device is t.device
    assert not w.is_autodiff() and not w.is_tracked()
    assert raw.wrap(a, t.device, True).is_autodiff()


def test_tracking_follows_the_graph_and_no_recording():
    leaf = Tensor.from_data([1.0, 2.0]).require_grad()
    plain = Tensor.from_data([3.0, 4.0])
    assert raw.tracking(leaf) and raw.tracking(plain, leaf) and raw.tracking(None, leaf)
    assert not raw.tracking(plain) and not raw.tracking(None)
    with no_recording():
        assert not raw.tracking(leaf)


def test_untracked_results_keep_the_autodiff_association():
    a = Tensor.from_data([1.0]).autodiff()
    b = Tensor.from_data([2.0])
    out = np.array([3.0], dtype=np.float32)
    assert raw.untracked(out, (a, b)).is_autodiff()
    assert raw.untracked(out, (b, a)).is_autodiff()
    r = raw.untracked(out, (b,))
    assert not r.is_autodiff() and r.device is b.device and raw.array(r) is out


def test_record_and_op_of():
    leaf = Tensor.from_data([1.0, 2.0]).require_grad()
    assert raw.op_of(leaf) == "leaf"
    assert raw.op_of(Tensor.from_data([1.0])) is None
    out = raw.record(raw.array(leaf) * 3, leaf.device, (leaf,), lambda g: (g * 3,), "triple")
    assert raw.op_of(out) == "triple"
    assert leaf.grad(out.sum().backward()).tolist() == [3.0, 3.0]


def test_sum_leading_equals_numpys_sum_over_the_leading_axes():
    rng = np.random.default_rng(0)
    cases = [((2048, 128), 1, np.float32), ((4, 300, 7), 2, np.float32), ((64, 3, 5), 1, np.float64),
             ((3, 5), 1, np.float32),  # few rows: NumPy's own reduction
             ((40, 6), 1, np.int64), ((40, 6), 1, np.float16)]  # no BLAS product for these dtypes
    for shape, k, dt in cases:
        g = (rng.standard_normal(shape) * 10).astype(dt)
        got = raw.sum_leading(g, k)
        want = g.astype(np.float64).sum(axis=tuple(range(k)))
        assert got.shape == shape[k:] and got.dtype == g.dtype
        tol = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 1e-2}.get(dt, 0)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(g).sum(axis=tuple(range(k))).max())
    strided = rng.standard_normal((64, 20)).astype(np.float32)[:, ::2]  # not C-contiguous
    np.testing.assert_allclose(raw.sum_leading(strided), strided.sum(axis=0), rtol=1e-5, atol=1e-4)
    # unbroadcast uses it for a bias's gradient and for added leading axes
    g = rng.standard_normal((8, 16, 5)).astype(np.float32)
    np.testing.assert_allclose(raw.unbroadcast(g, (16, 5)), g.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(raw.unbroadcast(g, (5,)), g.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(raw.unbroadcast(g, (1, 5)), g.sum(axis=(0, 1))[None], rtol=1e-5, atol=1e-5)
