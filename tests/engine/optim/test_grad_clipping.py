"""Gradient clipping by value and by norm (Burn's per-tensor semantics)."""
import numpy as np
import pytest

from engine import Tensor
from engine.optim import GradientClipping, GradientClippingConfig

G = np.array([[0.6294, 0.0940, 0.8176, 0.8824, 0.5228, 0.4310],
              [0.7152, 0.9559, 0.7893, 0.5684, 0.5939, 0.8883]], dtype=np.float32)


def test_clip_by_value_clamps_each_component():
    g = np.array([-2.0, -0.3, 0.0, 0.4, 3.0], dtype=np.float32)
    out = GradientClippingConfig.value(0.5).init().clip_array(g)
    np.testing.assert_array_equal(out, np.array([-0.5, -0.3, 0.0, 0.4, 0.5], dtype=np.float32))
    np.testing.assert_array_equal(g, np.array([-2.0, -0.3, 0.0, 0.4, 3.0], dtype=np.float32))  # input untouched


def test_clip_by_norm_scales_to_the_max_norm():
    norm = float(np.sqrt((G.astype(np.float64) ** 2).sum()))  # about 2.39
    out = GradientClipping.norm(2.2).clip_gradient(Tensor.from_data(G)).numpy()
    assert np.sqrt((out.astype(np.float64) ** 2).sum()) == pytest.approx(2.2, rel=1e-6)
    np.testing.assert_allclose(out, G * (2.2 / norm), rtol=1e-6)
    assert out.max() <= 0.88


def test_clip_by_norm_leaves_small_gradients_alone():
    g = np.array([[0.3, 0.4, 0.5, 0.2], [0.1, 0.6, 0.3, 0.4]], dtype=np.float32)
    np.testing.assert_array_equal(GradientClipping.norm(2.2).clip_array(g), g)


def test_bad_threshold_is_refused():
    with pytest.raises(ValueError, match="greater than 0"):
        GradientClippingConfig.norm(0.0)
