"""Central finite differences in float64 against the engine's backward rules."""
from __future__ import annotations

import numpy as np

from engine import Tensor


def numeric_grad(f, arrays, i, eps=1e-6):
    """d sum(f(*arrays) * probe) / d arrays[i] by central differences (probe fixed by caller)."""
    base = [a.copy() for a in arrays]
    x = base[i]
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index", "zerosize_ok"])
    for _ in it:
        idx = it.multi_index
        old = x[idx]
        x[idx] = old + eps
        fp = f(*base)
        x[idx] = old - eps
        fm = f(*base)
        x[idx] = old
        g[idx] = (fp - fm) / (2 * eps)
    return g


def check_grads(fn, *arrays, device="cpu", rtol=1e-6, atol=1e-8, wrt=None, seed=0):
    """Check the engine gradient of `fn(*tensors)` for each float64 input against finite differences.

    The output is contracted with a fixed random probe so that every output element counts.
    Returns the list of analytic gradients (NumPy arrays).
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    wrt = range(len(arrays)) if wrt is None else wrt
    tensors = [Tensor.from_data(a, device=device, dtype="float64").require_grad() for a in arrays]
    out = fn(*tensors)
    rng = np.random.default_rng(seed)
    probe_np = rng.standard_normal(out.shape)
    probe = Tensor.from_data(probe_np, device=device, dtype="float64")
    grads = (out * probe).sum().backward()

    def scalar(*arrs):
        ts = [Tensor.from_data(a, device=device, dtype="float64") for a in arrs]
        return float((fn(*ts).numpy() * probe_np).sum())

    result = []
    for i in wrt:
        g = tensors[i].grad(grads)
        analytic = np.zeros_like(arrays[i]) if g is None else g.numpy()
        numeric = numeric_grad(scalar, arrays, i)
        err = np.abs(analytic - numeric)
        tol = atol + rtol * np.maximum(np.abs(numeric), np.abs(analytic))
        # central differences carry O(eps^2) truncation and O(1e-16/eps) rounding error
        fd_floor = 1e-7 * (1 + np.abs(numeric))
        bad = err > np.maximum(tol, fd_floor)
        assert not bad.any(), (
            f"gradient of input {i} differs from finite differences at {np.argwhere(bad)[:5].tolist()}: "
            f"analytic {analytic[bad][:5]}, numeric {numeric[bad][:5]}"
        )
        result.append(analytic)
    return result
