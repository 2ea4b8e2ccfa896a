"""Elementwise operations with broadcasting, each beside its backward rule.

Two tensors of different float dtypes promote as NumPy and PyTorch promote them (float32 and
float64 give float64); the gradient of each operand comes back in the operand's own dtype.
(Matrix products and convolutions refuse mixed dtypes instead: see ops_matmul.py.)
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ..autodiff.tape import Node, is_recording
from .tensor import Tensor, TensorError, as_operand, check_same_device, record, tensor_method, unbroadcast
from .scalar_ufunc import maximum_scalar, minimum_scalar
from . import cpu
from .cpu import elementwise

_wrap = Tensor._wrap


def _special(xp):
    if xp is np:
        import scipy.special as sp  # noqa: PLC0415

        return sp
    import cupyx.scipy.special as sp  # noqa: PLC0415

    return sp


def _bcast_error(op, a, b, exc):
    bdesc = f"dims {list(b.shape)}" if isinstance(b, Tensor) else repr(b)
    return TensorError(f"{op}: shapes cannot be broadcast together: dims {list(a.shape)} and {bdesc} ({exc})")


# ---------------------------------------------------------------- binary arithmetic
def _binary(a: Tensor, b, op: str, fwd, rule_tt, rule_ts, saves: str = "xyo"):
    """`saves` names the arrays the rules read (x, y, o: the operands and the output); only
    those stay alive in the graph until backward, the others reach the rules as None. The
    tensor-tensor rule also gets both operands' shapes, to reduce broadcast gradients.

    The common operands (a Tensor on the same device, a Python float or int) are recognised
    by their exact type before the general check: this runs for every arithmetic operator."""
    tb = type(b)
    if tb is not Tensor and tb is not float and tb is not int:
        b = as_operand(a, b, op)
        tb = Tensor if isinstance(b, Tensor) else float
    dev = a._device
    if tb is Tensor:
        if b._device is not dev:
            check_same_device(op, a, b)
        xd, yd = a._data, b._data
        try:
            out = fwd(xd, yd)
        except ValueError as exc:
            raise _bcast_error(op, a, b, exc) from None
        na, nb = a._node is not None, b._node is not None
        if not (na or nb) or not is_recording():
            return _wrap(out, dev, a._ad or b._ad)
        x = xd if "x" in saves else None
        y = yd if "y" in saves else None
        o = out if "o" in saves else None
        xs, ys = xd.shape, yd.shape
        if xd.dtype is yd.dtype:
            return _wrap(out, dev, True, Node((a._node, b._node), lambda g: rule_tt(g, x, y, o, na, nb, xs, ys), op))
        # mixed float dtypes promote (float32 + float64 -> float64); each operand's gradient
        # goes back in its own dtype, as after a cast
        xt, yt = xd.dtype, yd.dtype
        return _wrap(out, dev, True, Node(
            (a._node, b._node), lambda g: _own_dtypes(rule_tt(g, x, y, o, na, nb, xs, ys), xt, yt), op))
    out = fwd(a._data, b)
    if a._node is None or not is_recording():
        return _wrap(out, dev, a._ad)
    x = a._data if "x" in saves else None
    o = out if "o" in saves else None
    return _wrap(out, dev, True, Node((a._node,), lambda g: (rule_ts(g, x, b, o),), op))


def _own_dtypes(grads, xt, yt):
    gx, gy = grads
    if gx is not None and gx.dtype != xt:
        gx = gx.astype(xt)
    if gy is not None and gy.dtype != yt:
        gy = gy.astype(yt)
    return gx, gy


# rules for tensor-tensor ops: na / nb say whether each operand needs its gradient, xs / ys
# are the operands' shapes
def _add_tt(g, x, y, out, na, nb, xs, ys):
    return (unbroadcast(g, xs) if na else None), (unbroadcast(g, ys) if nb else None)


def _sub_tt(g, x, y, out, na, nb, xs, ys):
    return (unbroadcast(g, xs) if na else None), (unbroadcast(-g, ys) if nb else None)


def _mul_tt(g, x, y, out, na, nb, xs, ys):
    return (unbroadcast(g * y, xs) if na else None), (unbroadcast(g * x, ys) if nb else None)


def _div_tt(g, x, y, out, na, nb, xs, ys):
    gx = g / y
    return (unbroadcast(gx, xs) if na else None), (unbroadcast(-gx * out, ys) if nb else None)


def _pow_tt(g, x, y, out, na, nb, xs, ys):
    xp = _xp(x)
    gx = unbroadcast(g * y * xp.power(x, y - 1), xs) if na else None
    gy = None
    if nb:
        with np.errstate(divide="ignore", invalid="ignore"):
            logx = xp.where(x > 0, xp.log(xp.where(x > 0, x, 1)), 0)
        gy = unbroadcast(g * out * logx, ys)
    return gx, gy


def _xp(arr):
    return np if isinstance(arr, (np.ndarray, np.generic)) else __import__("cupy")


@tensor_method
def add(self, other):
    return _binary(self, other, "add", operator.add, _add_tt, lambda g, x, s, o: g, saves="")


@tensor_method
def sub(self, other):
    return _binary(self, other, "sub", operator.sub, _sub_tt, lambda g, x, s, o: g, saves="")


@tensor_method
def mul(self, other):
    return _binary(self, other, "mul", operator.mul, _mul_tt, lambda g, x, s, o: g * s, saves="xy")


@tensor_method
def div(self, other):
    return _binary(self, other, "div", operator.truediv, _div_tt, lambda g, x, s, o: g / s, saves="yo")


@tensor_method
def pow(self, other):
    """Elementwise power; `other` a tensor or a number."""
    return _binary(
        self, other, "pow", lambda x, y: x**y, _pow_tt, lambda g, x, s, o: g * (s * x ** (s - 1)) if s != 0 else g * 0
    )


@tensor_method
def rsub(self, other):
    """`other - self`."""
    return self.neg().add(other)


@tensor_method
def rdiv(self, other):
    """`other / self` for a number `other`."""
    return self.pow(-1.0).mul(other) if not isinstance(other, Tensor) else other.div(self)


@tensor_method
def neg(self):
    return _unary(self, "neg", operator.neg, lambda g, x, o: -g, saves="")


@tensor_method
def maximum(self, other):
    """Elementwise maximum of two tensors (the gradient goes to the larger; ties to self)."""
    return _binary(
        self,
        other,
        "maximum",
        lambda x, y: _xp(x).maximum(x, y),
        lambda g, x, y, o, na, nb, xs, ys: (unbroadcast(g * (x >= y), xs), unbroadcast(g * (x < y), ys)),
        lambda g, x, s, o: g * (x >= s),
        saves="xy",
    )


@tensor_method
def minimum(self, other):
    return _binary(
        self,
        other,
        "minimum",
        lambda x, y: _xp(x).minimum(x, y),
        lambda g, x, y, o, na, nb, xs, ys: (unbroadcast(g * (x <= y), xs), unbroadcast(g * (x > y), ys)),
        lambda g, x, s, o: g * (x <= s),
        saves="xy",
    )


Tensor.__add__ = add
Tensor.__radd__ = add
Tensor.__sub__ = sub
Tensor.__rsub__ = rsub
Tensor.__mul__ = mul
Tensor.__rmul__ = mul
Tensor.__truediv__ = div
Tensor.__rtruediv__ = rdiv
Tensor.__neg__ = neg
Tensor.__pow__ = pow


# ---------------------------------------------------------------- unary
def _unary(a: Tensor, op: str, fwd, rule, saves: str = "xo"):
    """`saves` names what `rule(g, x, o)` reads: the input x and / or the output o. Only those
    stay alive in the graph until backward; the others reach the rule as None."""
    x = a._data
    out = fwd(x)
    if a._node is None or not is_recording():
        return _wrap(out, a._device, a._ad)
    xs = x if "x" in saves else None
    os_ = out if "o" in saves else None
    return _wrap(out, a._device, True, Node((a._node,), lambda g: (rule(g, xs, os_),), op))


@tensor_method
def exp(self):
    return _unary(self, "exp", lambda x: _xp(x).exp(x), lambda g, x, o: g * o, saves="o")


@tensor_method
def log(self):
    return _unary(self, "log", lambda x: _xp(x).log(x), lambda g, x, o: g / x, saves="x")


@tensor_method
def log1p(self):
    return _unary(self, "log1p", lambda x: _xp(x).log1p(x), lambda g, x, o: g / (1 + x), saves="x")


@tensor_method
def sqrt(self):
    return _unary(self, "sqrt", lambda x: _xp(x).sqrt(x), lambda g, x, o: g * 0.5 / o, saves="o")


@tensor_method
def rsqrt(self):
    return _unary(self, "rsqrt", lambda x: 1 / _xp(x).sqrt(x), lambda g, x, o: g * -0.5 * o / x)


@tensor_method
def abs(self):
    return _unary(self, "abs", lambda x: _xp(x).abs(x), lambda g, x, o: g * _xp(x).sign(x), saves="x")


@tensor_method
def sign(self):
    return _unary(self, "sign", lambda x: _xp(x).sign(x), lambda g, x, o: g * 0, saves="")


@tensor_method
def powf(self, exponent: float):
    """`self ** exponent` for a number exponent."""
    return self.pow(float(exponent))


@tensor_method
def square(self):
    return _unary(self, "square", lambda x: x * x, lambda g, x, o: g * 2 * x, saves="x")


@tensor_method
def recip(self):
    return _unary(self, "recip", lambda x: 1 / x, lambda g, x, o: -g * o * o, saves="o")


@tensor_method
def tanh(self):
    return _unary(self, "tanh", lambda x: _xp(x).tanh(x), lambda g, x, o: g * (1 - o * o), saves="o")


def _sigmoid(x):
    xp = _xp(x)
    # stable for large |x|: exp of a non-positive number only
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@tensor_method
def sigmoid(self):
    return _unary(self, "sigmoid", _sigmoid, lambda g, x, o: g * o * (1 - o), saves="o")


@tensor_method
def erf(self):
    sq = 2.0 / math.sqrt(math.pi)

    def fwd(x):
        return _special(_xp(x)).erf(x).astype(x.dtype, copy=False)

    return _unary(self, "erf", fwd, lambda g, x, o: g * (sq * _xp(x).exp(-x * x)), saves="x")


@tensor_method
def sin(self):
    return _unary(self, "sin", lambda x: _xp(x).sin(x), lambda g, x, o: g * _xp(x).cos(x), saves="x")


@tensor_method
def cos(self):
    return _unary(self, "cos", lambda x: _xp(x).cos(x), lambda g, x, o: -g * _xp(x).sin(x), saves="x")


@tensor_method
def relu(self):
    return _unary(self, "relu", _relu, _relu_grad, saves="o")


def _relu(x):
    if not isinstance(x, np.ndarray):
        return _xp(x).maximum(x, 0)
    return elementwise(_relu_into, x.dtype, x)


def _relu_into(x, out=None):
    return maximum_scalar(x, 0.0, out=out)


def _relu_grad(g, x, o):
    if not (isinstance(g, np.ndarray) and isinstance(o, np.ndarray)) or g.dtype != o.dtype:
        return g * (o > 0)
    return elementwise(_mask_positive, g.dtype, g, o)


def _mask_positive(g, o, out=None):
    """g where o > 0, else 0 (g * (o > 0)); float32 through the compiled kernel in one pass."""
    k = cpu.kernels() if g.dtype == np.float32 and g.flags.c_contiguous and o.flags.c_contiguous else None
    if k is None:
        return np.multiply(g, o > 0, out=out)
    if out is None:
        out = np.empty(g.shape, np.float32)
    k.relu_grad(g.reshape(-1), o.reshape(-1), out.reshape(-1))
    return out


@tensor_method
def clamp(self, min=None, max=None):
    """Clamp into [min, max] (either bound may be None); gradient 1 inside, 0 where clipped."""
    if min is None and max is None:
        raise TensorError("clamp: expected at least one of min and max")

    def fwd(x):
        scalar = (int, float, np.integer, np.floating)
        if (isinstance(x, np.ndarray) and x.dtype.kind == "f" and (min is None or isinstance(min, scalar))
                and (max is None or isinstance(max, scalar))):
            # np.clip's scalar loops are the slow ones of maximum / minimum (scalar_ufunc)
            out = x if min is None else maximum_scalar(x, min)
            if max is not None:
                # in place into maximum's result, unless that is x itself or a NumPy scalar (0-d x)
                out = minimum_scalar(out, max, out=out if out is not x and isinstance(out, np.ndarray) else None)
            return out
        return _xp(x).clip(x, min, max)

    def rule(g, x, o):
        mask = _xp(x).ones_like(x, dtype=bool)
        if min is not None:
            mask &= x >= min
        if max is not None:
            mask &= x <= max
        return g * mask

    return _unary(self, "clamp", fwd, rule, saves="x")


@tensor_method
def clamp_min(self, min):
    return self.clamp(min=min)


@tensor_method
def clamp_max(self, max):
    return self.clamp(max=max)


@tensor_method
def cast(self, dtype):
    """Convert to another dtype; float-to-float casts pass gradients through (cast back)."""
    from . import dtype as _dt  # noqa: PLC0415

    dt = _dt.as_dtype(dtype)
    src = self._data.dtype
    if dt.np == src:
        return self
    if dt.kind == "float" and src.kind == "f":
        return _unary(self, "cast", lambda x: x.astype(dt.np), lambda g, x, o: g.astype(src), saves="")
    return Tensor._wrap(self._data.astype(dt.np), self._device, self._ad)


# ---------------------------------------------------------------- comparisons and masks
def _compare(a: Tensor, b, op: str, fn):
    b = as_operand(a, b, op)
    y = b._data if isinstance(b, Tensor) else b
    try:
        out = fn(a._data, y)
    except ValueError as exc:
        raise _bcast_error(op, a, b, exc) from None
    return Tensor._wrap(out, a._device, False)


@tensor_method
def equal(self, other):
    return _compare(self, other, "equal", lambda x, y: x == y)


@tensor_method
def not_equal(self, other):
    return _compare(self, other, "not_equal", lambda x, y: x != y)


@tensor_method
def greater(self, other):
    return _compare(self, other, "greater", lambda x, y: x > y)


@tensor_method
def greater_equal(self, other):
    return _compare(self, other, "greater_equal", lambda x, y: x >= y)


@tensor_method
def lower(self, other):
    return _compare(self, other, "lower", lambda x, y: x < y)


@tensor_method
def lower_equal(self, other):
    return _compare(self, other, "lower_equal", lambda x, y: x <= y)


Tensor.__gt__ = greater
Tensor.__ge__ = greater_equal
Tensor.__lt__ = lower
Tensor.__le__ = lower_equal
Tensor.eq = equal
Tensor.ne = not_equal
Tensor.gt = greater
Tensor.ge = greater_equal
Tensor.lt = lower
Tensor.le = lower_equal


@tensor_method
def bool_not(self):
    return Tensor._wrap(~self._data.astype(bool), self._device, False)


@tensor_method
def bool_and(self, other):
    check_same_device("bool_and", self, other)
    return Tensor._wrap(self._data.astype(bool) & other._data.astype(bool), self._device, False)


@tensor_method
def bool_or(self, other):
    check_same_device("bool_or", self, other)
    return Tensor._wrap(self._data.astype(bool) | other._data.astype(bool), self._device, False)


@tensor_method
def any(self):
    return Tensor._wrap(_xp(self._data).asarray(self._data.any()), self._device, False)


@tensor_method
def all(self):
    return Tensor._wrap(_xp(self._data).asarray(self._data.all()), self._device, False)


@tensor_method
def is_nan(self):
    return Tensor._wrap(_xp(self._data).isnan(self._data), self._device, False)


@tensor_method
def where(self, mask, other):
    """Burn's `mask_where`: values of `other` where `mask` is true, else of self."""
    return where(mask, other, self)


def where(mask: Tensor, a, b) -> Tensor:
    """`a` where `mask`, else `b` (tensors or numbers, broadcast together)."""
    ref = a if isinstance(a, Tensor) else b
    if not isinstance(ref, Tensor):
        raise TensorError("where: expected at least one of the two value operands to be a tensor")
    check_same_device("where", mask, ref)
    m = mask._data
    if m.dtype.kind != "b":
        raise TensorError(f"where: expected a bool mask, got {mask.dtype} (dims {list(mask.shape)})")
    xp = ref._device.xp
    av = a._data if isinstance(a, Tensor) else a
    bv = b._data if isinstance(b, Tensor) else b
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        check_same_device("where", a, b)
    try:
        out = xp.where(m, av, bv)
    except ValueError as exc:
        raise TensorError(f"where: shapes cannot be broadcast: mask {list(mask.shape)}, dims {list(ref.shape)} ({exc})") from None
    if isinstance(a, Tensor) != isinstance(b, Tensor):
        out = out.astype(ref._data.dtype, copy=False)
    # positional, not by identity: where(m, x, x) has x on both sides
    picked = [(t, is_a) for t, is_a in ((a, True), (b, False)) if isinstance(t, Tensor)]
    inputs = [t for t, _ in picked]
    shapes = [t._data.shape for t in inputs]
    which = [is_a for _, is_a in picked]

    def rule(g):
        res = []
        for s, is_a in zip(shapes, which):
            gm = xp.where(m, g, 0) if is_a else xp.where(m, 0, g)
            res.append(unbroadcast(gm.astype(g.dtype, copy=False), s))
        return tuple(res)

    return record(out, ref._device, inputs, rule, "where")


@tensor_method
def mask_fill(self, mask, value):
    """`value` where `mask` is true, else self."""
    return where(mask, value, self)


@tensor_method
def mask_where(self, mask, other):
    return where(mask, other, self)
