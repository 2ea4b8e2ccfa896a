"""PEFT (Hugging Face `peft`) LoRA adapters in and out: `load_peft_adapter`, `save_peft_adapter`.

An adapter folder holds `adapter_config.json` and `adapter_model.safetensors`, tensors named

    base_model.model.<module>.lora_A.weight          [r, d_in]       Ember lora.a [d_in, r]: transposed
    base_model.model.<module>.lora_B.weight          [d_out, r]      Ember lora.b [r, d_out]: transposed
    base_model.model.<module>.lora_magnitude_vector  [d_out]         DoRA (use_dora): Ember lora.magnitude
    base_model.model.<module>.lora_embedding_A       [r, V]          an Embedding's LoRA: Ember lora.a [V, r]
    base_model.model.<module>.lora_embedding_B       [d, r]          Ember lora.b [r, d]
    base_model.model.<module>.base_layer.weight      the base weight peft saves along with an embedding LoRA

where `<module>` is the Hugging Face module path (`model.layers.0.self_attn.q_proj`): for a model of
a known family (`from_pretrained`) it comes from the family's weight map (`pretrained_names`), for
any other model it is the Ember module path. The factors go through the same layout transforms as
the weight they adapt (`engine.models.mapping`): the B factor's rows (and a DoRA magnitude) of
Llama's q_proj / k_proj are permuted like the weight's rows (rotary convention), and GPT-2's fused
`c_attn` LoRA (one A, one B of 3·d rows) becomes three LoRAs on Ember's query / key / value with
the same A and B's three row blocks: the same function exactly. Saving three LoRAs that differ
writes one c_attn LoRA of their summed rank whose B is block diagonal (again exact), with its rank
and alpha in `rank_pattern` / `alpha_pattern`.

The scale of a module's adapter is `alpha / r` (`alpha / sqrt(r)` with `use_rslora`), `r` and
`alpha` from `rank_pattern` / `alpha_pattern` where a key matches the module (peft's rule), else
`r` / `lora_alpha`. `target_modules` is a list (exact name or suffix after a dot), a regex (full
match) or "all-linear" (every Linear but the output head); `target_group` and `peft_lora` apply
the same rules to attach fresh adapters.

Loading checks the config and every tensor's name, dtype and shape from the header before it reads
anything, and never runs code from the folder (no pickle). An adapter for another base, a
tensor no module fits, a target without its tensors, an unsupported `peft_type` or option: a
`PretrainedError` naming the file and the tensor; the model is never changed (a new one is returned).
An adapter that would load broken is refused too: adapter_config.json is read as config.json is
(bounded, nested at most 64 levels, no NaN / Infinity), `lora_alpha` and `alpha_pattern` must be
finite of magnitude at most 2^20, `r` and `rank_pattern` positive integers up to 2^20,
`use_rslora` / `use_dora` true or false; the weights file must end with its last tensor's data
(nothing after it is read) and each tensor is read once, when needed; a NaN or infinite value is
refused naming its tensor, as is an update `scale * B @ A` that can leave float32's range.

Saving writes both files into a staging folder and swaps it in at once
(`engine.store.atomic.save_folder`): a save killed at any moment leaves the old adapter or the
new one, never the config of one and the tensors of the other; a full disk is a
PretrainedError and leaves the old adapter.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import regex as _regex  # a user's regex (adapter_config.json) matches with a timeout

from .. import nn
from ..module import Module, Param, ParamGroup
from ..module.group import MATCH_TIMEOUT_S
from ..module.lora import DoraAdapter, Lora, LoraAdapter, RsLoraAdapter, pattern_key
from ..module.reparam import Reparameterizer, adapters_of, apply_reparameterization
from ..module.tree import FieldKind, walk
from ..store import safetensors_io
from ..store.atomic import os_error_reason, save_folder, write_new_file
from ..store.burnpack import bf16_to_float32, storage_dtype
from ..store.errors import RecordError
from ..store.filesource import FileSource
from ..tensor import Tensor
from .hf_folder import MAX_CONFIG_BYTES, PretrainedError, read_json
from .mapping import Rule, Split, Transpose

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "PeftTarget", "load_peft_adapter", "peft_lora", "peft_targets",
           "save_peft_adapter", "target_group"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_RANK = 1 << 20     # r and rank_pattern: far above any adapter's rank, the tensors' shapes decide the rest
MAX_ALPHA = 1 << 20    # |lora_alpha| and alpha_pattern: finite, far above any adapter's (8 to a few hundred)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
PREFIX = "base_model.model."
_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector", ".lora_embedding_A", ".lora_embedding_B",
             ".base_layer.weight")
_FLOATS = {"F64", "F32", "F16", "BF16"}

# adapter_config.json options Ember cannot honour: (key, the value that is fine, what it means)
_UNSUPPORTED = [
    ("bias", ("none", None), "trained biases (bias != 'none')"),
    ("lora_bias", (False, None), "a LoRA bias (lora_bias)"),
    ("modules_to_save", (None, []), "fully trained modules (modules_to_save)"),
    ("layers_to_transform", (None, []), "layers_to_transform"),
    ("layers_pattern", (None, [], ""), "layers_pattern"),
    ("target_parameters", (None, []), "LoRA on parameters (target_parameters)"),
    ("trainable_token_indices", (None, {}, []), "trainable tokens (trainable_token_indices)"),
    ("layer_replication", (None, []), "layer_replication"),
    ("use_qalora", (False, None), "QA-LoRA (use_qalora)"),
    ("alora_invocation_tokens", (None, []), "activated LoRA (alora_invocation_tokens)"),
    ("use_bdlora", (None, False), "block-diagonal LoRA (use_bdlora)"),
    ("megatron_config", (None,), "Megatron layers (megatron_config)"),
]


# ---------------------------------------------------------------------------------- targets
@dataclass
class PeftTarget:
    """One Ember weight a PEFT LoRA can adapt: its path, the PEFT module name, the layer kind
    ("linear" or "embedding") and the weight map rule between the stored weight and Ember's."""

    path: str            # Ember parameter path, `layers.0.self_attn.query.weight`
    module: str          # PEFT / Hugging Face module name, `model.layers.0.self_attn.q_proj`
    kind: str            # "linear" | "embedding"
    rule: Rule
    param: Param = field(repr=False)

    @property
    def torch_layout(self) -> bool:
        """Whether the stored weight is torch's nn.Linear `[out, in]` (else `[in, out]`: GPT-2's
        Conv1D, an Embedding)."""
        return any(isinstance(t, Transpose) for t in self.rule.transforms)

    @property
    def split(self) -> Split | None:
        return self.rule.split


def _family_rules(model):
    from .pretrained import family_of, pretrained_names  # noqa: PLC0415 - pretrained imports the families

    fam, cfg = family_of(model)
    if fam is None:
        return None, {}
    return fam.weight_map(cfg), pretrained_names(model)


def peft_targets(model: Module) -> list[PeftTarget]:
    """Every weight of a Linear or Embedding layer of `model`, with its PEFT module name."""
    if not isinstance(model, Module):
        raise TypeError(f"expected a Module, got {type(model).__name__}")
    wmap, names = _family_rules(model)
    out = []
    seen = set()
    for path, kind, value in walk(model):
        if kind != FieldKind.MODULE or not isinstance(value, (nn.Linear, nn.Embedding)):
            continue
        p = value.weight
        wpath = f"{path}.weight" if path else "weight"
        if not isinstance(p, Param) or p.id in seen:
            continue
        seen.add(p.id)
        layer = "embedding" if isinstance(value, nn.Embedding) else "linear"
        if wmap is not None:
            hit = wmap.find(wpath)
            if hit is None or wpath not in names:
                continue
            rule, stored = hit
            if not stored.endswith(".weight"):
                continue
            module = stored[: -len(".weight")]
        else:
            module = path
            rule = Rule(wpath, wpath, [Transpose()] if layer == "linear" else [])
        out.append(PeftTarget(wpath, module, layer, rule, p))
    return out


def _tied(model) -> bool:
    """Whether the model's output head is its input embedding, transposed (tie_word_embeddings)."""
    return bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))


def _output_head(targets: list[PeftTarget]) -> set[str]:
    return {t.module for t in targets if t.module.rpartition(".")[2] == "lm_head"}


def _compiled(pattern: str, key: str, fail):
    try:
        return _regex.compile(pattern)
    except (_regex.error, RecursionError, OverflowError, ValueError) as exc:
        fail(f"{key} {pattern!r} is not a valid regex: {exc}")


def _full(rx, name: str, fail) -> bool:
    try:
        return rx.fullmatch(name, timeout=MATCH_TIMEOUT_S) is not None
    except TimeoutError:
        fail(f"the regex {rx.pattern!r} took longer than {MATCH_TIMEOUT_S:g} s to match '{name}': expected a "
             f"pattern without nested repetition such as (.*.*)*")


def _select(targets: list[PeftTarget], target_modules, exclude_modules=None, where=None) -> list[PeftTarget]:
    """The targets PEFT's rules select (`check_target_module_exists` in peft 0.21)."""
    def fail(msg):
        raise PretrainedError(msg, where=where) if where else ValueError(msg)

    def suffix_match(names, key):
        return key in names or any(key.endswith(f".{n}") for n in names)

    if isinstance(target_modules, str):
        if target_modules.lower() == "all-linear":
            head = _output_head(targets)
            chosen = [t for t in targets if t.kind == "linear" and t.module not in head]
        else:
            rx = _compiled(target_modules, "target_modules", fail)
            chosen = [t for t in targets if _full(rx, t.module, fail)]
    elif isinstance(target_modules, (list, tuple, set)) and all(isinstance(n, str) for n in target_modules):
        names = set(target_modules)
        if "all-linear" in names and len(names) == 1:
            return _select(targets, "all-linear", exclude_modules, where)
        chosen = [t for t in targets if suffix_match(names, t.module)]
    else:
        fail(f"target_modules must be a list of module names, a regex or 'all-linear', found {target_modules!r}")
    if exclude_modules:
        if isinstance(exclude_modules, str):
            rx = _compiled(exclude_modules, "exclude_modules", fail)
            chosen = [t for t in chosen if not _full(rx, t.module, fail)]
        elif isinstance(exclude_modules, (list, tuple, set)) and all(isinstance(n, str) for n in exclude_modules):
            ex = set(exclude_modules)
            chosen = [t for t in chosen if not suffix_match(ex, t.module)]
        else:
            fail(f"exclude_modules must be a list of module names or a regex, found {exclude_modules!r}")
    if not chosen:
        known = sorted({t.module.rpartition(".")[2] for t in targets})
        fail(f"target_modules {target_modules!r} match no Linear or Embedding module of this model; its module "
             f"names end in {', '.join(known)}")
    return chosen


def target_group(model: Module, target_modules, exclude_modules=None) -> ParamGroup:
    """The weights PEFT's `target_modules` select, as a `ParamGroup` of Ember paths. Names are
    Hugging Face module names for a model of a known family, Ember module paths otherwise."""
    return ParamGroup.from_paths([t.path for t in _select(peft_targets(model), target_modules, exclude_modules)])


def peft_lora(model: Module, r: int = 8, lora_alpha: float = 8, target_modules="all-linear", *,
              use_rslora: bool = False, use_dora: bool = False, rank_pattern: dict | None = None,
              alpha_pattern: dict | None = None, exclude_modules=None, init_std: float | None = None) -> Lora:
    """A `Lora` configured as peft's `LoraConfig` with these values would be, for `model`
    (targets and pattern keys matched on its PEFT module names): `model.apply_lora(peft_lora(...))`."""
    chosen = _select(peft_targets(model), target_modules, exclude_modules)
    return Lora(r, lora_alpha, init_std, ParamGroup.from_paths([t.path for t in chosen]), use_rslora=use_rslora,
                use_dora=use_dora, rank_pattern=rank_pattern, alpha_pattern=alpha_pattern,
                module_names={t.path: t.module for t in chosen})


# ---------------------------------------------------------------------------------- loading
def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _rank_problem(x) -> str | None:
    """Why `x` is not a LoRA rank (a positive integer up to MAX_RANK; 8.0 counts as 8), or None."""
    if not _is_number(x) or (isinstance(x, float) and not (math.isfinite(x) and x.is_integer())):
        return "a positive integer expected"
    if not 0 < x <= MAX_RANK:
        return f"a positive integer of at most {MAX_RANK} expected"
    return None


def _alpha_problem(x) -> str | None:
    """Why `x` is not a LoRA alpha (a finite number of magnitude at most MAX_ALPHA), or None: NaN,
    Infinity or 1e308 would make every logit NaN."""
    if not _is_number(x):
        return "a number expected"
    if not (math.isfinite(x) and abs(x) <= MAX_ALPHA):
        return f"a finite number of magnitude at most {MAX_ALPHA} expected"
    return None


def _read_config(folder: Path) -> tuple[dict, str]:
    path = folder / ADAPTER_CONFIG
    where = str(path)
    try:
        is_folder, is_file = folder.is_dir(), path.is_file()
    except OSError as exc:  # a name too long
        raise PretrainedError(f"cannot read: {exc.strerror or exc}", where=str(folder)) from None
    if not is_folder:
        raise PretrainedError("expected a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)",
                              where=str(folder))
    if not is_file:
        held = ", ".join(sorted(p.name for p in folder.iterdir())[:10]) or "nothing"
        raise PretrainedError(f"no {ADAPTER_CONFIG}: expected a PEFT adapter folder; it holds {held}",
                              where=str(folder))
    # bounded size and nesting, NaN / Infinity refused (json.loads takes them), every problem a PretrainedError
    config = read_json(path, MAX_CONFIG_BYTES, "not a readable JSON file")
    if not isinstance(config, dict):
        raise PretrainedError(f"expected a JSON object, found {type(config).__name__}", where=where)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise PretrainedError(f"unsupported peft_type {_short(peft_type)}: expected 'LORA' (LoRA, rsLoRA, DoRA)",
                              where=where)
    for key, fine, what in _UNSUPPORTED:
        if key in config and config[key] not in fine:
            raise PretrainedError(f"{what} is not supported: found {key} = {_short(config[key])}, expected "
                                  f"{fine[0]!r}", where=where)
    r, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or _rank_problem(r):
        raise PretrainedError(f"'r' must be a positive integer of at most {MAX_RANK}, found {_short(r)}", where=where)
    problem = _alpha_problem(alpha)
    if problem:
        raise PretrainedError(f"'lora_alpha': {problem}, found {_short(alpha)}", where=where)
    for key, check in (("rank_pattern", _rank_problem), ("alpha_pattern", _alpha_problem)):
        v = config.get(key) or {}
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise PretrainedError(f"'{key}' must map module patterns to numbers, found {_short(v)}", where=where)
        for k, x in v.items():
            problem = check(x)
            if problem:
                raise PretrainedError(f"'{key}' [{_short(k)}]: {problem}, found {_short(x)}", where=where)
    for key in ("use_rslora", "use_dora"):
        if config.get(key) not in (None, True, False):  # bool("false") is True: a silently other scale
            raise PretrainedError(f"'{key}' must be true or false, found {_short(config[key])}", where=where)
    if config.get("target_modules") is None:
        raise PretrainedError("'target_modules' is missing: expected a list of module names, a regex or "
                              "'all-linear'", where=where)
    return config, where


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def _read_tensors(folder: Path) -> tuple[dict, str, FileSource, list]:
    """The weights file's tensors from its header; the file stays open (the caller closes the
    source) and each tensor is read when it is needed. A file longer than its tensors (a sparse
    hole of gigabytes after them) is refused from its size."""
    path = folder / ADAPTER_WEIGHTS
    where = str(path)
    try:
        is_file = path.is_file()
    except OSError as exc:
        raise PretrainedError(f"cannot read: {exc.strerror or exc}", where=where) from None
    if not is_file:
        other = [n for n in ("adapter_model.bin",) if (folder / n).is_file()]
        hint = f" (found {other[0]}: save the adapter with safe_serialization=True)" if other else ""
        raise PretrainedError(f"no {ADAPTER_WEIGHTS}{hint}", where=str(folder))
    try:
        src = FileSource(path, where)
    except RecordError as exc:
        raise PretrainedError(exc.reason, where=exc.where) from None
    try:
        first = src.read_bytes(0, 16)
        head = src.read_bytes(0, safetensors_io.head_length(first, src.size, where))
        plan = safetensors_io.plan(head, src.size, where)
    except BaseException as exc:
        src.close()
        if isinstance(exc, RecordError):
            raise PretrainedError(exc.reason, where=exc.where) from None
        raise
    return {t.name: t for t in plan.tensors}, where, src, plan.tensors


def _array(src: FileSource, t) -> np.ndarray:
    """Tensor `t` read from the file as float32 (float64 for F64); NaN or infinity refused, naming
    the tensor: one would make every logit NaN."""
    try:
        raw = src.read_array(t.offset, storage_dtype(t.dtype), t.count).reshape(t.shape)
    except RecordError as exc:
        raise PretrainedError(exc.reason, where=exc.where) from None
    raw = bf16_to_float32(raw) if t.dtype == "BF16" else raw
    arr = np.array(raw, dtype=np.float32 if t.dtype != "F64" else np.float64)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = int(arr.size - np.count_nonzero(finite))
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise PretrainedError(f"tensor '{t.name}' holds {bad} NaN or infinite value(s) (the first at index "
                              f"{list(first)}: {arr[first]}); an adapter's values must be finite", where=src.where)
    return arr


def _scale(rank: int, alpha: float, rslora: bool) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def _factor_layout(t: PeftTarget, b_stored: np.ndarray) -> np.ndarray:
    """peft's B `[d_out, r]` (or an embedding's lora_embedding_B `[d, r]`) in the stored weight's
    layout, ready for the rule's transforms."""
    return b_stored if t.torch_layout else b_stored.T


@dataclass
class _Planned:
    a: np.ndarray
    b: np.ndarray
    scale: float
    magnitude: np.ndarray | None = None
    base: np.ndarray | None = None
    rslora: bool = False


class _AttachPlanned(Reparameterizer):
    """Attaches the adapters of a checked plan ({Ember path: _Planned}); freezes everything else."""

    FREEZES_RUNNING_STATE = True

    def __init__(self, plan: dict[str, _Planned]):
        self.plan = plan

    def reparameterize(self, path, param):
        base = param.set_require_grad(False)
        item = self.plan.get(path)
        if item is None:
            return base, None
        device = param.lazy_device()
        dtype = param.base().dtype if param.is_initialized() else device.default_float_dtype
        if item.base is not None:
            value = Tensor.from_data(item.base, device=device, dtype=dtype)
            base = Param.initialized(value.autodiff() if param.is_autodiff() else value, id=param.id)
            base = base.set_require_grad(False)

        def trainable(array):
            return Param(Tensor.from_data(np.ascontiguousarray(array), device=device, dtype=dtype))

        a, b = trainable(item.a), trainable(item.b)
        if item.magnitude is not None:
            adapter = DoraAdapter(a, b, item.scale, trainable(item.magnitude), item.rslora)
        else:
            adapter = (RsLoraAdapter if item.rslora else LoraAdapter)(a, b, item.scale)
        return base, adapter if param.is_autodiff() else adapter.valid()


def load_peft_adapter(model: Module, folder) -> Module:
    """`model` with the LoRA / rsLoRA / DoRA adapters of a PEFT adapter folder attached (a new
    model; every other parameter frozen, as `Lora` freezes them). See this file's doc."""
    if not isinstance(model, Module):
        raise TypeError(f"load_peft_adapter expects a Module, got {type(model).__name__}")
    folder = Path(os.fspath(folder))
    config, config_where = _read_config(folder)
    tensors, where, src, order = _read_tensors(folder)
    try:
        return _load(model, config, config_where, tensors, where, src)
    finally:
        src.close()


def _load(model: Module, config: dict, config_where: str, tensors: dict, where: str, src: FileSource) -> Module:
    targets = peft_targets(model)
    by_module: dict[str, list[PeftTarget]] = {}
    for t in targets:
        by_module.setdefault(t.module, []).append(t)
    rslora = bool(config.get("use_rslora"))
    dora = bool(config.get("use_dora"))
    r0, alpha0 = int(config["r"]), float(config["lora_alpha"])
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    model_name = type(model).__name__

    # names -> (module, suffix), every tensor accounted for
    found: dict[str, dict[str, object]] = {}
    for name, t in tensors.items():
        if not name.startswith(PREFIX):
            raise PretrainedError(f"tensor '{name}' is not a PEFT LoRA tensor: expected names beginning with "
                                  f"'{PREFIX}'", where=where)
        rest = name[len(PREFIX):]
        suffix = next((s for s in _SUFFIXES if rest.endswith(s)), None)
        if suffix is None:
            raise PretrainedError(f"tensor '{name}' is not a LoRA tensor Ember reads: expected a name ending in "
                                  f"{', '.join(_SUFFIXES)}", where=where)
        module = rest[: -len(suffix)]
        if module not in by_module:
            raise PretrainedError(f"tensor '{name}': this {model_name} has no Linear or Embedding module "
                                  f"'{module}' (an adapter for another base model?)", where=where)
        if t.dtype not in _FLOATS:
            raise PretrainedError(f"tensor '{name}' holds {t.dtype} values, expected floats", where=where)
        found.setdefault(module, {})[suffix] = t

    wanted = {t.module for t in _select(targets, config["target_modules"], config.get("exclude_modules"),
                                        config_where)}
    missing = sorted(wanted - set(found))
    if missing:
        raise PretrainedError(f"adapter_config.json targets {len(missing)} module(s) the weights file has no "
                              f"tensors for, e.g. '{missing[0]}' (expected '{PREFIX}{missing[0]}.lora_A.weight'): an "
                              f"adapter for another base model?", where=where)
    plan: dict[str, _Planned] = {}
    reads = []  # (module, targets, tensors) after every shape is checked
    for module, parts in found.items():
        members = by_module[module]
        kind = members[0].kind
        names = ("lora_embedding_A", "lora_embedding_B") if kind == "embedding" else ("lora_A.weight",
                                                                                        "lora_B.weight")
        ta, tb = parts.get("." + names[0]), parts.get("." + names[1])
        if module not in wanted and (ta is not None or tb is not None):
            n = (ta or tb).name
            raise PretrainedError(f"tensor '{n}': module '{module}' is not among adapter_config.json's target_modules "
                                  f"{config['target_modules']!r}", where=where)
        other = ("lora_A.weight", "lora_B.weight") if kind == "embedding" else ("lora_embedding_A",
                                                                                  "lora_embedding_B")
        for o, mine in zip(other, names):
            if "." + o in parts:
                raise PretrainedError(f"tensor '{parts['.' + o].name}': '{module}' is an {kind} layer in this "
                                      f"{model_name}, expected '{PREFIX}{module}.{mine}'", where=where)
        if ta is None or tb is None:
            lost = names[0] if ta is None else names[1]
            raise PretrainedError(f"tensor '{PREFIX}{module}.{lost}' is missing (module '{module}' has only "
                                  f"{', '.join(sorted(x.lstrip('.') for x in parts))})", where=where)
        if kind == "embedding" and _tied(model):
            raise PretrainedError(f"tensor '{ta.name}': an embedding LoRA on a model whose output head is tied to "
                                  f"'{module}' is not supported (peft adapts the input embedding only, Ember's tied "
                                  f"head would use the adapted weight too)", where=where)
        mag = parts.get(".lora_magnitude_vector")
        if dora and mag is None:
            raise PretrainedError(f"tensor '{PREFIX}{module}.lora_magnitude_vector' is missing: the config has "
                                  f"use_dora", where=where)
        if mag is not None and not dora:
            raise PretrainedError(f"tensor '{mag.name}' is a DoRA magnitude, but adapter_config.json does not set "
                                  f"use_dora", where=where)
        try:
            key = pattern_key(rank_pattern, module)
            rank = int(rank_pattern[key]) if key is not None else r0
            key = pattern_key(alpha_pattern, module)
            alpha = float(alpha_pattern[key]) if key is not None else alpha0
        except (ValueError, _regex.error, RecursionError, OverflowError) as exc:
            raise PretrainedError(f"rank_pattern / alpha_pattern: {exc}", where=config_where) from None
        # every shape, before any data
        d_in = members[0].param.lazy_shape()[0]
        if tuple(ta.shape) != (rank, d_in):
            raise PretrainedError(f"tensor '{ta.name}' has dims {list(ta.shape)}; '{module}' ({members[0].path} "
                                  f"{list(members[0].param.lazy_shape())}) with r = {rank} needs [{rank}, {d_in}]",
                                  where=where)
        out_total = sum(m.param.lazy_shape()[1] for m in members)
        if tuple(tb.shape) != (out_total, rank):
            raise PretrainedError(f"tensor '{tb.name}' has dims {list(tb.shape)}; '{module}' with r = {rank} needs "
                                  f"[{out_total}, {rank}]", where=where)
        if mag is not None and tuple(mag.shape) != (out_total,):
            raise PretrainedError(f"tensor '{mag.name}' has dims {list(mag.shape)}; '{module}' needs [{out_total}]",
                                  where=where)
        base = parts.get(".base_layer.weight")
        if base is not None:
            if len(members) != 1:
                raise PretrainedError(f"tensor '{base.name}': a base weight for a split module is not supported",
                                      where=where)
            try:
                shape = members[0].rule.ember_shape(base.shape)
            except ValueError as exc:
                raise PretrainedError(f"tensor '{base.name}' does not fit '{members[0].path}': {exc}",
                                      where=where) from None
            if shape != tuple(members[0].param.lazy_shape()):
                raise PretrainedError(f"tensor '{base.name}' has dims {list(base.shape)}; '{members[0].path}' is "
                                      f"{list(members[0].param.lazy_shape())}", where=where)
        for m in members:
            try:
                m.rule.ember_shape(_factor_layout(m, np.empty(tb.shape, np.float32)).shape)
            except ValueError as exc:
                raise PretrainedError(f"tensor '{tb.name}' does not fit '{m.path}': {exc}", where=where) from None
        reads.append((module, members, ta, tb, mag, base, _scale(rank, alpha, rslora)))

    for module, members, ta, tb, mag, base, scale in reads:
        A, B = _array(src, ta), _array(src, tb)
        # each entry of scale * B @ A is at most r * max|A| * max|B| * |scale|: past float32's range
        # the adapted weight would be infinite (and every logit NaN), though each value is finite
        bound = A.shape[0] * float(np.abs(A).max(initial=0)) * float(np.abs(B).max(initial=0)) * abs(scale)
        if not bound <= _FLOAT32_MAX:
            raise PretrainedError(f"tensors '{ta.name}' and '{tb.name}': the update {scale:g} * B @ A can reach "
                                  f"{bound:.3g}, beyond float32's range ({_FLOAT32_MAX:.3g})", where=where)
        M = None if mag is None else _array(src, mag)
        for m in members:
            b = m.rule.load(_factor_layout(m, B))
            mm = None
            if M is not None:
                col = M[:, None] if m.torch_layout else M[None, :]
                mm = np.ascontiguousarray(m.rule.load(col)).reshape(-1)
            base_arr = None if base is None else m.rule.load(_array(src, base))
            plan[m.path] = _Planned(np.ascontiguousarray(A.T), np.ascontiguousarray(b), scale, mm, base_arr, rslora)
    return apply_reparameterization(model, _AttachPlanned(plan))


# ---------------------------------------------------------------------------------- saving
def _np(p: Param) -> np.ndarray:
    return np.asarray(p.val().numpy(), dtype=np.float32)


def _tidy(x: float) -> float | int:
    v = float(f"{x:.12g}")
    return int(v) if v.is_integer() else v


def save_peft_adapter(model: Module, folder, *, base_model_name_or_path: str | None = None) -> Path:
    """Write the LoRA / rsLoRA / DoRA adapters of `model` as a PEFT adapter folder that
    `PeftModel.from_pretrained(base, folder)` loads (see this file's doc). Returns the folder."""
    if not isinstance(model, Module):
        raise TypeError(f"save_peft_adapter expects a Module, got {type(model).__name__}")
    adapters = adapters_of(model)  # a GGUF weight kept in its blocks is the base, not an adapter
    if not adapters:
        raise PretrainedError(f"this {type(model).__name__} has no LoRA adapters to save: attach them with "
                              f"apply_lora first")
    targets = {t.path: t for t in peft_targets(model)}
    for path, r in adapters.items():
        if not isinstance(r, LoraAdapter):
            raise PretrainedError(f"'{path}' carries a {type(r).__name__}: a PEFT adapter holds LoRA factors only")
        if path not in targets:
            raise PretrainedError(f"'{path}' is not the weight of a Linear or Embedding layer: peft has no LoRA for it")
    tied = [p for p in adapters if targets[p].kind == "embedding" and _tied(model)]
    if tied:
        raise PretrainedError(f"'{tied[0]}' carries a LoRA, but this {type(model).__name__}'s output head is tied to "
                              f"it: peft would adapt the input embedding only, so the adapter would not give Ember's "
                              f"outputs; leave the embedding out of the LoRA group")
    doras = [isinstance(r, DoraAdapter) for r in adapters.values()]
    if any(doras) and not all(doras):
        raise PretrainedError("some adapters are DoRA and some are not: peft's use_dora is one setting for the whole "
                              "adapter")
    dora = all(doras)
    rslora = all(isinstance(r, RsLoraAdapter) or (isinstance(r, DoraAdapter) and r.rslora) for r in adapters.values())

    by_module: dict[str, list[PeftTarget]] = {}
    for t in targets.values():
        by_module.setdefault(t.module, []).append(t)
    tensors: list[tuple[str, np.ndarray]] = []
    modules: dict[str, tuple[int, float]] = {}  # module -> (rank, alpha)
    for module in sorted({targets[p].module for p in adapters}):
        members = by_module[module]
        kind = members[0].kind
        if members[0].split is not None:
            members = sorted(members, key=lambda m: m.split.index)
        present = [(m, adapters.get(m.path)) for m in members]
        live = [(m, r) for m, r in present if r is not None]
        scale = live[0][1].scale
        ranks = [r.a.shape[1] for _, r in live]
        shared = (len(live) == len(members) and len(set(ranks)) == 1
                  and all(math.isclose(r.scale, scale, rel_tol=1e-12) for _, r in live)
                  and all(np.array_equal(_np(r.a), _np(live[0][1].a)) for _, r in live))
        if shared:
            rank = ranks[0]
            A = _np(live[0][1].a).T
            b_parts = [_np(r.b) for _, r in present]
        else:  # one LoRA of the summed rank with a block-diagonal B: exactly the parts' sum
            rank = sum(ranks)
            A = np.concatenate([_np(r.a).T for _, r in live], axis=0)
            b_parts, row = [], 0
            for m, r in present:
                d_out = m.param.lazy_shape()[1]
                block = np.zeros((rank, d_out), dtype=np.float32)
                if r is not None:
                    k = r.a.shape[1]
                    block[row:row + k] = _np(r.b) * np.float32(r.scale / scale)
                    row += k
                b_parts.append(block)
        stored = [m.rule.save(b) for m, b in zip(members, b_parts)]
        if len(stored) > 1:
            stored = np.concatenate(stored, axis=members[0].split.axis)
        else:
            stored = stored[0]
        B = stored if members[0].torch_layout else stored.T  # peft's [d_out, r]
        if kind == "embedding":
            tensors += [(f"{PREFIX}{module}.lora_embedding_A", A), (f"{PREFIX}{module}.lora_embedding_B", B)]
        else:
            tensors += [(f"{PREFIX}{module}.lora_A.weight", A), (f"{PREFIX}{module}.lora_B.weight", B)]
        if dora:
            mags = []
            for m, r in present:
                if r is not None:
                    mags.append(_np(r.magnitude)[None, :])
                else:  # no adapter on this part: its magnitude is the base's column norms (the identity)
                    mags.append(np.linalg.norm(_np(m.param), axis=0)[None, :].astype(np.float32))
            saved = [m.rule.save(v) for m, v in zip(members, mags)]
            vec = np.concatenate(saved, axis=members[0].split.axis) if len(saved) > 1 else saved[0]
            tensors.append((f"{PREFIX}{module}.lora_magnitude_vector", np.ascontiguousarray(vec).reshape(-1)))
        alpha = scale * (math.sqrt(rank) if rslora else rank)
        modules[module] = (rank, _tidy(alpha))

    (r0, alpha0), _ = Counter(modules.values()).most_common(1)[0]
    rank_pattern = {re.escape(m): r for m, (r, _) in modules.items() if r != r0}
    alpha_pattern = {re.escape(m): a for m, (_, a) in modules.items() if a != alpha0}
    if base_model_name_or_path is None:
        from .pretrained import pretrained_info  # noqa: PLC0415

        info = pretrained_info(model)
        base_model_name_or_path = str(info.folder) if info is not None and info.folder is not None else None
    from .pretrained import peft_task_type  # noqa: PLC0415

    config = {
        "peft_type": "LORA", "task_type": peft_task_type(model), "base_model_name_or_path": base_model_name_or_path,
        "r": r0, "lora_alpha": alpha0, "lora_dropout": 0.0, "target_modules": sorted(modules),
        "use_rslora": rslora, "use_dora": dora, "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
        "bias": "none", "fan_in_fan_out": any(not targets[p].torch_layout and targets[p].kind == "linear"
                                              for p in adapters),
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": None, "exclude_modules": None,
        "layers_to_transform": None, "layers_pattern": None, "lora_bias": False, "revision": None,
    }
    folder = Path(os.fspath(folder))
    if folder.exists() and not folder.is_dir():
        raise PretrainedError("expected a folder to save the adapter into, found a file", where=str(folder))
    arrays = [(n, np.ascontiguousarray(a, dtype=np.float32)) for n, a in tensors]
    head = safetensors_io.header([(n, "F32", a.shape, a.nbytes) for n, a in arrays], {"format": "pt"})
    text = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")

    def write_weights(fp):
        fp.write(head)
        for _, a in arrays:
            if a.nbytes:
                fp.write(memoryview(a.reshape(-1)).cast("B"))

    def write(staging: Path) -> None:  # both files take effect together (atomic.save_folder)
        for name, fill in ((ADAPTER_WEIGHTS, write_weights), (ADAPTER_CONFIG, lambda fp: fp.write(text))):
            try:
                write_new_file(staging / name, fill)
            except OSError as exc:
                raise PretrainedError(f"cannot write: {os_error_reason(exc)}", where=str(folder / name)) from None
    try:
        save_folder(folder, write, lambda name: name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS))
    except OSError as exc:
        raise PretrainedError(f"cannot save: {os_error_reason(exc)}", where=exc.filename or str(folder)) from None
    return folder
