"""Resizing `[batch, channels, width]` and `[batch, channels, height, width]` tensors.

`interpolate(x, output_size, mode, align_corners=True)` follows Burn's `interpolate` op
(whose `InterpolateOptions` default to `align_corners = true`) and PyTorch's formulas:

- "nearest": source index floor(dst * in / out) (PyTorch's legacy nearest, Burn's Nearest);
  computed in exact integer arithmetic. `align_corners` does not apply.
- "nearest_exact": floor((dst + 0.5) * in / out), clamped (PyTorch's "nearest-exact").
- "linear" (alias "bilinear"): two taps per axis. With `align_corners` the source position
  is dst * (in - 1) / max(out - 1, 1); without it, (dst + 0.5) * in / out - 0.5 clamped at 0.
- "cubic" (alias "bicubic"): four taps per axis, Keys' cubic convolution with A = -0.75,
  source positions as for "linear" (not clamped without `align_corners`) and tap indices
  clamped to the input, as Burn's ndarray backend and PyTorch do.

Every mode is separable and linear in the input: each spatial axis is resampled by gathering
its taps, and the backward pass applies the transposed (adjoint) resampling matrix per axis.
"""
from __future__ import annotations

import numbers

import numpy as np

from .ops_pool import _apply_axis
from .tensor import Tensor, TensorError, record, tensor_method

CUBIC_A = -0.75

_MODES = {
    "nearest": "nearest",
    "nearest_exact": "nearest_exact",
    "nearest-exact": "nearest_exact",
    "linear": "linear",
    "bilinear": "linear",
    "cubic": "cubic",
    "bicubic": "cubic",
}


def _cubic_near(t):
    """Weight of a tap at distance t in [0, 1]."""
    a = CUBIC_A
    return ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0


def _cubic_far(t):
    """Weight of a tap at distance t in [1, 2]."""
    a = CUBIC_A
    return ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a


def _source(in_n, out_n, align_corners, clamp):
    o = np.arange(out_n, dtype=np.float64)
    if align_corners:
        return (in_n - 1) / max(out_n - 1, 1) * o
    src = (o + 0.5) * (in_n / out_n) - 0.5
    return np.maximum(src, 0.0) if clamp else src


def resample_taps(in_n: int, out_n: int, mode: str, align_corners: bool = True):
    """(indices [taps, out_n] int64, weights [taps, out_n] float64) along one axis."""
    o = np.arange(out_n, dtype=np.int64)
    last = in_n - 1
    if mode == "nearest":
        return np.minimum((o * in_n) // out_n, last)[None], np.ones((1, out_n))
    if mode == "nearest_exact":
        return np.minimum(((2 * o + 1) * in_n) // (2 * out_n), last)[None], np.ones((1, out_n))
    if mode == "linear":
        src = _source(in_n, out_n, align_corners, clamp=True)
        i0 = np.minimum(np.floor(src).astype(np.int64), last)
        lam = src - i0
        i1 = np.minimum(i0 + 1, last)
        return np.stack([i0, i1]), np.stack([1.0 - lam, lam])
    if mode == "cubic":
        src = _source(in_n, out_n, align_corners, clamp=False)
        i = np.floor(src).astype(np.int64)
        t = src - i
        idx = np.clip(np.stack([i - 1, i, i + 1, i + 2]), 0, last)
        w = np.stack([_cubic_far(t + 1.0), _cubic_near(t), _cubic_near(1.0 - t), _cubic_far(2.0 - t)])
        return idx, w
    raise AssertionError(mode)


def resample_matrix(in_n: int, out_n: int, mode: str, align_corners: bool = True) -> np.ndarray:
    """The dense [out_n, in_n] matrix of the resampling along one axis (float64)."""
    idx, w = resample_taps(in_n, out_n, mode, align_corners)
    m = np.zeros((out_n, in_n))
    rows = np.broadcast_to(np.arange(out_n), idx.shape)
    np.add.at(m, (rows.ravel(), idx.ravel()), w.ravel())
    return m


def _gather_axis(xp, a, idx, w, axis):
    """sum_t w[t, o] * a[..., idx[t, o], ...] along `axis`."""
    shape = [1] * a.ndim
    shape[axis] = idx.shape[1]
    out = None
    for t in range(idx.shape[0]):
        taken = xp.take(a, idx[t], axis=axis)
        if w is not None:
            taken *= w[t].reshape(shape)
        out = taken if out is None else out + taken
    return out


@tensor_method
def interpolate(x, output_size, mode="nearest", align_corners=True):
    """Resize the spatial axes of `x` ([b, c, w] or [b, c, h, w]) to `output_size`.

    `mode`: "nearest", "nearest_exact", "linear" ("bilinear") or "cubic" ("bicubic").
    `align_corners` (Burn's default True) applies to "linear" and "cubic".
    """
    op = "interpolate"
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if x.rank not in (3, 4):
        raise TensorError(
            f"{op}: expected an input of rank 3 [batch, channels, width] or 4 [batch, channels, height, width], "
            f"got dims {list(x.shape)}"
        )
    if x._data.dtype.kind != "f":
        raise TensorError(f"{op}: expected a float input, got {x.dtype}")
    key = mode.lower() if isinstance(mode, str) else None
    if key not in _MODES:
        raise TensorError(f"{op}: unknown mode {mode!r}; expected one of 'nearest', 'nearest_exact', 'linear', 'cubic'")
    mode = _MODES[key]
    if not isinstance(align_corners, (bool, np.bool_)):
        raise TensorError(f"{op}: align_corners must be a bool, got {align_corners!r}")
    n = x.rank - 2
    if isinstance(output_size, numbers.Integral) and not isinstance(output_size, bool):
        output_size = (output_size,) * n
    try:
        out_sp = tuple(int(s) for s in output_size)
        ok = len(out_sp) == n and all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in output_size)
    except TypeError:
        ok = False
    if not ok:
        raise TensorError(f"{op}: output_size must be {n} int(s) for an input of dims {list(x.shape)}, got {output_size!r}")
    if any(s < 1 for s in out_sp):
        raise TensorError(f"{op}: output_size must be >= 1 in every dimension, got {list(out_sp)}")
    in_sp = x.shape[2:]
    if any(s < 1 for s in in_sp):
        raise TensorError(f"{op}: expected non-empty spatial dims, got dims {list(x.shape)}")

    dev = x._device
    xp = dev.xp
    xa = x._data
    dt = xa.dtype
    taps = [resample_taps(L, o, mode, bool(align_corners)) for L, o in zip(in_sp, out_sp)]
    with dev.context():
        y = xa
        # last axis first (width, then height), as Burn resamples rows then columns
        for axis in reversed(range(n)):
            idx, w = taps[axis]
            wd = None if mode.startswith("nearest") else xp.asarray(w.astype(dt))
            y = _gather_axis(xp, y, xp.asarray(idx), wd, 2 + axis)

    def rule(g):
        with dev.context():
            gx = g
            for axis in range(n):
                m = xp.asarray(resample_matrix(in_sp[axis], out_sp[axis], mode, bool(align_corners)).astype(g.dtype))
                gx = _apply_axis(xp, gx, m.T, 2 + axis)
            return (xp.ascontiguousarray(gx),)

    return record(y, dev, (x,), rule, op)

