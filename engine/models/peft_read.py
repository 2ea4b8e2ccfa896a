"""Reading a PEFT adapter folder onto a model: `load_peft_adapter` (the format and the checks are
described in `engine.models.peft`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regex as _regex

from ..module import Module, Param
from ..module.lora import DoraAdapter, LoraAdapter, RsLoraAdapter, pattern_key
from ..module.reparam import Reparameterizer, apply_reparameterization
from ..store import safetensors_io
from ..store.burnpack import bf16_to_float32, storage_dtype
from ..store.errors import RecordError
from ..store.filesource import FileSource
from ..tensor import Tensor
from .hf_folder import MAX_CONFIG_BYTES, PretrainedError, read_json
from .peft_full import check_full_tensor, expected_full_tensors, full_params
from .peft_targets import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX, PeftTarget, _select, _tied, fused_parameters,
                           fused_tensor_prefixes, peft_targets, select_with_parameters)

__all__ = ["MAX_ALPHA", "MAX_RANK", "load_peft_adapter"]

MAX_RANK = 1 << 20     # r and rank_pattern: far above any adapter's rank, the tensors' shapes decide the rest
MAX_ALPHA = 1 << 20    # |lora_alpha| and alpha_pattern: finite, far above any adapter's (8 to a few hundred)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector", ".lora_embedding_A", ".lora_embedding_B",
             ".base_layer.weight")
_FLOATS = {"F64", "F32", "F16", "BF16"}

# adapter_config.json options Ember cannot honour: (key, the value that is fine, what it means)
_UNSUPPORTED = [
    ("lora_bias", (False, None), "a LoRA bias (lora_bias)"),
    ("layers_to_transform", (None, []), "layers_to_transform"),
    ("layers_pattern", (None, [], ""), "layers_pattern"),
    ("trainable_token_indices", (None, {}, []), "trainable tokens (trainable_token_indices)"),
    ("layer_replication", (None, []), "layer_replication"),
    ("use_qalora", (False, None), "QA-LoRA (use_qalora)"),
    ("alora_invocation_tokens", (None, []), "activated LoRA (alora_invocation_tokens)"),
    ("use_bdlora", (None, False), "block-diagonal LoRA (use_bdlora)"),
    ("megatron_config", (None,), "Megatron layers (megatron_config)"),
]



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
    if config.get("target_modules") is None and not config.get("target_parameters"):
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

    def __init__(self, plan: dict[str, _Planned], full: dict[str, np.ndarray] | None = None):
        self.plan = plan
        self.full = full or {}  # Ember path -> the value of a parameter the adapter trains whole
        self.shared: dict[int, Param] = {}  # id of an `a` array the plan gives several weights -> their one A

    def reparameterize(self, path, param):
        base = param.set_require_grad(False)
        device = param.lazy_device()
        dtype = param.base().dtype if param.is_initialized() else device.default_float_dtype
        if path in self.full:  # modules_to_save, a trained bias: the adapter's value, trainable
            value = Tensor.from_data(np.ascontiguousarray(self.full[path]), device=device, dtype=dtype)
            whole = Param.initialized(value.autodiff() if param.is_autodiff() else value, id=param.id, active=True)
            return whole.set_require_grad(True), None
        item = self.plan.get(path)
        if item is None:
            return base, None
        if item.base is not None:
            value = Tensor.from_data(item.base, device=device, dtype=dtype)
            base = Param.initialized(value.autodiff() if param.is_autodiff() else value, id=param.id)
            base = base.set_require_grad(False)

        def trainable(array):
            return Param(Tensor.from_data(np.ascontiguousarray(array), device=device, dtype=dtype))

        a = self.shared.get(id(item.a))  # the parts of a fused module share one A, as peft's one LoRA over it
        if a is None:
            a = self.shared[id(item.a)] = trainable(item.a)
        b = trainable(item.b)
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

    try:  # a config that selects nothing is refused after the tensors' names are checked
        selected, refused = select_with_parameters(targets, config, config_where), None
    except PretrainedError as exc:
        selected, refused = [], exc
    fused = fused_parameters(selected, config)  # {fused experts parameter: its weights}, target_parameters
    fused_at = fused_tensor_prefixes(fused)
    fused_found: dict[str, dict[str, object]] = {}

    # names -> (module, suffix), every tensor accounted for
    found: dict[str, dict[str, object]] = {}
    others = []  # names that are no LoRA tensor: a module of modules_to_save or a bias, else refused
    for name, t in tensors.items():
        if not name.startswith(PREFIX):
            raise PretrainedError(f"tensor '{name}' is not a PEFT LoRA tensor: expected names beginning with "
                                  f"'{PREFIX}'", where=where)
        rest = name[len(PREFIX):]
        suffix = next((s for s in _SUFFIXES if rest.endswith(s)), None)
        if suffix is None:
            others.append(name)
            continue
        module = rest[: -len(suffix)]
        if module in fused_at:
            if suffix not in (".lora_A.weight", ".lora_B.weight") or t.dtype not in _FLOATS:
                raise PretrainedError(f"tensor '{name}' ({t.dtype}): peft's LoRA on the fused experts parameter "
                                      f"'{fused_at[module]}' holds float lora_A.weight and lora_B.weight only",
                                      where=where)
            fused_found.setdefault(fused_at[module], {})[suffix] = t
            continue
        if module not in by_module:
            raise PretrainedError(f"tensor '{name}': this {model_name} has no Linear or Embedding module "
                                  f"'{module}' (an adapter for another base model?)", where=where)
        if t.dtype not in _FLOATS:
            raise PretrainedError(f"tensor '{name}' holds {t.dtype} values, expected floats", where=where)
        found.setdefault(module, {})[suffix] = t

    if refused is not None:
        raise refused
    wanted = {t.module for t in selected if not (t.optional and t.module not in found)
              and not (t.fused is not None and t.fused.name in fused)}
    full = _plan_full(model, config, config_where, wanted, tensors, others, where)
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
        a = np.ascontiguousarray(A.T)  # one array: the parts of a fused module get one A (_AttachPlanned)
        for m in members:
            b = m.rule.load(_factor_layout(m, B))
            mm = None
            if M is not None:
                col = M[:, None] if m.torch_layout else M[None, :]
                mm = np.ascontiguousarray(m.rule.load(col)).reshape(-1)
            base_arr = None if base is None else m.rule.load(_array(src, base))
            plan[m.path] = _Planned(a, np.ascontiguousarray(b), scale, mm, base_arr, rslora)
    plan.update(_plan_fused(fused, fused_found, config, src, where))
    values = {}
    for t, parts in full:
        arr = _array(src, t)
        for f in parts:
            values[f.path] = f.rule.load(arr)
    return apply_reparameterization(model, _AttachPlanned(plan, values))


def _plan_fused(fused: dict, found: dict, config: dict, src: FileSource, where: str) -> dict[str, _Planned]:
    """The per-expert LoRAs of peft's LoRAs on fused experts parameters (`peft_targets.FusedExpert`
    says where each expert's factors are): one A per expert, shared by its gate and up weights."""
    plan: dict[str, _Planned] = {}
    if fused and config.get("use_dora"):
        raise PretrainedError(f"DoRA on the fused experts parameter '{sorted(fused)[0]}' is not supported (peft 0.21 "
                              f"refuses it too)", where=where)
    rslora = bool(config.get("use_rslora"))
    for name, members in sorted(fused.items()):
        parts = found.get(name, {})
        for suffix in (".lora_A.weight", ".lora_B.weight"):
            if suffix not in parts:
                raise PretrainedError(f"the LoRA of target_parameters '{name}' has no {suffix[1:]} (peft writes it as "
                                      f"'{PREFIX}{name.rpartition('.')[0]}[.base_layer].{suffix[1:]}')", where=where)
        ta, tb = parts[".lora_A.weight"], parts[".lora_B.weight"]
        try:
            key = pattern_key(config.get("rank_pattern") or {}, name)
            rank = int(config["rank_pattern"][key]) if key is not None else int(config["r"])
            key = pattern_key(config.get("alpha_pattern") or {}, name)
            alpha = float(config["alpha_pattern"][key]) if key is not None else float(config["lora_alpha"])
        except (ValueError, _regex.error, RecursionError, OverflowError) as exc:
            raise PretrainedError(f"rank_pattern / alpha_pattern: {exc}", where=where) from None
        first = members[0]
        experts, n_parts = first.fused.experts, first.fused.parts
        d_in, d_out = first.param.lazy_shape()
        if tuple(ta.shape) != (rank * experts, d_in) or tuple(tb.shape) != (n_parts * d_out, rank * experts):
            raise PretrainedError(f"tensors '{ta.name}' {list(ta.shape)} and '{tb.name}' {list(tb.shape)}: the LoRA of "
                                  f"'{name}' ({experts} experts, r = {rank}) needs lora_A [{rank * experts}, {d_in}] "
                                  f"and lora_B [{n_parts * d_out}, {rank * experts}]", where=where)
        A, B = _array(src, ta), _array(src, tb)
        scale = _scale(rank, alpha, rslora)
        a_of = {e: np.ascontiguousarray(A[e * rank:(e + 1) * rank].T) for e in range(experts)}
        for m in members:
            f = m.fused
            b = B[f.part * d_out:(f.part + 1) * d_out, f.expert::experts]  # [d_out, rank]
            plan[m.path] = _Planned(a_of[f.expert], np.ascontiguousarray(b.T), scale, rslora=rslora)
    return plan


def _plan_full(model, config, config_where, lora_modules, tensors, others, where):
    """[(tensor, its Ember parameters)] of the whole parameters the file holds (modules_to_save, the
    biases of `bias`), every name, dtype and shape checked against adapter_config.json first."""
    fulls = full_params(model)
    expected = expected_full_tensors(model, fulls, config, lora_modules, config_where)
    for name in others:
        if name not in expected:
            raise PretrainedError(f"tensor '{name}' is not a tensor Ember reads: expected a LoRA tensor (a name "
                                  f"ending in {', '.join(_SUFFIXES)}), a parameter of a module of modules_to_save "
                                  f"({_short(config.get('modules_to_save'))}) or a bias of bias = "
                                  f"{_short(config.get('bias', 'none'))}", where=where)
    out = []
    for name, (stored, why) in expected.items():
        t = tensors.get(name)
        if t is None:
            raise PretrainedError(f"tensor '{name}' is missing: adapter_config.json's {why} needs it (an adapter "
                                  f"for another base model?)", where=where)
        if t.dtype not in _FLOATS:
            raise PretrainedError(f"tensor '{name}' holds {t.dtype} values, expected floats", where=where)
        check_full_tensor(fulls[stored], t, where)
        out.append((t, fulls[stored]))
    return out


