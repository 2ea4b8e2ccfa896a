"""Elementwise: the activations, Dropout, and an Add of two computed tensors."""
from __future__ import annotations




from .registry import handles
from .common import Unsupported, node_attrs


def activation(imp, node, name, kind, cfg=None):
    return imp.add(kind, name, node.op_type, cfg or {}, [node.input[0]], node.output[0])


@handles("Relu")
def relu(imp, node, name):
    return activation(imp, node, name, "Relu")


@handles("Sigmoid")
def sigmoid(imp, node, name):
    return activation(imp, node, name, "Sigmoid")


@handles("Tanh")
def tanh(imp, node, name):
    return activation(imp, node, name, "Tanh")


@handles("Softsign")
def softsign(imp, node, name):
    return activation(imp, node, name, "Softsign")


@handles("HardSwish")
def hard_swish(imp, node, name):
    return activation(imp, node, name, "HardSwish")


@handles("Mish")
def mish(imp, node, name):
    return activation(imp, node, name, "Mish")


@handles("Gelu")
def gelu(imp, node, name):
    approx = node_attrs(node).get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    if approx != "none":
        raise Unsupported(f"approximate={approx!r} (the exact form is imported)")
    return activation(imp, node, name, "Gelu")


@handles("LeakyRelu")
def leaky_relu(imp, node, name):
    return activation(imp, node, name, "LeakyRelu", {"negative_slope": float(node_attrs(node).get("alpha", 0.01))})


@handles("Elu")
def elu(imp, node, name):
    return activation(imp, node, name, "Elu", {"alpha": float(node_attrs(node).get("alpha", 1.0))})


@handles("Celu")
def celu(imp, node, name):
    return activation(imp, node, name, "Celu", {"alpha": float(node_attrs(node).get("alpha", 1.0))})


@handles("HardSigmoid")
def hard_sigmoid(imp, node, name):
    at = node_attrs(node)
    return activation(imp, node, name, "HardSigmoid", {"alpha": float(at.get("alpha", 0.2)),
                                                        "beta": float(at.get("beta", 0.5))})


@handles("Softplus")
def softplus(imp, node, name):
    return activation(imp, node, name, "Softplus")


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
