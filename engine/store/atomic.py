"""Atomic file replacement: a save that fails or is killed leaves the old file intact.

The new contents go to a temporary file beside the target (same directory, so the same file
system), are flushed and fsync'ed, and only then `os.replace`d onto the target, which POSIX
makes atomic; the directory is fsync'ed afterwards so the rename itself survives a crash.
A reader therefore sees either the old file or the complete new one, never a mix. A process
killed mid-write leaves at most a stray `.<name>.*.tmp` file; the target is untouched.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import RecordError


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
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
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
