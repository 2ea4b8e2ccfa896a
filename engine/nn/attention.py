"""Multi-head attention (Burn's `MultiHeadAttention`, `MhaInput`, `MhaOutput`) and masks.

Beyond Burn's layer, `MultiHeadAttentionConfig` takes what decoder families need: grouped-query
attention (`n_kv_heads`), a head size that is not `d_model / n_heads` (`head_dim`), linear maps
without bias (`bias`, `output_bias`), a causal mask (`causal`) and a rotary encoding applied to the
queries and keys of every head (`rotary`, or an `nn.RotaryEncoding` passed to `forward`), and a
key/value cache for generation (`KVCache`: the keys and values of earlier calls are kept and
attended to, never recomputed).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from ..tensor import Tensor
from ..tensor import raw
from ..tensor import trace as _trace
from . import _sdpa
from ._base import Config, Layer, assert_shape, check_dtype, dtype_value, initializers
from .activation import Gelu
from .dropout import DropoutConfig
from .linear import LinearConfig
from .pos_encoding import RotaryEncodingConfig
from ..shapes.rules import expect, float_input, same
from .spec import Burn, declare

__all__ = [
    "MultiHeadAttentionConfig", "MultiHeadAttention", "MhaInput", "MhaOutput", "KVCache",
    "generate_autoregressive_mask", "generate_padding_mask", "generate_segment_mask", "segment_positions",
    "packed_attention",
]


def _kaiming_default():
    return initializers.KaimingUniform(gain=1.0 / math.sqrt(3.0), fan_out_only=False)


def generate_autoregressive_mask(batch_size: int, seq_length: int, device=None) -> Tensor:
    """`[batch_size, seq_length, seq_length]` bool mask, true above the diagonal (future positions)."""
    import numpy as np  # noqa: PLC0415

    m = np.triu(np.ones((seq_length, seq_length), dtype=bool), k=1)
    return Tensor.from_data(np.broadcast_to(m, (batch_size, seq_length, seq_length)).copy(), device=device)


def generate_padding_mask(lengths, max_length: int | None = None, device=None) -> Tensor:
    """`[batch_size, max_length]` bool mask, true past each sequence's length."""
    import numpy as np  # noqa: PLC0415

    lengths = [int(n) for n in lengths]
    n = max(lengths) if max_length is None else int(max_length)
    return Tensor.from_data(np.arange(n)[None, :] >= np.asarray(lengths)[:, None], device=device)


def generate_segment_mask(segment_ids, device=None) -> Tensor:
    """`[batch_size, seq_length, seq_length]` bool mask, true where query `i` and key `j` lie in
    different segments of their row (`segment_ids` int `[batch_size, seq_length]`, a Tensor or
    array): sequences packed into one row attend only to themselves (a block-diagonal mask; the
    causal mask is the layer's own)."""
    import numpy as np  # noqa: PLC0415

    seg = np.asarray(segment_ids.numpy() if isinstance(segment_ids, Tensor) else segment_ids)
    if seg.ndim != 2 or seg.dtype.kind not in "iu":
        raise ValueError(f"segment_ids: expected int [batch_size, seq_length], found {seg.dtype} {list(seg.shape)}")
    if device is None and isinstance(segment_ids, Tensor):
        device = segment_ids.device
    return Tensor.from_data(seg[:, :, None] != seg[:, None, :], device=device)


def segment_positions(segment_ids):
    """Each position's index within its segment (int64 `[batch_size, seq_length]`, numpy), for
    segments that are runs of equal ids along the row: positions restart at 0 with each one."""
    import numpy as np  # noqa: PLC0415

    seg = np.asarray(segment_ids.numpy() if isinstance(segment_ids, Tensor) else segment_ids)
    idx = np.broadcast_to(np.arange(seg.shape[-1]), seg.shape)
    starts = np.ones(seg.shape, dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    first = np.maximum.accumulate(np.where(starts, idx, 0), axis=-1)
    return (idx - first).astype(np.int64)


def packed_attention(input_dims, position_ids=None, segment_ids=None, device=None):
    """(mask_attn or None, positions) for packed sequences of input `[batch_size, seq_length]`:
    `generate_segment_mask(segment_ids)` and `position_ids`, or without them `segment_positions`;
    each checked to have the input's dims."""
    dims = list(input_dims)
    for name, a in (("position_ids", position_ids), ("segment_ids", segment_ids)):
        if a is not None and list(a.shape) != dims:
            raise ValueError(f"{name}: expected dims {dims} (those of input_ids), found {list(a.shape)}")
    mask = None if segment_ids is None else generate_segment_mask(segment_ids, device)
    positions = position_ids if position_ids is not None else segment_positions(segment_ids)
    return mask, positions


class MhaInput:
    """Multi-head attention inputs: query, key, value and optional masks.

    `MhaInput.self_attn(x)`, `MhaInput(query, key, value)`; `.mask_pad(mask)` (true where the
    key position is padding, `[batch_size, seq_length_2]`) and `.mask_attn(mask)`
    (`[batch_size, seq_length_1, seq_length_2]`) return the input with the mask set.
    """

    __slots__ = ("query", "key", "value", "mask_pad_", "mask_attn_")

    def __init__(self, query, key, value, mask_pad=None, mask_attn=None):
        self.query, self.key, self.value = query, key, value
        self.mask_pad_, self.mask_attn_ = mask_pad, mask_attn

    @staticmethod
    def self_attn(tensor) -> "MhaInput":
        return MhaInput(tensor, tensor, tensor)

    @staticmethod
    def new(query, key, value) -> "MhaInput":
        return MhaInput(query, key, value)

    def mask_pad(self, mask_pad) -> "MhaInput":
        return MhaInput(self.query, self.key, self.value, mask_pad, self.mask_attn_)

    def mask_attn(self, mask_attn) -> "MhaInput":
        return MhaInput(self.query, self.key, self.value, self.mask_pad_, mask_attn)


class KVCache:
    """The keys and values one self-attention layer has computed so far, for generation.

    `keys` and `values` are `[batch_size, n_kv_heads, held, head_dim]` (after the rotary
    encoding): the last `held` of the `length` positions fed so far. `MultiHeadAttention.forward(...,
    cache=c)` appends the new positions' keys and values and attends over them and the held ones;
    the next call starts at position `length`. One cache serves one layer (`KVCache.layers(n)`
    makes one per layer of a model).

    A layer with a sliding `window` appends with `keep=window - 1`: after the call the cache
    holds only the last `window - 1` positions (the most a later query can see besides its own
    key), so its memory stays bounded however long the generation; `length` still counts every
    position fed (the rotary positions and the masks' columns), and the attention drops the
    masks' first `length - held` columns. A layer without a window holds every position.

    Outside a graph the keys and values are written into a buffer the cache owns, grown by
    doubling (or sized once by `capacity`, the most positions it will hold); a bounded cache
    moves its held positions to a fresh buffer of about twice `keep` when it runs out of room,
    so a step copies only its own positions, and `window - 1` of them once per about `window`
    steps. When the inputs take part in a graph (recording, autodiff, a trace) the cache
    concatenates tensors instead, so gradients flow through it, and holds every position (the
    ONNX export's `present` outputs are the whole past).
    """

    __slots__ = ("_k", "_v", "_dev", "_dt", "_at", "length", "held", "capacity")

    def __init__(self, capacity: int | None = None):
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"KVCache: capacity must be a positive int or None, got {capacity!r}")
        self.capacity = capacity
        self.reset()

    @staticmethod
    def layers(n_layers: int, capacity: int | None = None) -> list["KVCache"]:
        """One empty cache per layer."""
        return [KVCache(capacity) for _ in range(int(n_layers))]

    @staticmethod
    def holding(keys: Tensor, values: Tensor) -> "KVCache":
        """A cache that holds `keys` and `values` (`[batch_size, n_kv_heads, length, head_dim]`,
        length 0 allowed) as they are: what it is given next is joined to them by concatenation,
        so a trace records the join (the ONNX export's `past_key_values` inputs)."""
        if keys.rank != 4 or tuple(keys.shape) != tuple(values.shape):
            raise ValueError(f"KVCache.holding: expected keys and values of the same dims [batch_size, n_kv_heads, "
                             f"length, head_dim], found {list(keys.shape)} and {list(values.shape)}")
        c = KVCache()
        c._k, c._v, c._dev, c._dt = keys, values, keys.device, keys.dtype
        c.length = c.held = int(keys.shape[2])
        return c

    def reset(self) -> None:
        """Forget every position (the buffer is released)."""
        self._k = self._v = None
        self._dev = self._dt = None
        self._at = 0  # the buffer index of the first held position
        self.length = self.held = 0

    @property
    def keys(self) -> Tensor | None:
        """`[batch_size, n_kv_heads, held, head_dim]`, or None while empty."""
        return self._view(self._k)

    @property
    def values(self) -> Tensor | None:
        """`[batch_size, n_kv_heads, held, head_dim]`, or None while empty."""
        return self._view(self._v)

    @property
    def nbytes(self) -> int:
        """The bytes of the keys and values the cache owns (its buffers, room to grow included)."""
        if self._k is None:
            return 0
        if isinstance(self._k, Tensor):
            return 2 * int(raw.array(self._k).nbytes)
        return int(self._k.nbytes + self._v.nbytes)

    def _view(self, buf):
        if buf is None:
            return None
        if isinstance(buf, Tensor):
            return buf
        return raw.wrap(buf[:, :, self._at:self._at + self.held], self._dev)

    def append(self, key: Tensor, value: Tensor, keep: int | None = None) -> tuple[Tensor, Tensor]:
        """Add the keys and values of new positions (`[batch_size, n_kv_heads, seq_length, head_dim]`
        each) and return the held ones and the new ones (`held + seq_length` positions). `keep`
        (a sliding window's `window - 1`): afterwards hold only the last `keep` positions (outside
        a graph; the returned tensors stay valid)."""
        if key.rank != 4 or tuple(key.shape) != tuple(value.shape):
            raise ValueError(f"KVCache.append: expected keys and values of the same dims [batch_size, n_kv_heads, "
                             f"seq_length, head_dim], found {list(key.shape)} and {list(value.shape)}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise ValueError(f"KVCache.append: keep must be an int >= 0 or None, got {keep!r}")
        b, h, s, d = key.shape
        if self._k is not None:
            held = self._k.shape
            if (held[0], held[1], held[3]) != (b, h, d) or key.dtype != self._dt or key.device != self._dev:
                raise ValueError(
                    f"KVCache.append: the cache holds keys [batch_size {held[0]}, n_kv_heads {held[1]}, head_dim "
                    f"{held[3]}] {self._dt} on {self._dev}, the new ones are [{b}, {h}, {d}] {key.dtype} on "
                    f"{key.device} (one cache per layer and per batch; reset() it for another)")
        need = self.held + s
        if raw.tracking(key, value) or isinstance(self._k, Tensor):
            if self._k is None:
                self._k, self._v = key, value
            else:
                if not isinstance(self._k, Tensor):  # a graph joins a buffered cache: continue with tensors
                    self._k, self._v = self.keys, self.values
                    self._at = 0
                self._k, self._v = Tensor.cat([self._k, key], 2), Tensor.cat([self._v, value], 2)
            self._dev, self._dt = key.device, key.dtype
            self.length += s
            self.held = need
            return self._k, self._v
        kd, vd = raw.array(key), raw.array(value)
        if self._k is None or self._at + need > self._k.shape[2]:
            old = 0 if self._k is None else self._k.shape[2]
            if keep is None:
                cap = max(need, 2 * old, self.capacity or 0)
            else:  # room for `keep` held positions and about `keep` more steps before the next move
                room = 2 * keep + s
                cap = max(need, room if self.capacity is None else min(room, self.capacity))
            xp = key.device.xp
            k_buf, v_buf = xp.empty((b, h, cap, d), dtype=kd.dtype), xp.empty((b, h, cap, d), dtype=vd.dtype)
            if self.held:  # a fresh buffer: the views handed out keep the old one
                k_buf[:, :, :self.held] = self._k[:, :, self._at:self._at + self.held]
                v_buf[:, :, :self.held] = self._v[:, :, self._at:self._at + self.held]
            self._k, self._v, self._dev, self._dt, self._at = k_buf, v_buf, key.device, key.dtype, 0
        # positions already in the buffer are never written again: the views handed out stay valid
        end = self._at + self.held
        self._k[:, :, end:end + s] = kd
        self._v[:, :, end:end + s] = vd
        self.held, self.length = need, self.length + s
        out = self.keys, self.values
        if keep is not None and self.held > keep:
            self._at += self.held - keep
            self.held = keep
        return out

    def __repr__(self) -> str:
        held = "" if self.held == self.length else f", holding the last {self.held}"
        return f"KVCache(length {self.length}{held})"


class MhaOutput:
    """Attention `weights` `[batch_size, n_heads, seq_length_1, seq_length_2]` and `context`
    `[batch_size, seq_length_1, d_model]`."""

    __slots__ = ("weights", "context")

    def __init__(self, weights, context):
        self.weights, self.context = weights, context


@dataclass
class MultiHeadAttentionConfig(Config):
    """Configuration of a [`MultiHeadAttention`] layer.

    The defaults are Burn's layer. `n_kv_heads` (grouped-query attention, default `n_heads`): the
    key and value maps are `[d_model, n_kv_heads * head_dim]` and each key/value head serves a
    contiguous group of `n_heads / n_kv_heads` query heads (PyTorch's `repeat_interleave` order).
    `head_dim` defaults to `d_model // n_heads`. `bias` is the bias of the query, key and value maps,
    `output_bias` that of the output map (default: `bias`). `causal` masks every key after the
    query's position. `rotary` (a `RotaryEncodingConfig` with `d_model` = `head_dim`) is held by the
    layer and applied to the queries and keys per head.

    Decoder variants: `scale` replaces the scores' `1 / sqrt(head_dim)` (Gemma 2/3's
    `query_pre_attn_scalar ** -0.5`); `softcap` caps the scaled scores as `tanh(s / c) * c` before
    the masks (Gemma 2); `window` (causal only) is sliding-window attention: query `i` sees the keys
    `j` with `i - window < j <= i` (Mistral, Qwen2, Gemma 2/3's local layers; positions count
    every row index, padding included, as transformers' masks do); `qk_norm` (a norm config over
    `head_dim`, e.g. `RmsNormConfig`) adds `q_norm` / `k_norm`, applied to each head's queries and
    keys before the rotary encoding (Gemma 3, Qwen3).
    """

    d_model: int
    n_heads: int
    dropout: float = 0.1
    min_float: float = -1.0e4
    quiet_softmax: bool = False
    initializer: object = field(default_factory=_kaiming_default)
    n_kv_heads: int | None = None
    head_dim: int | None = None
    bias: bool = True
    output_bias: bool | None = None
    causal: bool = False
    rotary: RotaryEncodingConfig | None = None
    scale: float | None = None
    softcap: float | None = None
    window: int | None = None
    qk_norm: object = None

    def init(self, device=None) -> "MultiHeadAttention":
        n_kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        head_dim = self.d_model // self.n_heads if self.head_dim is None else self.head_dim
        for name, value in (("n_kv_heads", self.n_kv_heads), ("head_dim", self.head_dim)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"MultiHeadAttentionConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % n_kv:
            raise ValueError(f"MultiHeadAttentionConfig: n_heads ({self.n_heads}) must be a multiple of "
                             f"n_kv_heads ({n_kv})")
        if self.rotary is not None and self.rotary.d_model != head_dim:
            raise ValueError(f"MultiHeadAttentionConfig: the rotary encoding's d_model ({self.rotary.d_model}) "
                             f"must equal head_dim ({head_dim})")
        out_bias = self.bias if self.output_bias is None else self.output_bias
        if self.head_dim is None and n_kv == self.n_heads:
            q_dim = kv_dim = self.d_model  # Burn's layer: every map [d_model, d_model]
        else:
            q_dim, kv_dim = self.n_heads * head_dim, n_kv * head_dim
        init = self.initializer
        query = LinearConfig(self.d_model, q_dim, self.bias, init).init(device)
        key = LinearConfig(self.d_model, kv_dim, self.bias, init).init(device)
        value = LinearConfig(self.d_model, kv_dim, self.bias, init).init(device)
        output = LinearConfig(q_dim, self.d_model, out_bias, init).init(device)
        rotary = self.rotary.init(device) if self.rotary is not None else None
        for name, num in (("scale", self.scale), ("softcap", self.softcap)):
            if num is not None and (isinstance(num, bool) or not isinstance(num, (int, float)) or not num > 0):
                raise ValueError(f"MultiHeadAttentionConfig.{name} must be a positive number or None, got {num!r}")
        if self.window is not None:
            if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
                raise ValueError(f"MultiHeadAttentionConfig.window must be a positive int or None, got {self.window!r}")
            if not self.causal:
                raise ValueError("MultiHeadAttentionConfig: a sliding window needs causal=True")
        mha = MultiHeadAttention(
            query, key, value, output, DropoutConfig(self.dropout).init(), Gelu(), self.d_model, self.n_heads,
            head_dim, self.min_float, self.quiet_softmax, n_kv_heads=n_kv, causal=self.causal, rotary=rotary,
        )
        mha.scale = None if self.scale is None else float(self.scale)
        mha.softcap = None if self.softcap is None else float(self.softcap)
        mha.window = self.window
        if self.qk_norm is not None:
            if getattr(self.qk_norm, "d_model", head_dim) != head_dim:
                raise ValueError(f"MultiHeadAttentionConfig: qk_norm's d_model ({self.qk_norm.d_model}) must equal "
                                 f"head_dim ({head_dim})")
            mha.q_norm, mha.k_norm = self.qk_norm.init(device), self.qk_norm.init(device)
        return mha


class MultiHeadAttention(Layer):
    """Multi-head attention of "Attention Is All You Need": `query`, `key`, `value`, `output`
    linear maps (`[d_model, d_model]` by default); scores scaled by `1 / sqrt(d_k)`, masked entries
    set to `min_float`, softmax (or quiet softmax) over the keys. Dropout applies to the scores.

    With `n_kv_heads < n_heads` (grouped-query attention) the key and value maps have
    `n_kv_heads * d_k` outputs and key/value head `j` serves query heads `j * g .. j * g + g - 1`
    (`g = n_heads / n_kv_heads`). A rotary encoding (held in `rotary`, or passed to `forward`)
    rotates each head's queries and keys by their positions; `causal` masks the keys after each
    query's position."""

    def __init__(self, query, key, value, output, dropout, activation, d_model, n_heads, d_k, min_float,
                 quiet_softmax, n_kv_heads=None, causal=False, rotary=None):
        super().__init__()
        self.query = query
        self.key = key
        self.value = value
        self.output = output
        self.dropout = dropout
        self.activation = activation
        self.d_model = int(d_model)
        self.n_heads = int(n_heads)
        self.d_k = int(d_k)
        self.min_float = float(min_float)
        self.quiet_softmax = bool(quiet_softmax)
        self.n_kv_heads = int(n_heads if n_kv_heads is None else n_kv_heads)
        self.causal = bool(causal)
        self.rotary = rotary
        self.q_norm = self.k_norm = None  # MultiHeadAttentionConfig.qk_norm
        self.scale = self.softcap = self.window = None  # the decoder variants (see MultiHeadAttentionConfig)

    def forward(self, input: MhaInput, rotary=None, start: int | None = None, cache: KVCache | None = None,
                positions=None) -> MhaOutput:
        """Applies the forward pass on the input tensors.

        `rotary` (an `nn.RotaryEncoding` with `d_model` = `d_k`) is used instead of the layer's own;
        the queries and keys of this call take positions `start .. start + seq_length - 1` (default:
        0, or with a cache the number of positions it holds). The causal mask aligns the last query
        with the last key: query `i` sees keys `j <= i + seq_length_2 - seq_length_1`.

        `positions` (int `[batch_size, seq_length]`, self-attention): each row's own positions for
        the rotary encoding instead of `start ..` (packed sequences restarting at 0; with a
        `mask_attn` from `generate_segment_mask` each attends only to itself; with a cache, a
        left-padded row's positions counted from its first real token).

        `cache` (a `KVCache`, self-attention): this call's keys and values are appended to the
        cache's and the queries attend over all of them, so `seq_length_2` (the masks' last dim)
        is the cache's length before the call plus this call's key positions. With a `window`
        the cache keeps only the last `window - 1` positions after each call (all a later query
        can see): the masks' columns of the positions it no longer holds are left out, and the
        weights cover the held keys and the new ones (without a window, every key).

        # Shapes

        - query: `[batch_size, seq_length_1, d_model]`
        - key: `[batch_size, seq_length_2, d_model]`
        - value: `[batch_size, seq_length_2, d_model]`
        - mask_pad: `[batch_size, seq_length_2]`
        - mask_attn: `[batch_size, seq_length_1, seq_length_2]`
        - output weights: `[batch_size, n_heads, seq_length_1, seq_length_2]`
        - output context: `[batch_size, seq_length_1, d_model]`
        """
        assert_shape(input.query, [None, None, self.d_model])
        batch_size, seq_length_1, d_model = input.query.dims()
        assert_shape(input.key, [batch_size, None, self.d_model])
        seq_new = input.key.dims()[1]
        assert_shape(input.value, [batch_size, seq_new, self.d_model])
        past = 0 if cache is None else cache.length
        if start is None:
            start = past
        seq_length_2 = past + seq_new
        if input.mask_pad_ is not None:
            assert_shape(input.mask_pad_, [batch_size, seq_length_2])
        if input.mask_attn_ is not None:
            assert_shape(input.mask_attn_, [batch_size, seq_length_1, seq_length_2])
        weight = dtype_value(self.query.weight)
        check_dtype(self, input.query, weight, name="query", param_name="query weight")
        check_dtype(self, input.key, weight, name="key", param_name="query weight")
        check_dtype(self, input.value, weight, name="value", param_name="query weight")

        rope = rotary if rotary is not None else self.rotary
        query = self._heads(input.query, self.query, self.n_heads)
        key = self._heads(input.key, self.key, self.n_kv_heads)
        value = self._heads(input.value, self.value, self.n_kv_heads)
        if self.q_norm is not None:
            query, key = self.q_norm.forward(query), self.k_norm.forward(key)
        if positions is not None and seq_new != seq_length_1:
            raise ValueError("MultiHeadAttention: positions are for self-attention")
        if rope is not None:
            query = rope.apply(query, start, positions)
            key = rope.apply(key, start, positions)
        if cache is not None:
            dropped = cache.length - cache.held  # a windowed layer's cache no longer holds its first positions
            key, value = cache.append(key, value, None if self.window is None else self.window - 1)
            if dropped:  # the masks' columns of the positions held and new (each aligned with its last key)
                input, seq_length_2 = _masks_from(input, dropped), seq_length_2 - dropped
        scale = 1.0 / math.sqrt(self.d_k) if self.scale is None else self.scale
        causal_offset = seq_length_2 - seq_length_1 if self.causal else None
        p = max(self.dropout.rate_for(query), self.dropout.rate_for(key))  # the scores' rate
        window = None
        if self.window is not None and causal_offset is not None and (seq_length_2 > self.window or _trace.is_active()):
            # a trace records the window at every length (all false within it): the ONNX export's ops do not change
            window = _window_mask(seq_length_1, seq_length_2, causal_offset, self.window, query.device)
        if _trace.is_active() or self.softcap is not None:  # a trace (ONNX export, the graph view) records the op chain
            weights, context = self._attend_ops(query, key, value, input, scale, causal_offset, window)
        else:
            mask = _one_mask(input, batch_size, seq_length_1, seq_length_2)
            if window is not None:
                mask = raw.array(window) if mask is None else (mask | raw.array(window))
            weights, context = _sdpa.scaled_dot_product_attention(
                query, key, value, scale, mask=mask,
                causal_offset=causal_offset, min_float=self.min_float, quiet=self.quiet_softmax, dropout=p)
        context = context.swap_dims(1, 2).reshape(batch_size, seq_length_1, self.n_heads * self.d_k)
        return MhaOutput(weights, self.output.forward(context))

    def _attend_ops(self, query, key, value, input, scale, causal_offset, window=None):
        """The attention as a chain of tensor ops, what a trace records (ONNX export writes each
        op): the numbers of `_sdpa.scaled_dot_product_attention`, one node per op."""
        batch_size, _, seq_length_1, _ = query.shape
        seq_length_2 = key.shape[2]
        groups = self.n_heads // self.n_kv_heads
        if groups == 1:
            scores = query @ key.transpose()
        else:  # [b, kv, g, s1, d_k] @ [b, kv, 1, d_k, s2]: each kv head serves its group, not copied
            q5 = query.reshape(batch_size, self.n_kv_heads, groups, seq_length_1, self.d_k)
            scores = (q5 @ key.unsqueeze(2).transpose()).reshape(batch_size, self.n_heads, seq_length_1,
                                                                 seq_length_2)
        scores = scores * scale
        if self.softcap is not None:
            scores = (scores * (1.0 / self.softcap)).tanh() * self.softcap
        scores = self.dropout.forward(scores)
        if input.mask_pad_ is not None:
            scores = scores.mask_fill(input.mask_pad_.reshape(batch_size, 1, 1, seq_length_2), self.min_float)
        if input.mask_attn_ is not None:
            scores = scores.mask_fill(
                input.mask_attn_.reshape(batch_size, 1, seq_length_1, seq_length_2), self.min_float
            )
        if causal_offset is not None:
            scores = scores.mask_fill(_causal_mask(seq_length_1, seq_length_2, scores.device), self.min_float)
        if window is not None:
            scores = scores.mask_fill(window, self.min_float)
        weights = scores.quiet_softmax(3) if self.quiet_softmax else scores.softmax(3)
        if groups == 1:
            context = weights @ value
        else:
            w5 = weights.reshape(batch_size, self.n_kv_heads, groups, seq_length_1, seq_length_2)
            context = (w5 @ value.unsqueeze(2)).reshape(batch_size, self.n_heads, seq_length_1, self.d_k)
        return weights, context

    def _heads(self, x, linear, n_heads):
        b, s, _ = x.shape
        return linear.forward(x).reshape(b, s, n_heads, self.d_k).swap_dims(1, 2)

    def custom_content(self, content):
        content = (
            content.add("d_model", self.d_model)
            .add("n_heads", self.n_heads)
        )
        if self.n_kv_heads != self.n_heads:
            content = content.add("n_kv_heads", self.n_kv_heads)
        content = (
            content.add("d_k", self.d_k)
            .add("dropout", self.dropout.prob)
            .add("min_float", self.min_float)
            .add("quiet_softmax", self.quiet_softmax)
        )
        if self.causal:
            content = content.add("causal", self.causal)
        for name in ("scale", "softcap", "window"):
            if getattr(self, name) is not None:
                content = content.add(name, getattr(self, name))
        return content.optional()


def _one_mask(input: MhaInput, batch_size: int, seq_length_1: int, seq_length_2: int):
    """The padding and attention masks as one bool array `[batch_size, 1, seq_length_1 or 1,
    seq_length_2]` (true: masked), or None without either."""
    pad, attn = input.mask_pad_, input.mask_attn_
    m = None if pad is None else raw.array(pad).reshape(batch_size, 1, 1, seq_length_2)
    if attn is not None:
        a = raw.array(attn).reshape(batch_size, 1, seq_length_1, seq_length_2)
        m = a if m is None else (m | a)
    return m


def _masks_from(input: MhaInput, dropped: int) -> MhaInput:
    """`input` with its masks' first `dropped` key columns left out."""
    pad, attn = input.mask_pad_, input.mask_attn_
    if pad is not None:
        pad = pad.narrow(1, dropped, pad.shape[1] - dropped)
    if attn is not None:
        attn = attn.narrow(2, dropped, attn.shape[2] - dropped)
    return MhaInput(input.query, input.key, input.value, pad, attn)


def _causal_mask(seq_length_1: int, seq_length_2: int, device) -> Tensor:
    """`[1, 1, seq_length_1, seq_length_2]` bool, true where key `j` comes after query `i`, the last
    query aligned with the last key (`j - (seq_length_2 - seq_length_1) > i`)."""
    import numpy as np  # noqa: PLC0415

    m = np.triu(np.ones((seq_length_1, seq_length_2), dtype=bool), k=1 + seq_length_2 - seq_length_1)
    return Tensor.from_data(m.reshape(1, 1, seq_length_1, seq_length_2), device=device)


@functools.lru_cache(maxsize=4)  # a few shapes: a long row's mask is seq_length_1 * seq_length_2 bytes
def _window_mask(seq_length_1: int, seq_length_2: int, offset: int, window: int, device) -> Tensor:
    """`[1, 1, seq_length_1, seq_length_2]` bool, true where key `j` lies `window` or more positions
    before query `i` (at `i + offset`, the last query aligned with the last key): `j <= i + offset - window`.
    Made once per shape (every sliding layer of a forward, and every training step, share it)."""
    import numpy as np  # noqa: PLC0415

    m = np.tril(np.ones((seq_length_1, seq_length_2), dtype=bool), k=offset - window)
    return Tensor.from_data(m.reshape(1, 1, seq_length_1, seq_length_2), device=device)


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _mha_shape(m, ins, ctx):  # self-attention on one input, or the tensors of an MhaInput: query, key, value, masks
    expect("assert_shape(input.query, [None, None, self.d_model])", ins[0], [None, None, m.d_model])
    float_input("MultiHeadAttention", ins[0], "query")
    if len(ins) >= 3:
        batch_size = ins[0].dims[0]
        expect("assert_shape(input.key, [batch_size, None, self.d_model])", ins[1], [batch_size, None, m.d_model])
        seq_length_2 = ins[1].dims[1]
        expect("assert_shape(input.value, [batch_size, seq_length_2, self.d_model])", ins[2],
               [batch_size, seq_length_2, m.d_model])
        float_input("MultiHeadAttention", ins[1], "key")
        float_input("MultiHeadAttention", ins[2], "value")
    return same(ins[0])


declare(MultiHeadAttention, shape=_mha_shape)
declare(MultiHeadAttention, burn=Burn("attention", call="{m}.forward(MhaInput::self_attn({x})).context",
                                     extra_imports=(("attention", "MhaInput"),)))
declare(MultiHeadAttention, call="self_attn")  # the designer calls forward(MhaInput.self_attn(x)).context
