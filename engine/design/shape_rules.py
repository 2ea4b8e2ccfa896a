"""Shape rules: each layer type's output dims as exact expressions of its input dims.

A rule belongs to a module class (`Conv2d`, `MaxPool2d`, `GLU`, ...), not to a design node: it
takes the module (only its settings and parameter *shapes* are read; nothing is initialized, no
kernel runs) and the symbolic input tensors, and returns the output tensor's `Shape`. Sizes are
`Dim`s (see `dims`), so `Conv3d` 3x3x3 on `[batch, 1, d, h, w]` gives `[batch, 4, d-2, h-2, w-2]`
and a stride gives a floor quotient (`(h-3)//2+1`). What the input must satisfy beyond its
fixed sizes is returned as `Constraint`s in the input's own names (`w must be divisible by 2`,
`seq must be even`, `h must be at least 3`); a constraint that fails for fixed sizes, or a
fixed size that breaks the layer's contract, raises `RuleError` with the message the layer's
own check gives on a real tensor (`assert_shape(input, [..., d_input]): axis 1 expected 100,
got 1600 (dims [batch, 1600])`).

`infer(module, inputs)` applies the rule of the module's class (`has_rule` says whether there
is one). The tensor a rule describes is the one the designer uses: for a recurrent layer whose
forward returns `(output, state)`, the output; `MultiHeadAttention` is self-attention on one
tensor. One corner has no exact rule and raises `RuleError` saying so: Burn's Same padding with
a dilated window whose kernel is smaller than the stride (the output then depends on the size
modulo the stride in a way these expressions do not state).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .dims import Constraint, Dim, as_dim

__all__ = ["Shape", "RuleError", "RuleResult", "infer", "has_rule", "RULES", "dims_text", "op_shape"]


class RuleError(Exception):
    """The input does not fit the layer (the message the layer itself would give)."""


@dataclass(frozen=True)
class Shape:
    """A tensor's symbolic dims and its kind ("float", "int" or "bool")."""

    dims: tuple
    dtype: str = "float"

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass
class RuleResult:
    shape: Shape
    constraints: list = field(default_factory=list)


def dims_text(dims) -> str:
    return "[" + ", ".join(str(as_dim(d)) for d in dims) + "]"


class _Ctx:
    def __init__(self):
        self.constraints: list[Constraint] = []

    def require(self, dim, kind: str, value: int, message) -> None:
        """Record `dim` (kind) `value`; raise `message()` when it fails whatever the input sizes."""
        c = Constraint(as_dim(dim), kind, int(value))
        decided = c.decided()
        if decided is False:
            raise RuleError(message())
        if decided is None and c not in self.constraints:
            self.constraints.append(c)


RULES: dict = {}


def rule(*names):
    def deco(fn):
        for n in names:
            RULES[n] = fn
        return fn
    return deco


def has_rule(module) -> bool:
    return any(c.__name__ in RULES for c in type(module).__mro__)


def infer(module, inputs: list) -> RuleResult:
    """The output shape of `module.forward(*inputs)` and the constraints on the inputs."""
    for c in type(module).__mro__:
        fn = RULES.get(c.__name__)
        if fn is not None:
            ctx = _Ctx()
            shape = fn(module, list(inputs), ctx)
            return RuleResult(Shape(tuple(as_dim(d) for d in shape.dims), shape.dtype), ctx.constraints)
    raise KeyError(f"no shape rule for {type(module).__name__}")


# ---------------------------------------------------------------------------------- contracts
def expect(call: str, t: Shape, pattern) -> None:
    """`assert_shape` over symbolic dims: the same problems, the same message."""
    problem = _problem(t.dims, pattern)
    if problem is not None:
        raise RuleError(f"{call}: {problem} (dims {dims_text(t.dims)})")


def _problem(dims, pattern):
    rank, n = len(dims), len(pattern)
    ell = next((i for i, e in enumerate(pattern) if e is Ellipsis), -1)

    def mismatch(axis, e):
        if e is None:
            return None
        e = as_dim(e)
        if dims[axis] != e:
            return f"axis {axis} expected {e}, got {dims[axis]}"
        return None

    if ell < 0:
        if rank != n:
            return f"rank {n} expected, got {rank}"
        for i in range(n):
            p = mismatch(i, pattern[i])
            if p:
                return p
        return None
    before, after = ell, n - 1 - ell
    if rank < before + after:
        return f"rank at least {before + after} expected, got {rank}"
    for i in range(before):
        p = mismatch(i, pattern[i])
        if p:
            return p
    for j in range(after):
        p = mismatch(rank - after + j, pattern[ell + 1 + j])
        if p:
            return p
    return None


_NP_DTYPE = {"float": "float32", "int": "int64", "bool": "bool"}


def _float_input(owner: str, t: Shape, name: str = "input") -> None:
    if t.dtype != "float":
        raise RuleError(f"{owner}: expected a float tensor, got {_NP_DTYPE[t.dtype]} ({name} dims "
                        f"{dims_text(t.dims)}); convert the {name} with {name}.cast(\"float32\")")


def _same(t: Shape, dtype: str | None = None) -> Shape:
    return Shape(t.dims, dtype or t.dtype)


def _with(dims, i: int, d) -> tuple:
    dims = list(dims)
    dims[i] = as_dim(d)
    return tuple(dims)


# ---------------------------------------------------------------------------------- general
@rule("Gelu", "Relu", "Relu6", "Selu", "Sigmoid", "Tanh", "SiLU", "HardSwish", "Mish", "Softsign", "LogSigmoid",
      "Tanhshrink", "LeakyRelu", "Elu", "Celu", "HardSigmoid", "Hardtanh", "Softplus", "HardShrink", "SoftShrink",
      "ThresholdedRelu", "GaussianNoise")
def _elementwise(m, ins, ctx):
    expect("assert_shape(input, [None, ...])", ins[0], [None, ...])
    return _same(ins[0])


@rule("Identity")
def _identity(m, ins, ctx):
    expect("assert_shape(input, [...])", ins[0], [...])
    return _same(ins[0])


@rule("Dropout")
def _dropout(m, ins, ctx):
    return _same(ins[0])


@rule("PRelu")
def _prelu(m, ins, ctx):
    (n,) = m.alpha.shape
    if n == 1:
        expect("assert_shape(input, [None, ...])", ins[0], [None, ...])
    else:
        expect("assert_shape(input, [None, n, ...])", ins[0], [None, n, ...])
    _float_input("PRelu", ins[0])
    return _same(ins[0])


@rule("GLU")
def _glu(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, ...])", t, [None, ...])
    d = m.dim if m.dim >= 0 else m.dim + t.rank
    if not 0 <= d < t.rank:
        raise RuleError(f"GLU: dim {m.dim} is out of range for an input of dims {dims_text(t.dims)}")
    size = t.dims[d]
    ctx.require(size, "multiple", 2, lambda: f"GLU: input tensor along dimension {m.dim} must have an even size, "
                                             f"got {size} (dims {dims_text(t.dims)})")
    return Shape(_with(t.dims, d, size // 2), t.dtype)


@rule("Linear")
def _linear(m, ins, ctx):
    d_input, d_output = m.weight.shape
    expect("assert_shape(input, [..., d_input])", ins[0], [..., d_input])
    _float_input("Linear", ins[0])
    return Shape(_with(ins[0].dims, -1, d_output))


@rule("SwiGlu")
def _swiglu(m, ins, ctx):
    d_input, d_output = m.linear_inner.weight.shape
    expect("assert_shape(input, [..., d_input])", ins[0], [..., d_input])
    _float_input("SwiGlu", ins[0])
    return Shape(_with(ins[0].dims, -1, d_output))


@rule("LayerNorm", "RmsNorm")
def _layer_norm(m, ins, ctx):
    (d_model,) = m.gamma.shape
    expect("assert_shape(input, [..., d_model])", ins[0], [..., d_model])
    _float_input(type(m).__name__, ins[0])
    return _same(ins[0])


@rule("BatchNorm")
def _batch_norm(m, ins, ctx):
    (channels,) = m.beta.shape
    expect("assert_shape(input, [None, channels, ...])", ins[0], [None, channels, ...])
    _float_input("BatchNorm", ins[0])
    return _same(ins[0])


@rule("GroupNorm", "InstanceNorm")
def _group_norm(m, ins, ctx):
    expect("assert_shape(input, [None, self.num_channels, None, ...])", ins[0], [None, m.num_channels, None, ...])
    _float_input(type(m).__name__, ins[0])
    return _same(ins[0])


@rule("LocalResponseNorm")
def _lrn(m, ins, ctx):
    expect("assert_shape(input, [None, None, None, ...])", ins[0], [None, None, None, ...])
    _float_input("LocalResponseNorm", ins[0])
    return _same(ins[0])


@rule("Embedding")
def _embedding(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None])", t, [None, None])
    if t.dtype == "float" or t.dtype == "bool":
        raise RuleError(f"Embedding: expected an int tensor of indices, got {_NP_DTYPE[t.dtype]} (input dims "
                        f"{dims_text(t.dims)}); convert the input with input.cast(\"int64\")")
    _, d_model = m.weight.shape
    return Shape(t.dims + (as_dim(d_model),))


@rule("CosineSimilarity")
def _cosine_similarity(m, ins, ctx):
    x1, x2 = ins
    expect("assert_shape(x1, [None, None])", x1, [None, None])
    batch_size, features = x1.dims
    expect("assert_shape(x2, [batch_size, features])", x2, [batch_size, features])
    d = m.dim + 2 if m.dim < 0 else m.dim
    if not 0 <= d < 2:
        raise RuleError(f"CosineSimilarity: dim {m.dim} is out of range for inputs of rank 2")
    return Shape((x1.dims[1 - d],))


@rule("PairwiseDistance")
def _pairwise_distance(m, ins, ctx):
    x1, x2 = ins
    expect("assert_shape(x1, [None, None])", x1, [None, None])
    batch_size, features = x1.dims
    expect("assert_shape(x2, [batch_size, features])", x2, [batch_size, features])
    return Shape((batch_size,))


@rule("PixelShuffle")
def _pixel_shuffle(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None, None])", t, [None, None, None, None])
    r = m.upscale_factor
    if r <= 0:
        raise RuleError("PixelShuffle: upscale_factor must be greater than 0")
    b, c, h, w = t.dims
    ctx.require(c, "multiple", r * r, lambda: f"PixelShuffle: input channels ({c}) must be divisible by "
                                              f"upscale_factor^2 ({r * r}) (dims {dims_text(t.dims)})")
    return Shape((b, c // (r * r), h * r, w * r), t.dtype)


@rule("PixelUnshuffle")
def _pixel_unshuffle(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None, None])", t, [None, None, None, None])
    r = m.downscale_factor
    if r <= 0:
        raise RuleError("PixelUnshuffle: downscale_factor must be greater than 0")
    b, c, h, w = t.dims
    ctx.require(h, "multiple", r, lambda: f"PixelUnshuffle: input height ({h}) must be divisible by "
                                          f"downscale_factor ({r})")
    ctx.require(w, "multiple", r, lambda: f"PixelUnshuffle: input width ({w}) must be divisible by "
                                          f"downscale_factor ({r})")
    return Shape((b, c * (r * r), h // r, w // r), t.dtype)


# ---------------------------------------------------------------------------------- convolutions
def _tuple(v, n: int) -> tuple:
    return tuple(int(x) for x in v) if isinstance(v, (tuple, list)) else (int(v),) * n


def _explicit_pads(padding, n: int):
    """(start, end) pads per axis, or None for Same padding (which depends on the size)."""
    if padding.kind == "Valid":
        return [(0, 0)] * n
    if padding.kind == "Explicit":
        return [(padding.values[i], padding.values[i + n]) for i in range(n)]
    return None


def _conv_out(size: Dim, lo, hi, k: int, s: int, d: int) -> Dim:
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _same_out(size: Dim, k: int, s: int, d: int, owner: str) -> Dim:
    """The output size with Burn's Same padding: total = max((ceil(L/s)-1)*s + k - L, 0) (the
    kernel, not the dilated window), so out = ceil(L/s) + floor((k - eff)/s) when k >= s."""
    eff = d * (k - 1) + 1
    if k < s and eff > k:
        raise RuleError(f"{owner}: Same padding with a stride ({s}) larger than the kernel ({k}) and dilation {d} "
                        f"has no exact shape rule: use Explicit padding")
    # k >= s: the total is never clamped; an undilated window (eff == k) and k < s: out = ceil(L/s) either way
    shift = (k - eff) // s if k >= s else 0
    return size.ceil_div(s) + shift


def _same_min_length(k: int, s: int, eff: int) -> int:
    """The shortest input Same padding (by the kernel, k >= s) leaves room for a dilated window of
    `eff`: the padded span (ceil(L/s) - 1) * s + k - eff must not be negative."""
    m = -(-(s + eff - k) // s)  # ceil(L/s) >= m
    return (m - 1) * s + 1


def _min_size(ctx, size: Dim, need: int, message) -> None:
    ctx.require(size, "min", need, message)


@rule("Conv1d", "Conv2d", "Conv3d")
def _conv(m, ins, ctx):
    t = ins[0]
    n = m.N
    owner = type(m).__name__
    channels_in = m.weight.shape[1] * m.groups
    call = {1: "assert_shape(input, [None, channels_in, None])",
            2: "assert_shape(input, [None, channels_in, None, None])",
            3: "assert_shape(input, [None, channels_in, None, None, None])"}[n]
    expect(call, t, [None, channels_in] + [None] * n)
    _float_input(owner, t)
    kernel, stride, dilation = _tuple(m.kernel_size, n), _tuple(m.stride, n), _tuple(m.dilation, n)
    sizes = t.dims[2:]
    pads = _explicit_pads(m.padding, n)
    out = []
    op = f"conv{n}d"
    for i, (L, k, s, d) in enumerate(zip(sizes, kernel, stride, dilation)):
        if pads is None:
            o = _same_out(L, k, s, d, owner)
            # the padded span is never negative unless the dilated window is wider than the kernel
            eff = d * (k - 1) + 1
            if k < eff:
                _min_size(ctx, L, _same_min_length(k, s, eff),
                          lambda: _kernel_too_large(op, kernel, dilation, sizes, "Same"))
        else:
            lo, hi = pads[i]
            eff = d * (k - 1) + 1
            _min_size(ctx, L + lo + hi, eff,
                      lambda: _kernel_too_large(op, kernel, dilation, sizes, [list(p) for p in pads]))
            o = _conv_out(L, lo, hi, k, s, d)
        out.append(o)
    return Shape((t.dims[0], as_dim(m.weight.shape[0])) + tuple(out))


def _kernel_too_large(op, kernel, dilation, sizes, padding) -> str:
    return (f"{op}: the kernel (size {list(kernel)}, dilation {list(dilation)}) is larger than the padded input "
            f"(spatial dims {dims_text(sizes)}, padding {padding})")


@rule("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
def _conv_transpose(m, ins, ctx):
    t = ins[0]
    n = m.N
    owner = type(m).__name__
    channels_in, channels_out = m.channels
    call = {1: "assert_shape(input, [None, channels_in, None])",
            2: "assert_shape(input, [None, channels_in, None, None])",
            3: "assert_shape(input, [None, channels_in, None, None, None])"}[n]
    expect(call, t, [None, channels_in] + [None] * n)
    _float_input(owner, t)
    kernel, stride, dilation = _tuple(m.kernel_size, n), _tuple(m.stride, n), _tuple(m.dilation, n)
    pad, pad_out = _tuple(m.padding, n), _tuple(m.padding_out, n)
    op = f"conv_transpose{n}d"
    for po, s, d in zip(pad_out, stride, dilation):
        if po >= max(s, d):
            raise RuleError(f"{op}: padding_out must be smaller than stride or dilation, got padding_out "
                            f"{list(pad_out)}, stride {list(stride)}, dilation {list(dilation)}")
    out = []
    for L, k, s, d, p, po in zip(t.dims[2:], kernel, stride, dilation, pad, pad_out):
        o = (L - 1) * s + d * (k - 1) + 1 + po - 2 * p
        _min_size(ctx, o, 1, lambda: (f"{op}: the output would be empty for input dims {dims_text(t.dims)}, "
                                      f"kernel {list(kernel)}, stride {list(stride)}, padding {list(pad)}"))
        out.append(o)
    return Shape((t.dims[0], as_dim(channels_out)) + tuple(out))


# ---------------------------------------------------------------------------------- pooling
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
                ctx.require(L, "min", _same_min_length(k, s, eff), lambda: (f"{op}: the kernel (size {list(kernel)}, dilation {list(dilation)}) "
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


@rule("MaxPool1d")
def _max_pool1d(m, ins, ctx):
    return _pool(m, ins, ctx, 1, "max_pool1d", (m.kernel_size,), (m.stride,), (m.dilation,), m.ceil_mode)


@rule("MaxPool2d")
def _max_pool2d(m, ins, ctx):
    return _pool(m, ins, ctx, 2, "max_pool2d", _tuple(m.kernel_size, 2), _tuple(m.stride, 2),
                 _tuple(m.dilation, 2), m.ceil_mode)


@rule("AvgPool1d")
def _avg_pool1d(m, ins, ctx):
    return _pool(m, ins, ctx, 1, "avg_pool1d", (m.kernel_size,), (m.stride,), (1,), m.ceil_mode)


@rule("AvgPool2d")
def _avg_pool2d(m, ins, ctx):
    return _pool(m, ins, ctx, 2, "avg_pool2d", _tuple(m.kernel_size, 2), _tuple(m.stride, 2), (1, 1), m.ceil_mode)


@rule("AdaptiveAvgPool1d")
def _adaptive1d(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None])", t, [None, None, None])
    return Shape(t.dims[:2] + (as_dim(m.output_size),), t.dtype)


@rule("AdaptiveAvgPool2d")
def _adaptive2d(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None, None])", t, [None, None, None, None])
    return Shape(t.dims[:2] + tuple(as_dim(v) for v in m.output_size), t.dtype)


# ---------------------------------------------------------------------------------- interpolation
def _scaled(size: Dim, scale: float) -> Dim:
    """int(size * float32(scale)), exactly: the float32 scale is a dyadic rational p / 2**q."""
    f = Fraction(float(np.float32(scale)))
    return (size * f.numerator) // f.denominator


def _interpolate(m, ins, ctx, n: int):
    t = ins[0]
    owner = f"Interpolate{n}d"
    expect("assert_shape(input, [None, None, None])" if n == 1 else "assert_shape(input, [None, None, None, None])",
           t, [None] * (n + 2))
    if (m.output_size is None) == (m.scale_factor is None):
        raise RuleError(f"{owner}: Either output_size or scale_factor must be provided (exactly one of them; got "
                        f"output_size {m.output_size} and scale_factor {m.scale_factor})")
    _float_input("interpolate", t)
    if m.output_size is not None:
        out = tuple(as_dim(v) for v in _tuple(m.output_size, n))
    else:
        out = tuple(_scaled(L, s) for L, s in zip(t.dims[2:], _tuple_f(m.scale_factor, n)))
    for o in out:
        ctx.require(o, "min", 1, lambda: f"interpolate: output_size must be >= 1 in every dimension, got "
                                         f"{dims_text(out)}")
    return Shape(t.dims[:2] + out)


def _tuple_f(v, n):
    return tuple(float(x) for x in v) if isinstance(v, (tuple, list)) else (float(v),) * n


@rule("Interpolate1d")
def _interpolate1d(m, ins, ctx):
    return _interpolate(m, ins, ctx, 1)


@rule("Interpolate2d")
def _interpolate2d(m, ins, ctx):
    return _interpolate(m, ins, ctx, 2)


# ---------------------------------------------------------------------------------- recurrent
@rule("Lstm")
def _lstm(m, ins, ctx):
    d_input = m.input_gate.input_transform.weight.shape[0]
    expect("assert_shape(batched_input, [None, None, d_input])", ins[0], [None, None, d_input])
    _float_input("Lstm", ins[0], "batched_input")
    return Shape(_with(ins[0].dims, 2, m.d_hidden))


@rule("Gru")
def _gru(m, ins, ctx):
    d_input = m.update_gate.input_transform.weight.shape[0]
    expect("assert_shape(batched_input, [None, None, d_input])", ins[0], [None, None, d_input])
    _float_input("Gru", ins[0], "batched_input")
    return Shape(_with(ins[0].dims, 2, m.d_hidden))


@rule("BiLstm", "BiGru")
def _bidirectional(m, ins, ctx):
    d_input = m._input_transform().weight.shape[0]
    expect("assert_shape(batched_input, [None, None, transform.weight.shape[0]])", ins[0], [None, None, d_input])
    _float_input(type(m).__name__, ins[0], "batched_input")
    return Shape(_with(ins[0].dims, 2, 2 * m.d_hidden))


# ---------------------------------------------------------------------------------- transformer
@rule("MultiHeadAttention")
def _mha(m, ins, ctx):  # self-attention on one input, or the tensors of an MhaInput: query, key, value, masks
    expect("assert_shape(input.query, [None, None, self.d_model])", ins[0], [None, None, m.d_model])
    _float_input("MultiHeadAttention", ins[0], "query")
    if len(ins) >= 3:
        batch_size = ins[0].dims[0]
        expect("assert_shape(input.key, [batch_size, None, self.d_model])", ins[1], [batch_size, None, m.d_model])
        seq_length_2 = ins[1].dims[1]
        expect("assert_shape(input.value, [batch_size, seq_length_2, self.d_model])", ins[2],
               [batch_size, seq_length_2, m.d_model])
        _float_input("MultiHeadAttention", ins[1], "key")
        _float_input("MultiHeadAttention", ins[2], "value")
    return _same(ins[0])


@rule("TransformerEncoder")
def _encoder(m, ins, ctx):
    expect("assert_shape(x, [None, None, self.d_model])", ins[0], [None, None, m.d_model])
    _float_input("TransformerEncoder", ins[0])
    return _same(ins[0])


@rule("TransformerDecoder")
def _decoder(m, ins, ctx):
    target, memory = ins
    expect("assert_shape(input.target, [None, None, self.d_model])", target, [None, None, m.d_model])
    batch_size = target.dims[0]
    expect("assert_shape(input.memory, [batch_size, None, self.d_model])", memory, [batch_size, None, m.d_model])
    _float_input("TransformerDecoder", target, "target")
    _float_input("TransformerDecoder", memory, "memory")
    return _same(target)


@rule("PositionWiseFeedForward")
def _ffn(m, ins, ctx):
    d_model, _ = m.linear_inner.weight.shape
    expect("assert_shape(input, [..., d_model])", ins[0], [..., d_model])
    _float_input("PositionWiseFeedForward", ins[0])
    return _same(ins[0])


@rule("PositionalEncoding")
def _positional(m, ins, ctx):
    t = ins[0]
    _, max_sequence_size, d_model = m.sinusoids.shape
    expect("assert_shape(input, [None, None, d_model])", t, [None, None, d_model])
    _float_input("PositionalEncoding", t)
    seq = t.dims[1]
    ctx.require(seq, "max", max_sequence_size, lambda: (f"max_sequence_size({max_sequence_size}) must be greater "
                                                        f"or equal than length({seq})"))
    return _same(t)


@rule("RotaryEncoding")
def _rotary(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(x, [..., None, self.d_model])", t, [..., None, m.d_model])
    _float_input("RotaryEncoding", t, "x")
    seq = t.dims[-2]
    ctx.require(seq, "max", m.max_sequence_length, lambda: (f"RotaryEncoding: positions 0..{seq} exceed "
                                                            f"max_sequence_length {m.max_sequence_length}"))
    return _same(t)


# ---------------------------------------------------------------------------------- losses
_ONE = Shape((as_dim(1),))


def _like(call: str, first: Shape, *others: Shape) -> None:
    for t in others:
        expect(call, t, list(first.dims))


@rule("MseLoss", "SoftMarginLoss")
def _mse(m, ins, ctx):
    _like("assert_shape(targets, list(logits.dims()))", ins[0], ins[1])
    return _ONE


@rule("BinaryCrossEntropyLoss")
def _bce(m, ins, ctx):
    logits, targets = ins
    _like("assert_shape(targets, list(logits.dims()))", logits, targets)
    if m.weights is not None and logits.rank > 1:
        w = Shape((as_dim(len(m.weights)),))
        expect("assert_shape(self.weights, [logits.dims()[-1]])", w, [logits.dims[-1]])
    return _ONE


@rule("HuberLoss", "KLDivLoss", "PoissonNllLoss")
def _pred_targets(m, ins, ctx):
    _like("assert_shape(targets, list(predictions.dims()))", ins[0], ins[1])
    return _ONE


@rule("SmoothL1Loss")
def _smooth_l1(m, ins, ctx):  # Burn's forward does not reduce
    _like("assert_shape(targets, list(predictions.dims()))", ins[0], ins[1])
    return Shape(ins[0].dims)


@rule("HingeEmbeddingLoss")
def _hinge(m, ins, ctx):
    _like("assert_shape(target, list(input.dims()))", ins[0], ins[1])
    return _ONE


@rule("MarginRankingLoss")
def _margin_ranking(m, ins, ctx):
    first, second, target = ins
    _like("assert_shape(second, dims)", first, second)
    _like("assert_shape(target, dims)", first, target)
    return _ONE


@rule("GaussianNLLLoss")
def _gaussian_nll(m, ins, ctx):
    inp, target, var = ins
    _like("assert_shape(target, dims)", inp, target)
    _like("assert_shape(var, dims)", inp, var)
    return _ONE


@rule("CrossEntropyLoss")
def _cross_entropy(m, ins, ctx):
    logits, targets = ins
    expect("assert_shape(logits, [None, None])", logits, [None, None])
    batch_size, _ = logits.dims
    expect("assert_shape(targets, [batch_size])", targets, [batch_size])
    if targets.dtype != "int":
        raise RuleError(f"CrossEntropyLoss: expected int class targets, got {_NP_DTYPE[targets.dtype]}")
    return _ONE


@rule("MultiMarginLoss")
def _multi_margin(m, ins, ctx):
    inp, target = ins
    expect("assert_shape(input, [None, None])", inp, [None, None])
    batch_size, _ = inp.dims
    expect("assert_shape(target, [batch_size])", target, [batch_size])
    return _ONE


@rule("CosineEmbeddingLoss")
def _cosine_embedding(m, ins, ctx):
    a, b, target = ins
    expect("assert_shape(input1, [None, None])", a, [None, None])
    batch_size, embedding_dim = a.dims
    expect("assert_shape(input2, [batch_size, embedding_dim])", b, [batch_size, embedding_dim])
    expect("assert_shape(target, [batch_size])", target, [batch_size])
    return _ONE


@rule("TripletMarginLoss")
def _triplet(m, ins, ctx):
    anchor, positive, negative = ins
    expect("assert_shape(anchor, [None, None])", anchor, [None, None])
    batch_size, embedding_dim = anchor.dims
    expect("assert_shape(positive, [batch_size, embedding_dim])", positive, [batch_size, embedding_dim])
    expect("assert_shape(negative, [batch_size, embedding_dim])", negative, [batch_size, embedding_dim])
    return _ONE


# ---------------------------------------------------------------------------------- primitive ops
_OP_KIND = {"float32": "float", "float64": "float", "float16": "float", "int64": "int", "int32": "int",
            "int8": "int", "uint8": "int", "bool": "bool"}


def _op_axis(axis: int, rank: int, op: str) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise RuleError(f"{op}: axis {axis} is out of range for a tensor of rank {rank}")
    return a


def _broadcast(op: str, shapes: list) -> tuple:
    n = max(s.rank for s in shapes)
    out = [as_dim(1)] * n
    padded = [(as_dim(1),) * (n - s.rank) + tuple(s.dims) for s in shapes]
    for i in range(n):
        d = None
        for p in padded:
            x = p[i]
            if x == 1:
                continue
            if d is None:
                d = x
            elif x != d:
                raise RuleError(f"{op}: the operands' dims {', '.join(dims_text(s.dims) for s in shapes)} do not "
                                f"broadcast (axis {i}: {d} and {x})")
        out[i] = d if d is not None else as_dim(1)
    return tuple(out)


def _const_int(d, what: str, op: str) -> int:
    d = as_dim(d)
    if not d.is_const():
        raise RuleError(f"{op}: {what} is the named axis {d}, where a fixed size is needed")
    return d.value()


@rule("PrimitiveOp")
def _primitive_op(m, ins, ctx):
    from .primitive import parse_operands, slice_length  # noqa: PLC0415

    op, a = m.op, m.attrs
    consts = m.constant_specs()
    ops = []
    for t in parse_operands(m.operands):
        if t is None:
            ops.append(None)
        elif t[0] == "in":
            ops.append(ins[t[1]])
        else:
            dtype, dims = consts[t[1]]
            ops.append(Shape(tuple(as_dim(d) for d in dims), _OP_KIND[dtype]))
    x = ops[0] if ops else None
    if x is None:
        raise RuleError(f"{op}: the first operand is missing")
    arity = {"Where": 3, "MatMul": 2, "Gather": 2, "Gemm": 2, "GatherElements": 2, "PRelu": 2, "ScatterND": 3}
    arity.update({k: 2 for k in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual",
                                 "Greater", "GreaterOrEqual", "And", "Or", "Xor")})
    need = arity.get(op, 1)
    if len([o for o in ops[:need] if o is not None]) < need:
        raise RuleError(f"{op}: expected {need} operands, got {len([o for o in ops if o is not None])}")
    if op in ("Identity", "Neg", "Sqrt", "Reciprocal", "Exp", "Log", "Abs", "Erf", "Tanh", "Sigmoid", "Relu", "Sin",
              "Cos"):
        return _same(x)
    if op in ("IsNaN",):
        return Shape(x.dims, "bool")
    if op == "Not":
        return _same(x)
    if op in ("Max", "Min", "Sum", "Mean"):
        parts = [o for o in ops if o is not None]
        for o in parts[1:]:
            if o.dtype != x.dtype:
                raise RuleError(f"{op}: expected operands of one dtype, got {_NP_DTYPE[x.dtype]} and "
                                f"{_NP_DTYPE[o.dtype]}")
        if op == "Mean":
            _float_input(op, x)
        return Shape(_broadcast(op, parts), x.dtype)
    if op == "Clip":
        for o in ops[1:3]:
            if o is not None and o.rank != 0 and not all(d == 1 for d in o.dims):
                raise RuleError(f"Clip: expected a scalar min / max, got dims {dims_text(o.dims)}")
        return _same(x)
    if op == "Pad":
        from .primitive import OpError, pad_widths  # noqa: PLC0415

        try:
            widths = pad_widths(x.rank, a)
        except OpError as e:
            raise RuleError(str(e)) from None
        dims = []
        for k, (b, e) in enumerate(widths):
            if (a.get("mode") or "constant") == "reflect" and (b or e):
                size = _const_int(x.dims[k], f"axis {k} of {dims_text(x.dims)}", op)
                if max(b, e) >= size:
                    raise RuleError(f"Pad: reflect pads {b}, {e} must be smaller than axis {k} of {dims_text(x.dims)}")
            dims.append(x.dims[k] + (b + e) if b or e else x.dims[k])
        return Shape(tuple(dims), x.dtype)
    if op == "Tile":
        reps = a["shape"] or []
        if len(reps) != x.rank or any(r < 0 for r in reps):
            raise RuleError(f"Tile: expected {x.rank} repeats >= 0 for {dims_text(x.dims)}, got {list(reps)}")
        return Shape(tuple(d * r if r != 1 else d for d, r in zip(x.dims, reps)), x.dtype)
    if op == "GatherElements":
        idx = ops[1]
        k = _op_axis(a["axis"], x.rank, op)
        if idx.dtype != "int" or idx.rank != x.rank:
            raise RuleError(f"GatherElements: expected int indices of rank {x.rank}, got {_NP_DTYPE[idx.dtype]} "
                            f"{dims_text(idx.dims)}")
        return Shape(tuple(idx.dims), x.dtype)
    if op in ("ArgMax", "ArgMin"):
        k = _op_axis(a["axis"], x.rank, op)
        dims = tuple(as_dim(1) if i == k else d for i, d in enumerate(x.dims)) if a["keepdims"] else \
            tuple(d for i, d in enumerate(x.dims) if i != k)
        return Shape(dims, "int")
    if op == "Einsum":
        from .primitive import OpError, einsum_sizes, parse_einsum  # noqa: PLC0415

        parts = [o for o in ops if o is not None]
        try:
            terms, out = parse_einsum(a.get("mode", ""))
            if len(terms) != len(parts):
                raise OpError(f"Einsum: {a.get('mode')!r} names {len(terms)} operand(s), the node has {len(parts)}")
            sizes = einsum_sizes(terms, [p.dims for p in parts], a.get("mode"))
        except OpError as e:
            raise RuleError(str(e)) from None
        _float_input(op, x)
        return Shape(tuple(as_dim(sizes[c]) for c in out), x.dtype)
    if op == "Trilu":
        if x.rank < 2:
            raise RuleError(f"Trilu: expected a tensor of rank >= 2, got {dims_text(x.dims)}")
        return _same(x)
    if op in ("Add", "Sub", "Mul", "Div", "Pow"):
        if op != "Pow" and ops[0].dtype != ops[1].dtype:
            raise RuleError(f"{op}: expected operands of one dtype, got {_NP_DTYPE[ops[0].dtype]} and "
                            f"{_NP_DTYPE[ops[1].dtype]} (dims {dims_text(ops[0].dims)} and {dims_text(ops[1].dims)})")
        return Shape(_broadcast(op, ops[:2]), ops[0].dtype)
    if op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"):
        return Shape(_broadcast(op, ops[:2]), "bool")
    if op == "Where":
        if ops[0].dtype != "bool":
            raise RuleError(f"Where: expected a bool condition, got {_NP_DTYPE[ops[0].dtype]}")
        return Shape(_broadcast(op, ops[:3]), ops[1].dtype)
    if op == "Cast":
        return Shape(x.dims, _OP_KIND[a["to"]])
    if op in ("MatMul", "Gemm"):
        p, q = ops[0], ops[1]
        if p.rank == 0 or q.rank == 0:
            raise RuleError(f"{op}: expected operands of rank >= 1, got dims {dims_text(p.dims)} and {dims_text(q.dims)}")
        if op == "Gemm":
            if p.rank != 2 or q.rank != 2:
                raise RuleError(f"Gemm: expected two rank-2 operands, got dims {dims_text(p.dims)} and "
                                f"{dims_text(q.dims)}")
            pd = p.dims[::-1] if a["trans_a"] else p.dims
            qd = q.dims[::-1] if a["trans_b"] else q.dims
            p, q = Shape(pd, p.dtype), Shape(qd, q.dtype)
        pd = p.dims if p.rank > 1 else (as_dim(1),) + tuple(p.dims)
        qd = q.dims if q.rank > 1 else tuple(q.dims) + (as_dim(1),)
        if p.dtype != q.dtype:
            raise RuleError(f"{op}: expected operands of one dtype, got {_NP_DTYPE[p.dtype]} and {_NP_DTYPE[q.dtype]}")
        if pd[-1] != qd[-2]:
            raise RuleError(f"{op}: inner dimensions differ: dims {dims_text(p.dims)} @ {dims_text(q.dims)}")
        lead = _broadcast(op, [Shape(pd[:-2]), Shape(qd[:-2])]) if len(pd) > 2 or len(qd) > 2 else ()
        out = tuple(lead) + ((pd[-2],) if p.rank > 1 else ()) + ((qd[-1],) if q.rank > 1 else ())
        if op == "Gemm" and len(ops) > 2 and ops[2] is not None:
            _broadcast("Gemm", [Shape(out), ops[2]])
        return Shape(out, p.dtype)
    if op == "Transpose":
        perm = a["perm"] if a["perm"] is not None else list(range(x.rank))[::-1]
        if sorted(perm) != list(range(x.rank)):
            raise RuleError(f"Transpose: perm {perm} is not a permutation of the {x.rank} axes of "
                            f"{dims_text(x.dims)}")
        return Shape(tuple(x.dims[i] for i in perm), x.dtype)
    if op in ("Reshape", "Expand") and any(s <= -2 for s in (a["shape"] or [])):
        ref = ops[1] if len(ops) > 1 else None
        target = []
        for s in a["shape"]:
            if s <= -2:
                if ref is None or -s - 2 >= ref.rank:
                    raise RuleError(f"{op}: the shape code {s} names axis {-s - 2} of the reference operand, which "
                                    f"{'is absent' if ref is None else f'has dims {dims_text(ref.dims)}'}")
                target.append(ref.dims[-s - 2])
            else:
                target.append(s)
    else:
        target = list(a["shape"] or [])
    if op == "Reshape":
        shape = target
        if shape.count(-1) > 1 or any(isinstance(s, int) and s < -1 for s in shape):
            raise RuleError(f"Reshape: expected sizes >= 0 and at most one -1, got {shape}")
        out = []
        for i, s in enumerate(shape):
            if isinstance(s, int) and s == 0:
                if i >= x.rank:
                    raise RuleError(f"Reshape: 0 at axis {i} copies an axis the input {dims_text(x.dims)} lacks")
                out.append(as_dim(x.dims[i]))
            else:
                out.append(s)
        total = as_dim(1)
        for d in x.dims:
            total = total * d
        known = as_dim(1)
        for d in out:
            if not (isinstance(d, int) and d == -1):
                known = known * d
        if -1 in [d for d in out if isinstance(d, int)]:
            if known == 0:
                raise RuleError(f"Reshape: cannot infer -1 in {shape} from dims {dims_text(x.dims)}")
            q = _quotient(total, known)
            if q is None:
                raise RuleError(f"Reshape: cannot reshape {dims_text(x.dims)} into {shape}: no size for -1 makes "
                                f"the number of elements agree")
            out = [q if isinstance(d, int) and d == -1 else d for d in out]
        elif _product_dims(out) != total:
            raise RuleError(f"Reshape: cannot reshape {dims_text(x.dims)} into {shape}: the number of elements "
                            f"differs")
        return Shape(tuple(as_dim(d) for d in out), x.dtype)
    if op == "Unsqueeze":
        axes = a["axes"] or []
        rank = x.rank + len(axes)
        pos = sorted({_op_axis(v, rank, op) for v in axes})
        if len(pos) != len(axes):
            raise RuleError(f"Unsqueeze: axes {axes} repeat an axis")
        dims = list(x.dims)
        for p in pos:
            dims.insert(p, as_dim(1))
        return Shape(tuple(dims), x.dtype)
    if op == "Squeeze":
        axes = a["axes"]
        if axes is None:
            pos = [i for i, d in enumerate(x.dims) if d == 1]
        else:
            pos = sorted({_op_axis(v, x.rank, op) for v in axes})
            for p in pos:
                if x.dims[p] != 1:
                    raise RuleError(f"Squeeze: axis {p} of {dims_text(x.dims)} has size {x.dims[p]}, expected 1")
        return Shape(tuple(d for i, d in enumerate(x.dims) if i not in pos), x.dtype)
    if op == "Flatten":
        k = _op_axis(a["axis"], x.rank + 1, op)
        return Shape((_product_dims(x.dims[:k]), _product_dims(x.dims[k:])), x.dtype)
    if op == "Expand":
        shape = target
        return Shape(_broadcast(op, [x, Shape(tuple(as_dim(s) for s in shape))]), x.dtype)
    if op == "Concat":
        parts = [o for o in ops if o is not None]
        k = _op_axis(a["axis"], x.rank, op)
        total = as_dim(0)
        for i, t in enumerate(parts):
            if t.rank != x.rank or t.dtype != x.dtype or any(t.dims[j] != x.dims[j] for j in range(x.rank) if j != k):
                raise RuleError(f"Concat: operand {i} has dims {dims_text(t.dims)} ({_NP_DTYPE[t.dtype]}), expected "
                                f"those of operand 0 {dims_text(x.dims)} ({_NP_DTYPE[x.dtype]}) except on axis {k}")
            total = total + t.dims[k]
        return Shape(x.dims[:k] + (total,) + x.dims[k + 1:], x.dtype)
    if op == "Slice":
        starts, ends = a["starts"] or [], a["ends"] or []
        axes = a["axes"] if a["axes"] is not None else list(range(len(starts)))
        steps = a["steps"] if a["steps"] is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise RuleError(f"Slice: starts, ends, axes and steps differ in length ({len(starts)}, {len(ends)}, "
                            f"{len(axes)}, {len(steps)})")
        dims = list(x.dims)
        for s, e, ax, st in zip(starts, ends, axes, steps):
            k = _op_axis(ax, x.rank, op)
            if st == 0:
                raise RuleError("Slice: a step of 0")
            size = _const_int(dims[k], f"axis {k} of {dims_text(x.dims)}", op) if not (
                s == 0 and st == 1 and e >= 1 << 31) else None
            dims[k] = dims[k] if size is None else as_dim(slice_length(size, s, e, st))
        return Shape(tuple(dims), x.dtype)
    if op == "Gather":
        idx = ops[1]
        if idx.dtype != "int":
            raise RuleError(f"Gather: expected int indices, got {_NP_DTYPE[idx.dtype]}")
        k = _op_axis(a["axis"], x.rank, op)
        return Shape(x.dims[:k] + tuple(idx.dims) + x.dims[k + 1:], x.dtype)
    if op in ("Softmax", "LogSoftmax"):
        _op_axis(a["axis"], x.rank, op)
        _float_input(op, x)
        return _same(x)
    if op == "CumSum":
        _op_axis(a["axis"], x.rank, op)
        _float_input(op, x)
        return _same(x)
    if op == "TopK":
        k_axis = _op_axis(a["axis"], x.rank, op)
        k = int((a["shape"] or [0])[0])
        size = x.dims[k_axis]
        if as_dim(size).is_const() and not 0 <= k <= as_dim(size).value():
            raise RuleError(f"TopK: k {k} for axis {k_axis} of {dims_text(x.dims)}")
        dims = tuple(as_dim(k) if i == k_axis else d for i, d in enumerate(x.dims))
        return Shape(dims, "int" if (a.get("mode") or "").endswith("indices") else x.dtype)
    if op == "ScatterND":
        idx, upd = ops[1], ops[2]
        if idx.dtype != "int" or idx.rank < 1:
            raise RuleError(f"ScatterND: expected int indices of rank >= 1, got {_NP_DTYPE[idx.dtype]} "
                            f"{dims_text(idx.dims)}")
        q = _const_int(idx.dims[-1], "the indices' last axis", op)
        if not 1 <= q <= x.rank:
            raise RuleError(f"ScatterND: indices {dims_text(idx.dims)} index {q} axes of {dims_text(x.dims)}")
        want = tuple(idx.dims[:-1]) + tuple(x.dims[q:])
        if upd.dtype != x.dtype or upd.rank != len(want) or any(u != w for u, w in zip(upd.dims, want)):
            raise RuleError(f"ScatterND: updates {dims_text(upd.dims)}, expected {dims_text(want)} of the data's dtype")
        return _same(x)
    if op == "PRelu":
        if ops[1] is None or ops[1].dtype != x.dtype:
            raise RuleError("PRelu: expected a slope of the input's dtype")
        if _broadcast(op, [x, ops[1]]) != tuple(x.dims):
            raise RuleError(f"PRelu: the slope {dims_text(ops[1].dims)} does not broadcast to {dims_text(x.dims)}")
        return _same(x)
    if op == "Shrink":
        _float_input(op, x)
        return _same(x)
    if op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceLogSumExp"):
        if op == "ReduceLogSumExp":
            _float_input(op, x)
        axes = a["axes"]
        pos = set(range(x.rank)) if axes is None else {_op_axis(v, x.rank, op) for v in axes}
        if a["keepdims"]:
            return Shape(tuple(as_dim(1) if i in pos else d for i, d in enumerate(x.dims)), x.dtype)
        return Shape(tuple(d for i, d in enumerate(x.dims) if i not in pos), x.dtype)
    if op == "Shape":
        return Shape((as_dim(x.rank),), "int")
    raise RuleError(f"{op}: no shape rule")


class _OpSettings:
    """What the `PrimitiveOp` rule reads of an Op node's module, for `op_shape`."""

    def __init__(self, op: str, attrs: dict, operands: str):
        self.op, self.attrs, self.operands = op, attrs, operands

    @staticmethod
    def constant_specs() -> list:
        return []


def op_shape(op: str, attrs: dict, inputs: list) -> Shape:
    """The output of the primitive op `op` (ONNX semantics, `attrs` as `PrimitiveOp` holds them) on operands of
    these Shapes (None: an absent optional operand), by the `PrimitiveOp` rule: nothing is computed, so the
    ONNX importer sizes a constant fold with it before making the array."""
    tokens, shapes = [], []
    for t in inputs:
        tokens.append("" if t is None else f"in{len(shapes)}")
        if t is not None:
            shapes.append(Shape(tuple(as_dim(d) for d in t.dims), t.dtype))
    out = _primitive_op(_OpSettings(op, attrs, ",".join(tokens)), shapes, _Ctx())
    return Shape(tuple(as_dim(d) for d in out.dims), out.dtype)


def _product_dims(dims):
    p = as_dim(1)
    for d in dims:
        p = p * as_dim(d)
    return p


def _quotient(total, known):
    """total / known when it is exact (a monomial divisor, or a constant one dividing every coefficient)."""
    known = as_dim(known)
    if known.is_const():
        k = known.value()
        return total // k if k and total.divisible_by(k) else None
    if len(known.terms) != 1:
        return None
    (km, kc), = known.terms.items()
    out = {}
    for mono, c in total.terms.items():
        rest = list(mono)
        for atom in km:
            if atom not in rest:
                return None
            rest.remove(atom)
        if c % kc:
            return None
        out[tuple(rest)] = c // kc
    from .dims import Dim  # noqa: PLC0415

    return Dim(out)
