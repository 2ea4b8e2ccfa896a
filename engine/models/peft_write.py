"""Writing a model's LoRA adapters as a PEFT adapter folder: `save_peft_adapter` (the format is
described in `engine.models.peft`)."""
from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np

from ..module import Module, Param
from ..module.lora import DoraAdapter, LoraAdapter, RsLoraAdapter
from ..module.reparam import adapters_of
from ..store import safetensors_io
from ..store.atomic import os_error_reason, save_folder, write_new_file
from .hf_folder import PretrainedError
from .peft_full import full_tensors_to_save
from .peft_targets import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX, PeftTarget, _tied, fused_tensor_prefixes,
                           peft_targets)

__all__ = ["save_peft_adapter"]


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
    from .pretrained import family_of  # noqa: PLC0415

    fam, cfg = family_of(model)
    if fam is not None and fam.check_peft_adapter is not None:
        fam.check_peft_adapter(cfg, {targets[p].module for p in adapters})
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
    tensors, modules = _fused_experts(adapters, targets, dora, rslora)  # module -> (rank, alpha)
    for module in sorted({targets[p].module for p in adapters if targets[p].fused is None}):
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

    whole, bias, modules_to_save = full_tensors_to_save(model, set(modules))
    by_parameter = {t.module for t in targets.values() if t.by_parameter and t.module in modules}
    fused = {t.fused.name for t in targets.values() if t.fused is not None and t.fused.name in modules}
    tensors += whole
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
        "r": r0, "lora_alpha": alpha0, "lora_dropout": 0.0,
        "target_modules": sorted(m for m in modules if m not in by_parameter and m not in fused),
        "use_rslora": rslora, "use_dora": dora, "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
        "bias": bias, "fan_in_fan_out": any(not targets[p].torch_layout and targets[p].kind == "linear"
                                              for p in adapters),
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": modules_to_save or None,
        "exclude_modules": None,
        "layers_to_transform": None, "layers_pattern": None, "lora_bias": False, "revision": None,
    }
    if by_parameter or fused:  # peft 0.21 adapts a mixture's router and its fused experts as parameters
        config["target_parameters"] = sorted([f"{m}.weight" for m in by_parameter] + list(fused))
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


def _fused_experts(adapters: dict, targets: dict, dora: bool, rslora: bool):
    """The tensors and {parameter: (rank, alpha)} of the experts' LoRAs, written as peft's LoRA on
    transformers 5's fused experts parameters (target_parameters; `peft_targets.FusedExpert`): expert
    e's A the rows `e·r …` of lora_A, its B the columns `e, e + experts, …` of lora_B (gate rows, then
    up rows). An expert whose gate and up share their `a` (Ember's LoRA on a mixture ties them, as peft's
    one A) gives rank r and trains in peft as in Ember; parts with their own `a` are written with the
    summed rank and a block-diagonal B (the same function; peft then trains the off-diagonal blocks
    too), an expert without a LoRA with zero factors (the same function, and zeros stay zero)."""
    groups: dict[str, list[PeftTarget]] = {}
    for path in adapters:
        f = targets[path].fused
        if f is not None:
            groups.setdefault(f.name, [])
    if not groups:
        return [], {}
    if dora:
        raise PretrainedError(f"DoRA on the experts ('{sorted(groups)[0]}') cannot be written: peft 0.21 adapts "
                              f"transformers 5's fused experts with target_parameters, which refuse DoRA")
    for t in targets.values():
        if t.fused is not None and t.fused.name in groups:
            groups[t.fused.name].append(t)
    prefix = {name: module for module, name in fused_tensor_prefixes(groups).items()}
    tensors, modules = [], {}
    for name, members in sorted(groups.items()):
        members.sort(key=lambda t: (t.fused.expert, t.fused.part))
        experts, parts = members[0].fused.experts, members[0].fused.parts
        d_in, d_out = members[0].param.lazy_shape()
        scale = next(adapters[m.path].scale for m in members if m.path in adapters)
        blocks = {}  # expert -> (A_e [k, d_in], B_e [parts * d_out, k])
        for e in range(experts):
            live = [(m, adapters[m.path]) for m in members if m.fused.expert == e and m.path in adapters]
            if not live:
                continue
            factors = list({r.a.id: r.a for _, r in live}.values())  # one `a` when gate and up share it
            offsets, k = {}, 0
            for a in factors:
                offsets[a.id], k = k, k + a.shape[1]
            A_e = np.concatenate([_np(a).T for a in factors], axis=0)
            B_e = np.zeros((parts * d_out, k), dtype=np.float32)
            for m, r in live:
                col = offsets[r.a.id]
                B_e[m.fused.part * d_out:(m.fused.part + 1) * d_out, col:col + r.a.shape[1]] = \
                    _np(r.b).T * np.float32(r.scale / scale)
            blocks[e] = (A_e, B_e)
        ranks = {e: a.shape[0] for e, (a, _) in blocks.items()}
        rank = max(ranks.values())
        if len(set(ranks.values())) > 1:
            raise PretrainedError(f"the experts of '{name}' have LoRAs of ranks {sorted(set(ranks.values()))}: peft's "
                                  f"LoRA on a fused experts parameter gives every expert one rank")
        A = np.zeros((rank * experts, d_in), dtype=np.float32)
        B = np.zeros((parts * d_out, rank * experts), dtype=np.float32)
        for e, (A_e, B_e) in blocks.items():
            A[e * rank:(e + 1) * rank] = A_e
            B[:, e::experts] = B_e
        tensors += [(f"{PREFIX}{prefix[name]}.lora_A.weight", A), (f"{PREFIX}{prefix[name]}.lora_B.weight", B)]
        modules[name] = (rank, _tidy(scale * (math.sqrt(rank) if rslora else rank)))
    return tensors, modules
