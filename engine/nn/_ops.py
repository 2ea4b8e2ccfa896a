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
from ..tensor.raw import array, check_same_device, recompute_of, record, sum_leading, tracking, unbroadcast, untracked
from ..tensor import cpu

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


def gelu(x: Tensor) -> Tensor:
    """Exact Gelu: `x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))`. float32 on NumPy goes through
    the CPU door's kernel (`cpu.activation.gelu`, Phi within 7.3e-8); other dtypes and devices
    use SciPy's / CuPy's erf, and the backward reuses Phi(x)."""
    op = "gelu"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    fused = cpu.activation.gelu(xd)
    if fused is not None:
        out, der = fused
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



def silu(x: Tensor) -> Tensor:
    """`x * sigmoid(x)`. float32 on NumPy with the compiled kernels: the output and the
    derivative `s (1 + x (1 - s))` in one pass (`cpu.activation.silu`), the backward one product
    (NumPy's passes are many: benchmarks/TUNING.md, "silu"). Otherwise the sigmoid is computed once, `1 / (1 + exp(-x))` in three in-place
    passes (an exp that overflows gives exactly 0; within an ulp or so of scipy's `expit`, which
    took twice as long on float32), and kept for the backward, `g * s * (1 + x * (1 - s))`, worked
    in place."""
    op = "silu"
    _float_input(op, x)
    xd = array(x)
    xp = x.device.xp
    fused = cpu.activation.silu(xd)
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
    out2 = cpu.matmul(x2, wd)
    if bias is not None:
        out2 += array(bias)
    out = out2.reshape(lead + (wd.shape[1],)) if xd.ndim != 2 else out2
    inputs = (x, weight) if bias is None else (x, weight, bias)
    if not tracking(*inputs):
        return untracked(out, inputs)
    need_x, need_w = _needs(x), _needs(weight)
    need_b = bias is not None and _needs(bias)
    xshape, d_output = xd.shape, wd.shape[1]
    # the weight for the input's gradient: kept, or computed again (GGUF blocks: engine.tensor.recompute)
    again = recompute_of(wd) if need_x else None
    kept_w = wd if need_x and again is None else None
    kept_x = x2 if need_w else None

    def rule(g):
        g2 = g.reshape(-1, d_output) if g.ndim != 2 else g
        gx = cpu.matmul(g2, (kept_w if again is None else again()).T).reshape(xshape) if need_x else None
        gw = cpu.matmul(kept_x.T, g2) if need_w else None
        if bias is None:
            return gx, gw
        gb = sum_leading(g2) if need_b else None
        return gx, gw, gb

    return record(out, x.device, inputs, rule, op)


# ---------------------------------------------------------------------- normalization
def _affine_array(t: Tensor | None):
    return None if t is None else array(t)


def _layer_norm_compiled(x: Tensor, xd, plan, row_shape, eps: float, gamma: Tensor | None, beta: Tensor | None):
    """Layer norm over the trailing axes through the CPU door's compiled kernels
    (`cpu.norm.layer_norm`), or None when they do not apply."""
    _, r, p = plan
    run = cpu.norm.layer_norm(xd, r, p, row_shape, _affine_array(gamma), _affine_array(beta), eps)
    if run is None:
        return None
    out, backward = run
    inputs = tuple(t for t in (x, gamma, beta) if t is not None)
    if not tracking(*inputs):
        return untracked(out, inputs)
    need_x = _needs(x)

    def rule(g):
        gx, sum_g, sum_gxhat = backward(g, need_x)
        res = [gx.reshape(xd.shape).astype(g.dtype, copy=False) if need_x else None]
        if gamma is not None:
            res.append(sum_gxhat.astype(np.float32).reshape(gamma.shape) if _needs(gamma) else None)
        if beta is not None:
            res.append(sum_g.astype(np.float32).reshape(beta.shape) if _needs(beta) else None)
        return tuple(res)

    return record(out, x.device, inputs, rule, "normalize")


def _rms_norm_compiled(x: Tensor, xd, gamma: Tensor, eps: float):
    """RMS norm over the last axis through the CPU door's compiled kernels (`cpu.norm.rms_norm`),
    or None when they do not apply."""
    run = cpu.norm.rms_norm(xd, array(gamma), eps)
    if run is None:
        return None
    out, backward = run
    if not tracking(x, gamma):
        return untracked(out, (x, gamma))
    need_x, need_g = _needs(x), _needs(gamma)

    def rule(g):
        gx, sum_gxhat = backward(g, need_x)
        gg = sum_gxhat.astype(np.float32).reshape(gamma.shape) if need_g else None
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
    plan = cpu.norm.reduction_plan(xd.shape, axes)
    if stats is None and plan is not None and plan[0] == "rows" and xp is np:
        row_shape = xd.shape[nd - len({a % nd for a in axes}):]
        affine_fits = affine_shape is None or cpu.norm.strip_ones(affine_shape) == cpu.norm.strip_ones(row_shape)
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
        mean, var, rstd, out, xc = cpu.norm.batch_norm_forward(xd, axes, plan, inv_n, eps, gd, bd)
    else:
        mean = cpu.norm.sum_keep(xd, axes, plan)
        mean *= inv_n
        xc = xd - mean
        var = cpu.norm.dot_keep(xc, xc, axes, plan)
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
            gx, sg, sgx = cpu.norm.batch_norm_backward(g, z, plan, axes, inv_n, gd, rstd, need_x)
            if need_g:
                gg = unbroadcast(sgx, pshape).reshape(gamma.shape)
            if need_b:
                gb = unbroadcast(sg, pshape).reshape(beta.shape)
        elif fold:
            # per-statistic sums: sum(g) and sum(g * xhat) = z_scale * sum(g * z)
            sg = cpu.norm.sum_keep(g, axes, plan) if (need_x or need_b) else None
            sgx = cpu.norm.dot_keep(g, z, axes, plan) * z_scale if (need_x or need_g) else None
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
                m1 = cpu.norm.sum_keep(gxh, axes, plan)
                m2 = cpu.norm.dot_keep(gxh, z, axes, plan)
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
    through `_rms_norm_compiled` (the CPU door's kernels), else in NumPy's / CuPy's passes."""
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
            blocked = cpu.rows.shifted_exp(x2)
            if blocked is not None:
                m, e, s = blocked
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
            grad = cpu.rows.scale(e, row.astype(e.dtype, copy=False))  # a fresh array this rule owns
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
