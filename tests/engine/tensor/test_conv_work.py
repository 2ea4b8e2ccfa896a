"""Performance regression check for convolutions that times nothing (issue 22, must-show 2).

One conv2d forward + backward on each path (channel-major, channels-last) and one training
step of the burn-mnist CNN on fixed small inputs are run with NumPy's `matmul` wrapped to count the matrix products and their
floating-point operations, under tracemalloc for the peak of the bytes allocated. The bounds
are today's numbers (measured at one kernel thread, noted beside each bound) with a little
room: a change that doubles the products, their work or the memory a step holds fails here,
whatever the machine's speed.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from engine import Device, Tensor, optim
from engine.tensor import ops_conv
from engine.tensor.cpu import conv as cpu_conv
from engine.tensor.cpu import jit
from engine.tensor.cpu.threads import set_num_threads
from engine.train import cross_entropy
from resources.examples import build_example


@pytest.fixture
def gemm_counter(monkeypatch):
    """Every `np.matmul` call made while the test runs: a list of (calls' flops)."""
    flops: list[int] = []
    real = np.matmul

    def counting(a, b, *args, **kwargs):
        out = real(a, b, *args, **kwargs)
        a_, b_ = np.asarray(a), np.asarray(b)
        m, k = (a_.shape[-2], a_.shape[-1]) if a_.ndim > 1 else (1, a_.shape[-1])
        n = b_.shape[-1] if b_.ndim > 1 else 1
        stack = int(np.prod(np.broadcast_shapes(a_.shape[:-2], b_.shape[:-2]))) if max(a_.ndim, b_.ndim) > 2 else 1
        flops.append(2 * m * n * k * stack)
        return out

    monkeypatch.setattr(np, "matmul", counting)
    # the blocked kernels' scratch space and the channels-last input gradient's runs of images
    # depend on the kernel and BLAS thread counts
    import engine.tensor.cpu.threads as threads_module

    monkeypatch.setattr(threads_module, "blas_threads", lambda: 1)
    set_num_threads(1)
    yield flops
    set_num_threads(None)


def _measure(fn, flops):
    """(products, their flops, peak bytes allocated) of one call of `fn`."""
    flops.clear()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return len(flops), sum(flops), peak


def _conv_step(c_in: int):
    """A 3x3 conv2d forward + backward of [4, c_in, 9, 9] -> 16 channels, checking that every
    gradient arrives; the step to measure."""
    rng = np.random.default_rng(0)
    x = Tensor.from_data(rng.standard_normal((4, c_in, 9, 9), dtype=np.float32)).require_grad()
    w = Tensor.from_data(rng.standard_normal((16, c_in, 3, 3), dtype=np.float32)).require_grad()
    b = Tensor.from_data(rng.standard_normal(16, dtype=np.float32)).require_grad()
    g = Tensor.from_data(rng.standard_normal((4, 16, 7, 7), dtype=np.float32))

    def step():
        grads = x.conv2d(w, b).backward(g)
        assert all(t.grad(grads) is not None for t in (x, w, b))

    return step


def test_conv2d_forward_backward_work_is_bounded(gemm_counter):
    step = _conv_step(8)
    step()  # warm caches (pools, lazily built helpers)
    calls, work, peak = _measure(step, gemm_counter)
    # the arithmetic itself: forward [16, 73] @ [73, 196] (bias folded), weight gradient
    # [72, 196] @ [196, 16], col2im three products [24, 16] @ [16, 196]: 1,361,024 flops
    minimum = 2 * 16 * 73 * 196 + 2 * 72 * 196 * 16 + 3 * 2 * 24 * 16 * 196
    assert work >= minimum  # the counter sees every product
    assert calls <= 5, f"{calls} matrix products for one conv2d forward + backward (5 today)"
    assert work <= 1.1 * 1_361_024, f"{work:,} flops in matrix products (1,361,024 today)"
    assert peak <= 1.3 * 151_816, f"peak {peak:,} bytes allocated (151,816 today)"


def test_mnist_cnn_train_step_work_is_bounded(gemm_counter):
    dev = Device("cpu")
    dev.seed(0)
    state = {"model": build_example("digits", dev).train()}
    opt = optim.AdamConfig().init()
    rng = np.random.default_rng(0)
    xt = Tensor.from_data(rng.standard_normal((8, 28, 28), dtype=np.float32))
    yt = Tensor.from_data(np.arange(8) % 10)

    def step():
        model = state["model"]
        loss = cross_entropy(model.forward(xt), yt)
        grads = optim.GradientsParams.from_grads(loss.backward(), model)
        state["model"] = opt.step(1e-3, model, grads)

    step()  # the first step creates Adam's moments
    calls, work, peak = _measure(step, gemm_counter)
    # the second convolution alone (64 -> 64, 3x3, 11x11 out of 13x13 at batch 8): with the
    # compiled kernels Winograd's F(2x2, 3x3) in one run of the 8 images, 6 x 6 tiles each, its
    # forward, weight and input gradients 16 products [288, 64] @ [64, 64] each; without them
    # channels-last, one product [968, 576] @ [576, 64] (or its transpose) for each
    winograd = jit.kernels() is not None
    conv2 = 3 * 2 * 16 * 288 * 64 * 64 if winograd else 3 * 2 * 64 * 576 * 968
    today = 127_090_688 if winograd else 227_950_592
    assert work >= conv2
    assert calls <= 26, f"{calls} matrix products in one MNIST CNN train step (5 today)"
    assert work <= 1.1 * today, f"{work:,} flops in matrix products ({today:,} today)"
    assert peak <= 1.3 * 8_632_098, f"peak {peak:,} bytes allocated in one step (8,632,098 today)"


def test_channels_last_conv2d_work_is_bounded(gemm_counter, monkeypatch):
    """A groups-1 convolution with many channels (the channels-last path, here one run of all
    4 images; the 3x3 kernel's Winograd path switched off): one product forward, one for the
    weight gradient, one per kernel offset for the input gradient (or one in all with the
    compiled col2im), with no more arithmetic than the convolution itself."""
    monkeypatch.setattr(cpu_conv, "_winograd_fits", lambda *args: False)
    step = _conv_step(32)
    step()
    calls, work, peak = _measure(step, gemm_counter)
    # forward [196, 288] @ [288, 16], weight gradient [288, 196] @ [196, 16], input gradient
    # 9 x [196, 16] @ [16, 32]: 3 * 2 * 196 * 288 * 16 = 5,419,008 flops, the minimum
    minimum = 3 * 2 * 196 * 288 * 16
    assert work >= minimum  # the counter sees every product
    assert calls <= 11, f"{calls} matrix products for one conv2d forward + backward (11 today)"
    assert work <= 1.1 * minimum, f"{work:,} flops in matrix products ({minimum:,} today)"
    assert peak <= 1.3 * 497_313, f"peak {peak:,} bytes allocated (497,313 today)"


@pytest.mark.skipif(jit.kernels() is None, reason=f"compiled kernels unavailable: {jit.unavailable_reason()}")
def test_winograd_conv2d_work_is_bounded(gemm_counter):
    """The same convolution by Winograd's F(2x2, 3x3) (the compiled kernels' transforms): the
    forward, the weight gradient and the input gradient one stacked product each, 16 products
    [64 tiles, 32] @ [32, 16] or their transposes, 2.25x fewer multiplications per output than
    the direct products (here 1.72x fewer flops: the 7x7 output is padded to 4x4 whole tiles)."""
    step = _conv_step(32)
    step()
    calls, work, peak = _measure(step, gemm_counter)
    exact = 3 * 2 * 16 * 64 * 32 * 16  # 3,145,728
    assert work >= exact  # the counter sees every product
    assert calls <= 3, f"{calls} matrix products for one conv2d forward + backward (3 today)"
    assert work <= 1.1 * exact, f"{work:,} flops in matrix products ({exact:,} today)"
    assert work < 3 * 2 * 196 * 288 * 16 / 1.7  # against the direct products' 5,419,008
    assert peak <= 1.3 * 435_650, f"peak {peak:,} bytes allocated (435,650 today)"


@pytest.mark.parametrize("blas", [1, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv2d_product_orientations_match_a_float64_reference(threads, blas, monkeypatch):
    """The forward product is formed directly with one BLAS thread and transposed with
    several: both, on one or two kernel threads, give the float64 reference's output and
    gradients to float32 rounding."""
    import engine.tensor.cpu.threads as threads_module

    monkeypatch.setattr(threads_module, "blas_threads", lambda: blas)
    from numpy.lib.stride_tricks import sliding_window_view

    rng = np.random.default_rng(3)
    xa = rng.standard_normal((3, 5, 8, 7)).astype(np.float32)
    wa = rng.standard_normal((6, 5, 3, 2)).astype(np.float32)
    ba = rng.standard_normal(6).astype(np.float32)
    ga = rng.standard_normal((3, 6, 6, 6)).astype(np.float32)
    x, w, b = (Tensor.from_data(a).require_grad() for a in (xa, wa, ba))
    set_num_threads(threads)
    try:
        y = x.conv2d(w, b)
        grads = y.backward(Tensor.from_data(ga))
    finally:
        set_num_threads(None)
    x64, w64, g64 = xa.astype(np.float64), wa.astype(np.float64), ga.astype(np.float64)
    win = sliding_window_view(x64, (3, 2), axis=(2, 3))  # [B, C, OH, OW, KH, KW]
    ref = np.einsum("bchwij,ocij->bohw", win, w64) + ba[None, :, None, None]
    ref_gw = np.einsum("bohw,bchwij->ocij", g64, win)
    ref_gx = np.zeros_like(x64)
    for i in range(3):
        for j in range(2):
            ref_gx[:, :, i:i + 6, j:j + 6] += np.einsum("bohw,oc->bchw", g64, w64[:, :, i, j])
    for got, want in ((y, ref), (x.grad(grads), ref_gx), (w.grad(grads), ref_gw), (b.grad(grads), g64.sum(axis=(0, 2, 3)))):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("blas", [1, 2, "2, count fixed"])
@pytest.mark.parametrize("threads", [1, 2])
def test_channels_last_conv2d_matches_a_float64_reference(threads, blas, monkeypatch):
    """The channels-last path (groups 1, >= 16 channels), with stride, asymmetric padding and
    dilation, its input gradient cut into runs of one image (split over the kernel threads,
    OpenBLAS held at one thread when it has several; all in the caller where BLAS has several
    threads whose count cannot be set): the float64 reference's output and gradients to
    float32 rounding, and BLAS's thread count as it was."""
    import engine.tensor.cpu.threads as threads_module
    from engine.tensor import ops_conv

    if blas == "2, count fixed":
        monkeypatch.setattr(threads_module, "one_blas_thread_possible", lambda: False)
        blas = 2
    monkeypatch.setattr(threads_module, "blas_threads", lambda: blas)
    api = threads_module._openblas_api()
    count_before = int(api[1]()) if api is not None else None
    monkeypatch.setattr(cpu_conv, "CL_CHUNK_BYTES", 1)
    calls = []
    real = cpu_conv._conv_cl
    monkeypatch.setattr(cpu_conv, "_conv_cl", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(4)
    xa = rng.standard_normal((3, 16, 9, 8)).astype(np.float32)
    wa = rng.standard_normal((17, 16, 3, 2)).astype(np.float32)
    ba = rng.standard_normal(17).astype(np.float32)
    stride, dilation, pads = (2, 1), (1, 2), ((1, 0), (2, 1))
    oh = (9 + 1 - 1 * 2 - 1) // 2 + 1
    ow = (8 + 3 - 2 * 1 - 1) // 1 + 1
    ga = rng.standard_normal((3, 17, oh, ow)).astype(np.float32)
    x, w, b = (Tensor.from_data(a).require_grad() for a in (xa, wa, ba))
    set_num_threads(threads)
    try:
        y = x.conv2d(w, b, stride=stride, padding=pads, dilation=dilation)
        grads = y.backward(Tensor.from_data(ga))
    finally:
        set_num_threads(None)
    assert calls, "the channels-last path was not taken"
    if api is not None:
        assert int(api[1]()) == count_before
    x64 = np.pad(xa.astype(np.float64), ((0, 0), (0, 0)) + pads)
    w64, g64 = wa.astype(np.float64), ga.astype(np.float64)
    ref = np.zeros((3, 17, oh, ow)) + ba[None, :, None, None]
    ref_gw = np.zeros_like(w64)
    ref_gxp = np.zeros_like(x64)
    for i in range(3):
        for j in range(2):
            hs = slice(i * dilation[0], i * dilation[0] + stride[0] * (oh - 1) + 1, stride[0])
            ws = slice(j * dilation[1], j * dilation[1] + stride[1] * (ow - 1) + 1, stride[1])
            win = x64[:, :, hs, ws]  # [B, C, OH, OW]
            ref += np.einsum("bchw,oc->bohw", win, w64[:, :, i, j])
            ref_gw[:, :, i, j] = np.einsum("bohw,bchw->oc", g64, win)
            ref_gxp[:, :, hs, ws] += np.einsum("bohw,oc->bchw", g64, w64[:, :, i, j])
    ref_gx = ref_gxp[:, :, 1:10, 2:10]
    for got, want in ((y, ref), (x.grad(grads), ref_gx), (w.grad(grads), ref_gw), (b.grad(grads), g64.sum(axis=(0, 2, 3)))):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_channels_last_gradients_have_the_same_bits_on_one_or_two_kernel_threads(monkeypatch):
    """The channels-last weight gradient sums its runs' partials in run order, so that the
    number of kernel threads does not change a bit of any result."""
    import engine.tensor.cpu.threads as threads_module
    from engine.tensor import ops_conv

    monkeypatch.setattr(threads_module, "blas_threads", lambda: 1)
    monkeypatch.setattr(cpu_conv, "CL_CHUNK_BYTES", 1)  # one image per run: 5 runs
    rng = np.random.default_rng(5)
    arrays = (rng.standard_normal((5, 16, 7, 7)).astype(np.float32),
              rng.standard_normal((16, 16, 3, 3)).astype(np.float32), rng.standard_normal(16).astype(np.float32))
    g = Tensor.from_data(rng.standard_normal((5, 16, 7, 7)).astype(np.float32))
    results = []
    for threads in (1, 2):
        x, w, b = (Tensor.from_data(a).require_grad() for a in arrays)
        set_num_threads(threads)
        try:
            y = x.conv2d(w, b, padding=1)
            grads = y.backward(g)
        finally:
            set_num_threads(None)
        results.append([y.numpy()] + [t.grad(grads).numpy() for t in (x, w, b)])
    for one, two in zip(*results):
        assert np.array_equal(one, two)
