"""Convolutions and transposed convolutions against plain loop implementations, and their gradients."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Device, Tensor, TensorError
from engine.tensor.cpu import conv as cpu_conv
from tests.engine.gradcheck import check_grads


# ---------------------------------------------------------------------- loop references
def ref_conv(x, w, b, stride, pads, dilation, groups):
    """out[b, o, p] = sum_{c, k} xpad[b, g*cg + c, p*s + k*d] * w[o, c, k] (+ bias), by loops."""
    n = x.ndim - 2
    x = np.pad(x, [(0, 0), (0, 0)] + list(pads))
    batch, c_in = x.shape[:2]
    c_out, cg = w.shape[:2]
    kernel = w.shape[2:]
    og = c_out // groups
    out_sp = [(x.shape[2 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    out = np.zeros([batch, c_out] + out_sp)
    for bb, o in itertools.product(range(batch), range(c_out)):
        gi = o // og
        for pos in itertools.product(*map(range, out_sp)):
            acc = 0.0 if b is None else b[o]
            for c in range(cg):
                for k in itertools.product(*map(range, kernel)):
                    idx = tuple(pos[i] * stride[i] + k[i] * dilation[i] for i in range(n))
                    acc += x[(bb, gi * cg + c) + idx] * w[(o, c) + k]
            out[(bb, o) + pos] = acc
    return out


def ref_conv_transpose(x, w, b, stride, padding, padding_out, dilation, groups):
    """Scatter form: every input element adds x * w[c, o, k] at output position i*s - p + k*d."""
    n = x.ndim - 2
    batch, c_in = x.shape[:2]
    og = w.shape[1]
    kernel = w.shape[2:]
    cg = c_in // groups
    out_sp = [
        (x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + padding_out[i] + 1
        for i in range(n)
    ]
    out = np.zeros([batch, og * groups] + out_sp)
    for bb, c in itertools.product(range(batch), range(c_in)):
        gi = c // cg
        for pos in itertools.product(*map(range, x.shape[2:])):
            for ol in range(og):
                for k in itertools.product(*map(range, kernel)):
                    idx = tuple(pos[i] * stride[i] - padding[i] + k[i] * dilation[i] for i in range(n))
                    if all(0 <= idx[i] < out_sp[i] for i in range(n)):
                        out[(bb, gi * og + ol) + idx] += x[(bb, c) + pos] * w[(c, ol) + k]
    if b is not None:
        out += b.reshape((1, -1) + (1,) * n)
    return out


def t64(a):
    return Tensor.from_data(a, dtype="float64")


@pytest.fixture(params=["per-image products", "one large product", "channels-last", "channels-last, one image per run"])
def product_path(request, monkeypatch):
    """Run a test through each computation strategy of ops_conv (normally chosen by shape);
    the channels-last paths take every convolution with groups 1 (grouped ones keep the
    channel-major paths), the last with one image per run of the input gradient."""
    from engine.tensor import ops_conv

    monkeypatch.setattr(ops_conv, "_SMALL_K", 10**9 if request.param == "per-image products" else 0)
    monkeypatch.setattr(cpu_conv, "CL_MIN_CHANNELS", 1 if request.param.startswith("channels-last") else 10**9)
    if request.param.endswith("per run"):
        monkeypatch.setattr(cpu_conv, "CL_CHUNK_BYTES", 1)
    return request.param


CONV_CASES = [
    # n, batch, c_in, c_out, spatial, kernel, stride, padding, dilation, groups
    (1, 2, 3, 4, (7,), (3,), 1, 0, 1, 1),
    (1, 2, 4, 6, (9,), (2,), 2, 1, 2, 2),
    (1, 1, 3, 3, (6,), (3,), 1, 2, 1, 3),  # depthwise
    (2, 2, 3, 4, (5, 6), (3, 3), 1, 1, 1, 1),
    (2, 1, 4, 6, (7, 6), (3, 2), (2, 1), (1, 0), (1, 2), 2),
    (2, 2, 2, 2, (5, 5), (1, 1), 2, 0, 1, 1),
    (2, 1, 2, 3, (6, 5), (2, 3), (1, 2), ((1, 0), (2, 1)), 1, 1),  # asymmetric padding
    (3, 1, 2, 2, (4, 5, 4), (2, 3, 2), (1, 2, 1), (1, 0, 1), (2, 1, 1), 1),
    (3, 2, 4, 2, (3, 4, 4), (1, 2, 2), 1, 0, 1, 2),
]


def _pairs(padding, n):
    if isinstance(padding, int):
        return [(padding, padding)] * n
    return [p if isinstance(p, tuple) else (p, p) for p in padding]


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_matches_loops(case, product_path):
    n, batch, c_in, c_out, spatial, kernel, stride, padding, dilation, groups = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c_in) + spatial)
    w = rng.standard_normal((c_out, c_in // groups) + kernel)
    b = rng.standard_normal(c_out)
    fn = getattr(Tensor, f"conv{n}d")
    y = fn(t64(x), t64(w), t64(b), stride=stride, padding=padding, dilation=dilation, groups=groups)
    expected = ref_conv(x, w, b, _tup(stride, n), _pairs(padding, n), _tup(dilation, n), groups)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)
    # without a bias, the module-level function gives the same minus the bias
    from engine.tensor import ops_conv

    y0 = getattr(ops_conv, f"conv{n}d")(t64(x), t64(w), None, stride, padding, dilation, groups)
    np.testing.assert_allclose(y0.numpy(), expected - b.reshape((1, -1) + (1,) * n), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_gradients(case, product_path):
    n, batch, c_in, c_out, spatial, kernel, stride, padding, dilation, groups = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, c_in) + spatial)
    w = rng.standard_normal((c_out, c_in // groups) + kernel)
    b = rng.standard_normal(c_out)
    fn = getattr(Tensor, f"conv{n}d")
    check_grads(lambda x, w, b: fn(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups), x, w, b)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_parameter_gradients_without_an_input_gradient(case, product_path):
    # a first layer: the input takes no part in the graph, so only weight and bias gradients
    # are computed (by a different product in the per-image path); they equal the full ones
    n, batch, c_in, c_out, spatial, kernel, stride, padding, dilation, groups = case
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, c_in) + spatial)
    w = rng.standard_normal((c_out, c_in // groups) + kernel)
    b = rng.standard_normal(c_out)
    fn = getattr(Tensor, f"conv{n}d")
    for with_bias in (True, False):
        ts = [t64(x).require_grad(), t64(w).require_grad(), t64(b).require_grad() if with_bias else None]
        probe = None
        results = []
        for track_x in (True, False):
            xt = ts[0] if track_x else t64(x)
            y = fn(xt, ts[1], ts[2], stride=stride, padding=padding, dilation=dilation, groups=groups)
            if probe is None:
                probe = t64(rng.standard_normal(y.shape))
            grads = y.backward(probe)
            results.append([t.grad(grads).numpy() for t in ts[1:] if t is not None])
            assert xt.grad(grads) is None if not track_x else xt.grad(grads) is not None
        for full, partial in zip(*results):
            np.testing.assert_allclose(partial, full, rtol=1e-12, atol=1e-12)


def test_conv2d_same_padding_keeps_size_and_matches_explicit_pairs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 5, 6))
    w = rng.standard_normal((3, 2, 4, 3))  # even kernel height: total padding 3 = 1 before + 2 after
    y = t64(x).conv2d(t64(w), padding="same")
    assert y.shape == (1, 3, 5, 6)
    np.testing.assert_allclose(y.numpy(), ref_conv(x, w, None, (1, 1), [(1, 2), (1, 1)], (1, 1), 1), atol=1e-12)
    v = t64(x).conv2d(t64(w), padding="valid")
    assert v.shape == (1, 3, 2, 4)


def test_conv2d_known_values():
    # a 3x3 box filter over 0..15 in a 4x4 image: each output is the sum of its 3x3 window
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    y = t64(x).conv2d(t64(np.ones((1, 1, 3, 3))), t64([0.5]))
    np.testing.assert_allclose(y.numpy()[0, 0], [[45.5, 54.5], [81.5, 90.5]])


TRANSPOSE_CASES = [
    # n, batch, c_in, c_out_per_group, spatial, kernel, stride, padding, padding_out, dilation, groups
    (1, 2, 3, 2, (4,), (3,), 1, 0, 0, 1, 1),
    (1, 1, 4, 3, (5,), (3,), 2, 1, 1, 1, 2),
    (2, 2, 2, 3, (3, 4), (3, 2), (2, 1), (1, 0), (1, 0), (1, 1), 1),
    (2, 1, 4, 1, (3, 3), (2, 3), (3, 2), (0, 1), (2, 1), (1, 2), 2),
    (2, 1, 2, 2, (3, 2), (3, 3), 1, 1, 0, 2, 1),
    (3, 1, 2, 2, (2, 3, 2), (2, 2, 3), (2, 1, 2), (0, 1, 1), (1, 0, 0), 1, 1),
]


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose_forward_matches_loops(case, product_path):
    n, batch, c_in, og, spatial, kernel, stride, padding, padding_out, dilation, groups = case
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, c_in) + spatial)
    w = rng.standard_normal((c_in, og) + kernel)
    b = rng.standard_normal(og * groups)
    fn = getattr(Tensor, f"conv_transpose{n}d")
    y = fn(t64(x), t64(w), t64(b), stride=stride, padding=padding, padding_out=padding_out, dilation=dilation, groups=groups)
    expected = ref_conv_transpose(
        x, w, b, _tup(stride, n), _tup(padding, n), _tup(padding_out, n), _tup(dilation, n), groups
    )
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose_gradients(case, product_path):
    n, batch, c_in, og, spatial, kernel, stride, padding, padding_out, dilation, groups = case
    rng = np.random.default_rng(4)
    x = rng.standard_normal((batch, c_in) + spatial)
    w = rng.standard_normal((c_in, og) + kernel)
    b = rng.standard_normal(og * groups)
    fn = getattr(Tensor, f"conv_transpose{n}d")
    check_grads(
        lambda x, w, b: fn(x, w, b, stride=stride, padding=padding, padding_out=padding_out, dilation=dilation, groups=groups),
        x, w, b,
    )


def test_conv_transpose_is_the_adjoint_of_conv():
    # <conv(x), y> == <x, conv_transpose(y)> for the same weight, stride, padding, dilation
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 2, 3, 2))
    y = t64(x).conv2d(t64(w), stride=2, padding=1, dilation=(1, 2), groups=2)
    r = rng.standard_normal(y.shape)
    xt = t64(r).conv_transpose2d(t64(w), stride=2, padding=1, dilation=(1, 2), groups=2, padding_out=(0, 1))
    assert xt.shape == x.shape
    np.testing.assert_allclose((y.numpy() * r).sum(), (x * xt.numpy()).sum(), rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    c_in_g=st.integers(1, 2), groups=st.integers(1, 2), og=st.integers(1, 2),
    h=st.integers(3, 6), w_=st.integers(3, 6), kh=st.integers(1, 3), kw=st.integers(1, 3),
    s=st.tuples(st.integers(1, 3), st.integers(1, 3)), p=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    d=st.tuples(st.integers(1, 2), st.integers(1, 2)), seed=st.integers(0, 1000),
)
def test_conv2d_random_configurations(c_in_g, groups, og, h, w_, kh, kw, s, p, d, seed):
    if h + 2 * p[0] < d[0] * (kh - 1) + 1 or w_ + 2 * p[1] < d[1] * (kw - 1) + 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, c_in_g * groups, h, w_))
    w = rng.standard_normal((og * groups, c_in_g, kh, kw))
    y = t64(x).conv2d(t64(w), stride=s, padding=p, dilation=d, groups=groups)
    np.testing.assert_allclose(y.numpy(), ref_conv(x, w, None, s, [(p[0],) * 2, (p[1],) * 2], d, groups), atol=1e-12)


def test_float32_stays_float32_and_gradients_flow():
    rng = np.random.default_rng(6)
    x = Tensor.from_data(rng.standard_normal((2, 3, 6, 6))).require_grad()
    w = Tensor.from_data(rng.standard_normal((4, 3, 3, 3))).require_grad()
    b = Tensor.from_data(rng.standard_normal(4))
    y = x.conv2d(w, b, padding=1)
    assert y.dtype == "float32" and y.shape == (2, 4, 6, 6)
    assert y.is_tracked()
    grads = y.sum().backward()
    assert x.grad(grads).dtype == "float32" and x.grad(grads).shape == x.shape
    assert w.grad(grads).shape == w.shape
    assert b.grad(grads) is None  # b does not require grad
    # the sum's gradient w.r.t. the bias would be the count of output positions per channel
    b2 = Tensor.from_data(np.zeros(4)).require_grad()
    g2 = x.detach().conv2d(w.detach(), b2, padding=1).sum().backward()
    np.testing.assert_allclose(b2.grad(g2).numpy(), np.full(4, 2 * 36.0))


# ---------------------------------------------------------------------- errors
def _err(fn):
    with pytest.raises(TensorError) as info:
        fn()
    return str(info.value)


def test_errors_name_the_op_and_the_shapes():
    x = Tensor.zeros((1, 3, 5, 5))
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 4, 3, 3))))
    assert msg.startswith("conv2d: input has 3 channels, weight expects 4") and "groups 1" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 3))))
    assert "conv2d" in msg and "rank 4" in msg and "[2, 3, 3]" in msg
    msg = _err(lambda: Tensor.zeros((3, 5, 5)).conv2d(Tensor.zeros((2, 3, 3, 3))))
    assert "conv2d" in msg and "[batch, channels, height, width]" in msg and "[3, 5, 5]" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 3, 3)), Tensor.zeros((3,))))
    assert "conv2d" in msg and "bias of dims [2]" in msg and "[3]" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((3, 1, 3, 3)), groups=2))
    assert "conv2d" in msg and "groups 2" in msg
    msg = _err(lambda: Tensor.zeros((1, 4, 5, 5)).conv2d(Tensor.zeros((3, 2, 3, 3)), groups=2))
    assert "not divisible by groups 2" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 7, 3))))
    assert "conv2d" in msg and "larger than the padded input" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 3, 3)), stride=0))
    assert "stride must be >= 1" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 3, 3)), stride=(1, 2, 3)))
    assert "stride must be an int or a sequence of 2 ints" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 3, 3)), padding=-1))
    assert "padding must be >= 0" in msg
    msg = _err(lambda: x.conv2d(Tensor.zeros((2, 3, 3, 3)), padding="same", stride=2))
    assert "'same' needs stride 1" in msg
    msg = _err(lambda: Tensor.zeros((1, 3, 5, 5), dtype="int64").conv2d(Tensor.zeros((2, 3, 3, 3))))
    assert "conv2d: expected a float input" in msg
    msg = _err(lambda: Tensor.zeros((1, 3, 5)).conv1d(Tensor.zeros((2, 3, 3)), Tensor.zeros((2, 1))))
    assert msg.startswith("conv1d:")
    msg = _err(lambda: Tensor.zeros((1, 3, 4, 4, 4)).conv3d(Tensor.zeros((2, 2, 3, 3, 3))))
    assert msg.startswith("conv3d: input has 3 channels, weight expects 2")


def test_transpose_errors():
    x = Tensor.zeros((1, 3, 4, 4))
    msg = _err(lambda: x.conv_transpose2d(Tensor.zeros((4, 2, 3, 3))))
    assert msg.startswith("conv_transpose2d: input has 3 channels, weight expects 4")
    msg = _err(lambda: x.conv_transpose2d(Tensor.zeros((3, 2, 3, 3)), stride=2, padding_out=2))
    assert "padding_out must be smaller than stride or dilation" in msg
    msg = _err(lambda: x.conv_transpose2d(Tensor.zeros((3, 2, 3, 3)), groups=2))
    assert "not divisible by groups 2" in msg
    msg = _err(lambda: Tensor.zeros((1, 3, 1, 1)).conv_transpose2d(Tensor.zeros((3, 2, 1, 1)), padding=1))
    assert "output would be empty" in msg


def test_mixed_devices_are_refused():
    from engine import DeviceError

    x = Tensor.zeros((1, 2, 4, 4), device=Device("cpu"))
    w = Tensor.zeros((1, 2, 3, 3), device=Device("cpu:1"))
    with pytest.raises(DeviceError, match="conv2d"):
        x.conv2d(w)


def test_channels_last_conv2d_of_an_empty_batch():
    """Zero images through the channels-last path (groups 1, >= 16 channels): an empty output
    and input gradient, zero weight and bias gradients."""
    rng = np.random.default_rng(0)
    x = Tensor.from_data(np.zeros((0, 16, 6, 6), np.float32)).require_grad()
    w = Tensor.from_data(rng.standard_normal((16, 16, 3, 3)).astype(np.float32)).require_grad()
    b = Tensor.from_data(np.zeros(16, np.float32)).require_grad()
    y = x.conv2d(w, b, padding=1)
    assert y.shape == (0, 16, 6, 6)
    grads = y.backward(Tensor.from_data(np.ones(y.shape, np.float32)))
    assert x.grad(grads).shape == (0, 16, 6, 6)
    assert not w.grad(grads).numpy().any() and w.grad(grads).shape == (16, 16, 3, 3)
    assert not b.grad(grads).numpy().any()
