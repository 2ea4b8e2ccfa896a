"""The CPU door (engine/tensor/cpu): its public surface, what importing the engine does, and its
named kernels' answer for arrays they have no CPU kernel for (None: the caller's generic path)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import special

from engine.tensor import cpu

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import json, os, sys, threading
{before}
import engine
print(json.dumps({{
    "timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
    "loaded": sorted(m for m in ("numba", "llvmlite", "threadpoolctl", "scipy") if m in sys.modules),
    "threads": threading.active_count(),
}}))
"""


def _import_engine(before: str = "", **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    environ.update(env)
    result = subprocess.run([sys.executable, "-c", _PROBE.format(before=before)], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_engine_does_only_what_the_door_documents():
    """OPENBLAS_THREAD_TIMEOUT=20 when NumPy was not loaded and it was unset; no thread started;
    neither the compiler (numba, llvmlite) nor the BLAS thread control (threadpoolctl) loaded."""
    got = _import_engine()
    assert got == {"timeout": "20", "loaded": [], "threads": 1}
    assert "OPENBLAS_THREAD_TIMEOUT" in cpu.__doc__ and "at-fork" in cpu.__doc__


def test_a_users_openblas_setting_wins_and_numpy_loaded_first_is_left_alone():
    assert _import_engine(OPENBLAS_THREAD_TIMEOUT="7")["timeout"] == "7"
    assert _import_engine(before="import numpy")["timeout"] is None


def test_the_door_exports_its_documented_surface():
    """Every exported name exists and is named in the door's docstring (the list the guide shows)."""
    assert cpu.__all__ == [
        "num_threads", "set_num_threads", "matmul",
        "run_blocks", "run_chunks", "split", "min_blocks", "copy_into", "elementwise",
        "kernels", "warm_up", "describe",
        "activation", "attention", "conv", "norm", "quant", "rows",
    ]
    for name in cpu.__all__:
        assert hasattr(cpu, name), name
        assert f"`{name}" in cpu.__doc__, f"{name} is not described in engine.tensor.cpu's docstring"
    import engine

    assert engine.set_num_threads is cpu.set_num_threads and engine.num_threads is cpu.num_threads


def test_describe_names_the_blas_the_threads_and_the_compiled_kernels():
    line = cpu.describe()
    assert "kernel threads" in line and "compiled kernels" in line
    assert "MKL" in line or "OpenBLAS" in line


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_named_kernels_answer_none_where_they_have_no_cpu_kernel(dtype):
    """The caller then runs its generic NumPy / CuPy code (the reference the tests compare with)."""
    x = np.arange(12, dtype=dtype).reshape(3, 4)
    assert cpu.activation.gelu(x) is None
    assert cpu.activation.silu(x) is None
    assert cpu.norm.layer_norm(x, 3, 4, (4,), None, None, 1e-5) is None
    assert cpu.norm.rms_norm(x, np.ones(4, dtype), 1e-5) is None
    assert cpu.activation.gelu(np.zeros(0, np.float32)) is None  # empty: nothing to run


def test_named_kernels_run_float32_numpy_arrays():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    out, der = cpu.activation.gelu(x)
    assert out.shape == x.shape and der.shape == x.shape and out.dtype == np.float32
    x64 = x.astype(np.float64)  # float64 erf GELU and its derivative Phi(x) + x phi(x)
    cdf = special.ndtr(x64)
    np.testing.assert_allclose(out, x64 * cdf, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(der, cdf + x64 * np.exp(-0.5 * x64 * x64) / np.sqrt(2 * np.pi), rtol=1e-5, atol=1e-6)
    logits = np.ascontiguousarray(np.tile(x, (1, 30000)))  # over rows.BLOCK_BYTES: blocked with or without numba
    m, e, s = cpu.rows.shifted_exp(logits)
    np.testing.assert_allclose(e, np.exp(logits - logits.max(axis=1, keepdims=True)), rtol=1e-6)
    np.testing.assert_allclose(s[:, 0], e.sum(axis=1), rtol=1e-5)


def test_matmul_is_numpys_product_for_numpy_arrays():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    np.testing.assert_allclose(cpu.matmul(a, b), a @ b, rtol=1e-12)
    out = np.empty((5, 3))
    assert cpu.matmul(a, b, out=out) is out
