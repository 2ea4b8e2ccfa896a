"""Shared by the tensor tests of ops-index: check_grads that also covers empty inputs, and the
device list with CUDA skipped visibly where no GPU is present."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Tensor
from engine.tensor.device import cupy_module
from tests.engine.gradcheck import check_grads

HAS_GPU = cupy_module() is not None
CUDA = pytest.param("cuda:0", marks=pytest.mark.skipif(not HAS_GPU, reason="CuPy with a GPU is not available"))
DEVICES = ["cpu", CUDA]


def grads(fn, *arrays, device="cpu"):
    """`check_grads` on the non-empty inputs; for every input, the gradient has its shape.

    (check_grads' finite differences cannot iterate over an empty array, so an empty input
    only gets its gradient's shape checked.) Returns one gradient per input.
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    wrt = [i for i, a in enumerate(arrays) if a.size]
    checked = dict(zip(wrt, check_grads(fn, *arrays, device=device, wrt=wrt))) if wrt else {}
    ts = [Tensor.from_data(a, device=device, dtype="float64").require_grad() for a in arrays]
    out = fn(*ts)
    result = []
    if out.is_tracked():
        g = out.sum().backward()
        for i, (t, a) in enumerate(zip(ts, arrays)):
            gt = t.grad(g)
            if gt is not None:
                assert gt.shape == a.shape, f"gradient of input {i} has dims {gt.shape}, expected {a.shape}"
                assert gt.device == t.device
                assert gt.dtype == "float64"
            result.append(checked.get(i, np.zeros_like(a)))
    else:
        result = [checked.get(i, np.zeros_like(a)) for i, a in enumerate(arrays)]
    for r, a in zip(result, arrays):
        assert r.shape == a.shape
    return result
