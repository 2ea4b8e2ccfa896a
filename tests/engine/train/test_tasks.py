"""Built-in tasks: shapes, labels, determinism from the seed, and the rendered digits."""
import numpy as np
import pytest

from engine.train import TASKS, build_task
from engine.train.stroke_digits import FONTS, render_digit


def test_spirals_are_two_balanced_interleaved_classes():
    t = build_task("spirals", seed=1)
    assert t.kind == "classification" and t.num_classes == 2 and t.input_shape == (2,)
    x, y = t.train.inputs, t.train.targets
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert abs((y == 0).mean() - 0.5) < 0.01
    # the classes are not linearly separable but interleave: both occupy every quadrant
    for cls in (0, 1):
        q = x[y == cls]
        assert {(bool(a > 0), bool(b > 0)) for a, b in q} == {(True, True), (True, False), (False, True), (False, False)}


def test_noisy_sine_targets_follow_sin():
    t = build_task("noisy-sine", seed=0, noise=0.1)
    resid = t.train.targets[:, 0] - np.sin(t.train.inputs[:, 0])
    assert t.kind == "regression" and abs(resid.std() - 0.1) < 0.02 and abs(resid.mean()) < 0.02


def test_copy_task_targets():
    t = build_task("copy", seq_length=6, vocab_size=7, reverse=True, n_train=50)
    np.testing.assert_array_equal(t.train.targets, t.train.inputs[:, ::-1])
    assert t.train.inputs.max() < 7 and t.num_classes == 7


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = build_task("spirals", seed=3), build_task("spirals", seed=3), build_task("spirals", seed=4)
    np.testing.assert_array_equal(a.train.inputs, b.train.inputs)
    assert not np.array_equal(a.train.inputs, c.train.inputs)


def test_digits_are_mnist_shaped_balanced_and_distinct():
    t = build_task("digits", n_train=200, n_valid=50, seed=0)
    x, y = t.train.inputs, t.train.targets
    assert x.shape == (200, 28, 28) and x.dtype == np.float32 and t.num_classes == 10
    assert np.bincount(y, minlength=10).tolist() == [20] * 10
    # MNIST scaling: background pixels are (0 - 0.1307) / 0.3081
    assert x.min() == pytest.approx(-0.1307 / 0.3081, abs=1e-5)
    assert x.max() == pytest.approx((1 - 0.1307) / 0.3081, abs=1e-5)
    # class means differ clearly from one another (each digit is drawn as itself)
    means = np.stack([x[y == k].mean(axis=0) for k in range(10)])
    d = np.sqrt(((means[:, None] - means[None]) ** 2).sum(axis=(2, 3)))
    assert d[~np.eye(10, dtype=bool)].min() > 2.0


def test_rendered_strokes_have_the_font_width_and_antialiasing():
    img = render_digit(1, FONTS[0])  # a vertical bar (plus a flag)
    row = img[20]  # below the flag: only the stem
    covered = row.sum()
    assert covered == pytest.approx(FONTS[0].width + 0.0, abs=0.6)
    assert ((row > 0) & (row < 1)).any()  # partial coverage at the edges
    shifted = render_digit(1, FONTS[0], shift=(3.0, 0.0))
    assert np.argmax(shifted[20]) == np.argmax(row) + 3


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'mnist'"):
        build_task("mnist")
    assert set(TASKS) == {"spirals", "noisy-sine", "digits", "copy"}
