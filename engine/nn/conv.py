"""Convolutions: Conv1d/2d/3d (weight `[out, in / groups, k...]`, padding Valid / Same /
Explicit) and ConvTranspose1d/2d/3d (weight `[in, out / groups, k...]`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..tensor import ops_conv
from ._base import Config, Debug, Layer, assert_shape, check_dtype, init_with, initializers, pair, rust_debug
from ..shapes.dims import as_dim
from ..shapes.rules import (RuleError, Shape, conv_out, dims_text, expect, explicit_pads, float_input,
                            kernel_too_large, min_size, same_min_length, same_out, tuple_of)
from .spec import Burn, declare

__all__ = [
    "PaddingConfig1d", "PaddingConfig2d", "PaddingConfig3d",
    "Conv1dConfig", "Conv1d", "Conv2dConfig", "Conv2d", "Conv3dConfig", "Conv3d",
    "ConvTranspose1dConfig", "ConvTranspose1d", "ConvTranspose2dConfig", "ConvTranspose2d",
    "ConvTranspose3dConfig", "ConvTranspose3d",
]


def same_padding(kernel: int, stride: int, size: int) -> tuple[int, int]:
    """Burn's "same" padding of one axis: the output has ceil(size / stride) entries; an odd
    total puts the extra element at the end."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0) if out > 0 else 0
    return total // 2, total - total // 2


class _Padding:
    """Burn's `PaddingConfigNd`: `Same`, `Valid` or `Explicit(...)` (starts, then ends)."""

    N = 0
    SIDES = ()

    def __init__(self, kind: str, values: tuple = ()):
        self.kind = kind
        self.values = tuple(int(v) for v in values)

    @classmethod
    def Explicit(cls, *values):  # noqa: N802 - Burn's variant name
        """`Explicit(left, right)` / `Explicit(top, left, bottom, right)` / 6 values in 3-D."""
        if len(values) == 1 and isinstance(values[0], (tuple, list)):
            values = tuple(values[0])
        if len(values) != 2 * cls.N:
            raise ValueError(f"{cls.__name__}.Explicit: expected {2 * cls.N} values ({', '.join(cls.SIDES)}), got {list(values)}")
        if any(int(v) < 0 for v in values):
            raise ValueError(f"{cls.__name__}.Explicit: padding must be >= 0, got {list(values)}")
        return cls("Explicit", values)

    @classmethod
    def of(cls, value) -> "_Padding":
        """A padding from a `PaddingConfigNd`, "same" / "valid", or explicit values."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower()
            if key in ("same", "valid"):
                return getattr(cls, key.capitalize())
        if isinstance(value, int):
            return cls.Explicit(*([value] * (2 * cls.N)))
        if isinstance(value, (tuple, list)):
            if len(value) == cls.N:
                return cls.Explicit(*(list(value) * 2))
            return cls.Explicit(*value)
        raise ValueError(f"{cls.__name__}: expected Same, Valid or Explicit(...), got {value!r}")

    def pairs(self, sizes, kernel, stride) -> tuple[tuple[int, int], ...]:
        """(start, end) padding per spatial axis for inputs of spatial `sizes`."""
        if self.kind == "Valid":
            return ((0, 0),) * self.N
        if self.kind == "Same":
            return tuple(same_padding(k, s, n) for k, s, n in zip(kernel, stride, sizes))
        n = self.N
        return tuple((self.values[i], self.values[i + n]) for i in range(n))

    def __eq__(self, other) -> bool:
        return isinstance(other, type(self)) and (self.kind, self.values) == (other.kind, other.values)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.kind, self.values))

    def __rust_debug__(self) -> str:
        if self.kind == "Explicit":
            return "Explicit(" + ", ".join(str(v) for v in self.values) + ")"
        return self.kind

    __rust_display__ = __rust_debug__

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.__rust_debug__()}"


class PaddingConfig1d(_Padding):
    N = 1
    SIDES = ("left", "right")


class PaddingConfig2d(_Padding):
    N = 2
    SIDES = ("top", "left", "bottom", "right")


class PaddingConfig3d(_Padding):
    N = 3
    SIDES = ("front", "top", "left", "back", "bottom", "right")


for _cls in (PaddingConfig1d, PaddingConfig2d, PaddingConfig3d):
    _cls.Same = _cls("Same")
    _cls.Valid = _cls("Valid")
del _cls


def _kaiming_default():
    return initializers.KaimingUniform(gain=1.0 / math.sqrt(3.0), fan_out_only=False)


def _check_groups(channels_in: int, channels_out: int, groups: int) -> None:
    if groups <= 0 or channels_in % groups or channels_out % groups:
        raise ValueError(
            f"Both channels must be divisible by the number of groups. "
            f"(channels [{channels_in}, {channels_out}], groups {groups})"
        )


# ---------------------------------------------------------------------- convolution
class _ConvNd(Layer):
    N = 0
    _PAD = _Padding
    _FN = None

    def __init__(self, weight, bias, stride, kernel_size, dilation, groups, padding):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.stride = stride
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.groups = int(groups)
        self.padding = padding

    def _t(self, v):
        return (v,) if self.N == 1 else tuple(v)

    def _forward(self, input):
        stride, kernel, dilation = self._t(self.stride), self._t(self.kernel_size), self._t(self.dilation)
        pads = self.padding.pairs(input.shape[2:], kernel, stride)
        weight = self.weight.val()
        check_dtype(self, input, weight)
        bias = self.bias.val() if self.bias is not None else None
        return type(self)._FN(input, weight, bias, stride, pads, dilation, self.groups)

    def custom_content(self, content):
        channels_out, group_in = self.weight.shape[:2]
        return (
            content.add("ch_in", group_in * self.groups)
            .add("ch_out", channels_out)
            .add("stride", rust_debug(self.stride))
            .add("kernel_size", rust_debug(self.kernel_size))
            .add("dilation", rust_debug(self.dilation))
            .add("groups", self.groups)
            .add("padding", Debug(rust_debug(self.padding)))
            .optional()
        )


@dataclass
class Conv1dConfig(Config):
    """Configuration of a [`Conv1d`] layer."""

    channels_in: int
    channels_out: int
    kernel_size: int
    stride: int = 1
    dilation: int = 1
    groups: int = 1
    padding: object = PaddingConfig1d.Valid
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "Conv1d":
        _check_groups(self.channels_in, self.channels_out, self.groups)
        k = int(self.kernel_size)
        shape = (self.channels_out, self.channels_in // self.groups, k)
        fan_in = self.channels_in // self.groups * k
        fan_out = self.channels_out // self.groups * k
        weight = init_with(self.initializer, shape, fan_in, fan_out, device)
        bias = init_with(self.initializer, (self.channels_out,), fan_in, fan_out, device) if self.bias else None
        return Conv1d(weight, bias, int(self.stride), k, int(self.dilation), self.groups,
                      PaddingConfig1d.of(self.padding))


class Conv1d(_ConvNd):
    """1-D convolution; `weight` `[channels_out, channels_in / groups, kernel_size]`."""

    N = 1
    _FN = staticmethod(ops_conv.conv1d)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels_in, length_in]`
        - output: `[batch_size, channels_out, length_out]`
        """
        channels_in = self.weight.shape[1] * self.groups
        assert_shape(input, [None, channels_in, None])
        return self._forward(input)


@dataclass
class Conv2dConfig(Config):
    """Configuration of a [`Conv2d`] layer."""

    channels: tuple
    kernel_size: tuple
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    groups: int = 1
    padding: object = PaddingConfig2d.Valid
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "Conv2d":
        return _init_conv(self, 2, Conv2d, PaddingConfig2d, device)


class Conv2d(_ConvNd):
    """2-D convolution; `weight` `[channels_out, channels_in / groups, kernel_h, kernel_w]`."""

    N = 2
    _FN = staticmethod(ops_conv.conv2d)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels_in, height_in, width_in]`
        - output: `[batch_size, channels_out, height_out, width_out]`
        """
        channels_in = self.weight.shape[1] * self.groups
        assert_shape(input, [None, channels_in, None, None])
        return self._forward(input)


@dataclass
class Conv3dConfig(Config):
    """Configuration of a [`Conv3d`] layer."""

    channels: tuple
    kernel_size: tuple
    stride: tuple = (1, 1, 1)
    dilation: tuple = (1, 1, 1)
    groups: int = 1
    padding: object = PaddingConfig3d.Valid
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "Conv3d":
        return _init_conv(self, 3, Conv3d, PaddingConfig3d, device)


class Conv3d(_ConvNd):
    """3-D convolution; `weight` `[channels_out, channels_in / groups, kd, kh, kw]`."""

    N = 3
    _FN = staticmethod(ops_conv.conv3d)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels_in, depth_in, height_in, width_in]`
        - output: `[batch_size, channels_out, depth_out, height_out, width_out]`
        """
        channels_in = self.weight.shape[1] * self.groups
        assert_shape(input, [None, channels_in, None, None, None])
        return self._forward(input)


def _init_conv(cfg, n, cls, pad_cls, device):
    owner = type(cfg).__name__
    ch_in, ch_out = pair(cfg.channels, 2, "channels", owner)
    kernel = pair(cfg.kernel_size, n, "kernel_size", owner)
    _check_groups(ch_in, ch_out, cfg.groups)
    k = math.prod(kernel)
    fan_in = ch_in // cfg.groups * k
    fan_out = ch_out // cfg.groups * k
    weight = init_with(cfg.initializer, (ch_out, ch_in // cfg.groups) + kernel, fan_in, fan_out, device)
    bias = init_with(cfg.initializer, (ch_out,), fan_in, fan_out, device) if cfg.bias else None
    return cls(weight, bias, list(pair(cfg.stride, n, "stride", owner)), list(kernel),
               list(pair(cfg.dilation, n, "dilation", owner)), cfg.groups, pad_cls.of(cfg.padding))


# ---------------------------------------------------------------------- transposed convolution
class _ConvTransposeNd(Layer):
    N = 0
    _FN = None

    def __init__(self, weight, bias, stride, kernel_size, dilation, groups, padding, padding_out, channels):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.stride = stride
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.groups = int(groups)
        self.padding = padding
        self.padding_out = padding_out
        self.channels = channels

    def _t(self, v):
        return (v,) if self.N == 1 else tuple(v)

    def _forward(self, input):
        weight = self.weight.val()
        check_dtype(self, input, weight)
        bias = self.bias.val() if self.bias is not None else None
        return type(self)._FN(input, weight, bias, self._t(self.stride), self._t(self.padding),
                              self._t(self.padding_out), self._t(self.dilation), self.groups)

    def custom_content(self, content):
        return (
            content.add("channels", rust_debug(list(self.channels)))
            .add("stride", rust_debug(self.stride))
            .add("kernel_size", rust_debug(self.kernel_size))
            .add("dilation", rust_debug(self.dilation))
            .add("groups", self.groups)
            .add("padding", rust_debug(self.padding))
            .add("padding_out", rust_debug(self.padding_out))
            .optional()
        )


def _init_conv_transpose(cfg, n, cls, device):
    owner = type(cfg).__name__
    ch_in, ch_out = pair(cfg.channels, 2, "channels", owner)
    kernel = pair(cfg.kernel_size, n, "kernel_size", owner)
    _check_groups(ch_in, ch_out, cfg.groups)
    fan_in = ch_out // cfg.groups * math.prod(kernel)
    weight = init_with(cfg.initializer, (ch_in, ch_out // cfg.groups) + kernel, fan_in, None, device)
    bias = init_with(cfg.initializer, (ch_out,), fan_in, None, device) if cfg.bias else None

    def norm(v, name):
        t = pair(v, n, name, owner)
        return t[0] if n == 1 else list(t)

    return cls(weight, bias, norm(cfg.stride, "stride"), norm(cfg.kernel_size, "kernel_size"),
               norm(cfg.dilation, "dilation"), cfg.groups, norm(cfg.padding, "padding"),
               norm(cfg.padding_out, "padding_out"), [ch_in, ch_out])


@dataclass
class ConvTranspose1dConfig(Config):
    """Configuration of a [`ConvTranspose1d`] layer."""

    channels: tuple
    kernel_size: int
    stride: int = 1
    dilation: int = 1
    groups: int = 1
    padding: int = 0
    padding_out: int = 0
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "ConvTranspose1d":
        return _init_conv_transpose(self, 1, ConvTranspose1d, device)


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution; `weight` `[channels_in, channels_out / groups, kernel_size]`."""

    N = 1
    _FN = staticmethod(ops_conv.conv_transpose1d)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels_in, length_in]`
        - output: `[batch_size, channels_out, length_out]`
        """
        channels_in = self.channels[0]
        assert_shape(input, [None, channels_in, None])
        return self._forward(input)


@dataclass
class ConvTranspose2dConfig(Config):
    """Configuration of a [`ConvTranspose2d`] layer."""

    channels: tuple
    kernel_size: tuple
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    groups: int = 1
    padding: tuple = (0, 0)
    padding_out: tuple = (0, 0)
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "ConvTranspose2d":
        return _init_conv_transpose(self, 2, ConvTranspose2d, device)


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution; `weight` `[channels_in, channels_out / groups, kh, kw]`."""

    N = 2
    _FN = staticmethod(ops_conv.conv_transpose2d)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels_in, height_in, width_in]`
        - output: `[batch_size, channels_out, height_out, width_out]`
        """
        channels_in = self.channels[0]
        assert_shape(input, [None, channels_in, None, None])
        return self._forward(input)


@dataclass
class ConvTranspose3dConfig(Config):
    """Configuration of a [`ConvTranspose3d`] layer."""

    channels: tuple
    kernel_size: tuple
    stride: tuple = (1, 1, 1)
    dilation: tuple = (1, 1, 1)
    groups: int = 1
    padding: tuple = (0, 0, 0)
    padding_out: tuple = (0, 0, 0)
    bias: bool = True
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "ConvTranspose3d":
        return _init_conv_transpose(self, 3, ConvTranspose3d, device)


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution; `weight` `[channels_in, channels_out / groups, kd, kh, kw]`."""

    N = 3
    _FN = staticmethod(ops_conv.conv_transpose3d)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels_in, depth_in, height_in, width_in]`
        - output: `[batch_size, channels_out, depth_out, height_out, width_out]`
        """
        channels_in = self.channels[0]
        assert_shape(input, [None, channels_in, None, None, None])
        return self._forward(input)


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _conv_input(owner: str, t, n: int, channels_in: int) -> None:
    """The input a convolution's forward asserts: float, `[batch, channels_in]` and `n` sizes."""
    expect(f"assert_shape(input, [None, channels_in{', None' * n}])", t, [None, channels_in] + [None] * n)
    float_input(owner, t)


def _conv_shape(m, ins, ctx):
    t = ins[0]
    n = m.N
    owner = type(m).__name__
    _conv_input(owner, t, n, m.weight.shape[1] * m.groups)
    kernel, stride, dilation = tuple_of(m.kernel_size, n), tuple_of(m.stride, n), tuple_of(m.dilation, n)
    sizes = t.dims[2:]
    pads = explicit_pads(m.padding, n)
    out = []
    op = f"conv{n}d"
    for i, (L, k, s, d) in enumerate(zip(sizes, kernel, stride, dilation)):
        if pads is None:
            o = same_out(L, k, s, d, owner)
            # the padded span is never negative unless the dilated window is wider than the kernel
            eff = d * (k - 1) + 1
            if k < eff:
                min_size(ctx, L, same_min_length(k, s, eff),
                          lambda: kernel_too_large(op, kernel, dilation, sizes, "Same"))
        else:
            lo, hi = pads[i]
            eff = d * (k - 1) + 1
            min_size(ctx, L + lo + hi, eff,
                      lambda: kernel_too_large(op, kernel, dilation, sizes, [list(p) for p in pads]))
            o = conv_out(L, lo, hi, k, s, d)
        out.append(o)
    return Shape((t.dims[0], as_dim(m.weight.shape[0])) + tuple(out))


def _conv_transpose_shape(m, ins, ctx):
    t = ins[0]
    n = m.N
    owner = type(m).__name__
    channels_in, channels_out = m.channels
    _conv_input(owner, t, n, channels_in)
    kernel, stride, dilation = tuple_of(m.kernel_size, n), tuple_of(m.stride, n), tuple_of(m.dilation, n)
    pad, pad_out = tuple_of(m.padding, n), tuple_of(m.padding_out, n)
    op = f"conv_transpose{n}d"
    for po, s, d in zip(pad_out, stride, dilation):
        if po >= max(s, d):
            raise RuleError(f"{op}: padding_out must be smaller than stride or dilation, got padding_out "
                            f"{list(pad_out)}, stride {list(stride)}, dilation {list(dilation)}")
    out = []
    for L, k, s, d, p, po in zip(t.dims[2:], kernel, stride, dilation, pad, pad_out):
        o = (L - 1) * s + d * (k - 1) + 1 + po - 2 * p
        min_size(ctx, o, 1, lambda: (f"{op}: the output would be empty for input dims {dims_text(t.dims)}, "
                                      f"kernel {list(kernel)}, stride {list(stride)}, padding {list(pad)}"))
        out.append(o)
    return Shape((t.dims[0], as_dim(channels_out)) + tuple(out))


declare(Conv1d, Conv2d, Conv3d, shape=_conv_shape)
declare(ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, shape=_conv_transpose_shape)
declare(Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, burn=Burn("conv"))
