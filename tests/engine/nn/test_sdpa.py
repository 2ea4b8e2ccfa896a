"""The fused scaled-dot-product attention (issue 22): `engine.nn._sdpa.scaled_dot_product_attention`
and `MultiHeadAttention` on it, against a NumPy reference written here (kv heads repeated, scores
scaled, dropped, masked to `min_float`, softmax or quiet softmax); gradients of q, k, v (through
the context and through the weights) against central finite differences in float64; the dropout
draw and its gradient; a work count (one tape node, a bounded number of score-sized arrays) that
fails if the op is unfused again."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine import Device, Tensor, nn
from engine.nn._sdpa import scaled_dot_product_attention
from engine.tensor import TensorError
from engine.tensor.cpu import threads
from engine.tensor.cpu.threads import num_threads, set_num_threads
from tests.engine.gradcheck import check_grads, numeric_grad
from tests.engine.work_count import graph_ops, step_memory

RNG = np.random.default_rng(22)


def _ref(q, k, v, scale, mask=None, causal_offset=None, min_float=-1.0e4, quiet=False, mult=None):
    """Attention in NumPy: weights [b, h, s1, s2] and context [b, h, s1, dv]."""
    g = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kr) * scale
    if mult is not None:
        s = s * mult
    full = np.zeros(s.shape, dtype=bool)
    if mask is not None:
        full |= np.broadcast_to(mask, s.shape)
    if causal_offset is not None:
        s1, s2 = s.shape[-2:]
        full |= (np.arange(s2)[None, :] > np.arange(s1)[:, None] + causal_offset)[None, None]
    s = np.where(full, min_float, s)
    if quiet:
        m = np.maximum(s.max(-1, keepdims=True), 0)
        e = np.exp(s - m)
        w = e / (e.sum(-1, keepdims=True) + np.exp(-m))
    else:
        e = np.exp(s - s.max(-1, keepdims=True))
        w = e / e.sum(-1, keepdims=True)
    return w, np.einsum("bhij,bhjd->bhid", w, vr)


def _qkv(b, h, hk, s1, s2, d, dv=None, dtype=np.float64):
    dv = d if dv is None else dv
    return (RNG.standard_normal((b, h, s1, d)).astype(dtype), RNG.standard_normal((b, hk, s2, d)).astype(dtype),
            RNG.standard_normal((b, hk, s2, dv)).astype(dtype))


def _t(a):
    return Tensor.from_data(a, dtype=str(a.dtype))


CASES = {
    # name: (b, h, hk, s1, s2, d, mask builder, causal_offset, quiet)
    "mha": (2, 3, 3, 4, 4, 5, None, None, False),
    "gqa": (2, 6, 2, 3, 5, 4, None, None, False),
    "mqa causal": (1, 4, 1, 5, 5, 3, None, 0, False),
    "pad mask": (3, 2, 2, 4, 6, 3, lambda b, s1, s2: RNG.random((b, 1, 1, s2)) < 0.4, None, False),
    "attn mask": (2, 4, 2, 3, 4, 2, lambda b, s1, s2: RNG.random((b, 1, s1, s2)) < 0.3, None, False),
    "causal cache s1 != s2": (2, 4, 2, 2, 7, 3, lambda b, s1, s2: RNG.random((b, 1, 1, s2)) < 0.2, 5, False),
    "quiet": (2, 2, 1, 3, 4, 4, lambda b, s1, s2: RNG.random((b, 1, s1, s2)) < 0.3, None, True),
    "per-head mask": (2, 4, 2, 3, 3, 2, lambda b, s1, s2: RNG.random((b, 4, s1, s2)) < 0.3, None, False),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_the_numpy_reference(name, dtype):
    b, h, hk, s1, s2, d, make_mask, off, quiet = CASES[name]
    q, k, v = _qkv(b, h, hk, s1, s2, d, dv=d + 1, dtype=dtype)
    mask = make_mask(b, s1, s2) if make_mask else None
    scale = 1.0 / math.sqrt(d)
    w, c = scaled_dot_product_attention(_t(q), _t(k), _t(v), scale, mask=None if mask is None else Tensor.from_data(mask),
                                        causal_offset=off, quiet=quiet)
    rw, rc = _ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale, mask, off, quiet=quiet)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    assert w.dtype == c.dtype == str(np.dtype(dtype))
    assert w.shape == (b, h, s1, s2) and c.shape == (b, h, s1, d + 1)
    np.testing.assert_allclose(w.numpy(), rw, **tol)
    np.testing.assert_allclose(c.numpy(), rc, **tol)


@pytest.mark.parametrize("s1, s2, off", [(1, 9, 8), (1, 9, 12), (3, 5, 4), (4, 6, 2)])
def test_a_causal_mask_is_built_once_and_not_at_all_where_no_key_is_in_the_future(s1, s2, off, monkeypatch):
    """A decode step's one query over the cache sees every key: no mask is built for it (the
    generation profile found one built in every layer of every step); a mask that masks something
    is built once for its shape and reused."""
    from engine.nn import _sdpa

    built = []
    real = _sdpa.causal_mask_array
    monkeypatch.setattr(_sdpa, "causal_mask_array", lambda *a: built.append(a[1:]) or real(*a))
    monkeypatch.setattr(_sdpa, "_CAUSAL", {})
    q, k, v = _qkv(2, 4, 2, s1, s2, 3)
    rw, rc = _ref(q, k, v, 0.5, None, off)
    for _ in range(3):  # three layers of one step
        w, c = scaled_dot_product_attention(_t(q), _t(k), _t(v), 0.5, causal_offset=off)
        np.testing.assert_allclose(w.numpy(), rw, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(c.numpy(), rc, rtol=1e-10, atol=1e-12)
    assert built == ([] if off >= s2 - 1 else [(s1, s2, off)])


def test_a_row_with_every_key_masked_is_uniform_as_before():
    q, k, v = _qkv(2, 2, 2, 3, 4, 3)
    mask = np.zeros((2, 1, 3, 4), dtype=bool)
    mask[0, 0, 1] = True  # every key of query 1 in batch 0
    mask[1, 0, :, 2] = True
    w, c = scaled_dot_product_attention(_t(q), _t(k), _t(v), 0.5, mask=mask)
    np.testing.assert_array_equal(w.numpy()[0, :, 1], np.full((2, 4), 0.25))
    rw, rc = _ref(q, k, v, 0.5, mask)
    np.testing.assert_allclose(w.numpy(), rw, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(c.numpy(), rc, rtol=1e-12, atol=1e-14)


def _grad_case(name):
    b, h, hk, s1, s2, d, make_mask, off, quiet = CASES[name]
    q, k, v = _qkv(b, h, hk, s1, s2, d)
    mask = make_mask(b, s1, s2) if make_mask else None
    return q, k, v, mask, off, quiet, 1.0 / math.sqrt(d)


@pytest.mark.parametrize("name", ["mha", "gqa", "causal cache s1 != s2", "quiet", "per-head mask"])
@pytest.mark.parametrize("output", ["context", "weights"])
def test_gradients_of_q_k_v_match_finite_differences(name, output):
    q, k, v, mask, off, quiet, scale = _grad_case(name)
    pick = 1 if output == "context" else 0
    check_grads(lambda a, b_, c: scaled_dot_product_attention(a, b_, c, scale, mask=mask, causal_offset=off,
                                                               quiet=quiet)[pick], q, k, v)


def test_gradients_with_an_all_masked_row_and_both_outputs_used():
    q, k, v = _qkv(1, 4, 2, 3, 4, 2)
    mask = np.zeros((1, 1, 3, 4), dtype=bool)
    mask[0, 0, 2] = True  # the uniform row: no gradient flows into its masked scores
    mask[0, 0, 0, 1] = True

    def fn(a, b, c):
        w, ctx = scaled_dot_product_attention(a, b, c, 0.7, mask=mask, min_float=-3.0)
        return ctx.sum_dim(3) + w.sum_dim(3) * 0.5

    check_grads(fn, q, k, v)


def test_only_the_inputs_in_a_graph_get_gradients():
    q, k, v = _qkv(2, 4, 2, 3, 3, 2)
    tq, tk, tv = _t(q).require_grad(), _t(k), _t(v).require_grad()
    grads = scaled_dot_product_attention(tq, tk, tv, 0.5, causal_offset=0)[1].sum().backward()
    assert tk.grad(grads) is None
    assert tq.grad(grads).shape == q.shape and tv.grad(grads).shape == v.shape


def test_dropout_draws_as_tensor_dropout_and_its_gradient_matches_finite_differences():
    dev = Device("cpu:5")
    p = 0.3
    q, k, v = _qkv(2, 4, 2, 3, 5, 3)
    mask = RNG.random((2, 1, 1, 5)) < 0.3
    scale = 1.0 / math.sqrt(3)
    dev.seed(7)
    tq, tk, tv = (Tensor.from_data(a, device=dev, dtype="float64").require_grad() for a in (q, k, v))
    w, c = scaled_dot_product_attention(tq, tk, tv, scale, mask=mask, causal_offset=2, dropout=p)
    dev.seed(7)  # the same draw as Tensor.dropout on the scores: one uniform per score
    mult = (dev.rng.random((2, 4, 3, 5), dtype=np.float64) >= p) * (1.0 / (1.0 - p))
    assert (mult == 0).any() and (mult != 0).any()
    rw, rc = _ref(q, k, v, scale, mask, 2, mult=mult)
    np.testing.assert_allclose(w.numpy(), rw, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(c.numpy(), rc, rtol=1e-12, atol=1e-14)

    probe = RNG.standard_normal(rc.shape)
    grads = (c * Tensor.from_data(probe, device=dev, dtype="float64")).sum().backward()

    def scalar(a, b, cc):
        return float((_ref(a, b, cc, scale, mask, 2, mult=mult)[1] * probe).sum())

    for i, t in enumerate((tq, tk, tv)):
        np.testing.assert_allclose(t.grad(grads).numpy(), numeric_grad(scalar, [q, k, v], i), rtol=1e-6, atol=1e-8)


def test_the_layer_with_dropout_draws_what_the_unfused_layer_drew():
    """In training mode the layer's dropout on the scores: the same uniforms, the same kept
    scores scaled by 1 / (1 - p), as the op chain's `Tensor.dropout` gave."""
    dev = Device("cpu:6")
    dev.set_default_float_dtype("float64")
    try:
        m = nn.MultiHeadAttentionConfig(8, 4, dropout=0.5, n_kv_heads=2).init(dev)
        x = RNG.standard_normal((2, 3, 8))
        m.forward(nn.MhaInput.self_attn(Tensor.from_data(x, device=dev)))  # the lazy parameters, before the seed
        dev.seed(11)
        out = m.forward(nn.MhaInput.self_attn(Tensor.from_data(x, device=dev).autodiff()))
        dev.seed(11)
        mult = (dev.rng.random((2, 4, 3, 3), dtype=np.float64) >= 0.5) * 2.0
    finally:
        dev.set_default_float_dtype("float32")

    def heads(lin, n):
        y = x @ lin.weight.val().numpy() + lin.bias.val().numpy()
        return y.reshape(2, 3, n, 2).transpose(0, 2, 1, 3)

    rw, rc = _ref(heads(m.query, 4), heads(m.key, 2), heads(m.value, 2), 1.0 / math.sqrt(2), mult=mult)
    np.testing.assert_allclose(out.weights.numpy(), rw, rtol=1e-12, atol=1e-14)
    ctx = rc.transpose(0, 2, 1, 3).reshape(2, 3, 8)
    expected = ctx @ m.output.weight.val().numpy() + m.output.bias.val().numpy()
    np.testing.assert_allclose(out.context.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_the_layer_with_masks_causal_and_a_cache_matches_the_reference(dev64):
    m = nn.MultiHeadAttentionConfig(12, 6, dropout=0.0, n_kv_heads=3, causal=True).init(dev64)
    x = RNG.standard_normal((2, 5, 12))
    pad = np.zeros((2, 5), dtype=bool)
    pad[1, 0] = True
    attn = RNG.random((2, 2, 5)) < 0.3
    cache = nn.KVCache()
    m.forward(nn.MhaInput.self_attn(Tensor.from_data(x[:, :3], device=dev64)), cache=cache)
    out = m.forward(nn.MhaInput.self_attn(Tensor.from_data(x[:, 3:], device=dev64))
                    .mask_pad(Tensor.from_data(pad, device=dev64)).mask_attn(Tensor.from_data(attn, device=dev64)),
                    cache=cache)

    def heads(lin, n, rows):
        y = x[:, rows] @ lin.weight.val().numpy() + lin.bias.val().numpy()
        return y.reshape(2, -1, n, 2).transpose(0, 2, 1, 3)

    mask = pad[:, None, None, :] | attn[:, None]
    rw, rc = _ref(heads(m.query, 6, slice(3, 5)), heads(m.key, 3, slice(0, 5)), heads(m.value, 3, slice(0, 5)),
                  1.0 / math.sqrt(2), mask, causal_offset=3)
    np.testing.assert_allclose(out.weights.numpy(), rw, rtol=1e-10, atol=1e-12)
    expected = rc.transpose(0, 2, 1, 3).reshape(2, 2, 12) @ m.output.weight.val().numpy() + m.output.bias.val().numpy()
    np.testing.assert_allclose(out.context.numpy(), expected, rtol=1e-10, atol=1e-12)


def _force_threaded(monkeypatch, phased: bool) -> list:
    """Make the kernel share its blocks among the threads even for these small tests (and run
    "phased" when asked: BLAS's thread count cannot be set); returns a list that records, per
    `run_chunks` call of the kernel, whether it went to the threads."""
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(threads, "blas_threads", lambda: 2)
    if phased:
        monkeypatch.setattr(threads, "one_blas_thread_possible", lambda: False)
    return _record_sharing(monkeypatch)


def _record_sharing(monkeypatch) -> list:
    """A list that records, per `run_chunks` call of the kernel, whether its blocks are handed
    to the threads (at least `min_blocks` of them, and two or more)."""
    from engine.tensor import cpu

    shared = []
    real = cpu.run_chunks

    def recording(fn, blocks, min_blocks=2, **kw):
        blocks = list(blocks)
        shared.append(len(blocks) >= min_blocks and len(blocks) > 1)
        return real(fn, blocks, min_blocks, **kw)

    monkeypatch.setattr(cpu, "run_chunks", recording)  # the door the kernel calls
    return shared


@pytest.mark.parametrize("blas", ["held at one thread", "products whole (phased)"])
def test_the_forward_makes_the_score_product_once(blas, monkeypatch):
    """q k^T is made once per score, whether per block or whole before the blocks (phased)."""
    shared = _force_threaded(monkeypatch, phased=blas != "held at one thread")
    b, h, s, d = 6, 8, 64, 8
    q, k, v = _qkv(b, h, 2, s, s, d, dtype=np.float32)
    score_macs = []
    real = np.matmul

    def counting(x, y, *args, **kwargs):
        if np.shape(x)[-1] == d and np.shape(y)[-2:] == (d, s):
            score_macs.append(int(np.prod(np.broadcast_shapes(np.shape(x)[:-1], np.shape(y)[:-2] + (1,)))) * d * s)
        return real(x, y, *args, **kwargs)

    tq, tk, tv = (_t(a) for a in (q, k, v))
    old = num_threads()
    set_num_threads(2)
    monkeypatch.setattr(np, "matmul", counting)
    try:
        scaled_dot_product_attention(tq, tk, tv, 0.35, causal_offset=0)
    finally:
        monkeypatch.setattr(np, "matmul", real)
        set_num_threads(old)
    assert shared and all(shared), "the blocks did not go to the kernel threads"
    assert sum(score_macs) == b * h * s * s * d, (score_macs, b * h * s * s * d)


@pytest.mark.parametrize("blas", ["held at one thread", "products whole (phased)"])
def test_large_inputs_split_into_blocks_over_threads_give_the_same_numbers(blas, monkeypatch):
    """Enough scores for several blocks and both kernel threads: the same bits as one thread,
    whether each thread makes its blocks' products with OpenBLAS held at one thread (its count
    restored after) or the products run whole where BLAS's threads cannot be set."""
    shared = _force_threaded(monkeypatch, phased=blas != "held at one thread")
    api = threads._openblas_api()
    before = int(api[1]()) if api is not None else None
    q, k, v = _qkv(6, 8, 2, 64, 64, 8, dtype=np.float32)
    old = num_threads()
    res = []
    try:
        for n in (1, 2):
            set_num_threads(n)
            tq, tk, tv = (_t(a).require_grad() for a in (q, k, v))
            w, c = scaled_dot_product_attention(tq, tk, tv, 0.35, causal_offset=0, quiet=True)
            grads = (c * c).sum().backward()
            res.append([w.numpy(), c.numpy()] + [t.grad(grads).numpy() for t in (tq, tk, tv)])
    finally:
        set_num_threads(old)
    assert any(shared), "the blocks never went to the kernel threads"
    if api is not None:
        assert int(api[1]()) == before
    rw, rc = _ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 0.35, None, 0, quiet=True)
    np.testing.assert_allclose(res[0][0], rw, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res[0][1], rc, rtol=1e-4, atol=1e-5)
    for a, b in zip(res[0], res[1]):
        np.testing.assert_array_equal(a, b)  # each block's arithmetic does not depend on the thread count


def test_blocks_go_to_the_threads_by_the_products_work_not_only_the_scores_bytes(monkeypatch):
    """The small GPT's attention (batch 16, one head of 32, seq 128): 1 MB of scores, under
    PARALLEL_MIN_BYTES, but 2^23 multiply-adds of products: its blocks are shared at 2 threads,
    forward and backward, with the same bits as at one thread. A tiny attention (2^13
    multiply-adds) stays in the calling thread."""
    assert threads.PARALLEL_MIN_BYTES > 16 * 128 * 128 * 4  # the rule under test, not the bytes one
    calls = _record_sharing(monkeypatch)
    old = num_threads()
    res = []
    data = {shape: _qkv(shape[0], shape[1], shape[1], shape[2], shape[2], shape[3], dtype=np.float32)
            for shape in ((16, 1, 128, 32), (2, 1, 8, 8))}
    try:
        for shape, n in (((16, 1, 128, 32), 1), ((16, 1, 128, 32), 2), ((2, 1, 8, 8), 2)):
            set_num_threads(n)
            calls.clear()
            q, k, v = data[shape]
            tq, tk, tv = (_t(a).require_grad() for a in (q, k, v))
            w, c = scaled_dot_product_attention(tq, tk, tv, shape[3] ** -0.5, causal_offset=0)
            grads = (c * c).sum().backward()
            res.append(([w.numpy(), c.numpy()] + [t.grad(grads).numpy() for t in (tq, tk, tv)], list(calls)))
    finally:
        set_num_threads(old)
    assert res[0][1] == [False, False]  # one thread: forward and backward run here
    assert res[1][1] == [True, True], res[1][1]  # two: both shared by the products' work
    assert res[2][1] == [False, False], res[2][1]  # tiny: the wake-up would cost more
    for a, b in zip(res[0][0], res[1][0]):
        np.testing.assert_array_equal(a, b)
    q, k, v = (a.astype(np.float64) for a in data[16, 1, 128, 32])
    rw, rc = _ref(q, k, v, 32 ** -0.5, None, 0)  # the threaded blocks against NumPy in float64
    np.testing.assert_allclose(res[1][0][0], rw, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res[1][0][1], rc, rtol=1e-4, atol=1e-5)


def test_wrong_inputs_say_what_was_expected_and_found():
    q, k, v = _qkv(2, 4, 2, 3, 5, 2)
    with pytest.raises(TensorError, match=r"mask's dims \[2, 1, 3, 4\] do not broadcast .*seq_length_2 5"):
        scaled_dot_product_attention(_t(q), _t(k), _t(v), 1.0, mask=np.zeros((2, 1, 3, 4), dtype=bool))
    with pytest.raises(TensorError, match=r"expected a bool mask, found float64"):
        scaled_dot_product_attention(_t(q), _t(k), _t(v), 1.0, mask=np.zeros((2, 1, 3, 5)))
    with pytest.raises(TensorError, match=r"query's heads \(4\) must be a multiple of the key's \(3\)"):
        scaled_dot_product_attention(_t(q), _t(np.zeros((2, 3, 5, 2))), _t(np.zeros((2, 3, 5, 2))), 1.0)
    with pytest.raises(TensorError, match=r"expected the key as \[batch_size, heads, seq_length, head_dim\]"):
        scaled_dot_product_attention(_t(q), _t(k[0]), _t(v), 1.0)


# ---------------------------------------------------------------------- work count (no timing)
def test_the_layer_records_one_attention_node():
    m = nn.MultiHeadAttentionConfig(16, 4, dropout=0.1, n_kv_heads=2, causal=True).init()
    x = Tensor.from_data(RNG.standard_normal((2, 5, 16), dtype=np.float32)).require_grad()
    pad = Tensor.from_data(np.array([[0, 0, 0, 0, 1], [0] * 5], dtype=bool))
    ops = graph_ops(m.forward(nn.MhaInput.self_attn(x).mask_pad(pad)).context.sum())
    assert ops["scaled_dot_product_attention"] == 1, ops
    for unfused in ("softmax", "quiet_softmax", "mask_fill", "matmul", "dropout", "mul"):
        assert ops[unfused] == 0, ops
    # 4 linear maps, the 3 head splits (reshape, swap_dims), the merge (swap_dims, reshape), the sum
    assert sum(n for op, n in ops.items() if op != "leaf") <= 14, ops


def test_forward_and_backward_allocate_a_bounded_number_of_score_arrays():
    """At one thread, scores of [2, 8, 64, 64] float32 (256 KB, one block) dominate. After the
    forward the graph keeps the weights (one score array), the dropout's dropped entries (a byte
    each) and the context: 1.41 score arrays; forward + backward peak at 2.99 (the block's dW and
    the gradients). The op chain (`MultiHeadAttention._attend_ops`) held 3.18 and peaked at 5.36."""
    b, h, hk, s, d = 2, 8, 2, 64, 8
    q, k, v = _qkv(b, h, hk, s, s, d, dtype=np.float32)
    unit = b * h * s * s * 4
    tq, tk, tv = (_t(a).require_grad() for a in (q, k, v))
    old = num_threads()
    set_num_threads(1)
    try:
        def step():
            c = scaled_dot_product_attention(tq, tk, tv, 0.3, causal_offset=0, dropout=0.1)[1]
            return c

        _, held, peak = step_memory(step, lambda c: c.sum().backward())
    finally:
        set_num_threads(old)
    assert held <= 1.6 * unit, held / unit  # 1.41 today
    assert peak <= 3.5 * unit, peak / unit  # 2.99 today


@pytest.mark.parametrize("case", ["causal", "all-masked rows", "min_float near the scores", "quiet", "weights"])
def test_a_longer_causal_sequence_keeps_the_numbers(case):
    """64 queries and keys, causal, with rows whose every visible key is masked too (uniform over
    all keys, as before), a min_float the scores come near, quiet softmax, the weights' gradient:
    values against the reference and gradients against finite differences."""
    b, h, hk, s, d = 2, 2, 1, 64, 2
    q, k, v = _qkv(b, h, hk, s, s, d)
    mask = None
    min_float, quiet, pick = -1.0e4, case == "quiet", 0 if case == "weights" else 1
    if case == "all-masked rows":
        mask = np.zeros((b, 1, 1, s), dtype=bool)
        mask[1, 0, 0, :20] = True  # rows 0..19 of batch 1 see only masked keys: uniform over all 64
    if case == "min_float near the scores":
        min_float = -2.0
    scale = 0.8
    w, c = scaled_dot_product_attention(_t(q), _t(k), _t(v), scale, mask=mask, causal_offset=0, min_float=min_float,
                                        quiet=quiet)
    rw, rc = _ref(q, k, v, scale, mask, 0, min_float=min_float, quiet=quiet)
    np.testing.assert_allclose(w.numpy(), rw, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(c.numpy(), rc, rtol=1e-10, atol=1e-13)
    if case == "all-masked rows":
        np.testing.assert_allclose(w.numpy()[1, :, :20], 1.0 / s, rtol=1e-12)
    check_grads(lambda a, b_, c_: scaled_dot_product_attention(a, b_, c_, scale, mask=mask, causal_offset=0,
                                                                min_float=min_float, quiet=quiet)[pick], q, k, v)


# ---------------------------------------------------------------------- non-finite scores under the mask
def _masked_key_case(kind, b=2, h=4, hk=2, s=5, d=3):
    """q, k, v (float64), the mask (or None), the causal offset, and the (batch, kv head, key)
    positions masked for every query of their batch entry and head, where a bad key may go."""
    q, k, v = _qkv(b, h, hk, s, s, d)
    off = None
    if kind == "pad, per batch entry":
        mask = np.zeros((b, 1, 1, s), dtype=bool)
        mask[1, 0, 0, s - 1] = True
        bad = [(1, j, s - 1) for j in range(hk)]
    elif kind == "per head":  # query heads 2, 3 share kv head 1: its key 2 masked for both
        mask = RNG.random((b, h, s, s)) < 0.2
        mask[:, 2:4, :, 2] = True
        bad = [(i, 1, 2) for i in range(b)]
    elif kind == "shared by every entry":  # the compiled softmax takes float32 without dropout
        mask = np.zeros((1, 1, s, s), dtype=bool)
        mask[..., 1] = True
        bad = [(1, j, 1) for j in range(hk)]
    elif kind == "causal and pad":
        mask = np.zeros((b, 1, 1, s), dtype=bool)
        mask[0, 0, 0, 0] = True
        off = 0
        bad = [(0, j, 0) for j in range(hk)]
    else:  # "causal only": offset -1 hides the last key from every query (the cached mask)
        mask, off = None, -1
        bad = [(1, 0, s - 1)]
    return q, k, v, mask, off, bad


# q k^T and dS k meet the NaN / inf keys (in the kernel threads too, where np.errstate does not reach)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("threaded", [None, "own products", "phased"], ids=["1 thread", "2 threads", "2 threads phased"])
@pytest.mark.parametrize("compiled", [True, False], ids=["kernels on", "EMBER_JIT=0"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "huge"])
@pytest.mark.parametrize("kind", ["pad, per batch entry", "per head", "shared by every entry", "causal and pad",
                                  "causal only"])
def test_a_nan_or_inf_at_a_masked_key_stays_out_of_every_row(kind, bad, dtype, compiled, threaded, monkeypatch):
    """A masked score is replaced by min_float whatever it held (PyTorch's masked_fill): the
    weights, context and gradients are those of the same inputs with that key made finite, and
    the float64 NumPy reference's. The NumPy path computed `score * 0 + min_float`: NaN at a
    NaN or infinite score, and every row of its batch entry and head NaN (issue 43, item 13).
    "huge": finite keys whose scores overflow (dq = dS k then stays finite too)."""
    from engine.tensor.cpu import jit

    q, k, v, mask, off, bad_at = _masked_key_case(kind)
    clean = k.copy()
    big = {np.float64: 1e308, np.float32: 3e38}[dtype]
    for i, j, key in bad_at:
        k[i, j, key] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "huge": big}[bad]
        clean[i, j, key] = 0.0
    q, k, v, clean = (a.astype(dtype) for a in (q, k, v, clean))
    shared = []
    if threaded:  # a block per batch entry and kv head, shared by the two threads
        from engine.tensor.cpu import attention

        shared = _force_threaded(monkeypatch, phased=threaded == "phased")
        monkeypatch.setattr(attention, "BLOCK_BYTES", 1)
    old_jit, old_n = jit.set_enabled(compiled), num_threads()
    set_num_threads(2 if threaded else 1)
    res = []
    try:
        for keys in (k, clean):
            tq, tk, tv = (_t(a).require_grad() for a in (q, keys, v))
            w, c = scaled_dot_product_attention(tq, tk, tv, 0.6, mask=mask, causal_offset=off)
            grads = ((c * c).sum() + (w * w).sum()).backward()  # dq = dS k: 0 * NaN, as in PyTorch
            res.append([w.numpy(), c.numpy()] + [t.grad(grads).numpy() for t in (tq, tk, tv)])
    finally:
        jit.set_enabled(old_jit)
        set_num_threads(old_n)
    assert all(shared) and len(shared) == (6 if threaded else 0), shared  # forward, both backward rules; twice
    (w, c, dq, dk, dv), (cw, cc, cdq, cdk, cdv) = res
    assert np.isfinite(w).all() and np.isfinite(c).all(), f"{np.isnan(c).sum()} of {c.size} context values NaN"
    rw, rc = _ref(*(a.astype(np.float64) for a in (q, clean, v)), 0.6, mask, off)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(w, rw, **tol)
    np.testing.assert_allclose(c, rc, **tol)
    np.testing.assert_array_equal(w, cw)  # the masked scores were min_float both times: the same bits
    np.testing.assert_array_equal(c, cc)
    np.testing.assert_array_equal(dv, cdv)
    np.testing.assert_array_equal(dk, cdk)  # no gradient reaches the masked scores: 0 at the bad keys
    for i, j, key in bad_at:
        assert not dk[i, j, key].any()
    if bad == "huge":
        np.testing.assert_allclose(dq, cdq, rtol=1e-6, atol=1e-12)
    else:  # the rows that never read a non-finite key
        ok = np.ones(q.shape[:2], dtype=bool)
        g = q.shape[1] // k.shape[1]
        for i, j, _ in bad_at:
            ok[i, j * g:(j + 1) * g] = False
        assert ok.any()
        np.testing.assert_array_equal(dq[ok], cdq[ok])


@pytest.mark.parametrize("compiled", [True, False], ids=["kernels on", "EMBER_JIT=0"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("traced", [False, True], ids=["fused", "traced op chain"])
def test_the_layer_with_a_padding_mask_ignores_a_nan_padded_key(dtype, compiled, traced):
    """The issue's case through `MultiHeadAttention`: batch 2, a padding mask, NaN in entry 1's
    padded key. Was 80 of 80 of that entry's context values NaN (float64, and float32 as the mask
    differs per entry); now the context of the same inputs with that key finite, and the NumPy
    reference's."""
    from engine.tensor.cpu import jit
    from engine.tensor.trace import Tracer

    dev = Device("cpu:7")
    dev.set_default_float_dtype(dtype)
    old_jit = jit.set_enabled(compiled)
    try:
        m = nn.MultiHeadAttentionConfig(16, 2, dropout=0.0).init(dev)
        x = RNG.standard_normal((2, 5, 16))
        key = x.copy()
        key[1, 4] = np.nan
        pad = np.zeros((2, 5), dtype=bool)
        pad[1, 4] = True
        outs = []
        for kk in (key, x):
            inp = nn.MhaInput(*(Tensor.from_data(a, device=dev) for a in (x, kk, x)))
            inp = inp.mask_pad(Tensor.from_data(pad, device=dev))
            with np.errstate(invalid="ignore"):  # the NaN key's scores
                if traced:
                    with Tracer() as tr:
                        out = m.forward(inp)
                    assert "mask_fill" in tr.trace.op_names()
                else:
                    out = m.forward(inp)
            outs.append(out.context.numpy())
    finally:
        jit.set_enabled(old_jit)
        dev.set_default_float_dtype("float32")
    assert np.isfinite(outs[0]).all(), f"{np.isnan(outs[0]).sum()} of {outs[0].size} values NaN"
    np.testing.assert_array_equal(outs[0], outs[1])

    def heads(lin):
        w, bias = (a.numpy().astype(np.float64) for a in (lin.weight.val(), lin.bias.val()))
        return (x.astype(dtype).astype(np.float64) @ w + bias).reshape(2, 5, 2, 8).transpose(0, 2, 1, 3)

    _, rc = _ref(heads(m.query), heads(m.key), heads(m.value), 1.0 / math.sqrt(8), pad[:, None, None, :])
    ow, ob = (a.numpy().astype(np.float64) for a in (m.output.weight.val(), m.output.bias.val()))
    expected = rc.transpose(0, 2, 1, 3).reshape(2, 5, 16) @ ow + ob
    np.testing.assert_allclose(outs[0], expected, **(dict(rtol=1e-10, atol=1e-12) if dtype == "float64"
                                                      else dict(rtol=1e-4, atol=1e-5)))
