"""The editable fields of a design node, derived from a layer's `…Config` dataclass.

A field keeps its value in *design form*: plain JSON (numbers, strings, booleans, lists), so a
design file and an undo snapshot are just data. `FieldSpec` converts between three forms:

- text, as the user types it in the configuration form (`parse(text)` / `to_text(value)`);
- design form, as stored in the design (`check(value)` validates one read from a file);
- the Python value the `…Config` dataclass takes (`to_config(value)`).

Kinds:
`int`, `float`, `bool`, `str`; `ints` / `floats`: a fixed number `n` of ints / floats (Burn's
`[usize; 2]`); `int_list` / `float_list`: any number of them; `enum`: one of `choices`;
`padding`: Burn's `PaddingConfigNd` (`"Valid"`, `"Same"`, or `2 * n` explicit ints);
`dims`: a tensor shape with named axes (`["batch", 28, 28]`, and -1 where `allow_infer`).
Any kind can be `optional` (None, shown as an empty text).
"""
from __future__ import annotations

import dataclasses
import enum
import keyword
import math
import re
from typing import Any

__all__ = ["FieldError", "FieldSpec", "MISSING", "is_axis_name"]



class _Missing:
    """The default of a required field (one the config has no default for)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class FieldError(ValueError):
    """A value that does not fit a field: says what was expected and what was found."""


def is_axis_name(text: str) -> bool:
    """A named axis (`batch`, `seq_len`): a Python identifier that is not a keyword."""
    return isinstance(text, str) and bool(_NAME.match(text)) and not keyword.iskeyword(text)


def _int(text: str, what: str) -> int:
    t = text.strip()
    try:
        return int(t)
    except ValueError:
        raise FieldError(f"expected {what}, got {t!r}") from None


def _float(text: str, what: str) -> float:
    t = text.strip()
    try:
        v = float(t)
    except ValueError:
        raise FieldError(f"expected {what}, got {t!r}") from None
    if math.isnan(v):
        raise FieldError(f"expected {what}, got NaN")
    return v


def _items(text: str) -> list[str]:
    t = text.strip()
    if t[:1] in "[(" and t[-1:] in "])":
        t = t[1:-1]
    parts = [p.strip() for p in t.split(",")]
    if parts and parts[-1] == "":  # a trailing comma
        parts.pop()
    return parts


def _fmt_float(v: float) -> str:
    return repr(float(v))


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One editable field of a node: its name, kind, default (design form) and constraints."""

    name: str
    kind: str
    default: Any = MISSING
    n: int = 0  # the length of `ints` / `floats`, the spatial rank of `padding`
    optional: bool = False
    choices: tuple = ()
    enum_class: Any = None  # for `enum`: the Enum whose member names are the choices
    padding_class: Any = None  # for `padding`: PaddingConfig1d / 2d / 3d
    allow_infer: bool = False  # for `dims`: one -1 may stand for the size that makes the count right
    minimum: float | None = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is MISSING

    # ------------------------------------------------------------------ text <-> design form
    def parse(self, text: str):
        """The design-form value of what the user typed; `FieldError` says why it does not fit."""
        t = str(text).strip()
        if t == "" or t.lower() == "none":
            if self.optional:
                return None
            raise FieldError(f"{self.name}: a value is required ({self.expected()})")
        try:
            value = self._parse(t)
        except FieldError as e:
            raise FieldError(f"{self.name}: {e}") from None
        return self.check(value)

    def _parse(self, t: str):
        k = self.kind
        if k == "int":
            return _int(t, "an integer")
        if k == "float":
            return _float(t, "a number")
        if k == "bool":
            low = t.lower()
            if low in ("true", "yes", "1", "on"):
                return True
            if low in ("false", "no", "0", "off"):
                return False
            raise FieldError(f"expected true or false, got {t!r}")
        if k == "str":
            return t
        if k in ("ints", "int_list"):
            return [_int(p, "integers separated by commas") for p in _items(t)]
        if k in ("floats", "float_list"):
            return [_float(p, "numbers separated by commas") for p in _items(t)]
        if k == "enum":
            for c in self.choices:
                if c.lower() == t.lower():
                    return c
            raise FieldError(f"expected one of {', '.join(self.choices)}, got {t!r}")
        if k == "padding":
            low = t.lower()
            if low in ("valid", "same"):
                return low.capitalize()
            inner = t
            m = re.match(r"^explicit\s*\((.*)\)$", t, re.IGNORECASE)
            if m:
                inner = m.group(1)
            return [_int(p, "Valid, Same or explicit paddings separated by commas") for p in _items(inner)]
        if k == "dims":
            out = []
            for p in _items(t):
                if is_axis_name(p):
                    out.append(p)
                else:
                    out.append(_int(p, "sizes or axis names separated by commas"))
            return out
        raise FieldError(f"unknown field kind {k!r}")  # pragma: no cover

    def to_text(self, value) -> str:
        """The text the form shows for a design-form value."""
        if value is None:
            return ""
        k = self.kind
        if k == "bool":
            return "true" if value else "false"
        if k == "float":
            return _fmt_float(value)
        if k in ("ints", "int_list", "dims"):
            return ", ".join(str(v) for v in value)
        if k in ("floats", "float_list"):
            return ", ".join(_fmt_float(v) for v in value)
        if k == "padding":
            return value if isinstance(value, str) else ", ".join(str(v) for v in value)
        return str(value)

    def expected(self) -> str:
        """What the field takes, in words (shown as the form's placeholder and in errors)."""
        k = self.kind
        base = {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "str": "text",
            "ints": f"{self.n} integers",
            "floats": f"{self.n} numbers",
            "int_list": "integers separated by commas",
            "float_list": "numbers separated by commas",
            "enum": "one of " + ", ".join(self.choices),
            "padding": f"Valid, Same or {2 * self.n} integers",
            "dims": "sizes or axis names, e.g. batch, 28, 28",
        }[k]
        return base + (" (or empty for none)" if self.optional else "")

    # ------------------------------------------------------------------ design form checks
    def check(self, value):
        """Validate a design-form value (from a file or from `parse`) and return it normalized."""
        if value is None:
            if self.optional:
                return None
            raise FieldError(f"{self.name}: a value is required ({self.expected()})")
        k = self.kind
        if k == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise FieldError(f"{self.name}: expected an integer, got {value!r}")
            self._check_min(value)
            return int(value)
        if k == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FieldError(f"{self.name}: expected a number, got {value!r}")
            if math.isnan(value):
                raise FieldError(f"{self.name}: expected a number, got NaN")
            self._check_min(value)
            return float(value)
        if k == "bool":
            if not isinstance(value, bool):
                raise FieldError(f"{self.name}: expected true or false, got {value!r}")
            return value
        if k == "str":
            if not isinstance(value, str):
                raise FieldError(f"{self.name}: expected text, got {value!r}")
            return value
        if k in ("ints", "int_list", "floats", "float_list"):
            if not isinstance(value, (list, tuple)):
                raise FieldError(f"{self.name}: expected {self.expected()}, got {value!r}")
            want_int = k in ("ints", "int_list")
            items = []
            for v in value:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or (want_int and not float(v).is_integer()):
                    raise FieldError(f"{self.name}: expected {self.expected()}, got {list(value)!r}")
                items.append(int(v) if want_int else float(v))
            if k in ("ints", "floats") and len(items) != self.n:
                raise FieldError(f"{self.name}: expected {self.n} values, got {len(items)} ({_show(items)})")
            for v in items:
                self._check_min(v)
            return items
        if k == "enum":
            if value not in self.choices:
                raise FieldError(f"{self.name}: expected one of {', '.join(self.choices)}, got {value!r}")
            return value
        if k == "padding":
            if value in ("Valid", "Same"):
                return value
            if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                if len(value) != 2 * self.n:
                    raise FieldError(f"{self.name}: expected Valid, Same or {2 * self.n} explicit paddings "
                                     f"({', '.join(self.padding_class.SIDES) if self.padding_class else ''}), "
                                     f"got {len(value)} ({_show(value)})")
                if any(v < 0 for v in value):
                    raise FieldError(f"{self.name}: paddings must be >= 0, got {_show(value)}")
                return list(value)
            raise FieldError(f"{self.name}: expected Valid, Same or {2 * self.n} integers, got {value!r}")
        if k == "dims":
            if not isinstance(value, (list, tuple)):
                raise FieldError(f"{self.name}: expected a list of sizes and axis names, got {value!r}")
            out = []
            inferred = 0
            for v in value:
                if isinstance(v, str):
                    if not is_axis_name(v):
                        raise FieldError(f"{self.name}: {v!r} is not an axis name (letters, digits and _)")
                    out.append(v)
                elif isinstance(v, int) and not isinstance(v, bool):
                    if v == -1 and self.allow_infer:
                        inferred += 1
                    elif v < 1:
                        allowed = "sizes >= 1, axis names, or one -1" if self.allow_infer else "sizes >= 1 or axis names"
                        raise FieldError(f"{self.name}: expected {allowed}, got {v} in {_show(value)}")
                    out.append(v)
                else:
                    raise FieldError(f"{self.name}: expected sizes and axis names, got {v!r} in {list(value)!r}")
            if inferred > 1:
                raise FieldError(f"{self.name}: at most one -1 may be inferred, got {_show(value)}")
            return out
        raise FieldError(f"{self.name}: unknown field kind {k!r}")  # pragma: no cover

    def _check_min(self, v) -> None:
        if self.minimum is not None and v < self.minimum:
            m = self.minimum
            shown = int(m) if float(m).is_integer() else m
            raise FieldError(f"{self.name}: expected a value >= {shown}, got {v}")

    # ------------------------------------------------------------------ design form -> config
    def to_config(self, value):
        """The value the `…Config` dataclass (or the module's constructor) takes."""
        if value is None:
            return None
        k = self.kind
        if k in ("ints", "floats"):
            return tuple(value)
        if k in ("int_list", "float_list", "dims"):
            return list(value)
        if k == "enum" and self.enum_class is not None:
            return self.enum_class[value]
        if k == "padding":
            pc = self.padding_class
            if isinstance(value, str):
                return getattr(pc, value)
            return pc.Explicit(*value)
        return value

    @staticmethod
    def from_config_value(spec: "FieldSpec", value):
        """The design form of a value found in a config (a default): tuples to lists, enums to names."""
        if value is None:
            return None
        if isinstance(value, enum.Enum):
            return value.name
        if spec.kind == "padding":
            kind = getattr(value, "kind", None)
            if kind in ("Valid", "Same"):
                return kind
            if kind == "Explicit":
                return list(value.values)
            if isinstance(value, str):
                return value.capitalize()
        if isinstance(value, tuple):
            return [spec.from_config_value(spec, v) if isinstance(v, tuple) else v for v in value]
        if spec.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value


def _show(items) -> str:
    return "[" + ", ".join(str(v) for v in items) + "]"
