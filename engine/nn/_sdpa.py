"""Scaled-dot-product attention as one fused op with its own backward (issue 22).

`MultiHeadAttention` used to build attention from small tensor ops (a product of the queries
and keys, the scale, dropout, up to three `mask_fill`s, the softmax, a product with the values),
each recording a tape node and allocating `[batch, heads, seq_1, seq_2]` arrays in the forward
and again in the backward. `scaled_dot_product_attention` computes the same numbers in one
kernel and records one node for the context (and one for the weights, reached only when a loss
reads them), whose rules give dq, dk, dv analytically:

    S = scale * q k^T;  S = S * dropout_keep / (1 - p);  S[mask] = min_float;  W = softmax(S);  C = W v
    dW = dC v^T;  dv = W^T dC;  dS = W * (dW - rowsum(dW * W))  (rowsum(dW * W) = rowsum(dC * C));
    dS[mask] = 0;  dS = dS * dropout_keep / (1 - p);  dq = scale * dS k;  dk = scale * dS^T q

Grouped-query attention: key/value head `j` serves query heads `j * g .. j * g + g - 1`; the
`g` query heads of a group are stacked as `g * seq_1` rows of one product with that key head, so
k and v are never copied per head and dk, dv are summed over the group by the product itself.

On NumPy the work runs a block of batch entries (or of kv heads within one entry) at a time:
both products and every softmax pass of a block happen while its scores are in cache, and the
blocks are shared among the kernel threads (`engine.tensor.threads`; NumPy and BLAS release the
GIL). The backward keeps only the weights, the context (an output), the dropout's dropped
entries (one byte each) and the mask, never intermediate copies.
"""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor, TensorError
from ..tensor.raw import array, record, tracking, untracked
from ..tensor.threads import PARALLEL_MIN_BYTES, run_chunks

__all__ = ["scaled_dot_product_attention", "causal_mask_array"]

# scores bytes per block: a block's scores, the backward's dW and the products' operands stay
# within a core's L2 cache (512 KB on the AMD EPYC this was tuned on)
_BLOCK_BYTES = 1 << 18


def causal_mask_array(xp, seq_length_1: int, seq_length_2: int, offset: int):
    """`[seq_length_1, seq_length_2]` bool, true where key `j > i + offset` (a future key)."""
    return xp.triu(xp.ones((seq_length_1, seq_length_2), dtype=bool), k=1 + int(offset))


def _grouped(a, nb, hk, rows, last):
    """`a` `[nb, h, s, last]` as `[nb, hk, g * s, last]` (a copy only when its layout needs one)."""
    return a.reshape(nb, hk, rows, last)


def _blocks(b: int, hk: int, unit_bytes: int, xp) -> list[tuple[slice, slice]]:
    """(batch slice, kv-head slice) blocks of about `_BLOCK_BYTES` of scores each."""
    if xp is not np:
        return [(slice(0, b), slice(0, hk))]
    entry = unit_bytes * hk
    if entry >= _BLOCK_BYTES and hk > 1:  # one batch entry is large: split it over its kv heads
        per = max(1, _BLOCK_BYTES // max(1, unit_bytes))
        return [(slice(i, i + 1), slice(j, min(hk, j + per))) for i in range(b) for j in range(0, hk, per)]
    per = max(1, _BLOCK_BYTES // max(1, entry))
    return [(slice(i, min(b, i + per)), slice(0, hk)) for i in range(0, b, per)]


def _check(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int, int]:
    op = "scaled_dot_product_attention"
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.rank != 4:
            raise TensorError(f"{op}: expected the {name} as [batch_size, heads, seq_length, head_dim], "
                              f"found dims {list(t.shape)}")
        if array(t).dtype.kind != "f":
            raise TensorError(f"{op}: expected a float {name}, found {t.dtype} (dims {list(t.shape)})")
    b, h, s1, d = q.shape
    bk, hk, s2, dk = k.shape
    if tuple(v.shape) != (bk, hk, s2, v.shape[3]) or bk != b or dk != d:
        raise TensorError(f"{op}: the query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} do not "
                          f"fit [batch_size, heads, seq_length_1, head_dim], [batch_size, kv_heads, seq_length_2, "
                          f"head_dim] and [batch_size, kv_heads, seq_length_2, value_dim]")
    if h % hk:
        raise TensorError(f"{op}: the query's heads ({h}) must be a multiple of the key's ({hk})")
    if q.device is not k.device or q.device is not v.device:
        raise TensorError(f"{op}: the query, key and value are on different devices ({q.device}, {k.device}, "
                          f"{v.device}); move them with to_device()")
    return b, h, s1, d, hk, s2


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, mask=None, causal_offset=None,
                                 min_float: float = -1.0e4, quiet: bool = False,
                                 dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """`(weights, context)` of attention of `q` `[b, h, s1, d]` over `k` `[b, hk, s2, d]`, `v`
    `[b, hk, s2, dv]` (`h` a multiple of `hk`: grouped-query attention).

    - `scale`: the scores are `scale * q k^T`.
    - `dropout`: probability of zeroing a score (after the scale, before the masks), the rest
      scaled by `1 / (1 - p)`: the draw is the device generator's, the same as `Tensor.dropout`
      on the scores. 0 draws nothing.
    - `mask`: a bool tensor or array broadcastable to `[b, h, s1, s2]`, true where the score is
      masked; `causal_offset` (an int, or None): also mask key `j` for query `i` when
      `j > i + causal_offset`. Masked scores are set to `min_float` (so a row with every key
      masked gets a uniform softmax) and receive no gradient.
    - `quiet`: Burn's quiet softmax (an extra implicit zero logit).

    `weights` is `[b, h, s1, s2]`, `context` `[b, h, s1, dv]` (its memory laid out as
    `[b, s1, h, dv]`, so that `swap_dims(1, 2).reshape(b, s1, h * dv)` copies nothing).
    """
    b, h, s1, d, hk, s2 = _check(q, k, v)
    dv = v.shape[3]
    g = h // hk
    rows = g * s1
    dev = q.device
    xp = dev.xp
    qd, kd, vd = array(q), array(k), array(v)
    dt = np.result_type(qd.dtype, kd.dtype, vd.dtype)
    if dt != qd.dtype or dt != kd.dtype or dt != vd.dtype:
        raise TensorError(f"scaled_dot_product_attention: the query ({q.dtype}), key ({k.dtype}) and value "
                          f"({v.dtype}) must share a float dtype")
    c_scale = dt.type(scale)
    c_min = dt.type(min_float)
    zero = dt.type(0.0)

    # one mask, built once: the given mask and the causal one, broadcast to [b or 1, h or 1, s1, s2]
    m = None
    if mask is not None:
        m = array(mask) if isinstance(mask, Tensor) else xp.asarray(mask)
        if m.dtype != np.bool_:
            raise TensorError(f"scaled_dot_product_attention: expected a bool mask, found {m.dtype} "
                              f"(dims {list(m.shape)})")
        try:
            np.broadcast_shapes(m.shape, (b, h, s1, s2))
        except ValueError:
            raise TensorError(f"scaled_dot_product_attention: the mask's dims {list(m.shape)} do not broadcast to "
                              f"the scores' [batch_size {b}, heads {h}, seq_length_1 {s1}, seq_length_2 {s2}]") from None
        while m.ndim < 4:
            m = m[None]
    if causal_offset is not None:
        cm = causal_mask_array(xp, s1, s2, causal_offset)[None, None]
        m = cm if m is None else xp.logical_or(m, cm)
    if m is not None and not bool(m.any()):
        m = None
    mask_b, mask_h = (m.shape[0] > 1, m.shape[1] > 1) if m is not None else (False, False)

    # dropout: the same draw as Tensor.dropout on the [b, h, s1, s2] scores
    drop = None
    keep_scale = None
    p = float(dropout)
    if p > 0.0:
        if p >= 1.0:
            keep_scale = zero
        else:
            with dev.context():
                u = dev.rng.random((b, h, s1, s2), dtype=np.float64 if dt == np.float64 else np.float32)
                drop = u < p
                del u
            keep_scale = dt.type(1.0 / (1.0 - p))

    weights = xp.empty((b, h, s1, s2), dtype=dt)
    ctx_mem = xp.empty((b, s1, h, dv), dtype=dt)
    ctx = ctx_mem.transpose(0, 2, 1, 3)  # [b, h, s1, dv]
    w5 = weights.reshape(b, hk, g, s1, s2)
    kT = kd.swapaxes(-1, -2)

    def mask_of(bs, hs):
        """The mask for a block of batch entries and kv heads, as [nb or 1, ng or 1, s1, s2]."""
        mb = m[bs] if mask_b else m
        if mask_h:
            mb = mb[:, hs.start * g:hs.stop * g]
        return mb

    def drop_of(bs, hs):
        return drop[bs, hs.start * g:hs.stop * g]

    def forward_chunk(blocks):
        for bs, hs in blocks:
            nb, nk = bs.stop - bs.start, hs.stop - hs.start
            qg = _grouped(qd[bs, hs.start * g:hs.stop * g], nb, nk, rows, d)
            S = w5[bs, hs].reshape(nb, nk, rows, s2)  # a view of the weights
            xp.matmul(qg, kT[bs, hs], out=S)
            S4 = S.reshape(nb, nk * g, s1, s2)
            xp.multiply(S, c_scale, out=S)
            if keep_scale is not None:
                xp.multiply(S, keep_scale, out=S)
                if drop is not None:
                    xp.copyto(S4, zero, where=drop_of(bs, hs))
            if m is not None:
                xp.copyto(S4, c_min, where=mask_of(bs, hs))
            mx = S.max(axis=-1, keepdims=True)
            if quiet:
                xp.maximum(mx, zero, out=mx)
            xp.subtract(S, mx, out=S)
            xp.exp(S, out=S)
            tot = S.sum(axis=-1, keepdims=True)
            if quiet:
                xp.negative(mx, out=mx)
                xp.exp(mx, out=mx)
                tot += mx
            xp.divide(S, tot, out=S)
            cg = xp.matmul(S, vd[bs, hs])  # [nb, nk, g * s1, dv]
            ctx[bs, hs.start * g:hs.stop * g] = cg.reshape(nb, nk * g, s1, dv)

    unit = rows * s2 * dt.itemsize
    blocks = _blocks(b, hk, unit, xp)
    run_chunks(forward_chunk, blocks, min_blocks=2 if weights.nbytes >= PARALLEL_MIN_BYTES else len(blocks) + 1)

    inputs = (q, k, v)
    if not tracking(*inputs):
        return untracked(weights, inputs), untracked(ctx, inputs)
    need_q, need_k, need_v = q.is_tracked(), k.is_tracked(), v.is_tracked()

    def grads(g_ctx, g_w):
        """dq, dk, dv from the gradient of the context (`g_ctx`) or of the weights (`g_w`)."""
        with_v = need_v and g_ctx is not None
        dq_mem = xp.empty((b, s1, h, d), dtype=dt) if need_q else None
        dq = dq_mem.transpose(0, 2, 1, 3) if need_q else None
        dk_mem = xp.empty((b, s2, hk, d), dtype=dt) if need_k else None
        dk = dk_mem.transpose(0, 2, 1, 3) if need_k else None
        dv_mem = xp.empty((b, s2, hk, dv), dtype=dt) if with_v else None
        dvv = dv_mem.transpose(0, 2, 1, 3) if with_v else None
        vT = vd.swapaxes(-1, -2)

        def backward_chunk(chunk):
            for bs, hs in chunk:
                nb, nk = bs.stop - bs.start, hs.stop - hs.start
                hsl = slice(hs.start * g, hs.stop * g)
                W = w5[bs, hs].reshape(nb, nk, rows, s2)
                if g_ctx is not None:
                    gc4 = g_ctx[bs, hsl]
                    gg = _grouped(gc4, nb, nk, rows, dv)
                    dS = xp.matmul(gg, vT[bs, hs])  # dW
                    if with_v:
                        dvv[bs, hs] = xp.matmul(W.swapaxes(-1, -2), gg)
                    # rowsum(dW * W) = rowsum(dC * C): the context's rows, not the scores'
                    D = (gc4 * ctx[bs, hsl]).sum(axis=-1).reshape(nb, nk, rows, 1)
                else:
                    dS = _grouped(g_w[bs, hsl], nb, nk, rows, s2).copy()
                    D = (dS * W).sum(axis=-1, keepdims=True)
                xp.subtract(dS, D, out=dS)
                xp.multiply(dS, W, out=dS)
                dS4 = dS.reshape(nb, nk * g, s1, s2)
                if m is not None:
                    xp.copyto(dS4, zero, where=mask_of(bs, hs))
                if keep_scale is not None:
                    xp.multiply(dS, keep_scale, out=dS)
                    if drop is not None:
                        xp.copyto(dS4, zero, where=drop_of(bs, hs))
                if need_q:
                    r = xp.matmul(dS, kd[bs, hs])
                    r *= c_scale
                    dq[bs, hsl] = r.reshape(nb, nk * g, s1, d)
                if need_k:
                    qg = _grouped(qd[bs, hsl], nb, nk, rows, d)
                    r = xp.matmul(dS.swapaxes(-1, -2), qg)
                    r *= c_scale
                    dk[bs, hs] = r

        run_chunks(backward_chunk, blocks,
                   min_blocks=2 if weights.nbytes >= PARALLEL_MIN_BYTES else len(blocks) + 1)
        return dq, dk, dvv

    def ctx_rule(gc):
        return grads(gc, None)

    def w_rule(gw):
        dq, dk, _ = grads(None, gw)
        return dq, dk

    op = "scaled_dot_product_attention"
    context = record(ctx, dev, inputs, ctx_rule, op)
    weights_t = record(weights, dev, (q, k), w_rule, op + "_weights")
    return weights_t, context
