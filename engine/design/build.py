"""Build a design into an engine Module.

The built model is an ordinary `Module`: its fields are the design's layer nodes, in the order
the data reaches them (a topological order), so it shows in the module tree, counts, saves and
loads checkpoints, takes LoRA, freezing and training like any hand-written model. A dotted node
name nests: `conv1.conv` is the field `conv` of a block module `conv1` (a `Conv1Block`), so the
parameter paths are `conv1.conv.weight`, `conv1.norm.gamma`, ... The model's class is named after
the design (`Model`).

`forward(*inputs)` takes the Input nodes' tensors in design order (or by name), checks each
against its Input node's dims (named axes must agree between inputs), runs the nodes in order
and returns the Output nodes' tensors (one tensor, or a tuple for several outputs).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..module import Module, ShapeError
from ..tensor import Tensor, cat
from .graph import Design
from .shapes import Analysis, analyze, call_layer, format_dims

__all__ = ["BuildError", "DesignModel", "DesignBlock", "Program", "build_model", "block_class_name"]


class BuildError(ValueError):
    """A design that cannot be built yet; `messages` lists each problem (`node: message`)."""

    def __init__(self, messages: list[str]):
        self.messages = list(messages)
        super().__init__("the design cannot be built:\n  " + "\n  ".join(self.messages))


@dataclass(frozen=True)
class Program:
    """What forward runs: input slots with their dims, steps in order, output slots."""

    inputs: tuple  # (name, slot, dims)
    steps: tuple
    outputs: tuple  # (name, slot)
    n_slots: int


class DesignBlock(Module):
    """A group of design nodes sharing a dotted prefix (`conv1.conv`, `conv1.norm`, ...).

    The model's forward calls the block's layers itself; the block only holds them."""


class DesignModel(Module):
    """A model built from a design (see this file's docstring)."""

    def forward(self, *args, **kwargs):
        prog: Program = self._program
        vals, axes = _bind(type(self).__name__, prog, args, kwargs)
        for step in prog.steps:
            op = step[0]
            if op == "layer":
                _, path, spec, ins, out = step
                vals[out] = call_layer(spec, self._module_at(path), [vals[i] for i in ins])
            elif op == "add":
                _, ins, out = step
                acc = vals[ins[0]]
                for i in ins[1:]:
                    acc = acc + vals[i]
                vals[out] = acc
            elif op == "concat":
                _, dim, ins, out = step
                vals[out] = cat([vals[i] for i in ins], dim)
            elif op == "reshape":
                _, plan, i, out = step
                x = vals[i]
                vals[out] = x.reshape(tuple(x.shape[v] if k == "axis" else (axes[v][0] if k == "named" else v)
                                            for k, v in plan))
            elif op == "flatten":
                _, s, e, i, out = step
                vals[out] = vals[i].flatten(s, e)
            elif op == "split":
                _, dim, sizes, i, outs = step
                x = vals[i]
                start = 0
                for n, o in zip(sizes, outs):
                    vals[o] = x.narrow(dim, start, n)
                    start += n
        results = tuple(vals[slot] for _, slot in prog.outputs)
        return results[0] if len(results) == 1 else results

    def _module_at(self, path: tuple) -> Module:
        m = self
        for seg in path:
            m = getattr(m, seg)
        return m

    def design(self) -> Design:
        """The design this model was built from (a copy)."""
        return Design.from_dict(self._design)

    def input_names(self) -> list[str]:
        return [name for name, _, _ in self._program.inputs]

    def output_names(self) -> list[str]:
        return [name for name, _ in self._program.outputs]


def _bind(owner: str, prog: Program, args, kwargs) -> list:
    vals: list = [None] * prog.n_slots
    names = [n for n, _, _ in prog.inputs]
    if len(args) > len(names):
        raise TypeError(f"{owner}.forward takes {len(names)} input(s) ({', '.join(names)}), got {len(args)}")
    given = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"{owner}.forward got an unexpected input {k!r}: expected {', '.join(names)}")
        if k in given:
            raise TypeError(f"{owner}.forward got input {k!r} twice")
        given[k] = v
    missing = [n for n in names if n not in given]
    if missing:
        raise TypeError(f"{owner}.forward is missing input(s) {', '.join(missing)}")
    axes: dict[str, tuple[int, str]] = {}
    for name, slot, dims in prog.inputs:
        x = given[name]
        if not isinstance(x, Tensor):
            raise TypeError(f"{owner}.forward: input {name!r} must be a Tensor, got {type(x).__name__}")
        shape = tuple(x.shape)
        problem = None
        if len(shape) != len(dims):
            problem = f"rank {len(dims)} expected, got {len(shape)}"
        else:
            for i, (d, s) in enumerate(zip(dims, shape)):
                if isinstance(d, int) and d != s:
                    problem = f"axis {i} expected {d}, got {s}"
                    break
                if isinstance(d, str):
                    if d in axes and axes[d][0] != s:
                        problem = f"axis {i} ({d}) expected {axes[d][0]} as in input {axes[d][1]!r}, got {s}"
                        break
                    axes.setdefault(d, (s, name))
        if problem:
            raise ShapeError(f"{owner}.forward({name}: {format_dims(dims)}): {problem} (dims {format_dims(shape)})")
        vals[slot] = x
    return vals, axes


# ---------------------------------------------------------------------------------- building
_CLASSES: dict = {}


def _named_class(name: str, base: type) -> type:
    key = (name, base)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = type(name, (base,), {"__module__": __name__, "__qualname__": name, "__doc__": base.__doc__})
        _CLASSES[key] = cls
    return cls


def block_class_name(path: str) -> str:
    """`conv1` -> `Conv1Block`, `encoder.layer1` -> `EncoderLayer1Block`, `my_block` -> `MyBlockBlock`."""
    parts = []
    for seg in path.split("."):
        parts.extend(p[:1].upper() + p[1:] for p in seg.split("_") if p)
    return "".join(parts) + "Block"


def compile_program(design: Design, analysis: Analysis) -> Program:
    """The steps forward runs, from a design whose analysis is clean."""
    slots: dict = {}

    def slot(key):
        if key not in slots:
            slots[key] = len(slots)
        return slots[key]

    inputs = []
    for n in design.inputs():
        inputs.append((n, slot((n, "output")), tuple(design.config(n)["shape"])))
    needed = set()
    for o in design.outputs():
        needed |= {o} | _ancestors(design, o)
    steps = []
    for n in design.topological_order():
        if n not in needed:
            continue
        spec = design.spec(n)
        values = design.config(n)
        kind = spec.kind
        if kind in ("Input", "Output"):
            continue
        ins = [slot(design.source_of(n, p)) for p in spec.input_ports(values)]
        state = analysis.state(n)
        if kind == "Add":
            steps.append(("add", tuple(ins), slot((n, "output"))))
        elif kind == "Concat":
            rank = state.inputs["in0"].rank
            dim = values["dim"] + rank if values["dim"] < 0 else values["dim"]
            steps.append(("concat", dim, tuple(ins), slot((n, "output"))))
        elif kind == "Reshape":
            src = state.inputs["input"]
            plan = tuple((("axis", src.dims.index(s)) if s in src.dims else ("named", s)) if isinstance(s, str)
                         else ("size", s) for s in values["shape"])
            steps.append(("reshape", plan, ins[0], slot((n, "output"))))
        elif kind == "Flatten":
            rank = state.inputs["input"].rank
            s, e = (v + rank if v < 0 else v for v in (values["start_dim"], values["end_dim"]))
            steps.append(("flatten", s, e, ins[0], slot((n, "output"))))
        elif kind == "Split":
            rank = state.inputs["input"].rank
            dim = values["dim"] + rank if values["dim"] < 0 else values["dim"]
            outs = tuple(slot((n, p)) for p in spec.output_ports(values))
            steps.append(("split", dim, tuple(values["sizes"]), ins[0], outs))
        else:
            steps.append(("layer", tuple(n.split(".")), spec, tuple(ins), slot((n, "output"))))
    outputs = []
    for o in design.outputs():
        outputs.append((o, slot(design.source_of(o, "input"))))
    return Program(tuple(inputs), tuple(steps), tuple(outputs), len(slots))


def _ancestors(design: Design, name: str) -> set:
    import networkx as nx  # noqa: PLC0415

    return nx.ancestors(design.graph, name)


def build_model(design: Design, device=None, analysis: Analysis | None = None) -> DesignModel:
    """A fresh model of the design on `device` (lazy parameters, Burn's initializers).

    Raises `BuildError` listing every problem when the design is not complete and consistent."""
    analysis = analysis if analysis is not None else analyze(design)
    if not analysis.ok:
        blocked = [n for n, s in analysis.nodes.items() if s.blocked]
        msgs = analysis.messages() or [f"{n}: waits for an input upstream" for n in blocked]
        raise BuildError(msgs)
    program = compile_program(design, analysis)
    model = object.__new__(_named_class(design.name, DesignModel))
    blocks: dict[str, Module] = {}
    for n in design.topological_order():
        spec = design.spec(n)
        if spec.structural and spec.module_class is None:  # the Op kind is structural and holds a module
            continue
        try:
            module = spec.create(design.config(n), device)
        except Exception as e:  # noqa: BLE001 - analysis already made it once; report where
            raise BuildError([f"{n}: configuration: {e}"]) from e
        parts = n.split(".")
        parent: Module = model
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            block = blocks.get(prefix)
            if block is None:
                block = object.__new__(_named_class(block_class_name(prefix), DesignBlock))
                blocks[prefix] = block
                setattr(parent, parts[i - 1], block)
            parent = block
        setattr(parent, parts[-1], module)
    model._program = program
    model._design = design.to_dict()
    return model


