"""Transformer blocks: PositionWiseFeedForward, TransformerEncoder, TransformerDecoder."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._base import Config, Layer, Module, assert_shape, check_dtype, initializers
from .activation import ActivationConfig
from .attention import MhaInput, MultiHeadAttentionConfig
from .dropout import DropoutConfig
from .linear import LinearConfig
from .norm import LayerNormConfig
from ..shapes.rules import expect, float_input, same
from .spec import Burn, declare

__all__ = [
    "PositionWiseFeedForwardConfig", "PositionWiseFeedForward",
    "TransformerEncoderConfig", "TransformerEncoder", "TransformerEncoderLayer", "TransformerEncoderInput",
    "TransformerDecoderConfig", "TransformerDecoder", "TransformerDecoderLayer", "TransformerDecoderInput",
]


def _kaiming_default():
    return initializers.KaimingUniform(gain=1.0 / math.sqrt(3.0), fan_out_only=False)


# ---------------------------------------------------------------------- feed-forward
@dataclass
class PositionWiseFeedForwardConfig(Config):
    """Configuration of a [`PositionWiseFeedForward`] block."""

    d_model: int
    d_ff: int
    dropout: float = 0.1
    initializer: object = field(default_factory=_kaiming_default)
    activation: object = "Gelu"

    def init(self, device=None) -> "PositionWiseFeedForward":
        return PositionWiseFeedForward(
            LinearConfig(self.d_model, self.d_ff, initializer=self.initializer).init(device),
            LinearConfig(self.d_ff, self.d_model, initializer=self.initializer).init(device),
            DropoutConfig(self.dropout).init(),
            ActivationConfig.of(self.activation).init(device),
        )


class PositionWiseFeedForward(Layer):
    """`FFN(x) = act(x W1 + b1) W2 + b2`, dropout after the activation."""

    def __init__(self, linear_inner, linear_outer, dropout, activation):
        super().__init__()
        self.linear_inner = linear_inner
        self.linear_outer = linear_outer
        self.dropout = dropout
        self.activation = activation

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., d_model]` (usually `[batch_size, seq_length, d_model]`)
        - output: `[..., d_model]`
        """
        d_model, _ = self.linear_inner.weight.shape
        assert_shape(input, [..., d_model])
        check_dtype(self, input, self.linear_inner.weight.val(), param_name="linear_inner weight")
        x = self.linear_inner.forward(input)
        x = self.activation.forward(x)
        x = self.dropout.forward(x)
        return self.linear_outer.forward(x)

    def custom_content(self, content):
        d_model, d_ff = self.linear_inner.weight.shape
        return content.add("d_model", d_model).add("d_ff", d_ff).add("prob", self.dropout.prob).optional()


def _transformer_content(m, content):
    return (
        content.add("d_model", m.d_model)
        .add("d_ff", m.d_ff)
        .add("n_heads", m.n_heads)
        .add("n_layers", m.n_layers)
        .add("dropout", m.dropout)
        .add("norm_first", m.norm_first)
        .add("quiet_softmax", m.quiet_softmax)
        .optional()
    )


# ---------------------------------------------------------------------- encoder
class TransformerEncoderInput:
    """Encoder input: `tensor` `[batch_size, seq_length, d_model]` and optional masks."""

    __slots__ = ("tensor", "mask_pad_", "mask_attn_")

    def __init__(self, tensor, mask_pad=None, mask_attn=None):
        self.tensor, self.mask_pad_, self.mask_attn_ = tensor, mask_pad, mask_attn

    @staticmethod
    def new(tensor) -> "TransformerEncoderInput":
        return TransformerEncoderInput(tensor)

    def mask_pad(self, mask_pad) -> "TransformerEncoderInput":
        return TransformerEncoderInput(self.tensor, mask_pad, self.mask_attn_)

    def mask_attn(self, mask_attn) -> "TransformerEncoderInput":
        return TransformerEncoderInput(self.tensor, self.mask_pad_, mask_attn)


@dataclass
class TransformerEncoderConfig(Config):
    """Configuration of a [`TransformerEncoder`]."""

    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    dropout: float = 0.1
    norm_first: bool = False
    quiet_softmax: bool = False
    initializer: object = field(default_factory=_kaiming_default)
    activation: object = "Gelu"
    layer_norm_eps: float = 1e-5

    def init(self, device=None) -> "TransformerEncoder":
        layers = [TransformerEncoderLayer.new(self, device) for _ in range(self.n_layers)]
        return TransformerEncoder(layers, self.d_model, self.d_ff, self.n_heads, self.n_layers, self.dropout,
                                  self.norm_first, self.quiet_softmax)


class TransformerEncoderLayer(Module):
    """Self-attention and feed-forward, each with a residual connection and a layer norm
    (applied first with `norm_first`, else after the residual sum)."""

    def __init__(self, mha, pwff, norm_1, norm_2, dropout, norm_first: bool):
        super().__init__()
        self.mha = mha
        self.pwff = pwff
        self.norm_1 = norm_1
        self.norm_2 = norm_2
        self.dropout = dropout
        self.norm_first = bool(norm_first)

    @staticmethod
    def new(config, device=None) -> "TransformerEncoderLayer":
        mha = MultiHeadAttentionConfig(config.d_model, config.n_heads, config.dropout,
                                       quiet_softmax=config.quiet_softmax, initializer=config.initializer).init(device)
        norm = LayerNormConfig(config.d_model, epsilon=config.layer_norm_eps)
        pwff = PositionWiseFeedForwardConfig(config.d_model, config.d_ff, config.dropout, config.initializer,
                                             config.activation).init(device)
        return TransformerEncoderLayer(mha, pwff, norm.init(device), norm.init(device),
                                       DropoutConfig(config.dropout).init(), config.norm_first)

    def forward(self, input, mask_pad=None, mask_attn=None):
        """Applies one encoder layer.

        # Shapes

        - input: `[batch_size, seq_length, d_model]`
        - output: `[batch_size, seq_length, d_model]`
        """
        assert_shape(input, [None, None, self.mha.d_model])
        check_dtype(self, input, self.mha.query.weight.val(), param_name="attention weight")
        x = input
        res = self.norm_2.forward(x) if self.norm_first else x
        mha_in = MhaInput.self_attn(res)
        if mask_pad is not None:
            mha_in = mha_in.mask_pad(mask_pad)
        if mask_attn is not None:
            mha_in = mha_in.mask_attn(mask_attn)
        x = x + self.dropout.forward(self.mha.forward(mha_in).context)
        if self.norm_first:
            res = self.norm_1.forward(x)
        else:
            x = self.norm_1.forward(x)
            res = x
        x = x + self.dropout.forward(self.pwff.forward(res))
        if not self.norm_first:
            x = self.norm_2.forward(x)
        return x


class TransformerEncoder(Layer):
    """A stack of [`TransformerEncoderLayer`]s."""

    def __init__(self, layers, d_model, d_ff, n_heads, n_layers, dropout, norm_first, quiet_softmax):
        super().__init__()
        self.layers = list(layers)
        self.d_model = int(d_model)
        self.d_ff = int(d_ff)
        self.n_heads = int(n_heads)
        self.n_layers = int(n_layers)
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.quiet_softmax = bool(quiet_softmax)

    def forward(self, input):
        """Applies the forward pass on the input tensor (a tensor or a `TransformerEncoderInput`).

        # Shapes

        - tensor: `[batch_size, seq_length, d_model]`
        - output: `[batch_size, seq_length, d_model]`
        """
        if not isinstance(input, TransformerEncoderInput):
            input = TransformerEncoderInput(input)
        x = input.tensor
        assert_shape(x, [None, None, self.d_model])
        if self.layers:
            check_dtype(self, x, self.layers[0].mha.query.weight.val(), param_name="attention weight")
        for layer in self.layers:
            x = layer.forward(x, input.mask_pad_, input.mask_attn_)
        return x

    def custom_content(self, content):
        return _transformer_content(self, content)


# ---------------------------------------------------------------------- decoder
class TransformerDecoderInput:
    """Decoder input: `target` and `memory` `[batch_size, seq_length, d_model]` and masks."""

    __slots__ = ("target", "memory", "target_mask_pad_", "target_mask_attn_", "memory_mask_pad_",
                 "memory_mask_attn_")

    def __init__(self, target, memory, target_mask_pad=None, target_mask_attn=None, memory_mask_pad=None,
                 memory_mask_attn=None):
        self.target, self.memory = target, memory
        self.target_mask_pad_, self.target_mask_attn_ = target_mask_pad, target_mask_attn
        self.memory_mask_pad_, self.memory_mask_attn_ = memory_mask_pad, memory_mask_attn

    @staticmethod
    def new(target, memory) -> "TransformerDecoderInput":
        return TransformerDecoderInput(target, memory)

    def _with(self, **kw):
        args = dict(target_mask_pad=self.target_mask_pad_, target_mask_attn=self.target_mask_attn_,
                    memory_mask_pad=self.memory_mask_pad_, memory_mask_attn=self.memory_mask_attn_)
        args.update(kw)
        return TransformerDecoderInput(self.target, self.memory, **args)

    def target_mask_pad(self, mask):
        return self._with(target_mask_pad=mask)

    def target_mask_attn(self, mask):
        return self._with(target_mask_attn=mask)

    def memory_mask_pad(self, mask):
        return self._with(memory_mask_pad=mask)

    def memory_mask_attn(self, mask):
        return self._with(memory_mask_attn=mask)


@dataclass
class TransformerDecoderConfig(Config):
    """Configuration of a [`TransformerDecoder`]."""

    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    dropout: float = 0.1
    norm_first: bool = False
    quiet_softmax: bool = False
    initializer: object = field(default_factory=_kaiming_default)
    activation: object = "Gelu"
    layer_norm_eps: float = 1e-5

    def init(self, device=None) -> "TransformerDecoder":
        layers = [TransformerDecoderLayer.new(self, device) for _ in range(self.n_layers)]
        return TransformerDecoder(layers, self.d_model, self.d_ff, self.n_heads, self.n_layers, self.dropout,
                                  self.norm_first, self.quiet_softmax)


class TransformerDecoderLayer(Module):
    """Self-attention, cross-attention over the memory, and feed-forward, each residual."""

    def __init__(self, cross_attn, self_attn, pwff, norm_1, norm_2, norm_3, dropout, norm_first: bool):
        super().__init__()
        self.cross_attn = cross_attn
        self.self_attn = self_attn
        self.pwff = pwff
        self.norm_1 = norm_1
        self.norm_2 = norm_2
        self.norm_3 = norm_3
        self.dropout = dropout
        self.norm_first = bool(norm_first)

    @staticmethod
    def new(config, device=None) -> "TransformerDecoderLayer":
        mha = MultiHeadAttentionConfig(config.d_model, config.n_heads, config.dropout,
                                       quiet_softmax=config.quiet_softmax, initializer=config.initializer)
        norm = LayerNormConfig(config.d_model, epsilon=config.layer_norm_eps)
        pwff = PositionWiseFeedForwardConfig(config.d_model, config.d_ff, config.dropout, config.initializer,
                                             config.activation).init(device)
        self_attn = mha.init(device)
        cross_attn = mha.init(device)
        return TransformerDecoderLayer(cross_attn, self_attn, pwff, norm.init(device), norm.init(device),
                                       norm.init(device), DropoutConfig(config.dropout).init(), config.norm_first)

    def forward(self, input: TransformerDecoderInput) -> TransformerDecoderInput:
        """Applies one decoder layer; returns the input with the new target.

        # Shapes

        - target: `[batch_size, seq_length_1, d_model]`
        - memory: `[batch_size, seq_length_2, d_model]`
        - output target: `[batch_size, seq_length_1, d_model]`
        """
        assert_shape(input.target, [None, None, self.self_attn.d_model])
        check_dtype(self, input.target, self.self_attn.query.weight.val(), name="target",
                    param_name="attention weight")
        check_dtype(self, input.memory, self.cross_attn.query.weight.val(), name="memory",
                    param_name="attention weight")
        x = input.target
        res = self.norm_1.forward(x) if self.norm_first else x
        sa = MhaInput.self_attn(res)
        if input.target_mask_pad_ is not None:
            sa = sa.mask_pad(input.target_mask_pad_)
        if input.target_mask_attn_ is not None:
            sa = sa.mask_attn(input.target_mask_attn_)
        x = x + self.dropout.forward(self.self_attn.forward(sa).context)
        if self.norm_first:
            res = self.norm_2.forward(x)
        else:
            x = self.norm_1.forward(x)
            res = x
        ca = MhaInput(res, input.memory, input.memory)
        if input.memory_mask_pad_ is not None:
            ca = ca.mask_pad(input.memory_mask_pad_)
        if input.memory_mask_attn_ is not None:
            ca = ca.mask_attn(input.memory_mask_attn_)
        x = x + self.dropout.forward(self.cross_attn.forward(ca).context)
        if self.norm_first:
            res = self.norm_3.forward(x)
        else:
            x = self.norm_2.forward(x)
            res = x
        x = x + self.dropout.forward(self.pwff.forward(res))
        if not self.norm_first:
            x = self.norm_3.forward(x)
        out = input._with()
        out.target = x
        return out


class TransformerDecoder(Layer):
    """A stack of [`TransformerDecoderLayer`]s."""

    def __init__(self, layers, d_model, d_ff, n_heads, n_layers, dropout, norm_first, quiet_softmax):
        super().__init__()
        self.layers = list(layers)
        self.d_model = int(d_model)
        self.d_ff = int(d_ff)
        self.n_heads = int(n_heads)
        self.n_layers = int(n_layers)
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.quiet_softmax = bool(quiet_softmax)

    def forward(self, input: TransformerDecoderInput):
        """Applies the forward pass.

        # Shapes

        - target: `[batch_size, seq_length_1, d_model]`
        - memory: `[batch_size, seq_length_2, d_model]`
        - output: `[batch_size, seq_length_1, d_model]`
        """
        assert_shape(input.target, [None, None, self.d_model])
        batch_size = input.target.dims()[0]
        assert_shape(input.memory, [batch_size, None, self.d_model])
        if self.layers:
            weight = self.layers[0].self_attn.query.weight.val()
            check_dtype(self, input.target, weight, name="target", param_name="attention weight")
            check_dtype(self, input.memory, weight, name="memory", param_name="attention weight")
        for layer in self.layers:
            input = layer.forward(input)
        return input.target

    def custom_content(self, content):
        return _transformer_content(self, content)


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _encoder_shape(m, ins, ctx):
    expect("assert_shape(x, [None, None, self.d_model])", ins[0], [None, None, m.d_model])
    float_input("TransformerEncoder", ins[0])
    return same(ins[0])


def _decoder_shape(m, ins, ctx):
    target, memory = ins
    expect("assert_shape(input.target, [None, None, self.d_model])", target, [None, None, m.d_model])
    batch_size = target.dims[0]
    expect("assert_shape(input.memory, [batch_size, None, self.d_model])", memory, [batch_size, None, m.d_model])
    float_input("TransformerDecoder", target, "target")
    float_input("TransformerDecoder", memory, "memory")
    return same(target)


def _ffn_shape(m, ins, ctx):
    d_model, _ = m.linear_inner.weight.shape
    expect("assert_shape(input, [..., d_model])", ins[0], [..., d_model])
    float_input("PositionWiseFeedForward", ins[0])
    return same(ins[0])


declare(TransformerEncoder, shape=_encoder_shape)
declare(TransformerDecoder, shape=_decoder_shape)
declare(PositionWiseFeedForward, shape=_ffn_shape)
declare(PositionWiseFeedForward, burn=Burn("transformer"))
declare(TransformerEncoder, burn=Burn("transformer", call="{m}.forward(TransformerEncoderInput::new({x}))",
                                     extra_imports=(("transformer", "TransformerEncoderInput"),)))
declare(TransformerEncoder, call="encoder")  # the designer calls forward(TransformerEncoderInput(x))
declare(TransformerDecoder, call="decoder")  # forward(TransformerDecoderInput(target, memory))
