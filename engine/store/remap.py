"""Renaming a record's tensors by pattern (Burn's `KeyRemapper` / `with_key_remapping`).

A checkpoint written by another program rarely uses the module's parameter paths. A
`KeyRemapper` is an ordered list of (regular expression, replacement) rules; each name is
rewritten by every rule in turn (`re.sub` syntax: `\\1` or `\\g<name>` for groups):

    remap = KeyRemapper().add(r"^model\\.", "").add(r"\\.q_proj\\.", ".query.")
    record = ModuleRecord.load("weights.safetensors").with_key_remapping(remap)
    model = model.load_record(record)

`remap.apply(name)` gives one name's result, `remap.explain(name)` the rules that changed it.
Two stored names that end up with one name are an error naming both (never a silent
overwrite). Patterns are compiled when added, so a malformed one fails there, with the pattern.
"""
from __future__ import annotations

import re

from .errors import RecordError

__all__ = ["KeyRemapper"]


class KeyRemapper:
    """Ordered regex renames applied to tensor names."""

    def __init__(self, rules=()):
        self._rules: list[tuple[re.Pattern, str]] = []
        for rule in rules:
            try:
                pattern, replacement = rule
            except (TypeError, ValueError):
                raise TypeError(f"KeyRemapper: a rule is a (pattern, replacement) pair, got {rule!r}") from None
            self.add(pattern, replacement)

    def add(self, pattern: str, replacement: str) -> "KeyRemapper":
        """Append a rule; returns the remapper (chainable)."""
        if not isinstance(pattern, str) or not isinstance(replacement, str):
            raise TypeError(f"KeyRemapper.add expects two strings, got {type(pattern).__name__} and "
                            f"{type(replacement).__name__}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"KeyRemapper: invalid pattern {pattern!r}: {exc}") from None
        try:  # sub() parses the template even without a match: a bad group reference fails now
            compiled.sub(replacement, "")
        except (re.error, IndexError) as exc:
            raise ValueError(f"KeyRemapper: replacement {replacement!r} does not fit {pattern!r}: {exc}") from None
        self._rules.append((compiled, replacement))
        return self

    # Burn's name
    add_pattern = add

    @property
    def rules(self) -> list[tuple[str, str]]:
        return [(p.pattern, r) for p, r in self._rules]

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"KeyRemapper({self.rules!r})"

    def apply(self, name: str) -> str:
        for pattern, replacement in self._rules:
            try:
                name = pattern.sub(replacement, name)
            except (re.error, IndexError) as exc:
                raise RecordError(f"key remapping rule {pattern.pattern!r} -> {replacement!r} failed on "
                                  f"{name!r}: {exc}") from None
        return name

    def explain(self, name: str) -> list[tuple[str, str, str]]:
        """(pattern, before, after) for every rule that changed `name`, in order."""
        steps = []
        for pattern, replacement in self._rules:
            after = pattern.sub(replacement, name)
            if after != name:
                steps.append((pattern.pattern, name, after))
            name = after
        return steps

    def mapping(self, names) -> dict[str, str]:
        """{old: new} for `names`; two old names with one new name raise RecordError."""
        out: dict[str, str] = {}
        seen: dict[str, str] = {}
        for old in names:
            new = self.apply(old)
            if not new:
                raise RecordError(f"key remapping turned {old!r} into an empty name")
            if new in seen:
                raise RecordError(f"key remapping maps both {seen[new]!r} and {old!r} to {new!r}")
            seen[new] = old
            out[old] = new
        return out
