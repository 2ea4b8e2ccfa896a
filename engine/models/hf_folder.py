"""Reading a Hugging Face checkpoint folder: `config.json` and the weight files' headers, lazily.

    ckpt = open_checkpoint("path/to/folder")
    ckpt.config                       # config.json, a dict
    t = ckpt.tensors["model.embed_tokens.weight"]
    t.dtype, t.shape, t.file          # from the header: nothing read yet
    t.read()                          # an owned float32 (or int / bool / float64) array of t.shape
    ckpt.close()

Folder kinds, looked for in this order (as transformers does):

- `model.safetensors`,
- `model.safetensors.index.json` plus the shards its `weight_map` names,
- `pytorch_model.bin` (a `torch.save` zip, read by `engine.store.torch_pickle` without running its
  pickle),
- `pytorch_model.bin.index.json` plus `.bin` shards.

Only headers are read when the folder is opened (the safetensors JSON headers through
`safetensors_io.plan`, the hardened parser `ModuleRecord.load` uses; a `.bin`'s zip directory and
pickle). Each file stays open as an `engine.store.filesource.FileSource` (no memory map, see that
file) and each tensor is read at its first `read()` into an array of its own; a file that
changed since it was opened is an error, never a crash.

Every problem a user can hit is a `PretrainedError` (a `RecordError`) that names the file, the
tensor and what was expected: a folder without `config.json` (listing what it holds), a
`config.json` that is not a JSON object, no weights file (naming the ones looked for), an index
naming a missing shard or a shard path that leaves the folder, a tensor the index and its shard
disagree on, a tensor in two files, truncated files and sizes that do not fit.

Limits, each checked before the work it bounds: config.json at most 16 MiB and an index at most
64 MiB of UTF-8 JSON, nested at most 64 levels (MAX_JSON_DEPTH), without NaN / Infinity or
integers of thousands of digits; an index of at most MAX_TENSORS (100,000) names (more than
twice that many ':' refuse it before it is parsed) in at most 10,000 shards, each a plain file
name in the folder of at most 255 bytes; a safetensors header at most 100 MB and 100,000 tensors
(counted before parsing), the file ending with the last tensor's data; a `.bin` of at most
100,000 tensors (its zip entries counted from the end record, its state dict's entries as the
pickle is walked, before it is loaded).
"""
from __future__ import annotations

import math
import operator
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np

from ..store import json_file, safetensors_io, torch_pickle
from ..store.burnpack import MAX_TENSORS, bf16_to_float32, storage_dtype
from ..store.errors import RecordError
from ..store.filesource import FileSource

__all__ = ["Checkpoint", "PretrainedError", "StoredTensor", "WEIGHT_FILES", "open_checkpoint"]

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)

MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_SHARDS = 10_000
MAX_SHARD_NAME = 255       # bytes: the longest file name Linux and macOS accept


class PretrainedError(RecordError):
    """A Hugging Face folder could not be read or does not fit the model; `where` names the file."""


# the largest size (layers, width, heads, vocabulary, positions, ...) a family's config.json may
# give: more is no real model, and is refused before anything is computed from it
MAX_SIZE = 2 ** 31 - 1


def _fail(where, message):
    raise PretrainedError(message, where=str(where) if where is not None else None)


def _as_pretrained(exc: RecordError) -> PretrainedError:
    if isinstance(exc, PretrainedError):
        return exc
    err = PretrainedError(exc.reason, where=exc.where, missing=exc.missing, unused=exc.unused,
                          mismatched=exc.mismatched)
    return err


class StoredTensor:
    """One tensor in one file; nothing is read until `read()` / `read_stored()` is called.

    `dtype` is the burnpack dtype name ("F32", "F16", "BF16", "F64", "I64", ..., "Bool(Native)"),
    `shape` a tuple, `file` the file it lives in, `nbytes` its size as stored."""

    __slots__ = ("name", "dtype", "shape", "file", "nbytes", "_reader")

    def __init__(self, name: str, dtype: str, shape, file: Path, nbytes: int, reader):
        self.name = name
        self.dtype = dtype
        self.shape = shape if type(shape) is tuple else tuple(int(d) for d in shape)
        self.file = file if isinstance(file, Path) else Path(file)  # shared: 100,000 Paths took seconds
        self.nbytes = int(nbytes)
        self._reader = reader

    def __repr__(self) -> str:
        return f"StoredTensor({self.name!r}, {self.dtype}, {list(self.shape)}, {self.file.name})"

    def read_stored(self) -> np.ndarray:
        """A new owned array of `shape` holding the stored bits: BF16 as uint16, F16 as float16,
        bools as bool (for bit-exact copies on save). Checks that the file did not change."""
        try:
            arr = self._reader()
        except PretrainedError:
            raise
        except RecordError as exc:
            raise _as_pretrained(exc) from None
        if tuple(arr.shape) != self.shape:  # the readers reshape; this guards the contract
            arr = arr.reshape(self.shape)
        return arr

    def read(self) -> np.ndarray:
        """A new owned array of `shape` to compute with: F32 / F16 / BF16 as float32 (BF16 widened
        exactly: its bits are float32's upper 16), F64 as float64, ints as their NumPy type, bools
        as bool."""
        arr = self.read_stored()
        if self.dtype == "BF16":
            return bf16_to_float32(arr).reshape(self.shape)
        if self.dtype == "F16":
            return arr.astype(np.float32)
        return arr


class Checkpoint:
    """A folder opened by `open_checkpoint`: `config` (config.json), `tensors` (HF name ->
    StoredTensor, in file order), `files` (the weight files). `close()` closes the files; reading
    a tensor after that raises PretrainedError."""

    def __init__(self, folder: Path, config: dict, tensors: dict, files: list, sources: list):
        self.folder = folder
        self.config = config
        self.tensors: dict[str, StoredTensor] = tensors
        self.files: list[Path] = files
        self._sources = sources

    def close(self) -> None:
        for src in self._sources:
            src.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.folder)!r}, {len(self.tensors)} tensors in {len(self.files)} file(s))"


# ------------------------------------------------------------------------------ files
def read_json(path: Path, limit: int, what: str):
    """The JSON document of a model folder's file (config.json, an index, adapter_config.json),
    read as `engine.store.json_file.read_json` reads it; every problem is a PretrainedError naming
    the file."""
    return json_file.read_json(path, limit, what, _pretrained_error)


def parse_json(raw: bytes, where, what: str):
    """`raw` parsed as `read_json` does (see there)."""
    return json_file.parse_json(raw, where, what, _pretrained_error)


def _pretrained_error(where, message) -> PretrainedError:
    return PretrainedError(message, where=str(where) if where is not None else None)


def _listing(folder: Path) -> str:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return "nothing readable"
    if not names:
        return "no files"
    shown = ", ".join(names[:20])
    return shown + (f", ... ({len(names) - 20} more)" if len(names) > 20 else "")


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _shard_path(folder: Path, name, index: Path, tensor: str) -> Path:
    """The shard file `name` of an index: a plain file name in the folder (no folders, no '..',
    no drive, at most MAX_SHARD_NAME bytes; a symlink in the folder, as the Hub cache makes, is
    fine)."""
    if not isinstance(name, str) or not name:
        _fail(index, f"weight_map[{tensor!r}]: a shard file name expected, found {_clip(repr(name))}")
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if (posix.is_absolute() or windows.is_absolute() or windows.drive
            or ".." in posix.parts or ".." in windows.parts):
        _fail(index, f"weight_map[{tensor!r}]: shard {_clip(repr(name))} is outside the folder; a file name "
                     f"inside {folder} expected")
    if "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        _fail(index, f"weight_map[{tensor!r}]: a shard file name expected (a file directly in {folder}), found "
                     f"{_clip(repr(name))}")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_SHARD_NAME:
        _fail(index, f"weight_map[{tensor!r}]: a shard file name of at most {MAX_SHARD_NAME} bytes expected, found "
                     f"one of {len(name.encode('utf-8', 'surrogatepass'))} bytes ({_clip(repr(name))})")
    return folder / name


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[:n] + "..."


# ------------------------------------------------------------------------------ readers
def _open_safetensors(path: Path, sources: list) -> dict[str, StoredTensor]:
    where = str(path)
    src = FileSource(path, where)
    sources.append(src)
    if src.size == 0:
        _fail(path, "the file is empty; a safetensors file expected")
    first = src.read_bytes(0, 16)
    head = src.read_bytes(0, safetensors_io.head_length(first, src.size, where))
    plan = safetensors_io.plan(head, src.size, where)
    out = {}
    for t in sorted(plan.tensors, key=_BY_OFFSET):  # the plan checked nbytes = count * itemsize
        out[t.name] = StoredTensor(t.name, t.dtype, t.shape, path, t.nbytes,
                                   _safetensors_reader(src, t.offset, t.dtype, math.prod(t.shape), t.shape))
    return out


_BY_OFFSET = operator.attrgetter("offset")


def _safetensors_reader(src: FileSource, offset: int, dtype: str, count: int, shape):
    def read():
        arr = src.read_array(offset, storage_dtype(dtype), count).reshape(shape)
        return arr != 0 if dtype.startswith("Bool(") else arr
    return read


def _open_torch(path: Path, sources: list) -> dict[str, StoredTensor]:
    src = FileSource(path, str(path))
    sources.append(src)
    if src.size == 0:
        _fail(path, "the file is empty; a torch.save zip archive expected")
    z = torch_pickle.TorchZip(path, str(path), source=src)
    return {name: StoredTensor(name, t.dtype, t.shape, path, t.nbytes, t.read_stored) for name, t in z.tensors.items()}


def _open_index(folder: Path, index: Path, opener, sources: list) -> tuple[dict, list]:
    raw = json_file.read_limited(index, MAX_INDEX_BYTES, "the index", _pretrained_error)
    # every weight_map entry has its ':'; counted before parsing so that an index of millions of
    # names is refused in the time of a byte count, not of building them
    colons = raw.count(b":")
    if colons > 2 * MAX_TENSORS + 1000:
        _fail(index, f"the index: at most {MAX_TENSORS} tensors expected, found {colons} ':' separators "
                     f"(refused before parsing)")
    doc = parse_json(raw, index, "the index")
    del raw
    if not isinstance(doc, dict):
        _fail(index, f"the index: a JSON object expected, found {type(doc).__name__}")
    wmap = doc.get("weight_map")
    if not isinstance(wmap, dict):
        _fail(index, f"the index: a 'weight_map' object (tensor name -> shard file) expected, found "
                     f"{type(wmap).__name__ if wmap is not None else 'none'}")
    if not wmap:
        _fail(index, "the index: 'weight_map' names no tensors")
    if len(wmap) > MAX_TENSORS:
        _fail(index, f"the index: 'weight_map' names {len(wmap)} tensors, more than the limit of {MAX_TENSORS}")
    shards: dict = {}
    for tensor, shard in wmap.items():
        if not isinstance(shard, str):
            _shard_path(folder, shard, index, tensor)
        shards.setdefault(shard, []).append(tensor)
        if len(shards) > MAX_SHARDS:
            _fail(index, f"the index names more than {MAX_SHARDS} shards, the limit")
    paths = {shard: _shard_path(folder, shard, index, names[0]) for shard, names in shards.items()}
    tensors: dict[str, StoredTensor] = {}
    files = []
    for shard, names in sorted(shards.items()):
        path = paths[shard]
        try:
            exists = path.exists()
        except OSError as exc:
            _fail(index, f"shard {shard!r}: cannot look it up in {folder}: {exc.strerror or exc}")
        if not exists:
            _fail(index, f"shard {shard!r} (holding {names[0]!r}{' and others' if len(names) > 1 else ''}) "
                         f"does not exist in {folder}")
        if not _regular(path):
            _fail(path, f"shard {shard!r} named by {index.name}: a regular file expected")
        found = opener(path, sources)
        files.append(path)
        for name in names:
            if name not in found:
                _fail(path, f"tensor {name!r}: {index.name} says it is in {shard}, which does not hold it")
        for name, t in found.items():
            owner = wmap.get(name)
            if owner is None:
                _fail(path, f"tensor {name!r} is in {shard} but not in {index.name}'s weight_map")
            if owner != shard:
                _fail(path, f"tensor {name!r} is in {shard} and in {owner}; {index.name} names {owner}, "
                            f"a tensor must be in one shard")
            tensors[name] = t
    return tensors, files


def open_checkpoint(folder, check_config=None) -> Checkpoint:
    """Open a Hugging Face checkpoint folder: config.json parsed, the weight files' headers read,
    every tensor described by a StoredTensor and nothing else read. See the module docstring.

    `check_config(config)`, when given, runs on the parsed config before any weight file is
    looked at (from_pretrained names an unsupported architecture before a missing file)."""
    folder = Path(os.fspath(folder)).expanduser()
    try:
        exists, is_dir, has_config = folder.exists(), folder.is_dir(), (folder / CONFIG).exists()
    except OSError as exc:  # a name too long
        _fail(folder, f"cannot read: {exc.strerror or exc}")
    if not exists:
        _fail(folder, "no such folder; a Hugging Face checkpoint folder (config.json plus weights) expected")
    if not is_dir:
        _fail(folder, "a Hugging Face checkpoint folder (config.json plus weights) expected, found a file")
    config_path = folder / CONFIG
    if not has_config:
        _fail(folder, f"no {CONFIG} in the folder; a Hugging Face checkpoint folder has one (it holds: "
                      f"{_listing(folder)})")
    if not _regular(config_path):
        _fail(config_path, "a regular file expected")
    try:
        config = read_json(config_path, MAX_CONFIG_BYTES, CONFIG)
    except PretrainedError:
        raise
    except RecordError as exc:
        raise _as_pretrained(exc) from None
    if not isinstance(config, dict):
        _fail(config_path, f"a JSON object expected, found {type(config).__name__}")
    if check_config is not None:
        check_config(config)

    sources: list[FileSource] = []
    try:
        tensors, files = _open_weights(folder, sources)
    except PretrainedError:
        for s in sources:
            s.close()
        raise
    except RecordError as exc:
        for s in sources:
            s.close()
        raise _as_pretrained(exc) from None
    except BaseException:
        for s in sources:
            s.close()
        raise
    return Checkpoint(folder, config, tensors, files, sources)


def _open_weights(folder: Path, sources: list) -> tuple[dict, list]:
    single = folder / SAFETENSORS
    if single.exists():
        return _open_safetensors(single, sources), [single]
    index = folder / SAFETENSORS_INDEX
    if index.exists():
        return _open_index(folder, index, _open_safetensors, sources)
    single = folder / TORCH_BIN
    if single.exists():
        return _open_torch(single, sources), [single]
    index = folder / TORCH_BIN_INDEX
    if index.exists():
        return _open_index(folder, index, _open_torch, sources)
    _fail(folder, f"no weights file: looked for {', '.join(WEIGHT_FILES)}; the folder holds: {_listing(folder)}")
