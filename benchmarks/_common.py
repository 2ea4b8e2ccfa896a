"""Shared helpers for the benchmark scripts: timing, tables, optional peers."""
from __future__ import annotations

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STABLE_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": "268435456",
    "MALLOC_TRIM_THRESHOLD_": "1073741824",
    "MALLOC_TOP_PAD_": "268435456",
}


THREAD_VARS = ("EMBER_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def threads_from_argv(argv=None) -> int | None:
    """A script's `--threads N`: pins the engine's kernels, NumPy's BLAS and PyTorch to N threads
    through the environment, and returns N (None without the option). Call it before NumPy loads:
    OpenBLAS reads its variable once. This module imports no NumPy."""
    argv = sys.argv if argv is None else argv
    if "--threads" not in argv:
        return None
    n = int(argv[argv.index("--threads") + 1])
    for var in THREAD_VARS:
        os.environ[var] = str(n)
    return n


def malloc_note() -> str:
    ok = all(os.environ.get(k) == v for k, v in STABLE_MALLOC.items())
    return "stable malloc settings on" if ok else "default malloc (set MALLOC_*_ for stable numbers)"


def torch_or_none():
    try:
        import torch  # noqa: PLC0415

        torch.set_num_threads(os.cpu_count() or 1)
        return torch
    except Exception:
        return None


def timeit(fn, *, min_time=0.5, warmup=3, repeat=5):
    """Best-of-`repeat` mean seconds per call, each repeat running at least `min_time / repeat`."""
    for _ in range(warmup):
        fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time / repeat or n >= 1 << 20:
            break
        n *= 2
    best = dt / n
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def alternate(fns: dict, *, rounds: int = 5, min_time: float = 0.5, warmup: int = 2) -> dict:
    """{name: fn or None} -> {name: best seconds per call, or None}, the functions timed in
    turn over `rounds` rounds. On a shared machine background load then hits every side alike,
    and each keeps its best round (load only ever adds time)."""
    best: dict = {k: None for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            if fn is None:
                continue
            t = timeit(fn, min_time=min_time, warmup=warmup, repeat=1)
            best[k] = t if best[k] is None else min(best[k], t)
    return best


@dataclass
class Paired:
    """One side of a paired comparison (see `paired`): seconds per call and ratios to the base."""

    best: float  # the fastest block's seconds per call
    median: float  # the median block's seconds per call
    ratio: float  # median over blocks of (this block / the base's block of the same set)
    ratio_q1: float
    ratio_q3: float
    times: list  # seconds per call of each block, in set order


def paired(fns: dict, base: str, *, blocks: int = 150, calls: int = 10, warmup: int = 3,
           settle: float = 0.0, clock=time.perf_counter, sleep=time.sleep, seed: int = 0) -> dict:
    """{name: fn} -> {name: Paired}, every ratio taken against the side named `base`.

    The sides run in short blocks of `calls` calls, one block each per set, in an order
    shuffled from set to set (with a fixed seed): a side that leaves the machine busy after it
    returns, as PyTorch's spinning worker threads do, then slows a random side instead of
    always the same one (rotating a fixed order would keep the same successor); a `settle`
    pause before every block lets such threads go idle, so that every block starts from the
    same quiet machine. A block is compared with the base's block of the same set, a fraction of
    a second apart, so that this VM's drift in speed (it changes over seconds) hits both sides
    of a ratio alike; the median over the sets is the ratio reported. The best block is kept
    too, as `alternate` reports it."""
    if base not in fns:
        raise KeyError(f"paired: the base {base!r} is not one of the sides {list(fns)}")
    names = list(fns)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {k: [] for k in names}
    order = list(names)
    shuffle = random.Random(seed).shuffle
    for _ in range(blocks):
        shuffle(order)
        for k in order:
            fn = fns[k]
            if settle:
                sleep(settle)
            t0 = clock()
            for _ in range(calls):
                fn()
            times[k].append((clock() - t0) / calls)
    out = {}
    for k in names:
        ratios = [t / tb for t, tb in zip(times[k], times[base])]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        out[k] = Paired(min(times[k]), statistics.median(times[k]), statistics.median(ratios), q1, q3, times[k])
    return out


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {malloc_note()}"


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU as the reports name it: its model name, family, model and vector width from
    /proc/cpuinfo (`AMD EPYC (family 26 model 2, AVX-512)`: the model name alone does not tell a
    Zen 3 from a Zen 5, whose BLAS kernels differ 2x), else what `platform` knows. `cpuinfo`:
    that file's text (for the tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():  # the first processor's block
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    detail = [f"family {fields['cpu family']} model {fields['model']}"] if "cpu family" in fields and "model" in fields else []
    detail += [isa] if isa else []
    return f"{name} ({', '.join(detail)})" if detail else name


OPENBLAS_FORCING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def openblas_kernels(environ=None) -> str:
    """Which kernels NumPy's OpenBLAS runs (threadpoolctl's `architecture` of the copy NumPy
    calls, found as the engine finds it), and the OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE that
    force them when the environment sets them: an image that pins older kernels halves float32
    products on an AVX-512 CPU, and a report must say which it measured. Imports the engine."""
    environ = os.environ if environ is None else environ
    forced = ", ".join(f"{k}={environ[k]}" for k in OPENBLAS_FORCING if k in environ)
    try:
        import threadpoolctl  # noqa: PLC0415

        from engine.tensor.cpu import threads  # noqa: PLC0415

        libs = threadpoolctl.ThreadpoolController().select(internal_api="openblas").lib_controllers
        lib = threads._numpys_openblas(libs)
        arch = getattr(lib, "architecture", None) if lib is not None else None
    except Exception:  # noqa: BLE001 - a report line, never a failure
        arch = None
    line = f"OpenBLAS kernels (NumPy's copy): {arch or 'unknown'}"
    return line + (f", forced by {forced} in the environment" if forced else ", as OpenBLAS chose them for this CPU")


def blas_line() -> str:
    """Which BLAS makes the engine's products (engine.tensor.cpu.mkl.describe). Imports the engine."""
    try:
        from engine.tensor.cpu import mkl  # noqa: PLC0415

        return "Products: " + mkl.describe()
    except Exception as exc:  # noqa: BLE001 - a report line, never a failure
        return f"Products: unknown ({exc})"


def machine_line() -> str:
    """The `Machine: ...` line the scripts print first: CPU, cores, Python, NumPy, its OpenBLAS
    kernels, malloc."""
    import numpy as np  # noqa: PLC0415  (callers import the engine first)

    return (f"Machine: {cpu_name()}, {os.cpu_count()} logical cores, {platform.machine()}, Python "
            f"{platform.python_version()}, NumPy {np.__version__}, {openblas_kernels()}, {blas_line()}, {malloc_note()}")


def rss_mib() -> float:
    """This process's resident memory, MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---------------------------------------------------------------- a peer in another Python
def oracle_python(modules=("torch", "transformers")):
    """(python, versions) of the first Python that imports `modules`: this one, else the one
    `EMBER_ORACLE_PYTHON` names (a venv holding torch, transformers, peft); None if neither."""
    candidates = [sys.executable] + ([os.environ["EMBER_ORACLE_PYTHON"]] if os.environ.get("EMBER_ORACLE_PYTHON")
                                     else [])
    code = f"import {', '.join(modules)}; print({', '.join(m + '.__version__' for m in modules)})"
    for py in candidates:
        try:
            proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return py, proc.stdout.strip()
    return None


def child_env(threads: int) -> dict:
    """The environment of one side's fresh process: `threads` for Ember, BLAS, OpenMP and MKL,
    the repository on the path, the Hugging Face libraries quiet and offline."""
    env = dict(os.environ)
    env.update({"EMBER_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
                "OPENBLAS_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"})
    return env


def run_side(py: str, code: str, args: list[str], threads: int, *, timeout: float = 900, stderr: bool = False):
    """Run `code` in a fresh `py` process; its last stdout line parsed as JSON (or its stderr,
    for a profile, with `stderr=True`)."""
    proc = subprocess.run([py, "-c", code, *args], capture_output=True, text=True, env=child_env(threads),
                          cwd=str(ROOT), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{py} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    if stderr:
        return proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- does the host give two cores?
# On these VMs the two vCPUs do not always get two cores' worth from the host: a plain
# two-thread OpenBLAS product that ran at 181 GFLOPS (1.9x one thread) in one process ran at
# 93 GFLOPS (1.0x) in another a few minutes later, on an idle guest. The 2-thread rows of a
# stretch like that say more about the host than about either side, so the report says when.
TWO_CORE_SHAPE = (4096, 256, 1024)  # m, k, n: ~2.1 GFLOP a product, ~12 ms on 2 Zen 3 cores
TWO_CORE_MIN_SPEEDUP = 1.6  # below this the second core was not really there
_TWO_CORE_CODE = """
import sys, time
import numpy as np
m, k, n, reps = (int(v) for v in sys.argv[1:5])
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
out = np.empty((m, n), dtype=np.float32)
for _ in range(3):
    np.matmul(a, b, out=out)
times = []
for _ in range(reps):
    t = time.perf_counter()
    np.matmul(a, b, out=out)
    times.append(time.perf_counter() - t)
times.sort()
print(2.0 * m * k * n / times[len(times) // 2] / 1e9)
"""


def two_core_check(shape=TWO_CORE_SHAPE, reps: int = 15, run=None) -> tuple[float, float]:
    """(GFLOPS at 1 thread, GFLOPS at 2 threads) of one float32 product, each in a fresh
    process (`run_side`: OpenBLAS reads its thread count at start-up), the median of `reps`
    calls. `run(threads, argv) -> GFLOPS` replaces the processes (tests)."""
    run = run or (lambda threads, argv: run_side(sys.executable, _TWO_CORE_CODE, argv, threads, timeout=120))
    argv = [str(v) for v in (*shape, reps)]
    return float(run(1, argv)), float(run(2, argv))


def two_core_verdict(one: float, two: float, shape=TWO_CORE_SHAPE) -> str:
    """The check as a line of the report, flagged when 2 threads got less than
    TWO_CORE_MIN_SPEEDUP times one thread's throughput."""
    speedup = two / one if one > 0 else 0.0
    m, k, n = shape
    line = (f"one float32 product {m}×{k} @ {k}×{n}: 1 thread {one:.0f} GFLOPS, 2 threads {two:.0f} GFLOPS "
            f"({speedup:.2f}× one thread)")
    if speedup < TWO_CORE_MIN_SPEEDUP:
        line += (f" — **under {TWO_CORE_MIN_SPEEDUP}×: the host gave less than two cores' worth, so 2-thread "
                 "figures measured around now are not representative**")
    return line


def two_core_line(shape=TWO_CORE_SHAPE, **kw) -> str:
    """`two_core_verdict(*two_core_check())`, or why the check could not run."""
    try:
        return two_core_verdict(*two_core_check(shape, **kw), shape=shape)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        return f"not measured ({e})"
