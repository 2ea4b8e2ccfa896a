"""Multi-head attention (Burn's `MultiHeadAttention`, `MhaInput`, `MhaOutput`) and masks."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..tensor import Tensor
from ._base import Config, Layer, assert_shape, check_dtype, initializers
from .activation import Gelu
from .dropout import DropoutConfig
from .linear import LinearConfig

__all__ = [
    "MultiHeadAttentionConfig", "MultiHeadAttention", "MhaInput", "MhaOutput",
    "generate_autoregressive_mask", "generate_padding_mask",
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


class MhaOutput:
    """Attention `weights` `[batch_size, n_heads, seq_length_1, seq_length_2]` and `context`
    `[batch_size, seq_length_1, d_model]`."""

    __slots__ = ("weights", "context")

    def __init__(self, weights, context):
        self.weights, self.context = weights, context


@dataclass
class MultiHeadAttentionConfig(Config):
    """Configuration of a [`MultiHeadAttention`] layer."""

    d_model: int
    n_heads: int
    dropout: float = 0.1
    min_float: float = -1.0e4
    quiet_softmax: bool = False
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "MultiHeadAttention":
        lin = LinearConfig(self.d_model, self.d_model, initializer=self.initializer)
        return MultiHeadAttention(
            lin.init(device), lin.init(device), lin.init(device), lin.init(device), DropoutConfig(self.dropout).init(),
            Gelu(), self.d_model, self.n_heads, self.d_model // self.n_heads, self.min_float, self.quiet_softmax,
        )


class MultiHeadAttention(Layer):
    """Multi-head attention of "Attention Is All You Need": `query`, `key`, `value`, `output`
    linear maps `[d_model, d_model]`; scores scaled by `1 / sqrt(d_k)`, masked entries set to
    `min_float`, softmax (or quiet softmax) over the keys. Dropout applies to the scores."""

    def __init__(self, query, key, value, output, dropout, activation, d_model, n_heads, d_k, min_float,
                 quiet_softmax):
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

    def forward(self, input: MhaInput) -> MhaOutput:
        """Applies the forward pass on the input tensors.

        # Shapes

        - query: `[batch_size, seq_length_1, d_model]`
        - key: `[batch_size, seq_length_2, d_model]`
        - value: `[batch_size, seq_length_2, d_model]`
        - mask_pad: `[batch_size, seq_length_2]`
        - mask_attn: `[batch_size, seq_length_1, seq_length_2]`
        - output: `[batch_size, seq_length_1, d_model]`
        """
        assert_shape(input.query, [None, None, self.d_model])
        batch_size, seq_length_1, d_model = input.query.dims()
        assert_shape(input.key, [batch_size, None, self.d_model])
        seq_length_2 = input.key.dims()[1]
        assert_shape(input.value, [batch_size, seq_length_2, self.d_model])
        if input.mask_pad_ is not None:
            assert_shape(input.mask_pad_, [batch_size, seq_length_2])
        if input.mask_attn_ is not None:
            assert_shape(input.mask_attn_, [batch_size, seq_length_1, seq_length_2])
        weight = self.query.weight.val()
        check_dtype(self, input.query, weight, name="query", param_name="query weight")
        check_dtype(self, input.key, weight, name="key", param_name="query weight")
        check_dtype(self, input.value, weight, name="value", param_name="query weight")

        query = self._heads(input.query, self.query)
        key = self._heads(input.key, self.key)
        value = self._heads(input.value, self.value)
        scores = (query @ key.transpose()) * (1.0 / math.sqrt(self.d_k))
        scores = self.dropout.forward(scores)
        if input.mask_pad_ is not None:
            scores = scores.mask_fill(input.mask_pad_.reshape(batch_size, 1, 1, seq_length_2), self.min_float)
        if input.mask_attn_ is not None:
            scores = scores.mask_fill(
                input.mask_attn_.reshape(batch_size, 1, seq_length_1, seq_length_2), self.min_float
            )
        weights = scores.quiet_softmax(3) if self.quiet_softmax else scores.softmax(3)
        context = (weights @ value).swap_dims(1, 2).reshape(batch_size, seq_length_1, d_model)
        return MhaOutput(weights, self.output.forward(context))

    def _heads(self, x, linear):
        b, s, _ = x.shape
        return linear.forward(x).reshape(b, s, self.n_heads, self.d_k).swap_dims(1, 2)

    def custom_content(self, content):
        return (
            content.add("d_model", self.d_model)
            .add("n_heads", self.n_heads)
            .add("d_k", self.d_k)
            .add("dropout", self.dropout.prob)
            .add("min_float", self.min_float)
            .add("quiet_softmax", self.quiet_softmax)
            .optional()
        )
