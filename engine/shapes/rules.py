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

A layer declares its rule next to its class (`engine.nn.spec.declare(Cls, shape=rule)`);
`engine.nn.spec.infer(module, inputs)` applies it (`has_rule` says whether there is one). This
module holds what the rules share: `Shape`, `RuleError`, the constraint context `Ctx`, `expect`
(`assert_shape` over symbolic dims) and the convolution arithmetic the conv and pool rules use. The tensor a rule describes is the one the designer uses: for a recurrent layer whose
forward returns `(output, state)`, the output; `MultiHeadAttention` is self-attention on one
tensor. One corner has no exact rule and raises `RuleError` saying so: Burn's Same padding with
a dilated window whose kernel is smaller than the stride (the output then depends on the size
modulo the stride in a way these expressions do not state).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .dims import Constraint, Dim, as_dim

__all__ = ["Shape", "RuleError", "RuleResult", "Ctx", "dims_text", "expect", "float_input", "same", "with_dim",
           "elementwise", "tuple_of", "explicit_pads", "conv_out", "same_out", "same_min_length", "min_size",
           "kernel_too_large", "ONE", "like", "rows_like", "NP_DTYPE"]


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


class Ctx:
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


NP_DTYPE = {"float": "float32", "int": "int64", "bool": "bool"}


def float_input(owner: str, t: Shape, name: str = "input") -> None:
    if t.dtype != "float":
        raise RuleError(f"{owner}: expected a float tensor, got {NP_DTYPE[t.dtype]} ({name} dims "
                        f"{dims_text(t.dims)}); convert the {name} with {name}.cast(\"float32\")")


def same(t: Shape, dtype: str | None = None) -> Shape:
    return Shape(t.dims, dtype or t.dtype)


def with_dim(dims, i: int, d) -> tuple:
    dims = list(dims)
    dims[i] = as_dim(d)
    return tuple(dims)


def elementwise(m, ins, ctx):
    expect("assert_shape(input, [None, ...])", ins[0], [None, ...])
    return same(ins[0])


def tuple_of(v, n: int) -> tuple:
    return tuple(int(x) for x in v) if isinstance(v, (tuple, list)) else (int(v),) * n


def explicit_pads(padding, n: int):
    """(start, end) pads per axis, or None for Same padding (which depends on the size)."""
    if padding.kind == "Valid":
        return [(0, 0)] * n
    if padding.kind == "Explicit":
        return [(padding.values[i], padding.values[i + n]) for i in range(n)]
    return None


def conv_out(size: Dim, lo, hi, k: int, s: int, d: int) -> Dim:
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def same_out(size: Dim, k: int, s: int, d: int, owner: str) -> Dim:
    """The output size with Burn's Same padding: total = max((ceil(L/s)-1)*s + k - L, 0) (the
    kernel, not the dilated window), so out = ceil(L/s) + floor((k - eff)/s) when k >= s."""
    eff = d * (k - 1) + 1
    if k < s and eff > k:
        raise RuleError(f"{owner}: Same padding with a stride ({s}) larger than the kernel ({k}) and dilation {d} "
                        f"has no exact shape rule: use Explicit padding")
    # k >= s: the total is never clamped; an undilated window (eff == k) and k < s: out = ceil(L/s) either way
    shift = (k - eff) // s if k >= s else 0
    return size.ceil_div(s) + shift


def same_min_length(k: int, s: int, eff: int) -> int:
    """The shortest input Same padding (by the kernel, k >= s) leaves room for a dilated window of
    `eff`: the padded span (ceil(L/s) - 1) * s + k - eff must not be negative."""
    m = -(-(s + eff - k) // s)  # ceil(L/s) >= m
    return (m - 1) * s + 1


def min_size(ctx, size: Dim, need: int, message) -> None:
    ctx.require(size, "min", need, message)


def kernel_too_large(op, kernel, dilation, sizes, padding) -> str:
    return (f"{op}: the kernel (size {list(kernel)}, dilation {list(dilation)}) is larger than the padded input "
            f"(spatial dims {dims_text(sizes)}, padding {padding})")


ONE = Shape((as_dim(1),))


def like(call: str, first: Shape, *others: Shape) -> None:
    for t in others:
        expect(call, t, list(first.dims))


def rows_like(names, ins, width: str = "embedding_dim") -> tuple:
    """Inputs `names` (the first `[None, None]`, each other `[batch_size, width]` like it), as the
    layers' `assert_shape` calls say; returns the first's (batch_size, width) dims."""
    first = ins[0]
    expect(f"assert_shape({names[0]}, [None, None])", first, [None, None])
    batch_size, w = first.dims
    for name, t in zip(names[1:], ins[1:]):
        expect(f"assert_shape({name}, [batch_size, {width}])", t, [batch_size, w])
    return batch_size, w
