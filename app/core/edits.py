"""Model edits as data: what the user did, in a form the project file keeps and can replay.

An edit is a small dict, for example
`{"op": "freeze", "group": {"kind": "regex", "pattern": "^encoder\\."}}`,
`{"op": "lora", "rank": 8, "alpha": 16.0, "init_std": None, "group": {"kind": "all"}, "qlora": None}`,
`{"op": "fork", "device": "cpu:1"}`. `apply_edit(module, edit)` performs it with the engine's
transitions and returns the new module; the receiver is unchanged.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.module import Lora, QLora
from widgets.module_info import group_from_spec

GROUP_OPS = ("freeze", "unfreeze", "no_grad")
OP_TEXT = {"freeze": "Freeze", "unfreeze": "Unfreeze", "no_grad": "No grad"}


class EditError(ValueError):
    """An edit that cannot be applied: says which edit and why."""


def subtree_group(path: str) -> dict:
    """The group of every parameter at or below `path` ("" is the whole model)."""
    if not path:
        return {"kind": "all"}
    return {"kind": "regex", "pattern": "^" + re.escape(path) + r"(\.|$)"}


def make_group(spec: dict):
    try:
        return group_from_spec(spec)
    except ValueError as e:
        raise EditError(str(e)) from e


def describe_group(spec: dict) -> str:
    kind = spec.get("kind")
    if kind == "all":
        return "all parameters"
    if kind == "regex":
        m = re.fullmatch(r"\^(.*)\(\\\.\|\$\)", spec["pattern"])
        if m:
            return _unescape(m.group(1))
        return f"/{spec['pattern']}/"
    if kind == "path":
        return spec["path"]
    if kind == "paths":
        return ", ".join(spec["paths"])
    if kind == "predicate":
        return f"paths containing {spec['text']!r}"
    return str(spec)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def describe(edit: dict) -> str:
    """The undo-stack text of an edit: `Freeze encoder.layers.0`."""
    op = edit.get("op")
    if op in GROUP_OPS:
        return f"{OP_TEXT[op]} {describe_group(edit['group'])}"
    if op == "lora":
        kind = "QLoRA" if edit.get("qlora") else "LoRA"
        return f"Attach {kind} (rank {edit['rank']}, alpha {edit['alpha']:g}) to {describe_group(edit['group'])}"
    if op == "materialize":
        return "Materialize adapters"
    if op == "fork":
        return f"Fork to {edit['device']}"
    if op == "to_device":
        return f"Transfer to {edit['device']}"
    if op == "load":
        return f"Load weights from {Path(edit['path']).name}"
    return str(op)


def lora_config(edit: dict):
    """The engine's `Lora` (or `QLora`) for a LoRA edit."""
    lora = Lora(edit["rank"], edit["alpha"], init_std=edit.get("init_std"), param_group=make_group(edit["group"]))
    q = edit.get("qlora")
    if q:
        return QLora(lora, block_size=q.get("block_size", 64), double_quant=q.get("double_quant", True))
    return lora


def apply_edit(module: Any, edit: dict) -> Any:
    op = edit.get("op")
    if op in GROUP_OPS:
        group = make_group(edit["group"])
        return getattr(module, f"{op}_group")(group)
    if op == "lora":
        config = lora_config(edit)
        return module.apply_qlora(config) if edit.get("qlora") else module.apply_lora(config)
    if op == "materialize":
        return module.materialize()
    if op == "fork":
        return module.fork(edit["device"])
    if op == "to_device":
        return module.to_device(edit["device"])
    if op == "load":
        from .checkpoints import load  # noqa: PLC0415

        return load(module, edit["path"], edit.get("allow_partial", False))[0]
    raise EditError(f"unknown edit {op!r}: expected freeze, unfreeze, no_grad, lora, materialize, fork, to_device or load")


# An edit that copies or computes more than this runs on a worker thread (app.main_window).
HEAVY_EDIT_BYTES = 32 << 20


def edit_cost_bytes(module: Any, edit: dict) -> int:
    """About how many bytes `edit` copies or computes, without touching a value: the
    initialized parameters a move copies, the weights QLoRA packs (it reads lazy ones too),
    the reparameterized weights `materialize` folds, the files `load` reads. Lazy parameters
    move for free (they stay lazy), and freezing or attaching LoRA copies nothing."""
    op = edit.get("op")
    if op in ("fork", "to_device"):
        return sum(p.numel() * 4 for p in module.params() if p.is_initialized())
    if op == "lora" and edit.get("qlora"):
        return sum(p.numel() * 4 for p in module.params() if p.rank == 2)
    if op == "materialize":
        return sum(p.numel() * 4 for p in module.params() if p.reparameterization is not None)
    if op == "load":
        try:
            return Path(edit["path"]).stat().st_size
        except (OSError, KeyError, TypeError):
            return 0
    return 0


def replay(module: Any, edits: list[dict]) -> Any:
    for i, edit in enumerate(edits):
        try:
            module = apply_edit(module, edit)
        except EditError:
            raise
        except Exception as e:
            raise EditError(f"edit {i + 1} of {len(edits)} ({describe(edit) if isinstance(edit, dict) else edit!r}) "
                            f"failed: {type(e).__name__}: {e}") from e
    return module
