"""nn.KVCache with nn.MultiHeadAttention: feeding a sequence in pieces through a cache gives the
context of the whole sequence at once (GQA, rotary, causal, padding mask over the cached
prefix), the cache holds [batch, n_kv_heads, length, head_dim], grows past its capacity,
keeps gradients flowing when recording, and refuses keys that do not fit."""
import numpy as np
import pytest

from engine import Tensor, nn
from engine.autodiff.tape import no_recording


def _mha(causal=True, rotary=True, n_kv=2):
    cfg = nn.MultiHeadAttentionConfig(24, 6, dropout=0.0, n_kv_heads=n_kv, head_dim=4, causal=causal,
                                      rotary=nn.RotaryEncodingConfig(64, 4) if rotary else None)
    return cfg.init().valid()


def _x(b, s, seed=0):
    return Tensor.from_data(np.random.default_rng(seed).standard_normal((b, s, 24)).astype(np.float32))


@pytest.mark.parametrize("n_kv", [1, 2, 6])
@pytest.mark.parametrize("pieces", [[1] * 9, [4, 1, 1, 3], [9]])
def test_pieces_through_the_cache_equal_the_whole(n_kv, pieces):
    mha = _mha(n_kv=n_kv)
    x = _x(2, 9)
    whole = mha.forward(nn.MhaInput.self_attn(x)).context.numpy()
    cache = nn.KVCache()
    got, at = [], 0
    with no_recording():
        for n in pieces:
            out = mha.forward(nn.MhaInput.self_attn(x.narrow(1, at, n)), cache=cache)
            assert out.weights.shape == (2, 6, n, at + n)  # the new queries over every key so far
            got.append(out.context.numpy())
            at += n
    np.testing.assert_allclose(np.concatenate(got, axis=1), whole, atol=1e-5, rtol=1e-5)
    assert cache.length == 9 and cache.keys.shape == (2, n_kv, 9, 4) and cache.values.shape == (2, n_kv, 9, 4)


def test_padding_mask_covers_the_cached_prefix():
    mha = _mha()
    x = _x(2, 7, seed=1)
    pad = Tensor.from_data(np.array([[True, True, False, False, False, False, False], [False] * 7]))
    whole = mha.forward(nn.MhaInput.self_attn(x).mask_pad(pad)).context.numpy()
    cache = nn.KVCache()
    first = mha.forward(nn.MhaInput.self_attn(x.narrow(1, 0, 5)).mask_pad(pad.narrow(1, 0, 5)), cache=cache)
    rest = [mha.forward(nn.MhaInput.self_attn(x.narrow(1, i, 1)).mask_pad(pad.narrow(1, 0, i + 1)), cache=cache)
            for i in (5, 6)]
    got = np.concatenate([first.context.numpy()] + [r.context.numpy() for r in rest], axis=1)
    np.testing.assert_allclose(got[:, 2:], whole[:, 2:], atol=1e-5, rtol=1e-5)  # every real query
    np.testing.assert_allclose(got[1], whole[1], atol=1e-5, rtol=1e-5)


def test_explicit_start_and_growth_past_capacity():
    mha = _mha(causal=False)
    x = _x(1, 6, seed=2)
    cache = nn.KVCache(capacity=2)
    for i in range(6):
        mha.forward(nn.MhaInput.self_attn(x.narrow(1, i, 1)), cache=cache)
    assert cache.length == 6
    key_heads = mha.key.forward(x).reshape(1, 6, 2, 4).swap_dims(1, 2)
    np.testing.assert_allclose(cache.keys.numpy(), mha.rotary.apply(key_heads, 0).numpy(), atol=1e-6)
    cache.reset()
    assert cache.length == 0 and cache.keys is None


def test_gradients_flow_through_a_recording_cache():
    mha = _mha().train()
    x = _x(1, 5, seed=3)
    whole = mha.forward(nn.MhaInput.self_attn(x)).context.sum()
    g_whole = whole.backward()
    cache = nn.KVCache()
    a = mha.forward(nn.MhaInput.self_attn(x.narrow(1, 0, 3)), cache=cache).context.sum()
    b = mha.forward(nn.MhaInput.self_attn(x.narrow(1, 3, 2)), cache=cache).context.sum()
    g = (a + b).backward()
    np.testing.assert_allclose(mha.query.weight.val().grad(g).numpy(), mha.query.weight.val().grad(g_whole).numpy(),
                               atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(mha.key.weight.val().grad(g).numpy(), mha.key.weight.val().grad(g_whole).numpy(),
                               atol=1e-4, rtol=1e-4)


def test_no_cache_path_unchanged_and_mismatch_refused():
    mha = _mha()
    x = _x(2, 4)
    a = mha.forward(nn.MhaInput.self_attn(x)).context.numpy()
    b = mha.forward(nn.MhaInput.self_attn(x), None, 0).context.numpy()
    np.testing.assert_array_equal(a, b)
    cache = nn.KVCache()
    with no_recording():
        mha.forward(nn.MhaInput.self_attn(x), cache=cache)
        with pytest.raises(ValueError, match=r"the cache holds keys \[batch_size 2.*new ones are \[3"):
            mha.forward(nn.MhaInput.self_attn(_x(3, 1)), cache=cache)
    with pytest.raises(ValueError, match="capacity"):
        nn.KVCache(capacity=0)
    assert len(nn.KVCache.layers(3)) == 3


def test_a_cache_holding_given_tensors_joins_the_next_ones_to_them():
    KVCache = nn.KVCache
    k = Tensor.from_data(np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3))
    c = KVCache.holding(k, k * 2.0)
    assert c.length == 2
    new = Tensor.from_data(np.ones((1, 2, 1, 3), dtype=np.float32))
    keys, values = c.append(new, new)
    assert c.length == 3 and keys.shape == (1, 2, 3, 3)
    np.testing.assert_array_equal(keys.numpy()[:, :, :2], k.numpy())
    np.testing.assert_array_equal(values.numpy()[:, :, 2], np.ones((1, 2, 3)))
    empty = KVCache.holding(Tensor.from_data(np.zeros((1, 2, 0, 3), dtype=np.float32)),
                            Tensor.from_data(np.zeros((1, 2, 0, 3), dtype=np.float32)))
    assert empty.length == 0 and empty.append(new, new)[0].shape == (1, 2, 1, 3)
    with pytest.raises(ValueError, match=r"KVCache.holding: expected keys and values of the same dims"):
        KVCache.holding(k, new)
