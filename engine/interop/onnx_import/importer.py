"""The importer: walks the graph in order, asks the registered handler of each node's op type
(`registry.HANDLERS`, filled by the family modules) and folds what is constant."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...store.burnpack import TensorEntry
from ...store.record import ModuleRecord
from ...design.catalog import snake_name
from ...design.fields import is_axis_name
from ...design.graph import Design, DesignError, check_node_name
from ...design.layout import auto_layout
from ...design.primitive import FOLD_ONLY_OPS, PRIMITIVE_OPS, constants_text
from ...design.shapes import analyze

from . import ops_activation, ops_conv_pool, ops_matmul, ops_norm, ops_shape  # noqa: F401 - they fill HANDLERS
from .folding import Folding
from .input_axes import relabel_sums
from .fusions import Fusions
from .registry import HANDLERS
from .common import (EINSUM_TEXT, ImportReport, ImportedOnnx, KIND_OF_ELEM, MAX_NODES, MAX_SHAPE_ENTRIES,
                     OnnxImportError, TO_DTYPE, UNSAFE_NAME, Unsupported, node_attrs)
from .reading import infer_shapes, light_model, tensor_array


class Importer(Folding, Fusions):
    def __init__(self, model, path: Path, where: str, opset: int):
        self.model = model
        self.g = model.graph
        self.path = path
        self.where = where
        self.folder = path.parent
        self.report = ImportReport(path=where, opset=opset, producer=(model.producer_name or "")[:60])
        self.design = Design("Model")
        self.entries: list = []
        self.consts: dict = {}
        self.src: dict = {}  # value name -> (design node, port)
        self.origin: dict = {}  # design node -> onnx node name
        self.info: dict = {}  # value name -> (elem_type, dims or None)
        self.done: set = set()
        self.sym: dict = {}  # value -> (entries, rank): a run-time shape, each entry an int or (value, axis)
        self.deferred: dict = {}  # value -> node index: made as Op nodes only when a consumer needs the tensor
        self.file_bytes = 0  # the bytes of the file's own tensors (initializers, Constant nodes)
        self.folded_bytes = 0  # the bytes of the constants folded so far

    # ------------------------------------------------------------------ helpers
    def fail(self, message: str):
        raise OnnxImportError(f"{self.where}: {message}", self.report)

    def node_name(self, i: int, node) -> str:
        return node.name or f"#{i} ({node.op_type})"

    def dims_of(self, value: str):
        if value in self.consts:
            return list(self.consts[value].shape)
        got = self.info.get(value)
        return None if got is None else got[1]

    def design_name(self, onnx_name: str, op: str) -> str:
        stem = onnx_name if isinstance(onnx_name, str) else bytes(onnx_name).decode("utf-8", "replace")
        if stem.startswith("node_"):
            stem = stem[5:]
        stem = UNSAFE_NAME.sub("_", stem).strip("_").lower()
        if not stem or not stem[0].isalpha():
            stem = f"{op.lower()}_{stem}" if stem else op.lower()
        stem = stem[:60]
        try:
            check_node_name(stem)
        except DesignError:
            stem = f"n_{stem}"
        return self.design.unique_name(stem)

    def add(self, kind: str, onnx_name: str, op: str, config: dict, inputs: list, output: str | None,
            params: dict | None = None, ports: list | None = None) -> str:
        name = self.design_name(onnx_name, op)
        try:
            self.design.add_node(kind, name, config)
        except DesignError as e:
            raise Unsupported(f"its settings do not make a {kind}: {e}") from None
        ports = ports or list(self.design.input_ports(name))
        for value, port in zip(inputs, ports):
            s = self.src.get(value)
            if s is None:
                self.fail(f"node {onnx_name!r} ({op}): input {value!r} is not defined before it (expected a graph "
                          f"input, an initializer or an earlier node's output)")
            self.design.connect(s[0], s[1], name, port)
        for fname, arr in (params or {}).items():
            arr = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
            self.entries.append(TensorEntry.from_array(f"{name}.{fname}", arr))
        if output is not None:
            self.src[output] = (name, "output")
        self.origin[name] = onnx_name
        self.report.kinds[name] = kind
        return name

    def const(self, value: str, onnx_name: str, what: str) -> np.ndarray:
        if value not in self.consts:
            raise Unsupported(f"its {what} ({value!r}) is computed at run time; the importer needs it constant")
        return self.consts[value]

    def consumers(self, value: str) -> list:
        return self.consumed.get(value, [])

    def single(self, value: str):
        """The index of the one node reading `value` (None when several, none, or a graph output)."""
        c = self.consumers(value)
        if len(c) != 1 or value in self.outputs:
            return None
        return c[0]

    def scalar(self, value: str):
        a = self.consts.get(value)
        if a is None or a.size != 1:
            return None
        return float(a.reshape(()))

    # ------------------------------------------------------------------ run
    def run(self) -> ImportedOnnx:
        g = self.g
        if len(g.node) > MAX_NODES:
            self.fail(f"{len(g.node):,} nodes; a design holds at most {MAX_NODES:,}")
        self._before_inference()
        self._shape_info()
        for t in g.initializer:
            self.consts[t.name] = tensor_array(t, self.where, self.folder, "initializer")
            self.file_bytes += self.consts[t.name].nbytes
        self.outputs = {o.name for o in g.output}
        self.consumed: dict = {}
        for i, n in enumerate(g.node):
            for v in n.input:
                if v:
                    self.consumed.setdefault(v, []).append(i)
        self._inputs()
        relabel_sums(self, self.g.input)
        self._defined_check()
        for i, n in enumerate(g.node):  # the Constant nodes first: the patterns below read their values
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
                try:
                    self._fold(n, self.node_name(i, n))
                except Unsupported:
                    continue
                self.done.add(i)
        self.fusions = self._find_fusions()
        for i, node in enumerate(g.node):
            if i in self.done:
                continue
            name = self.node_name(i, node)
            try:
                self._node(i, node, name)
            except Unsupported as e:
                key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
                label = name if not e.why else f"{name}: {e.why}"
                self.report.unsupported.setdefault(key, []).append(label)
                self.report.mapping[name] = "unsupported" + (f": {e.why}" if e.why else "")
                for o in node.output:
                    self.src.setdefault(o, None)
        if self.report.unsupported:
            n = sum(len(v) for v in self.report.unsupported.values())
            self.fail(f"{n} node(s) the engine cannot import: {self.report.unsupported_text()}")
        self._outputs()
        analysis = analyze(self.design)
        if not analysis.ok:
            msgs = []
            for n, m in analysis.errors().items():
                msgs.append(f"node {self.origin.get(n, n)!r} (imported as {n}, {self.design.kind(n)}): {m}")
            msgs = msgs or analysis.messages()
            self.report.problems.extend(msgs)
            self.fail("the graph's dims do not fit: " + "; ".join(msgs[:10]))
        self._check_declared(analysis)
        auto_layout(self.design)
        return ImportedOnnx(self.design, ModuleRecord(self.entries), self.report)

    def _before_inference(self):
        """What onnx's shape inference does not survive: an Einsum equation with a character other than letters,
        ',', '.', '->' and spaces makes it loop for ever (onnx 1.x, two rank-2 operands: 'i;j->ij')."""
        for i, n in enumerate(self.g.node):
            if n.op_type == "Einsum" and n.domain in ("", "ai.onnx"):
                eq = node_attrs(n).get("equation", b"")
                eq = eq if isinstance(eq, bytes) else str(eq).encode("utf-8", "replace")
                if not EINSUM_TEXT.match(eq):
                    self.fail(f"node {self.node_name(i, n)!r} (Einsum): equation {eq[:80]!r} holds characters other "
                              f"than letters, ',', '...', '->' and spaces (expected an equation such as 'bij,bjk->bik')")

    def _shape_info(self):
        inferred = infer_shapes(light_model(self.model))
        if inferred is not None:
            values = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
        else:  # shape inference is a hint only; the design's own analysis decides
            values = list(self.g.value_info) + list(self.g.output) + list(self.g.input)
        for v in values:
            tt = v.type.tensor_type
            if not v.type.HasField("tensor_type"):
                continue
            dims = None
            if tt.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
            self.info[v.name] = (tt.elem_type, dims)

    def _inputs(self):
        names = set()
        for v in self.g.input:
            if v.name in self.consts:
                continue
            if not v.type.HasField("tensor_type"):
                self.fail(f"graph input {v.name!r}: expected a tensor, found another type")
            tt = v.type.tensor_type
            kind = KIND_OF_ELEM.get(tt.elem_type)
            if kind is None:
                self.fail(f"graph input {v.name!r}: element type {tt.elem_type} is not one the engine computes with")
            dims = []
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_value"):
                    self.fail(f"graph input {v.name!r}: axis {i} has size {d.dim_value} (expected a size >= 1 or a "
                              f"named axis)")
                else:
                    p = UNSAFE_NAME.sub("_", d.dim_param or "").strip("_")
                    dims.append(p if p and is_axis_name(p) else f"{UNSAFE_NAME.sub('_', v.name)}_d{i}")
            if not dims:
                self.fail(f"graph input {v.name!r}: a scalar input (expected at least one axis)")
            name = self.design_name(v.name, "input")
            self.design.add_node("Input", name, {"shape": dims, "dtype": kind})
            self.src[v.name] = (name, "output")
            names.add(name)
        if not names:
            self.fail("the graph has no inputs (expected at least one tensor input that is not an initializer)")

    def _defined_check(self):
        defined = set(self.consts) | set(self.src)
        missing = []
        for i, n in enumerate(self.g.node):
            for v in n.input:
                if v and v not in defined:
                    missing.append(f"node {self.node_name(i, n)!r} ({n.op_type}) reads {v!r}")
            defined.update(o for o in n.output if o)
        for o in self.g.output:
            if o.name not in defined:
                missing.append(f"graph output {o.name!r}")
        if missing:
            self.fail("missing initializer or input: " + "; ".join(missing[:10]) +
                      " — expected a graph input, an initializer or an earlier node's output of that name")

    def _outputs(self):
        for o in self.g.output:
            s = self.src.get(o.name)
            if s is None:
                if o.name in self.consts:
                    self.fail(f"graph output {o.name!r} is a constant (expected a tensor computed from the inputs)")
                self.fail(f"graph output {o.name!r} is not produced by any node")
            name = self.design_name(o.name, "output")
            self.design.add_node("Output", name)
            self.design.connect(s[0], s[1], name, "input")

    def _check_declared(self, analysis):
        shapes = analysis.output_shapes()
        reading: dict = {}  # (design node, port) -> the first Output node reading it
        for n in self.design.outputs():
            reading.setdefault(self.design.source_of(n, "input"), n)
        for o in self.g.output:
            got = self.info.get(o.name)
            out = reading.get(self.src.get(o.name))
            if not got or not got[1] or out is None or out not in shapes:
                continue
            t = shapes[out]
            declared = got[1]
            if len(declared) != t.rank or any(isinstance(d, int) and d > 0 and s.is_const() and s.value() != d
                                              for d, s in zip(declared, t.sym)):
                self.fail(f"graph output {o.name!r}: the file declares dims {declared}, the imported graph computes "
                          f"{t.text()}")

    # ------------------------------------------------------------------ fusions
    def _producer(self):
        if not hasattr(self, "_prod"):
            self._prod = {o: i for i, n in enumerate(self.g.node) for o in n.output if o}
        return self._prod

    def other_input(self, node, value):
        """The operand of a two-input node that is not `value` (None when both or neither are)."""
        a, b = (list(node.input) + ["", ""])[:2]
        if a == value and b != value:
            return b
        if b == value and a != value:
            return a
        return None

    def _node(self, i: int, node, name: str):
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise Unsupported(f"an op of the domain {node.domain!r}")
        if i in self.fusions:
            kind, config, x, out, params, members = self.fusions[i]
            if x in self.src and self.src[x] is None:
                for nm in [self.node_name(m, self.g.node[m]) for m in sorted(members)]:
                    self.report.mapping[nm] = "not imported: it reads the output of an unsupported node"
                self.src.setdefault(out, None)
                return
            if x not in self.src:
                raise Unsupported("its input is not a tensor computed from the graph's inputs")
            made = self.add(kind, snake_name(kind), kind, config, [x], out, params)
            self.origin[made] = name
            names = [self.node_name(m, self.g.node[m]) for m in sorted(members)]
            for nm in names:
                self.report.mapping[nm] = f"fused into {made} ({kind})"
            self.report.fused.append((made, kind, names))
            return
        ins = list(node.input)
        known = op in PRIMITIVE_OPS or op in FOLD_ONLY_OPS or op in ("Identity", "Shape", "Constant", "Dropout") \
            or op in HANDLERS
        if not known:
            raise Unsupported()
        runtime = [v for v in ins if v and v not in self.consts]
        if any(v in self.sym for v in runtime) and self._symbolic(i, node, name):
            return
        for v in runtime:
            if v in self.deferred and v not in self._attr_inputs(node):
                self._materialize(v)
        if any(self.src.get(v, 0) is None for v in runtime):
            self.report.mapping[name] = "not imported: it reads the output of an unsupported node"
            for o in node.output:
                self.src.setdefault(o, None)
            return
        if op in ("Constant",) or (not runtime and (op in PRIMITIVE_OPS or op in FOLD_ONLY_OPS)):
            self._fold(node, name)
            return
        if op == "Shape":
            dims = self.dims_of(ins[0])
            at = node_attrs(node)
            if dims and all(isinstance(d, int) and d > 0 for d in dims):
                arr = np.asarray(dims, np.int64)[slice(at.get("start", 0), at.get("end"))]
                self.consts[node.output[0]] = arr
                self.report.mapping[name] = "folded into a constant (the input's dims are fixed)"
                return
            if dims is not None and ins[0] in self.src and self.src[ins[0]] is not None:
                entries = [d if isinstance(d, int) and d > 0 else (ins[0], k) for k, d in enumerate(dims)]
                self.sym[node.output[0]] = (entries[slice(at.get("start", 0), at.get("end"))], 1)
                self.deferred[node.output[0]] = i
                self.report.mapping[name] = "a run-time shape (its named axes flow into the ops reading it)"
                return
            if "start" in at or "end" in at:
                raise Unsupported("Shape with start / end of a tensor whose dims vary")
        if op == "Identity" or (op == "Dropout" and len(node.output) > 1 and node.output[1] in self.consumed):
            if op == "Dropout":
                raise Unsupported("its mask output is used")
            self.src[node.output[0]] = self.src[ins[0]]
            self.report.mapping[name] = "passes its input through (no node)"
            return
        if op == "Expand" and len(ins) > 1 and ins[1] in self.sym and self._expand_in_steps(node, name):
            return
        handler = HANDLERS.get(op)
        if handler is not None:
            made = handler(self, node, name)
            if made is not None:
                self.report.mapping.setdefault(name, f"{made} ({self.design.kind(made)})")
                return
        if op in PRIMITIVE_OPS:
            made = self._primitive(node, name)
            self.report.mapping[name] = f"{made} (Op {op})"
            return
        if op in FOLD_ONLY_OPS:
            raise Unsupported("its inputs are computed at run time (the output's dims would be a run-time value)")
        raise Unsupported()

    # ------------------------------------------------------------------ run-time shapes
    def _sym_of(self, v: str):
        """(entries, rank) of a run-time shape or of a small int constant (None for anything else)."""
        if v in self.sym:
            return self.sym[v]
        a = self.consts.get(v)
        if a is not None and a.dtype.kind in "iu" and a.ndim <= 1 and a.size <= 1024:
            return [int(x) for x in a.reshape(-1)], a.ndim
        return None

    def _symbolic(self, i: int, node, name: str) -> bool:
        """Evaluates Gather / Slice / Concat / Unsqueeze / Squeeze / Cast / Identity of a run-time shape on its
        entries (the named axes flow through); False where the op is not one of those forms."""
        op, ins, at = node.op_type, list(node.input), node_attrs(node)
        if op == "Range":
            return self._runtime_range(node, name)
        got = self._sym_of(ins[0]) if ins and ins[0] else None
        out = None
        if op in ("Identity", "Cast") and got is not None and (op == "Identity" or TO_DTYPE.get(int(at.get("to", 1)))
                                                               == "int64"):
            out = got
        elif op == "Gather" and got is not None and got[1] == 1 and int(at.get("axis", 0)) == 0:
            idx = self.consts.get(ins[1])
            if idx is not None and idx.dtype.kind in "iu" and idx.ndim <= 1 and idx.size <= MAX_SHAPE_ENTRIES and \
                    all(-len(got[0]) <= int(k) < len(got[0]) for k in idx.reshape(-1)):
                out = ([got[0][int(k)] for k in idx.reshape(-1)], idx.ndim)
        elif op == "Slice" and got is not None and got[1] == 1:
            try:
                b = [self.ints(node, k, w) for k, w in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps"))]
            except Unsupported:
                return False
            if b[0] is not None and b[1] is not None and len(b[0]) == 1 and (b[2] is None or b[2] in ([0], [-1])):
                step = (b[3] or [1])[0]
                if step != 0:
                    out = (got[0][slice(b[0][0], b[1][0], step)], 1)
        elif op == "Concat" and int(at.get("axis", 0)) in (0, -1):
            parts = [self._sym_of(v) for v in ins if v]
            if all(p is not None and p[1] == 1 for p in parts) and sum(len(p[0]) for p in parts) <= MAX_SHAPE_ENTRIES:
                out = ([e for p in parts for e in p[0]], 1)
        elif op == "Unsqueeze" and got is not None and got[1] == 0:
            axes = [int(v) for v in at["axes"]] if "axes" in at else self.ints(node, 1, "axes")
            if axes in ([0], [-1]):
                out = (got[0], 1)
        elif op == "Squeeze" and got is not None and got[1] == 1 and len(got[0]) == 1:
            out = (got[0], 0)
        elif op in ("Reshape", "Shape", "Equal", "Where"):
            out = self._symbolic_more(node, got)
        if out is None:
            return False
        if out == "done":
            return True
        entries, rank = out
        if all(isinstance(e, int) for e in entries):
            arr = np.asarray(entries, np.int64)
            self.consts[node.output[0]] = arr.reshape(()) if rank == 0 else arr
            self.report.mapping[name] = "folded into a constant (the run-time sizes it reads are not used)"
        else:
            self.sym[node.output[0]] = out
            self.deferred[node.output[0]] = i
            self.report.mapping[name] = "a run-time shape (its named axes flow into the ops reading it)"
        return True

    def _materialize(self, v: str):
        """The Op nodes of a run-time shape a consumer reads as a tensor (not only as a target shape)."""
        made, todo = [], [v]
        while todo:  # the deferred nodes it reads, however deep the chain (no recursion)
            u = todo.pop()
            if u in self.deferred:
                i = self.deferred.pop(u)
                made.append(i)
                todo.extend(w for w in self.g.node[i].input if w in self.deferred)
        for i in sorted(made):  # the file's order: every node after the ones it reads
            node = self.g.node[i]
            name = self.node_name(i, node)
            self.report.mapping[name] = f"{self._primitive(node, name)} (Op {node.op_type})"

    def _symbolic_more(self, node, got):
        """Reshape to [-1], Shape, Equal and Where on the entries of run-time shapes (the TorchScript exporter's
        `expand(n, -1)`: Where(Equal(shape, -1), 1, shape)); None where the result is not known at import."""
        op, ins, at = node.op_type, list(node.input), node_attrs(node)
        if op == "Reshape" and got is not None and got[1] == 1:
            target = self.consts.get(ins[1]) if len(ins) > 1 else None
            if target is not None and [int(v) for v in target.reshape(-1)] in ([-1], [len(got[0])]):
                return got[0], 1
        if op == "Shape" and got is not None and "start" not in at and "end" not in at:
            return ([len(got[0])] if got[1] == 1 else []), 1
        if op == "Equal" and len(ins) == 2:
            a, b = self._sym_of(ins[0]), self._sym_of(ins[1])
            if a is None or b is None or a[1] + b[1] == 2 and len(a[0]) != len(b[0]) and 1 not in (len(a[0]), len(b[0])):
                return None
            n = max(len(a[0]), len(b[0]))
            pairs = zip(a[0] * (n if len(a[0]) == 1 else 1), b[0] * (n if len(b[0]) == 1 else 1))
            same = []
            for x, y in pairs:
                if isinstance(x, int) and isinstance(y, int):
                    same.append(x == y)
                elif x == y:
                    same.append(True)
                elif isinstance(x, int) or isinstance(y, int):  # a run-time size (>= 1) against a constant < 1
                    if (x if isinstance(x, int) else y) >= 1:
                        return None
                    same.append(False)
                else:
                    return None
            arr = np.asarray(same, bool)
            self.consts[node.output[0]] = arr.reshape(()) if max(a[1], b[1]) == 0 else arr
            self.report.mapping[self.node_name(0, node)] = "folded into a constant (sizes compared at import)"
            return "done"
        if op == "Where" and len(ins) == 3 and ins[0] in self.consts:
            c = self.consts[ins[0]]
            x, y = self._sym_of(ins[1]), self._sym_of(ins[2])
            if x is None or y is None or c.ndim > 1 or max(x[1], y[1], c.ndim) != 1:
                return None
            n = max(len(x[0]), len(y[0]), c.size)
            if any(k not in (1, n) for k in (len(x[0]), len(y[0]), c.size)):
                return None
            pick = [bool(v) for v in np.broadcast_to(c.reshape(-1), (n,))]
            xs, ys = x[0] * (n if len(x[0]) == 1 else 1), y[0] * (n if len(y[0]) == 1 else 1)
            return [p if k else q for k, p, q in zip(pick, xs, ys)], 1
        return None

    def _axis_name(self, e):
        """The name shape inference gives axis e[1] of tensor e[0] (a `dim_param`, or its own symbol), or None."""
        dims = self.dims_of(e[0]) or []
        return dims[e[1]] if e[1] < len(dims) and isinstance(dims[e[1]], str) else None

    def _one_reference(self, entries: list, refs: set, also: tuple = ()) -> tuple:
        """Entries that read the sizes of several tensors, rewritten to read one of them (or of `also`, a Reshape's
        own data) where each size is a named axis (a graph input's `dim_param`, shape inference's symbol, or the
        file's value_info name) that tensor also has: (entries, {that tensor}); unchanged otherwise."""
        axis_name = self._axis_name

        for ref in sorted(refs) + [v for v in also if v not in refs]:
            names = self.dims_of(ref) or []
            out = []
            for e in entries:
                n = None if isinstance(e, int) or e[0] == ref else axis_name(e)
                if n is not None and n in names:
                    e = (ref, names.index(n))
                elif not isinstance(e, int) and e[0] != ref:
                    break
                out.append(e)
            else:
                return out, {ref}
        return entries, refs

    def _expand_in_steps(self, node, name: str) -> bool:
        """An Expand whose run-time target reads the sizes of several tensors (a mask's [batch, 1, queries, keys]
        from the ids and the mask) as one Expand per tensor, the other tensors' sizes 1 in each (broadcasting by
        1 changes nothing, so the chain is the one Expand); False where the target reads one tensor."""
        entries, rank = self.sym[node.input[1]]
        refs = {e[0] for e in entries if not isinstance(e, int)}
        if len(refs) > 1:
            entries, refs = self._one_reference(entries, refs)
        if rank != 1 or len(refs) < 2:
            return False
        for ref in refs:
            if ref in self.deferred:
                self._materialize(ref)
            if self.src.get(ref) is None:
                raise Unsupported(f"its target shape reads the sizes of {ref!r}, which is not imported")
        data = node.input[0]
        for k, ref in enumerate(sorted(refs)):
            shape = [(e if k == 0 else 1) if isinstance(e, int) else (-2 - e[1] if e[0] == ref else 1)
                     for e in entries]
            last = k == len(refs) - 1
            config = {"op": "Expand", "shape": shape}
            if data in self.consts:
                config.update(inputs=1, operands="c0,in0", constants=constants_text([self.consts[data]]))
                made = self.add("Op", name, "Expand", config, [ref], node.output[0] if last else None,
                                {"c0": self.consts[data]})
            else:
                config.update(inputs=2, operands="in0,in1")
                made = self.add("Op", name, "Expand", config, [data, ref], node.output[0] if last else None)
            data = f"{node.output[0]}#step{k}"
            self.src[data] = (made, "output")
        self.report.mapping[name] = f"{made} (Op Expand, one step a tensor whose sizes it reads)"
        return True

    def _runtime_range(self, node, name: str) -> bool:
        """Range(0, <a run-time size>, 1): an Op node counting along that axis of the tensor it was read from
        (the positions of a dynamic sequence); other run-time Ranges are refused."""
        start, limit, delta = (list(node.input) + ["", "", ""])[:3]
        got = self._sym_of(limit)
        s, d = self.scalar(start), self.scalar(delta)
        if got is None or len(got[0]) != 1 or got[1] != 0 or isinstance(got[0][0], int) or s != 0 or d != 1 or \
                self.consts[start].dtype.kind not in "iu":
            raise Unsupported("a Range computed at run time other than Range(0, <an axis's size>, 1) of integers")
        ref, axis = got[0][0]
        if ref in self.deferred:
            self._materialize(ref)
        if self.src.get(ref) is None:
            raise Unsupported(f"its limit reads the sizes of {ref!r}, which is not imported")
        dtype = str(self.consts[start].dtype)
        made = self.add("Op", name, "Range", {"op": "Range", "inputs": 1, "operands": "in0", "axis": axis,
                                              "to": dtype}, [ref], node.output[0])
        self.report.mapping[name] = f"{made} (Op Range along axis {axis} of {ref!r})"
        return True

    def runtime_ends(self, node) -> tuple:
        """A Slice's run-time ends as (ends, codes, reference value): each entry an axis's size of one tensor."""
        entries, rank = self.sym[node.input[2]]
        refs = {e[0] for e in entries if not isinstance(e, int)}
        if rank != 1 or len(refs) != 1:
            raise Unsupported(f"its ends read the sizes of {len(refs)} tensors (expected one)")
        ref = refs.pop()
        if ref in self.deferred:
            self._materialize(ref)
        if self.src.get(ref) is None:
            raise Unsupported(f"its ends read the sizes of {ref!r}, which is not imported")
        ends = [e if isinstance(e, int) else 0 for e in entries]
        return ends, [0 if isinstance(e, int) else -2 - e[1] for e in entries], ref

    def _runtime_target(self, node, pos: int):
        """A run-time Reshape / Expand target as (shape with codes, reference value) (see primitive.py)."""
        entries, rank = self.sym[node.input[pos]]
        if rank != 1:
            raise Unsupported("its target shape is not a 1-d list of sizes")
        refs = {e[0] for e in entries if not isinstance(e, int)}
        data = node.input[0]
        if node.op_type == "Reshape":  # a size the data has at that axis (by its name too) is 0: copied
            own = self.dims_of(data) or []
            entries = [0 if not isinstance(e, int) and (e == (data, k) or k < len(own) and isinstance(own[k], str)
                                                         and self._axis_name(e) == own[k]) else e
                       for k, e in enumerate(entries)]
            free = [k for k, e in enumerate(entries) if not isinstance(e, int)]
            if len(free) == 1 and -1 not in entries or not free:
                return [e if isinstance(e, int) else -1 for e in entries], None
            refs = {e[0] for e in entries if not isinstance(e, int)}
        if len(refs) > 1:
            entries, refs = self._one_reference(entries, refs, (data,) if node.op_type == "Reshape" else ())
        if len(refs) != 1:
            raise Unsupported(f"its target shape reads the sizes of {len(refs)} tensors ({', '.join(sorted(refs))}; "
                              f"expected one, or axes of one name in one of them or in the data)")
        ref = refs.pop()
        if ref in self.deferred:
            self._materialize(ref)
        if self.src.get(ref) is None:
            raise Unsupported(f"its target shape reads the sizes of {ref!r}, which is not imported")
        return [e if isinstance(e, int) else -2 - e[1] for e in entries], ref

    def one_output(self, node):
        for o in list(node.output)[1:]:
            if o and (o in self.consumed or o in self.outputs):
                raise Unsupported(f"its extra output {o!r} is used")
