"""Intel MKL's matrix products for the engine's CPU products that run on one thread (issue 22).

NumPy's products are OpenBLAS's. On Intel CPUs OpenBLAS's float32 kernels (SkylakeX) are
slower than MKL's, which PyTorch links, on the products of training steps; on AMD CPUs
OpenBLAS was the faster (benchmarks/TUNING.md, "mkl"). So when the `mkl`
wheel is installed (`pip install ember-studio[mkl]`), the engine calls MKL's `cblas_?gemm` and
`cblas_?gemm_batch_strided` through ctypes for the float32 / float64 products that run on one
thread: every product of a one-thread process, and at several threads those that
`threads.matmul` does not hand to OpenBLAS's threads (small ones, and the products each kernel
thread makes). Products that get OpenBLAS's threads stay OpenBLAS's.

MKL runs with its sequential threading layer: it never starts threads of its own (no OpenMP
workers spinning on the cores the engine's threads need) and is safe to call from several
threads at once. Its results are the same from call to call, at any alignment of the operands
and on any number of kernel threads (tested); they are not OpenBLAS's bits: the two sum in
other orders, so results differ in the last bits (relative differences ~5e-7 in float32).

`EMBER_BLAS` chooses: `auto` (the default: MKL on an Intel CPU when the wheel is installed),
`mkl` (whenever installed; a warning says when it is not), `openblas` (never MKL).
A product that MKL cannot take as it is (integer dtypes, mixed dtypes, operands whose last two
axes are not a matrix in row- or column-major order with unit stride, batch axes that do not
collapse to one stride, an output that overlaps an operand or is not C-contiguous, sizes past
32-bit ints, fewer than MKL_MIN_WORK multiply-adds, where OpenBLAS's smaller overhead wins)
is NumPy's, unchanged.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings

import numpy as np

# Below this many multiply-adds in a product (all its matrices together) NumPy's call is the
# cheaper: ctypes' argument conversion costs a few microseconds a call
MKL_MIN_WORK = 1 << 21
# ... and each matrix of a stack at least this many: below it OpenBLAS's loop over the items
# is the faster
MKL_MIN_ITEM_WORK = 1 << 20

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_INT_MAX = (1 << 31) - 1

_lock = threading.Lock()
_state: dict = {}  # once decided: "reason" (None when MKL is used), and "lib", "routines", "path" when it is


def _choice() -> str:
    value = os.environ.get("EMBER_BLAS", "auto").strip().lower() or "auto"
    if value not in ("auto", "mkl", "openblas"):
        warnings.warn(f"EMBER_BLAS={value!r}: expected 'auto', 'mkl' or 'openblas'; using 'auto'",
                      RuntimeWarning, stacklevel=3)
        return "auto"
    return value


def _intel_cpu() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return "GenuineIntel" in line
    except OSError:  # not Linux: Windows names the vendor in platform.processor()
        import platform  # noqa: PLC0415
        return "GenuineIntel" in platform.processor()
    return False


def library_path() -> str | None:
    """Where the installed `mkl` wheel's single dynamic library (mkl_rt) is, or None."""
    try:
        from importlib import metadata  # noqa: PLC0415
        files = metadata.files("mkl") or ()
    except Exception:  # noqa: BLE001 - PackageNotFoundError, or a broken installation
        return None
    linux = sys.platform.startswith("linux")  # the wheels are built for Linux and Windows only

    def is_mkl_rt(name: str) -> bool:
        return name.startswith("libmkl_rt.so") if linux else name.startswith("mkl_rt") and name.endswith(".dll")

    found = sorted(os.path.normpath(str(f.locate())) for f in files if is_mkl_rt(f.name))
    for path in found:
        if os.path.exists(path):
            return path
    return None


def _load(path: str):
    lib = ctypes.CDLL(path)
    lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
    lib.MKL_Set_Threading_Layer.restype = ctypes.c_int
    if lib.MKL_Set_Threading_Layer(_SEQUENTIAL) != _SEQUENTIAL:  # before any other MKL call
        raise OSError("MKL did not take its sequential threading layer")
    # MKL keeps the buffers it packs operands into for reuse ("fast memory management"): a
    # LoRA step of a small Llama (its [1024, 256] @ [256, 32000] head) then held +163 MB more at
    # its peak than with OpenBLAS. Without it each call frees its buffers, as OpenBLAS does.
    lib.MKL_Disable_Fast_MM.restype = ctypes.c_int
    lib.MKL_Disable_Fast_MM()
    i, p = ctypes.c_int, ctypes.c_void_p
    routines = {}
    for dtype, prefix, real in ((np.dtype(np.float32), "s", ctypes.c_float), (np.dtype(np.float64), "d", ctypes.c_double)):
        gemm = getattr(lib, f"cblas_{prefix}gemm")
        gemm.restype = None
        gemm.argtypes = [i, i, i, i, i, i, real, p, i, p, i, real, p, i]
        batch = getattr(lib, f"cblas_{prefix}gemm_batch_strided")
        batch.restype = None
        batch.argtypes = [i, i, i, i, i, i, real, p, i, i, p, i, i, real, p, i, i, i]
        routines[dtype] = (gemm, batch)
    return lib, routines


def _decide() -> None:
    """Fill `_state` once, in one update: a thread that reads it without the lock sees it empty
    (and waits here) or whole."""
    with _lock:
        if _state:
            return
        choice = _choice()
        path = None if choice == "openblas" else library_path()
        found: dict = {"reason": None}
        if choice == "openblas":
            found["reason"] = "EMBER_BLAS=openblas"
        elif path is None:
            found["reason"] = "the mkl wheel is not installed (pip install ember-studio[mkl])"
            if choice == "mkl":
                warnings.warn("EMBER_BLAS=mkl: " + found["reason"] + "; the products stay OpenBLAS's",
                              RuntimeWarning, stacklevel=4)
        elif choice == "auto" and not _intel_cpu():
            found["reason"] = "not an Intel CPU (EMBER_BLAS=mkl uses MKL anyway)"
        else:
            try:
                lib, routines = _load(path)
                found.update(lib=lib, routines=routines, path=path)
            except (OSError, AttributeError) as exc:
                found["reason"] = f"MKL at {path} could not be used: {exc}"
                warnings.warn(found["reason"] + "; the products stay OpenBLAS's", RuntimeWarning, stacklevel=4)
        _state.update(found)


def active() -> bool:
    """Whether the engine's one-thread products are MKL's in this process."""
    if not _state:
        _decide()
    return "lib" in _state


def describe() -> str:
    """One line for reports: which BLAS makes the one-thread products, and why."""
    if active():
        try:
            from importlib import metadata  # noqa: PLC0415
            version = " " + metadata.version("mkl")
        except Exception:  # noqa: BLE001 - a report line
            version = ""
        return (f"MKL{version} (sequential) for the products on one thread (from 2^{MKL_MIN_WORK.bit_length() - 1} "
                f"multiply-adds), OpenBLAS for the rest")
    return f"OpenBLAS (NumPy's) for every product: {_state['reason']}"


def _reset_for_tests() -> None:
    with _lock:
        _state.clear()


# ---------------------------------------------------------------------- planning a call
def _matrix(x, rows: int, cols: int):
    """How x's last two axes ([rows, cols]) lie in memory for a row-major BLAS: (trans, ld),
    or None when they are not a matrix with one unit stride."""
    item = x.itemsize
    sr, sc = x.strides[-2], x.strides[-1]
    if (cols == 1 or sc == item) and (rows == 1 or (sr > 0 and sr % item == 0 and sr >= cols * item)):
        return _NO_TRANS, sr // item if rows > 1 else cols  # a single row: any ld >= cols will do
    if (rows == 1 or sr == item) and (cols == 1 or (sc > 0 and sc % item == 0 and sc >= rows * item)):
        return _TRANS, sc // item if cols > 1 else rows
    return None


def _batch_stride(x, batch: tuple[int, ...]):
    """The one stride (in elements) between x's consecutive matrices over the broadcast batch
    axes `batch` (0 when x is one matrix for all of them), or None when they do not collapse."""
    lead = x.shape[:-2]
    strides = x.strides[:-2]
    pad = len(batch) - len(lead)
    full = [0] * pad + [0 if n == 1 and m != 1 else s for n, m, s in zip(lead, batch[pad:], strides)]
    item = x.itemsize
    stride = None
    expected = None  # stride the next-outer axis must have, from the inner ones
    for n, s in zip(reversed(batch), reversed(full)):
        if n == 1:
            continue
        if stride is None:
            if s < 0 or s % item:
                return None
            stride = s // item
            expected = s * n
            continue
        if s != expected:
            return None
        expected = s * n
    return 0 if stride is None else stride


def plan(a, b, out=None):
    """The MKL call that computes `np.matmul(a, b)` into an output of shape
    batch + [M, N], or None when NumPy's product must be used: a tuple
    (routine, out, args) where `routine` is "gemm" or "batch" and `args` the C arguments after
    the layout (pointers as ints). `out` is the given output or a new C-contiguous array."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if m * k * n < MKL_MIN_ITEM_WORK:  # first, cheaply: most of a step's products are small (and
        return None                      # a stack's items must each make this many)
    dt = a.dtype
    if dt != b.dtype or dt not in (np.float32, np.float64) or not (a.flags.aligned and b.flags.aligned):
        return None
    if k != k2 or m == 0 or n == 0 or k == 0:
        return None
    if a.ndim == 2 and b.ndim == 2:
        batch, count = (), 1
    else:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return None
        count = 1
        for d in batch:
            count *= d
    if count * m * n * k < MKL_MIN_WORK:  # also a batch of 0
        return None
    ma, mb = _matrix(a, m, k), _matrix(b, k, n)
    if ma is None or mb is None:
        return None
    shape = batch + (m, n)
    if out is None:
        out = np.empty(shape, dtype=dt)
    elif (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dt or not out.flags.c_contiguous
          or not out.flags.writeable or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        return None
    (ta, lda), (tb, ldb) = ma, mb
    pa, pb, pc = a.ctypes.data, b.ctypes.data, out.ctypes.data
    if count == 1:
        args = (ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 0.0, pc, n)
        return ("gemm", out, args) if max(m, n, k, lda, ldb) <= _INT_MAX else None
    sa, sb = _batch_stride(a, batch), _batch_stride(b, batch)
    if sa is None or sb is None:
        return None
    if sb == 0 and ta == _NO_TRANS and (sa == m * lda or m == 1 and sa == lda):
        # one matrix b for a stack of a that is itself one tall matrix: a single product
        rows = count * m
        args = (ta, tb, rows, n, k, 1.0, pa, lda, pb, ldb, 0.0, pc, n)
        return ("gemm", out, args) if max(rows, n, k, lda, ldb) <= _INT_MAX else None
    args = (ta, tb, m, n, k, 1.0, pa, lda, sa, pb, ldb, sb, 0.0, pc, n, m * n, count)
    if max(m, n, k, lda, ldb, sa, sb, m * n, count) > _INT_MAX:
        return None
    return "batch", out, args


def matmul(a, b, out=None):
    """`np.matmul(a, b, out=out)`, made by MKL when it is active and can take the product."""
    if not _state:
        _decide()
    if "lib" in _state:
        p = plan(a, b, out)
        if p is not None:
            routine, result, args = p
            gemm, batch = _state["routines"][result.dtype]
            (gemm if routine == "gemm" else batch)(_ROW_MAJOR, *args)
            return result
    return np.matmul(a, b, out=out)
