"""`from_pretrained`: Hugging Face checkpoint folders in, lazily; the families that build them.

Opening (`from_pretrained(folder)`):

1. `hf_folder.open_checkpoint` reads `config.json` and the weight files' headers only;
2. the family is chosen from `config.json` (`architectures` first, then `model_type`); a size
   above `hf_folder.MAX_SIZE` (2**31 - 1) is refused as the config is read, and the layer
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

Saving is `engine.models.save` (`save_pretrained`).
"""
from __future__ import annotations

import contextvars
import gc
import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..module import Module, ModuleMapper, Param
from ..store.errors import RecordError
from ..tensor import Tensor
from ..tensor.dtype import as_dtype
from .hf_folder import MAX_CONFIG_BYTES, Checkpoint, PretrainedError, open_checkpoint, read_json
from .mapping import Rule, WeightMap
from .refusals import closest_family, refuse_quantized

__all__ = [
    "FAMILIES", "Family", "PretrainedInfo", "decoder_family", "from_pretrained", "layer_range", "peft_task_type", "pretrained_info",
    "pretrained_names", "supported_architectures",
]

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
    # (config, stored tensor names) -> the weight map to load with, where a family reads more than one
    # layout (the experts of a mixture, fused or one per expert); saving uses `weight_map`
    stored_weight_map: Callable[[Any, Any], WeightMap] | None = None
    # (config, stored module name) -> (the name peft gives that module, whether peft adapts it as a
    # parameter, `target_parameters`): where transformers' modules are not its checkpoint's names (a router)
    peft_name: Callable[[Any, str], tuple[str, bool, bool]] | None = None
    # (config, the peft module names a LoRA adapts) -> None, or a PretrainedError where transformers and
    # peft would not load the adapter as Ember computes it
    check_peft_adapter: Callable[[Any, set], None] | None = None
    # (config, stored tensor name) -> the parameter's name in transformers' module (the fused experts of a
    # mixture, `mlp.experts.gate_up_proj`), where it is not the stored name (the PyTorch training script)
    torch_name: Callable[[Any, str], str] | None = None


def decoder_family(name: str, architecture: str, config_from_json: Callable[[dict], Any], build, weight_map,
                   model_type: str | None = None, **hooks) -> Family:
    """The `Family` of a decoder whose config counts `num_hidden_layers` and writes itself back with
    `to_json()` (the Llama-like families); `hooks`: `Family`'s optional fields."""
    return Family(name=name, architectures=(architecture,), model_types=(model_type or name,),
                  config_from_json=config_from_json, config_to_json=lambda cfg: cfg.to_json(), build=build,
                  weight_map=weight_map, layers=lambda cfg: ("num_hidden_layers", cfg.num_hidden_layers), **hooks)


_FAMILY_MODULES = ("llama", "qwen3", "phi3", "gemma", "moe", "gpt2", "bert", "vit")
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
    refuse_quantized(config, where)  # before the architecture: a quantized Llama is refused as such
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
        f"unsupported architecture: found {found}{closest_family(archs, model_type, supported_architectures())}; "
        f"supported: {', '.join(supported_architectures())}", where=where)


# ---------------------------------------------------------------------------------- model info
@dataclass
class PretrainedInfo:
    """What a model opened by `from_pretrained` remembers of its folder."""

    family: Family
    config: Any                           # the family's config dataclass
    raw_config: dict                      # config.json as read (unknown keys kept for saving)
    folder: Path | None
    names: dict[str, str] = field(default_factory=dict)          # Ember path -> stored (HF) name
    stored_dtypes: dict[str, str] = field(default_factory=dict)  # stored name -> dtype in the file (GGUF: its name)
    order: list[str] = field(default_factory=list)               # stored names in file order
    sources: dict = field(default_factory=dict)                  # ParamId -> (lazy state, StoredTensor, rule)
    generation_config: dict | None = None                        # generation_config.json as read (None: no file)
    gguf: Path | None = None                                     # the GGUF file it was opened from (None: a folder)
    gguf_names: dict[str, str] = field(default_factory=dict)     # Ember path -> GGUF tensor name (GGUF)
    stored_bytes: dict[str, int] = field(default_factory=dict)   # GGUF tensor name -> bytes in the file (GGUF)


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


def peft_task_type(model) -> str | None:
    """peft's `TaskType` for an adapter of `model` (`save_peft_adapter` writes it), from the
    architecture its config.json names (its class for a model made in code): "CAUSAL_LM" for a
    causal language model (`*ForCausalLM`, `GPT2LMHeadModel`: `PeftModel.from_pretrained` then makes
    a `PeftModelForCausalLM`, whose `generate` works), "FEATURE_EXTRACTION" for a bare `BertModel`,
    None (a plain `PeftModel`) for the rest, such as a ViT classifier, which no peft task type fits."""
    info = pretrained_info(model)
    archs = info.raw_config.get("architectures") if info is not None else None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        archs = [type(model).__name__] if family_of(model)[0] is not None else [""]
    if archs[0].endswith(("ForCausalLM", "LMHeadModel")):
        return "CAUSAL_LM"
    return "FEATURE_EXTRACTION" if archs[0] == "BertModel" else None


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


class _Load(ModuleMapper):
    """Replaces each parameter of a new model (no reparameterization) with a lazy one reading its
    stored tensor, in one walk: the weight map's rule for its path, the stored tensor's dims after
    the rule's transforms checked against the parameter's, the stored dtype's kind against its kind.
    A tensor that does not fit raises; missing ones are collected in `problems` (the parameter is
    kept) for the caller to raise after the walk. A parameter used twice (a tied weight) gets the
    one new parameter. `check()` runs as each module and parameter is entered."""

    def __init__(self, family: str, wmap: WeightMap, tensors: dict, dtype, config_where: str, check):
        self.family, self.wmap, self.tensors, self.dtype = family, wmap, tensors, dtype
        self.target = as_dtype(dtype).np if dtype is not None else np.dtype(np.float32)
        self.config_where = config_where
        self.check = None if check is _no_check else check
        self.path: list[str] = []
        self.by_id: dict = {}
        self.names: dict[str, str] = {}  # Ember path -> stored (canonical) name
        self.used: set[str] = set()
        self.sources: dict = {}  # param id -> (lazy state, StoredTensor, Rule)
        self.problems: list[str] = []

    def enter_module(self, name, container_type):
        if self.check is not None:
            self.check()
        self.path.append(name)

    def exit_module(self, name, container_type):
        self.path.pop()

    def _map(self, param):
        new = self.by_id.get(param.id)
        if new is not None:
            return new
        path = ".".join(self.path)
        hit = self.wmap.find(path)
        if hit is None:
            raise PretrainedError(f"the {self.family} weight map has no rule for parameter '{path}' "
                                  f"(an Ember bug: every parameter needs one)", where=self.config_where)
        rule, name = hit
        stored = self.tensors.get(name)
        if stored is None:
            self.problems.append(f"tensor '{name}' (for '{path}') is missing")
            return param
        try:
            shape = rule.ember_shape(stored.shape)
        except ValueError as exc:
            raise PretrainedError(f"tensor '{name}' does not fit '{path}': {exc}", where=str(stored.file)) from None
        expected = param.lazy_shape()
        if shape != expected:
            dims = f"dims {list(stored.shape)}" + (f" (dims {list(shape)} after {_describe(rule)})"
                                                   if shape != tuple(stored.shape) else "")
            raise PretrainedError(
                f"tensor '{name}' has {dims}; the config ({Path(self.config_where).name}) gives '{path}' dims "
                f"{list(expected)}", where=str(stored.file))
        kind = _stored_kind(stored.dtype)
        if kind != param.kind:
            raise PretrainedError(f"tensor '{name}' holds {stored.dtype} values, '{path}' is a {param.kind} "
                                  f"parameter", where=str(stored.file))
        new = Param.uninitialized(_initializer(stored, rule, self.dtype, self.target), param.lazy_device(),
                                  param.is_require_grad(), expected, kind=kind, id=param.id)
        if param.is_running_state():
            new = new.as_running_state()
        self.by_id[param.id] = new
        self.names[path] = name
        self.used.add(name)
        self.sources[param.id] = (new.lazy_state(), stored, rule)
        return new

    map_float = map_int = map_bool = _map


_WIDE_AS_STORED = {"F32", "F16", "F64"}  # read as stored: the transforms' one pass converts them


def _initializer(stored, rule: Rule, dtype, target=None):
    if target is None:
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


def _is_gguf(source) -> bool:
    """Whether `source` names a GGUF file: a file whose name ends in .gguf or that starts with the
    GGUF magic bytes."""
    try:
        p = Path(os.fspath(source)).expanduser()
        if not p.is_file():
            return False
        if p.suffix.lower() == ".gguf":
            return True
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, TypeError, ValueError):
        return False


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
    from . import hub  # noqa: PLC0415

    if not hub.is_hub_id(text):
        raise PretrainedError("no such folder (and not a Hugging Face Hub model id like 'org/name')", where=text)
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a dependency
        raise PretrainedError("downloading from the Hub needs the huggingface_hub package", where=text) from None

    return hub.download(snapshot_download, text, revision=revision, token=token, cache_dir=cache_dir,
                        local_files_only=local_files_only)


def from_pretrained(source, device=None, dtype="float32", *, revision=None, token=None, cache_dir=None,
                    local_files_only=False, check: Callable[[], None] | None = None) -> Module:
    """Open a Hugging Face checkpoint folder (or Hub model id), or a GGUF file (`engine.models.gguf_model`:
    quantized weights kept quantized), as an Ember model, lazily.

    `dtype`: the float dtype of the parameters ("float32" by default; "float64" or "float16").
    `check()` (optional; a worker's cancellation check) runs before each layer is built and
    each parameter is matched to its tensor; what it raises stops the open and propagates.
    Raises `PretrainedError` (a `RecordError`) naming the file, the tensor and what was expected;
    the config's layer count is checked against the layers the folder holds tensors of before
    anything is built, so a config that claims 10**12 layers is refused in the time its header
    takes to read.
    """
    # the open makes a few objects per parameter and no garbage: the cyclic collector's passes over
    # them took more than half of opening Qwen3-30B-A3B's 18,867 tensors (benchmarks/moe_open.py)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _from_pretrained(source, device, dtype, revision, token, cache_dir, local_files_only, check)
    finally:
        if collecting:
            gc.enable()


def _from_pretrained(source, device, dtype, revision, token, cache_dir, local_files_only, check) -> Module:
    if _is_gguf(source):
        from .gguf_model import from_gguf  # noqa: PLC0415 - gguf_model imports this module

        token_ = _CHECK.set(check)
        try:
            return from_gguf(source, device, dtype, check)
        finally:
            _CHECK.reset(token_)
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
    held = sorted(_layers_held(wmap, wmap.kept(tensors)))
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
    wmap = fam.weight_map(cfg) if fam.stored_weight_map is None else fam.stored_weight_map(cfg, list(ckpt.tensors))
    try:
        canonical = wmap.canonical(list(ckpt.tensors))
    except RecordError as exc:
        raise PretrainedError(str(exc), where=str(ckpt.folder)) from None
    tensors = {name: ckpt.tensors[stored] for name, stored in canonical.items()}
    _check_layers(fam, cfg, wmap, tensors, config_where)
    model = fam.build(cfg, device)
    load = _Load(fam.name, wmap, tensors, dtype, config_where, check)
    out = model.map(load)  # one walk: each parameter matched, checked and replaced as it is reached
    if load.problems:
        first = load.problems[:5]
        more = f" (and {len(load.problems) - 5} more)" if len(load.problems) > 5 else ""
        raise PretrainedError(f"the checkpoint lacks tensors the config needs: {'; '.join(first)}{more}",
                              where=str(ckpt.folder))
    used = load.used
    extra = [n for n in tensors if n not in used and not wmap.ignored(n)]
    if extra:
        where = str(tensors[extra[0]].file)
        shown = ", ".join(f"'{tensors[n].name}'" for n in extra[:5]) + (f" (and {len(extra) - 5} more)" if len(extra) > 5 else "")
        raise PretrainedError(f"{len(extra)} tensor(s) fit no parameter of a {fam.name} model with this config: "
                              f"{shown}", where=where)
    generation = _generation_config(Path(ckpt.folder))
    out._pretrained = PretrainedInfo(
        family=fam, config=cfg, raw_config=dict(ckpt.config), folder=Path(ckpt.folder), names=load.names,
        stored_dtypes={n: tensors[n].dtype for n in used}, order=[n for n in tensors if n in used],
        sources=load.sources, generation_config=generation)
    return out


GENERATION_CONFIG = "generation_config.json"


def _generation_config(folder: Path) -> dict | None:
    """The folder's generation_config.json (bounded like config.json), None when it has none; a
    file that is not a JSON object is a PretrainedError naming it."""
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        return None
    doc = read_json(path, MAX_CONFIG_BYTES, GENERATION_CONFIG)
    if not isinstance(doc, dict):
        raise PretrainedError(f"expected a JSON object of generation settings, found {type(doc).__name__}",
                              where=str(path))
    return doc


def _describe(rule: Rule) -> str:
    return ", ".join(type(t).__name__ for t in rule.transforms) or "no transform"
