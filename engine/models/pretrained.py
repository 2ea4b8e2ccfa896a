"""`from_pretrained` / `save_pretrained`: Hugging Face checkpoint folders in and out, lazily.

Opening (`from_pretrained(folder)`):

1. `checkpoint.open_checkpoint` reads `config.json` and the weight files' headers only;
2. the family is chosen from `config.json` (`architectures` first, then `model_type`); a size
   above `checkpoint.MAX_SIZE` (2**31 - 1) is refused as the config is read, and the layer
   count (`Family.layers`: `num_hidden_layers`, GPT-2's `n_layer`) must be the layers the
   headers hold tensors of, so a config claiming 10**12 layers is refused before the build
   (linear in the count) starts;
3. the family builds its model from `engine.nn` layers, every parameter lazy (`check()`, a
   worker's cancellation, runs before each layer: `layer_range`);
4. every parameter is matched to its stored tensor by the family's `WeightMap` and the shape
   after the rule's transforms is checked against the parameter's, all before any tensor is
   read; a tensor the map does not expect (and does not ignore) is an error too;
5. each parameter becomes a lazy `Param` with the same id and trainability whose initializer
   reads the stored tensor and applies the rule's transforms.

So opening, displaying, counting, freezing or attaching LoRA to a 7 B checkpoint reads and
allocates almost nothing; a value is read from its file when it is first used (the file is
checked to be unchanged before and after each read; `filesource.FileSource`).

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

import contextvars
import importlib
import json
import math
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..module import Module, ModuleMapper, Param
from ..module.memory import size_text
from ..module.tree import params as tree_params
from ..store.atomic import os_error_reason, save_folder, write_new_file
from ..store.burnpack import float32_to_bf16, storage_dtype
from ..store.errors import RecordError
from ..store.safetensors_io import header as safetensors_header
from ..tensor import Tensor
from ..tensor.dtype import as_dtype
from .checkpoint import Checkpoint, PretrainedError, open_checkpoint
from .mapping import Rule, WeightMap

__all__ = [
    "FAMILIES", "Family", "PretrainedInfo", "from_pretrained", "layer_range", "pretrained_info", "pretrained_names",
    "save_pretrained", "supported_architectures",
]

# files of a model folder that describe the tokenizer or generation; copied by save_pretrained
EXTRA_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.txt",
    "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json", "preprocessor_config.json",
)
DEFAULT_SHARD_SIZE = 5 * 2 ** 30
MAX_EXTRA_FILE_BYTES = 128 * 2 ** 20  # a copied tokenizer / generation file (the largest known: ~35 MB)
_MODEL_FILE = re.compile(r"(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json)\Z")


@dataclass(frozen=True)
class Family:
    """One architecture family: how to read its config, build it, and name its tensors."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    config_from_json: Callable[[dict], Any]
    config_to_json: Callable[[Any], dict]
    build: Callable[[Any, Any], Module]
    weight_map: Callable[[Any], WeightMap]
    # (config.json key, count) of the layer stack: checked against the layers the folder holds
    # tensors of before anything is built (the build is linear in the count)
    layers: Callable[[Any], tuple[str, int]] | None = None


_FAMILY_MODULES = ("llama", "gpt2", "bert", "vit")
_families: list[Family] | None = None


def _load_families() -> list[Family]:
    global _families
    if _families is None:
        found = []
        for name in _FAMILY_MODULES:
            try:
                mod = importlib.import_module(f"{__package__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name == f"{__package__}.{name}":
                    continue
                raise
            fams = getattr(mod, "FAMILIES", None) or [getattr(mod, "FAMILY")]
            found.extend(fams)
        _families = found
    return _families


class _Families:
    """`FAMILIES`: the known families, loaded on first use (a sequence of `Family`)."""

    def __iter__(self):
        return iter(_load_families())

    def __len__(self):
        return len(_load_families())

    def __getitem__(self, i):
        return _load_families()[i]

    def __repr__(self):
        return f"FAMILIES({[f.name for f in _load_families()]})"


FAMILIES = _Families()


def supported_architectures() -> list[str]:
    return [a for f in FAMILIES for a in f.architectures]


def _choose_family(config: dict, where: str) -> Family:
    archs = config.get("architectures")
    model_type = config.get("model_type")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise PretrainedError(f"'architectures' must be a list of names, found {archs!r}", where=where)
    for arch in archs or []:
        for fam in FAMILIES:
            if arch in fam.architectures:
                return fam
    if isinstance(model_type, str) and not archs:
        for fam in FAMILIES:
            if model_type in fam.model_types:
                return fam
    found = ", ".join(archs) if archs else (f"model_type {model_type!r}" if model_type else "no 'architectures' "
                                                                                          "or 'model_type'")
    raise PretrainedError(
        f"unsupported architecture: found {found}; supported: {', '.join(supported_architectures())}", where=where
    )


# ---------------------------------------------------------------------------------- model info
@dataclass
class PretrainedInfo:
    """What a model opened by `from_pretrained` remembers of its folder."""

    family: Family
    config: Any                           # the family's config dataclass
    raw_config: dict                      # config.json as read (unknown keys kept for saving)
    folder: Path | None
    names: dict[str, str] = field(default_factory=dict)          # Ember path -> stored name
    stored_dtypes: dict[str, str] = field(default_factory=dict)  # stored name -> dtype in the file
    order: list[str] = field(default_factory=list)               # stored names in file order
    sources: dict = field(default_factory=dict)                  # ParamId -> (lazy state, StoredTensor, rule)


def pretrained_info(model) -> PretrainedInfo | None:
    """The folder information of a model made by `from_pretrained` (kept through transitions)."""
    info = getattr(model, "_pretrained", None)
    return info if isinstance(info, PretrainedInfo) else None


def pretrained_names(model) -> dict[str, str]:
    """{Ember parameter path: Hugging Face tensor name} for a model from `from_pretrained`, or
    for any model of a known family; {} otherwise."""
    info = pretrained_info(model)
    if info is not None:
        return dict(info.names)
    fam, cfg = family_of(model)
    if fam is None:
        return {}
    wmap = fam.weight_map(cfg)
    out = {}
    for path, _ in model.named_params():
        hit = wmap.find(path)
        if hit is not None:
            out[path] = hit[1]
    return out


def family_of(model):
    """`(Family, config)` of a model from `from_pretrained` or of a known architecture with a
    `config`; `(None, None)` for any other module."""
    info = pretrained_info(model)
    if info is not None:
        return info.family, info.config
    cfg = getattr(model, "config", None)
    name = type(model).__name__
    for fam in FAMILIES:
        if name in fam.architectures and cfg is not None:
            return fam, cfg
    return None, None


_family_of = family_of  # engine/models/training_script.py's name, until it moves to the interop room (issue 44)


# ---------------------------------------------------------------------------------- opening
_FLOAT_KINDS = {"F64", "F32", "F16", "BF16", "Flex32"}
_BOOL_DTYPES = {"Bool(Native)", "Bool(U8)", "Bool(U32)", "Bool"}


def _stored_kind(dtype: str) -> str:
    if dtype in _FLOAT_KINDS:
        return "float"
    if dtype.startswith("Bool"):
        return "bool"
    return "int"


class _Attach(ModuleMapper):
    """Replaces every parameter with a lazy one reading its stored tensor (checked beforehand)."""

    def __init__(self, plan, check=None):
        self.plan = plan  # path -> new Param
        self.check = check or _no_check  # runs as each module is entered (a cancellation check)
        self.path: list[str] = []
        self.by_id: dict = {}

    def enter_module(self, name, container_type):
        self.check()
        self.path.append(name)

    def exit_module(self, name, container_type):
        self.path.pop()

    def _map(self, param):
        new = self.plan.get(".".join(self.path))
        return param if new is None else new

    map_float = map_int = map_bool = _map


_WIDE_AS_STORED = {"F32", "F16", "F64"}  # read as stored: the transforms' one pass converts them


def _initializer(stored, rule: Rule, dtype):
    target = as_dtype(dtype).np if dtype is not None else np.dtype(np.float32)

    def init(device, require_grad):
        try:
            if stored.dtype in _WIDE_AS_STORED:
                array = rule.load(stored.read_stored(), dtype=target)
            elif _stored_kind(stored.dtype) == "float":
                array = rule.load(stored.read(), dtype=target)
            else:
                array = rule.load(stored.read())
        except RecordError:
            raise
        except (OSError, ValueError) as exc:
            raise PretrainedError(f"tensor {stored.name!r} could not be read: {exc}", where=str(stored.file)) from None
        t = Tensor.from_data(array, device=device, dtype=dtype if array.dtype.kind == "f" else None)
        return t.require_grad() if require_grad and array.dtype.kind == "f" else t
    return init


def _resolve(source, *, revision=None, token=None, cache_dir=None, local_files_only=False) -> Path:
    """A local folder for `source`: itself when it is a folder, else a Hugging Face Hub model id
    downloaded (or found in the cache) through `huggingface_hub`."""
    text = os.fspath(source)
    p = Path(text).expanduser()
    try:
        is_dir, exists = p.is_dir(), p.exists()
    except OSError as exc:  # a name too long
        raise PretrainedError(f"cannot read: {exc.strerror or exc}", where=text) from None
    if is_dir:
        return p
    if exists:
        raise PretrainedError("expected a model folder (config.json plus weights), found a file", where=text)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", text) or ".." in text:
        raise PretrainedError("no such folder (and not a Hugging Face Hub model id like 'org/name')", where=text)
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a dependency
        raise PretrainedError("downloading from the Hub needs the huggingface_hub package", where=text) from None
    from . import hub  # noqa: PLC0415

    return hub.download(snapshot_download, text, revision=revision, token=token, cache_dir=cache_dir,
                        local_files_only=local_files_only)


def from_pretrained(source, device=None, dtype="float32", *, revision=None, token=None, cache_dir=None,
                    local_files_only=False, check: Callable[[], None] | None = None) -> Module:
    """Open a Hugging Face checkpoint folder (or Hub model id) as an Ember model, lazily.

    `dtype`: the float dtype of the parameters ("float32" by default; "float64" or "float16").
    `check()` (optional; a worker's cancellation check) runs before each layer is built and
    each parameter is matched to its tensor; what it raises stops the open and propagates.
    Raises `PretrainedError` (a `RecordError`) naming the file, the tensor and what was expected;
    the config's layer count is checked against the layers the folder holds tensors of before
    anything is built, so a config that claims 10**12 layers is refused in the time its header
    takes to read.
    """
    folder = _resolve(source, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only)
    ckpt = open_checkpoint(folder, check_config=lambda c: _choose_family(c, str(Path(folder) / "config.json")))
    token_ = _CHECK.set(check)
    try:
        return _open(ckpt, device, dtype, check or _no_check)
    except BaseException:
        ckpt.close()
        raise
    finally:
        _CHECK.reset(token_)


# the `check` of the from_pretrained running in this thread, for the families' layer loops
_CHECK: contextvars.ContextVar = contextvars.ContextVar("ember_from_pretrained_check", default=None)


def _no_check() -> None:
    pass


def layer_range(n: int):
    """`range(n)` for a family's loop that builds its layers: inside `from_pretrained(check=...)`
    `check()` runs before each layer, so a long open can be cancelled between layers."""
    check = _CHECK.get()
    if check is None:
        return range(n)
    return _checked_range(n, check)


def _checked_range(n: int, check):
    for i in range(n):
        check()
        yield i


_LAYER_INDEX = re.compile(r"[0-9]{1,9}")  # a longer index is no layer (a 5000-digit int is not parsed)


def _layers_held(wmap: WeightMap, names) -> set[int]:
    """The layer indices `{i}` of the stored tensors the weight map's per-layer rules name:
    one dict look-up per name (the name with its index replaced by `{i}` is a rule's template)."""
    templates = {r.hf for r in wmap.rules if r.hf.count("{") == 1 and "{i}" in r.hf}
    prefixes = sorted({t.split("{i}")[0] for t in templates}, key=len, reverse=True)
    if not prefixes:
        return set()
    at = re.compile("|".join(re.escape(p) for p in prefixes))
    held = set()
    for name in names:
        m = at.match(name)
        if m is None:
            continue
        digits = _LAYER_INDEX.match(name, m.end())
        if digits is not None and name[:digits.start()] + "{i}" + name[digits.end():] in templates:
            held.add(int(digits.group()))
    return held


def _spans(indices: list[int], limit: int = 4) -> str:
    """'0-1, 5' for [0, 1, 5] (the first `limit` runs, then how many more)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more run(s)" if len(runs) > limit else "")


def _check_layers(fam: Family, cfg, wmap: WeightMap, tensors: dict, where: str) -> None:
    """Refuse a config whose layer count is not the layers the folder holds tensors of, before
    the model (linear in the count) is built."""
    if fam.layers is None:
        return
    key, count = fam.layers(cfg)
    held = sorted(_layers_held(wmap, (n for n in tensors if not wmap.ignored(n))))
    if held == list(range(count)):
        return
    holds = f"the tensors of {len(held)} layer(s) (layers {_spans(held)})" if held else "no per-layer tensors"
    expected = "layer 0" if count == 1 else f"layers 0-{count - 1}"
    raise PretrainedError(f"'{key}' is {count}, but the checkpoint holds {holds}: expected those of {expected}",
                          where=where)


def _open(ckpt: Checkpoint, device, dtype, check: Callable[[], None]) -> Module:
    config_where = str(Path(ckpt.folder) / "config.json")
    fam = _choose_family(ckpt.config, config_where)
    try:
        cfg = fam.config_from_json(ckpt.config)
    except PretrainedError as exc:  # the family sees a dict: name the folder's config.json
        if exc.where in (None, "config.json"):
            raise PretrainedError(exc.reason, where=config_where) from None
        raise
    wmap = fam.weight_map(cfg)
    try:
        canonical = wmap.canonical(list(ckpt.tensors))
    except RecordError as exc:
        raise PretrainedError(str(exc), where=str(ckpt.folder)) from None
    tensors = {name: ckpt.tensors[stored] for name, stored in canonical.items()}
    _check_layers(fam, cfg, wmap, tensors, config_where)
    model = fam.build(cfg, device)
    plan: dict[str, Param] = {}
    names: dict[str, str] = {}
    used: set[str] = set()
    sources = {}
    by_id: dict = {}
    problems: list[str] = []
    for path, param in tree_params(model):  # a new model: no reparameterization
        check()
        if param.id in by_id:  # one parameter used twice (a tied weight): one value, one entry
            plan[path] = by_id[param.id]
            continue
        hit = wmap.find(path)
        if hit is None:
            raise PretrainedError(f"the {fam.name} weight map has no rule for parameter '{path}' "
                                  f"(an Ember bug: every parameter needs one)", where=config_where)
        rule, name = hit
        stored = tensors.get(name)
        if stored is None:
            problems.append(f"tensor '{name}' (for '{path}') is missing")
            continue
        where = str(stored.file)
        try:
            shape = rule.ember_shape(stored.shape)
        except ValueError as exc:
            raise PretrainedError(f"tensor '{name}' does not fit '{path}': {exc}", where=where) from None
        expected = tuple(param.lazy_shape())
        if shape != expected:
            dims = f"dims {list(stored.shape)}" + (f" (dims {list(shape)} after {_describe(rule)})"
                                                   if shape != tuple(stored.shape) else "")
            raise PretrainedError(
                f"tensor '{name}' has {dims}; the config ({Path(config_where).name}) gives '{path}' dims "
                f"{list(expected)}", where=where)
        kind = _stored_kind(stored.dtype)
        if kind != param.kind:
            raise PretrainedError(f"tensor '{name}' holds {stored.dtype} values, '{path}' is a {param.kind} "
                                  f"parameter", where=where)
        new = Param.uninitialized(_initializer(stored, rule, dtype), param.lazy_device(),
                                  param.lazy_is_require_grad(), expected, kind=kind, id=param.id)
        if param.is_running_state():
            new = new.as_running_state()
        plan[path] = by_id[param.id] = new
        names[path] = name
        used.add(name)
        sources[param.id] = (new._lazy, stored, rule)
    if problems:
        first = problems[:5]
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise PretrainedError(f"the checkpoint lacks tensors the config needs: {'; '.join(first)}{more}",
                              where=str(ckpt.folder))
    extra = [n for n in tensors if n not in used and not wmap.ignored(n)]
    if extra:
        where = str(tensors[extra[0]].file)
        shown = ", ".join(f"'{tensors[n].name}'" for n in extra[:5]) + (f" (and {len(extra) - 5} more)" if len(extra) > 5 else "")
        raise PretrainedError(f"{len(extra)} tensor(s) fit no parameter of a {fam.name} model with this config: "
                              f"{shown}", where=where)
    out = model.map(_Attach(plan, check))
    out._pretrained = PretrainedInfo(
        family=fam, config=cfg, raw_config=dict(ckpt.config), folder=Path(ckpt.folder), names=names,
        stored_dtypes={n: tensors[n].dtype for n in used}, order=[n for n in tensors if n in used],
        sources=sources)
    return out


def _describe(rule: Rule) -> str:
    return ", ".join(type(t).__name__ for t in rule.transforms) or "no transform"


# ---------------------------------------------------------------------------------- saving
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
    reparam = [path for path, p in model.named_params() if p.reparameterization is not None]
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


def _untouched(p: Param, info: PretrainedInfo | None):
    """The StoredTensor a parameter still equals (never initialized since it was opened), or None."""
    if info is None or p.is_initialized():
        return None
    src = info.sources.get(p.id)
    if src is None or src[0] is not p._lazy:
        return None
    return src


def _out_for(name, members, info, stored_dtype, dtype) -> _Out:
    split = members[0][0].split
    if split is None:
        rule, p, path = members[0]
        src = _untouched(p, info)
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
