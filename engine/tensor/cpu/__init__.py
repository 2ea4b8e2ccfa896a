"""The CPU door: every decision about HOW a computation runs on the CPU lives behind it.

The layers, models, optimizers and file readers say WHAT to compute; this package decides how:
how many kernel threads and how work is cut into blocks for them (`threads`), which BLAS makes
a product and on how many of its threads (`threads.matmul`, `mkl`), and when the compiled
(numba) kernels run (`jit`, `_kernels`). Nothing outside this package reads a threshold, a
thread count or a backend; the constants and their measurements are listed by name in
benchmarks/TUNING.md.

The public surface (`__all__`):

- `num_threads()`, `set_num_threads(n)`: the kernel threads (also `engine.set_num_threads`).
- `matmul(a, b, out=None)`: the engine's matrix product on any array module (on NumPy: MKL or
  OpenBLAS, OpenBLAS's threads by the product's size).
- `run_blocks(fn, blocks, min_blocks=2)`, `run_chunks(fn, blocks, min_blocks=2,
  own_products=False)`, `split(n, nbytes)`, `min_blocks(block_bytes, cost=1)`,
  `copy_into(dst, src)`, `elementwise(fn, dtype, *arrays)`: blocked work over the kernel
  threads, for the tensor ops (`engine.tensor.ops_*`) that cut their own work into blocks.
- `kernels()`: the compiled kernels' module, or None (switched off with `EMBER_JIT=0`, or no
  numba); `warm_up()` compiles or loads them on a background thread (the app does at start).
- `describe()`: one line saying which BLAS, how many threads and whether the compiled kernels
  run (the benchmarks print it).
- the named kernels, by family: `activation` (gelu, silu), `norm` (the reductions, batch norm,
  layer / RMS norm), `rows` (softmax cross entropy's row passes), `attention` (how attention's
  blocks are cut and shared), `conv` (the channels-last and Winograd convolutions), `quant`
  (products with weights kept in GGUF's quantized blocks). Each takes
  arrays and returns arrays, or None where it has no CPU kernel for them: the caller then runs
  its generic NumPy / CuPy code, which is also the reference the tests compare against.

A GPU (CuPy) twin of a kernel plugs in at the same function: the function looks at its arrays'
module and hands CuPy arrays to the twin (a `cupy.ElementwiseKernel` / `RawKernel` in a module
of its own, imported on first use), returning None while there is none. docs/engine-guide.md
("CPU threads and compiled kernels") has the steps to add a kernel.

What importing this package does (it is imported with `engine`), and nothing else:

- when NumPy is not loaded yet and `OPENBLAS_THREAD_TIMEOUT` is not set, it sets it to 20
  (OpenBLAS's workers spin 2**20 clock ticks after a call, not 2**28, so that they sleep through
  the engine's own kernels instead of holding their cores; OpenBLAS reads it when it loads, so
  it only takes effect when `engine` is imported before NumPy; a value already set wins);
- it reads `EMBER_NUM_THREADS` / `OMP_NUM_THREADS` / `OPENBLAS_NUM_THREADS` (the thread counts)
  and `EMBER_JIT`, and registers an at-fork hook that makes a child start its own thread pool.

No thread starts and numba, threadpoolctl and MKL are not loaded until the first kernel or
product that needs them (`EMBER_BLAS` is read then).
"""
import os as _os
import sys as _sys

if "numpy" not in _sys.modules:  # before anything here imports NumPy (see above)
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from . import mkl, jit  # noqa: E402
from .threads import (  # noqa: E402
    copy_into, elementwise, matmul, min_blocks, num_threads, run_blocks, run_chunks, set_num_threads, split)
from .jit import warm_up  # noqa: E402
from . import activation, attention, conv, norm, quant, rows  # noqa: E402

__all__ = [
    "num_threads", "set_num_threads",
    "matmul",
    "run_blocks", "run_chunks", "split", "min_blocks", "copy_into", "elementwise",
    "kernels", "warm_up",
    "describe",
    "activation", "attention", "conv", "norm", "quant", "rows",
]


def kernels():
    """The compiled kernels' module (`_kernels`), or None when they are switched off or numba is
    missing: the caller then takes its NumPy path. Compiles or loads them on the first call."""
    return jit.kernels()


def describe() -> str:
    """One line: the BLAS that makes the products, the kernel and BLAS threads, the compiled
    kernels' state."""
    from . import threads  # noqa: PLC0415

    reason = jit.unavailable_reason()
    compiled = "compiled kernels on" if reason is None else f"compiled kernels off ({reason})"
    return (f"{mkl.describe()}; {num_threads()} kernel threads, BLAS started with "
            f"{threads.blas_threads()}; {compiled}")
