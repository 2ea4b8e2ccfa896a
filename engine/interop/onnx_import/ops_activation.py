"""Elementwise: the activation layers (each declares the ONNX ops it imports from, engine.nn.spec), Dropout,
and an Add of two computed tensors."""
from __future__ import annotations

from functools import partial

from ...nn.spec import layer_specs
from .common import Unsupported, node_attrs
from .registry import handles


def _layer_op(layers, imp, node, name):
    """An op a layer declares (`declare(Cls, onnx={op: config or attrs -> config})`): the first that takes the
    node's attributes makes one layer node."""
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in node_attrs(node).items()}
    for cls, mapping in layers:
        config = mapping(attrs) if callable(mapping) else dict(mapping)
        if config is not None:
            return imp.add(cls.__name__, name, node.op_type, config, [node.input[0]], node.output[0])
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(attrs.items()))
    raise Unsupported(f"{shown} (no layer takes these attributes: {', '.join(c.__name__ for c, _ in layers)})")


def _register_layer_ops() -> None:
    by_op: dict = {}
    for cls, spec in layer_specs().items():
        for op, mapping in spec.onnx.items():
            by_op.setdefault(op, []).append((cls, mapping))
    for op, layers in by_op.items():
        handles(op)(partial(_layer_op, layers))


_register_layer_ops()


@handles("Dropout")
def dropout(imp, node, name):
    ratio = 0.5
    if len(node.input) > 1 and node.input[1]:
        r = imp.scalar(node.input[1])
        if r is None:
            raise Unsupported("its ratio is computed at run time")
        ratio = r
    if not 0.0 <= ratio < 1.0:
        raise Unsupported(f"ratio {ratio} (expected 0 <= ratio < 1)")
    return imp.add("Dropout", name, "Dropout", {"prob": float(ratio)}, [node.input[0]], node.output[0])


@handles("Add")
def add(imp, node, name):
    a, b = node.input[0], node.input[1]
    if a in imp.consts or b in imp.consts:
        return None
    da, db = imp.info.get(a), imp.info.get(b)
    if not da or not db or da[1] is None or da[1] != db[1] or da[0] != db[0] or any(d is None for d in da[1]):
        return None
    return imp.add("Add", name, "Add", {"inputs": 2}, [a, b], node.output[0])
