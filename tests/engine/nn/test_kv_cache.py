"""nn.KVCache with nn.MultiHeadAttention: feeding a sequence in pieces through a cache gives the
context of the whole sequence at once (GQA, rotary, causal, padding mask over the cached
prefix), the cache holds [batch, n_kv_heads, length, head_dim], grows past its capacity,
keeps gradients flowing when recording, and refuses keys that do not fit; a sliding-window layer's
cache holds only its last window - 1 positions and stays exact."""
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


# ---------------------------------------------------------------------------------- sliding windows
def _windowed(window, positions=64):
    cfg = nn.MultiHeadAttentionConfig(24, 6, dropout=0.0, n_kv_heads=2, head_dim=4, causal=True, window=window,
                                      rotary=nn.RotaryEncodingConfig(positions, 4))
    return cfg.init().valid()


@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("pieces", [[1] * 20, [6, 1, 1, 4, 1, 7], [2, 9, 9]])
def test_a_windowed_cache_holds_only_the_window_and_equals_the_whole(window, pieces):
    """Fed in pieces through a cache, a windowed layer gives the whole sequence's context (a padding
    mask and an attention mask over every position, their dropped columns left out), while the cache
    holds at most window - 1 positions after each call: the last ones, as they were computed."""
    mha = _windowed(window)
    x = _x(2, 20, seed=4)
    rng = np.random.default_rng(5)
    pad = np.zeros((2, 20), dtype=bool)
    pad[1, :3] = True  # the second row left-padded
    attn = rng.random((2, 20, 20)) < 0.2
    attn[:, np.arange(20), np.arange(20)] = False  # every query sees itself
    whole = mha.forward(nn.MhaInput.self_attn(x).mask_pad(Tensor.from_data(pad))
                        .mask_attn(Tensor.from_data(attn))).context.numpy()
    key_heads = mha.rotary.apply(mha.key.forward(x).reshape(2, 20, 2, 4).swap_dims(1, 2), 0).numpy()
    cache = nn.KVCache()
    got, at = [], 0
    with no_recording():
        for n in pieces:
            held_before = cache.held
            inp = nn.MhaInput.self_attn(x.narrow(1, at, n)).mask_pad(Tensor.from_data(pad[:, :at + n]))
            out = mha.forward(inp.mask_attn(Tensor.from_data(attn[:, at:at + n, :at + n])), cache=cache)
            assert out.weights.shape == (2, 6, n, held_before + n)  # the held keys and the new ones only
            got.append(out.context.numpy())
            at += n
            assert cache.length == at and cache.held == min(at, window - 1)
            assert cache.keys.shape == (2, 2, cache.held, 4) and cache.values.shape == (2, 2, cache.held, 4)
            np.testing.assert_allclose(cache.keys.numpy(), key_heads[:, :, at - cache.held:at], atol=1e-6)
    got = np.concatenate(got, axis=1)
    np.testing.assert_allclose(got[:, 3:], whole[:, 3:], atol=1e-5, rtol=1e-5)  # every real query
    np.testing.assert_allclose(got[0], whole[0], atol=1e-5, rtol=1e-5)


def test_a_windowed_cache_buffer_stays_bounded_over_a_long_generation():
    """300 one-position steps: the buffer is moved, never grown, so its bytes stay those of at most
    2 * (window - 1) + 1 positions, where a layer without a window holds all 300."""
    windowed, full = _windowed(4, 512), _windowed(None, 512)
    x = _x(1, 300, seed=6)
    wc, fc = nn.KVCache(), nn.KVCache()
    per_position = 2 * 1 * 2 * 4 * 4  # keys and values: rows, kv heads, head_dim, float32 bytes
    with no_recording():
        for i in range(300):
            step = nn.MhaInput.self_attn(x.narrow(1, i, 1))
            windowed.forward(step, cache=wc)
            full.forward(step, cache=fc)
            assert wc.held == min(i + 1, 3) and wc.nbytes <= (2 * 3 + 1) * per_position
    assert fc.held == fc.length == wc.length == 300 and fc.nbytes >= 300 * per_position
    with no_recording():
        last = windowed.forward(nn.MhaInput.self_attn(_x(1, 301, seed=6).narrow(1, 300, 1)), cache=wc)
    assert last.weights.shape == (1, 6, 1, 4)
    whole = windowed.forward(nn.MhaInput.self_attn(_x(1, 301, seed=6))).context.numpy()[:, -1]
    np.testing.assert_allclose(last.context.numpy()[:, 0], whole, atol=1e-5, rtol=1e-5)


def test_a_recording_windowed_cache_keeps_every_position_and_keep_is_checked():
    """In a graph the cache concatenates and keeps every position (gradients, the ONNX export's
    present outputs); a keep that is not an int >= 0 is refused."""
    mha = _windowed(2).train()
    x = _x(1, 5, seed=7)
    cache = nn.KVCache()
    a = mha.forward(nn.MhaInput.self_attn(x.narrow(1, 0, 3)), cache=cache).context
    b = mha.forward(nn.MhaInput.self_attn(x.narrow(1, 3, 2)), cache=cache).context
    assert cache.held == cache.length == 5 and cache.keys.shape[2] == 5
    whole = mha.forward(nn.MhaInput.self_attn(x)).context.numpy()
    np.testing.assert_allclose(np.concatenate([a.numpy(), b.numpy()], axis=1), whole, atol=1e-5, rtol=1e-5)
    new = Tensor.from_data(np.ones((1, 2, 1, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"KVCache.append: keep must be an int >= 0 or None, got -1"):
        nn.KVCache().append(new, new, keep=-1)
