"""Which weights of a model a PEFT LoRA adapts, by PEFT's rules (`target_modules`,
`exclude_modules`, "all-linear"), with their Hugging Face module names and weight map rules; the
names shared by the reading side (`peft_read`) and the writing side (`peft_write`). The file
format is described in `engine.models.peft`."""
from __future__ import annotations

from dataclasses import dataclass, field

import regex as _regex  # a user's regex (adapter_config.json) matches with a timeout

from .. import nn
from ..module import Module, Param, ParamGroup
from ..module.group import MATCH_TIMEOUT_S
from ..module.lora import Lora
from ..module.tree import FieldKind, walk
from .hf_folder import PretrainedError
from .mapping import Rule, Split, Transpose

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "PREFIX", "FusedExpert", "PeftTarget", "fused_parameters",
           "fused_tensor_prefixes", "peft_lora", "peft_targets", "select_with_parameters", "target_group"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


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
    by_parameter: bool = False  # peft adapts it as a parameter (`target_parameters`: a mixture's router)
    optional: bool = False  # an adapter selecting it may hold nothing for it (a mixture's expert)
    fused: "FusedExpert | None" = None  # its place in transformers 5's fused experts parameter (a mixture's expert)

    @property
    def torch_layout(self) -> bool:
        """Whether the stored weight is torch's nn.Linear `[out, in]` (else `[in, out]`: GPT-2's
        Conv1D, an Embedding)."""
        return any(isinstance(t, Transpose) for t in self.rule.transforms)

    @property
    def split(self) -> Split | None:
        return self.rule.split


@dataclass(frozen=True)
class FusedExpert:
    """Where an expert's weight sits in transformers 5's fused experts parameter, which peft adapts
    with `target_parameters` (one ParamWrapper LoRA: lora_A `[rank · experts, in]`, expert e's A its
    rows `e·rank … (e+1)·rank`; lora_B `[parts · out, rank · experts]`, expert e's B its columns
    `e, e + experts, …`; part `part` of `parts` its row block: gate 0 and up 1 of `gate_up_proj`)."""

    name: str        # the fused parameter, `model.layers.0.mlp.experts.gate_up_proj`
    expert: int
    experts: int
    part: int = 0
    parts: int = 1


def _family_rules(model):
    from .pretrained import family_of, pretrained_names  # noqa: PLC0415 - pretrained imports the families

    fam, cfg = family_of(model)
    if fam is None:
        return None, {}, None
    peft_name = None if fam.peft_name is None else (lambda module: fam.peft_name(cfg, module))
    return fam.weight_map(cfg), pretrained_names(model), peft_name


def peft_targets(model: Module) -> list[PeftTarget]:
    """Every weight of a Linear or Embedding layer of `model`, with its PEFT module name."""
    if not isinstance(model, Module):
        raise TypeError(f"expected a Module, got {type(model).__name__}")
    wmap, names, peft_name = _family_rules(model)
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
            if peft_name is not None:
                module, by_parameter, optional, *fused = peft_name(module)
                out.append(PeftTarget(wpath, module, layer, rule, p, by_parameter, optional,
                                      fused[0] if fused else None))
                continue
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


def select_with_parameters(targets: list[PeftTarget], config: dict, where=None) -> list[PeftTarget]:
    """The targets of an adapter_config.json: those its `target_modules` select, and the weights its
    `target_parameters` name (peft 0.21's LoRA on a parameter; a 2-D weight's is a Linear's LoRA: a
    mixture's router; transformers 5's fused experts `mlp.experts.gate_up_proj` / `down_proj` select
    every expert's weights in them, `FusedExpert`). A parameter no weight of the model answers to is
    refused, naming it."""
    params = config.get("target_parameters") or []
    modules = config.get("target_modules")
    chosen = [] if modules in ([], None) and params else _select(targets, modules, config.get("exclude_modules"),
                                                                     where)
    if not params:
        return chosen
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise PretrainedError(f"target_parameters must be a list of parameter names, found {params!r}", where=where)
    by_name: dict[str, list[PeftTarget]] = {}
    for t in targets:
        if t.kind == "linear":
            by_name.setdefault(t.fused.name if t.fused is not None else f"{t.module}.weight", []).append(t)
    for p in params:
        hits = [t for name, ts in by_name.items() if name == p or name.endswith(f".{p}") for t in ts]
        if not hits:
            known = sorted({n.rpartition(".")[2] for n in by_name})
            raise PretrainedError(f"LoRA on parameter {p!r} (target_parameters) is not supported: no weight of this "
                                  f"model answers to it (its Linear weights and fused experts end in "
                                  f"{', '.join(known)})", where=where)
        chosen += [t for t in hits if t not in chosen]
    return chosen


def fused_parameters(selected: list[PeftTarget], config: dict) -> dict[str, list[PeftTarget]]:
    """{fused experts parameter named by the config's `target_parameters`: its selected weights, by
    expert and part}: the experts an adapter holds in peft's fused form."""
    params = config.get("target_parameters") or []
    out: dict[str, list[PeftTarget]] = {}
    for t in selected:
        f = t.fused
        if f is not None and any(f.name == p or f.name.endswith(f".{p}") for p in params):
            out.setdefault(f.name, []).append(t)
    for members in out.values():
        members.sort(key=lambda t: (t.fused.expert, t.fused.part))
    return out


_FUSED_ORDER = ("gate_up_proj", "down_proj")  # transformers 5's fused experts parameters, in order of definition


def fused_tensor_prefixes(names) -> dict[str, str]:
    """{the module name peft's tensors of a fused experts parameter carry: the parameter} for the
    fused parameters `names` an adapter targets. peft nests one ParamWrapper per targeted parameter
    of the experts module, the first defined innermost: with both targeted, gate_up_proj's tensors are
    `…mlp.experts.base_layer.lora_A.weight` and down_proj's `…mlp.experts.lora_A.weight`."""
    names = set(names)
    out = {}
    for container in {n.rpartition(".")[0] for n in names}:
        mine = [n for n in _FUSED_ORDER if f"{container}.{n}" in names]
        for i, n in enumerate(mine):
            out[container + ".base_layer" * (len(mine) - 1 - i)] = f"{container}.{n}"
    return out


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


