"""`save_pretrained`: a model written back as a Hugging Face folder (opening is `pretrained.py`).

Saving (`save_pretrained(model, folder)`) walks the model's parameters, inverts each rule's
transforms, concatenates split tensors (GPT-2's fused q/k/v) and writes `config.json` plus
`model.safetensors`, or shards of at most `max_shard_size` bytes and
`model.safetensors.index.json`. Each tensor is written in the dtype it was read in unless
`dtype` says otherwise; a parameter never initialized is copied from its source file, one
tensor at a time. Tokenizer and generation files of the source folder are copied along.

A save takes effect at one moment (`engine.store.atomic.save_folder`): every new file
(config.json, the weights, the copied files) is written and fsync'ed in a staging folder
beside the target, and one atomic exchange of the two folders makes the save take effect; a
process killed at any moment leaves a folder that loads as the old save or as the new one,
never a mix, and the next save cleans up what the kill left. Files of the folder that are
not part of a save stay; those that are (config.json, `model.safetensors`, its shards and
index; the tokenizer and generation files when the save copies them) are replaced together,
so shards of an older save never remain. The copied files are regular files inside the
source folder (a Hugging Face cache snapshot's links into its `blobs` folder count as inside),
each at most MAX_EXTRA_FILE_BYTES; anything else is a PretrainedError, as is a failed write
(a full disk), which leaves the folder as it was. As both saves are on disk until the swap, a
save whose files do not fit in the free space is refused before anything is written.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..module import Param
from ..module.memory import size_text
from ..module.reparam import iter_param_slots
from ..store.atomic import os_error_reason, save_folder, write_new_file
from ..store.burnpack import float32_to_bf16, storage_dtype
from ..store.safetensors_io import header as safetensors_header
from .gguf_weight import dequantized_bases
from .hf_folder import PretrainedError
from .pretrained import Family, PretrainedInfo, _stored_kind, family_of, pretrained_info

__all__ = ["DEFAULT_SHARD_SIZE", "EXTRA_FILES", "MAX_EXTRA_FILE_BYTES", "save_pretrained"]

# files of a model folder that describe the tokenizer or generation; copied by save_pretrained
EXTRA_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.txt",
    "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json", "preprocessor_config.json",
)
DEFAULT_SHARD_SIZE = 5 * 2 ** 30
MAX_EXTRA_FILE_BYTES = 128 * 2 ** 20  # a copied tokenizer / generation file (the largest known: ~35 MB)
_MODEL_FILE = re.compile(r"(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json)\Z")


_NP_TO_DTYPE = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _target_dtype(dtype, stored: str | None, array_dtype) -> str:
    if dtype is not None:
        d = _NP_TO_DTYPE.get(str(dtype))
        if d is None:
            raise ValueError(f"save_pretrained: dtype must be one of {sorted(_NP_TO_DTYPE)}, got {dtype!r}")
        return d if np.dtype(array_dtype).kind == "f" else _int_dtype(array_dtype)
    if stored is not None:
        return stored
    return _NP_TO_DTYPE.get(np.dtype(array_dtype).name) or _int_dtype(array_dtype)


def _int_dtype(np_dtype) -> str:
    d = np.dtype(np_dtype)
    if d.kind == "b":
        return "Bool(Native)"
    return {"int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16",
            "uint32": "U32", "uint64": "U64"}[d.name]


def _encode(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` in the stored layout of `dtype` (BF16 rounded to nearest even)."""
    if dtype == "BF16":
        return float32_to_bf16(np.asarray(array, dtype=np.float32))
    if dtype.startswith("Bool"):
        return np.asarray(array, dtype=np.bool_)
    return np.asarray(array, dtype=storage_dtype(dtype))


@dataclass
class _Out:
    name: str
    dtype: str
    shape: tuple
    produce: Callable[[], np.ndarray]  # the stored-layout array, made when written

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * (1 if self.dtype.startswith("Bool") else storage_dtype(self.dtype).itemsize)


def _plan_save(model, dtype) -> tuple[list[_Out], PretrainedInfo | None, Family, Any]:
    fam, cfg = family_of(model)
    if fam is None:
        raise PretrainedError(f"save_pretrained needs a model opened by from_pretrained or built by engine.models; "
                              f"found a {type(model).__name__}")
    info = pretrained_info(model)
    model = dequantized_bases(model)  # a GGUF weight kept quantized is saved as its values
    reparam = [path for path, p in iter_param_slots(model) if p.reparameterization is not None]
    if reparam:
        raise PretrainedError(
            f"{len(reparam)} parameter(s) carry a reparameterization (LoRA/QLoRA), e.g. '{reparam[0]}': a Hugging "
            f"Face folder holds plain weights, so call model.materialize() first (or save the adapter alone)")
    wmap = fam.weight_map(cfg)
    groups: dict[str, list] = {}
    order: list[str] = []
    seen = set()
    for path, p in model.named_params():
        if p.id in seen:
            continue
        seen.add(p.id)
        hit = wmap.find(path)
        if hit is None:
            raise PretrainedError(f"the {fam.name} weight map has no rule for parameter '{path}'")
        rule, name = hit
        if name not in groups:
            groups[name] = []
            order.append(name)
        groups[name].append((rule, p, path))
    if info is not None and info.order:  # keep the source file's order where it applies
        rank = {n: i for i, n in enumerate(info.order)}
        order.sort(key=lambda n: rank.get(n, len(rank)))
    outs = []
    for name in order:
        members = groups[name]
        stored_dtype = info.stored_dtypes.get(name) if info is not None else None
        outs.append(_out_for(name, members, info, stored_dtype, dtype))
    return outs, info, fam, cfg


def _untouched(p: Param, info: PretrainedInfo | None, rule=None):
    """The StoredTensor a parameter still equals (never initialized since it was opened), or None."""
    if info is None or p.is_initialized():
        return None
    src = info.sources.get(p.id)
    if src is None or src[0] is not p.lazy_state():
        return None
    if rule is not None and src[2] != rule:  # read in another layout (fused experts): saved from its values
        return None
    return src


def _out_for(name, members, info, stored_dtype, dtype) -> _Out:
    split = members[0][0].split
    if split is None:
        rule, p, path = members[0]
        src = _untouched(p, info, rule)
        if src is not None:  # never read since it was opened: from the file, without initializing it
            stored = src[1]
            if dtype is None or _NP_TO_DTYPE.get(str(dtype)) == stored.dtype:
                return _Out(name, stored.dtype, tuple(stored.shape), stored.read_stored)
            target = _target_dtype(dtype, stored.dtype, np.float32 if _stored_kind(stored.dtype) == "float"
                                   else storage_dtype(stored.dtype))
            return _Out(name, target, tuple(stored.shape), lambda: _encode(stored.read(), target))
        shape = rule.stored_shape(tuple(p.lazy_shape()))
        np_dtype = _param_np_dtype(p)
        target = _target_dtype(dtype, stored_dtype, np_dtype)
        return _Out(name, target, shape, lambda: _encode(rule.save(_value(p)), target))
    members = sorted(members, key=lambda m: m[0].split.index)
    parts = split.parts
    if [m[0].split.index for m in members] != list(range(parts)):
        raise PretrainedError(f"tensor '{name}' is split into {parts} parameters, found "
                              f"{[m[2] for m in members]}")
    srcs = [_untouched(m[1], info) for m in members]
    if all(s is not None for s in srcs) and len({id(s[1]) for s in srcs}) == 1 and (
            dtype is None or _NP_TO_DTYPE.get(str(dtype)) == srcs[0][1].dtype):
        stored = srcs[0][1]
        return _Out(name, stored.dtype, tuple(stored.shape), stored.read_stored)
    shapes = [m[0].stored_shape(tuple(m[1].lazy_shape())) for m in members]
    axis = split.axis
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)
    target = _target_dtype(dtype, stored_dtype, _param_np_dtype(members[0][1]))

    def produce():
        return _encode(np.concatenate([m[0].save(_value(m[1])) for m in members], axis=axis), target)
    return _Out(name, target, tuple(shape), produce)


def _param_np_dtype(p: Param):
    if p.is_initialized():
        return np.dtype(p.val().numpy().dtype)
    return np.dtype(np.float32) if p.kind == "float" else (np.dtype(np.bool_) if p.kind == "bool" else np.dtype(np.int64))


def _value(p: Param) -> np.ndarray:
    """The parameter's values on the host (reading a lazy one initializes it)."""
    return np.asarray(p.val().numpy())


def _shards(outs: list[_Out], max_shard_size: int) -> list[list[_Out]]:
    shards, current, size = [], [], 0
    for o in outs:
        if current and size + o.nbytes > max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(o)
        size += o.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def _write_shard(path: Path, outs: list[_Out], where: Path) -> None:
    head = safetensors_header([(o.name, o.dtype, o.shape, o.nbytes) for o in outs], {"format": "pt"})

    def write(fp):
        fp.write(head)
        for o in outs:
            arr = np.ascontiguousarray(o.produce())
            if tuple(arr.shape) != tuple(o.shape) or arr.nbytes != o.nbytes:
                raise PretrainedError(f"tensor '{o.name}': made dims {list(arr.shape)} ({arr.nbytes} bytes), "
                                      f"expected {list(o.shape)} ({o.nbytes} bytes)", where=str(where))
            if arr.nbytes:
                fp.write(memoryview(arr.reshape(-1)).cast("B"))
    _write_new(path, write, where)


def _write_new(path: Path, write, where: Path) -> None:
    """A new file in the staging folder; a failed write names the file it becomes."""
    try:
        write_new_file(path, write)
    except OSError as exc:
        raise PretrainedError(f"cannot write: {os_error_reason(exc)}", where=str(where)) from None


def _inside(path: str, roots: list[str]) -> bool:
    try:
        return any(os.path.commonpath([path, root]) == root for root in roots)
    except ValueError:  # another drive (Windows)
        return False


def _extra_roots(source: Path) -> list[str]:
    """Where a copied file may live: the source folder, and for a Hugging Face cache snapshot
    (`models--org--name/snapshots/<revision>`, whose files link to `../../blobs/<hash>`) that
    repository's `blobs` folder."""
    roots = [os.path.realpath(source)]
    real = Path(roots[0])
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        roots.append(os.path.realpath(real.parent.parent / "blobs"))
    return roots


def _extra_files(sources: list[Path]) -> dict[str, Path]:
    """{name: the real file to copy} for the EXTRA_FILES of `sources` (a later folder's file
    wins), each checked: a regular file inside its source folder, at most MAX_EXTRA_FILE_BYTES."""
    found: dict[str, Path] = {}
    for source in sources:
        roots = _extra_roots(source)
        for name in EXTRA_FILES:
            path = source / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise PretrainedError(f"cannot read: {os_error_reason(exc)}", where=str(path)) from None
            real = os.path.realpath(path)
            if stat.S_ISLNK(st.st_mode) and not _inside(real, roots):
                raise PretrainedError(f"a symbolic link to {real}, outside the model folder: only files inside it "
                                      f"are copied into a save (replace the link with the file, or save with "
                                      f"copy_extra_files=False)", where=str(path))
            try:
                st = os.stat(real)
            except OSError as exc:
                raise PretrainedError(f"cannot read: {os_error_reason(exc)}", where=str(path)) from None
            _check_extra(st, path)
            found[name] = Path(real)
    return found


def _check_extra(st: os.stat_result, where: Path) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise PretrainedError(f"expected a regular file to copy into the save, found {kind}", where=str(where))
    if st.st_size > MAX_EXTRA_FILE_BYTES:
        raise PretrainedError(f"{st.st_size} bytes, more than the {MAX_EXTRA_FILE_BYTES // 2 ** 20} MiB a tokenizer or "
                              f"generation file may have to be copied into a save", where=str(where))


def _copy_extra(real: Path, target: Path, where: Path) -> None:
    """Copy one checked file (opened without following a link, checked again once open)."""
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PretrainedError(f"cannot read: {os_error_reason(exc)}", where=str(real)) from None
    with os.fdopen(fd, "rb") as src:
        _check_extra(os.fstat(fd), real)

        def write(fp):
            left = MAX_EXTRA_FILE_BYTES + 1
            while left > 0:
                try:
                    chunk = src.read(min(left, 1 << 20))
                except OSError as exc:
                    raise PretrainedError(f"cannot read: {os_error_reason(exc)}", where=str(real)) from None
                if not chunk:
                    return
                left -= len(chunk)
                if left <= 0:
                    raise PretrainedError(f"grew past {MAX_EXTRA_FILE_BYTES // 2 ** 20} MiB while it was copied",
                                          where=str(real))
                fp.write(chunk)
        _write_new(target, write, where)


def save_pretrained(model, folder, *, max_shard_size: int = DEFAULT_SHARD_SIZE, dtype=None,
                    copy_extra_files: bool = True, extra_files_from=None) -> Path:
    """Write `model` as a Hugging Face folder that transformers' `from_pretrained` loads.

    `dtype`: None keeps each tensor's dtype as it was read (float32 for a model built here);
    "float32", "float16", "bfloat16" or "float64" converts every float tensor.
    `copy_extra_files`: copy the tokenizer and generation files (EXTRA_FILES) of the model's
    folder, and of `extra_files_from` (a folder; its files win). The whole folder is saved at
    once (see the module docstring). Returns the folder.
    """
    if not isinstance(max_shard_size, int) or max_shard_size <= 0:
        raise ValueError(f"save_pretrained: max_shard_size must be a positive number of bytes, got {max_shard_size!r}")
    outs, info, fam, cfg = _plan_save(model, dtype)
    folder = Path(os.fspath(folder))
    if folder.exists() and not folder.is_dir():
        raise PretrainedError("expected a folder to save into, found a file", where=str(folder))
    config = dict(info.raw_config) if info is not None else {}
    config.update(fam.config_to_json(cfg))
    if dtype is not None:
        config["torch_dtype"] = str(dtype)
        config["dtype"] = str(dtype)
    shards = _shards(outs, max_shard_size)
    sources = []
    if copy_extra_files:
        here = os.path.realpath(folder)
        given = [info.folder if info is not None else None, extra_files_from]
        sources = [Path(os.fspath(f)) for f in given if f is not None and os.path.realpath(f) != here]
    extras = _extra_files(sources)  # checked before anything is written
    _check_room(folder, sum(o.nbytes for o in outs) + sum(os.stat(p).st_size for p in extras.values()))

    def write(staging: Path) -> None:
        if len(shards) == 1:
            _write_shard(staging / "model.safetensors", shards[0], folder / "model.safetensors")
        else:
            n = len(shards)
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                name = f"model-{i:05d}-of-{n:05d}.safetensors"
                _write_shard(staging / name, shard, folder / name)
                weight_map.update({o.name: name for o in shard})
            index = {"metadata": {"total_size": sum(o.nbytes for o in outs)}, "weight_map": weight_map}
            _write_text(staging, folder, "model.safetensors.index.json", json.dumps(index, indent=2) + "\n")
        _write_text(staging, folder, "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name, real in extras.items():
            _copy_extra(real, staging / name, folder / name)

    def owned(name: str) -> bool:  # the files of the save this one replaces
        return name == "config.json" or bool(_MODEL_FILE.match(name)) or (bool(sources) and name in EXTRA_FILES)
    try:
        save_folder(folder, write, owned)
    except OSError as exc:
        raise PretrainedError(f"cannot save: {os_error_reason(exc)}", where=exc.filename or str(folder)) from None
    return folder


def _check_room(folder: Path, needed: int) -> None:
    """Refuse at once a save the disk cannot hold: every new file is written before the old
    save goes, so its bytes must fit beside the old ones."""
    probe = next((p for p in (folder, *folder.absolute().parents) if p.is_dir()), None)
    try:
        free = shutil.disk_usage(probe).free if probe is not None else None
    except OSError:
        return
    if free is not None and needed > free:
        raise PretrainedError(f"the save needs {size_text(needed)} of free disk space (every file is written before "
                              f"the old save goes), the disk has {size_text(free)}", where=str(folder))


def _write_text(staging: Path, folder: Path, name: str, text: str) -> None:
    data = text.encode("utf-8")
    _write_new(staging / name, lambda fp: fp.write(data), folder / name)
