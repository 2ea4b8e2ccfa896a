"""Gelu's tanh approximation (GPT-2's `gelu_new`): values and gradients against torch's
`gelu(approximate="tanh")` (numbers made once with torch 2.13, float64), finite differences,
display and transitions; `Gelu()` stays the exact form."""
import math

import numpy as np

from engine import Tensor, nn
from tests.engine.gradcheck import check_grads

X = np.array([-4.0, -2.5, -1.0, -0.3, 0.0, 0.2, 0.7, 1.5, 3.0, 5.0])
# torch.nn.functional.gelu(x, approximate="tanh") and its derivative, torch 2.13 float64
TORCH_Y = np.array([
    -7.024594819227126e-05, -0.015084266089998577, -0.1588080093917233, -0.11462907645724074, 0.0,
    0.11585142978210627, 0.5305701347051167, 1.3995715769802328, 2.996362607918227, 4.999999770820381,
])
TORCH_DY = np.array([
    -0.00033512319712218684, -0.03795157621266618, -0.08296408384578258, 0.26770454836119817, 0.5,
    0.6574581491956996, 0.976357218656104, 1.127710793151433, 1.0115841666309695, 1.000001546361988,
])


def test_tanh_gelu_matches_torch_values_and_derivative():
    gelu = nn.Gelu.tanh_approximate()
    x = Tensor.from_data(X, dtype="float64").require_grad()
    y = gelu.forward(x)
    np.testing.assert_allclose(y.numpy(), TORCH_Y, rtol=1e-12, atol=1e-15)
    dy = x.grad(y.sum().backward()).numpy()
    np.testing.assert_allclose(dy, TORCH_DY, rtol=1e-10, atol=1e-14)


def test_tanh_gelu_float32_and_gradient_by_finite_differences():
    gelu = nn.Gelu.tanh_approximate()
    y32 = gelu.forward(Tensor.from_data(X.astype(np.float32)))
    assert str(y32.dtype) == "float32"
    np.testing.assert_allclose(y32.numpy(), TORCH_Y, rtol=1e-5, atol=1e-6)
    check_grads(lambda t: gelu.forward(t), X.reshape(2, 5))


def test_tanh_gelu_differs_from_exact_and_default_is_unchanged():
    exact = nn.Gelu()
    assert exact.approximate == "none" and str(exact) == "Gelu"
    want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in X]
    np.testing.assert_allclose(exact.forward(Tensor.from_data(X, dtype="float64")).numpy(), want, rtol=1e-12,
                               atol=1e-15)
    tanh = nn.Gelu.tanh_approximate().forward(Tensor.from_data(X, dtype="float64")).numpy()
    assert np.abs(tanh - np.asarray(want)).max() > 1e-4  # a different function, not a renamed one


def test_tanh_gelu_display_and_transitions_keep_the_option():
    gelu = nn.Gelu.tanh_approximate()
    assert str(gelu) == "Gelu {approximate: tanh}"
    for moved in (gelu.clone(), gelu.valid(), gelu.train(), gelu.freeze()):
        assert moved.approximate == "tanh" and str(moved) == "Gelu {approximate: tanh}"
    assert type(gelu) is nn.Gelu and gelu.num_params() == 0
