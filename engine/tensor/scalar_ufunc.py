"""`np.maximum` / `np.minimum` of a float array and a scalar, at the speed of two arrays.

NumPy 2.4's maximum and minimum against a scalar take a loop about 3x slower than against an
array of the same dtype (benchmarks/TUNING.md, "scalar_ufunc"), while the other arithmetic
ufuncs are as fast either way. The functions here pair a C-contiguous array, seen as rows of
`ROW` elements, with one cached read-only row of the constant (64 KB for float32: it stays in
the L2 cache), so NumPy takes its array-array loop. The results are those of `np.maximum(x, c)`
bit for bit, NaN propagating as there. Anything else (CuPy, another layout, a small array, a NaN
constant) goes straight to NumPy.
"""
from __future__ import annotations

import numpy as np

__all__ = ["maximum_scalar", "minimum_scalar", "ROW"]

ROW = 1 << 14  # elements per row: 4 KB multiples below 8 K elements were slow (cache aliasing)
_rows: dict = {}


def _row(dtype: np.dtype, value: float) -> np.ndarray:
    key = (dtype.str, value)
    row = _rows.get(key)
    if row is None:
        if len(_rows) >= 32:
            _rows.clear()
        row = np.full(ROW, value, dtype=dtype)
        row.flags.writeable = False
        _rows[key] = row
    return row


def _apply(fn, x, value, out):
    if (not isinstance(x, np.ndarray) or x.dtype.kind != "f" or x.size < ROW or not x.flags.c_contiguous
            or (out is not None and (not isinstance(out, np.ndarray) or out.shape != x.shape
                                     or out.dtype != x.dtype or not out.flags.c_contiguous))):
        return fn(x, value) if out is None else fn(x, value, out=out)
    c = float(value)
    if c != c:  # NaN: no cache key equals it
        return fn(x, value) if out is None else fn(x, value, out=out)
    if out is None:
        out = np.empty_like(x)
    row = _row(x.dtype, c)
    xf, of = x.reshape(-1), out.reshape(-1)
    n = xf.size - xf.size % ROW
    fn(xf[:n].reshape(-1, ROW), row, out=of[:n].reshape(-1, ROW))
    if n < xf.size:
        fn(xf[n:], row[: xf.size - n], out=of[n:])
    return out


def maximum_scalar(x, value, out=None):
    """`np.maximum(x, value, out=out)` (see the module's docstring)."""
    return _apply(np.maximum, x, value, out)


def minimum_scalar(x, value, out=None):
    """`np.minimum(x, value, out=out)` (see the module's docstring)."""
    return _apply(np.minimum, x, value, out)
