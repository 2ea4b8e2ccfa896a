"""Pooling: MaxPool1d/2d, AvgPool1d/2d (count_include_pad, ceil_mode), AdaptiveAvgPool1d/2d."""
from __future__ import annotations

from dataclasses import dataclass

from ..tensor import ops_pool
from ._base import Config, Layer, assert_shape, pair, rust_debug
from .conv import PaddingConfig1d, PaddingConfig2d
from ..shapes.dims import as_dim
from ..shapes.rules import RuleError, Shape, dims_text, expect, same_min_length, tuple_of
from .spec import Burn, declare

__all__ = [
    "MaxPool1dConfig", "MaxPool1d", "MaxPool2dConfig", "MaxPool2d",
    "AvgPool1dConfig", "AvgPool1d", "AvgPool2dConfig", "AvgPool2d",
    "AdaptiveAvgPool1dConfig", "AdaptiveAvgPool1d", "AdaptiveAvgPool2dConfig", "AdaptiveAvgPool2d",
]


def _pooled(input, padding, kernel, stride, fill, pool):
    """Run `pool(x, pads)` with symmetric padding, or pad explicitly with `fill` first."""
    pairs = padding.pairs(input.shape[2:], kernel, stride)
    if all(a == b for a, b in pairs):
        return pool(input, tuple(a for a, _ in pairs))
    flat = []
    for a, b in reversed(pairs):
        flat += [a, b]
    return pool(input.pad(flat, "constant", fill), (0,) * len(pairs))


def _check_same(padding, kernel, owner):
    if padding == type(padding).Same and any(k % 2 == 0 for k in kernel):
        raise ValueError(f"{owner}: Same padding with an even kernel size is not supported (kernel {list(kernel)})")


# ---------------------------------------------------------------------- max pooling
@dataclass
class MaxPool1dConfig(Config):
    """Configuration of a [`MaxPool1d`] layer; the stride defaults to the kernel size."""

    kernel_size: int
    stride: int | None = None
    padding: object = PaddingConfig1d.Valid
    dilation: int = 1
    ceil_mode: bool = False

    def __post_init__(self):
        if self.stride is None:
            self.stride = self.kernel_size

    def init(self, device=None) -> "MaxPool1d":
        return MaxPool1d(self.stride, self.kernel_size, PaddingConfig1d.of(self.padding), self.dilation, self.ceil_mode)


class MaxPool1d(Layer):
    """1-D max pooling over `[batch_size, channels, length]`."""

    def __init__(self, stride, kernel_size, padding, dilation, ceil_mode):
        super().__init__()
        self.stride = int(stride)
        self.kernel_size = int(kernel_size)
        self.padding = padding
        self.dilation = int(dilation)
        self.ceil_mode = bool(ceil_mode)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, length_in]`
        - output: `[batch_size, channels, length_out]`
        """
        assert_shape(input, [None, None, None])
        return _pooled(
            input, self.padding, (self.kernel_size,), (self.stride,), float("-inf"),
            lambda x, p: ops_pool.max_pool1d(x, self.kernel_size, self.stride, p, self.dilation, self.ceil_mode),
        )

    def custom_content(self, content):
        return (
            content.add("kernel_size", self.kernel_size)
            .add("stride", self.stride)
            .add("padding", self.padding)
            .add("dilation", self.dilation)
            .add("ceil_mode", self.ceil_mode)
            .optional()
        )


@dataclass
class MaxPool2dConfig(Config):
    """Configuration of a [`MaxPool2d`] layer; `strides` default to the kernel size."""

    kernel_size: tuple
    strides: tuple | None = None
    padding: object = PaddingConfig2d.Valid
    dilation: tuple = (1, 1)
    ceil_mode: bool = False

    def __post_init__(self):
        if self.strides is None:
            self.strides = self.kernel_size

    def init(self, device=None) -> "MaxPool2d":
        kernel = pair(self.kernel_size, 2, "kernel_size", "MaxPool2dConfig")
        padding = PaddingConfig2d.of(self.padding)
        _check_same(padding, kernel, "MaxPool2dConfig")
        return MaxPool2d(list(pair(self.strides, 2, "strides", "MaxPool2dConfig")), list(kernel), padding,
                         list(pair(self.dilation, 2, "dilation", "MaxPool2dConfig")), self.ceil_mode)


class MaxPool2d(Layer):
    """2-D max pooling over `[batch_size, channels, height, width]`."""

    def __init__(self, stride, kernel_size, padding, dilation, ceil_mode):
        super().__init__()
        self.stride = stride
        self.kernel_size = kernel_size
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = bool(ceil_mode)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, height_in, width_in]`
        - output: `[batch_size, channels, height_out, width_out]`
        """
        assert_shape(input, [None, None, None, None])
        k, s, d = tuple(self.kernel_size), tuple(self.stride), tuple(self.dilation)
        return _pooled(
            input, self.padding, k, s, float("-inf"),
            lambda x, p: ops_pool.max_pool2d(x, k, s, p, d, self.ceil_mode),
        )

    def custom_content(self, content):
        return (
            content.add("kernel_size", rust_debug(self.kernel_size))
            .add("stride", rust_debug(self.stride))
            .add("padding", self.padding)
            .add("dilation", rust_debug(self.dilation))
            .add("ceil_mode", self.ceil_mode)
            .optional()
        )


# ---------------------------------------------------------------------- average pooling
@dataclass
class AvgPool1dConfig(Config):
    """Configuration of an [`AvgPool1d`] layer; the stride defaults to the kernel size."""

    kernel_size: int
    stride: int | None = None
    padding: object = PaddingConfig1d.Valid
    count_include_pad: bool = True
    ceil_mode: bool = False

    def __post_init__(self):
        if self.stride is None:
            self.stride = self.kernel_size

    def init(self, device=None) -> "AvgPool1d":
        return AvgPool1d(self.stride, self.kernel_size, PaddingConfig1d.of(self.padding), self.count_include_pad,
                         self.ceil_mode)


class AvgPool1d(Layer):
    """1-D average pooling; padded zeros count in the mean when `count_include_pad`."""

    def __init__(self, stride, kernel_size, padding, count_include_pad, ceil_mode):
        super().__init__()
        self.stride = int(stride)
        self.kernel_size = int(kernel_size)
        self.padding = padding
        self.count_include_pad = bool(count_include_pad)
        self.ceil_mode = bool(ceil_mode)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, length_in]`
        - output: `[batch_size, channels, length_out]`
        """
        assert_shape(input, [None, None, None])
        return _pooled(
            input, self.padding, (self.kernel_size,), (self.stride,), 0.0,
            lambda x, p: ops_pool.avg_pool1d(x, self.kernel_size, self.stride, p, self.count_include_pad,
                                             self.ceil_mode),
        )

    def custom_content(self, content):
        return (
            content.add("kernel_size", self.kernel_size)
            .add("stride", self.stride)
            .add("padding", self.padding)
            .add("count_include_pad", self.count_include_pad)
            .add("ceil_mode", self.ceil_mode)
            .optional()
        )


@dataclass
class AvgPool2dConfig(Config):
    """Configuration of an [`AvgPool2d`] layer; `strides` default to the kernel size."""

    kernel_size: tuple
    strides: tuple | None = None
    padding: object = PaddingConfig2d.Valid
    count_include_pad: bool = True
    ceil_mode: bool = False

    def __post_init__(self):
        if self.strides is None:
            self.strides = self.kernel_size

    def init(self, device=None) -> "AvgPool2d":
        return AvgPool2d(list(pair(self.strides, 2, "strides", "AvgPool2dConfig")),
                         list(pair(self.kernel_size, 2, "kernel_size", "AvgPool2dConfig")),
                         PaddingConfig2d.of(self.padding), self.count_include_pad, self.ceil_mode)


class AvgPool2d(Layer):
    """2-D average pooling; padded zeros count in the mean when `count_include_pad`."""

    def __init__(self, stride, kernel_size, padding, count_include_pad, ceil_mode):
        super().__init__()
        self.stride = stride
        self.kernel_size = kernel_size
        self.padding = padding
        self.count_include_pad = bool(count_include_pad)
        self.ceil_mode = bool(ceil_mode)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, height_in, width_in]`
        - output: `[batch_size, channels, height_out, width_out]`
        """
        assert_shape(input, [None, None, None, None])
        k, s = tuple(self.kernel_size), tuple(self.stride)
        return _pooled(
            input, self.padding, k, s, 0.0,
            lambda x, p: ops_pool.avg_pool2d(x, k, s, p, self.count_include_pad, self.ceil_mode),
        )

    def custom_content(self, content):
        return (
            content.add("kernel_size", rust_debug(self.kernel_size))
            .add("stride", rust_debug(self.stride))
            .add("padding", self.padding)
            .add("count_include_pad", self.count_include_pad)
            .add("ceil_mode", self.ceil_mode)
            .optional()
        )


# ---------------------------------------------------------------------- adaptive
@dataclass
class AdaptiveAvgPool1dConfig(Config):
    """Configuration of an [`AdaptiveAvgPool1d`] layer."""

    output_size: int

    def init(self, device=None) -> "AdaptiveAvgPool1d":
        return AdaptiveAvgPool1d(self.output_size)


class AdaptiveAvgPool1d(Layer):
    """Average over adaptive bins to `output_size` entries."""

    def __init__(self, output_size: int):
        super().__init__()
        self.output_size = int(output_size)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, length]`
        - output: `[batch_size, channels, length_out]`
        """
        assert_shape(input, [None, None, None])
        return ops_pool.adaptive_avg_pool1d(input, self.output_size)

    def custom_content(self, content):
        return content.add("output_size", self.output_size).optional()


@dataclass
class AdaptiveAvgPool2dConfig(Config):
    """Configuration of an [`AdaptiveAvgPool2d`] layer."""

    output_size: tuple

    def init(self, device=None) -> "AdaptiveAvgPool2d":
        return AdaptiveAvgPool2d(list(pair(self.output_size, 2, "output_size", "AdaptiveAvgPool2dConfig")))


class AdaptiveAvgPool2d(Layer):
    """Average over adaptive bins to `output_size` `[height, width]`."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, height_in, width_in]`
        - output: `[batch_size, channels, height_out, width_out]`
        """
        assert_shape(input, [None, None, None, None])
        return ops_pool.adaptive_avg_pool2d(input, tuple(self.output_size))

    def custom_content(self, content):
        return content.add("output_size", rust_debug(self.output_size)).optional()


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _pool(m, ins, ctx, n: int, op: str, kernel, stride, dilation, ceil_mode: bool):
    t = ins[0]
    call = "assert_shape(input, [None, None, None])" if n == 1 else "assert_shape(input, [None, None, None, None])"
    expect(call, t, [None] * (n + 2))
    sizes = t.dims[2:]
    padding = m.padding
    out = []
    for i, (L, k, s, d) in enumerate(zip(sizes, kernel, stride, dilation)):
        eff = d * (k - 1) + 1
        if padding.kind == "Same":
            if k < s and eff > k:
                raise RuleError(f"{type(m).__name__}: Same padding with a stride ({s}) larger than the kernel ({k}) "
                                f"and dilation {d} has no exact shape rule: use Explicit padding")
            # Burn pads by the kernel (not the dilated window): out = ceil(L/s) + a constant shift
            # (0 without dilation, whether or not the padding is clamped at 0)
            o = L.ceil_div(s) + (-((eff - k) // s) if ceil_mode else (k - eff) // s)
            if eff > k:
                ctx.require(L, "min", same_min_length(k, s, eff), lambda: (f"{op}: the kernel (size {list(kernel)}, dilation {list(dilation)}) "
                                                  f"is larger than the padded input (spatial dims {dims_text(sizes)})"))
            out.append(o)
            continue
        if padding.kind == "Valid":
            lo = hi = 0
        else:
            lo, hi = padding.values[i], padding.values[i + n]
        symmetric = all((padding.values[j] if padding.kind == "Explicit" else 0)
                        == (padding.values[j + n] if padding.kind == "Explicit" else 0) for j in range(n))
        if symmetric and lo > k // 2:
            pads = [padding.values[j] for j in range(n)] if padding.kind == "Explicit" else [0] * n
            raise RuleError(f"{op}: padding must be at most half the kernel size, got padding {pads} for kernel "
                            f"{list(kernel)}")
        ctx.require(L + lo + hi, "min", eff, lambda: (f"{op}: the kernel (size {list(kernel)}, dilation "
                                                      f"{list(dilation)}) is larger than the padded input (spatial "
                                                      f"dims {dims_text(sizes)})"))
        num = L + lo + hi - eff
        if not ceil_mode:
            out.append(num // s + 1)
            continue
        # ceil mode drops a last window that would start in the right padding (at or past X = the
        # input and its left padding). That can only happen when the window reaches less than a
        # stride past its start (reach < s); then the windows are exactly those starting before
        # X: with X = q*s + r, min(ceil((X - reach)/s), ceil(X/s) - 1) + 1 = ceil(X/s) for every r.
        reach = (eff - lo) if symmetric else eff
        if reach < s:
            x = (L + lo) if symmetric else (L + lo + hi)
            out.append(x.ceil_div(s))
        else:
            out.append(num.ceil_div(s) + 1)
    return Shape(t.dims[:2] + tuple(out), t.dtype)


def _max_pool1d_shape(m, ins, ctx):
    return _pool(m, ins, ctx, 1, "max_pool1d", (m.kernel_size,), (m.stride,), (m.dilation,), m.ceil_mode)


def _max_pool2d_shape(m, ins, ctx):
    return _pool(m, ins, ctx, 2, "max_pool2d", tuple_of(m.kernel_size, 2), tuple_of(m.stride, 2),
                 tuple_of(m.dilation, 2), m.ceil_mode)


def _avg_pool1d_shape(m, ins, ctx):
    return _pool(m, ins, ctx, 1, "avg_pool1d", (m.kernel_size,), (m.stride,), (1,), m.ceil_mode)


def _avg_pool2d_shape(m, ins, ctx):
    return _pool(m, ins, ctx, 2, "avg_pool2d", tuple_of(m.kernel_size, 2), tuple_of(m.stride, 2), (1, 1), m.ceil_mode)


def _adaptive1d_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None])", t, [None, None, None])
    return Shape(t.dims[:2] + (as_dim(m.output_size),), t.dtype)


def _adaptive2d_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None, None])", t, [None, None, None, None])
    return Shape(t.dims[:2] + tuple(as_dim(v) for v in m.output_size), t.dtype)


declare(MaxPool1d, shape=_max_pool1d_shape)
declare(MaxPool2d, shape=_max_pool2d_shape)
declare(AvgPool1d, shape=_avg_pool1d_shape)
declare(AvgPool2d, shape=_avg_pool2d_shape)
declare(AdaptiveAvgPool1d, shape=_adaptive1d_shape)
declare(AdaptiveAvgPool2d, shape=_adaptive2d_shape)
declare(MaxPool1d, MaxPool2d, AvgPool1d, AvgPool2d, AdaptiveAvgPool1d, AdaptiveAvgPool2d,
        burn=Burn("pool", device=False))
