"""Folding: the nodes whose inputs are constant computed at import, each sized before it is computed."""
from __future__ import annotations

import math

import numpy as np

from ...design.primitive import OpError, constants_text, einsum_sizes, fold, parse_einsum
from ...design.shape_rules import op_shape
from ...shapes.rules import RuleError, Shape
from .common import (INT_BOUND, KIND_OF_DTYPE, MAX_FOLD_BYTES, MAX_FOLD_ELEMENTS, MAX_FOLD_WORK, MAX_SHAPE_ENTRIES,
                     TO_DTYPE, Unsupported, bytes_text, dims_text, node_attrs)
from .reading import normalize_array, tensor_array


def fold_work(op: str, attrs: dict, operands: list, dims: list) -> tuple:
    """(elements of the largest scratch array, multiply-adds) a fold takes beyond making its output, where the
    engine's implementation takes more than a pass over its operands: products and CumSum's triangle."""
    out = math.prod(dims)
    if op in ("MatMul", "Gemm"):
        a = operands[0]
        inner = a.shape[-1] if a.ndim else 1
        if op == "Gemm" and attrs.get("trans_a") and a.ndim == 2:
            inner = a.shape[0]
        return 0, out * int(inner)
    if op == "Einsum":
        parts = [a for a in operands if a is not None]
        terms, letters = parse_einsum(attrs.get("mode", ""))
        sizes = einsum_sizes(terms, [a.shape for a in parts], attrs.get("mode"))
        # each operand summed over the letters only it has (an empty one's sum is as large as its other axes)
        scratch = max(math.prod(int(sizes[c]) for c in t if c in letters or sum(c in u for u in terms) > 1)
                      for t in terms)
        if len(terms) == 2:  # the product runs over the output's letters and the ones both operands share
            letters = set(letters) | (set(terms[0]) & set(terms[1]))
        return scratch, math.prod(int(sizes[c]) for c in set(letters))
    if op.startswith("Reduce"):  # one axis at a time: reducing an empty axis makes the others' product
        dims_now = list(operands[0].shape)
        rank = len(dims_now)
        axes = range(rank) if attrs.get("axes") is None else {a + rank if a < 0 else a for a in attrs["axes"]}
        scratch = 0
        for a in sorted(axes, reverse=True):
            dims_now[a] = 1
            scratch = max(scratch, math.prod(dims_now))
        return scratch, 0
    if op == "ScatterND":  # a mask of the rows the indices can name
        data, idx = operands[0], operands[1]
        q = int(idx.shape[-1]) if idx.ndim else 0
        return math.prod(data.shape[:q]), 0
    if op == "CumSum":  # a product with an n x n triangle along the axis
        x = operands[0]
        axis = int(attrs["axis"])
        n = int(x.shape[axis + x.ndim if axis < 0 else axis]) if x.ndim else 1
        return n * n, out * n
    return 0, 0


class Folding:
    """Constant folding and primitive Op nodes (a part of `importer.Importer`)."""

    def _fold(self, node, name: str):
        at = node_attrs(node)
        op = node.op_type
        if op == "Constant":
            if "value" not in at:
                raise Unsupported("a Constant without a tensor 'value'")
            t = [a for a in node.attribute if a.name == "value"][0].t
            self.consts[node.output[0]] = tensor_array(t, self.where, self.folder, node.output[0])
            self.file_bytes += self.consts[node.output[0]].nbytes
            self.report.mapping[name] = "a constant"
            return
        arrays = [self.consts[v] if v else None for v in node.input]
        if not arrays or arrays[0] is None:
            self.fail(f"node {name!r} ({op}): its first input is missing (expected a tensor)")
        attrs = self._op_attrs(node, at, fold=True)
        if op == "ConstantOfShape" and "value" in at:
            attrs["value"] = tensor_array(at["value"], self.where, self.folder, "value")
        operands = [a for a, v in zip(arrays, node.input) if v not in self._attr_inputs(node)]
        outputs = [(node.output[0], attrs)]
        if op == "TopK":  # values and indices, each where it is read
            outputs = [(o, {**attrs, "mode": attrs["mode"] + what}) for o, what in zip(node.output, ("values", "indices"))
                       if o and (o in self.consumed or o in self.outputs)]
        for value, settings in outputs:
            nbytes = self._fold_size(name, op, settings, operands)
            try:
                out = fold(op, settings, operands)
            except (OpError, ValueError, TypeError, IndexError) as e:
                self.fail(f"node {name!r} ({op}): its constant operands do not fit: {e}")
            out = normalize_array(np.asarray(out))
            self.consts[value] = out
            self.folded_bytes += max(out.size * out.itemsize, nbytes)
        self.report.mapping[name] = "folded into a constant"

    def _fold_size(self, name: str, op: str, attrs: dict, operands: list) -> int:
        """The bytes a fold will make, from its operands' dims and the op's settings (nothing is computed):
        `Unsupported` saying the size and the limit when the value, a scratch array or the product's work
        passes `MAX_FOLD_ELEMENTS` / `MAX_FOLD_WORK`, or the folded values together `MAX_FOLD_BYTES` (or
        twice the file's own tensors where that is more)."""
        itemsize = {"float": 4, "int": 8, "bool": 1}
        scratch, work = 0, 0
        if op == "ConstantOfShape":
            if operands[0].dtype.kind not in "iu" or operands[0].ndim > 1 or operands[0].size > MAX_SHAPE_ENTRIES:
                raise Unsupported(f"a shape of {operands[0].dtype} dims {list(operands[0].shape)} (expected at most "
                                   f"{MAX_SHAPE_ENTRIES} integer sizes)")
            dims = [int(v) for v in operands[0].reshape(-1)]
            if any(d < 0 for d in dims):
                raise Unsupported(f"a negative size in its shape {dims_text(dims)}")
            value = attrs.get("value")
            kind = KIND_OF_DTYPE.get(np.dtype(np.float32 if value is None else value.dtype).kind, "int")
        elif op == "Range":
            if len(operands) != 3 or any(a is None or a.size != 1 for a in operands):
                raise Unsupported("a Range of other than three scalars (start, limit, delta)")
            s, lim, d = (float(a.reshape(())) for a in operands)
            n = (lim - s) / d if d else math.nan
            if math.isnan(n):
                raise Unsupported(f"Range({s}, {lim}, {d}): expected finite scalars and a delta other than 0")
            if n > MAX_FOLD_ELEMENTS:
                raise Unsupported(f"Range({s}, {lim}, {d}) would make {n:,.0f} elements (at most "
                                   f"{MAX_FOLD_ELEMENTS:,} in a folded constant)")
            dims = [max(math.ceil(n), 0)]
            kind = KIND_OF_DTYPE.get(operands[0].dtype.kind, "int")
        else:
            try:
                shapes = [None if a is None else Shape(a.shape, KIND_OF_DTYPE.get(a.dtype.kind, "int"))
                          for a in operands]
                out = op_shape(op, attrs, shapes)
                dims = [d.value() for d in out.dims]
                kind = out.dtype
                scratch, work = fold_work(op, attrs, operands, dims)
            except (RuleError, OpError, ValueError, TypeError, IndexError, KeyError) as e:
                self.fail(f"node {name!r} ({op}): its constant operands do not fit: {e}")
        n = math.prod(dims)
        nbytes = n * itemsize[kind]
        if n > MAX_FOLD_ELEMENTS:
            raise Unsupported(f"folding it would make dims {dims_text(dims)}: {n:,} elements ({bytes_text(nbytes)}"
                               f"); at most {MAX_FOLD_ELEMENTS:,} elements in a folded constant")
        axis = max([int(d) for a in operands if a is not None for d in a.shape] + list(dims) + [0])
        if axis > MAX_FOLD_ELEMENTS:  # empty arrays too: NumPy makes index arrays along an axis (TopK's gather)
            raise Unsupported(f"folding it would take an axis of {axis:,} (operands of dims "
                               f"{', '.join(dims_text(a.shape) for a in operands if a is not None)[:200]}, result "
                               f"{dims_text(dims)}); at most {MAX_FOLD_ELEMENTS:,} in a folded constant")
        if scratch > MAX_FOLD_ELEMENTS:
            raise Unsupported(f"folding it would need a scratch array of {scratch:,} elements (at most "
                               f"{MAX_FOLD_ELEMENTS:,})")
        if work > MAX_FOLD_WORK:
            raise Unsupported(f"folding it would take {work:,} multiply-adds (at most {MAX_FOLD_WORK:,} for a "
                               f"folded product)")
        budget = max(MAX_FOLD_BYTES, 2 * self.file_bytes)
        if self.folded_bytes + nbytes > budget:
            raise Unsupported(f"folding it would make {bytes_text(nbytes)} more, {bytes_text(self.folded_bytes)} "
                               f"of constants being folded already (at most {bytes_text(budget)} in all: "
                               f"{bytes_text(MAX_FOLD_BYTES)}, or twice the file's own tensors)")
        return nbytes

    def _attr_inputs(self, node) -> set:
        """The inputs this op reads as settings (a Reshape's shape, a Slice's starts...)."""
        pos = {"Reshape": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4),
               "Pad": (1, 2, 3), "Tile": (1,), "Trilu": (1,), "TopK": (1,), "CumSum": (1,),
               "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
               "ReduceLogSumExp": (1,)}.get(node.op_type, ())
        return {node.input[p] for p in pos if p < len(node.input) and node.input[p]}

    def ints(self, node, pos: int, what: str):
        if pos >= len(node.input) or not node.input[pos]:
            return None
        a = self.const(node.input[pos], node.name, what)
        if a.dtype.kind not in "iu":
            raise Unsupported(f"its {what} must be integers, found {a.dtype}")
        if a.size > 1024:
            raise Unsupported(f"its {what} has {a.size} values (at most 1024)")
        return [int(max(min(v, INT_BOUND), -INT_BOUND)) for v in a.reshape(-1)]

    def _op_attrs(self, node, at: dict, fold: bool = False) -> dict:
        op = node.op_type
        attrs = {"axis": 0, "axes": None, "perm": None, "keepdims": True, "starts": None, "ends": None, "steps": None,
                 "shape": None, "alpha": 1.0, "beta": 1.0, "to": "float32", "trans_a": False, "trans_b": False,
                 "mode": ""}
        if op in ("ArgMax", "ArgMin"):
            if at.get("select_last_index", 0):
                raise Unsupported("select_last_index=1 (the first index of ties is computed)")
            attrs["keepdims"] = bool(at.get("keepdims", 1))
        if op in ("Concat", "Gather", "Flatten", "GatherElements", "ArgMax", "ArgMin"):
            attrs["axis"] = int(at.get("axis", 1 if op == "Flatten" else 0))
        if op in ("Softmax", "LogSoftmax"):
            attrs["axis"] = int(at.get("axis", -1))
        if op == "Transpose" and "perm" in at:
            attrs["perm"] = [int(v) for v in at["perm"]]
        if op in ("Reshape", "Expand") and len(node.input) > 1 and node.input[1] in self.sym:
            attrs["shape"], attrs["_ref"] = self._runtime_target(node, 1)
        elif op == "Reshape":
            attrs["shape"] = self.ints(node, 1, "target shape")
            if attrs["shape"] is None:
                raise Unsupported("a Reshape without a shape")
            if at.get("allowzero", 0) and 0 in attrs["shape"]:
                raise Unsupported("a Reshape to an empty axis (allowzero with 0)")
        if op in ("Unsqueeze", "Squeeze"):
            attrs["axes"] = self.ints(node, 1, "axes") if "axes" not in at else [int(v) for v in at["axes"]]
            if op == "Unsqueeze" and attrs["axes"] is None:
                raise Unsupported("an Unsqueeze without axes")
        if op == "Expand" and "_ref" not in attrs:
            attrs["shape"] = self.ints(node, 1, "target shape")
            if attrs["shape"] is None or any(s < 0 for s in attrs["shape"]):
                raise Unsupported("an Expand without a shape of sizes >= 0")
        if op == "Slice":
            attrs["starts"] = self.ints(node, 1, "starts")
            if len(node.input) > 2 and node.input[2] in self.sym and not fold:
                attrs["ends"], attrs["shape"], attrs["_ref"] = self.runtime_ends(node)
            else:
                attrs["ends"] = self.ints(node, 2, "ends")
            attrs["axes"] = self.ints(node, 3, "axes")
            attrs["steps"] = self.ints(node, 4, "steps")
            if attrs["starts"] is None or attrs["ends"] is None:
                raise Unsupported("a Slice without starts and ends")
            n = len(attrs["starts"])
            if len(attrs["ends"]) != n or (attrs["axes"] is not None and len(attrs["axes"]) != n) or \
                    (attrs["steps"] is not None and len(attrs["steps"]) != n):
                raise Unsupported("starts, ends, axes and steps of different lengths")
            if attrs["steps"] is not None and 0 in attrs["steps"]:
                raise Unsupported("a Slice step of 0")
        if op.startswith("Reduce"):
            axes = [int(v) for v in at["axes"]] if "axes" in at else self.ints(node, 1, "axes")
            if not axes:
                axes = [] if at.get("noop_with_empty_axes", 0) else None
            attrs["axes"] = axes
            attrs["keepdims"] = bool(at.get("keepdims", 1))
        if op == "Cast":
            to = int(at.get("to", 1))
            if to not in TO_DTYPE:
                raise Unsupported(f"a Cast to the element type {to}")
            attrs["to"] = TO_DTYPE[to]
        if op == "Pad":
            pads = self.ints(node, 1, "pads")
            mode = at.get("mode", b"constant")
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            if mode not in ("constant", "reflect", "edge"):
                raise Unsupported(f"mode {mode!r} (constant, reflect and edge are imported)")
            if pads is None or len(pads) % 2:
                raise Unsupported("a Pad without an even number of pads")
            if any(p < 0 for p in pads):
                raise Unsupported(f"negative pads {pads} (cropping)")
            n = len(pads) // 2
            attrs.update(starts=pads[:n], ends=pads[n:], mode=mode, axes=self.ints(node, 3, "axes"))
            if len(node.input) > 2 and node.input[2]:
                v = self.scalar(node.input[2]) if node.input[2] in self.consts else None
                if v is None:
                    raise Unsupported("its constant_value is computed at run time or is not a scalar")
                attrs["alpha"] = v
        if op == "ScatterND":
            red = at.get("reduction", b"none")
            red = red.decode() if isinstance(red, bytes) else str(red)
            if red not in ("none", "add"):
                raise Unsupported(f"reduction {red!r} (none and add are imported)")
            attrs["mode"] = "" if red == "none" else red
        if op == "CumSum":
            ax = self.ints(node, 1, "axis")
            if ax is None or len(ax) != 1:
                raise Unsupported("its axis is not one constant")
            attrs.update(axis=ax[0], trans_a=bool(at.get("exclusive", 0)), trans_b=bool(at.get("reverse", 0)))
        if op == "Shrink":
            attrs.update(alpha=float(at.get("lambd", 0.5)), beta=float(at.get("bias", 0.0)))
        if op == "Einsum":
            from ...design.primitive import parse_einsum  # noqa: PLC0415

            eq = at.get("equation", b"")
            eq = eq.decode() if isinstance(eq, bytes) else str(eq)
            try:
                parse_einsum(eq)
            except OpError as e:
                raise Unsupported(str(e)) from None
            attrs["mode"] = eq.replace(" ", "")
        if op == "Tile":
            attrs["shape"] = self.ints(node, 1, "repeats")
            if attrs["shape"] is None:
                raise Unsupported("a Tile without repeats")
        if op == "TopK":  # folded here (else one Op node an output, _op_TopK): k, the axis, which end
            k = self.ints(node, 1, "k")
            if k is None or len(k) != 1 or k[0] < 0:
                raise Unsupported("a k that is not one constant >= 0")
            attrs.update(shape=k, axis=int(at.get("axis", -1)), mode="" if at.get("largest", 1) else "smallest_")
        if op == "Trilu":
            k = self.ints(node, 1, "k")
            attrs["axis"] = 0 if not k else k[0]
            attrs["mode"] = "upper" if at.get("upper", 1) else "lower"
        if op == "Gemm":
            attrs.update(alpha=float(at.get("alpha", 1.0)), beta=float(at.get("beta", 1.0)),
                         trans_a=bool(at.get("transA", 0)), trans_b=bool(at.get("transB", 0)))
        return attrs

    def _primitive(self, node, name: str) -> str:
        op = node.op_type
        at = node_attrs(node)
        attrs = self._op_attrs(node, at)
        if op.startswith("Reduce") and attrs["axes"] == []:
            attrs["axes"] = None
            op_ = "Identity"
        else:
            op_ = op
        skip = self._attr_inputs(node)
        operands, inputs, consts = [], [], []
        for v in node.input:
            if v in skip:
                continue
            if not v:
                operands.append("")
            elif v in self.consts:
                operands.append(f"c{len(consts)}")
                consts.append(self.consts[v])
            else:
                operands.append(f"in{len(inputs)}")
                inputs.append(v)
        while operands and operands[-1] == "":
            operands.pop()
        ref = attrs.pop("_ref", None)
        if ref is not None:
            operands.append(f"in{len(inputs)}")
            inputs.append(ref)
        if len(consts) > 64:
            raise Unsupported("more than 64 constant operands")
        config = {k: v for k, v in attrs.items() if v is not None and not (k == "mode" and v == "")}
        config.update(op=op_, inputs=len(inputs), operands=",".join(operands), constants=constants_text(consts))
        return self.add("Op", name, op, config, inputs, node.output[0],
                        {f"c{k}": a for k, a in enumerate(consts)})

    # ------------------------------------------------------------------ layers
