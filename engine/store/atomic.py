"""Atomic file replacement: a save that fails or is killed leaves the old file intact.

The new contents go to a temporary file beside the target (same directory, so the same file
system), are flushed and fsync'ed, and only then `os.replace`d onto the target, which POSIX
makes atomic; the directory is fsync'ed afterwards so the rename itself survives a crash.
A reader therefore sees either the old file or the complete new one, never a mix. A process
killed mid-write leaves a stray `.<name>.<pid>.*.tmp` file and the target untouched; the next
save of the same target removes such a file once it is STALE_TEMP_S old and no process with
its pid is alive on this machine (never on Windows, where probing a pid is not harmless).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from .errors import RecordError


STALE_TEMP_S = 600.0  # a temporary file untouched this long, whose writer is gone, is removed


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


def remove_stale_temps(directory: Path, name: str, now: float | None = None) -> list[Path]:
    """Remove the temporary files that killed saves of `directory/name` left behind: those
    named `.<name>.<pid>.<random>.tmp` whose process is gone and which nobody has written to
    for STALE_TEMP_S seconds. Returns the files removed; errors are ignored (best effort)."""
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
        if not (dot and rest and pid.isdigit()):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_TEMP_S or _alive(int(pid)):
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
        with os.fdopen(fd, "wb") as fp:  # buffered: loops over partial writes
            write(fp)
            fp.flush()
            os.fsync(fp.fileno())
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)
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
