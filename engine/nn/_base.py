"""What every built-in layer file shares: configs, display helpers, lazy parameters."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..module import init as initializers
from ..module.display import Content, Debug, DisplaySettings, option, rust_debug  # noqa: F401
from ..module.flag import Flag
from ..module.module import Module
from ..module.param import Param
from ..module.shape import ShapeError, assert_shape  # noqa: F401
from ..tensor import DTypeError
from ..tensor.raw import array

__all__ = [
    "Config",
    "Module",
    "Layer",
    "Param",
    "Flag",
    "Content",
    "DisplaySettings",
    "assert_shape",
    "check_dtype",
    "check_float",
    "check_indices",
    "row_settings",
    "f64",
    "f32",
    "dbg",
    "rust_bool",
    "member_of",
    "initializers",
    "init_with",
    "state",
    "multiplied",
    "looked_up",
    "dtype_value",
]


def init_with(initializer, shape, fan_in, fan_out, device, require_grad: bool = True):
    """A lazy parameter drawn by `initializer` on first use (Burn's `Initializer::init_with`)."""
    if require_grad:
        return initializer.init_with(tuple(shape), fan_in, fan_out, device)
    dims = tuple(int(s) for s in shape)
    return Param.uninitialized(lambda d, rg: initializer.init_tensor(dims, fan_in, fan_out, d), device, False, dims)


def multiplied(weight, x, transposed: bool = False):
    """`x @ weight`'s value (`x @ value.T` when `transposed`) made by the weight's
    reparameterization itself when it says it MULTIPLIES (a GGUF weight kept quantized,
    engine.models.gguf_weight), else None: the layer then multiplies by `weight.val()`."""
    r = weight.reparameterization
    if r is None or not getattr(r, "MULTIPLIES", False):
        return None
    return r.matmul(x, transposed)


def dtype_value(weight):
    """A tensor with the dtype of `weight`'s value, for `check_dtype`: the value itself, or for a
    weight that multiplies in its blocks (`multiplied`) an empty one (its value is never unpacked)."""
    r = weight.reparameterization
    if r is None or not getattr(r, "MULTIPLIES", False):
        return weight.val()
    return r.empty_value()


def looked_up(weight, indices):
    """The rows of the weight's value at `indices` (a Tensor of ints) when its reparameterization
    MULTIPLIES and can give them alone, else None (the layer then indexes `weight.val()`)."""
    r = weight.reparameterization
    if r is None or not getattr(r, "MULTIPLIES", False):
        return None
    return r.rows(array(indices))


def state(initializer, shape, device):
    """Saved running state (Burn's `RunningState`): a lazy parameter that is never trainable."""
    return init_with(initializer, shape, None, None, device, require_grad=False).as_running_state()


# the size and count fields of the layer configs: each must be a positive int (a tuple of them for
# the 2d / 3d layers; None where the field is optional), or >= 0 for the paddings
POSITIVE_FIELDS = frozenset({
    "d_input", "d_output", "d_hidden", "d_model", "d_ff", "n_heads", "n_layers", "n_embedding",
    "num_features", "num_groups", "num_channels", "num_parameters", "channels", "channels_in", "channels_out",
    "kernel_size", "stride", "strides", "dilation", "groups", "output_size", "size", "upscale_factor",
    "downscale_factor", "max_sequence_size", "max_sequence_length", "max_timescale",
})
NON_NEGATIVE_FIELDS = frozenset({"padding", "padding_out"})


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


# {config class: ((field name, positive, optional), ...)}: its size and count fields, in field order
_SIZE_FIELDS: dict[type, tuple[tuple[str, bool, bool], ...]] = {}


def _size_fields(cls) -> tuple[tuple[str, bool, bool], ...]:
    found = _SIZE_FIELDS.get(cls)
    if found is None:
        found = _SIZE_FIELDS[cls] = tuple(
            (f.name, f.name in POSITIVE_FIELDS, f.default is None) for f in dataclasses.fields(cls)
            if f.name in POSITIVE_FIELDS or f.name in NON_NEGATIVE_FIELDS)
    return found


def check_sizes(config) -> None:
    """Raise a ValueError naming the config, the field and the value when a size or count field
    of `config` is not a positive int (>= 0 for a padding)."""
    for name, positive, optional in _SIZE_FIELDS.get(type(config)) or _size_fields(type(config)):
        value = getattr(config, name)
        if type(value) is int and value >= positive:  # a plain int in range (>= 1 when positive; a bool is no int here)
            continue
        if value is None and optional:
            continue  # optional: the layer picks it
        if not positive and not (_is_int(value) or isinstance(value, (tuple, list))):
            continue  # a padding config object (Same / Valid / Explicit) checks itself
        items = list(value) if isinstance(value, (tuple, list)) else [value]
        least = 1 if positive else 0
        bad = not items or any(not _is_int(v) or v < least for v in items)
        if bad:
            want = "a positive int" if positive else "an int >= 0"
            if isinstance(value, (tuple, list)):
                want = f"a tuple of {'positive ints' if positive else 'ints >= 0'}"
            raise ValueError(f"{type(config).__name__}.{name} must be {want}, got {value!r}")


class Config:
    """Mixin for the `…Config` dataclasses: Burn's `with_<field>(value)` builders.

    `LinearConfig(3, 5).with_bias(False)` is `dataclasses.replace(config, bias=False)`.

    A config's `init()` first checks its size and count fields (`check_sizes`): `LinearConfig(16, -3)
    .init()` raises `ValueError: LinearConfig.d_output must be a positive int, got -3`.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("init")
        if init is not None and not getattr(init, "_checks_sizes", False):
            def checked_init(self, *args, __init=init, **kw):
                if hasattr(type(self), "__dataclass_fields__"):  # dataclasses.is_dataclass, without a call
                    check_sizes(self)
                return __init(self, *args, **kw)

            checked_init.__name__, checked_init.__qualname__ = init.__name__, init.__qualname__
            checked_init.__doc__ = init.__doc__
            checked_init.__wrapped__ = init
            checked_init._checks_sizes = True
            cls.init = checked_init

    def __getattr__(self, name: str):
        if name.startswith("with_"):
            field = name[5:]
            names = {f.name for f in dataclasses.fields(self)}
            if field in names:
                return lambda value: dataclasses.replace(self, **{field: value})
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


def row_settings():
    """Burn's built-in layers print on one line: `with_new_line_after_attribute(false)`."""
    return DisplaySettings().with_new_line_after_attribute(False).optional()


class Layer(Module):
    """Base of the built-in layers and losses that Burn displays on one line
    (`Linear {d_input: 3, d_output: 5, bias: true, params: 20}`): their display settings are
    `row_settings()`, which their children inherit. A layer still says what it shows in its own
    `custom_content`."""

    def custom_settings(self):
        return row_settings()


def f64(x) -> str:
    """A float as Rust's `Display` for f64 writes it: shortest round trip, never an exponent."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return np.format_float_positional(x, unique=True, trim="-")


def f32(x) -> str:
    """A float as Rust's `Display` for f32 writes it (the shortest f32 round trip)."""
    x = np.float32(x)
    if np.isnan(x):
        return "NaN"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return np.format_float_positional(x, unique=True, trim="-")


def dbg(value) -> str:
    """Rust's `{:?}` of an int, a bool, a float (f64) or a sequence of those: `[1, 1]`."""
    if isinstance(value, bool):
        return rust_bool(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dbg(v) for v in value) + "]"
    if isinstance(value, float):
        s = f64(value)
        return s + ".0" if s.lstrip("-").isdigit() else s
    return str(value)


def rust_bool(value) -> str:
    return "true" if value else "false"


def member_of(enum_cls, value, what: str, spells):
    """`value` if it is a member of `enum_cls`, else the member `m` with `spells(m, value)` for the
    text `value`; a ValueError naming `what` and the members' names for anything else."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        for m in enum_cls:
            if spells(m, value):
                return m
    raise ValueError(f"unknown {what} {value!r}: expected one of {[m.name for m in enum_cls]}")


def pair(value, n: int, name: str, owner: str) -> tuple:
    """An int or a sequence of `n` ints as a tuple of `n` ints (for kernel sizes, strides)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        items = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{owner}: expected {name} as {n} ints, got {value!r}") from None
    if len(items) != n:
        raise ValueError(f"{owner}: expected {name} as {n} ints, got {list(items)}")
    return items


# ---------------------------------------------------------------------- dtype contracts
# A layer's input meets its parameters at the boundary: the input must have the parameters'
# float dtype (no silent promotion of a float32 layer to float64, no int input computed in
# float). The passing path is one identity test of two NumPy dtypes; everything else (the
# layer's name, the message) is worked out only when the check fails.


def check_dtype(owner, input, param, name: str = "input", param_name: str = "weight") -> None:
    """Refuse `input` unless its dtype is that of the tensor `param` (a layer's parameter).

    `owner` is the layer (its class names it in the message) or a string. Raises `DTypeError`:
    `Linear: input dtype float64 does not match the weight's float32 ...`, or, for an int or
    bool input, `Linear: expected a float tensor, got int64 ...`."""
    try:
        found = array(input).dtype
    except AttributeError:
        raise _not_a_tensor(owner, name, input) from None
    if found is array(param).dtype:
        return
    _dtype_mismatch(owner, input, param, name, param_name)


def check_float(owner, input, name: str = "input") -> None:
    """Refuse an int or bool `input` to a float layer that has no parameter to compare with."""
    try:
        if array(input).dtype.kind == "f":
            return
    except AttributeError:
        raise _not_a_tensor(owner, name, input) from None
    raise DTypeError(f"{_owner_name(owner)}: {_float_expected(input, name)}")


def check_indices(owner, input, name: str = "input") -> None:
    """Refuse a float or bool `input` where a layer looks rows up by integer index (Embedding)."""
    try:
        if array(input).dtype.kind in "iu":
            return
    except AttributeError:
        raise _not_a_tensor(owner, name, input) from None
    raise DTypeError(
        f"{_owner_name(owner)}: expected an int tensor of indices, got {input.dtype} "
        f"({name} dims {list(input.shape)}); convert the {name} with {name}.cast(\"int64\")"
    )


def _owner_name(owner) -> str:
    return owner if isinstance(owner, str) else type(owner).__name__


def _not_a_tensor(owner, name, value) -> TypeError:
    cls = type(value)
    found = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return TypeError(
        f"{_owner_name(owner)}: expected an engine Tensor as {name}, got {found} (convert with Tensor.from_data(...))"
    )


def _float_expected(input, name, target: str = "float32") -> str:
    return (
        f"expected a float tensor, got {input.dtype} ({name} dims {list(input.shape)}); "
        f"convert the {name} with {name}.cast(\"{target}\")"
    )


def _dtype_mismatch(owner, input, param, name, param_name) -> None:
    found, wanted = array(input).dtype, array(param).dtype
    if found == wanted:  # an equal dtype object that is not the same instance
        return
    if found.kind != "f" and wanted.kind == "f":
        raise DTypeError(f"{_owner_name(owner)}: {_float_expected(input, name, str(param.dtype))}")
    raise DTypeError(
        f"{_owner_name(owner)}: {name} dtype {input.dtype} does not match the {param_name}'s {param.dtype} "
        f"({name} dims {list(input.shape)}); convert the {name} with {name}.cast(\"{param.dtype}\"), or build the module "
        f"in {input.dtype} (set the device's default float dtype with "
        f"device.set_default_float_dtype(\"{input.dtype}\") before init)"
    )
