"""Convolution, pooling and interpolation layers: values against NumPy loops, gradients
against finite differences, Burn's padding rules and initializers."""
import itertools
import math

import numpy as np
import pytest

from engine import Tensor, nn
from engine.module.param import Param
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(5)


def _conv_ref(x, w, b, stride, pads, dilation, groups):
    """Direct convolution by loops over output positions (N-d)."""
    n = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + list(pads))
    co, cig = w.shape[:2]
    k = w.shape[2:]
    out_sp = [(xp.shape[2 + i] - dilation[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    out = np.zeros((x.shape[0], co, *out_sp))
    per = co // groups
    for o in range(co):
        g = o // per
        for pos in itertools.product(*[range(s) for s in out_sp]):
            acc = np.zeros(x.shape[0])
            for kk in itertools.product(*[range(s) for s in k]):
                idx = tuple(pos[i] * stride[i] + kk[i] * dilation[i] for i in range(n))
                acc += (xp[(slice(None), slice(g * cig, (g + 1) * cig)) + idx] * w[(o, slice(None)) + kk]).sum(1)
            out[(slice(None), o) + pos] = acc + (b[o] if b is not None else 0)
    return out


def _set(m, w, b):
    m.weight = Param(w)
    if b is not None:
        m.bias = Param(b)


@pytest.mark.parametrize("padding,stride,dilation,groups", [
    ("valid", [1, 1], [1, 1], 1), ("same", [1, 1], [1, 1], 2), ("explicit", [2, 1], [1, 2], 1), ("same", [2, 2], [1, 1], 1),
])
def test_conv2d(dev64, padding, stride, dilation, groups):
    pad = {"valid": nn.PaddingConfig2d.Valid, "same": nn.PaddingConfig2d.Same,
           "explicit": nn.PaddingConfig2d.Explicit(1, 0, 2, 1)}[padding]
    conv = nn.Conv2dConfig([4, 2], [3, 2], stride=stride, dilation=dilation, groups=groups, padding=pad).init(dev64)
    x = RNG.standard_normal((2, 4, 5, 6))
    w, b = conv.weight.val().numpy(), conv.bias.val().numpy()
    pairs = pad.pairs((5, 6), (3, 2), stride)
    ref = _conv_ref(x, w, b, stride, pairs, dilation, groups)
    out = conv.forward(Tensor.from_data(x, device=dev64)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    if padding == "same" and stride == [1, 1]:
        assert out.shape[2:] == (5, 6)

    def f(xt, wt, bt):
        _set(conv, wt, bt)
        return conv.forward(xt)

    check_grads(f, x[:1, :, :4, :4], w, b, device=dev64)


def test_same_padding_is_burns():
    # size 5, kernel 2, stride 1: total 1, the extra element at the end
    assert nn.PaddingConfig2d.Same.pairs((5, 5), (2, 2), (1, 1)) == ((0, 1), (0, 1))
    # size 7, kernel 3, stride 2: out 4, total max(3*2+3-7, 0) = 2
    assert nn.PaddingConfig1d.Same.pairs((7,), (3,), (2,)) == ((1, 1),)


def test_conv1d_and_conv3d(dev64):
    c1 = nn.Conv1dConfig(2, 3, 3, stride=2, padding=nn.PaddingConfig1d.Explicit(1, 2)).init(dev64)
    x1 = RNG.standard_normal((2, 2, 7))
    ref = _conv_ref(x1, c1.weight.val().numpy(), c1.bias.val().numpy(), [2], [(1, 2)], [1], 1)
    np.testing.assert_allclose(c1.forward(Tensor.from_data(x1, device=dev64)).numpy(), ref, rtol=1e-10)
    check_grads(lambda t: c1.forward(t), x1, device=dev64)
    c3 = nn.Conv3dConfig([2, 2], [2, 2, 1], padding=nn.PaddingConfig3d.Same).init(dev64)
    x3 = RNG.standard_normal((1, 2, 3, 3, 2))
    pairs = nn.PaddingConfig3d.Same.pairs((3, 3, 2), (2, 2, 1), (1, 1, 1))
    ref = _conv_ref(x3, c3.weight.val().numpy(), c3.bias.val().numpy(), [1, 1, 1], pairs, [1, 1, 1], 1)
    np.testing.assert_allclose(c3.forward(Tensor.from_data(x3, device=dev64)).numpy(), ref, rtol=1e-10)
    check_grads(lambda t: c3.forward(t), x3, device=dev64)


def test_conv_default_init_and_groups_check():
    conv = nn.Conv2dConfig([5, 1], [5, 5]).init()
    k = math.sqrt(1 / (5 * 25))
    w = conv.weight.val().numpy()
    assert w.shape == (1, 5, 5, 5) and w.min() >= -k and w.max() <= k
    with pytest.raises(ValueError, match="Both channels must be divisible by the number of groups"):
        nn.Conv2dConfig([1, 4], [1, 1], groups=4).init()


def _conv_transpose_ref(x, w, b, stride, pad, pad_out, dilation, groups):
    n = x.ndim - 2
    ci, cog = w.shape[:2]
    k = w.shape[2:]
    full = [(x.shape[2 + i] - 1) * stride[i] + dilation[i] * (k[i] - 1) + 1 + pad_out[i] for i in range(n)]
    out = np.zeros((x.shape[0], cog * groups, *full))
    cig = ci // groups
    for c in range(ci):
        g = c // cig
        for pos in itertools.product(*[range(s) for s in x.shape[2:]]):
            for kk in itertools.product(*[range(s) for s in k]):
                idx = tuple(pos[i] * stride[i] + kk[i] * dilation[i] for i in range(n))
                out[(slice(None), slice(g * cog, (g + 1) * cog)) + idx] += x[(slice(None), c) + pos][:, None] * w[(c, slice(None)) + kk]
    crop = tuple(slice(pad[i], full[i] - pad[i]) for i in range(n))
    out = out[(slice(None), slice(None)) + crop]
    return out + b.reshape((1, -1) + (1,) * n)


@pytest.mark.parametrize("n", [1, 2])
def test_conv_transpose(dev64, n):
    if n == 1:
        m = nn.ConvTranspose1dConfig([2, 4], 3, stride=2, padding=1, padding_out=1, groups=2).init(dev64)
        x = RNG.standard_normal((2, 2, 4))
        args = ([2], [1], [1], [1], 2)
    else:
        m = nn.ConvTranspose2dConfig([2, 3], [3, 2], stride=[2, 1], padding=[1, 0], dilation=[1, 2]).init(dev64)
        x = RNG.standard_normal((2, 2, 3, 3))
        args = ([2, 1], [1, 0], [0, 0], [1, 2], 1)
    w, b = m.weight.val().numpy(), m.bias.val().numpy()
    ref = _conv_transpose_ref(x, w, b, *args)
    np.testing.assert_allclose(m.forward(Tensor.from_data(x, device=dev64)).numpy(), ref, rtol=1e-10, atol=1e-12)

    def f(xt, wt, bt):
        _set(m, wt, bt)
        return m.forward(xt)

    check_grads(f, x, w, b, device=dev64)


# ---------------------------------------------------------------------- pooling
def _pool_ref(x, k, s, pads, fn, fill):
    n = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + list(pads), constant_values=fill)
    out_sp = [(xp.shape[2 + i] - k[i]) // s[i] + 1 for i in range(n)]
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for pos in itertools.product(*[range(v) for v in out_sp]):
        win = xp[(slice(None), slice(None)) + tuple(slice(pos[i] * s[i], pos[i] * s[i] + k[i]) for i in range(n))]
        out[(slice(None), slice(None)) + pos] = fn(win.reshape(x.shape[0], x.shape[1], -1), axis=2)
    return out


@pytest.mark.parametrize("pad", ["valid", "explicit_sym", "explicit_asym", "same_odd"])
def test_max_and_avg_pool2d(dev64, pad):
    padding = {"valid": nn.PaddingConfig2d.Valid, "explicit_sym": nn.PaddingConfig2d.Explicit(1, 1, 1, 1),
               "explicit_asym": nn.PaddingConfig2d.Explicit(1, 2, 0, 1), "same_odd": nn.PaddingConfig2d.Same}[pad]
    x = RNG.standard_normal((2, 3, 5, 6))
    k, s = (3, 3), (1, 2)
    pairs = padding.pairs((5, 6), k, s)
    mp = nn.MaxPool2dConfig(list(k), strides=list(s), padding=padding).init()
    np.testing.assert_allclose(mp.forward(Tensor.from_data(x, device=dev64)).numpy(), _pool_ref(x, k, s, pairs, np.max, -np.inf))
    check_grads(mp.forward, x, device=dev64)
    ap = nn.AvgPool2dConfig(list(k), strides=list(s), padding=padding).init()
    np.testing.assert_allclose(ap.forward(Tensor.from_data(x, device=dev64)).numpy(), _pool_ref(x, k, s, pairs, np.mean, 0.0), rtol=1e-12)
    check_grads(ap.forward, x, device=dev64)


def test_pool1d_and_options(dev64):
    x = RNG.standard_normal((2, 3, 7))
    mp = nn.MaxPool1dConfig(2).init()
    np.testing.assert_allclose(mp.forward(Tensor.from_data(x, device=dev64)).numpy(), _pool_ref(x, (2,), (2,), [(0, 0)], np.max, 0))
    check_grads(mp.forward, x, device=dev64)
    ap = nn.AvgPool1dConfig(3, stride=2, padding=nn.PaddingConfig1d.Explicit(1, 1), count_include_pad=False).init()
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1)])
    ones = np.pad(np.ones_like(x), [(0, 0), (0, 0), (1, 1)])
    sums = _pool_ref(xp, (3,), (2,), [(0, 0)], np.sum, 0)
    counts = _pool_ref(ones, (3,), (2,), [(0, 0)], np.sum, 0)
    np.testing.assert_allclose(ap.forward(Tensor.from_data(x, device=dev64)).numpy(), sums / counts, rtol=1e-12)
    check_grads(ap.forward, x, device=dev64)
    ceil = nn.MaxPool1dConfig(2, ceil_mode=True).init()
    assert ceil.forward(Tensor.zeros([1, 1, 7])).shape == (1, 1, 4)
    with pytest.raises(ValueError, match="Same padding with an even kernel size is not supported"):
        nn.MaxPool2dConfig([2, 2], padding=nn.PaddingConfig2d.Same).init()
    same = nn.AvgPool2dConfig([2, 2], strides=[1, 1], padding=nn.PaddingConfig2d.Same).init()
    assert same.forward(Tensor.ones([1, 2, 5, 5])).shape == (1, 2, 5, 5)


def test_adaptive_avg_pool(dev64):
    x = RNG.standard_normal((2, 3, 7, 5))
    m = nn.AdaptiveAvgPool2dConfig([3, 2]).init()

    def bins(n, o):
        return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]

    ref = np.zeros((2, 3, 3, 2))
    for i, (a, b) in enumerate(bins(7, 3)):
        for j, (c, d) in enumerate(bins(5, 2)):
            ref[:, :, i, j] = x[:, :, a:b, c:d].mean(axis=(2, 3))
    np.testing.assert_allclose(m.forward(Tensor.from_data(x, device=dev64)).numpy(), ref, rtol=1e-12)
    check_grads(m.forward, x, device=dev64)
    m1 = nn.AdaptiveAvgPool1dConfig(3).init()
    x1 = RNG.standard_normal((2, 2, 5))
    ref1 = np.stack([x1[:, :, a:b].mean(2) for a, b in bins(5, 3)], axis=2)
    np.testing.assert_allclose(m1.forward(Tensor.from_data(x1, device=dev64)).numpy(), ref1, rtol=1e-12)


# ---------------------------------------------------------------------- interpolation
def test_interpolate_nearest_and_linear(dev64):
    x = RNG.standard_normal((1, 2, 4, 3))
    out = nn.Interpolate2dConfig(output_size=[8, 5]).init().forward(Tensor.from_data(x, device=dev64)).numpy()
    rows = [i * 4 // 8 for i in range(8)]
    cols = [j * 3 // 5 for j in range(5)]
    np.testing.assert_array_equal(out, x[:, :, rows][:, :, :, cols])
    lin = nn.Interpolate1dConfig(output_size=7, mode=nn.InterpolateMode.Linear).init()
    x1 = RNG.standard_normal((2, 3, 4))
    pos = np.arange(7) * 3 / 6
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, 3)
    fr = pos - lo
    ref = x1[:, :, lo] * (1 - fr) + x1[:, :, hi] * fr
    np.testing.assert_allclose(lin.forward(Tensor.from_data(x1, device=dev64)).numpy(), ref, rtol=1e-12)
    check_grads(lin.forward, x1, device=dev64)


@pytest.mark.parametrize("mode", ["Nearest", "NearestExact", "Linear", "Cubic"])
def test_interpolate_scale_factor_and_grads(dev64, mode):
    m = nn.Interpolate2dConfig(scale_factor=[2.0, 1.5], mode=mode).init()
    x = RNG.standard_normal((1, 2, 3, 4))
    assert m.forward(Tensor.from_data(x, device=dev64)).shape == (1, 2, 6, 6)
    check_grads(m.forward, x, device=dev64)


def test_interpolate_needs_exactly_one_size():
    for cfg in (nn.Interpolate2dConfig(), nn.Interpolate2dConfig(output_size=[4, 4], scale_factor=[2.0, 2.0])):
        with pytest.raises(ValueError, match="output_size.*scale_factor"):
            cfg.init().forward(Tensor.zeros([1, 1, 2, 2]))
    with pytest.raises(ValueError, match="Either output_size or scale_factor must be provided"):
        nn.Interpolate1dConfig().init().forward(Tensor.zeros([1, 1, 2]))
