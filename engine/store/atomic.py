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

A save of several files that must take effect together (a Hugging Face folder: config.json,
the weights, the tokenizer files; a PEFT adapter: its config and its tensors; a training-script
export with its sub-folders) uses `save_folder(folder, write, owned)` (a sub-folder the save
writes replaces the old one of that name, as a file does, when `owned` claims the name):

1. `write(staging)` writes the new files into a fresh private folder beside `folder` (its
   parent, so the same file system), `.<name>.<pid>.<random>.save.d`; each file is fsync'ed;
2. the entries of `folder` that are not part of the save are carried into it: regular files
   as hard links (the same file, no copy), symbolic links as the same link; sub-folders (and
   files where hard links are refused) are moved back after step 3;
3. the commit: one `renameat2(RENAME_EXCHANGE)` (macOS: `renamex_np(RENAME_SWAP)`) swaps the
   two folders, so the path `folder` names either the old folder or the complete new one at
   every moment, whatever a reader looks at; a folder that did not exist is a plain rename;
4. the old folder, now under the staging name, is emptied: the files of the save it held are
   deleted, the other entries moved back (a file changed since it was linked: the newer one
   wins), and it is removed.

Beside the staging folder, a state file `.<name>.<pid>.<random>.save` (locked by the writer
while it saves, as above) records the staging folder's identity and what step 4 must do. A
killed save is finished by the next save of the same folder (`remove_stale_folder_saves`,
with the lock, pid and age rules above): a staging folder that was never swapped in is
deleted (it holds only new files and links); an old folder that was is emptied as in step 4.
Nothing in these names is ever read by a load. The folder is a new one after the save (same
path, mode and entries; another inode): a process whose working directory was the folder
itself must change into it again (this one does so). What a kill can leave, until the next save:
the hidden staging folder; sub-folders of `folder` that are not part of the save, when the
kill falls in the few renames of step 4 that move them back (they are then in the hidden
folder beside it).

Where the swap is impossible the save is still made complete before anything is renamed, but
it takes effect file by file (not at one moment): on a system without an exchange call, the
old folder is renamed aside and the new one into place (a kill between the two leaves no
folder; the next save puts the complete one back); when `folder` is a mount point or its
parent cannot be written, the new files are written into a hidden folder inside `folder` and
then renamed over the old ones one by one (also when `folder` cannot be moved: another user's
folder in a sticky folder such as /tmp).
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

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
    now = time.time() if now is None else now
    removed = []
    for entry in _left_by_killed_saves(directory, f".{name}.", ".tmp", now):
        try:
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _left_by_killed_saves(directory, prefix: str, suffix: str, now: float, folders: bool = False) -> list:
    """The entries of `directory` named `<prefix><pid>.<random><suffix>` (files; folders when
    `folders`) that killed saves left: unlocked, and their pid gone or untouched for
    STALE_TEMP_S seconds. A dot in `<random>` names the save of another target
    (`<name>.<more>`): skipped. Unreadable entries are skipped."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    found = []
    for entry in entries:
        n = entry.name
        if not (n.startswith(prefix) and n.endswith(suffix)):
            continue
        pid_text, dot, rest = n[len(prefix):len(n) - len(suffix)].partition(".")
        if not (dot and rest and "." not in rest and pid_text.isdigit() and int(pid_text) > 0):
            continue
        try:
            kind = entry.is_dir(follow_symlinks=False) if folders else entry.is_file(follow_symlinks=False)
            if not kind or _writer_holds_lock(entry.path):
                continue
            if _alive(int(pid_text)) and now - entry.stat(follow_symlinks=False).st_mtime < STALE_TEMP_S:
                continue
        except OSError:
            continue
        found.append(entry)
    return found


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


def os_error_reason(exc: OSError) -> str:
    """A failed write in words: 'the disk is full (No space left on device)' for ENOSPC."""
    text = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        return f"the disk is full ({text})"
    if exc.errno == getattr(errno, "EDQUOT", -1):
        return f"the disk quota is exceeded ({text})"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"the folder cannot be written ({text})"
    return text


# ------------------------------------------------------------------ saving a folder at once
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
STATE_SUFFIX = ".save"  # `.<folder>.<pid>.<random>.save`: a folder save's state file; beside it
# `<state>.d`, the staging folder (after the swap: the old folder), and `<state>.old`, the old
# folder renamed aside where nothing can swap
IN_PLACE_PREFIX = ".ember-save."  # a staging folder inside the target (mount points)
MAX_STATE_BYTES = 64 * 1024 * 1024


def write_new_file(path, write) -> Path:
    """Create the file `path`, which must not exist (nothing is written through a link), call
    `write(fp)` on it, flush and fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    with os.fdopen(fd, "wb") as fp:
        write(fp)
        fp.flush()
        os.fsync(fp.fileno())
    return Path(path)


def _fsync_dir(directory) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


_swap_call = None


def _swap_function():
    """This system's atomic exchange of two paths, `f(a: bytes, b: bytes) -> 0 | -1`, or None."""
    global _swap_call
    if _swap_call is None:
        found = False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
                fn = libc.renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                found = lambda a, b: fn(-100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE  # noqa: E731
            elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
                fn = libc.renamex_np
                fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
                found = lambda a, b: fn(a, b, 2)  # RENAME_SWAP  # noqa: E731
        except (OSError, AttributeError):
            found = False
        _swap_call = found
    return _swap_call or None


def exchange(a, b) -> bool:
    """Swap the paths `a` and `b` (both existing) in one atomic step; False when this system
    or file system cannot (then nothing changed)."""
    fn = _swap_function()
    if fn is None:
        return False
    if fn(os.fsencode(a), os.fsencode(b)) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def _identity(path) -> list[int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino] if stat.S_ISDIR(st.st_mode) else None


def _write_state(fd: int, offset: int, part: dict) -> int:
    """Append one line of state at `offset` (fsync'ed); returns the offset after it. The first
    line (the folder and the staging folder's identity) is written before anything is staged,
    the second (what the swap replaces) before the swap, so a kill while the second is written
    still leaves the first whole."""
    data = (json.dumps(part) + "\n").encode("utf-8")
    if offset + len(data) > MAX_STATE_BYTES:
        raise OSError(errno.EFBIG, f"the folder holds too many entries to save into at once (their list takes "
                                   f"more than {MAX_STATE_BYTES} bytes)")
    os.pwrite(fd, data, offset)
    os.fsync(fd)
    return offset + len(data)


def _read_state(path) -> dict | None:
    """The state a save wrote: its first line, updated by the second when that is whole; None
    when not even the first is."""
    try:
        with open(path, "rb") as fp:
            data = fp.read(MAX_STATE_BYTES + 1)
    except OSError:
        return None
    state = None
    for line in data.split(b"\n")[:-1]:  # whole lines only
        try:
            part = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            break
        if not isinstance(part, dict):
            break
        state = part if state is None else {**state, **part}
    return state


def _replaces_folder(staging: Path, name: str, owned) -> bool:
    """Whether the save's new entry `name` may replace the folder's sub-folder of that name: the
    save owns the name and writes a sub-folder there too (a file never replaces a folder)."""
    new = staging / name
    return bool(owned(name)) and new.is_dir() and not new.is_symlink()


def _carry_over(folder: Path, staging: Path, written: set, owned) -> tuple[list, dict]:
    """Hard-link (or re-create, for symbolic links) into `staging` the entries of `folder` that
    are not part of the save. Returns the names of the save's old files and {name: inode} of
    the files linked."""
    replaced, linked = [], {}
    for entry in os.scandir(folder):
        name = entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if name in written:
            if is_dir and not _replaces_folder(staging, name, owned):
                raise IsADirectoryError(errno.EISDIR, "a folder has the name of a file this save writes",
                                        entry.path)
            replaced.append(name)
            if entry.is_file(follow_symlinks=False):
                os.chmod(staging / name, entry.stat(follow_symlinks=False).st_mode & 0o7777)
            continue
        if owned(name) and not is_dir:
            replaced.append(name)
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), staging / name)
        elif entry.is_file(follow_symlinks=False):
            try:
                os.link(entry.path, staging / name, follow_symlinks=False)
                linked[name] = entry.inode()
            except OSError:  # a file system without hard links: moved back after the swap
                pass
    return replaced, linked


def _finish(old: Path, folder: Path, state: dict) -> bool:
    """Empty the old folder after the swap: delete the save's old files, move back the other
    entries that `folder` does not hold yet, drop the links that it does. True when `old` is
    gone (False: an entry could not be placed; it stays for the user, and the next save tries
    again)."""
    replaced = set(state.get("replaced") or ())
    linked = state.get("linked") or {}
    try:
        entries = list(os.scandir(old))
    except OSError:
        return False
    for entry in entries:
        src, dst = entry.path, folder / entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.name in replaced:
                if is_dir:
                    shutil.rmtree(src)  # a sub-folder of the save, written anew
                else:
                    os.unlink(src)
                continue
            try:
                now = os.lstat(dst)
            except FileNotFoundError:
                os.rename(src, dst)  # a sub-folder, or a file that could not be linked
                continue
            mine = entry.stat(follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(src)  # the link made in step 2
            elif entry.is_symlink() and stat.S_ISLNK(now.st_mode) and os.readlink(src) == os.readlink(dst):
                os.unlink(src)
            elif not is_dir and linked.get(entry.name) == now.st_ino:
                os.replace(src, dst)  # replaced in the old folder after it was linked: the newer file
        except OSError:
            continue
    try:
        os.rmdir(old)
    except OSError:
        return False
    return True


def remove_stale_folder_saves(folder, now: float | None = None) -> list[Path]:
    """Finish or undo what killed `save_folder` calls into `folder` left beside it (see the
    module docstring); the lock, pid and age rules of `remove_stale_temps` decide which.
    Returns the state files dealt with; errors are ignored (best effort)."""
    folder = Path(folder)
    now = time.time() if now is None else now
    done = []
    for entry in _left_by_killed_saves(folder.parent, f".{folder.name}.", STATE_SUFFIX, now):
        try:
            state = _read_state(entry.path)
            if state is not None and state.get("folder") != folder.name:
                continue
            staging, aside = Path(entry.path + ".d"), Path(entry.path + ".old")
            finished = True
            if _identity(staging) is not None:
                mine = state.get("dir") if state else None
                if mine is None or _identity(staging) == mine:  # never swapped in: only new files and links
                    if state and state.get("ready") and not os.path.lexists(folder) and _identity(aside):
                        os.rename(staging, folder)  # cut between the two renames of the fallback
                    else:
                        shutil.rmtree(staging)
                else:  # swapped: this is the old folder
                    finished = _finish(staging, folder, state)
            if _identity(aside) is not None:
                if not os.path.lexists(folder):
                    os.rename(aside, folder)
                else:
                    finished = _finish(aside, folder, state or {}) and finished
            if finished:
                os.unlink(entry.path)
                done.append(Path(entry.path))
        except OSError:
            continue
    return done


def _remove_stale_in_place(folder: Path, now: float) -> None:
    for entry in _left_by_killed_saves(folder, IN_PLACE_PREFIX, "", now, folders=True):
        try:
            shutil.rmtree(entry.path)  # only new files of a save that never finished
        except OSError:
            continue


def _can_swap(folder: Path, parent: Path) -> bool:
    """Whether a sibling staging folder can be swapped with `folder`: not a mount point, and the
    parent writable."""
    try:
        if os.path.lexists(folder) and os.stat(folder).st_dev != os.stat(parent).st_dev:
            return False
    except OSError:
        return False
    return os.access(parent, os.W_OK | os.X_OK)


def _replace_each(staging: Path, folder: Path, written, owned) -> None:
    """The files of the save renamed over the old ones one by one (where the folder cannot be
    swapped), then the old save's other files removed."""
    def is_folder(path):
        return os.path.isdir(path) and not os.path.islink(path)

    for name in written:
        dst = folder / name
        if is_folder(dst) and not _replaces_folder(staging, name, owned):
            raise IsADirectoryError(errno.EISDIR, "a folder has the name of a file this save writes", str(dst))
    for name in written:
        dst = folder / name
        if is_folder(dst):  # the save's old sub-folder goes into the staging folder, removed with it
            os.rename(dst, tempfile.mkdtemp(prefix=".replaced.", dir=staging) + "/" + name)
        os.replace(staging / name, dst)  # replaces a link itself, never its target
    for entry in os.scandir(folder):
        if entry.name not in written and owned(entry.name) and not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)
    _fsync_dir(folder)


def _save_in_place(folder: Path, write, owned) -> Path:
    folder.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{IN_PLACE_PREFIX}{os.getpid()}.", dir=folder))
    dfd = os.open(staging, os.O_RDONLY)
    try:
        _lock(dfd)
        write(staging)
        _replace_each(staging, folder, sorted(os.listdir(staging)), owned)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(dfd)
    return folder


def _commit(staging: Path, folder: Path, aside: Path, existed: bool) -> Path | None:
    """Make the staged folder take effect; returns where the old folder now is (None: there
    was none)."""
    if not existed:
        os.rename(staging, folder)
        return None
    if exchange(staging, folder):
        return staging
    os.rename(folder, aside)
    try:
        os.rename(staging, folder)
    except BaseException:
        os.rename(aside, folder)
        raise
    return aside


def save_folder(folder, write: Callable[[Path], None], owned: Callable[[str], bool] = lambda name: False) -> Path:
    """Save several files into `folder` so that they take effect together (see the module
    docstring): `write(staging)` creates the new files in an empty private folder (with
    `write_new_file`); `owned(name)` says which other names in `folder` belong to the save being
    replaced (they go; every other entry stays). Returns the folder (symbolic links in its path
    resolved). Raises OSError (nothing changed) when a file cannot be written."""
    folder = Path(os.path.realpath(os.path.abspath(os.fspath(folder))))
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(folder) and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "expected a folder to save into, found a file", str(folder))
    remove_stale_folder_saves(folder)
    if folder.is_dir():
        _remove_stale_in_place(folder, time.time())
    if not _can_swap(folder, parent):
        return _save_in_place(folder, write, owned)
    fd, state_path = tempfile.mkstemp(prefix=f".{folder.name}.{os.getpid()}.", suffix=STATE_SUFFIX, dir=parent)
    staging, aside = Path(state_path + ".d"), Path(state_path + ".old")
    try:
        _lock(fd)
        try:
            mode = os.stat(folder).st_mode & 0o7777
        except FileNotFoundError:
            mode = None
        os.mkdir(staging, 0o777 if mode is None else 0o700)  # a new folder: the umask's mode
        if mode is not None:
            os.chmod(staging, mode)  # the folder's own mode, before anything is in it
        state = {"folder": folder.name, "dir": _identity(staging), "ready": False}
        offset = _write_state(fd, 0, state)
        write(staging)
        written = set(os.listdir(staging))
        existed = folder.is_dir()
        replaced, linked = _carry_over(folder, staging, written, owned) if existed else ([], {})
        _fsync_dir(staging)
        ready = {"ready": True, "replaced": sorted(replaced), "linked": linked}
        _write_state(fd, offset, ready)
        state.update(ready)
        try:
            old = _commit(staging, folder, aside, existed)
        except PermissionError:  # a folder this user may write into but not move (another's, in a sticky folder)
            _replace_each(staging, folder, sorted(written), owned)
            shutil.rmtree(staging)
            old = None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)
        try:
            os.unlink(state_path)
        except OSError:
            pass
        raise
    _fsync_dir(parent)
    if old is not None and _identity(".") == _identity(old):
        try:  # this process worked inside the folder: it goes on in the new one, not the old one
            os.chdir(folder)
        except OSError:
            pass
    try:
        finished = old is None or _finish(old, folder, state)
        if finished:
            os.unlink(state_path)
    except OSError:
        pass
    finally:
        os.close(fd)
    return folder
