"""The softmax cross entropy over large logits runs a block of rows at a time over the kernel
threads (engine.tensor.cpu.rows: _shifted_exp_rows / _scale_rows). Checked against a NumPy reference
written here and against the whole-array path, at one and two threads, with padding rows."""
import numpy as np
import pytest

from engine import Tensor
from engine.nn import _ops
from engine.tensor.cpu import jit, threads
from engine.tensor.cpu import rows as cpu_rows


def reference(x, t, w, denom):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]
    per = (lse - x[np.arange(len(t)), t]) * w
    loss = per.sum() / denom
    p = np.exp(x - lse[:, None])
    p[np.arange(len(t)), t] -= 1.0
    return loss, p * (w / denom)[:, None]


def run(x, t, w, denom):
    xt = Tensor.from_data(x).require_grad()
    loss = _ops.softmax_cross_entropy(xt, t, denom, row_weights=w)
    grads = loss.backward()
    return float(loss.item()), xt.grad(grads).numpy()


@pytest.mark.parametrize("n_threads", [1, 2])
def test_blocked_cross_entropy_matches_reference_and_whole_array_path(monkeypatch, n_threads):
    rng = np.random.default_rng(3)
    rows, classes = 97, 3001  # 1.1 MB of float32 logits: well above one block, an odd split
    x = (rng.standard_normal((rows, classes)) * 4).astype(np.float32)
    t = rng.integers(0, classes, rows)
    w = np.ones(rows, dtype=np.float32)
    w[::7] = 0.0  # pad rows count for nothing
    denom = float(w.sum())
    assert x.nbytes > 2 * cpu_rows.BLOCK_BYTES
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 1 << 16)  # this size goes to the threads too
    threads.set_num_threads(n_threads)
    # NumPy's passes (the compiled rows have their own test, tests/engine/tensor/test_jit_kernels.py):
    # with them on, both runs below would take the compiled path
    old_jit = jit.set_enabled(False)
    try:
        blocks = []
        real = cpu_rows._shifted_exp_rows
        monkeypatch.setattr(cpu_rows, "_shifted_exp_rows", lambda a: blocks.append(a.shape) or real(a))
        loss, grad = run(x, t, w, denom)
        assert blocks == [(rows, classes)]  # the blocked path ran
        monkeypatch.setattr(cpu_rows, "BLOCK_BYTES", 1 << 62)  # the whole-array path
        loss_whole, grad_whole = run(x, t, w, denom)
    finally:
        threads.set_num_threads(None)
        jit.set_enabled(old_jit)
    ref_loss, ref_grad = reference(x, t, w, denom)
    assert loss == pytest.approx(ref_loss, rel=2e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-8)
    assert np.all(grad[::7] == 0.0)
    # the same per-row reductions in either path: the same numbers
    assert loss == pytest.approx(loss_whole, rel=1e-7)
    np.testing.assert_allclose(grad, grad_whole, rtol=1e-6, atol=1e-12)


def test_the_shifted_exp_is_shared_from_fewer_bytes_than_a_streaming_pass(monkeypatch):
    """The forward's exp costs ~25x a copy per byte: [2048, 256] float32 logits (2 MB, 4 row
    blocks, under PARALLEL_MIN_BYTES) share their shifted-exp blocks at 2 threads, with the same
    loss and gradient bits as at one; the backward's scale (a streaming pass) stays here, and so
    do logits of a single block."""
    assert threads.PARALLEL_MIN_BYTES > 2048 * 256 * 4
    rng = np.random.default_rng(5)
    shared = []
    real = cpu_rows.run_blocks

    def recording(fn, blocks, min_blocks=2):
        blocks = list(blocks)  # whether run_blocks hands them to the threads (it has 2 or more)
        shared.append(len(blocks) >= min_blocks and len(blocks) > 1)
        return real(fn, blocks, min_blocks)

    monkeypatch.setattr(cpu_rows, "run_blocks", recording)
    res = {}
    try:
        for rows in (2048, 256):
            x = rng.standard_normal((rows, 256)).astype(np.float32)
            t = rng.integers(0, 256, rows)
            for n in (1, 2):
                threads.set_num_threads(n)
                shared.clear()
                xt = Tensor.from_data(x).require_grad()
                loss = _ops.softmax_cross_entropy(xt, t, float(rows))
                grad = xt.grad(loss.backward()).numpy()
                res[rows, n] = (float(loss.item()), grad, list(shared))
            ref_loss, ref_grad = reference(x, t, np.ones(rows), float(rows))
            assert res[rows, 2][0] == pytest.approx(ref_loss, rel=2e-6)
            np.testing.assert_allclose(res[rows, 2][1], ref_grad, rtol=1e-4, atol=1e-8)
            assert res[rows, 1][0] == res[rows, 2][0]
            np.testing.assert_array_equal(res[rows, 1][1], res[rows, 2][1])
    finally:
        threads.set_num_threads(None)
    assert not any(res[256, 2][2])  # one block of logits
    assert res[2048, 2][2][0] is True  # the forward's shifted exp: shared
    assert not any(res[2048, 2][2][1:])  # the backward's scale: here
