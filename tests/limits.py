"""Resource limits for tests that must fail fast instead of filling the machine's memory."""
from __future__ import annotations

import contextlib
import resource


@contextlib.contextmanager
def address_space_growth_limit(extra: int):
    """Within the block the process may grow its address space by `extra` bytes at most: code
    that tries to allocate what a file claims, or a regression that allocates a 7 B model,
    fails with MemoryError instead of filling memory."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


FUZZ_HEADROOM = 512 * 1024 * 1024  # the file readers' fuzz tests: far above what one case needs


def capped_memory():
    """The address space capped FUZZ_HEADROOM above its size now: a file reader that allocated
    from a size it did not check fails the fuzz case with MemoryError."""
    return address_space_growth_limit(FUZZ_HEADROOM)
