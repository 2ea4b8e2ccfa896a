"""Model edits as data: what the user did, in a form the project file keeps and can replay.

An edit is one of the typed values of `app.core.schema` (`GroupEdit`, `LoraEdit`,
`MaterializeEdit`, `MoveEdit`, `LoadEdit`, `PeftEdit`). `apply_edit(module, edit)` performs it with the
engine's transitions and returns the new module; the receiver is unchanged. `replay` applies a
project's edits in order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from engine.module import Lora, QLora

from .schema import DetachEdit, GroupEdit, GroupSpec, LoadEdit, LoraEdit, MaterializeEdit, MoveEdit, PeftEdit, Edit

OP_TEXT = {"freeze": "Freeze", "unfreeze": "Unfreeze", "no_grad": "No grad"}


class EditError(ValueError):
    """An edit that cannot be applied: says which edit and why."""


def make_group(spec: GroupSpec):
    """The engine's ParamGroup for a spec; a bad spec is an `EditError`."""
    try:
        return spec.to_param_group()
    except ValueError as e:
        raise EditError(str(e)) from e


def describe(edit: Edit) -> str:
    """The undo-stack text of an edit: `Freeze encoder.layers.0`."""
    if isinstance(edit, GroupEdit):
        return f"{OP_TEXT[edit.op]} {edit.group.describe()}"
    if isinstance(edit, LoraEdit):
        kind = "QLoRA" if edit.qlora else {"rslora": "rsLoRA", "dora": "DoRA"}.get(edit.variant, "LoRA")
        fully = f", training {edit.train_fully.describe()} fully" if edit.train_fully is not None else ""
        return f"Attach {kind} (rank {edit.rank}, alpha {edit.alpha:g}) to {edit.group.describe()}{fully}"
    if isinstance(edit, MaterializeEdit):
        return "Materialize adapters"
    if isinstance(edit, DetachEdit):
        return f"Detach LoRA from {edit.group.describe()}"
    if isinstance(edit, MoveEdit):
        return f"{'Fork' if edit.fork else 'Transfer'} to {edit.device}"
    if isinstance(edit, LoadEdit):
        return f"Load weights from {Path(edit.path).name}"
    if isinstance(edit, PeftEdit):
        return f"Load PEFT adapter {Path(edit.path).name}"
    return str(edit)


def lora_config(edit: LoraEdit):
    """The engine's `Lora` (or `QLora`) for a LoRA edit."""
    lora = Lora(edit.rank, edit.alpha, init_std=edit.init_std, param_group=make_group(edit.group),
                use_rslora=edit.variant == "rslora", use_dora=edit.variant == "dora")
    if edit.qlora:
        return QLora(lora, block_size=edit.qlora.block_size, double_quant=edit.qlora.double_quant)
    return lora


def apply_edit(module: Any, edit: Edit) -> Any:
    if isinstance(edit, GroupEdit):
        return getattr(module, f"{edit.op}_group")(make_group(edit.group))
    if isinstance(edit, LoraEdit):
        config = lora_config(edit)
        module = module.apply_qlora(config) if edit.qlora else module.apply_lora(config)
        if edit.train_fully is not None:  # peft's modules_to_save / bias: trainable beside the adapters
            module = module.unfreeze_group(make_group(edit.train_fully))
        return module
    if isinstance(edit, MaterializeEdit):
        return module.materialize()
    if isinstance(edit, DetachEdit):
        return module.detach_reparameterization(make_group(edit.group))
    if isinstance(edit, MoveEdit):
        return module.fork(edit.device) if edit.fork else module.to_device(edit.device)
    if isinstance(edit, LoadEdit):
        from .checkpoints import load  # noqa: PLC0415

        return load(module, edit.path, edit.allow_partial)[0]
    if isinstance(edit, PeftEdit):
        from engine.models.peft import load_peft_adapter  # noqa: PLC0415 - only a project with one reads it

        return load_peft_adapter(module, edit.path)
    raise EditError(f"unknown edit {edit!r}: expected freeze, unfreeze, no_grad, lora, materialize, fork, to_device, "
                    f"load or peft")


# An edit that copies or computes more than this runs on a worker thread (app.edit_actions).
HEAVY_EDIT_BYTES = 32 << 20


def edit_cost_bytes(module: Any, edit: Edit) -> int:
    """About how many bytes `edit` copies or computes, without touching a value: the
    initialized parameters a move copies, the weights QLoRA packs (it reads lazy ones too),
    the reparameterized weights `materialize` folds, the files `load` reads. Lazy parameters
    move for free (they stay lazy), and freezing or attaching LoRA copies nothing."""
    if isinstance(edit, MoveEdit):
        return sum(p.numel() * 4 for p in module.params() if p.is_initialized())
    if isinstance(edit, LoraEdit) and edit.qlora:
        return sum(p.numel() * 4 for p in module.params() if p.rank == 2)
    if isinstance(edit, MaterializeEdit):
        return sum(p.numel() * 4 for p in module.params() if p.reparameterization is not None)
    if isinstance(edit, (LoadEdit, PeftEdit)):
        try:
            path = Path(edit.path)
            return (path / "adapter_model.safetensors" if isinstance(edit, PeftEdit) else path).stat().st_size
        except OSError:
            return 0
    return 0


def replay(module: Any, edits: list[Edit], check: "Callable[[], None] | None" = None) -> Any:
    """Apply `edits` in order; `check()` runs before each (a worker's cancellation check)."""
    for i, edit in enumerate(edits):
        if check is not None:
            check()
        try:
            module = apply_edit(module, edit)
        except EditError:
            raise
        except Exception as e:
            raise EditError(f"edit {i + 1} of {len(edits)} ({describe(edit)}) failed: {type(e).__name__}: {e}") from e
    return module
