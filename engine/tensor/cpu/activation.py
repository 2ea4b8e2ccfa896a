"""The activations' CPU kernels: exact Gelu and SiLU of float32 NumPy arrays, with their
derivatives, a block of elements at a time over the kernel threads (compiled when numba is
there; Gelu has a NumPy path of its own otherwise).

Each function returns `(out, derivative)`, or None when it has no CPU kernel for the array
(another dtype or array module, an empty array, SiLU without the compiled kernels): the layer
then runs its generic NumPy / CuPy code. The layer's backward is `g * derivative`.
"""
from __future__ import annotations

import math

import numpy as np

from ..scalar_ufunc import maximum_scalar
from . import jit as _jit
from .threads import min_blocks, run_chunks

__all__ = ["gelu", "silu", "BLOCK"]

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# Abramowitz & Stegun 7.1.26: erfc(z) ~ t (a1 + t (a2 + ... + t a5)) exp(-z^2), t = 1 / (1 + p z),
# z >= 0, absolute error under 1.5e-7 (measured: Phi within 7.3e-8, Gelu within 2.2e-7 of SciPy's
# float64 result over [-10, 10]: about one float32 ulp of Gelu near |x| = 3, less elsewhere)
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# elements per pass: the ~23 passes over a block stay in a core's L2 cache (a smaller block
# shows the per-call overheads; benchmarks/TUNING.md has the measurements)
BLOCK = 1 << 15


def _gelu_f32(xd):
    """Gelu of a float32 NumPy array and its derivative `Phi(x) + x phi(x)`, in blocks of
    `BLOCK` elements (threaded over blocks): SciPy's float32 `erf` alone cost ~50 ns an
    element, a fifth of a small GPT's step. Phi comes from A&S 7.1.26, whose `exp(-x^2 / 2)` is
    phi's too, so the derivative costs no second exp; the backward is one product. The constants
    are folded (`p / sqrt 2` into t, the 1/2 of erfc -> Phi into the coefficients) and the sign
    mask is float32, so that every pass is a float32 pass."""
    xf = np.ascontiguousarray(xd).reshape(-1)
    n = xf.size
    out = np.empty(n, np.float32)
    der = np.empty(n, np.float32)
    f32 = np.float32
    p = f32(_AS_P / _SQRT_2)  # t = 1 / (1 + p |x| / sqrt 2)
    a1, a2, a3, a4, a5 = (f32(a * 0.5) for a in _AS_A)  # Phi(-|x|) = erfc(|x| / sqrt 2) / 2
    inv_sqrt_2pi = f32(_INV_SQRT_2PI)
    zero, one, minus_half, floor = f32(0.0), f32(1.0), f32(-0.5), f32(-60.0)  # NumPy scalars: Python floats take a slow path

    k = _jit.kernels()
    if k is not None:  # the same arithmetic compiled: one pass instead of ~25
        coef = np.array([p, a1, a2, a3, a4, a5, floor, inv_sqrt_2pi], np.float32)

        def compiled(blocks):
            for lo in blocks:
                hi = min(lo + BLOCK, n)
                k.gelu(xf[lo:hi], out[lo:hi], der[lo:hi], coef)

        run_chunks(compiled, range(0, n, BLOCK), min_blocks=min_blocks(4 * BLOCK))
        return out.reshape(xd.shape), der.reshape(xd.shape)

    def chunk(blocks):
        size = min(BLOCK, n)
        e, t, q, pos = (np.empty(size, np.float32) for _ in range(4))
        for lo in blocks:
            hi = min(lo + BLOCK, n)
            m = hi - lo
            x = xf[lo:hi]
            eb, tb, qb, pb = e[:m], t[:m], q[:m], pos[:m]
            np.multiply(x, x, out=eb)
            eb *= minus_half
            # exp(-x^2 / 2), from -60 up: subnormal results (|x| > 13) made every later pass over
            # the block ~50x slower; Phi(-|x|) < 1e-27 there, so the clamp changes nothing visible
            # in Phi. x phi(x) < 1e-25 there counts as 0 (x times the floor's exp grew with x:
            # 3494 at 1e30, inf at inf): one reduction finds the blocks that need it (or hold a NaN)
            under = None if eb.min() >= floor else eb < floor
            maximum_scalar(eb, floor, out=eb)
            np.exp(eb, out=eb)
            np.abs(x, out=tb)
            tb *= p
            tb += one
            np.reciprocal(tb, out=tb)
            np.multiply(tb, a5, out=qb)
            for a in (a4, a3, a2, a1):
                qb += a
                qb *= tb
            qb *= eb  # Phi(-|x|)
            # Phi(x) = |[x >= 0] - q|: 1 - q where x >= 0 (q <= 1/2), exactly q where x < 0 (no
            # cancellation in the left tail); arithmetic with a float32 0 / 1 mask, as np.where /
            # copyto(where=) cost ~8 ns an element and a bool operand takes a slower mixed loop
            np.greater_equal(x, zero, out=pb)
            np.subtract(pb, qb, out=qb)
            np.abs(qb, out=qb)
            np.multiply(x, qb, out=out[lo:hi])
            eb *= x
            eb *= inv_sqrt_2pi  # x phi(x)
            np.add(eb, qb, out=der[lo:hi])
            if under is not None:
                np.copyto(der[lo:hi], qb, where=under)

    run_chunks(chunk, range(0, n, BLOCK), min_blocks=min_blocks(4 * BLOCK))
    return out.reshape(xd.shape), der.reshape(xd.shape)

def _silu_f32(xd):
    """SiLU of a float32 NumPy array and its derivative `s (1 + x (1 - s))`, one compiled pass
    a block of `BLOCK` elements (threaded over blocks), or None without the kernels."""
    k = _jit.kernels()
    if k is None:
        return None
    xf = np.ascontiguousarray(xd).reshape(-1)
    n = xf.size
    out = np.empty(n, np.float32)
    der = np.empty(n, np.float32)

    def compiled(blocks):
        for lo in blocks:
            hi = min(lo + BLOCK, n)
            k.silu(xf[lo:hi], out[lo:hi], der[lo:hi])

    run_chunks(compiled, range(0, n, BLOCK), min_blocks=min_blocks(4 * BLOCK))
    return out.reshape(xd.shape), der.reshape(xd.shape)

def _f32_array(xd) -> bool:
    return isinstance(xd, np.ndarray) and xd.dtype == np.float32 and xd.size > 0


def gelu(xd):
    """Exact Gelu of `xd` and its derivative `Phi(x) + x phi(x)` (`_gelu_f32`), or None unless
    `xd` is a non-empty float32 NumPy array."""
    return _gelu_f32(xd) if _f32_array(xd) else None


def silu(xd):
    """SiLU of `xd` and its derivative (`_silu_f32`), or None unless `xd` is a non-empty float32
    NumPy array and the compiled kernels are on."""
    return _silu_f32(xd) if _f32_array(xd) else None
