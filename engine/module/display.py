"""Module display, as Burn's `ModuleDisplay` prints it.

`str(module)` is `module.format(DisplaySettings())`. A module customizes its display by
overriding `custom_settings(self) -> DisplaySettings | None` (settings for itself and, by
inheritance, its children) and `custom_content(self, content) -> Content | None` (which
attributes to show). Without custom content every field is shown: children formatted
recursively, plain attributes as Rust's Debug would print them.

Built-in layers print their configuration inline, e.g.

    class Linear(Module):
        def custom_settings(self):
            return DisplaySettings().with_new_line_after_attribute(False).optional()

        def custom_content(self, content):
            return (content.add("d_input", self.d_input).add("d_output", self.d_output)
                    .add("bias", self.bias is not None).optional())

giving `Linear {d_input: 3, d_output: 5, bias: true, params: 20}`. Values given to
`Content.add` are formatted as Rust's `Display` formats them (`0.00001`, `-10000`, `true`,
strings as they are); use `rust_debug(value)` / `option(value)` for Debug forms such as
`[3, 3]`, `Valid`, `Some([20, 20])` or `None`.
"""
from __future__ import annotations

import contextvars
import enum
import math
import numbers

import numpy as np

from ..tensor import Tensor
from .tree import FieldKind, children, fields, kind_of

__all__ = [
    "DisplaySettings",
    "Content",
    "Attribute",
    "Debug",
    "format_module",
    "format_value",
    "default_content",
    "rust_display",
    "rust_debug",
    "option",
]


_PARAM_KIND, _MODULE_KIND, _REPARAM_KIND = FieldKind.PARAM, FieldKind.MODULE, FieldKind.REPARAMETERIZATION
# {id(module): displayed parameter count} of the display being made (see _shown_params), None between displays
_COUNTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("display_counts", default=None)


class DisplaySettings:
    """Display options; unset options inherit from the parent's settings as in Burn.

    Defaults: param ids off, all attributes off, parameter counts on, new line after each
    attribute on, indentation 2. Each `with_*` returns new settings.
    """

    __slots__ = ("_show_param_id", "_show_all_attributes", "_show_num_parameters",
                 "_new_line_after_attribute", "_indentation_size", "level")

    def __init__(self):
        self._show_param_id = None
        self._show_all_attributes = None
        self._show_num_parameters = None
        self._new_line_after_attribute = None
        self._indentation_size = None
        self.level = 1

    @staticmethod
    def new() -> "DisplaySettings":
        return DisplaySettings()

    def _copy(self, **changes) -> "DisplaySettings":
        s = object.__new__(DisplaySettings)
        for k in DisplaySettings.__slots__:
            setattr(s, k, changes.get(k, getattr(self, k)))
        return s

    def with_show_param_id(self, flag: bool) -> "DisplaySettings":
        return self._copy(_show_param_id=bool(flag))

    def with_show_all_attributes(self, flag: bool) -> "DisplaySettings":
        return self._copy(_show_all_attributes=bool(flag))

    def with_show_num_parameters(self, flag: bool) -> "DisplaySettings":
        return self._copy(_show_num_parameters=bool(flag))

    def with_new_line_after_attribute(self, flag: bool) -> "DisplaySettings":
        return self._copy(_new_line_after_attribute=bool(flag))

    def with_indentation_size(self, size: int) -> "DisplaySettings":
        size = int(size)
        if size < 0:
            raise ValueError(f"with_indentation_size: expected a size >= 0, got {size}")
        return self._copy(_indentation_size=size)

    def optional(self) -> "DisplaySettings":
        """Burn's `.optional()` (wraps in `Some`); in Python the settings themselves."""
        return self

    def inherit(self, top: "DisplaySettings") -> "DisplaySettings":
        """These settings, overridden by every option `top` sets, at `top`'s level."""
        s = self._copy()
        for k in ("_show_param_id", "_show_all_attributes", "_show_num_parameters",
                  "_new_line_after_attribute", "_indentation_size"):
            v = getattr(top, k)
            if v is not None:
                setattr(s, k, v)
        s.level = top.level
        return s

    def level_up(self) -> "DisplaySettings":
        return self._copy(level=self.level + 1)

    def show_param_id(self) -> bool:
        return False if self._show_param_id is None else self._show_param_id

    def show_all_attributes(self) -> bool:
        return False if self._show_all_attributes is None else self._show_all_attributes

    def show_num_parameters(self) -> bool:
        return True if self._show_num_parameters is None else self._show_num_parameters

    def new_line_after_attribute(self) -> bool:
        return True if self._new_line_after_attribute is None else self._new_line_after_attribute

    def indentation_size(self) -> int:
        return 2 if self._indentation_size is None else self._indentation_size

    def __repr__(self) -> str:
        return (f"DisplaySettings(show_param_id={self._show_param_id}, show_all_attributes={self._show_all_attributes}, "
                f"show_num_parameters={self._show_num_parameters}, new_line_after_attribute="
                f"{self._new_line_after_attribute}, indentation_size={self._indentation_size}, level={self.level})")


class Attribute:
    __slots__ = ("name", "value", "ty")

    def __init__(self, name: str, value: str, ty: str):
        self.name, self.value, self.ty = name, value, ty

    def __repr__(self) -> str:
        return f"Attribute({self.name!r}, {self.value!r})"


class Content:
    """What a module shows: named attributes, or a single item, and the type name on top."""

    __slots__ = ("attributes", "single_item", "display_settings", "top_level_type")

    def __init__(self, display_settings: DisplaySettings | None = None):
        self.attributes: list[Attribute] = []
        self.single_item: str | None = None
        self.display_settings = DisplaySettings() if display_settings is None else display_settings
        self.top_level_type: str | None = None

    def add(self, name: str, value) -> "Content":
        """Add `name: value`, the value formatted with these settings (modules recursively,
        numbers and strings as Rust's Display)."""
        if self.single_item is not None:
            raise ValueError("Content.add: cannot add attributes when a single item is set")
        self.attributes.append(Attribute(str(name), format_value(value, self.display_settings), type(value).__name__))
        return self

    def add_debug_attribute(self, name: str, value) -> "Content":
        """Add `name: value` with the value formatted as Rust's Debug (`[3, 3]`, `Some(2)`, `"text"`)."""
        if self.single_item is not None:
            raise ValueError("Content.add_debug_attribute: cannot add attributes when a single item is set")
        self.attributes.append(Attribute(str(name), rust_debug(value), type(value).__name__))
        return self

    def add_single(self, value) -> "Content":
        """Show only `value` (formatted with these settings)."""
        if self.attributes:
            raise ValueError("Content.add_single: cannot set a single item when attributes are set")
        self.single_item = format_value(value, self.display_settings)
        return self

    def add_formatted(self, value) -> "Content":
        """Show only `str(value)`."""
        if self.attributes:
            raise ValueError("Content.add_formatted: cannot set a single item when attributes are set")
        self.single_item = str(value)
        return self

    def set_top_level_type(self, ty: str) -> "Content":
        self.top_level_type = str(ty)
        return self

    def optional(self) -> "Content | None":
        """None when nothing was added (Burn's `optional`), else the content."""
        if not self.attributes and self.single_item is None and self.top_level_type is None:
            return None
        return self

    def __repr__(self) -> str:
        return f"Content({self.attributes!r}, single_item={self.single_item!r}, top={self.top_level_type!r})"


# ---------------------------------------------------------------------------------- formatting
def format_module(module, passed: DisplaySettings) -> str:
    """Burn's `ModuleDisplay::format`."""
    if _COUNTS.get() is None and passed.show_num_parameters():  # the outermost module of this display
        token = _COUNTS.set(_display_counts(module))
        try:
            return _format_module(module, passed)
        finally:
            _COUNTS.reset(token)
    return _format_module(module, passed)


def _format_module(module, passed: DisplaySettings) -> str:
    custom = module.custom_settings()
    settings = custom.inherit(passed) if custom is not None else passed
    size = settings.indentation_size()
    indent = " " * (settings.level * size)
    indent_close = " " * ((settings.level - 1) * size)
    settings = settings.level_up()
    self_type = type(module).__name__

    content = None
    if not settings.show_all_attributes():
        content = module.custom_content(Content(settings))
    if content is None:
        content = module.content(Content(settings))
    if content is None:
        raise ValueError(f"{self_type}: no display content (content() returned None)")
    if not isinstance(content, Content):
        raise TypeError(f"{self_type}: custom_content/content must return a Content or None, got {type(content).__name__}")

    top = content.top_level_type if content.top_level_type is not None else self_type
    if content.single_item is not None:
        return content.single_item
    if not content.attributes:
        return top

    nl = settings.new_line_after_attribute()
    parts = [f"{top} {{\n" if nl else f"{top} {{"]
    for i, a in enumerate(content.attributes):
        if nl:
            parts.append(f"{indent}{a.name}: {a.value}\n")
        elif i == 0:
            parts.append(f"{a.name}: {a.value}")
        else:
            parts.append(f", {a.name}: {a.value}")
    if settings.show_num_parameters():
        n = _shown_params(module)
        if n > 0:
            parts.append(f"{indent}params: {n}\n" if nl else f", params: {n}")
    parts.append(f"{indent_close}}}" if nl else "}")
    return "".join(parts)


def default_content(module, content: Content) -> Content | None:
    """Every field: children formatted, plain attributes as Rust's Debug (Burn's derive)."""
    content.set_top_level_type(type(module).__name__)
    for name, kind, v in fields(module):
        if kind is FieldKind.PLAIN:
            content.add_debug_attribute(name, v)
        else:
            content.add(name, v)
    return content.optional()


def _format_param(p, settings: DisplaySettings) -> str:
    ident = f", id: {p.id}" if settings.show_param_id() else ""
    shape = p.lazy_shape()
    return f"ParamTensor {{rank: {len(shape)}, shape: {_list(shape)}, kind: {p.kind}{ident}}}"


def _list(items) -> str:
    return "[" + ", ".join(str(int(i)) for i in items) + "]"


def _format_container(value, passed: DisplaySettings) -> str:
    """A list / tuple / dict of children, laid out as Burn's Vec / tuple modules print
    (`Vec<0..2> {0: ..., 1: ...}`); containers count no parameters of their own, as in Burn."""
    size = passed.indentation_size()
    indent = " " * (passed.level * size)
    indent_close = " " * ((passed.level - 1) * size)
    settings = passed.level_up()
    c = Content(settings)
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    for key, item in items:
        if kind_of(item) is FieldKind.PLAIN:
            c.add_debug_attribute(str(key), item)
        else:
            c.add(str(key), item)
    if isinstance(value, dict):
        top = f"Map<{len(value)}>"
    elif isinstance(value, tuple):
        top = "(" + ", ".join(f"L{i}" for i in range(len(value))) + ")"
    else:
        top = f"Vec<0..{len(value)}>"
    nl = settings.new_line_after_attribute()
    parts = [f"{top} {{\n" if nl else f"{top} {{"]
    for i, a in enumerate(c.attributes):
        if nl:
            parts.append(f"{indent}{a.name}: {a.value}\n")
        elif i == 0:
            parts.append(f"{a.name}: {a.value}")
        else:
            parts.append(f", {a.name}: {a.value}")
    parts.append(f"{indent_close}}}" if nl else "}")
    return "".join(parts)


def format_value(value, settings: DisplaySettings) -> str:
    """Format a field or attribute value as Burn's `Content::add` would."""
    kind = kind_of(value)
    if kind is FieldKind.MODULE:
        return format_module(value, settings)
    if kind is FieldKind.PARAM:
        return _format_param(value, settings)
    if kind is FieldKind.FLAG:
        return str(value)
    if kind is FieldKind.CONSTANT:
        return f"Tensor {{rank: {value.rank}, shape: {_list(value.shape)}}}"
    if kind is FieldKind.CONTAINER:
        return _format_container(value, settings)
    return rust_display(value)


# ---------------------------------------------------------------------------------- Rust forms
class Debug(str):
    """A string already in its final form: shown verbatim by `Content.add` and inside `rust_debug`."""

    __slots__ = ()


def option(value) -> Debug:
    """Rust's Debug of an `Option`: `None`, or `Some(<Debug of value>)`."""
    return Debug("None" if value is None else f"Some({rust_debug(value)})")


def _float_display(x) -> str:
    x = float(x) if not isinstance(x, np.floating) else x
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return np.format_float_positional(x if isinstance(x, np.floating) else np.float64(x), unique=True, trim="-")


def _float_debug(x) -> str:
    xf = float(x)
    if math.isnan(xf):
        return "NaN"
    if math.isinf(xf):
        return "inf" if xf > 0 else "-inf"
    v = x if isinstance(x, np.floating) else np.float64(xf)
    if xf != 0.0 and (abs(xf) < 1e-4 or abs(xf) >= 1e16):
        s = np.format_float_scientific(v, unique=True, trim="-")
        mant, _, exp = s.partition("e")
        return f"{mant}e{int(exp)}"
    return np.format_float_positional(v, unique=True, trim="0")


def _str_debug(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\0":
            out.append("\\0")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def rust_display(value) -> str:
    """`format!("{}", value)` for Python values: floats without exponent (`0.00001`, `-10000`,
    `2`), `true` / `false`, strings as they are, enums by member name, sequences as Debug."""
    hook = getattr(value, "__rust_display__", None)
    if hook is not None and not isinstance(value, type):
        return hook()
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, enum.Enum):
        return rust_debug(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return _float_display(value)
    if value is None:
        return "None"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return rust_debug(value)
    return str(value)


def rust_debug(value) -> str:
    """`format!("{:?}", value)` for Python values: `[1, 2]`, `(1, 2)`, `"text"`, `1e-5`, `0.5`,
    `2.0`, `true`, `None`, enum members by name (or their `__rust_debug__()`)."""
    if isinstance(value, Debug):
        return str.__str__(value)
    hook = getattr(value, "__rust_debug__", None)
    if hook is not None and not isinstance(value, type):
        return hook()
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, str):
        return _str_debug(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return _float_debug(value)
    if value is None:
        return "None"
    if isinstance(value, list):
        return "[" + ", ".join(rust_debug(v) for v in value) + "]"
    if isinstance(value, tuple):
        if len(value) == 1:
            return f"({rust_debug(value[0])},)"
        return "(" + ", ".join(rust_debug(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{rust_debug(k)}: {rust_debug(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(rust_debug(v) for v in value) + "}"
    if isinstance(value, Tensor):
        return f"Tensor {{rank: {value.rank}, shape: {_list(value.shape)}}}"
    return repr(value)


def _shown_params(module) -> int:
    """The parameter elements a display counts: every parameter below `module` once (one held at
    several places, as a fused module's shared LoRA `a`, counts once), its reparameterization's
    (LoRA factors) included; a GGUF weight's stored blocks (`PACKED_STORAGE`) stand for the weight,
    which is counted already, so their bytes are not parameters (of the modules above them).

    While a display is made, the counts of every module in it come from one pass over its tree
    (`_display_counts`), so that a model of 50,000 modules is not walked again for each module shown."""
    counts = _COUNTS.get()
    if counts is not None:
        n = counts.get(id(module))
        if n is not None:
            return n
    return _display_counts(module)[id(module)]


def _display_counts(root) -> dict[int, int]:
    """{id(module): its displayed parameter count} for `root` and every module (and reparameterization)
    below it, in one pass: each module gathers its parameters' counts by id, then gives them to the
    module above it (but a packed storage's, which stay its own)."""
    counts: dict[int, int] = {}

    def gather(node, acc: dict) -> None:
        for _, kind, v in children(node):
            if kind is _PARAM_KIND:
                acc[v.id] = math.prod(v.lazy_shape())
                if v.reparameterization is not None:
                    gather(v, acc)
            elif kind is _MODULE_KIND or kind is _REPARAM_KIND:
                own: dict = {}
                gather(v, own)
                counts[id(v)] = sum(own.values())
                if not getattr(type(v), "PACKED_STORAGE", False):
                    acc.update(own)
            else:  # a list / tuple / dict of children
                gather(v, acc)

    top: dict = {}
    gather(root, top)
    counts[id(root)] = sum(top.values())
    return counts
