"""How many parameters train, in the form users know from PEFT's `print_trainable_parameters`:

    trainable params: 2,048 || all params: 36,618 || trainable%: 5.5929

Every parameter element counts once: a reparameterized parameter counts its base and the
parameters of its reparameterization (LoRA factors). A weight packed as NF4 (QLoRA) counts by
its logical element count, not by the bytes and scale constants it is packed into. A parameter
is trainable when it is a float parameter configured to train (`Param.is_active()`: kept
across `valid()`). Nothing is initialized.
"""
from __future__ import annotations

from dataclasses import dataclass

from .lora import NF4Weight
from .module import Module
from .reparam import iter_param_slots

__all__ = ["TrainableCounts", "trainable_counts", "trainable_summary"]


@dataclass(frozen=True)
class TrainableCounts:
    """Parameter element counts: `trainable` of `total`."""

    trainable: int
    total: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def percent(self) -> float:
        """The trainable share in percent (0 for a module without parameters)."""
        return 100.0 * self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return f"trainable params: {self.trainable:,d} || all params: {self.total:,d} || trainable%: {self.percent:.4f}"


def trainable_counts(module: Module) -> TrainableCounts:
    """The trainable and total parameter element counts of `module` (see this file's doc)."""
    if not isinstance(module, Module):
        raise TypeError(f"trainable_counts expects a Module, got {type(module).__name__}")
    trainable = total = 0
    # NF4 storage is skipped: its weight is counted by the parameter's base, which keeps the
    # logical shape.
    for _, p in iter_param_slots(module, skip=lambda m: isinstance(m, NF4Weight)):
        n = p.numel()
        total += n
        if p.kind == "float" and p.is_active():
            trainable += n
    return TrainableCounts(trainable, total)


def trainable_summary(module: Module) -> str:
    """`trainable params: … || all params: … || trainable%: …` for `module`."""
    return str(trainable_counts(module))
