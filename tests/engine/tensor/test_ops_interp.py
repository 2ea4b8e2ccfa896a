"""Interpolation (nearest, nearest_exact, linear, cubic) against per-pixel loops, known values and gradients."""
import math

import numpy as np
import pytest

from engine import Tensor, TensorError
from tests.engine.gradcheck import check_grads


def t64(a):
    return Tensor.from_data(a, dtype="float64")


# ---------------------------------------------------------------------- per-pixel reference
def src_pos(o, in_n, out_n, align_corners):
    if align_corners:
        return 0.0 if out_n == 1 else o * (in_n - 1) / (out_n - 1)
    return (o + 0.5) * in_n / out_n - 0.5


def keys(d, a=-0.75):
    """Keys' cubic convolution kernel at distance d."""
    d = abs(d)
    if d <= 1:
        return (a + 2) * d**3 - (a + 3) * d**2 + 1
    if d < 2:
        return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
    return 0.0


def ref_axis_weights(o, in_n, out_n, mode, align_corners):
    """{input index: weight} for output index o along one axis."""
    if mode == "nearest":
        return {min(math.floor(o * in_n / out_n), in_n - 1): 1.0}
    if mode == "nearest_exact":
        return {min(math.floor((o + 0.5) * in_n / out_n), in_n - 1): 1.0}
    if mode == "linear":
        s = max(src_pos(o, in_n, out_n, align_corners), 0.0)
        i0 = min(math.floor(s), in_n - 1)
        lam = s - i0
        res = {i0: 1.0 - lam}
        i1 = min(i0 + 1, in_n - 1)
        res[i1] = res.get(i1, 0.0) + lam
        return res
    s = src_pos(o, in_n, out_n, align_corners)
    i = math.floor(s)
    res = {}
    for j in range(i - 1, i + 3):
        k = min(max(j, 0), in_n - 1)
        res[k] = res.get(k, 0.0) + keys(s - j)
    return res


def ref_interpolate(x, out_sp, mode, align_corners):
    in_sp = x.shape[2:]
    if len(in_sp) == 1:
        out = np.zeros(x.shape[:2] + tuple(out_sp))
        for o in range(out_sp[0]):
            for i, w in ref_axis_weights(o, in_sp[0], out_sp[0], mode, align_corners).items():
                out[:, :, o] += w * x[:, :, i]
        return out
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for oh in range(out_sp[0]):
        wh = ref_axis_weights(oh, in_sp[0], out_sp[0], mode, align_corners)
        for ow in range(out_sp[1]):
            ww = ref_axis_weights(ow, in_sp[1], out_sp[1], mode, align_corners)
            for ih, a in wh.items():
                for iw, b in ww.items():
                    out[:, :, oh, ow] += a * b * x[:, :, ih, iw]
    return out


MODES = [("nearest", True), ("nearest_exact", True), ("linear", True), ("linear", False), ("cubic", True), ("cubic", False)]
SIZES_2D = [((4, 5), (7, 3)), ((3, 3), (9, 8)), ((8, 6), (3, 2)), ((1, 4), (3, 1)), ((5, 5), (5, 5)), ((2, 7), (6, 13))]


@pytest.mark.parametrize("mode,align", MODES)
@pytest.mark.parametrize("in_sp,out_sp", SIZES_2D)
def test_interpolate_2d_matches_per_pixel_loops(mode, align, in_sp, out_sp):
    x = np.random.default_rng(0).standard_normal((2, 2) + in_sp)
    y = t64(x).interpolate(out_sp, mode, align)
    assert y.shape == (2, 2) + out_sp
    np.testing.assert_allclose(y.numpy(), ref_interpolate(x, out_sp, mode, align), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode,align", MODES)
@pytest.mark.parametrize("in_n,out_n", [(5, 3), (3, 8), (6, 6), (1, 4), (4, 1)])
def test_interpolate_1d_matches_per_pixel_loops(mode, align, in_n, out_n):
    x = np.random.default_rng(1).standard_normal((2, 3, in_n))
    y = t64(x).interpolate(out_n, mode, align)
    np.testing.assert_allclose(y.numpy(), ref_interpolate(x, (out_n,), mode, align), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode,align", MODES)
@pytest.mark.parametrize("in_sp,out_sp", [((3, 4), (5, 2)), ((4, 2), (2, 5)), ((2, 3), (2, 3))])
def test_interpolate_gradients(mode, align, in_sp, out_sp):
    x = np.random.default_rng(2).standard_normal((1, 2) + in_sp)
    check_grads(lambda x: x.interpolate(out_sp, mode, align), x)
    check_grads(lambda x: x.interpolate(out_sp[1], mode, align), x[:, :, 0])


def test_linear_known_values():
    # PyTorch: F.interpolate(tensor([[[0., 1.]]]), size=4, mode="linear") -> [0, 0.25, 0.75, 1]
    # (half-pixel: sources -0.25 -> 0, 0.25, 0.75, 1.25 -> clamped to the last value)
    y = t64([[[0.0, 1.0]]]).interpolate(4, "linear", align_corners=False)
    np.testing.assert_allclose(y.numpy()[0, 0], [0.0, 0.25, 0.75, 1.0])
    # Burn's default (align corners): [[0, 1], [2, 3]] to 3x3 puts the mean of neighbours between them
    y = t64([[[[0.0, 1.0], [2.0, 3.0]]]]).interpolate((3, 3), "bilinear")
    np.testing.assert_allclose(y.numpy()[0, 0], [[0.0, 0.5, 1.0], [1.0, 1.5, 2.0], [2.0, 2.5, 3.0]])


def test_cubic_known_values():
    # [0, 1, 2, 3] to 7 with aligned corners: source o / 2. At o = 1 (source 0.5) the taps are
    # indices -1 (clamped to 0), 0, 1, 2 with weights W(1.5), W(0.5), W(0.5), W(1.5) of Keys'
    # kernel (A = -0.75): W(0.5) = (1.25 * 0.5 - 2.25) * 0.25 + 1 = 0.59375,
    # W(1.5) = ((-0.75 * 1.5 + 3.75) * 1.5 - 6) * 1.5 + 3 = -0.09375,
    # so the value is 0 * (-0.09375 + 0.59375) + 1 * 0.59375 + 2 * (-0.09375) = 0.40625.
    # Interior points of a ramp stay on it: o = 3 (source 1.5) gives 1.5.
    y = t64([[[0.0, 1.0, 2.0, 3.0]]]).interpolate(7, "cubic").numpy()[0, 0]
    np.testing.assert_allclose(y[[0, 1, 3, 6]], [0.0, 0.40625, 1.5, 3.0])
    np.testing.assert_allclose(y[5], 3.0 - 0.40625)  # mirror image at the other end


def test_nearest_known_values():
    x = t64([[[10.0, 20.0, 30.0]]])
    # legacy nearest: floor(o * 3 / 5) -> 0, 0, 1, 1, 2
    np.testing.assert_array_equal(x.interpolate(5, "nearest").numpy()[0, 0], [10, 10, 20, 20, 30])
    # nearest-exact: floor((o + 0.5) * 3 / 5) -> 0, 0, 1, 2, 2
    np.testing.assert_array_equal(x.interpolate(5, "nearest_exact").numpy()[0, 0], [10, 10, 20, 30, 30])
    # downsampling 4 -> 2 with nearest picks indices 0 and 2
    np.testing.assert_array_equal(t64([[[1.0, 2.0, 3.0, 4.0]]]).interpolate(2).numpy()[0, 0], [1.0, 3.0])


def test_nearest_upsampling_gradient_sums_the_copies():
    x = t64(np.ones((1, 1, 2, 2))).require_grad()
    g = x.interpolate((4, 6)).sum().backward()  # each input pixel is copied 2 x 3 times
    np.testing.assert_array_equal(x.grad(g).numpy(), np.full((1, 1, 2, 2), 6.0))


def test_float32_in_float32_out():
    x = Tensor.from_data(np.random.default_rng(3).standard_normal((1, 2, 4, 4)))
    for mode in ("nearest", "linear", "cubic"):
        assert x.interpolate((6, 5), mode).dtype == "float32"


def test_interpolate_errors():
    x = Tensor.zeros((1, 2, 4, 4))
    with pytest.raises(TensorError, match=r"interpolate: expected an input of rank 3 .* or 4 .*got dims \[4, 4\]"):
        Tensor.zeros((4, 4)).interpolate((2, 2))
    with pytest.raises(TensorError, match="interpolate: unknown mode 'area'"):
        x.interpolate((2, 2), "area")
    with pytest.raises(TensorError, match=r"interpolate: output_size must be 2 int\(s\) for an input of dims \[1, 2, 4, 4\]"):
        x.interpolate((2, 2, 2))
    with pytest.raises(TensorError, match="output_size must be >= 1"):
        x.interpolate((0, 2))
    with pytest.raises(TensorError, match="expected a float input, got int64"):
        Tensor.zeros((1, 2, 4), dtype="int64").interpolate(3)
    with pytest.raises(TensorError, match="align_corners must be a bool"):
        x.interpolate((2, 2), "linear", align_corners="no")
