"""Convolutions and pools: Conv, ConvTranspose, MaxPool, AveragePool, GlobalAveragePool."""
from __future__ import annotations


from .registry import handles
from .common import Unsupported, node_attrs


def _padding(at: dict, n: int, kernel, strides, dilations):
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto == "VALID":
        return "Valid"
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if all(s == 1 for s in strides) and all(((k - 1) * d) % 2 == 0 for k, d in zip(kernel, dilations)):
            half = [((k - 1) * d) // 2 for k, d in zip(kernel, dilations)]
            return half + half
        raise Unsupported(f"auto_pad {auto} with strides {list(strides)} (its padding depends on the input size)")
    pads = [int(p) for p in at.get("pads", [0] * (2 * n))]
    if len(pads) != 2 * n or any(p < 0 for p in pads):
        raise Unsupported(f"pads {pads} (expected {2 * n} values >= 0)")
    return "Valid" if not any(pads) else pads


@handles("Conv")
def conv(imp, node, name):
    imp.one_output(node)
    at = node_attrs(node)
    w = imp.const(node.input[1], name, "weight")
    b = imp.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and b is None:
        raise Unsupported("its bias is computed at run time")
    n = w.ndim - 2
    if n not in (1, 2, 3):
        raise Unsupported(f"a weight of dims {list(w.shape)} (expected a 1-, 2- or 3-d convolution)")
    groups = int(at.get("group", 1))
    kernel = [int(k) for k in w.shape[2:]]
    if "kernel_shape" in at and [int(k) for k in at["kernel_shape"]] != kernel:
        raise Unsupported(f"kernel_shape {list(at['kernel_shape'])} differs from the weight's {kernel}")
    strides = [int(s) for s in at.get("strides", [1] * n)]
    dil = [int(d) for d in at.get("dilations", [1] * n)]
    if len(strides) != n or len(dil) != n or min(strides + dil) < 1:
        raise Unsupported(f"strides {strides} / dilations {dil} (expected {n} values >= 1)")
    padding = _padding(at, n, kernel, strides, dil)
    c_in, c_out = int(w.shape[1]) * groups, int(w.shape[0])
    if b is not None and b.shape != (c_out,):
        raise Unsupported(f"a bias of dims {list(b.shape)} (expected [{c_out}])")
    if n == 1:
        cfg = {"channels_in": c_in, "channels_out": c_out, "kernel_size": kernel[0], "stride": strides[0],
               "dilation": dil[0], "groups": groups, "padding": padding, "bias": b is not None}
    else:
        cfg = {"channels": [c_in, c_out], "kernel_size": kernel, "stride": strides, "dilation": dil,
               "groups": groups, "padding": padding, "bias": b is not None}
    params = {"weight": w} if b is None else {"weight": w, "bias": b}
    return imp.add(f"Conv{n}d", name, "Conv", cfg, [node.input[0]], node.output[0], params)


@handles("ConvTranspose")
def conv_transpose(imp, node, name):
    at = node_attrs(node)
    w = imp.const(node.input[1], name, "weight")
    b = imp.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    n = w.ndim - 2
    if n not in (1, 2, 3):
        raise Unsupported(f"a weight of dims {list(w.shape)}")
    if "output_shape" in at:
        raise Unsupported("output_shape (the padding would depend on the input size)")
    auto = at.get("auto_pad", b"NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) not in ("NOTSET", "VALID"):
        raise Unsupported(f"auto_pad {auto}")
    groups = int(at.get("group", 1))
    kernel = [int(k) for k in w.shape[2:]]
    strides = [int(s) for s in at.get("strides", [1] * n)]
    dil = [int(d) for d in at.get("dilations", [1] * n)]
    pads = [int(p) for p in at.get("pads", [0] * (2 * n))]
    out_pad = [int(p) for p in at.get("output_padding", [0] * n)]
    if len(pads) != 2 * n or pads[:n] != pads[n:]:
        raise Unsupported(f"asymmetric pads {pads}")
    cfg = {"channels": [int(w.shape[0]), int(w.shape[1]) * groups], "groups": groups, "bias": b is not None}
    if n == 1:
        cfg.update(kernel_size=kernel[0], stride=strides[0], dilation=dil[0], padding=pads[0],
                   padding_out=out_pad[0])
    else:
        cfg.update(kernel_size=kernel, stride=strides, dilation=dil, padding=pads[:n], padding_out=out_pad)
    params = {"weight": w} if b is None else {"weight": w, "bias": b}
    return imp.add(f"ConvTranspose{n}d", name, "ConvTranspose", cfg, [node.input[0]], node.output[0], params)


def pool_common(imp, node, name, kind: str):
    imp.one_output(node)
    at = node_attrs(node)
    kernel = [int(k) for k in at.get("kernel_shape", [])]
    n = len(kernel)
    if n not in (1, 2):
        raise Unsupported(f"a kernel of {n} dims (1 or 2 are imported)")
    strides = [int(s) for s in at.get("strides", [1] * n)]
    dil = [int(d) for d in at.get("dilations", [1] * n)]
    if len(strides) != n or len(dil) != n or min(kernel + strides + dil) < 1:
        raise Unsupported(f"kernel {kernel}, strides {strides}, dilations {dil}")
    padding = _padding(at, n, kernel, strides, dil)
    ceil = bool(at.get("ceil_mode", 0))
    return at, kernel, strides, dil, padding, ceil, n


@handles("MaxPool")
def max_pool(imp, node, name):
    at, kernel, strides, dil, padding, ceil, n = pool_common(imp, node, name, "MaxPool")
    if at.get("storage_order", 0):
        raise Unsupported("storage_order 1")
    if n == 1:
        cfg = {"kernel_size": kernel[0], "stride": strides[0], "padding": padding, "dilation": dil[0],
               "ceil_mode": ceil}
    else:
        cfg = {"kernel_size": kernel, "strides": strides, "padding": padding, "dilation": dil, "ceil_mode": ceil}
    return imp.add(f"MaxPool{n}d", name, "MaxPool", cfg, [node.input[0]], node.output[0])


@handles("AveragePool")
def average_pool(imp, node, name):
    at, kernel, strides, dil, padding, ceil, n = pool_common(imp, node, name, "AveragePool")
    if any(d != 1 for d in dil):
        raise Unsupported(f"dilations {dil}")
    inc = bool(at.get("count_include_pad", 0))
    if n == 1:
        cfg = {"kernel_size": kernel[0], "stride": strides[0], "padding": padding, "count_include_pad": inc,
               "ceil_mode": ceil}
    else:
        cfg = {"kernel_size": kernel, "strides": strides, "padding": padding, "count_include_pad": inc,
               "ceil_mode": ceil}
    return imp.add(f"AvgPool{n}d", name, "AveragePool", cfg, [node.input[0]], node.output[0])


@handles("GlobalAveragePool")
def global_average_pool(imp, node, name):
    dims = imp.dims_of(node.input[0])
    if dims is None or len(dims) not in (3, 4):
        raise Unsupported(f"an input of dims {dims} (expected rank 3 or 4)")
    if len(dims) == 4:
        return imp.add("AdaptiveAvgPool2d", name, "GlobalAveragePool", {"output_size": [1, 1]},
                        [node.input[0]], node.output[0])
    return imp.add("AdaptiveAvgPool1d", name, "GlobalAveragePool", {"output_size": 1}, [node.input[0]],
                    node.output[0])
