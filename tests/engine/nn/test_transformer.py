"""MultiHeadAttention, the transformer blocks and positional encodings: values against NumPy,
gradients against finite differences."""
import math

import numpy as np
import pytest

from engine import Tensor, nn
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(31)


def _lin(m, x):
    return x @ m.weight.val().numpy() + m.bias.val().numpy()


def _softmax(s, quiet=False):
    m = s.max(-1, keepdims=True)
    if quiet:
        m = np.maximum(m, 0)
    e = np.exp(s - m)
    return e / (e.sum(-1, keepdims=True) + (np.exp(-m) if quiet else 0))


def _mha_ref(m, q, k, v, mask_pad=None, mask_attn=None, quiet=False):
    b, s1, d = q.shape
    s2 = k.shape[1]
    h, dk = m.n_heads, m.d_k

    def heads(x, lin):
        return _lin(lin, x).reshape(x.shape[0], x.shape[1], h, dk).transpose(0, 2, 1, 3)

    scores = heads(q, m.query) @ heads(k, m.key).transpose(0, 1, 3, 2) / math.sqrt(dk)
    if mask_pad is not None:
        scores = np.where(mask_pad[:, None, None, :], m.min_float, scores)
    if mask_attn is not None:
        scores = np.where(mask_attn[:, None], m.min_float, scores)
    w = _softmax(scores, quiet)
    ctx = (w @ heads(v, m.value)).transpose(0, 2, 1, 3).reshape(b, s1, d)
    return w, _lin(m.output, ctx)


@pytest.mark.parametrize("quiet", [False, True])
def test_mha_with_masks(dev64, quiet):
    m = nn.MultiHeadAttentionConfig(8, 2, dropout=0.0, quiet_softmax=quiet).init(dev64)
    q, k = RNG.standard_normal((3, 4, 8)), RNG.standard_normal((3, 5, 8))
    pad = nn.generate_padding_mask([5, 3, 4], device=dev64)
    attn = RNG.random((3, 4, 5)) < 0.2
    t = lambda a: Tensor.from_data(a, device=dev64)  # noqa: E731
    out = m.forward(nn.MhaInput(t(q), t(k), t(k)).mask_pad(pad).mask_attn(t(attn)))
    w, ctx = _mha_ref(m, q, k, k, pad.numpy(), attn, quiet)
    np.testing.assert_allclose(out.weights.numpy(), w, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(out.context.numpy(), ctx, rtol=1e-10)
    assert (out.weights.numpy()[1, :, :, 3:] < 1e-3).all()  # padded keys get (almost) no weight
    check_grads(lambda a, b: m.forward(nn.MhaInput(a, b, b).mask_pad(pad)).context, q, k, device=dev64)


def test_mha_dropout_only_while_training():
    m = nn.MultiHeadAttentionConfig(8, 2, dropout=0.5).init()
    x = Tensor.random([2, 3, 8])
    v = m.valid()
    a = v.forward(nn.MhaInput.self_attn(x)).context.numpy()
    b = v.forward(nn.MhaInput.self_attn(x)).context.numpy()
    np.testing.assert_array_equal(a, b)  # valid(): no dropout
    # in training mode the parameters carry autodiff, so the scores do and dropout is active
    assert not np.allclose(m.forward(nn.MhaInput.self_attn(x)).context.numpy(), a)


def test_autoregressive_mask():
    m = nn.generate_autoregressive_mask(2, 3).numpy()
    np.testing.assert_array_equal(m[0], [[False, True, True], [False, False, True], [False, False, False]])


def _gelu(x):
    from scipy.special import erf

    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _ln(m, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + m.epsilon) * m.gamma.val().numpy() + m.beta.val().numpy()


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_against_numpy(dev64, norm_first):
    enc = nn.TransformerEncoderConfig(8, 16, 2, 2, dropout=0.0, norm_first=norm_first).init(dev64)
    x = RNG.standard_normal((2, 4, 8))
    mask = nn.generate_autoregressive_mask(2, 4, device=dev64)
    out = enc.forward(nn.TransformerEncoderInput(Tensor.from_data(x, device=dev64)).mask_attn(mask)).numpy()
    ref = x
    for layer in enc.layers:
        if norm_first:
            ref = ref + _mha_ref(layer.mha, *([_ln(layer.norm_2, ref)] * 3), mask_attn=mask.numpy())[1]
            ref = ref + _lin(layer.pwff.linear_outer, _gelu(_lin(layer.pwff.linear_inner, _ln(layer.norm_1, ref))))
        else:
            ref = _ln(layer.norm_1, ref + _mha_ref(layer.mha, ref, ref, ref, mask_attn=mask.numpy())[1])
            ref = _ln(layer.norm_2, ref + _lin(layer.pwff.linear_outer, _gelu(_lin(layer.pwff.linear_inner, ref))))
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)
    check_grads(lambda t: enc.forward(t), x[:1, :3], device=dev64)


def test_transformer_encoder_options():
    enc = nn.TransformerEncoderConfig(8, 16, 2, 1, activation="Relu", layer_norm_eps=1e-3).init()
    assert str(enc.layers[0].pwff.activation) == "Relu"
    assert enc.layers[0].norm_1.epsilon == 1e-3
    assert [p for p, _ in enc.named_params()][:2] == ["layers.0.mha.query.weight", "layers.0.mha.query.bias"]


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder(dev64, norm_first):
    dec = nn.TransformerDecoderConfig(8, 16, 2, 1, dropout=0.0, norm_first=norm_first).init(dev64)
    layer = dec.layers[0]
    tgt, mem = RNG.standard_normal((2, 3, 8)), RNG.standard_normal((2, 5, 8))
    t = lambda a: Tensor.from_data(a, device=dev64)  # noqa: E731
    out = dec.forward(nn.TransformerDecoderInput(t(tgt), t(mem))).numpy()
    x = tgt
    ff = lambda r: _lin(layer.pwff.linear_outer, _gelu(_lin(layer.pwff.linear_inner, r)))  # noqa: E731
    if norm_first:
        x = x + _mha_ref(layer.self_attn, *([_ln(layer.norm_1, x)] * 3))[1]
        x = x + _mha_ref(layer.cross_attn, _ln(layer.norm_2, x), mem, mem)[1]
        x = x + ff(_ln(layer.norm_3, x))
    else:
        x = _ln(layer.norm_1, x + _mha_ref(layer.self_attn, x, x, x)[1])
        x = _ln(layer.norm_2, x + _mha_ref(layer.cross_attn, x, mem, mem)[1])
        x = _ln(layer.norm_3, x + ff(x))
    np.testing.assert_allclose(out, x, rtol=1e-9, atol=1e-12)
    check_grads(lambda a, b: dec.forward(nn.TransformerDecoderInput(a, b)), tgt[:1, :2], mem[:1, :2], device=dev64)


def test_position_wise_feed_forward(dev64):
    m = nn.PositionWiseFeedForwardConfig(4, 6, dropout=0.0).init(dev64)
    x = RNG.standard_normal((2, 3, 4))
    ref = _lin(m.linear_outer, _gelu(_lin(m.linear_inner, x)))
    np.testing.assert_allclose(m.forward(Tensor.from_data(x, device=dev64)).numpy(), ref, rtol=1e-10)
    check_grads(m.forward, x, device=dev64)


def test_positional_encoding_burn_values(dev64):
    pe = nn.PositionalEncodingConfig(6).init()
    out = pe.forward(Tensor.zeros([2, 3, 6])).numpy()
    expected = [[0.0, 1.0, 0.0, 1.0, 0.0, 1.0], [0.84147, 0.54030, 0.04640, 0.99892, 0.00215, 1.0],
                [0.90930, -0.41615, 0.09270, 0.99569, 0.00431, 0.99999]]
    np.testing.assert_allclose(out[1], expected, atol=1e-5)
    sin = nn.generate_sinusoids(12, 6, 10_000).numpy()
    np.testing.assert_allclose(sin[11], [-0.99999, 0.00443, 0.48868, 0.87246, 0.02370, 0.99972], atol=1e-5)
    x = RNG.standard_normal((2, 3, 6))
    np.testing.assert_allclose(pe.forward(Tensor.from_data(x, device=dev64)).numpy(), x + sin[:3], atol=1e-7)
    check_grads(pe.forward, x, device=dev64)
    with pytest.raises(ValueError, match=r"max_sequence_size\(5000\) must be greater or equal than length\(6000\)"):
        pe.forward(Tensor.zeros([1, 6000, 6]))


def test_rotary_encoding_burn_values_and_grads(dev64):
    rope = nn.RotaryEncodingConfig(10, 4).init()
    x = Tensor.from_data([[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], [[9.0, 10.0, 11.0, 12.0], [13.0, 14.0, 15.0, 16.0]]])
    expected = [[[1.0, 2.0, 3.0, 4.0], [-2.3473, 7.4492, 6.9197, 8.0696]],
                [[9.0, 10.0, 11.0, 12.0], [-4.7567, 18.5034, 14.8393, 16.1492]]]
    np.testing.assert_allclose(rope.forward(x).numpy(), expected, atol=1e-4)
    np.testing.assert_allclose(rope.forward(x.unsqueeze(0)).numpy()[0], expected, atol=1e-4)
    y = RNG.standard_normal((2, 2, 5, 6))
    r6 = nn.RotaryEncodingConfig(8, 6, theta=100.0).init()
    freqs = 1 / 100.0 ** (np.arange(0, 6, 2) / 6)
    ang = np.arange(2, 7)[:, None] * freqs[None]
    a, b = y[..., 0::2], y[..., 1::2]
    ref = np.empty_like(y)
    ref[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
    ref[..., 1::2] = a * np.sin(ang) + b * np.cos(ang)
    np.testing.assert_allclose(r6.apply(Tensor.from_data(y, device=dev64), 2).numpy(), ref, rtol=1e-5, atol=1e-6)
    check_grads(r6.forward, y, device=dev64)
    with pytest.raises(ValueError, match="must be even"):
        nn.RotaryEncodingConfig(10, 5).init()
