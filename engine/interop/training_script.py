"""The scale-out hand-off: a PyTorch + transformers + peft training script for an Ember run.

```python
out = export_training_script(model, "export/", data=train_rows, training_config=TrainingConfig(...),
                             optimizer=optim.AdamWConfig(), lr=2e-4)
# export/train.py, export/train_config.json, export/tokens.safetensors, export/initial_adapter/
```

`export_training_script(model, folder, *, data, ...)` writes into `folder`:

- `train.py`: a short, commented PyTorch script (`TRAIN_PY`, in `torch_train_script.py`; the same text for every export:
  everything about the run is in its config). It runs as `python train.py`, `accelerate launch
  train.py` or `torchrun --nproc_per_node N train.py`: under a launcher it reads the
  environment variables torchrun and accelerate set (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`),
  joins the process group and wraps the model in `DistributedDataParallel`; every process
  takes its share of each batch Ember would feed. It imports torch, transformers, peft,
  safetensors and numpy, never Ember.
- `train_config.json`: the base model folder (the Hugging Face folder the model was opened
  from when its base weights are still the stored ones, else a `save_pretrained` copy in
  `base_model/`), the LoRA settings as peft's `LoraConfig` (r, lora_alpha, target_modules as
  Hugging Face module names, use_rslora, use_dora, rank/alpha patterns), the frozen parameters
  by their Hugging Face / peft names (`requires_grad=False`), the optimizer (AdamW / Adam /
  SGD with Ember's hyperparameters: Burn's defaults differ from PyTorch's, epsilon 1e-5 for
  one, so every value is written out), learning rate, warm-up, global-norm clipping, gradient
  accumulation, batch size, epochs, seed, shuffling, and how the data were made (text files,
  tokenizer, block size, packing or padding, prompt masking).
- `tokens.safetensors`: the token rows Ember trains on (`train_inputs`, `train_targets` with -100
  where nothing is learnt, `train_attention_mask` 1 on real positions and 0 on pads; `valid_...`
  the same for its validation rows), so the script sees the very batches, in the very order (the
  script rebuilds Ember's per-epoch shuffle with NumPy from the seed). For conversation data
  (`engine.train.chat_data`; told by the data file's first record, `data_file_format`) these are
  the rows Ember rendered with the chat template, labelled on the assistant's tokens only: the
  script trains on them as they are, so `torchrun` continues the same chat fine-tune. `python
  train.py --tokenize` makes text rows again from the text files with the `tokenizers` library,
  the way `engine.train.text` does, for data changed since the export (refused for conversations:
  their rendering and masks are Ember's). Rows must be right-padded (what Ember's Learner runs
  under plain causal attention); others are refused. Packed conversation rows also carry
  `train_segment_ids` (1.. per conversation of a row, 0 on pads) and `train_position_ids` (each
  conversation's positions from 0): the script gives the model those positions and a
  block-diagonal causal mask, so each conversation attends only to itself, as in Ember.
- `initial_adapter/`: the LoRA factors Ember initialized (`save_peft_adapter`), loaded by the
  script in place of peft's random initialization, so both start from the same weights.

The script's loss is Ember's: the mean next-token cross entropy over the targets of an
optimizer step (all its micro-batches, all processes), so a step of N accumulated batches on
K processes has the gradient of one batch of N·B rows, as Ember's accumulation gives it.

The export is one save (`engine.store.atomic.save_folder`): the script, its config, the rows and
the adapter (and base) folders appear together, and a re-export replaces them together; a failed
one leaves the folder as it was.

Everything the export cannot express is refused before anything is written, with what was
expected and what was found: a model of no known family, a learning-rate schedule other than a
constant (with an optional warm-up), an optimizer rule PyTorch has no twin for (cautious weight
decay, per-tensor clipping, per-group optimizers), a QLoRA adapter, a fused GPT-2 c_attn whose
q/k/v parts are frozen differently.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import optim
from ..optim.decay import as_weight_decay
from ..module import Module, ParamGroup
from ..module.lora import DoraAdapter, Lora, LoraAdapter, QLoraAdapter
from ..module.reparam import detach_reparameterization, iter_param_slots
from ..store.atomic import os_error_reason, save_folder, write_new_file
from ..store.safetensors_io import header as safetensors_header
from ..models.hf_folder import PretrainedError
from ..train.conversations import conversation_format
from .torch_train_script import TRAIN_PY

__all__ = ["ExportedScript", "TRAIN_PY", "data_file_format", "export_training_script"]

CONFIG_FILE = "train_config.json"
SCRIPT_FILE = "train.py"
TOKENS_FILE = "tokens.safetensors"
ADAPTER_FOLDER = "initial_adapter"
BASE_FOLDER = "base_model"
EXPORT_NAMES = (CONFIG_FILE, SCRIPT_FILE, TOKENS_FILE, ADAPTER_FOLDER, BASE_FOLDER)


@dataclass
class ExportedScript:
    """What `export_training_script` wrote, and the model it describes (with the adapters the
    script starts from: train this one in Ember to compare)."""

    folder: Path
    script: Path
    config_path: Path
    config: dict
    model: Module
    files: list = field(default_factory=list)


# ---------------------------------------------------------------------------------- names
def _adapter_names(model: Module) -> dict[str, str]:
    """{Ember adapter param path: its peft name} (`model.layers.0.self_attn.q_proj.lora_A.weight`,
    the name the script gives a torch parameter once peft's prefix and adapter name are dropped)."""
    from ..models.peft import peft_targets  # noqa: PLC0415

    targets = {t.path: t for t in peft_targets(model)}
    adapters = {path: p.reparameterization for path, p in iter_param_slots(model)
                if p.reparameterization is not None and path in targets}
    _check_fused(targets, adapters)
    out = {}
    for path, r in adapters.items():
        t = targets[path]
        if t.fused is not None:  # peft's LoRA on transformers 5's fused experts parameter (target_parameters): its
            experts = t.fused.name.rpartition(".")[0]  # ParamWrappers nest, the script's names drop `base_layer`
            out[f"{path}.lora.a"], out[f"{path}.lora.b"] = f"{experts}.lora_A.weight", f"{experts}.lora_B.weight"
            continue
        if t.kind == "embedding":
            out[f"{path}.lora.a"], out[f"{path}.lora.b"] = (f"{t.module}.lora_embedding_A",
                                                            f"{t.module}.lora_embedding_B")
        else:
            out[f"{path}.lora.a"], out[f"{path}.lora.b"] = f"{t.module}.lora_A.weight", f"{t.module}.lora_B.weight"
        if isinstance(r, DoraAdapter):
            out[f"{path}.lora.magnitude"] = f"{t.module}.lora_magnitude_vector.weight"
    return out


def _check_fused(targets: dict, adapters: dict) -> None:
    """Refuse LoRAs on the parts of a fused module (Phi-3's qkv_proj / gate_up_proj, GPT-2's c_attn, a
    mixture's experts in transformers 5's fused parameters) that peft's one LoRA over the module cannot
    train as Ember does: every part adapted, sharing one A (as Ember's LoRA on Phi-3 and on a mixture
    makes them), one rank for every expert."""
    groups: dict[str, list] = {}
    for path, t in targets.items():
        if t.split is not None:
            groups.setdefault(t.module, []).append(path)
        elif t.fused is not None:
            groups.setdefault(f"{t.fused.name}/{t.fused.expert}", []).append(path)
    for key, paths in sorted(groups.items()):
        live = [p for p in paths if p in adapters]
        if not live:
            continue
        name = key.partition("/")[0]
        if len(live) < len(paths) or len({adapters[p].a.id for p in live}) > 1:
            raise PretrainedError(f"'{live[0]}' has a LoRA on a part of the fused module '{name}' that peft's one "
                                  f"LoRA over it cannot train as Ember does ({len(live)} of its {len(paths)} parts "
                                  f"adapted, with {len({adapters[p].a.id for p in live})} A factor(s); peft trains "
                                  f"one A over every part): adapt every part with one LoRA (Ember's LoRA on Phi-3 "
                                  f"and on a mixture's experts shares their A), or leave the fused module out")
    ranks: dict[str, set] = {}
    for path, r in adapters.items():
        if targets[path].fused is not None:
            ranks.setdefault(targets[path].fused.name, set()).add(r.a.shape[1])
    for name, rs in sorted(ranks.items()):
        if len(rs) > 1:
            raise PretrainedError(f"the experts of '{name}' have LoRAs of ranks {sorted(rs)}: peft's LoRA on a fused "
                                  f"experts parameter gives every expert one rank")


def _trainability(model: Module) -> tuple[list[str], list[str], int]:
    """(frozen names, trainable names, trainable values) by Hugging Face / peft names."""
    from ..models.pretrained import pretrained_names  # noqa: PLC0415

    from ..models.pretrained import family_of  # noqa: PLC0415

    base_names = pretrained_names(model)
    fam, cfg = family_of(model)
    if fam is not None and fam.torch_name is not None:
        base_names = {path: fam.torch_name(cfg, name) for path, name in base_names.items()}
    adapter_names = _adapter_names(model)
    state: dict[str, set] = {}
    who: dict[str, list] = {}
    trainable_values = 0
    seen = set()
    for path, p in model.named_params():
        if p.id in seen:
            continue
        seen.add(p.id)
        name = adapter_names.get(path) or base_names.get(path)
        if name is None:
            if ".lora." in path:
                raise PretrainedError(f"'{path}' belongs to an adapter peft has no parameter for")
            raise PretrainedError(f"parameter '{path}' has no Hugging Face name: the model's family does not "
                                  f"name it")
        trains = bool(p.is_require_grad()) and p.kind == "float"
        state.setdefault(name, set()).add(trains)
        who.setdefault(name, []).append(path)
        if trains:
            trainable_values += p.numel()
    mixed = [n for n, s in state.items() if len(s) > 1]
    if mixed:
        n = mixed[0]
        raise PretrainedError(f"the Hugging Face tensor '{n}' holds {', '.join(who[n])}, some frozen and some "
                              f"not: PyTorch trains a tensor as a whole; freeze them alike")
    frozen = sorted(n for n, s in state.items() if True not in s)
    trainable = sorted(n for n, s in state.items() if True in s)
    return frozen, trainable, trainable_values


# ---------------------------------------------------------------------------------- optimizer
def _l2_penalty(cfg, config_class) -> float:
    """The L2 penalty (torch.optim's `weight_decay`) of an optimizer config or of the optimizer
    it made."""
    if isinstance(cfg, config_class):
        wd = as_weight_decay(cfg.weight_decay)
        return wd.penalty if wd is not None else 0.0
    return cfg.penalty or 0.0


def _optimizer_json(optimizer, lr, training) -> dict:
    """The optimizer as torch.optim's arguments, from an Ember optimizer config (or optimizer)."""
    cfg = optimizer
    if isinstance(cfg, optim.ModuleOptimizer):
        if cfg.groups:
            raise ValueError("export_training_script: an optimizer with per-group rules (with_group) has no one "
                             "torch.optim equivalent: expected one rule for every parameter")
        if cfg.grad_clipping is not None:
            raise ValueError("export_training_script: per-tensor gradient clipping (grad_clipping) has no torch "
                             "equivalent: use TrainingConfig.max_grad_norm (global clipping) instead")
        cfg = cfg.default
    clip = getattr(cfg, "grad_clipping", None) or getattr(cfg, "gradient_clipping", None)
    if clip is not None:
        raise ValueError("export_training_script: per-tensor gradient clipping (grad_clipping) has no torch "
                         "equivalent: use TrainingConfig.max_grad_norm (global clipping) instead")
    if isinstance(cfg, (optim.AdamWConfig, optim.AdamW)):
        cautious = cfg.cautious_weight_decay if isinstance(cfg, optim.AdamWConfig) else cfg.cautious
        if cautious:
            raise ValueError("export_training_script: AdamW's cautious weight decay has no torch.optim.AdamW "
                             "equivalent: expected cautious_weight_decay=False")
        eps = cfg.epsilon
        out = {"name": "AdamW", "betas": [cfg.beta_1, cfg.beta_2], "eps": eps, "weight_decay": cfg.weight_decay}
    elif isinstance(cfg, (optim.AdamConfig, optim.Adam)):
        out = {"name": "Adam", "betas": [cfg.beta_1, cfg.beta_2], "eps": cfg.epsilon,
               "weight_decay": _l2_penalty(cfg, optim.AdamConfig), "amsgrad": bool(cfg.amsgrad)}
    elif isinstance(cfg, (optim.SgdConfig, optim.Sgd)):
        penalty = _l2_penalty(cfg, optim.SgdConfig)
        m = cfg.momentum
        out = {"name": "SGD", "weight_decay": penalty, "momentum": float(m.momentum) if m else 0.0,
               "dampening": float(m.dampening) if m else 0.0, "nesterov": bool(m.nesterov) if m else False}
    else:
        raise ValueError(f"export_training_script: expected an Adam, AdamW or SGD optimizer (config), found "
                         f"{type(cfg).__name__}")
    out["lr"] = _constant_lr(lr)
    out["warmup_steps"] = int(training.warmup_steps)
    out["max_grad_norm"] = training.max_grad_norm
    return out


def _constant_lr(lr) -> float:
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return float(lr)
    if isinstance(lr, optim.ConstantLr):
        return float(lr.lr)
    if type(lr).__name__ == "ConstantLrConfig":  # engine.train.run_spec's (engine.models does not import engine.train)
        return float(lr.lr)
    raise ValueError(f"export_training_script: expected a constant learning rate (a float or ConstantLr; "
                     f"TrainingConfig.warmup_steps adds the warm-up), found {type(lr).__name__}")


# ---------------------------------------------------------------------------------- base weights
def _base_matches_folder(model: Module) -> bool:
    """Whether every base weight still holds the stored tensor of the folder it was opened from
    (never read since, or read and unchanged: that reads the stored tensors once)."""
    from ..models.pretrained import pretrained_info  # noqa: PLC0415

    info = pretrained_info(model)
    if info is None or info.folder is None or not info.folder.is_dir():
        return False
    for _, p in iter_param_slots(model):
        src = info.sources.get(p.id)
        if src is None:
            continue  # an adapter's factor, not a base weight
        if not p.is_initialized():
            if src[0] is not p.lazy_state():
                return False
            continue
        stored, rule = src[1], src[2]
        try:
            value = rule.load(stored.read())
        except Exception:  # noqa: BLE001 - a file changed since: write a copy
            return False
        mine = np.asarray(p.base().numpy())
        if mine.shape != value.shape or not np.array_equal(mine, value.astype(mine.dtype, copy=False)):
            return False
    return True


# ---------------------------------------------------------------------------------- data
def data_file_format(path) -> str | None:
    """The conversation format ("messages", "sharegpt", "alpaca") of a `.jsonl` data file (or of the
    first `.jsonl` file of a folder), told by its first record as `engine.train.conversations` reads
    it; None for text (`.txt`, `text` or `prompt` / `completion` records) or a file it cannot read."""
    path = Path(path).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".jsonl" and p.is_file())
        if not files:
            return None
        path = files[0]
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return None
    try:
        with path.open("r", encoding="utf-8-sig") as fp:
            for line in fp:
                if line.strip():
                    record = json.loads(line)
                    kind = conversation_format(record) if isinstance(record, dict) else None
                    return kind if kind in ("messages", "sharegpt", "alpaca") else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None


def _rows(data, settings, training):
    """(train rows, valid rows or None, description of how the rows were made)."""
    valid = None
    if isinstance(data, (tuple, list)) and len(data) == 2:
        data, valid = data
    if not (hasattr(data, "inputs") and hasattr(data, "targets")):
        raise ValueError(f"export_training_script: data must be the training rows (a TextDataset of "
                         f"engine.train.text) or a (train, valid) pair of them, found {type(data).__name__}")
    desc = {"format": "text", "block_size": int(np.asarray(data.inputs).shape[1]),
            "packing": getattr(data, "packing", None)}
    tok = getattr(data, "tokenizer", None)
    if tok is not None and getattr(tok, "path", None):
        desc["tokenizer"] = str(Path(tok.path).resolve().parent)
    if settings is not None:  # engine.train.run_spec.DataSettings, read by its fields
        desc.update({"file": str(Path(settings.file).expanduser().resolve()),
                     "tokenizer": str(Path(settings.tokenizer).expanduser().resolve()),
                     "block_size": int(settings.block_size), "packing": bool(settings.packing),
                     "per_line": bool(settings.per_line), "truncate": bool(settings.truncate), "fields": "auto",
                     "valid_fraction": float(settings.valid_fraction) if valid is not None else None,
                     "split_seed": int(training.seed)})
        chat = data_file_format(settings.file)
        if chat is not None:  # rendered with the chat template, the loss on the assistant's tokens only
            desc.update({"format": "conversations", "conversation_format": chat, "assistant_only": True})
            desc.pop("per_line")
    return data, valid, desc


def _check_rows(data, where: str) -> dict:
    """{"inputs", "targets", "attention_mask"} of a dataset as int64 arrays, checked."""
    inputs, targets = np.asarray(data.inputs), np.asarray(data.targets)
    if inputs.ndim != 2 or inputs.shape != targets.shape or inputs.dtype.kind not in "iu" or \
            targets.dtype.kind not in "iu":
        raise ValueError(f"export_training_script: {where}: expected integer token rows inputs and targets of the "
                         f"same dims [rows, block], found {inputs.dtype} {list(inputs.shape)} and {targets.dtype} "
                         f"{list(targets.shape)}")
    mask = getattr(data, "attention_mask", None)
    mask = np.ones(inputs.shape, np.int64) if mask is None else np.asarray(mask)
    if mask.shape != inputs.shape or mask.dtype.kind not in "iub":
        raise ValueError(f"export_training_script: {where}: expected an attention mask of the rows' dims "
                         f"{list(inputs.shape)} (1: a real position, 0: padding), found {mask.dtype} {list(mask.shape)}")
    mask = mask.astype(np.int64)
    packed = {}
    segments, positions = getattr(data, "segment_ids", None), getattr(data, "position_ids", None)
    if segments is not None:  # packed rows: several conversations a row, each attending only to itself
        if positions is None:
            raise ValueError(f"export_training_script: {where}: packed rows (segment_ids) need their position_ids "
                             f"(each sequence's positions from 0), found none")
        segments, positions = np.asarray(segments), np.asarray(positions)
        for name, a in (("segment_ids", segments), ("position_ids", positions)):
            if a.shape != inputs.shape or a.dtype.kind not in "iu":
                raise ValueError(f"export_training_script: {where}: expected {name} of integers of the rows' dims "
                                 f"{list(inputs.shape)}, found {a.dtype} {list(a.shape)}")
        packed = {"segment_ids": np.ascontiguousarray(segments, dtype=np.int64),
                  "position_ids": np.ascontiguousarray(positions, dtype=np.int64)}
    # the script runs the model on whole rows under causal attention, as Ember's Learner does: that is
    # the same computation only for rows whose real positions come first (right padding)
    bad = (~np.isin(mask, (0, 1))).any(axis=1) | (np.diff(mask, axis=1) > 0).any(axis=1)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise ValueError(f"export_training_script: {where}: row {r}: expected an attention mask of ones then "
                         f"zeros (right padding), found {mask[r].tolist()[:16]}...: the script reproduces rows whose "
                         f"positions attend to every earlier position of the row")
    return {"inputs": np.ascontiguousarray(inputs, dtype=np.int64),
            "targets": np.ascontiguousarray(targets, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(mask), **packed}


def _write_tokens(path: Path, arrays: dict) -> None:
    head = safetensors_header([(k, "I64", a.shape, a.nbytes) for k, a in arrays.items()], {"format": "np"})

    def write(fp):
        fp.write(head)
        for a in arrays.values():
            if a.nbytes:
                fp.write(memoryview(a.reshape(-1)).cast("B"))
    write_new_file(path, write)


# ---------------------------------------------------------------------------------- export
def export_training_script(model: Module, folder, *, data, training_config, tokenizer_folder=None,
                           data_settings=None, optimizer=None, lr=1e-3, lora: Lora | None = None,
                           frozen: ParamGroup | None = None, base_folder=None) -> ExportedScript:
    """Write `train.py`, `train_config.json`, the token rows and the initial adapter (see this
    file's doc) into `folder`, for `model` (opened by `from_pretrained`, or any model of a known
    family) trained on `data` as Ember's Learner would (`kind="causal-lm"`).

    - `data`: the training rows Ember trains on (a `TextDataset`) or a `(train, valid)` pair
      (`engine.train.run_spec.make_data` gives the app's); `data_settings`: the run's causal-lm
      `DataSettings` they were made with (text file, tokenizer, block size, packing...), written
      to the config so that `train.py --tokenize` can make them again.
    - `training_config`: a `TrainingConfig` (epochs, batch size, seed, shuffle, accumulation,
      warm-up, clipping); `optimizer`: an Adam / AdamW / SGD config (default `AdamWConfig()`,
      Burn's defaults); `lr`: a constant learning rate.
    - `lora`: a `Lora` to attach to a model that carries no adapters yet (the returned
      `ExportedScript.model` has them); a model with adapters keeps its own.
    - `frozen`: a `ParamGroup` to freeze besides what the model already froze.
    - `tokenizer_folder`: copied into the base folder's place when the base is written out
      (default: the data's tokenizer, else the model's folder).
    - `base_folder`: the Hugging Face folder the script loads; default: the model's own folder
      when its base weights are unchanged, else a `save_pretrained` copy in `folder/base_model`.
    """
    from ..models.peft import ADAPTER_CONFIG, save_peft_adapter  # noqa: PLC0415
    from ..models.pretrained import family_of, pretrained_info  # noqa: PLC0415
    from ..models.save import save_pretrained  # noqa: PLC0415

    if not isinstance(model, Module):
        raise TypeError(f"export_training_script expects a Module, got {type(model).__name__}")
    fam, _ = family_of(model)
    if fam is None:
        raise PretrainedError(f"export_training_script needs a model of a known Hugging Face family (opened with "
                              f"from_pretrained); found a {type(model).__name__}")
    training = training_config
    missing = [k for k in ("num_epochs", "batch_size", "seed", "shuffle", "drop_last", "grad_accumulation",
                           "warmup_steps", "max_grad_norm") if not hasattr(training, k)]
    if missing:
        raise TypeError(f"export_training_script: training_config must be a TrainingConfig, found "
                        f"{type(training).__name__} without {', '.join(missing)}")
    opt = _optimizer_json(optimizer if optimizer is not None else optim.AdamWConfig(), lr, training)
    adapters = {path: p.reparameterization for path, p in iter_param_slots(model) if p.reparameterization is not None}
    if any(isinstance(r, QLoraAdapter) for r in adapters.values()):
        raise PretrainedError("export_training_script: the model carries QLoRA adapters (NF4 bases): the script "
                              "trains float LoRA; expected LoRA, rsLoRA or DoRA adapters")
    if lora is not None:
        if adapters:
            raise ValueError("export_training_script: the model already carries LoRA adapters; lora= attaches "
                             "adapters to a model without them")
        model = model.apply_lora(lora)
        adapters = {path: p.reparameterization for path, p in iter_param_slots(model)
                    if p.reparameterization is not None}
    if frozen is not None:
        model = model.freeze_group(frozen)
    if adapters and not all(isinstance(r, LoraAdapter) for r in adapters.values()):
        kinds = sorted({type(r).__name__ for r in adapters.values() if not isinstance(r, LoraAdapter)})
        raise PretrainedError(f"export_training_script: the model carries {', '.join(kinds)}: the script trains "
                              f"LoRA adapters only")
    frozen_names, trainable_names, trainable_values = _trainability(model)
    if not trainable_names:
        raise ValueError("export_training_script: nothing in the model trains (every parameter is frozen)")
    train, valid, data_desc = _rows(data, data_settings, training)
    arrays = {f"train_{k}": v for k, v in _check_rows(train, "the training rows").items()}
    if valid is not None and len(valid):
        arrays.update({f"valid_{k}": v for k, v in _check_rows(valid, "the validation rows").items()})

    folder = Path(os.fspath(folder)).expanduser()
    if folder.exists() and not folder.is_dir():
        raise PretrainedError("expected a folder to write the training script into, found a file", where=str(folder))
    info = pretrained_info(model)
    base = None
    if base_folder is not None:
        base_ref = str(Path(base_folder).expanduser().resolve())
    elif _base_matches_folder(model):
        base_ref = str(info.folder.resolve())
    else:  # the base weights changed in Ember (or came from no folder): the script needs them as they are
        base = detach_reparameterization(model) if adapters else model
        base_ref = BASE_FOLDER
    tok_src = tokenizer_folder or data_desc.get("tokenizer")
    if tok_src:
        tok_src = Path(tok_src)
        tok_src = tok_src.parent if tok_src.is_file() else tok_src
    if tokenizer_folder is not None:
        data_desc["tokenizer"] = str(Path(tokenizer_folder).expanduser().resolve())
    tx, ty = arrays["train_inputs"], arrays["train_targets"]
    config = {
        "written_by": "Ember (engine.interop.export_training_script)",
        "model": {"base": base_ref, "family": fam.name, "dtype": "float32"},
        "lora": None,
        "frozen_parameters": frozen_names,
        "trainable_parameters": trainable_names,
        "trainable_values": int(trainable_values),
        "optimizer": opt,
        "training": {"num_epochs": int(training.num_epochs), "batch_size": int(training.batch_size),
                     "valid_batch_size": int(training.valid_batch_size or training.batch_size),
                     "grad_accumulation": int(training.grad_accumulation), "seed": int(training.seed),
                     "shuffle": bool(training.shuffle), "drop_last": bool(training.drop_last)},
        "data": {"tokens": TOKENS_FILE, "train_rows": int(tx.shape[0]),
                 "valid_rows": int(arrays["valid_inputs"].shape[0]) if "valid_inputs" in arrays else 0,
                 "train_target_tokens": int((ty != -100).sum()), "ignore_index": -100,
                 "packed_sequences": "train_segment_ids" in arrays, **data_desc},
    }

    def write(staging: Path) -> None:
        # everything into one private folder, swapped in at once: the script, its config, the rows and
        # the adapter always belong to the same export (a re-export replaces them together)
        if base is not None:
            # the tokenizer's files are checked and copied as part of the one save of the base folder
            save_pretrained(base, staging / BASE_FOLDER, extra_files_from=tok_src or None)
        if adapters:
            adapter_dir = staging / ADAPTER_FOLDER
            save_peft_adapter(model, adapter_dir)
            saved = json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
            lora_json = {k: saved[k] for k in ("r", "lora_alpha", "target_modules", "use_rslora", "use_dora",
                                               "rank_pattern", "alpha_pattern", "fan_in_fan_out", "bias",
                                               "modules_to_save")}
            if saved.get("target_parameters"):  # a mixture's router
                lora_json["target_parameters"] = saved["target_parameters"]
            config["lora"] = {**lora_json, "initial_adapter": ADAPTER_FOLDER}
        _write_tokens(staging / TOKENS_FILE, arrays)
        text = json.dumps(config, indent=2) + "\n"
        write_new_file(staging / CONFIG_FILE, lambda fp: fp.write(text.encode("utf-8")))
        write_new_file(staging / SCRIPT_FILE, lambda fp: fp.write(TRAIN_PY.encode("utf-8")))

    try:
        folder = save_folder(folder, write, lambda name: name in EXPORT_NAMES)
    except OSError as exc:
        raise PretrainedError(f"cannot write the training script: {os_error_reason(exc)}",
                              where=exc.filename or str(folder)) from None
    written = [folder / n for n in EXPORT_NAMES if (folder / n).exists() and
               (n != BASE_FOLDER or base is not None) and (n != ADAPTER_FOLDER or adapters)]
    config_path, script = folder / CONFIG_FILE, folder / SCRIPT_FILE
    return ExportedScript(folder, script, config_path, config, model, written)
