"""Linear, Embedding, Dropout, the norms and the misc layers: values against NumPy, gradients
against finite differences, and Burn's initializers and behaviours."""
import math

import numpy as np
import pytest

from engine import Tensor, nn
from engine.module.init import Initializer
from engine.module.param import Param
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(3)


def T(a, dev):
    return Tensor.from_data(np.asarray(a, dtype=np.float64), device=dev)


# ---------------------------------------------------------------------- Linear
def test_linear_values_and_grads(dev64):
    lin = nn.LinearConfig(3, 4).init(dev64)
    assert lin.weight.shape == (3, 4) and lin.bias.shape == (4,)
    x = RNG.standard_normal((2, 5, 3))
    w, b = lin.weight.val().numpy(), lin.bias.val().numpy()
    np.testing.assert_allclose(lin.forward(T(x, dev64)).numpy(), x @ w + b, rtol=1e-12)

    def f(xt, wt, bt):
        lin.weight, lin.bias = Param(wt), Param(bt)
        return lin.forward(xt)

    check_grads(f, x, w, b, device=dev64)


def test_linear_default_init_is_kaiming_uniform_within_sqrt_one_over_d_input():
    lin = nn.LinearConfig(64, 256).init()
    k = math.sqrt(1 / 64)
    w = lin.weight.val().numpy()
    assert w.min() >= -k and w.max() <= k
    # uniform on [-k, k]: std k / sqrt(3)
    assert abs(w.std() - k / math.sqrt(3)) < 0.05 * k
    assert lin.bias.val().numpy().max() <= k


def test_linear_1d_input_and_config_builders(dev64):
    cfg = nn.LinearConfig(2, 3).with_bias(False).with_initializer(Initializer.KaimingUniform(gain=1.0, fan_out_only=False))
    lin = cfg.init(dev64)
    assert lin.bias is None
    out = lin.forward(T([1.0, 2.0], dev64))
    assert out.shape == (3,)


# ---------------------------------------------------------------------- Embedding
def test_embedding_values_and_grads(dev64):
    emb = nn.EmbeddingConfig(6, 3).init(dev64)
    w = emb.weight.val().numpy()
    idx = Tensor.from_data([[0, 2, 2], [5, 1, 0]], device=dev64)
    np.testing.assert_array_equal(emb.forward(idx).numpy(), w[idx.numpy()])

    def f(wt):
        emb.weight = Param(wt)
        return emb.forward(idx)

    check_grads(f, w, device=dev64)


def test_embedding_default_init_is_standard_normal():
    w = nn.EmbeddingConfig(200, 50).init().weight.val().numpy()
    assert abs(w.mean()) < 0.05 and abs(w.std() - 1) < 0.05


def test_embedding_rejects_out_of_range_index():
    emb = nn.EmbeddingConfig(4, 2).init()
    with pytest.raises(ValueError, match="index 4 is out of range for 4 embeddings"):
        emb.forward(Tensor.from_data([[4]]))


# ---------------------------------------------------------------------- Dropout
def test_dropout_trains_on_autodiff_inputs_only():
    drop = nn.DropoutConfig(0.5).init()
    x = Tensor.ones([100, 100])
    assert drop.forward(x) is x  # no autodiff: inference
    y = drop.forward(x.autodiff()).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0}
    assert 0.45 < (y == 0).mean() < 0.55
    assert drop.valid().forward(x.autodiff()) is not None
    np.testing.assert_array_equal(drop.valid().forward(x.autodiff()).numpy(), x.numpy())
    np.testing.assert_array_equal(drop.freeze().forward(x.autodiff()).numpy(), x.numpy())


def test_dropout_gradient_scales_kept_entries():
    x = Tensor.ones([50, 50]).require_grad()
    y = nn.DropoutConfig(0.2).init().forward(x)
    g = x.grad(y.sum().backward()).numpy()
    np.testing.assert_allclose(g, y.numpy())


def test_dropout_probability_checked():
    with pytest.raises(ValueError, match="Dropout probability should be between 0 and 1, but got -10"):
        nn.DropoutConfig(-10.0).init()


# ---------------------------------------------------------------------- norms
def _norm(x, axes, eps):
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    return (x - m) / np.sqrt(v + eps)


def test_layer_norm_burn_values():
    ln = nn.LayerNormConfig(10).init()
    x = Tensor.from_data([[-0.6897, -2.7106, 2.2222, -1.0330, -0.8933, 1.1765, 0.0601, 1.5252, -0.3630, 0.6728]])
    expected = [[-0.4990, -1.9680, 1.6178, -0.7486, -0.6470, 0.8576, 0.0461, 1.1111, -0.2614, 0.4915]]
    np.testing.assert_allclose(ln.forward(x).numpy(), expected, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_values_and_grads(dev64, bias):
    ln = nn.LayerNormConfig(5, epsilon=1e-3, bias=bias).init(dev64)
    x = RNG.standard_normal((2, 3, 5))
    g = RNG.standard_normal(5)
    b = RNG.standard_normal(5)
    ln.gamma = Param(T(g, dev64))
    if bias:
        ln.beta = Param(T(b, dev64))
    ref = _norm(x, -1, 1e-3) * g + (b if bias else 0)
    np.testing.assert_allclose(ln.forward(T(x, dev64)).numpy(), ref, rtol=1e-10)

    def f(xt, gt, bt):
        ln.gamma = Param(gt)
        if bias:
            ln.beta = Param(bt)
        return ln.forward(xt)

    check_grads(f, x, g, b, device=dev64, wrt=[0, 1, 2] if bias else [0, 1])


BN_INPUT = [
    [[0.9601, 0.7277], [0.6272, 0.9034], [0.9378, 0.7230]],
    [[0.6356, 0.1362], [0.0249, 0.9509], [0.6600, 0.5945]],
]


def test_batch_norm_burn_values_train_then_valid():
    bn = nn.BatchNormConfig(3).init()
    x = Tensor.from_data(BN_INPUT).autodiff()
    out = bn.forward(x)
    expected_train = [
        [[1.1483e00, 3.7521e-01], [1.6272e-03, 7.5067e-01], [1.6204e00, -4.5168e-02]],
        [[6.8856e-02, -1.5923e00], [-1.6318e00, 8.7949e-01], [-5.3368e-01, -1.0416e00]],
    ]
    # Burn checks these with Tolerance::rel_abs(0.1, 0.001)
    np.testing.assert_allclose(out.numpy(), expected_train, rtol=1e-2, atol=1e-3)
    expected_valid = [
        [[0.9409, 0.6976], [0.5892, 0.8774], [0.9106, 0.6844]],
        [[0.6012, 0.0782], [-0.0394, 0.9270], [0.6181, 0.5492]],
    ]
    # Burn's batch.rs updates running_var with the biased batch variance (as here); its test
    # values were made with the unbiased one, 0.2% apart, inside Burn's default tolerance
    np.testing.assert_allclose(bn.valid().forward(Tensor.from_data(BN_INPUT)).numpy(), expected_valid, rtol=3e-3)


def test_batch_norm_running_state_updates_only_while_training():
    bn = nn.BatchNormConfig(3, momentum=0.25).init()
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32) * 2 + 1
    mean = x.mean(axis=(0, 2))
    var = x.var(axis=(0, 2))
    bn.forward(Tensor.from_data(x).autodiff())
    np.testing.assert_allclose(bn.running_mean.val().numpy(), 0.25 * mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.val().numpy(), 0.75 + 0.25 * var, rtol=1e-5)
    assert not bn.running_mean.is_require_grad()
    before = bn.running_mean.val().numpy().copy()
    bn.forward(Tensor.from_data(x))  # no autodiff: inference, no update
    bn.valid().forward(Tensor.from_data(x).autodiff())
    bn.freeze().forward(Tensor.from_data(x).autodiff())
    np.testing.assert_array_equal(bn.running_mean.val().numpy(), before)
    assert [p for p, _ in bn.named_params()] == ["gamma", "beta", "running_mean", "running_var"]


def test_batch_norm_training_grads(dev64):
    bn = nn.BatchNormConfig(3).init(dev64)
    x = RNG.standard_normal((4, 3, 2, 2))
    g, b = RNG.standard_normal(3), RNG.standard_normal(3)
    ref = _norm(x, (0, 2, 3), 1e-5) * g.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)

    def f(xt, gt, bt):
        bn.gamma, bn.beta = Param(gt), Param(bt)
        return bn.forward(xt.autodiff())  # training path: an autodiff input

    np.testing.assert_allclose(f(T(x, dev64).autodiff(), T(g, dev64), T(b, dev64)).numpy(), ref, rtol=1e-10)
    check_grads(f, x, g, b, device=dev64)


def test_batch_norm_inference_grads(dev64):
    bn = nn.BatchNormConfig(3).init(dev64)
    bn.forward(T(RNG.standard_normal((4, 3, 2)), dev64).autodiff())  # move the running stats
    frozen = bn.freeze()
    m, v = frozen.running_mean.val().numpy(), frozen.running_var.val().numpy()
    x = RNG.standard_normal((2, 3, 2))
    ref = (x - m.reshape(1, 3, 1)) / np.sqrt(v.reshape(1, 3, 1) + 1e-5)
    np.testing.assert_allclose(frozen.forward(T(x, dev64)).numpy(), ref, rtol=1e-10)
    check_grads(frozen.forward, x, device=dev64)


def test_group_norm_burn_values():
    gn = nn.GroupNormConfig(2, 6, affine=False).init()
    x = Tensor.from_data([
        [[-0.3034, 0.2726, -0.9659], [-1.1845, -1.3236, 0.0172], [1.9507, 1.2554, -0.8625],
         [1.0682, 0.3604, 0.3985], [-0.4957, -0.4461, -0.9721], [1.5157, -0.1546, -0.5596]],
    ])
    expected = [[[-0.1653, 0.3748, -0.7866], [-0.9916, -1.1220, 0.1353], [1.9485, 1.2965, -0.6896],
                 [1.2769, 0.3628, 0.4120], [-0.7427, -0.6786, -1.3578], [1.8547, -0.3022, -0.8252]]]
    assert gn.gamma is None and gn.beta is None
    np.testing.assert_allclose(gn.forward(x).numpy(), expected, atol=1e-4)


@pytest.mark.parametrize("which", ["group", "instance"])
def test_group_and_instance_norm_values_and_grads(dev64, which):
    x = RNG.standard_normal((2, 4, 3, 2))
    g, b = RNG.standard_normal(4), RNG.standard_normal(4)
    if which == "group":
        m = nn.GroupNormConfig(2, 4).init(dev64)
        ref = _norm(x.reshape(2, 2, -1), 2, 1e-5).reshape(x.shape)
    else:
        m = nn.InstanceNormConfig(4).init(dev64)
        ref = _norm(x, (2, 3), 1e-5)
    ref = ref * g.reshape(1, 4, 1, 1) + b.reshape(1, 4, 1, 1)

    def f(xt, gt, bt):
        m.gamma, m.beta = Param(gt), Param(bt)
        return m.forward(xt)

    np.testing.assert_allclose(f(T(x, dev64), T(g, dev64), T(b, dev64)).numpy(), ref, rtol=1e-10)
    check_grads(f, x, g, b, device=dev64)


def test_group_norm_channels_must_divide():
    with pytest.raises(ValueError, match="divisible by the number of groups"):
        nn.GroupNormConfig(4, 6).init()


def test_rms_norm_burn_values_and_grads(dev64):
    out = nn.RmsNormConfig(3).init().forward(Tensor.arange(0, 9).cast("float32").reshape(3, 3))
    expected = [[0.0000, 0.7746, 1.5492], [0.7348, 0.9798, 1.2247], [0.8514, 0.9933, 1.1352]]
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-4)
    m = nn.RmsNormConfig(4).init(dev64)
    x, g = RNG.standard_normal((2, 3, 4)), RNG.standard_normal(4)

    def f(xt, gt):
        m.gamma = Param(gt)
        return m.forward(xt)

    ref = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(f(T(x, dev64), T(g, dev64)).numpy(), ref, rtol=1e-10)
    check_grads(f, x, g, device=dev64)
    with pytest.raises(ValueError, match="epsilon must be positive"):
        nn.RmsNormConfig(3, epsilon=0.0).init()


def _lrn_ref(x, size, alpha, beta, k):
    c = x.shape[1]
    left, right = (size - 1) // 2, size // 2
    out = np.empty_like(x)
    for ch in range(c):
        lo, hi = ch - left, ch + right
        acc = sum((x[:, j] ** 2 if 0 <= j < c else 0.0) for j in range(lo, hi + 1))
        out[:, ch] = x[:, ch] / (k + alpha * acc / size) ** beta
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_local_response_norm_values_and_grads(dev64, size):
    m = nn.LocalResponseNormConfig(size, alpha=0.5, beta=0.75, k=1.5).init()
    x = RNG.standard_normal((2, 4, 3))
    np.testing.assert_allclose(m.forward(T(x, dev64)).numpy(), _lrn_ref(x, size, 0.5, 0.75, 1.5), rtol=1e-10)
    check_grads(m.forward, x, device=dev64)


def test_local_response_norm_burn_even_window():
    m = nn.LocalResponseNormConfig(2, alpha=1.0, beta=1.0, k=0.0).init()
    out = m.forward(Tensor.from_data([[[1.0], [2.0], [4.0]]]))
    np.testing.assert_allclose(out.numpy(), [[[0.4], [0.2], [0.5]]], rtol=1e-6)


# ---------------------------------------------------------------------- misc
def test_gaussian_noise():
    noise = nn.GaussianNoiseConfig(0.5).init()
    x = Tensor.ones([100, 100])
    np.testing.assert_array_equal(noise.forward(x).numpy(), x.numpy())
    y = noise.forward(x.autodiff()).numpy() - 1
    assert abs(y.std() - 0.5) < 0.02 and abs(y.mean()) < 0.02
    np.testing.assert_array_equal(noise.valid().forward(x.autodiff()).numpy(), x.numpy())
    with pytest.raises(ValueError, match="Standard deviation is required to be non-negative"):
        nn.GaussianNoiseConfig(-0.5).init()


def test_cosine_similarity_values_and_grads(dev64):
    out = nn.CosineSimilarityConfig().init().forward(Tensor.from_data([[1.0, 0.0], [1.0, 1.0]]),
                                                     Tensor.from_data([[1.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_allclose(out.numpy(), [1.0, 0.707107], atol=1e-6)
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    m = nn.CosineSimilarityConfig(dim=-1).init()
    ref = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    np.testing.assert_allclose(m.forward(T(a, dev64), T(b, dev64)).numpy(), ref, rtol=1e-12)
    check_grads(m.forward, a, b, device=dev64)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_pairwise_distance_values_and_grads(dev64, p):
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    m = nn.PairwiseDistanceConfig(p=p).init()
    ref = (np.abs(a - b + 1e-6) ** p).sum(1) ** (1 / p)
    np.testing.assert_allclose(m.forward(T(a, dev64), T(b, dev64)).numpy(), ref, rtol=1e-10)
    check_grads(m.forward, a, b, device=dev64)


def test_pixel_shuffle_burn_values_inverse_and_grads(dev64):
    x = np.arange(16, dtype=np.float64).reshape(1, 4, 2, 2)
    out = nn.PixelShuffleConfig(2).init().forward(T(x, dev64)).numpy()
    expected = [[[[0, 4, 1, 5], [8, 12, 9, 13], [2, 6, 3, 7], [10, 14, 11, 15]]]]
    np.testing.assert_array_equal(out, expected)
    back = nn.PixelUnshuffleConfig(2).init().forward(T(out, dev64)).numpy()
    np.testing.assert_array_equal(back, x)
    check_grads(nn.PixelShuffleConfig(2).init().forward, RNG.standard_normal((2, 8, 2, 3)), device=dev64)
    check_grads(nn.PixelUnshuffleConfig(2).init().forward, RNG.standard_normal((2, 2, 4, 2)), device=dev64)
    with pytest.raises(ValueError, match=r"input channels \(6\) must be divisible by upscale_factor\^2 \(4\)"):
        nn.PixelShuffleConfig(2).init().forward(Tensor.zeros([1, 6, 2, 2]))


def test_identity_returns_its_input():
    x = Tensor.ones([2, 3])
    assert nn.Identity().forward(x) is x
