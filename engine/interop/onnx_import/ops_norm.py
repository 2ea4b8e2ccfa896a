"""Normalization: BatchNormalization, LayerNormalization (with constant scale and bias)."""
from __future__ import annotations


from .registry import handles
from .common import Unsupported, node_attrs


@handles("BatchNormalization")
def batch_normalization(imp, node, name):
    imp.one_output(node)
    at = node_attrs(node)
    if at.get("training_mode", 0):
        raise Unsupported("training_mode=1 (batch statistics in the graph)")
    scale, bias, mean, var = (imp.const(v, name, w) for v, w in
                              zip(node.input[1:5], ("scale", "bias", "mean", "variance")))
    c = scale.shape[0] if scale.ndim == 1 else -1
    if any(a.shape != (c,) for a in (scale, bias, mean, var)):
        raise Unsupported(f"scale / bias / mean / variance of dims {[list(a.shape) for a in (scale, bias, mean, var)]}"
                           f" (expected four [channels])")
    cfg = {"num_features": int(c), "epsilon": float(at.get("epsilon", 1e-5)),
           "momentum": float(1.0 - at.get("momentum", 0.9))}
    return imp.add("BatchNorm", name, "BatchNormalization", cfg, [node.input[0]], node.output[0],
                    {"gamma": scale, "beta": bias, "running_mean": mean, "running_var": var})


@handles("LayerNormalization")
def layer_normalization(imp, node, name):
    imp.one_output(node)
    at = node_attrs(node)
    dims = imp.dims_of(node.input[0])
    axis = int(at.get("axis", -1))
    if axis != -1 and not (dims and axis == len(dims) - 1):
        raise Unsupported(f"axis {axis} (Ember's LayerNorm normalizes the last axis)")
    scale = imp.const(node.input[1], name, "scale")
    b = imp.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scale.ndim != 1 or (b is not None and b.shape != scale.shape):
        raise Unsupported(f"scale / bias of dims {list(scale.shape)} / {None if b is None else list(b.shape)}")
    cfg = {"d_model": int(scale.shape[0]), "epsilon": float(at.get("epsilon", 1e-5)), "bias": b is not None}
    params = {"gamma": scale} if b is None else {"gamma": scale, "beta": b}
    return imp.add("LayerNorm", name, "LayerNormalization", cfg, [node.input[0]], node.output[0], params)
