"""Compiled CPU kernels (numba) for the passes NumPy can only make one array pass at a time.

NumPy runs an elementwise chain as one pass over memory per operation: exact Gelu is ~25
passes and an `exp`, a layer norm's forward and backward a dozen, a softmax cross entropy's
forward five. The kernels in `_kernels` make each of those chains one or two passes, the
whole computation of an element (or a row) in registers. They are what the engine uses on
NumPy for float32 whenever numba imports; the NumPy code stays beside each as the reference
the tests compare against and as the path taken without numba or with `EMBER_JIT=0`.

Compilation: the first `kernels()` call imports `_kernels` (and `_kernels_conv`), whose functions are compiled
for their one signature each, or loaded from numba's on-disk cache (`__pycache__` beside the
module, or numba's user cache directory when that is read-only): seconds the first time on a
machine, about a second from the cache (`benchmarks/jit_compile.py`; benchmarks/TUNING.md).
The call blocks the thread that makes it, so the app warms the kernels up on a background
thread at start (`warm_up`), and all model work already runs on worker threads.

Every kernel releases the GIL (`nogil`), so the engine's kernel threads (`threads.run_chunks`)
run its blocks in parallel; a kernel computes each block on its own, so the bits do not depend
on which thread took it.
"""
from __future__ import annotations

import os
import sys
import threading

__all__ = ["kernels", "enabled", "set_enabled", "unavailable_reason", "warm_up", "ENV"]

ENV = "EMBER_JIT"  # "0": never use the compiled kernels (the NumPy paths run instead)

_lock = threading.Lock()
_module = None
_failure: str | None = None
_enabled = os.environ.get(ENV, "1").strip() != "0"


def enabled() -> bool:
    """Whether the engine uses the compiled kernels (numba importable and not switched off)."""
    return _enabled and kernels() is not None


def set_enabled(on: bool) -> bool:
    """Switch the compiled kernels on or off for this process (the tests compare both paths);
    returns the previous setting."""
    global _enabled
    old, _enabled = _enabled, bool(on)
    return old


def kernels():
    """The compiled kernels' module, or None when they are switched off or numba is missing
    (then the callers take their NumPy paths). Compiles (or loads) them on the first call."""
    if not _enabled:
        return None
    mod = _module
    if mod is not None or _failure is not None:
        return mod
    return _load()


def _load():
    global _module, _failure
    with _lock:
        if _module is None and _failure is None:
            if getattr(sys, "frozen", False) and not os.environ.get("NUMBA_CACHE_DIR"):
                # a bundled app has no writable __pycache__ beside the module: a user cache folder
                os.environ["NUMBA_CACHE_DIR"] = os.path.join(os.path.expanduser("~"), ".cache", "ember", "numba")
            try:
                from . import _kernels  # noqa: PLC0415 - numba is imported only when used
            except ImportError as exc:  # numba not installed, or one too old for this NumPy
                _failure = f"numba unavailable: {exc}"
            except Exception as exc:  # noqa: BLE001 - a compile or cache failure: the NumPy paths run
                _failure = f"the compiled kernels failed to build: {type(exc).__name__}: {exc}"
            else:
                _module = _kernels
    return _module


def unavailable_reason() -> str | None:
    """Why the compiled kernels are not in use, or None when they are."""
    if not _enabled:
        return f"switched off ({ENV}=0 or set_enabled(False))"
    kernels()
    return _failure


def warm_up() -> threading.Thread:
    """Compile or load the kernels on a daemon thread (the app calls this at start, so the first
    training step does not wait for them on its worker); returns the thread."""
    t = threading.Thread(target=kernels, name="ember-jit-warm-up", daemon=True)
    t.start()
    return t
