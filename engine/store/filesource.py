"""Reading tensors from a file so that nothing depends on the file afterwards.

The rule: **a loaded record never depends on the file afterwards.** `ModuleRecord.load` reads
every tensor into memory that it owns (one `read` per tensor, straight into a preallocated
NumPy array, as `safetensors.numpy.load_file` does), then closes the file. Rewriting the file
in place (`cp other.bpk model.bpk`, `rsync --inplace`), truncating or deleting it changes
nothing in a loaded record or in a module that loaded it.

Nothing here memory-maps a file. A mapping stays tied to the file: even a private
(copy-on-write) mapping shows later writes to the file in every page not yet written to, and
touching a page past the end of a file that was truncated kills the process with SIGBUS,
which no `try` can catch.

`FileSource` is the one primitive for reading a file's byte ranges, also later, lazily (a
pretrained checkpoint of many GB that must not be read up front can keep a `FileSource` open
and read each tensor at its first use):

    with FileSource(path) as src:                 # opens, records size / mtime / inode
        head = src.read_bytes(0, 16)
        w = src.read_array(4096, np.float32, 1024)   # a new, owned, aligned array

- Each read uses `os.preadv` (position-independent, safe from several threads) into the
  destination buffer, with no mapping and no intermediate copy.
- Before and after every read the open file's identity (device, inode, size, mtime_ns) is
  compared with what it was when opened; any difference, or a read that comes up
  short, raises `RecordError("the file changed since it was opened ...")`, never a crash.
- The source holds the file open, so a save that *replaces* the path (an atomic save, which
  renames a new file over it) does not disturb it: the source keeps reading the file it opened,
  which has not changed. Only changes to that file itself are errors.
- Limits of the check: it sees what `stat` sees. Timestamps have the kernel's granularity (a
  few milliseconds on Linux), so a rewrite to the same size within that time after the
  file's previous modification cannot be told apart; a file read lazily long after it was
  written is always covered.

`numpy_shape_problem(shape, itemsize)` says why NumPy could not hold an array of a shape
(rank above 64, a dimension or a byte count beyond 2**63 - 1) before anything is allocated or
reshaped; the readers call it on every header.
"""
from __future__ import annotations

import os
import stat
import threading

import numpy as np

from ..tensor.cpu import run_blocks
from .errors import RecordError

__all__ = ["FileSource", "MAX_DIMS", "MAX_INTP", "numpy_shape_problem"]

MAX_DIMS = 64            # NumPy 2's NPY_MAXDIMS
MAX_INTP = 2 ** 63 - 1   # the largest dimension and byte count NumPy can index (64-bit intp)

SMALL_READ = 256 * 1024  # tensors below this are read together with their neighbours ...
CHUNK = 1024 * 1024      # ... in chunks of at most this many bytes
MAX_GAP = 4096           # bytes between two tensors that a chunk may read over and drop
PIECE = 8 * 1024 * 1024  # large tensors are read in pieces of this size, shared out over threads
PARALLEL_BYTES = 16 * 1024 * 1024  # below this, one thread reads everything


def numpy_shape_problem(shape, itemsize: int) -> str | None:
    """Why NumPy cannot hold an array of `shape` with elements of `itemsize` bytes, or None.

    NumPy refuses more than 64 axes, any dimension above 2**63 - 1, and shapes whose non-zero
    dimensions times the item size exceed 2**63 - 1, even when one dimension is 0 (so the
    array would hold no bytes at all). Computed in Python integers: nothing overflows."""
    if len(shape) > MAX_DIMS:
        return f"{len(shape)} axes, NumPy holds at most {MAX_DIMS}"
    nonzero = 1
    for axis, d in enumerate(shape):
        if d > MAX_INTP:
            return f"dimension {d} (axis {axis}) exceeds NumPy's limit of {MAX_INTP}"
        if d:
            nonzero *= d
    if nonzero * itemsize > MAX_INTP:
        return (f"its non-zero dimensions times the item size ({itemsize} bytes) make "
                f"{nonzero * itemsize} bytes, more than NumPy's limit of {MAX_INTP}")
    return None


def _identity(st) -> tuple:
    # not ctime: renaming another file over the path or deleting it changes the open file's
    # ctime (its link count), not its contents
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FileSource:
    """A regular file opened read-only, whose identity is checked around every read.

    `where` names the file in errors (default: the path). Use as a context manager or call
    `close()`; reading a closed source raises RecordError."""

    def __init__(self, path, where: str | None = None):
        self.path = os.fspath(path)
        self.where = str(self.path) if where is None else where
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise RecordError("no such file", where=self.where) from None
        except OSError as exc:
            raise RecordError(f"cannot read: {exc.strerror or exc}", where=self.where) from None
        if stat.S_ISDIR(st.st_mode):
            raise RecordError("is a folder, not a file", where=self.where)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError("a regular file expected, found a device, pipe or socket", where=self.where)
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise RecordError(f"cannot read: {exc.strerror or exc}", where=self.where) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
                raise RecordError("a regular file expected", where=self.where)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._identity = _identity(st)
        self.size = st.st_size
        self._lock = None if hasattr(os, "preadv") else threading.Lock()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __enter__(self) -> "FileSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def __repr__(self) -> str:
        return f"FileSource({self.where!r}, {self.size} bytes{', closed' if self.closed else ''})"

    # ------------------------------------------------------------------ checks
    def _changed(self, detail: str) -> RecordError:
        return RecordError(f"the file changed since it was opened ({detail}); it was "
                           f"{self.size} bytes then; load it again", where=self.where)

    def check(self) -> None:
        """Raise RecordError if the open file is no longer the one that was opened."""
        if self._fd is None:
            raise RecordError("the file source is closed", where=self.where)
        try:
            now = _identity(os.fstat(self._fd))
        except OSError as exc:
            raise self._changed(f"cannot stat it: {exc.strerror or exc}") from None
        if now != self._identity:
            if now[2] != self._identity[2]:
                detail = f"it now has {now[2]} bytes"
            else:
                detail = "it was modified"
            raise self._changed(detail)

    # ------------------------------------------------------------------ reads
    def _fill(self, view: memoryview, offset: int) -> None:
        """Fill the byte view from `offset`, checking the identity before and after."""
        n = len(view)
        if offset < 0 or offset + n > self.size:
            raise RecordError(f"bytes [{offset}, {offset + n}) requested, the file has {self.size}",
                              where=self.where)
        self.check()
        done = 0
        try:
            if self._lock is None:
                while done < n:
                    got = os.preadv(self._fd, [view[done:]], offset + done)
                    if got <= 0:
                        break
                    done += got
            else:  # no pread (Windows): one seek + readinto at a time
                with self._lock:
                    with os.fdopen(os.dup(self._fd), "rb", buffering=0) as f:
                        f.seek(offset)
                        while done < n:
                            got = f.readinto(view[done:])
                            if not got:
                                break
                            done += got
        except OSError as exc:
            raise self._changed(f"reading bytes [{offset}, {offset + n}) failed: {exc.strerror or exc}") from None
        if done < n:
            self.check()  # a truncation shows here first
            raise self._changed(f"{n} bytes expected at offset {offset}, found {done}")
        self.check()

    def read_into(self, buffer, offset: int) -> None:
        """Fill a writable contiguous buffer (bytearray, NumPy array, memoryview) with the file's
        bytes from `offset`."""
        view = memoryview(buffer)
        if view.readonly:
            raise TypeError("read_into needs a writable buffer")
        self._fill(view.cast("B") if view.ndim != 1 or view.format != "B" else view, offset)

    def read_bytes(self, offset: int, n: int) -> bytes:
        """`n` bytes from `offset` (fewer only when the file is shorter: a reader of a header
        then reports the truncation itself)."""
        n = max(0, min(n, self.size - offset))
        buf = bytearray(n)
        if n:
            self._fill(memoryview(buf), offset)
        return bytes(buf)

    def read_array(self, offset: int, dtype, count: int) -> np.ndarray:
        """A new, owned, aligned 1-D array of `count` elements of `dtype` read from `offset`."""
        arr = np.empty(count, dtype=dtype)
        if arr.nbytes:
            self._fill(memoryview(arr.view(np.uint8)), offset)
        return arr

    def read_arrays(self, spans) -> list[np.ndarray]:
        """Arrays for a list of (offset, dtype, count), in that order, each a new owned array.

        Large ranges are read straight into their arrays, in pieces shared out over the
        engine's threads (`engine.set_num_threads`; `os.preadv` releases the GIL, and a second
        core copies from the page cache alongside the first); runs of small neighbouring
        ranges are read in one call and copied out, so that a file of many small tensors costs
        few system calls. Ranges must not overlap."""
        spans = [(int(off), np.dtype(dt), int(count)) for off, dt, count in spans]
        out: list[np.ndarray | None] = [None] * len(spans)
        order = sorted(range(len(spans)), key=lambda i: spans[i][0])
        jobs: list[tuple] = []   # (file offset, destination byte view) or (first, end, [indices])
        run: list[int] = []      # indices of small neighbouring spans, read as one chunk
        run_end = 0
        total = 0

        def close_run():
            if run:
                jobs.append((spans[run[0]][0], run_end, list(run)))
                run.clear()

        for i in order:
            off, dt, count = spans[i]
            nbytes = dt.itemsize * count
            total += nbytes
            if nbytes >= SMALL_READ:
                close_run()
                arr = out[i] = np.empty(count, dt)
                view = memoryview(arr.view(np.uint8))
                for start in range(0, nbytes, PIECE):
                    jobs.append((off + start, view[start:start + PIECE]))
                continue
            if run and (off - run_end > MAX_GAP or off + nbytes - spans[run[0]][0] > CHUNK):
                close_run()
            run.append(i)
            run_end = max(run_end, off + nbytes) if len(run) > 1 else off + nbytes
        close_run()

        def do(job):
            if len(job) == 2:
                self._fill(job[1], job[0])
                return
            first, end, members = job
            chunk = np.empty(end - first, np.uint8)
            if chunk.nbytes:
                self._fill(memoryview(chunk), first)
            for k in members:
                off, dt, count = spans[k]
                out[k] = chunk[off - first: off - first + dt.itemsize * count].view(dt).copy()

        if total >= PARALLEL_BYTES and len(jobs) > 1:
            run_blocks(do, jobs)
        else:
            for job in jobs:
                do(job)
        return out  # type: ignore[return-value]
