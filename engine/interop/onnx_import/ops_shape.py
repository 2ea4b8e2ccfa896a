"""Shape ops: Flatten, Reshape, Concat, Split, TopK."""
from __future__ import annotations


from .registry import handles
from .common import Unsupported, node_attrs


@handles("Flatten")
def flatten(imp, node, name):
    if int(node_attrs(node).get("axis", 1)) != 1:
        return None
    dims = imp.dims_of(node.input[0])
    if dims is None or len(dims) < 2:
        return None
    return imp.add("Flatten", name, "Flatten", {"start_dim": 1, "end_dim": -1}, [node.input[0]], node.output[0])


@handles("TopK")
def top_k(imp, node, name):
    """TopK -> one Op node an output used (values, indices), k constant."""
    at = node_attrs(node)
    k = imp.ints(node, 1, "k")
    if k is None or len(k) != 1 or k[0] < 0:
        raise Unsupported("a k that is not one constant >= 0")
    prefix = "" if at.get("largest", 1) else "smallest_"
    made = None
    for out, what in zip(node.output, ("values", "indices")):
        if out and (out in imp.consumed or out in imp.outputs):
            config = {"op": "TopK", "inputs": 1, "operands": "in0", "constants": "", "axis": int(at.get("axis", -1)),
                      "shape": [k[0]], "mode": prefix + what}
            made = imp.add("Op", f"{name}_{what}", "TopK", config, [node.input[0]], out)
    return made


@handles("Split")
def split(imp, node, name):
    """Split -> one Slice Op node an output (the parts' sizes from `split` or `num_outputs`)."""
    x, at = node.input[0], node_attrs(node)
    dims = imp.dims_of(x)
    if dims is None:
        raise Unsupported("its input's rank is not known")
    axis = int(at.get("axis", 0))
    k = axis + len(dims) if axis < 0 else axis
    if not 0 <= k < len(dims):
        raise Unsupported(f"axis {axis} is out of range for dims {dims}")
    sizes = imp.ints(node, 1, "split")
    if sizes is None:
        size = dims[k]
        n = int(at.get("num_outputs", len(node.output)))
        if not isinstance(size, int):
            raise Unsupported(f"an even split of the named axis {size} (the parts' sizes are needed)")
        if n < 1 or n != len(node.output):
            raise Unsupported(f"num_outputs {n} for {len(node.output)} outputs")
        part = -(-size // n)
        sizes = [min(part, max(size - part * j, 0)) for j in range(n)]
    if len(sizes) != len(node.output) or any(v < 0 for v in sizes):
        raise Unsupported(f"split sizes {sizes} for {len(node.output)} outputs")
    if isinstance(dims[k], int) and sum(sizes) != dims[k]:
        raise Unsupported(f"split sizes {sizes} do not add up to axis {k} of dims {dims}")
    made, start = None, 0
    for j, (out, size) in enumerate(zip(node.output, sizes)):
        if out and (out in imp.consumed or out in imp.outputs):
            config = {"op": "Slice", "inputs": 1, "operands": "in0", "constants": "", "starts": [start],
                      "ends": [start + size], "axes": [k], "steps": [1]}
            made = imp.add("Op", f"{name}_{j}", "Split", config, [x], out)
        start += size
    return made


@handles("Reshape")
def reshape(imp, node, name):
    if len(node.input) > 1 and node.input[1] in imp.sym:
        return None
    shape = imp.ints(node, 1, "target shape")
    if shape is None or not shape or any(s == 0 or s < -1 for s in shape) or shape.count(-1) > 1:
        return None
    return imp.add("Reshape", name, "Reshape", {"shape": shape}, [node.input[0]], node.output[0])


@handles("Concat")
def concat(imp, node, name):
    ins = [v for v in node.input if v]
    if len(ins) < 2 or any(v in imp.consts for v in ins):
        return None
    return imp.add("Concat", name, "Concat", {"dim": int(node_attrs(node).get("axis", 0)), "inputs": len(ins)},
                    ins, node.output[0])
