"""Module-owned training flags (Burn's `Param<Flag>`): dropout, running statistics, noise.

A layer whose behaviour differs between training and inference keeps a `Flag` field:

    class Dropout(Module):
        def __init__(self, prob):
            self.prob = prob
            self.training = Flag(True)

        def forward(self, x):
            if not self.training or self.prob == 0 or not x.is_autodiff():
                return x
            ...

`bool(flag)` is whether the behaviour is on now. The flag keeps two states, like a parameter's
trainability: its *configured* value, set by `freeze()` / `unfreeze()` (and their group
variants), and the mode: `valid()` turns every flag off without forgetting the configured
value, `train()` turns each flag back to its configured value. `no_grad()` and
`set_require_grad()` leave flags alone. Flags have an id and a path (`dropout.training`), so
parameter groups select them like parameters; they hold no tensor and count no parameters.
"""
from __future__ import annotations

from .param import ParamId

__all__ = ["Flag"]


class Flag:
    """A training flag: `Flag(True)`. Immutable; transitions return new flags with the same id."""

    __slots__ = ("id", "enabled", "configured", "_ad")

    def __init__(self, enabled: bool = True, id: ParamId | None = None):
        self.id = ParamId() if id is None else ParamId(id)
        self.enabled = bool(enabled)
        self.configured = bool(enabled)
        self._ad = True

    @classmethod
    def _make(cls, id, enabled, configured, ad) -> "Flag":
        f = object.__new__(cls)
        f.id = id
        f.enabled = enabled
        f.configured = configured
        f._ad = ad
        return f

    def __bool__(self) -> bool:
        return self.enabled

    def with_value(self, value: bool) -> "Flag":
        """Configured to `value`; on now only when the flag is not in validation mode."""
        value = bool(value)
        return Flag._make(self.id, value and self._ad, value, self._ad)

    def valid(self) -> "Flag":
        return Flag._make(self.id, False, self.configured, False)

    def train(self) -> "Flag":
        return Flag._make(self.id, self.configured, self.configured, True)

    def clone(self) -> "Flag":
        return Flag._make(self.id, self.enabled, self.configured, self._ad)

    def __copy__(self) -> "Flag":
        return self

    def __deepcopy__(self, memo) -> "Flag":
        return self

    def __eq__(self, other) -> bool:
        if isinstance(other, bool):
            return self.enabled == other
        return NotImplemented

    __hash__ = object.__hash__

    def __str__(self) -> str:
        return "enabled" if self.enabled else "disabled"

    def __repr__(self) -> str:
        return f"Flag({self.enabled}, configured={self.configured}, id={self.id})"
