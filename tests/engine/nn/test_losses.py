"""Losses: values against NumPy and Burn's reference numbers, gradients against finite differences."""
import math
import warnings

import numpy as np
import pytest

from engine import Tensor, TensorError, nn
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(11)
F = Tensor.from_data


def _log_softmax(x):
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


# ---------------------------------------------------------------------- cross entropy
def _ce_ref(logits, targets, pads=None, weights=None, smoothing=None):
    b, c = logits.shape
    lp = _log_softmax(logits)
    onehot = np.eye(c)[targets]
    dist = onehot * (1 - smoothing) + smoothing / c if smoothing is not None else onehot
    mask = np.ones(b) if pads is None else ~np.isin(targets, pads)
    if weights is not None:
        w = np.asarray(weights)
        return -(dist * w * lp * mask[:, None]).sum() / (w[targets] * mask).sum()
    return -(dist * lp * mask[:, None]).sum() / mask.sum()  # the mean over the non-pad rows


@pytest.mark.parametrize("pads,weights,smoothing", [
    (None, None, None), ([1, 2], None, None), (None, [1.0, 2.0, 3.0, 4.0, 5.0], None),
    (None, None, 0.05), ([1], [1.0, 2.0, 3.0, 4.0, 5.0], 0.1), ([3], None, 0.2),
])
def test_cross_entropy(pads, weights, smoothing):
    logits = RNG.standard_normal((4, 5))
    targets = np.array([2, 0, 4, 1])
    loss = nn.CrossEntropyLossConfig(pad_tokens=pads, weights=weights, smoothing=smoothing).init()
    out = loss.forward(F(logits, dtype="float64"), F(targets))
    assert out.shape == (1,)
    np.testing.assert_allclose(out.numpy()[0], _ce_ref(logits, targets, pads, weights, smoothing), rtol=1e-6)
    check_grads(lambda t: loss.forward(t, F(targets)), logits)


def test_cross_entropy_index_path_matches_the_one_hot_path():
    # plain targets take the gather path; unit class weights take the one-hot path: same loss
    # and gradient, in float32 as models train
    logits = RNG.standard_normal((6, 4)).astype(np.float32)
    targets = F(np.array([3, 3, 0, 1, 3, 2]))
    plain = nn.CrossEntropyLossConfig().init()
    one_hot = nn.CrossEntropyLossConfig(weights=[1.0, 1.0, 1.0, 1.0]).init()
    outs = []
    for loss in (plain, one_hot):
        x = F(logits).require_grad()
        out = loss.forward(x, targets)
        outs.append((out.numpy(), x.grad(out.backward()).numpy()))
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-6)
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-7)
    assert outs[0][1].dtype == np.float32


def test_cross_entropy_with_probabilities_when_smoothed():
    p = RNG.random((3, 4)) + 0.1
    p /= p.sum(1, keepdims=True)
    t = np.array([0, 3, 1])
    loss = nn.CrossEntropyLossConfig(smoothing=0.1, logits=False).init()
    dist = np.eye(4)[t] * 0.9 + 0.1 / 4
    np.testing.assert_allclose(loss.forward(F(p, dtype="float64"), F(t)).numpy()[0], -(dist * np.log(p)).sum() / 3, rtol=1e-6)
    check_grads(lambda x: loss.forward(x, F(t)), p)


def test_cross_entropy_checks():
    with pytest.raises(ValueError, match=r"should be in interval \[0, 1\]. Got 1.5"):
        nn.CrossEntropyLossConfig(smoothing=1.5).init()
    with pytest.raises(ValueError, match="Weights of cross-entropy have to be positive"):
        nn.CrossEntropyLossConfig(weights=[1.0, 0.0]).init()
    with pytest.raises(ValueError, match="target class 7 is out of range for 5 classes"):
        nn.CrossEntropyLossConfig().init().forward(Tensor.zeros([2, 5]), F([1, 7]))


def test_cross_entropy_with_pads_is_the_mean_over_the_rows_that_count():
    # the case: targets [0, 2, 1, 1], pad 2. Its logits were not given; these rows
    # have the per-row losses its numbers imply (0.2416 for row 0, 1.2886 for rows 2 and 3)
    x = F(np.array([[1.9904, 0.0, 0.0], [0.3, -1.0, 2.0], [0.0, -0.2729, 0.0], [0.0, -0.2729, 0.0]]), dtype="float64")
    t = F(np.array([0, 2, 1, 1]))
    padded = nn.CrossEntropyLossConfig(pad_tokens=[2]).init().forward(x, t).numpy()[0]
    assert padded == pytest.approx(0.9396, abs=5e-5)  # was 0.7047: the pad row counted in the mean
    weighted = nn.CrossEntropyLossConfig(pad_tokens=[2], weights=[1.0, 2.0, 3.0]).init().forward(x, t)
    assert weighted.numpy()[0] == pytest.approx(1.0792, abs=5e-5)  # was 0.6745: the pad row's weight counted


def test_cross_entropy_of_probabilities_without_smoothing():
    # the case: logits=False was ignored without smoothing (a softmax was taken: 0.7288)
    p = F(np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]]), dtype="float64")
    loss = nn.CrossEntropyLossConfig(logits=False).init().forward(p, F(np.array([0, 1])))
    assert loss.numpy()[0] == pytest.approx(-(math.log(0.7) + math.log(0.8)) / 2, rel=1e-12)
    assert loss.numpy()[0] == pytest.approx(0.2899, abs=5e-5)


def test_pad_rows_change_neither_the_loss_nor_the_gradient_of_the_other_rows():
    # what training sees: appending padded rows to a batch leaves the step as it was
    x = RNG.standard_normal((5, 4))
    t = np.array([3, 0, 1, 1, 2])
    junk = RNG.standard_normal((3, 4)) * 5.0
    for cfg in (dict(), dict(weights=[0.5, 1.0, 2.0, 4.0]), dict(smoothing=0.2), dict(weights=[1.0, 3.0, 1.0, 2.0], smoothing=0.1)):
        plain = nn.CrossEntropyLossConfig(pad_tokens=[9], **cfg).init()  # 9 is no target here
        padded = nn.CrossEntropyLossConfig(pad_tokens=[-100, 9], **cfg).init()
        xa = F(x, dtype="float64").require_grad()
        la = plain.forward(xa, F(t))
        ga = xa.grad(la.backward()).numpy()
        xb = F(np.concatenate([x[:2], junk, x[2:]]), dtype="float64").require_grad()
        lb = padded.forward(xb, F(np.array([3, 0, -100, 9, -100, 1, 1, 2])))
        gb = xb.grad(lb.backward()).numpy()
        np.testing.assert_allclose(lb.numpy(), la.numpy(), rtol=1e-12, err_msg=str(cfg))
        np.testing.assert_allclose(np.concatenate([gb[:2], gb[5:]]), ga, rtol=1e-12, atol=1e-15, err_msg=str(cfg))
        assert not gb[2:5].any()


@pytest.mark.parametrize("logits", [True, False])
@pytest.mark.parametrize("smoothing", [None, 0.3])
def test_cross_entropy_with_every_row_a_pad_is_zero(logits, smoothing):
    # documented choice: no row counts -> loss 0 and a zero gradient (PyTorch gives nan)
    x = np.full((3, 4), 0.25) if not logits else RNG.standard_normal((3, 4))
    loss = nn.CrossEntropyLossConfig(pad_tokens=[0, 2], weights=[1.0, 2.0, 3.0, 4.0], smoothing=smoothing,
                                     logits=logits).init()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xt = F(x, dtype="float64").require_grad()
        out = loss.forward(xt, F(np.array([2, 0, 2])))
        grad = xt.grad(out.backward()).numpy()
        empty = loss.forward(F(np.zeros((0, 4)), dtype="float64"), F(np.zeros(0, dtype=np.int64)))
    assert out.numpy().tolist() == [0.0] and not grad.any()
    assert empty.numpy().tolist() == [0.0]


@pytest.mark.parametrize("pads,weights,smoothing", [
    ([2], None, None), ([0, 2], None, None), ([2], [0.5, 1.5, 2.0, 3.0], None), (None, [0.5, 1.5, 2.0, 3.0], None),
    ([1, 3], [0.5, 1.5, 2.0, 3.0], 0.25), ([3], None, 0.1),
])
@pytest.mark.parametrize("logits", [True, False])
def test_cross_entropy_gradients_against_finite_differences(pads, weights, smoothing, logits):
    t = np.array([2, 0, 1, 3, 2, 1])
    x = RNG.standard_normal((6, 4))
    if not logits:
        x = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    loss = nn.CrossEntropyLossConfig(pad_tokens=pads, weights=weights, smoothing=smoothing, logits=logits).init()
    check_grads(lambda v: loss.forward(v, F(t)), x)


def _ce_ref_grad(x, targets, pads, weights, smoothing, logits):
    """The gradient of `_ce_ref` (float64): (softmax * sum_c D - D) / denom for logits, -D / (p
    denom) for probabilities, with D the rows' target distributions times the class weights."""
    b, c = x.shape
    d = np.eye(c)[targets]
    if smoothing is not None:
        d = d * (1 - smoothing) + smoothing / c
    keep = np.ones(b) if pads is None else (~np.isin(targets, pads)).astype(float)
    w = np.ones(c) if weights is None else np.asarray(weights, dtype=np.float64)
    big_d = d * w * keep[:, None]
    denom = (w[targets] * keep).sum()
    if logits:
        p = np.exp(_log_softmax(x))
        return (p * big_d.sum(1, keepdims=True) - big_d) / denom
    return -big_d / (x * denom)


@pytest.mark.parametrize("logits", [True, False])
def test_float64_cross_entropy_with_weights_or_smoothing_is_float64_accurate(logits):
    """Class weights and the smoothing in the input's precision: float64 logits got a loss and a
    gradient only float32-accurate (weights stored as float32, the smoothing rounded through
    np.float32): ~1e-8 relative here, where a float64 reference agrees to 1e-13."""
    rng = np.random.default_rng(43)
    worst = 0.0
    for case in range(24):
        b, c = int(rng.integers(2, 7)), int(rng.integers(2, 6))
        x = rng.standard_normal((b, c)) * 3
        if not logits:
            x = np.exp(_log_softmax(x))
        t = rng.integers(0, c, b)
        weights = (rng.random(c) * 3 + 0.1).tolist() if case % 3 != 1 else None
        smoothing = (float(rng.random()) * 0.9 + 0.01) if case % 3 != 0 else None
        pads = [int(t[0])] if case % 4 == 3 and b > 2 and (t != t[0]).any() else None
        loss = nn.CrossEntropyLossConfig(pad_tokens=pads, weights=weights, smoothing=smoothing, logits=logits).init()
        xt = F(x, dtype="float64").require_grad()
        out = loss.forward(xt, F(t))
        grad = xt.grad(out.backward()).numpy()
        ref = _ce_ref(np.log(x) if not logits else x, t, pads, weights, smoothing)
        ref_grad = _ce_ref_grad(x, t, pads, weights, smoothing, logits)
        assert out.dtype == "float64" and grad.dtype == np.float64
        worst = max(worst, abs(out.numpy()[0] - ref) / abs(ref))
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-11, atol=1e-14, err_msg=f"case {case}")
    assert worst < 1e-12, worst


def test_cross_entropy_of_probabilities_with_zero_entries():
    # a zero probability off the target counts for nothing without smoothing (no 0 * log 0)
    p = np.array([[0.9, 0.1, 0.0], [0.0, 1.0, 0.0]])
    loss = nn.CrossEntropyLossConfig(logits=False, pad_tokens=[7]).init()
    x = F(p, dtype="float64").require_grad()
    out = loss.forward(x, F(np.array([0, 1])))
    grad = x.grad(out.backward()).numpy()
    assert out.numpy()[0] == pytest.approx(-math.log(0.9) / 2, rel=1e-12)
    np.testing.assert_allclose(grad, [[-1 / 0.9 / 2, 0, 0], [0, -0.5, 0]], rtol=1e-12)


def test_cross_entropy_pad_tokens_and_range_checks():
    loss = nn.CrossEntropyLossConfig(pad_tokens=[-100]).init()
    x = F(RNG.standard_normal((3, 4)), dtype="float64")
    kept = nn.CrossEntropyLossConfig().init().forward(F(x.numpy()[1:], dtype="float64"), F([1, 3]))
    assert loss.forward(x, F([-100, 1, 3])).numpy()[0] == pytest.approx(kept.numpy()[0], rel=1e-12)
    with pytest.raises(TensorError, match=r"target class 4 is out of range for 4 classes at row 2 of the "
                                          r"targets \(expected 0 <= target < 4, or a pad token \[-100\]\)"):
        loss.forward(x, F([-100, 1, 4]))
    with pytest.raises(TensorError, match=r"target class -1 is out of range for 4 classes at row 0"):
        loss.forward(x, F([-1, 1, 3]))
    with pytest.raises(TensorError, match=r"expected one class weight per class \(4\), got 3 weights"):
        nn.CrossEntropyLossConfig(weights=[1.0, 2.0, 3.0]).init().forward(x, F([0, 1, 2]))


# ---------------------------------------------------------------------- binary cross entropy
SIG_IN = [0.8271, 0.9626, 0.3796, 0.2355]


def test_binary_cross_entropy_burn_values():
    x = F(SIG_IN)
    t = F([0, 1, 0, 1])
    cfg = nn.BinaryCrossEntropyLossConfig
    np.testing.assert_allclose(cfg().init().forward(x.sigmoid(), t).numpy(), [0.7491], rtol=1e-4)
    np.testing.assert_allclose(cfg(logits=True).init().forward(x, t).numpy(), [0.7491], rtol=1e-4)
    np.testing.assert_allclose(cfg(weights=[3.0, 7.0]).init().forward(x.sigmoid(), t).numpy(), [3.1531], rtol=1e-4)
    np.testing.assert_allclose(cfg(smoothing=0.1).init().forward(x.sigmoid(), t).numpy(), [0.7490], rtol=1e-4)
    xm = F([[0.5150, 0.3097, 0.7556], [0.4974, 0.9879, 0.1564]])
    tm = F([[1, 0, 1], [1, 0, 0]])
    np.testing.assert_allclose(cfg(logits=True).init().forward(xm, tm).numpy(), [0.7112], rtol=1e-4)
    np.testing.assert_allclose(cfg(logits=True, weights=[3.0, 7.0, 0.9]).init().forward(xm, tm).numpy(), [3.1708], rtol=1e-4)
    np.testing.assert_allclose(cfg(smoothing=0.1).init().forward(xm.sigmoid(), tm).numpy(), [0.7228], rtol=1e-4)
    np.testing.assert_allclose(cfg().init().forward(F([0.0, 1.0, 0.0, 1.0]), F([1, 0, 1, 0])).numpy(), [100.0])
    np.testing.assert_allclose(cfg().init().forward(F([1.0, 0.0, 1.0, 0.0]), F([1, 0, 1, 0])).numpy(), [0.0])


@pytest.mark.parametrize("logits", [True, False])
def test_binary_cross_entropy_grads(logits):
    x = RNG.standard_normal((3, 4)) if logits else RNG.uniform(0.1, 0.9, (3, 4))
    t = (RNG.random((3, 4)) > 0.5).astype(np.int64)
    loss = nn.BinaryCrossEntropyLossConfig(logits=logits, weights=[1.0, 2.0, 0.5, 3.0], smoothing=0.1).init()
    ts = t * 0.9 + 0.1 / 4
    p = 1 / (1 + np.exp(-x)) if logits else x
    ref = (-(ts * np.log(p) + (1 - ts) * np.log(1 - p)) * np.array([1.0, 2.0, 0.5, 3.0])).mean()
    np.testing.assert_allclose(loss.forward(F(x, dtype="float64"), F(t)).numpy()[0], ref, rtol=1e-6)
    check_grads(lambda a: loss.forward(a, F(t)), x)


# ---------------------------------------------------------------------- regression
def test_mse():
    a, b = F([[1.0, 2.0], [3.0, 4.0]]), F([[2.0, 1.0], [3.0, 2.0]])
    m = nn.MseLoss()
    np.testing.assert_array_equal(m.forward_no_reduction(a, b).numpy(), [[1.0, 1.0], [0.0, 4.0]])
    np.testing.assert_array_equal(m.forward(a, b, nn.Reduction.Auto).numpy(), [1.5])
    np.testing.assert_array_equal(m.forward(a, b, nn.Reduction.Sum).numpy(), [6.0])
    check_grads(lambda x, y: m.forward(x, y), RNG.standard_normal((3, 2)), RNG.standard_normal((3, 2)))


def test_huber():
    m = nn.HuberLossConfig(0.5).init()
    p, t = F([-2.0, -0.5, 0.0, 0.3, 1.0]), F([0.0] * 5)
    np.testing.assert_allclose(m.forward_no_reduction(p, t).numpy(), [0.875, 0.125, 0.0, 0.045, 0.375], rtol=1e-6)
    np.testing.assert_allclose(m.forward(p, t).numpy(), [0.284], rtol=1e-5)
    np.testing.assert_allclose(m.forward(p, t, "sum").numpy(), [1.42], rtol=1e-5)
    pr = F([-2.0, -0.5, 0.0, 0.3, 1.0]).require_grad()
    g = pr.grad(m.forward_no_reduction(pr, t).sum().backward()).numpy()
    np.testing.assert_allclose(g, [-0.5, -0.5, 0.0, 0.3, 0.5], rtol=1e-6)
    check_grads(lambda x: m.forward(x, F([0.0] * 4, dtype="float64")), np.array([-2.1, -0.2, 0.3, 1.3]))
    with pytest.raises(ValueError, match="Delta for Huber loss must be a non-negative number"):
        nn.HuberLossConfig(-1.0).init()


def test_smooth_l1():
    m = nn.SmoothL1LossConfig().init()
    out = m.forward(F([0.5, 1.5, 3.0, -3.0]), F([0.0] * 4))
    np.testing.assert_allclose(out.numpy(), [0.125, 1.0, 2.5, 2.5])
    np.testing.assert_allclose(m.forward_with_reduction(F([[0.5, 2.0]]), F([[0.0, 0.0]])).numpy(), [0.8125])
    r = nn.SmoothL1LossConfig(beta=2.0).init().forward_reduce_dims(F([[0.0, 1.0, 4.0], [0.0, 0.0, 0.0]]), Tensor.zeros([2, 3]), [1])
    np.testing.assert_allclose(r.numpy(), [[3.25 / 3], [0.0]], rtol=1e-6)
    check_grads(lambda x: m.forward_with_reduction(x, F([0.0] * 4, dtype="float64")), np.array([0.3, -0.6, 1.7, -2.2]))
    with pytest.raises(ValueError, match="The parameter beta must be positive"):
        nn.SmoothL1LossConfig(0.0).init()


def test_kl_div():
    p, t = F([[-1.0, -0.5], [-2.0, -0.2]]), F([[0.4, 0.6], [0.1, 0.9]])
    m = nn.KLDivLossConfig().init()
    np.testing.assert_allclose(m.forward_no_reduction(p, t).numpy(),
                               [[0.0334837139, -0.0064953566], [-0.0302585065, 0.0851755068]], atol=1e-6)
    np.testing.assert_allclose(m.forward(p, t, "sum").numpy(), [0.08191], atol=1e-5)
    np.testing.assert_allclose(m.forward(p, t).numpy(), [0.04095], atol=1e-5)
    lt = nn.KLDivLossConfig(log_target=True).init()
    np.testing.assert_allclose(lt.forward(F([-1.0, -2.0]), F([-0.5, -1.5])).numpy(), [0.207415204965], atol=1e-6)
    tt = np.array([[0.4, 0.6], [0.1, 0.9]])
    check_grads(lambda x: m.forward(x, F(tt, dtype="float64")), np.array([[-1.0, -0.5], [-2.0, -0.2]]))
    check_grads(lambda x, y: lt.forward(x, y, "mean"), RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3)))


# ---------------------------------------------------------------------- embedding / ranking
def test_cosine_embedding():
    a = F([[1.0, 0.0], [0.0, 1.0]])
    m = nn.CosineEmbeddingLossConfig().init()
    np.testing.assert_allclose(m.forward_no_reduction(a, a, F([1, -1])).numpy(), [0.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(nn.CosineEmbeddingLossConfig(margin=0.5).init().forward(a, a, F([-1, -1])).numpy(), [0.5])
    s = nn.CosineEmbeddingLossConfig(reduction=nn.Reduction.Sum).init()
    np.testing.assert_allclose(s.forward(a, a, F([-1, -1])).numpy(), [2.0])
    x1, x2 = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    t = np.array([1, -1, 1, -1])
    cos = (x1 * x2).sum(1) / np.linalg.norm(x1, axis=1) / np.linalg.norm(x2, axis=1)
    ref = np.where(t == 1, 1 - cos, np.maximum(cos - 0.1, 0)).mean()
    m2 = nn.CosineEmbeddingLossConfig(margin=0.1).init()
    np.testing.assert_allclose(m2.forward(F(x1, dtype="float64"), F(x2, dtype="float64"), F(t)).numpy()[0], ref, rtol=1e-6)
    check_grads(lambda p, q: m2.forward(p, q, F(t)), x1, x2)


def test_margin_ranking():
    m = nn.MarginRankingLossConfig(margin=0.5).init()
    a, b, t = F([1.0, 2.0, 3.0]), F([2.0, 1.0, 0.5]), F([1.0, -1.0, 1.0])
    np.testing.assert_allclose(m.forward_no_reduction(a, b, t).numpy(), [1.5, 1.5, 0.0])
    np.testing.assert_allclose(m.forward(a, b, t).numpy(), [1.0])
    check_grads(lambda x, y: m.forward(x, y, F([1.0, -1.0, 1.0], dtype="float64")), np.array([1.0, 2.0, 3.3]),
                np.array([2.0, 1.0, 0.5]))


def test_triplet_margin():
    m = nn.TripletMarginLossConfig().init()
    a, p, n = F([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), F([[1.0, 1.0], [1.0, 2.0], [0.0, 0.0]]), F([[1.0, 0.0], [0.0, 0.0], [5.0, 0.0]])
    np.testing.assert_allclose(m.forward_no_reduction(a, p, n).numpy(), [1.414214, 0.585786, 0.0], atol=1e-6)
    np.testing.assert_allclose(m.forward(a, p, n, "sum").numpy(), [2.0], atol=1e-6)
    check_grads(lambda x, y, z: m.forward(x, y, z), RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4)),
                RNG.standard_normal((3, 4)))


def test_gaussian_nll():
    m = nn.GaussianNLLLossConfig().init()
    x, t, v = F([1.0, 2.0]), F([1.5, 1.0]), F([0.5, 1.0])
    np.testing.assert_allclose(m.forward_no_reduction(x, t, v).numpy(), [-0.096574, 0.5], atol=1e-6)
    np.testing.assert_allclose(m.forward(x, t, v).numpy(), [0.201713], atol=1e-6)
    full = nn.GaussianNLLLossConfig(full=True).init()
    np.testing.assert_allclose(full.forward_no_reduction(x, t, v).numpy(), [0.822365, 1.418939], atol=1e-6)
    check_grads(lambda a, b, c: full.forward(a, b, c), RNG.standard_normal(4), RNG.standard_normal(4), RNG.uniform(0.5, 2, 4))


def test_poisson_nll():
    p, t = F([0.0, 0.0, -40.0, 1.0, 2.0, 3.0]), F([1.0, 4.5, 2.5, 0.0, 0.0, 2.0])
    m = nn.PoissonNllLossConfig().init()
    np.testing.assert_allclose(m.forward_no_reduction(p, t).numpy(), [1.0, 1.0, 100.0, 2.7183, 7.3891, 14.0855], atol=1e-4)
    np.testing.assert_allclose(m.forward(p, t, "sum").numpy(), [126.1929], rtol=1e-5)
    full = nn.PoissonNllLossConfig(full=True).init()
    np.testing.assert_allclose(full.forward_no_reduction(p, t).numpy(), [1.0, 4.9393, 101.1678, 2.7183, 7.3891, 14.7373], atol=1e-4)
    nolog = nn.PoissonNllLossConfig(log_input=False).init()
    out = nolog.forward_no_reduction(F([0.0, 0.5, 1.0, 1.0, 2.71828, 7.38905, 20.0855]), F([2.0, 3.0, 1.0, 4.5, 0.0, 0.0, 2.0]))
    np.testing.assert_allclose(out.numpy(), [36.84136, 2.579441, 1.0, 1.0, 2.71828, 7.38905, 14.0855], rtol=1e-5)
    tt = np.array([1.0, 4.5, 2.5, 0.0])
    check_grads(lambda a: full.forward(a, F(tt, dtype="float64")), np.array([0.1, -0.3, 0.5, 1.0]))
    with pytest.raises(ValueError, match="All the values of `targets` must be non-negative"):
        m.forward(F([0.0]), F([-0.5]))
    with pytest.raises(ValueError, match="eps for PoissonNllLoss must be a positive number"):
        nn.PoissonNllLossConfig(eps=0.0).init()


def test_hinge_embedding():
    m = nn.HingeEmbeddingLossConfig().init()
    x, t = F([0.5, 2.0, 1.5]), F([1.0, -1.0, -1.0])
    np.testing.assert_allclose(m.forward_no_reduction(x, t).numpy(), [0.5, 0.0, 0.0])
    tt = np.array([1.0, -1.0, -1.0, 1.0])
    xs = np.array([0.5, 0.3, -0.4, 1.2])
    np.testing.assert_allclose(m.forward(F(xs, dtype="float64"), F(tt)).numpy()[0], np.where(tt == 1, xs, np.maximum(0, 1 - xs)).mean())
    check_grads(lambda a: m.forward(a, F(tt, dtype="float64")), xs)


@pytest.mark.parametrize("p,expected", [(1, [0.3, 0.1]), (2, [0.136667, 0.015])])
def test_multi_margin(p, expected):
    m = nn.MultiMarginLossConfig(p=p).init()
    x = F([[0.1, 0.2, 0.7], [0.9, 0.05, 0.05]])
    np.testing.assert_allclose(m.forward_no_reduction(x, F([2, 0])).numpy(), expected, atol=1e-6)
    xs = RNG.standard_normal((3, 4)) * 0.3
    check_grads(lambda a: m.forward(a, F([1, 3, 0])), xs)
    with pytest.raises(ValueError, match="only supports p = 1 or p = 2, got 3"):
        nn.MultiMarginLossConfig(p=3).init()


def test_soft_margin():
    m = nn.SoftMarginLoss()
    x, t = F([[0.5, -1.0], [2.0, -0.5]]), F([[1.0, -1.0], [-1.0, 1.0]])
    np.testing.assert_allclose(m.forward_no_reduction(x, t).numpy(), [[0.474077, 0.313262], [2.126928, 0.974077]], atol=1e-6)
    np.testing.assert_allclose(m.forward(x, t).numpy(), [0.972086], atol=1e-6)
    check_grads(lambda a: m.forward(a, F([[1.0, -1.0], [-1.0, 1.0]], dtype="float64")), RNG.standard_normal((2, 2)))


def test_reduction_not_supported():
    with pytest.raises(ValueError, match="BatchMean reduction is not supported"):
        nn.MseLoss().forward(F([1.0]), F([2.0]), nn.Reduction.BatchMean)
