"""Arrays a backward rule may compute again instead of keeping (issue 46).

A weight that is cheap to compute again and large to keep, such as a GGUF weight dequantized from
its blocks for one use, is marked with `recomputable(t, again)`: `again()` gives a fresh array equal
to `t`'s. A kernel whose backward rule would otherwise close over that array (the input gradient
of `x @ W` needs `W`) asks `recompute_of(arr)` and, given a function, keeps the function instead:
the rule computes the array again when the backward reaches it, and the forward's copy is freed
as soon as the forward is done with it. A view of a marked array at its start (a transpose) is
computed again as the same view of the fresh array.

The mark lives as long as the array does (a weak reference), never in the tensor.
"""
from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

from .tensor import Tensor

__all__ = ["recomputable", "recompute_of"]

_again: dict[int, tuple[weakref.ref, Callable]] = {}


def _owner(data):
    """The array that owns `data`'s memory (NumPy: `base` is always the owner), or `data` itself."""
    base = getattr(data, "base", None) if isinstance(data, np.ndarray) else None
    return data if base is None else base


def _start(a) -> int:
    return a.__array_interface__["data"][0]


def recomputable(t: Tensor, again: Callable) -> Tensor:
    """`t`, its array marked as one `again()` gives afresh (an array equal to it, laid out as it is,
    a view of a fresh array where `t`'s is a view). Returns `t`."""
    owner = _owner(t._data)
    if isinstance(owner, np.ndarray) and not owner.flags.c_contiguous:
        return t
    key = id(owner)
    try:
        ref = weakref.ref(owner, lambda _r, key=key: _again.pop(key, None))
    except TypeError:  # an array type without weak references: kept as any other
        return t
    _again[key] = (ref, again)
    return t


def recompute_of(data) -> Callable | None:
    """A function giving `data` afresh when its array (or the array it is a view of, from its
    start: a reshape, a transpose) was marked `recomputable`; None otherwise (keep the array)."""
    owner = _owner(data)
    entry = _again.get(id(owner))
    if entry is None or entry[0]() is not owner:
        return None
    again = entry[1]
    if not isinstance(data, np.ndarray):
        return again  # a device array: marked itself (views of it are kept as any other)
    if _start(data) != _start(owner):
        return None
    shape, strides = data.shape, data.strides

    def fresh():
        whole = _owner(again())
        return np.lib.stride_tricks.as_strided(whole, shape, strides, writeable=False)
    return fresh
