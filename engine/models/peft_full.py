"""The parameters a PEFT adapter carries whole besides its LoRA factors, both ways.

- `modules_to_save`: peft trains a full copy of every module whose name ends with one of the
  entries (peft's rule: a plain `str.endswith`, so "norm" also matches "input_layernorm") and
  saves it as `base_model.model.<module>.<param>` (`base_model.model.lm_head.weight`; in memory
  `<module>.modules_to_save.default.<param>`).
- `bias`: "lora_only" trains the biases of the LoRA-adapted modules, saved as
  `base_model.model.<module>.base_layer.bias`; "all" trains every parameter named `bias`, saved so
  for the adapted modules and as `<module>.bias` for the others.

Ember keeps no second copy: the model's own parameter takes the adapter's value and stays
trainable while every other base parameter is frozen, so training it trains what peft would
train. Saving works the other way round, from what is trainable: a module all of whose
parameters train (and that carries no LoRA) is a `modules_to_save` entry, trained biases are
`bias` "lora_only" when they are exactly the adapted modules' biases, "all" when they are every
bias; anything else trainable is refused, naming it, since peft could not load it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..module import Module, Param, ParamGroup
from ..module.reparam import adapters_of, iter_param_slots
from ..module.tree import FieldKind, walk
from .hf_folder import PretrainedError
from .mapping import Rule, Transpose
from .peft_targets import PREFIX, _family_rules, _tied, peft_targets

BIAS_MODES = ("none", "lora_only", "all")
_INPUT_EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings")  # the module a tied output head reads


@dataclass
class FullParam:
    """One Ember parameter with the Hugging Face tensor it is stored as (`stored`; the parts of a
    split tensor, GPT-2's c_attn bias, share it)."""

    path: str
    stored: str
    rule: Rule
    param: Param = field(repr=False)
    tied: bool = False   # the same parameter serves at another path too (a tied output head)

    @property
    def module(self) -> str:
        return self.stored.rpartition(".")[0]


def is_bias(stored: str) -> bool:
    return stored == "bias" or stored.endswith(".bias")


def full_params(model: Module) -> dict[str, list[FullParam]]:
    """{stored name: its Ember parameters} for every float parameter of `model` (a LoRA's frozen
    base included, its factors not): the family's weight map for a model of a known family, Ember
    paths otherwise (a Linear weight in torch's [out, in] layout, as peft_targets stores it)."""
    wmap, names, _ = _family_rules(model)
    tied_head = _tied(model)
    linear = {f"{p}.weight" if p else "weight" for p, kind, v in walk(model)
              if kind == FieldKind.MODULE and isinstance(v, nn.Linear)}
    owners: list[str] = []
    paths_of: dict = {}
    slots = []
    for path, p in iter_param_slots(model):
        if any(path.startswith(o + ".") for o in owners):
            continue  # a reparameterization's own parameter (a LoRA factor)
        if p.reparameterization is not None:
            owners.append(path)
        if p.kind != "float":
            continue
        paths_of.setdefault(p.id, []).append(path)
        slots.append((path, p))
    out: dict[str, list[FullParam]] = {}
    for path, p in slots:
        if wmap is not None:
            hit = wmap.find(path)
            if hit is None or path not in names:
                continue
            rule, stored = hit
        else:
            rule, stored = Rule(path, path, [Transpose()] if path in linear else []), path
        module_leaf = stored.rpartition(".")[0].rpartition(".")[2]
        tied = len(paths_of[p.id]) > 1 or (tied_head and module_leaf in _INPUT_EMBEDDINGS)
        out.setdefault(stored, []).append(FullParam(path, stored, rule, p, tied))
    for parts in out.values():
        if parts[0].rule.split is not None:
            parts.sort(key=lambda f: f.rule.split.index)
    return out


def _modules(fulls: dict[str, list[FullParam]]) -> set[str]:
    """Every module name of the stored names (`model`, `model.layers`, `model.layers.0`, ...)."""
    out = set()
    for s in fulls:
        parts = s.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return out


def _tied_refusal(f: FullParam, model: Module, how: str) -> str:
    return (f"'{f.stored}' ({f.path}) {how}, but this {type(model).__name__}'s output head is tied to it: peft "
            f"trains a copy of the input embedding only, so Ember's tied head would differ from peft's")


# ---------------------------------------------------------------------------------- reading
def expected_full_tensors(model: Module, fulls: dict[str, list[FullParam]], config: dict, lora_modules: set[str],
                          where: str) -> dict[str, tuple[str, str]]:
    """{peft tensor name: (stored name, the setting that wants it)} of every whole parameter the adapter config says the
    weights file holds (modules_to_save, then the biases of `bias`). `where`: adapter_config.json."""
    entries = config.get("modules_to_save") or []
    if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
        raise PretrainedError(f"'modules_to_save' must be a list of module names, found {entries!r}", where=where)
    mode = config.get("bias") or "none"
    if mode not in BIAS_MODES:
        raise PretrainedError(f"'bias' must be one of {', '.join(BIAS_MODES)}, found {mode!r}", where=where)
    modules = _modules(fulls)
    matched = set()
    for e in entries:
        hits = {m for m in modules if m.endswith(e)}
        if not hits:
            known = sorted({m.rpartition(".")[2] for m in modules if not m.rpartition(".")[2].isdigit()})
            raise PretrainedError(f"modules_to_save entry {e!r} matches no module of this {type(model).__name__}; "
                                  f"its module names end in {', '.join(known)}", where=where)
        matched |= hits
    clash = sorted(matched & lora_modules)
    if clash:
        raise PretrainedError(f"module '{clash[0]}' is both a LoRA target and in modules_to_save: expected one or "
                              f"the other", where=where)
    out: dict[str, tuple[str, str]] = {}
    for s, parts in fulls.items():
        if any(s.startswith(m + ".") for m in matched):
            tied = next((f for f in parts if f.tied), None)
            if tied is not None:
                raise PretrainedError(_tied_refusal(tied, model, "is in modules_to_save"), where=where)
            out[PREFIX + s] = (s, f"modules_to_save {entries!r}")
    whole = {s for s, _ in out.values()}
    for s in fulls:
        if mode == "none" or not is_bias(s) or s in whole:
            continue
        module = s.rpartition(".")[0]
        if module in lora_modules:
            out[f"{PREFIX}{module}.base_layer.bias"] = (s, f"bias {mode!r}")
        elif mode == "all":
            out[PREFIX + s] = (s, f"bias {mode!r}")
    return out


def check_full_tensor(parts: list[FullParam], t, where: str) -> None:
    """Refuse a whole-parameter tensor whose shape does not fit its Ember parameters."""
    for f in parts:
        try:
            shape = f.rule.ember_shape(t.shape)
        except ValueError as exc:
            raise PretrainedError(f"tensor '{t.name}' does not fit '{f.path}': {exc}", where=where) from None
        want = tuple(f.param.lazy_shape())
        if shape != want:
            hint = ""
            differ = [i for i, (a, b) in enumerate(zip(shape, want)) if a != b]
            if len(shape) == len(want) == 2 and len(differ) == 1 and any(k in f.stored for k in ("embed", "lm_head",
                                                                                                 "wte")):
                hint = (f": an adapter trained with a resized vocabulary ({shape[differ[0]]} tokens, this model has "
                        f"{want[differ[0]]})? Ember loads it on a base of the same vocabulary size only")
            raise PretrainedError(f"tensor '{t.name}' has dims {list(t.shape)}; '{f.path}' is {list(want)}{hint}",
                                  where=where)


# ---------------------------------------------------------------------------------- writing
def _array(f: FullParam) -> np.ndarray:
    return np.asarray(f.param.val().numpy(), dtype=np.float32)


def full_tensors_to_save(model: Module, lora_modules: set[str]) -> tuple[list[tuple[str, np.ndarray]], str, list]:
    """(tensors, bias mode, modules_to_save) for the trainable base parameters of `model` (see the
    module doc); a trainable parameter peft could not express is a PretrainedError naming it."""
    fulls = full_params(model)
    trained = {s for s, parts in fulls.items()
               if any(f.param.reparameterization is None and f.param.is_active() for f in parts)}
    if not trained:
        return [], "none", []
    for s in sorted(trained):
        parts = fulls[s]
        frozen = [f.path for f in parts if not (f.param.reparameterization is None and f.param.is_active())]
        if frozen:
            live = next(f.path for f in parts if f.path not in frozen)
            raise PretrainedError(f"'{live}' is trainable but '{frozen[0]}' is not, and peft stores both as one "
                                  f"tensor '{s}': train both or neither")
        tied = next((f for f in parts if f.tied), None)
        if tied is not None:
            raise PretrainedError(_tied_refusal(tied, model, "is trainable"))
    by_module: dict[str, list[str]] = {}
    for s in fulls:
        by_module.setdefault(s.rpartition(".")[0], []).append(s)
    whole = sorted(m for m in {s.rpartition(".")[0] for s in trained}
                   if m not in lora_modules and all(s in trained for s in by_module[m])
                   and not all(is_bias(s) for s in by_module[m]))
    in_whole = {s for m in whole for s in by_module[m]}
    rest = sorted(trained - in_whole)
    odd = [s for s in rest if not is_bias(s)]
    if odd:
        s = odd[0]
        frozen = [x for x in by_module[s.rpartition(".")[0]] if x not in trained]
        what = (f"'{s.rpartition('.')[0]}' carries a LoRA" if s.rpartition(".")[0] in lora_modules
                else f"the rest of '{s.rpartition('.')[0]}' is frozen ({', '.join(frozen)})")
        raise PretrainedError(f"'{fulls[s][0].path}' ('{s}') is trainable, but {what}: peft trains whole modules "
                              f"(modules_to_save) and biases only; freeze it, or unfreeze its whole module")
    mode = "none"
    if rest:
        lora_b = {s for s in fulls if is_bias(s) and s.rpartition(".")[0] in lora_modules}
        all_b = {s for s in fulls if is_bias(s) and s not in in_whole}
        if set(rest) == lora_b:
            mode = "lora_only"
        elif set(rest) == all_b:
            mode = "all"
        else:
            extra = sorted(set(rest) - lora_b)
            lacking = sorted((lora_b if not extra else all_b) - set(rest))
            raise PretrainedError(f"the trainable biases are neither the LoRA-adapted modules' (peft's bias "
                                  f"'lora_only') nor every bias ('all'): '{lacking[0]}' is frozen" +
                                  (f" while '{extra[0]}' trains" if extra else ""))
    tensors = []
    for s in sorted(in_whole | set(rest)):
        parts = fulls[s]
        stored = [f.rule.save(_array(f)) for f in parts]
        value = np.concatenate(stored, axis=parts[0].rule.split.axis) if len(stored) > 1 else stored[0]
        module = s.rpartition(".")[0]
        name = f"{module}.base_layer.bias" if is_bias(s) and module in lora_modules else s
        tensors.append((PREFIX + name, np.ascontiguousarray(value, dtype=np.float32)))
    return tensors, mode, whole


# ---------------------------------------------------------------------------------- training
def peft_full_paths(model: Module, modules_to_save=None, bias: str = "none", lora_paths=None) -> list[str]:
    """The Ember paths of the parameters peft's `LoraConfig(modules_to_save=..., bias=...)` trains
    whole: the modules whose Hugging Face name ends with an entry of `modules_to_save` and the
    biases of `bias` ("lora_only": of the LoRA-adapted modules, "all": every bias). The adapted
    modules are those of `lora_paths` (weight paths) when given, else those carrying a LoRA now.
    A name that matches nothing, a tied input embedding, or an unknown `bias`: a PretrainedError."""
    names = {t.path: t.module for t in peft_targets(model)}
    if lora_paths is None:
        lora_paths = list(adapters_of(model))
    lora_modules = {names[p] for p in lora_paths if p in names}
    fulls = full_params(model)
    expected = expected_full_tensors(model, fulls, {"modules_to_save": list(modules_to_save or []), "bias": bias},
                                     lora_modules, None)
    return sorted(f.path for s, _ in expected.values() for f in fulls[s])


def peft_train_fully(model: Module, modules_to_save=None, bias: str = "none") -> Module:
    """`model` (its LoRA attached) with the parameters of `peft_full_paths` trainable: LLaMA-Factory's
    "embed_tokens", "lm_head" for a resized vocabulary, a norm, the biases. `save_peft_adapter` then
    writes them as peft does."""
    paths = peft_full_paths(model, modules_to_save, bias)
    return model.unfreeze_group(ParamGroup.from_paths(paths)) if paths else model


def full_candidates(model: Module) -> tuple[list[str], bool]:
    """(the last parts of the Hugging Face module names of `model` that hold parameters -- what a
    `modules_to_save` entry can name --, whether the model has biases), for a dialog to offer."""
    fulls = full_params(model)
    leaves = sorted({s.rpartition(".")[0].rpartition(".")[2] for s in fulls} - {""})
    return [n for n in leaves if not n.isdigit()], any(is_bias(s) for s in fulls)
