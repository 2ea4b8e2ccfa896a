"""Metrics on known batches, and the loop's losses against finite differences."""
import numpy as np
import pytest

from engine import Tensor, TensorError
from engine.train import AccuracyMetric, CustomMetric, LossMetric, TopKAccuracyMetric, cross_entropy, mse_loss
from tests.engine.gradcheck import check_grads

LOGITS = np.array([[2.0, 1.0, 0.1], [0.2, 0.3, 3.0], [1.0, 2.0, 0.5], [0.0, 0.1, 0.2]], dtype=np.float32)
TARGETS = np.array([0, 2, 0, 1])


def test_accuracy_and_top_k_over_batches():
    acc, top2, loss = AccuracyMetric(), TopKAccuracyMetric(2), LossMetric()
    for sl, l in ((slice(0, 3), 1.0), (slice(3, 4), 3.0)):
        out, y = Tensor.from_data(LOGITS[sl]), Tensor.from_data(TARGETS[sl])
        for m in (acc, top2, loss):
            m.update(out, y, l)
    assert acc.value() == pytest.approx(2 / 4)  # rows 0 and 1 right
    assert top2.value() == pytest.approx(4 / 4)  # row 2: 0 is second; row 3: 1 is second
    assert loss.value() == pytest.approx((1.0 * 3 + 3.0 * 1) / 4)  # weighted by items
    acc.reset()
    assert np.isnan(acc.value())


def test_sequence_accuracy_skips_padding():
    out = Tensor.from_data(np.eye(3, dtype=np.float32)[[[0, 1, 2], [2, 2, 1]]])  # [2, 3, 3]
    y = Tensor.from_data(np.array([[0, 1, 0], [2, 1, 0]]))
    m = AccuracyMetric(pad_token=0)
    m.update(out, y)
    assert m.value() == pytest.approx(2 / 3)  # positions with targets 1, 2, 1: right, right, wrong


def test_custom_metric_and_shape_errors():
    mae = CustomMetric("mae", lambda o, t: float(np.abs(o - t).mean()), higher_is_better=False)
    mae.update(Tensor.from_data([[1.0], [3.0]]), Tensor.from_data([[0.0], [0.0]]))
    assert mae.value() == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"expected targets of dims \[4\]"):
        AccuracyMetric().update(Tensor.from_data(LOGITS), Tensor.from_data(np.zeros((4, 1), dtype=np.int64)))


def test_cross_entropy_value_and_gradient():
    got = float(cross_entropy(Tensor.from_data(LOGITS), Tensor.from_data(TARGETS)))
    x = LOGITS.astype(np.float64)
    ref = np.mean(np.log(np.exp(x).sum(1)) - x[np.arange(4), TARGETS])
    assert got == pytest.approx(ref, rel=1e-6)
    y = Tensor.from_data(TARGETS)
    check_grads(lambda t: cross_entropy(t, y), np.random.default_rng(0).normal(size=(4, 3)))
    y3 = Tensor.from_data(np.array([[0, 2], [1, 0]]))
    check_grads(lambda t: cross_entropy(t, y3, pad_token=0), np.random.default_rng(1).normal(size=(2, 2, 3)))


def test_cross_entropy_checks_the_targets_that_are_not_pads():
    # a target outside the classes is an error with a pad token too (-1 read the last class)
    x = Tensor.from_data(LOGITS)
    with pytest.raises(TensorError, match=r"class index -1 is out of range for 3 classes at item 0 of the "
                                          r"flattened targets \(expected 0 <= target < 3, or the pad token 5\)"):
        cross_entropy(x, Tensor.from_data(np.array([-1, 2, 0, 1])), pad_token=5)
    with pytest.raises(TensorError, match=r"class index 7 is out of range for 3 classes at item 2"):
        cross_entropy(x, Tensor.from_data(np.array([0, 2, 7, 1])), pad_token=-100)
    # the pad token itself need not be a class; padded items leave the mean over the others
    padded = float(cross_entropy(x, Tensor.from_data(np.array([0, -100, 0, -100])), pad_token=-100))
    kept = float(cross_entropy(Tensor.from_data(LOGITS[[0, 2]]), Tensor.from_data(np.array([0, 0]))))
    assert padded == pytest.approx(kept, rel=1e-6)


def test_mse_value_and_gradient():
    t = Tensor.from_data(np.array([[1.0], [2.0]], dtype=np.float64), dtype="float64")
    assert float(mse_loss(Tensor.from_data([[0.0], [4.0]], dtype="float64"), t)) == pytest.approx((1 + 4) / 2)
    check_grads(lambda o: mse_loss(o, t), np.array([[0.3], [-1.2]]))
