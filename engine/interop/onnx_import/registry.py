"""The ONNX op types the import maps to layers: one handler per op type, registered by the module of its family.

A handler is `handler(importer, node, name)`; it adds the design node(s) for `node` and returns the name
of the node it made, returns None to leave the node to the primitive `Op` kind (or to folding), or raises
`common.Unsupported(why)`. To import a new op type, write its handler in the module of its family
(`ops_activation`, `ops_conv_pool`, `ops_matmul`, `ops_norm`, `ops_shape`, or a new `ops_*.py` that
`importer.py` imports) under `@handles("OpType")`.
"""
from __future__ import annotations

from typing import Callable

HANDLERS: dict[str, Callable] = {}


def handles(*op_types: str):
    """Register the decorated function as the handler of these ONNX op types (one handler an op type)."""
    def deco(fn):
        for op in op_types:
            if op in HANDLERS:
                raise ValueError(f"ONNX op {op!r} has two handlers: {HANDLERS[op].__module__} and {fn.__module__}")
            HANDLERS[op] = fn
        return fn
    return deco
