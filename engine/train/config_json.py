"""Config dataclasses (optimizer, schedule and training configs, nested ones too) as plain
JSON-able data and back: what a run folder's `run.json` and the settings forms use.

    data = to_dict(optim.SgdConfig(gradient_clipping=optim.GradientClippingConfig.norm(1.0)))
    back = from_dict(optim.SgdConfig, data, {"gradient_clipping": optim.GradientClippingConfig | None})
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any


def unwrap_optional(tp) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed). In a union of several types the first
    dataclass wins, else the first of int / float / str."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        for a in rest:
            if dataclasses.is_dataclass(a):
                return a, optional
        for want in (float, int, str, bool):
            if want in rest:
                return want, optional
        return (rest[0] if rest else Any), optional
    return tp, False


def to_dict(value) -> Any:
    """A dataclass (nested ones too) as plain JSON-able data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (list, tuple)):
        return [to_dict(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.name
    return value


def from_dict(cls, data: dict, types_: dict | None = None) -> Any:
    """Rebuild `cls` from `to_dict`'s output, nested dataclasses included (by annotation, or
    by `types_`, field name -> type, for fields annotated loosely such as `object`)."""
    hints = dict(typing.get_type_hints(cls))
    hints.update(types_ or {})
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in data:
            continue
        v = data[f.name]
        base, _ = unwrap_optional(hints.get(f.name, Any))
        if isinstance(v, dict) and dataclasses.is_dataclass(base):
            v = from_dict(base, v)
        kwargs[f.name] = v
    return cls(**kwargs)
