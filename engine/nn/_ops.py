"""Fused tensor kernels for the built-in layers, each beside its backward rule.

A layer written as a chain of small tensor operations records one autodiff node per
operation; on the small and medium sizes the app trains, that bookkeeping costs more than the
arithmetic. The kernels here compute a whole layer step (a linear map, a normalization, an
activation, a softmax cross entropy) in NumPy/CuPy and record a single node whose rule returns
the analytic gradients. Every rule is checked against finite differences in
`tests/engine/nn`.

Rules return `None` for inputs that take no part in the graph, so no work is spent on
gradients nobody reads.
"""
from __future__ import annotations

import math

import numpy as np

from ..tensor import Tensor, TensorError
from ..tensor.raw import array, check_same_device, record, sum_leading, tracking, unbroadcast, untracked
from ..tensor.scalar_ufunc import maximum_scalar
from ..tensor import jit
from ..tensor import threads as _threads
from ..tensor.threads import run_blocks, run_chunks

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def special(xp):
    """scipy.special on NumPy, cupyx.scipy.special on CuPy (erf for exact Gelu)."""
    if xp is np:
        import scipy.special as sp  # noqa: PLC0415

        return sp
    import cupyx.scipy.special as sp  # noqa: PLC0415

    return sp


def _needs(t: Tensor | None) -> bool:
    return t is not None and t.is_tracked()


def _float_input(op: str, x: Tensor) -> None:
    if array(x).dtype.kind != "f":
        raise TensorError(f"{op}: expected a float tensor, got {x.dtype} (dims {list(x.shape)})")


# ---------------------------------------------------------------------- elementwise
def unary(x: Tensor, op: str, fwd, grad):
    """An elementwise op: `fwd(xd) -> out`, `grad(xd, out) -> d out / d x` (elementwise)."""
    _float_input(op, x)
    xd = array(x)
    out = fwd(xd)
    if out.dtype != xd.dtype:
        out = out.astype(xd.dtype, copy=False)
    if not tracking(x):
        return untracked(out, (x,))
    def rule(g):
        gx = g * grad(xd, out)
        return (gx.astype(g.dtype, copy=False),)

    return record(out, x.device, (x,), rule, op)


def _xp(a):
    return np if isinstance(a, (np.ndarray, np.generic)) else __import__("cupy")


def _sigmoid(x):
    xp = _xp(x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x):
    """log(1 + exp(x)), stable for large |x|."""
    xp = _xp(x)
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


# Abramowitz & Stegun 7.1.26: erfc(z) ~ t (a1 + t (a2 + ... + t a5)) exp(-z^2), t = 1 / (1 + p z),
# z >= 0, absolute error under 1.5e-7 (measured: Phi within 7.3e-8, Gelu within 2.2e-7 of SciPy's
# float64 result over [-10, 10]: about one float32 ulp of Gelu near |x| = 3, less elsewhere)
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_GELU_BLOCK = 1 << 15  # elements per pass: the ~23 passes over a block stay in the L2 cache
# (measured: 32 K elements ~20 % faster than 16 K, whose per-call overheads showed; 8 K slower)


def _gelu_f32(xd):
    """Gelu of a float32 NumPy array and its derivative `Phi(x) + x phi(x)`, in blocks of
    `_GELU_BLOCK` elements (threaded over blocks): SciPy's float32 `erf` alone cost ~50 ns an
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

    k = jit.kernels()
    if k is not None:  # the same arithmetic compiled: one pass instead of ~25
        coef = np.array([p, a1, a2, a3, a4, a5, floor, inv_sqrt_2pi], np.float32)

        def compiled(blocks):
            for lo in blocks:
                hi = min(lo + _GELU_BLOCK, n)
                k.gelu(xf[lo:hi], out[lo:hi], der[lo:hi], coef)

        run_chunks(compiled, range(0, n, _GELU_BLOCK), min_blocks=_threads.min_blocks(4 * _GELU_BLOCK))
        return out.reshape(xd.shape), der.reshape(xd.shape)

    def chunk(blocks):
        size = min(_GELU_BLOCK, n)
        e, t, q, pos = (np.empty(size, np.float32) for _ in range(4))
        for lo in blocks:
            hi = min(lo + _GELU_BLOCK, n)
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

    run_chunks(chunk, range(0, n, _GELU_BLOCK), min_blocks=_threads.min_blocks(4 * _GELU_BLOCK))
    return out.reshape(xd.shape), der.reshape(xd.shape)


def gelu(x: Tensor) -> Tensor:
    """Exact Gelu: `x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))`. float32 on NumPy goes through
    `_gelu_f32` (Phi within 7.3e-8); other dtypes and devices use SciPy's / CuPy's erf, and the
    backward reuses Phi(x)."""
    op = "gelu"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    if xp is np and xd.dtype == np.float32 and xd.size:
        out, der = _gelu_f32(xd)
        if not tracking(x):
            return untracked(out, (x,))

        def rule32(g):
            return ((g * der).astype(g.dtype, copy=False),)

        return record(out, x.device, (x,), rule32, op)
    cdf = special(xp).erf(xd * (1.0 / _SQRT_2))
    cdf += 1.0
    cdf *= 0.5
    cdf = cdf.astype(xd.dtype, copy=False)
    out = xd * cdf
    if not tracking(x):
        return untracked(out, (x,))

    def rule(g):
        # d/dx x Phi(x) = Phi(x) + x phi(x)
        pdf = xp.exp(xd * xd * -0.5)
        pdf *= xd
        pdf *= _INV_SQRT_2PI
        pdf[xp.isinf(xd)] = 0.0  # x phi(x) -> 0 at +-inf (inf * exp(-inf) is NaN)
        pdf += cdf
        pdf *= g
        return (pdf.astype(g.dtype, copy=False),)

    return record(out, x.device, (x,), rule, op)


def relu6(x: Tensor) -> Tensor:
    return unary(x, "relu6", lambda a: _xp(a).clip(a, 0, 6), lambda a, o: (a > 0) & (a < 6))


def leaky_relu(x: Tensor, negative_slope: float) -> Tensor:
    s = float(negative_slope)
    return unary(
        x,
        "leaky_relu",
        lambda a: _xp(a).where(a >= 0, a, a * s),
        lambda a, o: _xp(a).where(a >= 0, 1.0, s).astype(a.dtype, copy=False),
    )


def elu(x: Tensor, alpha: float) -> Tensor:
    al = float(alpha)
    return unary(
        x,
        "elu",
        lambda a: _xp(a).where(a > 0, a, al * _xp(a).expm1(_xp(a).minimum(a, 0))),
        lambda a, o: _xp(a).where(a > 0, 1.0, o + al),
    )


def celu(x: Tensor, alpha: float) -> Tensor:
    al = float(alpha)
    return unary(
        x,
        "celu",
        lambda a: _xp(a).maximum(a, 0) + _xp(a).minimum(0, al * _xp(a).expm1(_xp(a).minimum(a, 0) / al)),
        lambda a, o: _xp(a).where(a > 0, 1.0, _xp(a).exp(_xp(a).minimum(a, 0) / al)),
    )


def selu(x: Tensor) -> Tensor:
    al, sc = SELU_ALPHA, SELU_SCALE
    return unary(
        x,
        "selu",
        lambda a: sc * _xp(a).where(a > 0, a, al * _xp(a).expm1(_xp(a).minimum(a, 0))),
        lambda a, o: _xp(a).where(a > 0, sc, o + sc * al),
    )


def hard_sigmoid(x: Tensor, alpha: float, beta: float) -> Tensor:
    al, be = float(alpha), float(beta)

    def grad(a, o):
        z = a * al + be
        return ((z > 0) & (z < 1)) * al

    return unary(x, "hard_sigmoid", lambda a: _xp(a).clip(a * al + be, 0, 1), grad)


def _silu_f32(xd):
    """SiLU of a float32 NumPy array and its derivative `s (1 + x (1 - s))`, one compiled pass
    a block of `_GELU_BLOCK` elements (threaded over blocks), or None without the kernels."""
    k = jit.kernels()
    if k is None:
        return None
    xf = np.ascontiguousarray(xd).reshape(-1)
    n = xf.size
    out = np.empty(n, np.float32)
    der = np.empty(n, np.float32)

    def compiled(blocks):
        for lo in blocks:
            hi = min(lo + _GELU_BLOCK, n)
            k.silu(xf[lo:hi], out[lo:hi], der[lo:hi])

    run_chunks(compiled, range(0, n, _GELU_BLOCK), min_blocks=_threads.min_blocks(4 * _GELU_BLOCK))
    return out.reshape(xd.shape), der.reshape(xd.shape)


def silu(x: Tensor) -> Tensor:
    """`x * sigmoid(x)`. float32 on NumPy with the compiled kernels: the output and the
    derivative `s (1 + x (1 - s))` in one pass (`_silu_f32`), the backward one product (a Llama
    MLP's SiLU forward and backward took 3.6 ms on [8, 128, 688] in NumPy's passes, Intel Xeon,
    1 thread). Otherwise the sigmoid is computed once, `1 / (1 + exp(-x))` in three in-place
    passes (an exp that overflows gives exactly 0; within an ulp or so of scipy's `expit`, which
    took twice as long on float32), and kept for the backward, `g * s * (1 + x * (1 - s))`, worked
    in place."""
    op = "silu"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    fused = _silu_f32(xd) if xp is np and xd.dtype == np.float32 and xd.size else None
    if fused is not None:
        out, der = fused
        if not tracking(x):
            return untracked(out, (x,))

        def rule32(g):
            return ((g * der).astype(g.dtype, copy=False),)

        return record(out, x.device, (x,), rule32, op)
    s = xp.negative(xd)
    with np.errstate(over="ignore"):
        xp.exp(s, out=s)
    s += 1.0
    xp.reciprocal(s, out=s)
    out = xd * s
    if not tracking(x):
        return untracked(out, (x,))

    def rule(g):
        d = 1.0 - s
        d *= xd
        d += 1.0
        d *= s
        d *= g
        return (d.astype(g.dtype, copy=False),)

    return record(out, x.device, (x,), rule, op)


def hard_swish(x: Tensor) -> Tensor:
    def fwd(a):
        return a * _xp(a).clip(a + 3.0, 0, 6) * (1.0 / 6.0)

    def grad(a, o):
        xp = _xp(a)
        return xp.where(a < -3, 0.0, xp.where(a > 3, 1.0, (2 * a + 3) * (1.0 / 6.0)))

    return unary(x, "hard_swish", fwd, grad)


def mish(x: Tensor) -> Tensor:
    def fwd(a):
        return a * _xp(a).tanh(_softplus(a))

    def grad(a, o):
        t = _xp(a).tanh(_softplus(a))
        return t + a * (1 - t * t) * _sigmoid(a)

    return unary(x, "mish", fwd, grad)


def softplus(x: Tensor, beta: float) -> Tensor:
    b = float(beta)
    return unary(x, "softplus", lambda a: _softplus(a * b) * (1.0 / b), lambda a, o: _sigmoid(a * b))


def softsign(x: Tensor) -> Tensor:
    return unary(x, "softsign", lambda a: a / (1 + _xp(a).abs(a)), lambda a, o: 1 / (1 + _xp(a).abs(a)) ** 2)


def log_sigmoid(x: Tensor) -> Tensor:
    return unary(x, "log_sigmoid", lambda a: -_softplus(-a), lambda a, o: _sigmoid(-a))


def hard_shrink(x: Tensor, lambd: float) -> Tensor:
    lam = float(lambd)
    return unary(
        x, "hard_shrink", lambda a: _xp(a).where(_xp(a).abs(a) > lam, a, 0.0), lambda a, o: _xp(a).abs(a) > lam
    )


def soft_shrink(x: Tensor, lambd: float, bias: float) -> Tensor:
    lam, bi = float(lambd), float(bias)

    def fwd(a):
        xp = _xp(a)
        return xp.where(a > lam, a - bi, xp.where(a < -lam, a + bi, 0.0))

    return unary(x, "soft_shrink", fwd, lambda a, o: _xp(a).abs(a) > lam)


def tanhshrink(x: Tensor) -> Tensor:
    def grad(a, o):
        t = _xp(a).tanh(a)
        return t * t

    return unary(x, "tanhshrink", lambda a: a - _xp(a).tanh(a), grad)


def thresholded_relu(x: Tensor, alpha: float) -> Tensor:
    al = float(alpha)
    return unary(x, "thresholded_relu", lambda a: _xp(a).where(a > al, a, 0.0), lambda a, o: a > al)


def hardtanh(x: Tensor, min_val: float, max_val: float) -> Tensor:
    lo, hi = float(min_val), float(max_val)
    return unary(x, "hardtanh", lambda a: _xp(a).clip(a, lo, hi), lambda a, o: (a >= lo) & (a <= hi))


def prelu(x: Tensor, alpha: Tensor) -> Tensor:
    """`x` where x >= 0, else `alpha * x`; alpha has one weight, or one per channel (dim 1)."""
    op = "prelu"
    _float_input(op, x)
    n = alpha.shape[0] if alpha.rank == 1 else -1
    if alpha.rank != 1 or (n != 1 and (x.rank < 2 or x.shape[1] != n)):
        raise TensorError(
            f"{op}: expected alpha of dims [1] or [channels] with channels = dim 1 of the input, "
            f"got alpha dims {list(alpha.shape)} for input dims {list(x.shape)}"
        )
    shape = [1] * x.rank
    if n != 1:
        shape[1] = n
    xd = array(x)
    ad = array(alpha).reshape(shape)
    xp = x.device.xp
    pos = xd >= 0
    out = xp.where(pos, xd, xd * ad)
    if not tracking(x, alpha):
        return untracked(out, (x, alpha))
    need_x, need_a = _needs(x), _needs(alpha)
    ashape = alpha.shape

    def rule(g):
        gx = g * xp.where(pos, 1.0, ad).astype(g.dtype, copy=False) if need_x else None
        ga = unbroadcast(xp.where(pos, 0.0, g * xd), tuple(shape)).reshape(ashape) if need_a else None
        return gx, ga

    return record(out, x.device, (x, alpha), rule, op)


# ---------------------------------------------------------------------- linear
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x @ weight + bias` over the last dim of x; weight `[d_input, d_output]`."""
    op = "linear"
    xd, wd = array(x), array(weight)
    if xd.ndim == 0 or xd.shape[-1] != wd.shape[0]:
        raise TensorError(
            f"{op}: the last dim of the input must equal d_input {wd.shape[0]} of the weight "
            f"(weight dims {list(wd.shape)}), got input dims {list(xd.shape)}"
        )
    if x.device is not weight.device:
        check_same_device(op, x, weight)
    lead = xd.shape[:-1]
    x2 = xd.reshape(-1, wd.shape[0]) if xd.ndim != 2 else xd
    out2 = _threads.matmul(x2, wd)
    if bias is not None:
        out2 += array(bias)
    out = out2.reshape(lead + (wd.shape[1],)) if xd.ndim != 2 else out2
    inputs = (x, weight) if bias is None else (x, weight, bias)
    if not tracking(*inputs):
        return untracked(out, inputs)
    need_x, need_w = _needs(x), _needs(weight)
    need_b = bias is not None and _needs(bias)
    xshape = xd.shape

    def rule(g):
        g2 = g.reshape(-1, wd.shape[1]) if g.ndim != 2 else g
        gx = _threads.matmul(g2, wd.T).reshape(xshape) if need_x else None
        gw = _threads.matmul(x2.T, g2) if need_w else None
        if bias is None:
            return gx, gw
        gb = sum_leading(g2) if need_b else None
        return gx, gw, gb

    return record(out, x.device, inputs, rule, op)


# ---------------------------------------------------------------------- normalization
def _reduction_plan(shape, axes):
    """How to reduce `axes` of an array of `shape` with matrix-vector products.

    ("rows", R, P): the axes are the trailing ones, each of R rows sums P contiguous values;
    ("bn", B, C, P): all axes but 1 (batch norm's per-channel statistics); None: neither.
    """
    nd = len(shape)
    ax = tuple(sorted(a % nd for a in axes))
    if ax == tuple(range(nd - len(ax), nd)) and len(ax) < nd:
        return ("rows", int(np.prod(shape[: nd - len(ax)])), int(np.prod(shape[nd - len(ax):])))
    if nd >= 2 and ax == (0,) + tuple(range(2, nd)):
        return ("bn", shape[0], shape[1], int(np.prod(shape[2:])))
    return None


def _keep_shape(shape, axes):
    nd = len(shape)
    red = {a % nd for a in axes}
    return tuple(1 if i in red else n for i, n in enumerate(shape))


def _sum_keep(a, axes, plan):
    """`a.sum(axes, keepdims=True)`; on NumPy as one BLAS matrix-vector product per call
    (several times faster than NumPy's reduction over non-trailing axes)."""
    if plan is None or not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        return a.sum(axis=axes, keepdims=True)
    keep = _keep_shape(a.shape, axes)
    if plan[0] == "rows":
        _, r, p = plan
        return (a.reshape(r, p) @ np.ones(p, dtype=a.dtype)).reshape(keep)
    _, b, c, p = plan
    return (a.reshape(b * c, p) @ np.ones(p, dtype=a.dtype)).reshape(b, c).sum(axis=0).reshape(keep)


def _dot_keep(a, b_, axes, plan):
    """`(a * b_).sum(axes, keepdims=True)` without the full-size product on NumPy."""
    if (plan is None or not isinstance(a, np.ndarray) or not a.flags.c_contiguous
            or not b_.flags.c_contiguous or a.shape != b_.shape):
        return (a * b_).sum(axis=axes, keepdims=True)
    keep = _keep_shape(a.shape, axes)
    if plan[0] == "rows":
        _, r, p = plan
        return np.vecdot(a.reshape(r, p), b_.reshape(r, p)).reshape(keep)
    _, b, c, p = plan
    return np.vecdot(a.reshape(b * c, p), b_.reshape(b * c, p)).reshape(b, c).sum(axis=0).reshape(keep)


# bytes of one block of images for the blocked batch norm passes (about half an L2 cache):
# the passes over a block find it in cache instead of streaming the whole tensor each time
_BN_BLOCK_BYTES = 1 << 19


def _bn_blocks(b, c, p, itemsize):
    step = max(1, _BN_BLOCK_BYTES // max(c * p * itemsize, 1))
    return [slice(lo, min(lo + step, b)) for lo in range(0, b, step)]


def _batch_norm_forward(xd, axes, plan, inv_n, eps, gd, bd):
    """Batch statistics and `xc * (gamma * rstd) + beta` of a C-contiguous NumPy `[B, C, ...]`,
    a block of images at a time. Returns mean, var, rstd (reduced axes kept), the output and
    the centred input xc."""
    _, b, c, p = plan
    keep = _keep_shape(xd.shape, axes)
    mean = _sum_keep(xd, axes, plan)
    mean *= inv_n
    x3, m3 = xd.reshape(b, c, p), mean.reshape(1, c, 1)
    xc = np.empty_like(xd)
    xc3 = xc.reshape(b, c, p)
    sq = np.empty((b, c), dtype=xd.dtype)
    blocks = _bn_blocks(b, c, p, xd.itemsize)

    k = jit.kernels() if xd.dtype == np.float32 else None
    if k is not None:  # one pass a block: the centred input and its squares' sums
        m1 = np.ascontiguousarray(mean, dtype=np.float32).reshape(-1)

        def centre(s):
            k.bn_centre(x3[s], m1, xc3[s], sq[s])
    else:
        def centre(s):
            np.subtract(x3[s], m3, out=xc3[s])
            sq[s] = np.vecdot(xc3[s], xc3[s])

    run_blocks(centre, blocks)
    var = sq.sum(axis=0).reshape(keep)
    var *= inv_n
    rstd = (1.0 / np.sqrt(var + eps)).astype(xd.dtype, copy=False)
    scale3 = (gd * rstd).astype(xd.dtype, copy=False).reshape(1, c, 1)
    shift3 = bd.reshape(1, c, 1) if bd is not None else None
    out = np.empty_like(xd)
    o3 = out.reshape(b, c, p)

    if k is not None:
        scale1 = np.ascontiguousarray(scale3, dtype=np.float32).reshape(-1)
        shift1 = (np.ascontiguousarray(shift3, dtype=np.float32).reshape(-1) if shift3 is not None
                  else np.empty(0, np.float32))

        def scale(s):
            k.bn_scale(xc3[s], scale1, shift1, o3[s])
    else:
        def scale(s):
            np.multiply(xc3[s], scale3, out=o3[s])
            if shift3 is not None:
                o3[s] += shift3

    run_blocks(scale, blocks)
    return mean, var, rstd, out, xc


def _batch_norm_backward(g, xc, plan, axes, inv_n, gd, rstd, need_x):
    """`_batch_norm_forward`'s backward, a block of images at a time: the input gradient
    `a * g + c1 + c2 * xc` (None unless `need_x`), sum(g) and sum(g * xhat) (reduced axes kept)."""
    _, b, c, p = plan
    keep = _keep_shape(xc.shape, axes)
    g = np.ascontiguousarray(g)
    g3, z3 = g.reshape(b, c, p), xc.reshape(b, c, p)
    ones = np.ones(p, dtype=g.dtype)
    sums = np.empty((b, c), dtype=g.dtype)
    dots = np.empty((b, c), dtype=g.dtype)
    blocks = _bn_blocks(b, c, p, g.itemsize)

    k = jit.kernels() if g.dtype == np.float32 and xc.dtype == np.float32 else None

    def reduce(s):  # NumPy's own loops: BLAS called from two threads at once takes turns
        if k is not None:  # g and xc read once
            k.bn_reduce(g3[s], z3[s], sums[s], dots[s])
            return
        sums[s] = np.vecdot(g3[s], ones)
        dots[s] = np.vecdot(g3[s], z3[s])

    run_blocks(reduce, blocks)
    sg = sums.sum(axis=0).reshape(keep)
    sgx = dots.sum(axis=0).reshape(keep) * rstd  # sum(g * xhat)
    if not need_x:
        return None, sg, sgx
    a = gd * rstd
    a3 = a.astype(g.dtype, copy=False).reshape(1, c, 1)
    c1 = ((a * sg) * -inv_n).astype(g.dtype, copy=False).reshape(1, c, 1)
    c2 = ((a * sgx * rstd) * -inv_n).astype(g.dtype, copy=False).reshape(1, c, 1)
    gx = np.empty_like(g)
    gx3 = gx.reshape(b, c, p)

    if k is not None:  # one pass a block instead of four
        a1, k1, k2 = (np.ascontiguousarray(v, dtype=np.float32).reshape(-1) for v in (a3, c1, c2))

        def compiled(chunk):
            for s in chunk:
                k.bn_input_grad(g3[s], z3[s], a1, k1, k2, gx3[s])

        run_chunks(compiled, blocks)
        return gx, sg, sgx

    longest = max(s.stop - s.start for s in blocks)

    def input_grad(chunk):  # the blocks one thread takes, with its own block-sized scratch
        tmp = np.empty((longest, c, p), dtype=g.dtype)
        for s in chunk:
            out = gx3[s]
            t = tmp[: out.shape[0]]
            np.multiply(g3[s], a3, out=out)
            np.multiply(z3[s], c2, out=t)
            out += t
            out += c1

    run_chunks(input_grad, blocks)
    return gx, sg, sgx


_LN_BLOCK = 1 << 15  # elements of one block of rows in the compiled layer norm (~L2-resident)


def _strip_ones(shape) -> tuple:
    dims = tuple(shape)
    while dims and dims[0] == 1:
        dims = dims[1:]
    return dims


def _per_row_affine(t: Tensor | None, row_shape) -> np.ndarray | None:
    """gamma / beta as one float32 value per element of a row, or None when `t` does not vary
    over the normalized trailing axes alone (then the compiled layer norm does not apply)."""
    if t is None:
        return np.empty(0, np.float32)
    a = array(t)
    if a.dtype != np.float32 or _strip_ones(a.shape) != _strip_ones(row_shape):
        return None
    return np.ascontiguousarray(a).reshape(-1)


def _row_norm_buffers(r: int, p: int):
    """The compiled layer / RMS norms' outputs for r rows of p: `out`, `xhat` [r, p], `rstd` [r],
    the row blocks (about `_LN_BLOCK` elements each) and how many of them go to the threads."""
    out, xhat = np.empty((r, p), np.float32), np.empty((r, p), np.float32)
    per = max(1, _LN_BLOCK // p)
    blocks = [slice(lo, min(lo + per, r)) for lo in range(0, r, per)]
    return out, xhat, np.empty(r, np.float32), blocks, _threads.min_blocks(per * p * 4)


def _layer_norm_compiled(x: Tensor, xd, plan, row_shape, eps: float, gamma: Tensor | None, beta: Tensor | None):
    """Layer norm over the trailing axes of a float32 NumPy tensor with the compiled kernels
    (`jit`: one pass for the statistics and output, one for the whole backward), or None when
    they do not apply (another dtype or layout, no numba, gamma / beta over other axes)."""
    _, r, p = plan
    if xd.dtype != np.float32 or not xd.flags.c_contiguous or r == 0 or p == 0:
        return None
    k = jit.kernels()
    if k is None:
        return None
    gd, bd = _per_row_affine(gamma, row_shape), _per_row_affine(beta, row_shape)
    if gd is None or bd is None:
        return None
    x2 = xd.reshape(r, p)
    out, xhat, rstd, blocks, min_blocks = _row_norm_buffers(r, p)
    e = float(eps)

    def forward(run):
        for b in run:
            k.layer_norm(x2[b], gd, bd, e, out[b], xhat[b], rstd[b])

    run_chunks(forward, blocks, min_blocks=min_blocks)
    inputs = tuple(t for t in (x, gamma, beta) if t is not None)
    out = out.reshape(xd.shape)
    if not tracking(*inputs):
        return untracked(out, inputs)
    need_x = _needs(x)

    def rule(g):
        g2 = np.ascontiguousarray(g, dtype=np.float32).reshape(r, p)
        gx = np.empty_like(g2) if need_x else np.empty((0, p), np.float32)
        sums = np.zeros((len(blocks), 2, p), np.float64)  # per block: fixed bits whoever runs it

        def backward(run):
            for i in run:
                b = blocks[i]
                k.layer_norm_backward(g2[b], xhat[b], rstd[b], gd, gx[b] if need_x else gx, sums[i, 0], sums[i, 1])

        run_chunks(backward, range(len(blocks)), min_blocks=min_blocks)
        total = sums.sum(axis=0)
        res = [gx.reshape(xd.shape).astype(g.dtype, copy=False) if need_x else None]
        if gamma is not None:
            res.append(total[1].astype(np.float32).reshape(gamma.shape) if _needs(gamma) else None)
        if beta is not None:
            res.append(total[0].astype(np.float32).reshape(beta.shape) if _needs(beta) else None)
        return tuple(res)

    return record(out, x.device, inputs, rule, "normalize")


def _rms_norm_compiled(x: Tensor, xd, gamma: Tensor, eps: float):
    """RMS norm over the last axis of a float32 NumPy tensor with the compiled kernels (one pass
    for the statistics and output, one for the whole backward, as `_layer_norm_compiled`), or
    None when they do not apply (another dtype or layout, no numba, a gamma not of the last
    axis's size)."""
    if xd.dtype != np.float32 or not xd.flags.c_contiguous or xd.ndim == 0 or xd.size == 0:
        return None
    k = jit.kernels()
    if k is None:
        return None
    p = xd.shape[-1]
    gd = _per_row_affine(gamma, (p,))
    if gd is None:
        return None
    r = xd.size // p
    x2 = xd.reshape(r, p)
    out, xhat, rstd, blocks, min_blocks = _row_norm_buffers(r, p)
    e = float(eps)

    def forward(run):
        for b in run:
            k.rms_norm(x2[b], gd, e, out[b], xhat[b], rstd[b])

    run_chunks(forward, blocks, min_blocks=min_blocks)
    out = out.reshape(xd.shape)
    if not tracking(x, gamma):
        return untracked(out, (x, gamma))
    need_x, need_g = _needs(x), _needs(gamma)

    def rule(g):
        g2 = np.ascontiguousarray(g, dtype=np.float32).reshape(r, p)
        gx = np.empty_like(g2) if need_x else np.empty((0, p), np.float32)
        sums = np.zeros((len(blocks), p), np.float64)  # per block: fixed bits whoever runs it

        def backward(run):
            for i in run:
                b = blocks[i]
                k.rms_norm_backward(g2[b], xhat[b], rstd[b], gd, gx[b] if need_x else gx, sums[i])

        run_chunks(backward, range(len(blocks)), min_blocks=min_blocks)
        gg = sums.sum(axis=0).astype(np.float32).reshape(gamma.shape) if need_g else None
        return (gx.reshape(xd.shape).astype(g.dtype, copy=False) if need_x else None), gg

    return record(out, x.device, (x, gamma), rule, "rms_norm")


def normalize(x: Tensor, axes: tuple[int, ...], eps: float, gamma: Tensor | None = None,
              beta: Tensor | None = None, affine_shape: tuple[int, ...] | None = None,
              stats: dict | None = None) -> Tensor:
    """`(x - mean) / sqrt(var + eps) * gamma + beta`, mean and biased var over `axes`.

    gamma / beta (optional) are reshaped to `affine_shape` to broadcast against x. When `stats`
    is a dict, the batch mean and biased variance (arrays, reduced axes kept) are put in it.

    Few full-size passes: these tensors are the largest a conv net makes. The statistics are
    matrix-vector products; where gamma is constant over the reduced axes (batch norm) the
    output is `xc * (gamma * rstd) + beta` from the centred input `xc`, which the backward
    keeps, and the input gradient is `a * g + c1 + c2 * xc` with per-channel a, c1, c2. On
    NumPy batch norm runs its passes a block of images at a time, while the block is in cache.
    """
    op = "normalize"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    nd = xd.ndim
    plan = _reduction_plan(xd.shape, axes)
    if stats is None and plan is not None and plan[0] == "rows" and xp is np:
        row_shape = xd.shape[nd - len({a % nd for a in axes}):]
        affine_fits = affine_shape is None or _strip_ones(affine_shape) == _strip_ones(row_shape)
        done = _layer_norm_compiled(x, xd, plan, row_shape, eps, gamma, beta) if affine_fits else None
        if done is not None:
            return done
    count = int(np.prod([xd.shape[a % nd] for a in axes]))
    inv_n = 1.0 / count
    gd = array(gamma).reshape(affine_shape) if gamma is not None else None
    bd = array(beta).reshape(affine_shape) if beta is not None else None
    red = {a % nd for a in axes}
    # gamma constant over the reduced axes: fold it with rstd into one per-statistic scale
    fold = gd is not None and all(gd.shape[i] == 1 for i in red if i < gd.ndim) and gd.ndim == nd
    # batch norm on NumPy: the same arithmetic, a few images at a time while they are in cache
    blocked = fold and xp is np and plan is not None and plan[0] == "bn" and xd.flags.c_contiguous
    if blocked:
        mean, var, rstd, out, xc = _batch_norm_forward(xd, axes, plan, inv_n, eps, gd, bd)
    else:
        mean = _sum_keep(xd, axes, plan)
        mean *= inv_n
        xc = xd - mean
        var = _dot_keep(xc, xc, axes, plan)
        var *= inv_n
        rstd = (1.0 / xp.sqrt(var + eps)).astype(xd.dtype, copy=False)
    if stats is not None:
        stats["mean"], stats["var"] = mean, var
    if fold:
        if not blocked:
            scale = (gd * rstd).astype(xd.dtype, copy=False)
            out = xp.multiply(xc, scale)
            if bd is not None:
                out += bd
        z, z_scale = xc, rstd  # xhat = z * z_scale
    else:
        xhat = xc
        xhat *= rstd
        if gd is not None:
            out = xhat * gd
            if bd is not None:
                out += bd
        else:
            out = xhat + bd if bd is not None else xhat
        z, z_scale = xhat, None
    del xc
    inputs = tuple(t for t in (x, gamma, beta) if t is not None)
    if not tracking(*inputs):
        return untracked(out, inputs)
    need_x, need_g, need_b = _needs(x), _needs(gamma), _needs(beta)
    pshape = affine_shape

    def rule(g):
        gx = gg = gb = None
        if blocked:
            gx, sg, sgx = _batch_norm_backward(g, z, plan, axes, inv_n, gd, rstd, need_x)
            if need_g:
                gg = unbroadcast(sgx, pshape).reshape(gamma.shape)
            if need_b:
                gb = unbroadcast(sg, pshape).reshape(beta.shape)
        elif fold:
            # per-statistic sums: sum(g) and sum(g * xhat) = z_scale * sum(g * z)
            sg = _sum_keep(g, axes, plan) if (need_x or need_b) else None
            sgx = _dot_keep(g, z, axes, plan) * z_scale if (need_x or need_g) else None
            if need_g:
                gg = unbroadcast(sgx, pshape).reshape(gamma.shape)
            if need_b:
                gb = unbroadcast(sg, pshape).reshape(beta.shape)
            if need_x:
                a = gd * rstd
                c1 = (a * sg) * -inv_n
                c2 = (a * sgx * z_scale) * -inv_n
                gx = xp.multiply(g, a.astype(g.dtype, copy=False))
                t = xp.multiply(z, c2.astype(g.dtype, copy=False))
                gx += t
                del t
                gx += c1.astype(g.dtype, copy=False)
        else:
            if need_g:
                gg = unbroadcast(g * z, pshape).reshape(gamma.shape)
            if need_b:
                gb = unbroadcast(g, pshape).reshape(beta.shape)
            if need_x:
                gxh = g * gd if gd is not None else g.copy()
                m1 = _sum_keep(gxh, axes, plan)
                m2 = _dot_keep(gxh, z, axes, plan)
                t = xp.multiply(z, (m2 * inv_n).astype(g.dtype, copy=False))
                gxh -= t
                del t
                gxh -= (m1 * inv_n).astype(g.dtype, copy=False)
                gxh *= rstd
                gx = gxh
        res = [gx]
        if gamma is not None:
            res.append(gg)
        if beta is not None:
            res.append(gb)
        return tuple(res)

    return record(out, x.device, inputs, rule, op)


def rms_norm(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    """`x / sqrt(mean(x^2, last dim) + eps) * gamma`: float32 on NumPy with the compiled kernels
    through `_rms_norm_compiled`, else in NumPy's / CuPy's passes."""
    op = "rms_norm"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    done = _rms_norm_compiled(x, xd, gamma, eps) if xp is np else None
    if done is not None:
        return done
    r = 1.0 / xp.sqrt((xd * xd).mean(axis=-1, keepdims=True) + eps)
    xhat = xd * r
    gd = array(gamma)
    out = xhat * gd
    if not tracking(x, gamma):
        return untracked(out, (x, gamma))
    need_x, need_g = _needs(x), _needs(gamma)

    def rule(g):
        gxh = g * gd
        gx = r * (gxh - xhat * (gxh * xhat).mean(axis=-1, keepdims=True)) if need_x else None
        gg = sum_leading((g * xhat).reshape(-1, gd.shape[0])) if need_g else None
        return gx, gg

    return record(out, x.device, (x, gamma), rule, op)


# ---------------------------------------------------------------------- losses
def first_bad_target(targets, classes: int, keep=None) -> int | None:
    """The first position of the int array `targets` whose class lies outside `[0, classes)`,
    counting only positions where `keep` (a bool array, or None for all) is true, so that a
    pad token need not be a class; None when there is none. The losses check their targets
    with it before `softmax_cross_entropy`, each with its own message."""
    if not targets.size or (int(targets.min()) >= 0 and int(targets.max()) < classes):
        return None
    bad = (targets < 0) | (targets >= classes)
    if keep is not None:
        bad &= keep
    return int(bad.argmax()) if bool(bad.any()) else None


# The softmax cross entropy's passes over the logits (max, shift, exp, sum; then the backward's
# scale) run a block of rows at a time, so that each block is read from memory once and stays in
# cache for the next pass, and the blocks are shared among the kernel threads. A block holds
# about this many bytes (a few rows of a 32k vocabulary: within a core's L2 cache). Every row is
# reduced by the same NumPy loop as a whole-array call would use: the bits do not change.
_CE_BLOCK_BYTES = 1 << 19


def _ce_min_blocks() -> int:
    """Below this many row blocks the cross entropy's streaming passes (the backward's scale)
    run in the calling thread."""
    return _threads.min_blocks(_CE_BLOCK_BYTES)


# The forward's max / shifted exp / sum costs far more per byte than a streaming pass: an exp
# per element. [2048, 256] float32 (2 MB, the small GPT's logits) took 1.1 ms with the compiled
# kernel on one thread (AMD EPYC, family 25 model 17), ~25x a copy of the same bytes, so the
# wake-up that PARALLEL_MIN_BYTES pays for with 4 MB of streaming pays for itself here with a
# few hundred KB. Measured at 2 threads, cross entropy fwd+bwd on those logits: 1.15 -> 0.72 ms
# with its 4 row blocks shared instead of run here. Counted as 16x a streaming pass (under the
# measured 25x, for CPUs with a faster exp): from 2 blocks (1 MB) with the default bar.
_CE_EXP_COST = 16


def _ce_exp_min_blocks() -> int:
    """Below this many row blocks the forward's shifted exp runs in the calling thread."""
    return _threads.min_blocks(_CE_BLOCK_BYTES, _CE_EXP_COST)



def _row_blocks(x2) -> list[slice]:
    n, row_bytes = x2.shape[0], max(1, x2.shape[1] * x2.itemsize)
    per = max(1, _CE_BLOCK_BYTES // row_bytes)
    return [slice(i, min(n, i + per)) for i in range(0, n, per)]


def _shifted_exp_rows(x2):
    """`m = max(x2, rows)`, `e = exp(x2 - m)`, `s = sum(e, rows)` (NumPy, C-contiguous x2) one
    block of rows at a time over the kernel threads."""
    n = x2.shape[0]
    m = np.empty((n, 1), dtype=x2.dtype)
    s = np.empty((n, 1), dtype=x2.dtype)
    e = np.empty_like(x2)
    k = jit.kernels() if x2.dtype == np.float32 and x2.shape[1] else None
    if k is not None:  # max, shifted exp and sum in two passes over a row, not four
        m1, s1 = m.reshape(-1), s.reshape(-1)

        def compiled(b):
            k.shifted_exp_rows(x2[b], e[b], m1[b], s1[b])

        run_blocks(compiled, _row_blocks(x2), min_blocks=_ce_exp_min_blocks())
        return m, e, s

    def block(b):
        xb, eb = x2[b], e[b]
        np.max(xb, axis=1, keepdims=True, out=m[b])
        np.subtract(xb, m[b], out=eb)
        np.exp(eb, out=eb)
        np.sum(eb, axis=1, keepdims=True, out=s[b])

    blocks = _row_blocks(x2)
    run_blocks(block, blocks, min_blocks=_ce_exp_min_blocks())
    return m, e, s


def _scale_rows(e, row, xp):
    """`e * row` (row: one factor per row, [n, 1]) into a fresh array; NumPy in row blocks over
    the kernel threads when `e` is large."""
    k = jit.kernels() if xp is np and e.dtype == np.float32 and e.flags.c_contiguous else None
    if k is None and (xp is not np or not e.flags.c_contiguous or e.nbytes < _CE_BLOCK_BYTES):
        return e * row
    out = np.empty_like(e)
    if k is not None:
        r1 = np.ascontiguousarray(row, dtype=np.float32).reshape(-1)

        def compiled(b):
            k.scale_rows(e[b], r1[b], out[b])

        run_blocks(compiled, _row_blocks(e), min_blocks=_ce_min_blocks())
        return out

    def block(b):
        np.multiply(e[b], row[b], out=out[b])

    run_blocks(block, _row_blocks(e), min_blocks=_ce_min_blocks())
    return out


def softmax_cross_entropy(logits: Tensor, targets, denom: float, row_weights=None, log_probs: bool = True,
                          dims: tuple[int, ...] = (1,)) -> Tensor:
    """`-sum_i r_i sum_c T_ic log p_ic / denom`, p the softmax of `logits` `[..., classes]` over
    the last dim, as a tensor of dims `dims` (`[1]` as Burn's losses return it). The one softmax
    cross entropy of the engine: `nn.CrossEntropyLoss` and `train.cross_entropy` both call it.

    `targets` is an array in one of two forms:
    - int, the logits' dims without the class axis: one class per row, whose entries the caller
      has checked to lie in range. `T` is its one-hot, read from each row's target entry rather
      than built. `row_weights` (an array, one per row, or None for all ones) is `r`: the class
      weight of the row's target, 0 for a pad row, which then counts for nothing whatever its
      values.
    - float, the logits' dims: the target distribution `T` itself (one-hot or smoothed, already
      scaled by class weights and padding masks); `r` is 1.

    With `log_probs=False` the input holds probabilities and their log takes the place of
    log_softmax. Entries where `T` is 0 count for nothing, even where a probability is 0 (no
    `0 * log 0 = nan`): their gradient is 0.
    """
    op = "cross_entropy"
    _float_input(op, logits)
    xd = array(logits)
    xp = logits.device.xp
    classes = xd.shape[-1]
    x2 = xd if xd.ndim == 2 else xd.reshape(-1, classes)
    index = targets.dtype.kind in "iu"
    if index:
        t = targets if targets.ndim == 1 else targets.reshape(-1)
        rows = xp.arange(x2.shape[0])
        rw = None if row_weights is None else row_weights.astype(xd.dtype, copy=False)
        if log_probs:
            # one array of the logits' size: the shifted logits, exponentiated in place (the
            # targets' entries read before), kept for the backward
            if xp is np and x2.flags.c_contiguous and (x2.nbytes >= _CE_BLOCK_BYTES or (
                    x2.dtype == np.float32 and jit.kernels() is not None)):
                m, e, s = _shifted_exp_rows(x2)
            else:
                m = x2.max(axis=1, keepdims=True)
                e = x2 - m
                xp.exp(e, out=e)
                s = e.sum(axis=1, keepdims=True)
            picked = x2[rows, t] - m[:, 0]
            per = xp.log(s[:, 0]) - picked
            if rw is not None:
                per = xp.where(rw != 0, per * rw, 0)
        else:
            pt = x2[rows, t]
            if rw is not None:
                pt = xp.where(rw != 0, pt, 1)
            with np.errstate(divide="ignore"):
                per = -xp.log(pt)
            if rw is not None:
                per = per * rw
        loss = per.sum() / denom
    else:
        T = targets.astype(xd.dtype, copy=False)
        T = T if T.ndim == 2 else T.reshape(-1, classes)
        if log_probs:
            shifted = x2 - x2.max(axis=1, keepdims=True)
            lp = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        else:
            used = T != 0
            with np.errstate(divide="ignore", invalid="ignore"):
                lp = xp.where(used, xp.log(xp.where(used, x2, 1)), 0)
        loss = 0.0 - (T * lp).sum() / denom  # 0.0 - : an all-zero T gives 0.0, not -0.0
    out = xp.asarray(loss, dtype=xd.dtype).reshape(dims)
    if not tracking(logits):
        return untracked(out, (logits,))
    shape = xd.shape

    def rule(g):
        scale = g.reshape(()) * (1.0 / denom)
        if index and log_probs:
            # (softmax - one_hot) * r * scale in one pass over the logits: each row's factor first
            row = scale / s if rw is None else (scale * rw[:, None]) / s
            grad = _scale_rows(e, row.astype(e.dtype, copy=False), xp)  # a fresh array this rule owns
            grad[rows, t] -= scale if rw is None else (scale * rw).astype(e.dtype, copy=False)
        elif index:
            grad = xp.zeros_like(x2)
            with np.errstate(divide="ignore"):
                coef = -1.0 / pt if rw is None else -rw / pt
            grad[rows, t] = coef * scale
        elif log_probs:
            grad = (T - xp.exp(lp) * T.sum(axis=1, keepdims=True)) * -scale
        else:
            with np.errstate(divide="ignore"):
                grad = xp.where(used, T / xp.where(used, x2, 1), 0) * -scale
        return (grad if grad.shape == shape else grad.reshape(shape),)

    return record(out, logits.device, (logits,), rule, op)


# ---------------------------------------------------------------------- rotary encoding
def rotary(x: Tensor, cos, sin) -> Tensor:
    """Rotate each pair (x[2i], x[2i+1]) of the last dim by the angle whose cos / sin are
    given per (position, pair): `cos`, `sin` arrays `[seq_length, d_model / 2]`."""
    op = "rotary"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    shape = xd.shape
    x2 = xd.reshape(shape[:-1] + (shape[-1] // 2, 2))
    a, b = x2[..., 0], x2[..., 1]
    c = cos.astype(xd.dtype, copy=False)
    s = sin.astype(xd.dtype, copy=False)
    out = xp.empty_like(x2)
    out[..., 0] = a * c - b * s
    out[..., 1] = a * s + b * c
    out = out.reshape(shape)
    if not tracking(x):
        return untracked(out, (x,))

    def rule(g):
        g2 = g.reshape(x2.shape)
        g0, g1 = g2[..., 0], g2[..., 1]
        gx = xp.empty_like(g2)
        gx[..., 0] = g0 * c + g1 * s
        gx[..., 1] = g1 * c - g0 * s
        return (gx.reshape(shape),)

    return record(out, x.device, (x,), rule, op)


# ---------------------------------------------------------------------- tracing
# each kernel is one op in a trace (engine.tensor.trace): the wrappers exist only while a trace runs
from ..tensor import trace as _trace  # noqa: E402

_trace.register_functions(__import__("sys").modules[__name__], [
    "gelu", "relu6", "leaky_relu", "elu", "celu", "selu", "hard_sigmoid", "silu", "hard_swish", "mish", "softplus",
    "softsign", "log_sigmoid", "hard_shrink", "soft_shrink", "tanhshrink", "thresholded_relu", "hardtanh", "prelu",
    "linear", "normalize", "rms_norm", "softmax_cross_entropy", "rotary",
])
