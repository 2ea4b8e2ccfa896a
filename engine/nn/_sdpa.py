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

Grouped-query attention: key/value head `j` serves query heads `j * g .. j * g + g - 1` by
broadcasting (k and v are never copied per head); in the backward the `g` query heads of a group
are stacked as `g * seq_1` rows of one product, so that dk and dv come out summed over the group.

On NumPy the work runs a block of batch entries (or of kv heads within one entry) at a time:
both products and every softmax pass of a block happen while its scores are in cache. The
blocks are shared among the kernel threads (`engine.tensor.cpu`; NumPy releases the GIL),
each making its own products with OpenBLAS held at one thread; only where BLAS's thread count
cannot be set do the products run whole (BLAS threads them) and the passes between them a block
at a time. The row sums are products with a vector of ones. The masks replace the masked
scores by `min_float` and their gradients by 0, whatever they held: and-ing a value's bits with
all ones keeps it, with zeros clears it even where it is NaN or infinite, and or-ing in
`min_float`'s bits sets it. So a NaN or inf at a masked key stays out of every row, as in the
compiled softmax and the traced op chain (`scores * 0 + min_float` was NaN there, and so was
every row of its batch entry and head). The causal mask's arrays are made once per shape. The
backward keeps only the weights, the context (an output), the dropout's dropped entries (one
byte each) and the mask, never intermediate copies.
"""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor, TensorError, cpu
from ..tensor.raw import array, record, tracking, untracked

__all__ = ["scaled_dot_product_attention", "causal_mask_array"]

def causal_mask_array(xp, seq_length_1: int, seq_length_2: int, offset: int):
    """`[seq_length_1, seq_length_2]` bool, true where key `j > i + offset` (a future key)."""
    return xp.triu(xp.ones((seq_length_1, seq_length_2), dtype=bool), k=1 + int(offset))


_CAUSAL: dict = {}  # (device, dtype, s1, s2, offset, min_float) -> the causal mask's bit masks (None: none)
_MISSING = object()


def _mask_bits(xp, m, dt, c_min):
    """(mask, keep, fill): unsigned integers of the dtype's width, all ones / zero where kept /
    masked, and zero / `min_float`'s bits, to apply to the scores' (and their gradients') bits
    with `bitwise_and` / `bitwise_or`: a replacement as fast as a multiply, exact for any value.
    (`scores * 0` is NaN where a score is NaN or infinite, and then so was every row's softmax.)"""
    ut = np.dtype(f"u{dt.itemsize}")
    keep = xp.where(m, ut.type(0), ~ut.type(0))
    fill = xp.where(m, c_min, dt.type(0.0)).view(ut)
    return m, keep, fill


def _bits(a):
    """A float array's bits as unsigned integers (a view)."""
    return a.view(f"u{a.dtype.itemsize}")


def _grouped(a, nb, hk, rows, last):
    """`a` `[nb, h, s, last]` as `[nb, hk, g * s, last]` (a copy only when its layout needs one)."""
    return a.reshape(nb, hk, rows, last)


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
      `j > i + causal_offset`. Masked scores are set to `min_float` whatever they held (a NaN or
      inf at a masked key reaches no row; a row with every key masked gets a uniform softmax)
      and receive no gradient (0, never NaN).
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
    mm = cpu.matmul  # on NumPy: OpenBLAS's threads by the product's size
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
    causal_only = m is None and causal_offset is not None
    if causal_offset is not None and not causal_only:
        m = xp.logical_or(m, causal_mask_array(xp, s1, s2, causal_offset)[None, None])
    if m is not None and not bool(m.any()):
        m = None

    # dropout: the same draw as Tensor.dropout on the [b, h, s1, s2] scores
    keep = None
    keep_scale = None
    p = float(dropout)
    if p > 0.0:
        if p >= 1.0:
            keep_scale = zero
        else:
            with dev.context():
                u = dev.rng.random((b, h, s1, s2), dtype=np.float64 if dt == np.float64 else np.float32)
                keep = u >= p  # one byte a score: multiplying by it beats copyto(where=) 5x on random masks
                del u
            keep_scale = dt.type(1.0 / (1.0 - p))

    # the mask as bits: (scores & keep) | fill puts min_float on masked scores, whatever they
    # held, keeping the others' bits; the backward's gradients are and-ed with keep
    fill = keepbits = None
    if causal_only and int(causal_offset) < s2 - 1:  # some key lies after a query (not a decode step's
        # one query over the cache, which sees every key); the same arrays every step: made once
        key = (id(dev), dt.str, s1, s2, int(causal_offset), float(min_float))
        cached = _CAUSAL.get(key, _MISSING)
        if cached is _MISSING:  # a mask with nothing masked is cached too (as None)
            cm = causal_mask_array(xp, s1, s2, causal_offset)[None, None]
            cached = _mask_bits(xp, cm, dt, c_min) if cm.any() else None
            if len(_CAUSAL) >= 32:
                _CAUSAL.clear()
            _CAUSAL[key] = cached
        if cached is not None:
            m, keepbits, fill = cached
    elif m is not None:
        keepbits, fill = _mask_bits(xp, m, dt, c_min)[1:]
    mask_b, mask_h = (m.shape[0] > 1, m.shape[1] > 1) if m is not None else (False, False)
    # the compiled softmax (one pass over a row while it is in cache, not ~8): float32 on NumPy
    # without dropout, with no mask or one [s1, s2] mask shared by every batch entry and head
    ksm = mask2 = None
    if xp is np and dt == np.float32 and keep_scale is None and not (mask_b or mask_h):
        ksm = cpu.kernels()
        if ksm is not None:
            mask2 = (np.zeros((0, 0), np.bool_) if m is None
                     else np.ascontiguousarray(np.broadcast_to(m.reshape(m.shape[-2:]), (s1, s2))))

    weights = xp.empty((b, h, s1, s2), dtype=dt)
    ctx = xp.empty((b, s1, h, dv), dtype=dt).transpose(0, 2, 1, 3)  # [b, h, s1, dv], laid out [b, s1, h, dv]
    # 5-d views [b, kv heads, group, rows, cols]: each kv head serves its group by broadcasting
    W5 = weights.reshape(b, hk, g, s1, s2)
    Q5 = qd.reshape(b, hk, g, s1, d)
    K5 = kd[:, :, None]
    V5 = vd[:, :, None]
    C5 = ctx.reshape(b, hk, g, s1, dv)
    KT5 = K5.swapaxes(-1, -2)
    ones = xp.ones((s2, 1), dtype=dt)

    def of_mask(arr, bs, hs):
        """A mask-shaped array for a block: [nb or 1, nk or 1, g or 1, s1, s2]."""
        a = arr[bs] if mask_b else arr
        return a.reshape(a.shape[0], hk, g, s1, s2)[:, hs] if mask_h else a[:, :, None]

    def of_keep(bs, hs):
        return keep[bs].reshape(-1, hk, g, s1, s2)[:, hs]

    def softmax_passes(S, bs, hs):
        """The scores S of a block made weights in place, one NumPy pass per operation."""
        xp.multiply(S, c_scale, out=S)
        if keep_scale is not None:  # (S * scale) * (kept) * 1 / (1 - p): Tensor.dropout's bits
            if keep is not None:
                xp.multiply(S, of_keep(bs, hs), out=S)
            xp.multiply(S, keep_scale, out=S)
        if m is not None:  # (S & keep) | fill: min_float where masked, whatever S held there
            Sb = _bits(S)
            xp.bitwise_and(Sb, of_mask(keepbits, bs, hs), out=Sb)
            xp.bitwise_or(Sb, of_mask(fill, bs, hs), out=Sb)
        mx = S.max(axis=-1, keepdims=True)
        if quiet:
            xp.maximum(mx, zero, out=mx)
        xp.subtract(S, mx, out=S)
        xp.exp(S, out=S)
        tot = mm(S.reshape(-1, s2), ones).reshape(mx.shape)  # the row sums, by BLAS
        if quiet:
            xp.negative(mx, out=mx)
            xp.exp(mx, out=mx)
            tot += mx
        xp.divide(S, tot, out=S)

    def attend(bs, hs):
        """The weights and context of a block of batch entries and kv heads."""
        S = W5[bs, hs]  # contiguous: a block spans whole kv heads or one batch entry
        if not phased:  # (phased: made whole before the blocks)
            mm(Q5[bs, hs], KT5[bs, hs], out=S)
        if ksm is not None:
            ksm.attention_softmax(S.reshape(-1, s1, s2), c_scale, mask2, c_min, bool(quiet))
        else:
            softmax_passes(S, bs, hs)
        if not phased:
            mm(S, V5[bs, hs], out=C5[bs, hs])

    blocks = cpu.attention.blocks(b, hk, rows * s2 * dt.itemsize, xp)
    threaded, phased = cpu.attention.plan(len(blocks), weights.nbytes, weights.size * (d + dv), xp)
    # A block's products and passes run together while its scores are in cache, each kernel
    # thread making its own products with BLAS held at one thread (`own_products`): OpenBLAS
    # splits even the small per-head products (128 x 32 x 128) over its threads, and calls made
    # from two kernel threads at once then wait on each other and on its spinning threads
    # (measured at 2 threads: the blocked attention at 1.5x its one-thread time with BLAS at 2
    # threads, at 0.6x the op chain's with BLAS held at one). Where BLAS's threads cannot be set,
    # the products run whole, threaded by BLAS, and only the passes between them go to the
    # kernel threads, a block each ("phased"). The CPU door decides both (`cpu.attention.plan`).
    if phased:
        mm(Q5, KT5, out=W5)
    cpu.run_chunks(lambda run: [attend(*blk) for blk in run], blocks, min_blocks=2 if threaded else len(blocks) + 1,
               own_products=True)
    if phased:
        mm(W5, V5, out=C5)

    inputs = (q, k, v)
    if not tracking(*inputs):
        return untracked(weights, inputs), untracked(ctx, inputs)
    need_q, need_k, need_v = q.is_tracked(), k.is_tracked(), v.is_tracked()
    qg = None  # the queries grouped [b, hk, g * s1, d] for dk (a copy when g > 1), made once

    def grads(g_ctx, g_w):
        """dq, dk, dv from the gradient of the context (`g_ctx`) or of the weights (`g_w`)."""
        nonlocal qg
        with_v = need_v and g_ctx is not None
        dq = xp.empty((b, s1, h, d), dtype=dt).transpose(0, 2, 1, 3) if need_q else None
        dk = xp.empty((b, s2, hk, d), dtype=dt).transpose(0, 2, 1, 3) if need_k else None
        dvv = xp.empty((b, s2, hk, dv), dtype=dt).transpose(0, 2, 1, 3) if with_v else None
        dq5 = dq.reshape(b, hk, g, s1, d) if need_q else None
        if need_k and qg is None:
            qg = _grouped(qd, b, hk, rows, d)
        VT5 = V5.swapaxes(-1, -2)
        G5 = g_ctx.reshape(b, hk, g, s1, dv) if g_ctx is not None else None
        gg = _grouped(g_ctx, b, hk, rows, dv) if with_v else None
        Wg = weights.reshape(b, hk, rows, s2)

        def first(bs, hs, out=None):
            """dW (from the context's gradient) or the weights' gradient, as a fresh array (or
            into `out`) that becomes dS; the row term D = rowsum(dW * W) [nb, nk, g, s1, 1]."""
            if g_ctx is not None:
                dS = mm(G5[bs, hs], VT5[bs, hs], out=out)
                # rowsum(dW * W) = rowsum(dC * C): over the context's rows, not the scores'
                return dS, (G5[bs, hs] * C5[bs, hs]).sum(axis=-1, keepdims=True)
            if out is None:
                out = xp.empty((bs.stop - bs.start, hs.stop - hs.start, g, s1, s2), dtype=dt)
            out[...] = g_w[bs].reshape(-1, hk, g, s1, s2)[:, hs]
            return out, None

        def middle(dS, D, bs, hs):
            """dS = W * (dW - D), masked and dropped entries 0, the dropout's scale."""
            W = W5[bs, hs]
            if ksm is not None and dS.flags.c_contiguous:
                d_rows = D.reshape(-1, s1) if D is not None else np.zeros((0, 0), np.float32)
                ksm.attention_softmax_backward(dS.reshape(-1, s1, s2), W.reshape(-1, s1, s2),
                                               np.ascontiguousarray(d_rows), D is not None, mask2)
                return
            if D is None:
                D = (dS * W).sum(axis=-1, keepdims=True)
            xp.subtract(dS, D, out=dS)
            xp.multiply(dS, W, out=dS)
            if m is not None:  # 0, not W * (dW - D) * 0: NaN where that is not finite
                dSb = _bits(dS)
                xp.bitwise_and(dSb, of_mask(keepbits, bs, hs), out=dSb)
            if keep_scale is not None:
                if keep is not None:
                    xp.multiply(dS, of_keep(bs, hs), out=dS)
                xp.multiply(dS, keep_scale, out=dS)

        def last(dS, bs, hs):
            """dq, dk, dv of a block (dk and dv summed over each group by one product)."""
            nb, nk = bs.stop - bs.start, hs.stop - hs.start
            if need_q:
                out = dq5[bs, hs]
                mm(dS, K5[bs, hs], out=out)
                out *= c_scale
            if need_k:
                r = mm(dS.reshape(nb, nk, rows, s2).swapaxes(-1, -2), qg[bs, hs])
                r *= c_scale
                dk[bs, hs] = r
            if with_v:
                dvv[bs, hs] = mm(Wg[bs, hs].swapaxes(-1, -2), gg[bs, hs])

        if phased:
            dS_all, D_all = first(slice(0, b), slice(0, hk))
            cpu.run_chunks(lambda run: [middle(dS_all[bs, hs], None if D_all is None else D_all[bs, hs], bs, hs)
                                    for bs, hs in run], blocks)
            last(dS_all, slice(0, b), slice(0, hk))
        else:
            def backward_run(run):
                for bs, hs in run:
                    dS, D = first(bs, hs)
                    middle(dS, D, bs, hs)
                    last(dS, bs, hs)

            cpu.run_chunks(backward_run, blocks, min_blocks=2 if threaded else len(blocks) + 1, own_products=True)
        return dq, dk, dvv

    def ctx_rule(gc):
        return grads(gc, None)

    def w_rule(gw):
        dq, dk, _ = grads(None, gw)
        return dq, dk

    op = "scaled_dot_product_attention"
    out_context = record(ctx, dev, inputs, ctx_rule, op)
    out_weights = record(weights, dev, (q, k), w_rule, op + "_weights")
    return out_weights, out_context
