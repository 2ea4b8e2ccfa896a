"""MultiHeadAttention's decoder options (issue 19): grouped-query attention, head_dim, bias
switches, the causal mask and a rotary encoding on the queries and keys, against a NumPy
reference; gradients of those paths against finite differences; rope frequency scaling against
transformers' numbers (a committed fixture); the defaults unchanged; the docstring contract of
the layer agreeing with what it returns."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn
from engine.module import contracts
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(19)
FIXTURES = Path(__file__).parent / "fixtures"


def _lin(lin, x):
    out = x @ lin.weight.val().numpy()
    return out + lin.bias.val().numpy() if lin.bias is not None else out


def _rope_ref(x, start, theta):
    """Interleaved-pair rotary encoding of `x` [..., seq, d] at positions start.., in NumPy."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = (start + np.arange(x.shape[-2]))[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def _gqa_ref(m, q, k, v, mask_pad=None, causal=False, rope_theta=None, start=0):
    """Grouped-query attention the way transformers writes it: kv heads repeated (repeat_interleave)."""
    b, s1, _ = q.shape
    s2 = k.shape[1]
    h, kv, dk = m.n_heads, m.n_kv_heads, m.d_k

    def heads(x, lin, n):
        return _lin(lin, x).reshape(x.shape[0], x.shape[1], n, dk).transpose(0, 2, 1, 3)

    qh, kh, vh = heads(q, m.query, h), heads(k, m.key, kv), heads(v, m.value, kv)
    if rope_theta is not None:
        qh, kh = _rope_ref(qh, start, rope_theta), _rope_ref(kh, start, rope_theta)
    kh, vh = np.repeat(kh, h // kv, axis=1), np.repeat(vh, h // kv, axis=1)
    scores = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(dk)
    if mask_pad is not None:
        scores = np.where(mask_pad[:, None, None, :], m.min_float, scores)
    if causal:
        future = np.arange(s2)[None, :] > np.arange(s1)[:, None] + (s2 - s1)
        scores = np.where(future[None, None], m.min_float, scores)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    w = e / e.sum(-1, keepdims=True)
    ctx = (w @ vh).transpose(0, 2, 1, 3).reshape(b, s1, h * dk)
    return w, _lin(m.output, ctx)


def _t(a, dev):
    return Tensor.from_data(a, device=dev)


def test_grouped_query_attention_matches_repeated_kv_heads(dev64):
    m = nn.MultiHeadAttentionConfig(12, 6, dropout=0.0, n_kv_heads=2).init(dev64)
    assert m.key.weight.shape == (12, 4) and m.value.weight.shape == (12, 4) and m.query.weight.shape == (12, 12)
    q, k = RNG.standard_normal((2, 5, 12)), RNG.standard_normal((2, 4, 12))
    pad = nn.generate_padding_mask([4, 2], device=dev64)
    out = m.forward(nn.MhaInput(_t(q, dev64), _t(k, dev64), _t(k, dev64)).mask_pad(pad))
    w, ctx = _gqa_ref(m, q, k, k, pad.numpy())
    np.testing.assert_allclose(out.weights.numpy(), w, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(out.context.numpy(), ctx, rtol=1e-10, atol=1e-12)
    assert out.weights.shape == (2, 6, 5, 4)


def test_head_dim_bias_causal_and_rotary_together(dev64):
    rope = nn.RotaryEncodingConfig(32, 6, theta=500.0)
    m = nn.MultiHeadAttentionConfig(16, 4, dropout=0.0, n_kv_heads=2, head_dim=6, bias=True, output_bias=False,
                                    causal=True, rotary=rope).init(dev64)
    assert m.query.weight.shape == (16, 24) and m.key.weight.shape == (16, 12)
    assert m.output.weight.shape == (24, 16) and m.output.bias is None and m.query.bias is not None
    x = RNG.standard_normal((2, 7, 16))
    pad = nn.generate_padding_mask([7, 5], device=dev64)
    out = m.forward(nn.MhaInput.self_attn(_t(x, dev64)).mask_pad(pad))
    w, ctx = _gqa_ref(m, x, x, x, pad.numpy(), causal=True, rope_theta=np.float32(500.0))
    np.testing.assert_allclose(out.context.numpy(), ctx, rtol=1e-5, atol=1e-6)  # the rope table is float32
    assert (out.weights.numpy()[:, :, np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]] < 1e-3).all()
    # the causal mask: a later token changes nothing before it
    x2 = x.copy()
    x2[:, -1] += 1.0
    out2 = m.forward(nn.MhaInput.self_attn(_t(x2, dev64)).mask_pad(pad))
    np.testing.assert_allclose(out2.context.numpy()[:, :-1], out.context.numpy()[:, :-1], rtol=1e-12, atol=1e-12)


def test_a_rotary_encoding_passed_in_and_the_position_offset(dev64):
    m = nn.MultiHeadAttentionConfig(8, 2, dropout=0.0, n_kv_heads=1, bias=False, causal=True).init(dev64)
    assert m.query.bias is None and m.output.bias is None and m.rotary is None
    rope = nn.RotaryEncodingConfig(64, 4, theta=100.0).init(dev64)
    x = RNG.standard_normal((1, 6, 8))
    inp = nn.MhaInput.self_attn(_t(x, dev64))
    base = m.forward(inp).context.numpy()
    a = m.forward(inp, rope).context.numpy()
    _, ref = _gqa_ref(m, x, x, x, causal=True, rope_theta=np.float32(100.0))
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-6)
    assert not np.allclose(a, base)
    b = m.forward(inp, rope, start=9).context.numpy()  # rope scores depend on relative positions only
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    _, ref9 = _gqa_ref(m, x, x, x, causal=True, rope_theta=np.float32(100.0), start=9)
    np.testing.assert_allclose(b, ref9, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="positions 60..66 exceed max_sequence_length 64"):
        m.forward(inp, rope, start=60)


def test_causal_mask_aligns_the_last_query_with_the_last_key(dev64):
    m = nn.MultiHeadAttentionConfig(4, 1, dropout=0.0, causal=True).init(dev64)
    q, k = RNG.standard_normal((1, 2, 4)), RNG.standard_normal((1, 5, 4))
    w = m.forward(nn.MhaInput(_t(q, dev64), _t(k, dev64), _t(k, dev64))).weights.numpy()[0, 0]
    assert (w[0, 4:] < 1e-3).all() and (w[0, :4] > 1e-6).all() and (w[1] > 1e-6).all()


def test_gradients_of_the_new_paths(dev64):
    rope = nn.RotaryEncodingConfig(16, 4)
    m = nn.MultiHeadAttentionConfig(12, 3, dropout=0.0, n_kv_heads=1, head_dim=4, causal=True,
                                    rotary=rope).init(dev64)
    pad = nn.generate_padding_mask([4, 3], device=dev64)
    q, k = RNG.standard_normal((2, 4, 12)), RNG.standard_normal((2, 4, 12))
    check_grads(lambda a, b: m.forward(nn.MhaInput(a, b, b).mask_pad(pad), start=2).context, q, k, device=dev64)
    # and the parameters: the key map of the shared kv head gets the gradient of every query head
    x = _t(q, dev64)
    wk = m.key.weight.val().numpy().copy()

    def through_key(w):
        m2 = m.clone()
        from engine import Param  # noqa: PLC0415

        m2.key.weight = Param.initialized(w, id=m.key.weight.id)
        return m2.forward(nn.MhaInput.self_attn(x).mask_pad(pad)).context

    check_grads(through_key, wk, device=dev64)


def test_defaults_keep_burns_layer():
    m = nn.MultiHeadAttentionConfig(8, 2).init()
    assert [p for p, _ in m.named_params()] == ["query.weight", "query.bias", "key.weight", "key.bias",
                                                "value.weight", "value.bias", "output.weight", "output.bias"]
    assert all(p.shape in ((8, 8), (8,)) for _, p in m.named_params())
    assert (m.n_kv_heads, m.d_k, m.causal, m.rotary) == (2, 4, False, None)
    assert str(m) == ("MultiHeadAttention {d_model: 8, n_heads: 2, d_k: 4, dropout: 0.1, min_float: -10000, "
                      "quiet_softmax: false, params: 288}")
    g = nn.MultiHeadAttentionConfig(12, 6, n_kv_heads=2, causal=True, bias=False).init()
    assert str(g) == ("MultiHeadAttention {d_model: 12, n_heads: 6, n_kv_heads: 2, d_k: 2, dropout: 0.1, "
                      "min_float: -10000, quiet_softmax: false, causal: true, params: 384}")


@pytest.mark.parametrize("kw, message", [
    ({"n_kv_heads": 4}, r"n_heads \(6\) must be a multiple of n_kv_heads \(4\)"),
    ({"n_kv_heads": 0}, r"MultiHeadAttentionConfig\.n_kv_heads must be a positive int, got 0"),
    ({"head_dim": -1}, r"MultiHeadAttentionConfig\.head_dim must be a positive int, got -1"),
    ({"rotary": nn.RotaryEncodingConfig(8, 4)}, r"rotary encoding's d_model \(4\) must equal head_dim \(2\)"),
])
def test_bad_settings_say_what_is_wrong(kw, message):
    with pytest.raises(ValueError, match=message):
        nn.MultiHeadAttentionConfig(12, 6, **kw).init()


def test_the_docstring_contract_agrees_with_the_outputs():
    """The contract lists the weights and the context (MhaOutput's fields, in order): a full
    contract check of the transformer example holds (it failed: the output was rank 3 in the
    docstring, the first output, the weights, rank 4)."""
    from resources.examples import build_example, example_input

    m = nn.MultiHeadAttentionConfig(8, 2, n_kv_heads=1).init()
    text = contracts.docstring_contract(m)
    assert text.endswith("-> [batch_size, n_heads, seq_length_1, seq_length_2], [batch_size, seq_length_1, d_model]")
    model = build_example("transformer")
    mods = list(model.named_modules())
    wanted = {p: t for p, t in ((p, contracts.docstring_contract(mod)) for p, mod in mods) if t}
    r = contracts.check(model, [example_input("transformer", 2)], wanted, mods)
    assert r.ok, r.error
    assert r.nodes["encoder.layers.0.mha"].outputs == [(2, 4, 32, 32), (2, 32, 64)]


# ---------------------------------------------------------------------------------- rope scaling
def _cases():
    return json.loads((FIXTURES / "rope_scaling_transformers.json").read_text())


def _scaling(case):
    if case["rope_type"] == "llama3":
        return nn.Llama3RopeScaling(case["factor"], case["low_freq_factor"], case["high_freq_factor"],
                                    case["original_max_position_embeddings"])
    if case["rope_type"] == "linear":
        return nn.LinearRopeScaling(case["factor"])
    return None


@pytest.mark.parametrize("i", range(5))
def test_rope_frequency_scaling_matches_transformers(i):
    case = _cases()[i]
    assert case["attention_factor"] == 1.0
    rope = nn.RotaryEncodingConfig(32, case["head_dim"], case["rope_theta"], scaling=_scaling(case)).init()
    np.testing.assert_allclose(rope.inverse_frequencies(), np.float32(case["inv_freq"]), rtol=2e-6, atol=0)


def test_init_with_frequency_scaling_is_burns_builder():
    cfg = nn.RotaryEncodingConfig(16, 8, 500000.0)
    plain = cfg.init()
    halved = cfg.init_with_frequency_scaling(lambda inv: inv / 2)
    np.testing.assert_allclose(halved.inverse_frequencies(), plain.inverse_frequencies() / 2, rtol=1e-7)
    x = Tensor.from_data(RNG.standard_normal((1, 5, 8)).astype(np.float32))
    assert halved.forward(x).shape == (1, 5, 8)
    # positions p under halved frequencies are positions p / 2 under the plain ones: p = 2 -> 1
    cos_h, _ = halved.frequencies()
    cos_p, _ = plain.frequencies()
    np.testing.assert_allclose(np.asarray(cos_h)[2], np.asarray(cos_p)[1], rtol=1e-6)
    with pytest.raises(ValueError, match=r"returned dims \[3\], expected \[4\]"):
        cfg.init_with_frequency_scaling(lambda inv: inv[:3]).frequencies()
    with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
        nn.Llama3RopeScaling(8.0, 4.0, 1.0, 16)


@pytest.mark.parametrize("field, value", [("causal", True), ("bias", False), ("n_kv_heads", 1), ("head_dim", 2)])
def test_a_designed_attention_with_the_new_settings_builds_and_the_rust_export_refuses_them(field, value):
    """The designer's catalog offers the new fields; Burn's MultiHeadAttentionConfig has none of them,
    so the Rust export names the field instead of writing code that does not compile."""
    from engine.design import Design, build_model  # noqa: PLC0415
    from engine.interop import ExportError, export_python, export_rust  # noqa: PLC0415

    d = Design()
    d.add_node("Input", "x")
    d.set_field("x", "shape", ["batch", "seq", 8])
    d.add_node("MultiHeadAttention", "mha")
    d.set_field("mha", "d_model", 8)
    d.set_field("mha", "n_heads", 2)
    d.add_node("Output", "out")
    d.connect("x", "output", "mha", "input")
    d.connect("mha", "output", "out", "input")
    assert "MultiHeadAttentionConfig::new(8, 2)" in export_rust(d)
    d.set_field("mha", field, value)
    mha = build_model(d).mha
    built = {"causal": mha.causal, "bias": mha.query.bias is not None, "n_kv_heads": mha.n_kv_heads,
             "head_dim": mha.d_k}
    assert built[field] == value
    assert f"{field}={value!r}" in export_python(d)
    with pytest.raises(ExportError, match=rf"mha: MultiHeadAttention\.{field} = {value!r} has no Rust form"):
        export_rust(d)


def test_the_rotary_table_holds_only_the_positions_used():
    rope = nn.RotaryEncodingConfig(131072, 8, 500000.0, scaling=nn.Llama3RopeScaling(8.0, 1.0, 4.0, 8192)).init()
    x = Tensor.from_data(RNG.standard_normal((1, 2, 6, 8)).astype(np.float32))
    short = rope.apply(x, 3).numpy()
    assert rope.frequencies(length=9)[0].shape == (1024, 4)  # not 131072 rows
    full_cos, _ = rope.frequencies()
    assert full_cos.shape == (131072, 4)
    np.testing.assert_allclose(rope.apply(x, 3).numpy(), short, rtol=1e-6, atol=1e-7)  # whatever the table's size
    fresh = nn.RotaryEncodingConfig(131072, 8, 500000.0, scaling=nn.Llama3RopeScaling(8.0, 1.0, 4.0, 8192)).init()
    np.testing.assert_allclose(fresh.apply(x, 100000).numpy(), rope.apply(x, 100000).numpy(), rtol=1e-6, atol=1e-7)
