"""Element types: Burn's kinds (float, int, bool) and the concrete dtypes of each."""
from __future__ import annotations

import numpy as np


class DType:
    """A concrete element type. Compare with `==` against another DType, a name or a NumPy dtype."""

    __slots__ = ("name", "np", "kind", "itemsize")

    def __init__(self, name: str, np_dtype, kind: str):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.kind = kind
        self.itemsize = self.np.itemsize

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        if isinstance(other, DType):
            return self is other
        try:
            return self is as_dtype(other)
        except (TypeError, ValueError):
            return False

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


float64 = DType("float64", np.float64, "float")
float32 = DType("float32", np.float32, "float")
float16 = DType("float16", np.float16, "float")
int64 = DType("int64", np.int64, "int")
int32 = DType("int32", np.int32, "int")
int16 = DType("int16", np.int16, "int")
int8 = DType("int8", np.int8, "int")
uint64 = DType("uint64", np.uint64, "int")
uint32 = DType("uint32", np.uint32, "int")
uint16 = DType("uint16", np.uint16, "int")
uint8 = DType("uint8", np.uint8, "int")
bool_ = DType("bool", np.bool_, "bool")

ALL = (float64, float32, float16, int64, int32, int16, int8, uint64, uint32, uint16, uint8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"bool_": bool_, "f32": float32, "f64": float64, "f16": float16, "i64": int64, "i32": int32})
_BY_NP = {d.np: d for d in ALL}


def as_dtype(x) -> DType:
    """Turn a DType, a name ("float32") or a NumPy dtype into a DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        try:
            return _BY_NAME[x]
        except KeyError:
            raise ValueError(f"unknown dtype {x!r}: expected one of {sorted(d.name for d in ALL)}") from None
    if x is bool:
        return bool_
    if x is int:
        return int64
    if x is float:
        return float32
    try:
        return _BY_NP[np.dtype(x)]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported dtype {x!r}: expected one of {sorted(d.name for d in ALL)}") from None


def from_np(np_dtype) -> DType:
    return _BY_NP[np.dtype(np_dtype)]


def default_int() -> DType:
    return int64
