"""Atomic file replacement: a save that fails or is killed leaves the old file intact.

The new contents go to a temporary file beside the target (same directory, so the same file
system), are flushed and fsync'ed, and only then `os.replace`d onto the target, which POSIX
makes atomic; the directory is fsync'ed afterwards so the rename itself survives a crash.
A reader therefore sees either the old file or the complete new one, never a mix.

A process killed mid-write leaves a stray `.<name>.<pid>.<random>.tmp` file and the target
untouched. The writer holds an exclusive `flock` on its temporary file until the file has its
final name; the kernel drops the lock when the process dies. The next save of the same target
removes a stray at once when its lock is free and no process with its pid is alive on this
machine; when the pid is alive (the writer, or an unrelated process that reused the pid) but
the lock is free, after STALE_TEMP_S seconds without a write. A locked file (a save in
progress) is never removed. Where there are no locks (Windows, some network file systems) the
pid and age rules alone decide; Windows also refuses to delete a file that is still open.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from .errors import RecordError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


STALE_TEMP_S = 600.0  # a temporary file of a live pid, unlocked and untouched this long, is removed


def _alive(pid: int) -> bool:
    if os.name == "nt" or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # exists, but belongs to someone else
        return True
    return True


def _lock(fd: int) -> None:
    """The writer's exclusive lock on its temporary file, held until the file has its final
    name (released by the kernel when the process dies, however it dies)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without locks: the pid and age rules still apply
            pass


def _writer_holds_lock(path: str) -> bool | None:
    """True when some process holds the lock of a temporary file (a save in progress), False
    when nobody does, None when this cannot be told (no locks here)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also drops the shared lock just taken
    return False


def remove_stale_temps(directory: Path, name: str, now: float | None = None) -> list[Path]:
    """Remove the temporary files that killed saves of `directory/name` left behind, those
    named `.<name>.<pid>.<random>.tmp`:

    - a file whose lock a process holds is a save in progress: kept, whatever its age;
    - otherwise, when no process with its pid is alive on this machine, its writer is gone:
      removed at once;
    - otherwise (the pid is alive: the writer, or another process that reused its pid) it is
      removed once nobody has written to it for STALE_TEMP_S seconds.

    Returns the files removed; errors are ignored (best effort)."""
    prefix = f".{name}."
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        n = entry.name
        if not (n.startswith(prefix) and n.endswith(".tmp")):
            continue
        pid, dot, rest = n[len(prefix):-len(".tmp")].partition(".")
        if not (dot and rest and pid.isdigit() and int(pid) > 0):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            if _writer_holds_lock(entry.path):
                continue
            if _alive(int(pid)) and now - entry.stat(follow_symlinks=False).st_mtime < STALE_TEMP_S:
                continue
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _file_mode(target: Path) -> int:
    try:
        return os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path, write, error=RecordError) -> Path:
    """Call `write(fp)` on a temporary binary file beside `path`, then move it into place.

    A missing folder raises `error` (RecordError for checkpoints; callers saving other files
    pass their own error type)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise error(f"cannot save to {target}: the folder {directory} does not exist")
    remove_stale_temps(directory, target.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        _lock(fd)
        with os.fdopen(fd, "wb") as fp:  # buffered: loops over partial writes
            write(fp)
            fp.flush()
            os.fsync(fp.fileno())
            os.chmod(tmp, _file_mode(target))
            if fcntl is not None:
                os.replace(tmp, target)  # still open and locked: no cleaner takes it for a stray
        if fcntl is None:
            os.replace(tmp, target)  # Windows cannot rename an open file
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return target
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
    return target


def atomic_write_text(path, text: str, error=OSError) -> Path:
    """Atomically replace `path` with UTF-8 `text` (project and design files)."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda fp: fp.write(data), error=error)
