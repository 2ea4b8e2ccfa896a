"""Reductions (sum, mean, max, min, var, argmax, argmin) and the softmax family."""
from __future__ import annotations

import builtins
import math

import numpy as np

from .tensor import Tensor, TensorError, dim_index, record, tensor_method


def _axis(op, t: Tensor, dim):
    if dim is None:
        return None
    return dim_index(op, dim, t._data.ndim)


def _expand_grad(g, shape, axis, keepdim):
    """Bring a reduced gradient back to broadcastable form against the input."""
    if axis is None:
        return g.reshape((1,) * len(shape)) if len(shape) else g
    if not keepdim:
        g = g.reshape(g.shape[:axis] + (1,) + g.shape[axis:])
    return g


_SPREAD_COPY_MAX = 1 << 15  # elements: below this a filled array is cheaper than a broadcast view


def _spread(xp, g, shape):
    """`g` (broadcastable to `shape`) repeated over `shape`: a fresh array when small, which
    costs less to build than a broadcast view; a read-only broadcast view when large."""
    if math.prod(shape) <= _SPREAD_COPY_MAX:
        out = xp.empty(shape, dtype=g.dtype)
        out[...] = g
        return out
    return xp.broadcast_to(g, shape)


@tensor_method
def sum(self, dim=None, keepdim=False):
    """Sum over `dim` (keeping it when `keepdim`), or over everything to a rank-0 tensor."""
    x = self._data
    axis = _axis("sum", self, dim)
    out = x.sum(axis=axis, keepdims=keepdim if axis is not None else False)
    shape = x.shape
    xp = self._device.xp

    def rule(g):
        return (_spread(xp, _expand_grad(g, shape, axis, keepdim), shape),)

    return record(out, self._device, (self,), rule, "sum")


@tensor_method
def mean(self, dim=None, keepdim=False):
    x = self._data
    axis = _axis("mean", self, dim)
    n = x.size if axis is None else x.shape[axis]
    out = x.mean(axis=axis, keepdims=keepdim if axis is not None else False)
    shape = x.shape
    xp = self._device.xp
    scale = 1.0 / n if n else 0.0

    def rule(g):
        return (_spread(xp, _expand_grad(g, shape, axis, keepdim) * scale, shape),)

    return record(out, self._device, (self,), rule, "mean")


def _extreme(self, dim, keepdim, op, argfn):
    x = self._data
    xp = self._device.xp
    if dim is None:
        if x.size == 0:
            raise TensorError(f"{op}: cannot reduce an empty tensor (dims {list(x.shape)})")
        flat = x.reshape(-1)
        i = int(argfn(flat))
        out = flat[i]
        shape = x.shape

        def rule_all(g):
            gx = xp.zeros(flat.shape, dtype=g.dtype)
            gx[i] = g
            return (gx.reshape(shape),)

        return record(xp.asarray(out), self._device, (self,), rule_all, op)
    axis = dim_index(op, dim, x.ndim)
    if x.shape[axis] == 0:
        raise TensorError(f"{op}: cannot reduce along dim {dim} of size 0 (dims {list(x.shape)})")
    idx = xp.expand_dims(argfn(x, axis=axis), axis)
    out = xp.take_along_axis(x, idx, axis=axis)
    if not keepdim:
        out = out.squeeze(axis)

    def rule(g):
        gx = xp.zeros(x.shape, dtype=g.dtype)
        gk = g if keepdim else xp.expand_dims(g, axis)
        xp.put_along_axis(gx, idx, gk, axis=axis)
        return (gx,)

    return record(out, self._device, (self,), rule, op)


@tensor_method
def max(self, dim=None, keepdim=False):
    """Largest value along `dim` or overall; the gradient goes to the first maximum."""
    return _extreme(self, dim, keepdim, "max", self._device.xp.argmax)


@tensor_method
def min(self, dim=None, keepdim=False):
    return _extreme(self, dim, keepdim, "min", self._device.xp.argmin)


@tensor_method
def argmax(self, dim=None, keepdim=False):
    """Index of the largest value (int64); along `dim`, or of the flattened tensor."""
    x = self._data
    xp = self._device.xp
    if dim is None:
        return Tensor._wrap(xp.asarray(xp.argmax(x)).astype(np.int64), self._device)
    axis = dim_index("argmax", dim, x.ndim)
    out = xp.argmax(x, axis=axis, keepdims=keepdim).astype(np.int64)
    return Tensor._wrap(out, self._device)


@tensor_method
def argmin(self, dim=None, keepdim=False):
    x = self._data
    xp = self._device.xp
    if dim is None:
        return Tensor._wrap(xp.asarray(xp.argmin(x)).astype(np.int64), self._device)
    axis = dim_index("argmin", dim, x.ndim)
    return Tensor._wrap(xp.argmin(x, axis=axis, keepdims=keepdim).astype(np.int64), self._device)


@tensor_method
def var(self, dim=None, keepdim=False, correction=1):
    """Variance with `correction` (1: unbiased, Burn's `var`; 0: biased, `var_bias`)."""
    m = self.mean(dim, keepdim=True)
    d = self - m
    n = self._data.size if dim is None else self._data.shape[dim_index("var", dim, self._data.ndim)]
    return (d * d).sum(dim, keepdim=keepdim) * (1.0 / builtins.max(n - correction, 1))


@tensor_method
def var_bias(self, dim=None, keepdim=False):
    return self.var(dim, keepdim=keepdim, correction=0)


@tensor_method
def var_mean(self, dim, correction=1):
    return self.var(dim, keepdim=True, correction=correction), self.mean(dim, keepdim=True)


# Burn-style names that keep the reduced dim
@tensor_method
def sum_dim(self, dim):
    return self.sum(dim, keepdim=True)


@tensor_method
def mean_dim(self, dim):
    return self.mean(dim, keepdim=True)


@tensor_method
def max_dim(self, dim):
    return self.max(dim, keepdim=True)


@tensor_method
def min_dim(self, dim):
    return self.min(dim, keepdim=True)


@tensor_method
def prod(self, dim=None, keepdim=False):
    x = self._data
    axis = _axis("prod", self, dim)
    out = x.prod(axis=axis, keepdims=keepdim if axis is not None else False)
    xp = self._device.xp

    def rule(g):
        # the product of all the other elements, without dividing (exact where x has zeros)
        if x.size == 0:
            return (xp.zeros(x.shape, dtype=g.dtype),)
        flat = x.reshape(1, -1) if axis is None else xp.moveaxis(x, axis, -1)
        ones = xp.ones(flat.shape[:-1] + (1,), dtype=x.dtype)
        left = xp.concatenate([ones, xp.cumprod(flat, axis=-1)[..., :-1]], axis=-1)
        rev = xp.flip(flat, -1)
        right = xp.flip(xp.concatenate([ones, xp.cumprod(rev, axis=-1)[..., :-1]], axis=-1), -1)
        others = left * right
        if axis is None:
            return ((g * others).reshape(x.shape),)
        return (_expand_grad(g, x.shape, axis, keepdim) * xp.moveaxis(others, -1, axis),)

    return record(out, self._device, (self,), rule, "prod")


# ---------------------------------------------------------------- softmax family
@tensor_method
def softmax(self, dim):
    x = self._data
    xp = self._device.xp
    axis = dim_index("softmax", dim, x.ndim)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    out = e / e.sum(axis=axis, keepdims=True)

    def rule(g):
        return ((g - (g * out).sum(axis=axis, keepdims=True)) * out,)

    return record(out, self._device, (self,), rule, "softmax")


@tensor_method
def log_softmax(self, dim):
    x = self._data
    xp = self._device.xp
    axis = dim_index("log_softmax", dim, x.ndim)
    shifted = x - x.max(axis=axis, keepdims=True)
    out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def rule(g):
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)

    return record(out, self._device, (self,), rule, "log_softmax")


@tensor_method
def logsumexp(self, dim, keepdim=False):
    x = self._data
    xp = self._device.xp
    axis = dim_index("logsumexp", dim, x.ndim)
    m = x.max(axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    lse = xp.log(xp.exp(x - m).sum(axis=axis, keepdims=True)) + m
    out = lse if keepdim else lse.squeeze(axis)

    def rule(g):
        gk = g if keepdim else xp.expand_dims(g, axis)
        return (gk * xp.exp(x - lse),)

    return record(out, self._device, (self,), rule, "logsumexp")


@tensor_method
def quiet_softmax(self, dim):
    """Softmax with an extra implicit zero logit (Burn's `quiet_softmax`): rows may sum below 1."""
    x = self._data
    xp = self._device.xp
    axis = dim_index("quiet_softmax", dim, x.ndim)
    m = xp.maximum(x.max(axis=axis, keepdims=True), 0)
    e = xp.exp(x - m)
    out = e / (e.sum(axis=axis, keepdims=True) + xp.exp(-m))

    def rule(g):
        return ((g - (g * out).sum(axis=axis, keepdims=True)) * out,)

    return record(out, self._device, (self,), rule, "quiet_softmax")
