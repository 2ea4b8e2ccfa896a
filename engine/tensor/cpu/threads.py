"""Worker threads for the engine's own CPU kernels.

NumPy's ufuncs and copies run on one core; only BLAS uses several. The kernels that do much
work outside BLAS (max pooling, batch norm, the im2col and col2im copies of convolution)
already work a block of images at a time so that each block stays in cache; `run_blocks`
hands those blocks to a few threads (NumPy releases the GIL inside its loops).

The thread count is, in order: `set_num_threads(n)`, the environment variable
`EMBER_NUM_THREADS`, `OMP_NUM_THREADS` or `OPENBLAS_NUM_THREADS` (so that a process limited
to one BLAS thread stays on one core), else the CPUs this process may run on. A call made
from one of these workers runs its blocks in that worker, never waiting on the pool.
"""
from __future__ import annotations

import ctypes
import importlib
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import mkl as _mkl

__all__ = ["num_threads", "set_num_threads", "blas_threads", "run_blocks", "run_chunks", "split", "min_blocks", "copy_into", "elementwise", "PARALLEL_MIN_BYTES",
           "one_blas_thread", "one_blas_thread_possible", "matmul", "BLAS_THREADED_MIN_WORK", "BLAS_THREADED_MIN_OUT", "blas_threads_by_size"]

# below this many bytes of data the threads' hand-off costs more than they save: a hand-off
# wakes a sleeping worker (a threading.Event round trip), which takes about as long as a
# compiled pass over this many bytes, so smaller work stays in the calling thread
# (measurements: benchmarks/TUNING.md, by constant name, as for every constant here)
PARALLEL_MIN_BYTES = 4 << 20
# streaming elementwise passes gain less from a second core (memory bandwidth): a higher bar,
# on the size of one array
ELEMENTWISE_MIN_BYTES = 1 << 23
# `split` cuts a pass into up to this many slices per thread, each touching at least
# PART_MIN_BYTES: the threads take them as they come free (`run_chunks`)
PARTS_PER_THREAD = 4
PART_MIN_BYTES = 1 << 18

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_configured: int | None = None
_inside = threading.local()


def _from_environment(names=("EMBER_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")) -> int:
    """The first of `names` set to a whole number >= 1, else the CPUs this process may run on."""
    for name in names:
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                n = int(raw)
            except ValueError:
                continue
            if n >= 1:
                return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def num_threads() -> int:
    """How many threads the engine's blocked CPU kernels use (1: no worker threads)."""
    return _configured if _configured is not None else _DEFAULT


def set_num_threads(n: int | None) -> None:
    """Use `n` threads (>= 1) for the engine's blocked CPU kernels; None restores the default
    from the environment. BLAS keeps its own setting."""
    global _configured
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"set_num_threads: expected an int >= 1 or None, got {n!r}")
    _configured = n


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-kernel",
                                       initializer=_mark_worker)
            _pool_size = workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _mark_worker() -> None:
    _inside.worker = True


def _forget_pool_in_child() -> None:
    # a forked child has none of the parent's threads: start a fresh pool when first needed
    global _pool, _pool_size
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _run_chunk(fn, chunk) -> None:
    for item in chunk:
        fn(item)


def run_blocks(fn, blocks, min_blocks: int = 2) -> None:
    """Call `fn(block)` for every block (any order, blocks must touch disjoint outputs).

    With fewer than `min_blocks` blocks, one thread, or when called from a worker, the calls
    run here in order. Otherwise this thread and the workers take the blocks one at a time, in
    order, whichever is free next (see `run_chunks`). The first exception raised by any block is
    raised here after every thread has stopped; once a block has failed no thread takes another.
    """
    run_chunks(lambda chunk: _run_chunk(fn, chunk), blocks, min_blocks)


class _Claims:
    """Blocks handed out one at a time to whichever thread asks next: each thread iterates its
    own `iter(claims)`, and all of them draw from one counter (`next` on an itertools.count is
    atomic under the GIL)."""

    __slots__ = ("blocks", "counter", "failed")

    def __init__(self, blocks):
        self.blocks = blocks
        self.counter = itertools.count()
        self.failed = False

    def __iter__(self):
        blocks, counter, n = self.blocks, self.counter, len(self.blocks)
        while not self.failed:
            i = next(counter)
            if i >= n:
                return
            yield blocks[i]


def _run_claims(fn, claims) -> None:
    try:
        fn(iter(claims))
    except BaseException:
        claims.failed = True
        raise


def run_chunks(fn, blocks, min_blocks: int = 2, own_products: bool = False) -> None:
    """Like `run_blocks`, but `fn(chunk)` is called once per thread with an iterable of the
    blocks that thread takes, so that it can set up scratch space once per thread.

    `own_products`: the blocks make matrix products of their own (attention, convolution).
    While the blocks run on several threads OpenBLAS is then held at one thread
    (`one_blas_thread`), so that each thread makes its own products instead of competing with
    OpenBLAS's threads; run here alone, the products keep all of BLAS's threads.

    The blocks are not cut into fixed runs: a woken worker starts a fraction of a millisecond
    late (a fraction of a millisecond), and with fixed runs this thread would finish
    first and wait for it. This thread starts taking blocks at once, each worker joins as it
    wakes, and a worker that has not started by the time the blocks are all taken is cancelled
    instead of waited for. Which thread works a block changes from call to call, so a kernel's
    arithmetic must not depend on it (every kernel here computes each block on its own)."""
    blocks = list(blocks)
    n = min(num_threads(), len(blocks))
    if n < 2 or len(blocks) < min_blocks or getattr(_inside, "worker", False):
        if blocks:
            fn(blocks)
        return
    if own_products and _BLAS > 1:
        with one_blas_thread():
            _run_shared(fn, blocks, n)
    else:
        _run_shared(fn, blocks, n)


def _run_shared(fn, blocks, n: int) -> None:
    """`run_chunks`'s blocks over this thread and `n - 1` workers."""
    claims = _Claims(blocks)
    pool = _get_pool(n - 1)
    futures = [pool.submit(_run_claims, fn, claims) for _ in range(n - 1)]
    error = None
    # while this thread works its blocks, a kernel called inside one (a copy_into, say) must not
    # hand blocks to the pool: the workers are busy with theirs, and this thread would wait for
    # them instead of working its own
    _inside.worker = True
    try:
        _run_claims(fn, claims)
    except BaseException as exc:  # noqa: BLE001 - re-raised below once the workers are done
        error = exc
    finally:
        _inside.worker = False
    for f in futures:
        if f.cancel():  # still queued: every block is taken (or one failed), nothing to wait for
            continue
        try:
            f.result()
        except BaseException as exc:  # noqa: BLE001
            if error is None:
                error = exc
    if error is not None:
        raise error


def min_blocks(block_bytes: int, cost: int = 1) -> int:
    """How many blocks of `block_bytes` a pass needs before `run_blocks` / `run_chunks` hand
    them to the threads (their `min_blocks`): PARALLEL_MIN_BYTES of data for a streaming pass,
    `cost` times fewer for one that does `cost` times a copy's work per byte (an exp per
    element, say); never fewer than 2. Read at call time, as PARALLEL_MIN_BYTES is."""
    return max(2, PARALLEL_MIN_BYTES // max(1, cost * block_bytes))


def split(n: int, nbytes: int) -> list[slice]:
    """[0, n) as contiguous slices for the threads to take (see `run_chunks`): up to
    PARTS_PER_THREAD per thread, none of under PART_MIN_BYTES of the `nbytes` the work touches,
    so that a worker that wakes late leaves the calling thread more of them instead of being
    waited for; a single slice when `nbytes` is under PARALLEL_MIN_BYTES or there is one thread."""
    threads = num_threads()
    if nbytes < PARALLEL_MIN_BYTES or threads < 2 or n < 2:
        return [slice(0, n)]
    parts = min(n, max(threads, min(threads * PARTS_PER_THREAD, nbytes // PART_MIN_BYTES)))
    per, extra = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + per + (1 if i < extra else 0)
        out.append(slice(lo, hi))
        lo = hi
    return out


def copy_into(dst, src) -> None:
    """`dst[...] = src` (same shape; NumPy), split along axis 0 over the threads: transposing
    copies are latency-bound and gain from a second core."""
    if dst.ndim == 0 or dst.shape[0] < 2:
        dst[...] = src
        return

    def part(s):
        dst[s] = src[s]

    run_blocks(part, split(dst.shape[0], dst.nbytes))


def elementwise(fn, dtype, *arrays):
    """`fn(*arrays, out=out)` for NumPy arrays of one shape, C-contiguous, into a fresh array of
    `dtype`, split into one contiguous run of elements per thread when each array holds at
    least ELEMENTWISE_MIN_BYTES; else simply `fn(*arrays)`. `fn` must be elementwise (each
    output element from the same element of every input)."""
    first = arrays[0]
    nbytes = first.nbytes  # checked first: most calls are small and stop here
    if (nbytes < max(ELEMENTWISE_MIN_BYTES, PARALLEL_MIN_BYTES) or num_threads() < 2
            or not all(isinstance(a, np.ndarray) for a in arrays)
            or any(a.shape != first.shape or not a.flags.c_contiguous for a in arrays)):
        return fn(*arrays)
    out = np.empty(first.shape, dtype=dtype)
    flats = [a.reshape(-1) for a in arrays]
    oflat = out.reshape(-1)

    def part(s):
        fn(*(f[s] for f in flats), out=oflat[s])

    run_blocks(part, split(first.size, nbytes * len(arrays)))
    return out


def blas_threads() -> int:
    """How many threads BLAS (OpenBLAS) was started with: `OPENBLAS_NUM_THREADS`, else
    `OMP_NUM_THREADS`, else the CPUs this process may run on, read once at import as OpenBLAS
    reads them when it loads. Fixed for the process (unlike `num_threads`), so that a kernel
    that shapes its products by it gives the same bits on any number of kernel threads."""
    return _BLAS


# ---------------------------------------------------------------------- one BLAS thread
# Kernels that split their products over the kernel threads (attention, convolution:
# `run_chunks(..., own_products=True)`) hold OpenBLAS at one thread while they run: each kernel
# thread then makes its own products, as PyTorch's kernels do, instead of handing every product
# to OpenBLAS's threads, which would compete with the kernel threads for the same cores and spin
# between calls. The first kernel to enter holds OpenBLAS at one thread, the last to leave
# restores the count it found (with BLAS's threads by size, below: one thread, or OpenBLAS's
# count while a large product runs on another thread).
_blas_lock = threading.Lock()
_blas_users = 0
_blas_saved: int | None = None
_blas_api: list = []  # [(set, get)] once looked up; [None] when there is none


def _numpys_openblas(libs):
    """The one of `libs` (threadpoolctl's OpenBLAS controllers) whose functions NumPy's own
    products call, or None when that cannot be told.

    A process often holds several OpenBLAS copies: NumPy's (numpy.libs), SciPy's (scipy.libs),
    others'. threadpoolctl lists them in an order that changes from process to process (it reads
    their paths from /proc/self/maps into a set, ordered by the process's hash seed), and
    setting the thread count of the wrong one leaves NumPy's at all its threads without a sign.
    That was the engine's "slow processes" at 2 threads (SciPy's copy was taken in about a third
    of processes: benchmarks/TUNING.md). So the library is the one that NumPy's
    core extension module resolves the symbol to: a lookup through a loaded module's handle
    searches that module and the libraries it links, nothing else."""
    alone = libs[0] if len(libs) == 1 else None  # the answer when the lookup cannot be made
    try:
        try:
            from numpy._core import _multiarray_umath as core  # noqa: PLC0415 - NumPy 2
        except ImportError:
            from numpy.core import _multiarray_umath as core  # noqa: PLC0415 - NumPy 1
        handle = ctypes.CDLL(core.__file__)  # already loaded: the same object, nothing runs
        for lib in libs:
            own = lib._get_symbol("openblas_get_num_threads")
            via = getattr(handle, f"{lib._symbol_prefix}openblas_get_num_threads{lib._symbol_suffix}", None)
            if own is not None and via is not None and _address(own) == _address(via):
                return lib
    except (ImportError, OSError, AttributeError):  # AttributeError: a threadpoolctl without these internals
        return alone
    return None


def _address(fn) -> int | None:
    return ctypes.cast(fn, ctypes.c_void_p).value


def _openblas_api():
    """(set_num_threads, get_num_threads) of NumPy's OpenBLAS, found by threadpoolctl (which
    knows the scipy-openblas builds and their symbol prefixes), or None."""
    if not _blas_api:
        api = None
        try:
            from threadpoolctl import ThreadpoolController  # noqa: PLC0415

            libs = ThreadpoolController().select(user_api="blas", internal_api="openblas").lib_controllers
            lib = _numpys_openblas(libs)
            if lib is not None:
                api = (lib.set_num_threads, lib.get_num_threads)
                # the C functions themselves when threadpoolctl finds them: a hold then costs half
                # of what it does through its Python wrappers (kernels hold it per call)
                raw_set = lib._get_symbol("openblas_set_num_threads")
                raw_get = lib._get_symbol("openblas_get_num_threads")
                if raw_set is not None and raw_get is not None:
                    api = (raw_set, raw_get)
        except Exception:  # noqa: BLE001 - no usable controller: the products run whole
            api = None
        _blas_api.append(api)
    return _blas_api[0]


class one_blas_thread:  # noqa: N801 - used as a function: `with one_blas_thread():`
    """While inside, OpenBLAS runs each call on the calling thread (a no-op when it cannot)."""

    def __enter__(self):
        global _blas_users, _blas_saved
        api = _openblas_api()
        if api is None:
            return self
        if not _by_size_checked:
            blas_threads_by_size()
        with _blas_lock:
            if _by_size:
                _blas_users += 1
                _set_blas_count_locked(api)
                return self
            if _blas_users == 0:
                _blas_saved = int(api[1]())
                if _blas_saved > 1:
                    api[0](1)
            _blas_users += 1
        return self

    def __exit__(self, *exc):
        global _blas_users
        api = _openblas_api()
        if api is None:
            return False
        with _blas_lock:
            _blas_users -= 1
            if _by_size:
                _set_blas_count_locked(api)
                return False
            if _blas_users == 0 and _blas_saved is not None and _blas_saved > 1:
                api[0](_blas_saved)
        return False


def one_blas_thread_possible() -> bool:
    """Whether a kernel can hold OpenBLAS at one thread while its blocks run."""
    return _openblas_api() is not None


# ---------------------------------------------------------------------- BLAS's threads by size
# After every call that it splits over its threads, OpenBLAS's workers spin before they sleep
# (2**20 clock ticks with the setting `engine` makes, 2**28 - a tenth of a second - without).
# A small product split that way (a classifier head, batch norm's sums, a bias gradient) leaves
# a worker spinning on the core the engine's kernel threads need next, and the two share it
# for the rest of the step, a slowdown of several times at random from process to process.
# So once the engine makes its first
# product, it sets OpenBLAS to one thread, and only a product of at least
# BLAS_THREADED_MIN_WORK multiply-adds raises it to OpenBLAS's count for that call (`matmul`):
# there the split saves far more than the spin costs. Kernels that make their own products on
# the kernel threads hold one thread as before (`one_blas_thread`). Small products split by
# OpenBLAS are what leave its worker spinning, so the bar sits where a product's split starts
# to pay (OpenBLAS itself runs a product under 2^18 multiply-adds on one thread).
BLAS_THREADED_MIN_WORK = 1 << 20
# ... counted per product that OpenBLAS makes: np.matmul makes one call per item of a batched
# product, and a product whose output is small (a weight gradient of a d-32 layer: [32, 2048] @
# [2048, 32]) is split by OpenBLAS over the output, so a second thread only adds its wake-up.
# So a product is raised when each item makes at least
# BLAS_THREADED_MIN_WORK multiply-adds into at least BLAS_THREADED_MIN_OUT outputs.
BLAS_THREADED_MIN_OUT = 1 << 12
_by_size = False    # OpenBLAS held at one thread but for large products (`blas_threads_by_size`)
_by_size_checked = False
_blas_raised = 0    # large products running now with OpenBLAS's threads


def _set_blas_count_locked(api) -> None:
    """With BLAS's threads by size, set OpenBLAS to the count its users call for (under
    _blas_lock): its own while a large product runs (`matmul`) and no kernel holds one thread
    (`one_blas_thread`), else one. Set every time, so a count changed behind the engine's back
    does not last past the next hold or large product."""
    api[0](_BLAS if _blas_raised and not _blas_users else 1)


def blas_threads_by_size() -> bool:
    """Whether the engine runs OpenBLAS at one thread but for its large products (see
    `matmul`). Decided at the engine's first product: yes when OpenBLAS was started with
    several threads, its count can be set, and `EMBER_BLAS_THREADS` is not `all` (`all`:
    every call keeps OpenBLAS's own setting, for a process whose own NumPy code needs it)."""
    global _by_size, _by_size_checked
    if not _by_size_checked:
        with _blas_lock:
            if not _by_size_checked:
                keep = os.environ.get("EMBER_BLAS_THREADS", "").strip().lower() == "all"
                api = _openblas_api() if _BLAS > 1 and not keep else None
                if api is not None and _blas_users == 0:
                    api[0](1)
                    _by_size = True
                _by_size_checked = True
    return _by_size


def matmul(a, b, out=None):
    """`np.matmul(a, b, out=out)` for NumPy arrays (their own module's matmul for others: CuPy's
    products are its own). With OpenBLAS at one thread (`blas_threads_by_size`), a product whose every matrix
    makes at least BLAS_THREADED_MIN_WORK multiply-adds into at least BLAS_THREADED_MIN_OUT
    outputs gets OpenBLAS's threads for the call, unless a kernel holds one thread or this is a
    kernel thread (their products are their own). The products that run on one thread are
    MKL's where `engine.tensor.cpu.mkl` is active (the `mkl` extra on an Intel CPU)."""
    global _blas_raised
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return a @ b if out is None else _module_of(a, b).matmul(a, b, out=out)
    if not _by_size_checked:
        blas_threads_by_size()
    if not _by_size:
        # OpenBLAS keeps its own count: one thread in a one-thread process (MKL may take the
        # product), OpenBLAS's threads otherwise (EMBER_BLAS_THREADS=all, or no way to set them)
        return _mkl.matmul(a, b, out) if _BLAS == 1 else np.matmul(a, b, out=out)
    if (a.ndim < 2 or b.ndim < 2 or getattr(_inside, "worker", False) or _blas_users
            or a.shape[-2] * b.shape[-1] < BLAS_THREADED_MIN_OUT
            or a.shape[-2] * a.shape[-1] * b.shape[-1] < BLAS_THREADED_MIN_WORK):
        return _mkl.matmul(a, b, out)  # a product on one thread
    api = _blas_api[0]
    with _blas_lock:
        _blas_raised += 1
        _set_blas_count_locked(api)
    try:
        return np.matmul(a, b, out=out)
    finally:
        with _blas_lock:
            _blas_raised -= 1
            _set_blas_count_locked(api)


def _module_of(a, b):
    """The array module of a product's operands that are not both NumPy's (CuPy's)."""
    other = b if isinstance(a, (np.ndarray, np.generic)) else a
    if isinstance(other, (np.ndarray, np.generic)):
        return np
    return importlib.import_module(type(other).__module__.partition(".")[0])


_DEFAULT = _from_environment()
_BLAS = _from_environment(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"))  # as OpenBLAS reads them
