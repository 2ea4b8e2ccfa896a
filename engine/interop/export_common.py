"""What the Python and Rust exporters share: the forward as a list of statements over named
values, the blocks of dotted names, and the checks that a design is complete."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..design.build import block_class_name
from ..design.graph import Design
from ..shapes.dims import as_dim
from ..design.shapes import Analysis, SymTensor, analyze

__all__ = ["ExportError", "Plan", "plan_export", "var_name", "dim_expr", "block_type"]

# names a generated forward never gives to a value (they are taken by the code around it)
RESERVED = {"self", "nn", "cat", "assert_shape", "Tensor", "Module", "device", "build", "Int", "Bool", "Device",
            "Config"}


class ExportError(ValueError):
    """A design that cannot be exported; names the node and why."""


def var_name(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", node)


@dataclass
class Plan:
    """The design laid out for code: fields (with nesting), statements, inputs, outputs."""

    design: Design
    analysis: Analysis
    order: list  # nodes in forward order (only those feeding an output), inputs excluded
    fields: list  # top-level entries: (name, node) for a layer, or (name, block_path) for a block
    blocks: dict  # block path -> list of (field name, node or sub-block path, is_block)
    vars: dict  # (node, port) -> variable name
    axes: dict  # named axis -> (input name, axis index) where it is first bound

    def shape(self, node: str, port: str = "output") -> SymTensor:
        return self.analysis.state(node).outputs[port]

    def input_of(self, node: str, port: str) -> tuple[str, str]:
        return self.design.source_of(node, port)


def plan_export(design: Design, analysis: Analysis | None = None) -> Plan:
    analysis = analysis if analysis is not None else analyze(design)
    if not analysis.ok:
        blocked = [f"{n}: waits for an input upstream" for n, s in analysis.nodes.items() if s.blocked]
        raise ExportError("the design cannot be exported until it is complete:\n  "
                          + "\n  ".join(analysis.messages() or blocked))
    needed = set()
    import networkx as nx  # noqa: PLC0415

    for o in design.outputs():
        needed |= {o} | nx.ancestors(design.graph, o)
    order = [n for n in design.topological_order() if n in needed and design.kind(n) != "Input"]
    # fields and blocks, in the order of first appearance (as the built model assigns them)
    fields: list = []
    blocks: dict = {}
    seen_top = set()
    for n in design.topological_order():
        if design.spec(n).structural:
            continue
        parts = n.split(".")
        if parts[0] not in seen_top:
            seen_top.add(parts[0])
            fields.append((parts[0], n if len(parts) == 1 else None))
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            entries = blocks.setdefault(prefix, [])
            child = parts[i]
            if any(e[0] == child for e in entries):
                continue
            if i == len(parts) - 1:
                entries.append((child, n, False))
            else:
                entries.append((child, ".".join(parts[:i + 1]), True))
    axes: dict = {}
    for n in design.inputs():
        for i, d in enumerate(design.config(n)["shape"]):
            if isinstance(d, str) and d not in axes:
                axes[d] = (n, i)
    taken: set = set(RESERVED) | set(axes)
    names: dict = {}
    for n in design.inputs():
        v = _unique(var_name(n), taken)
        names[(n, "output")] = v
    for n in order:
        for p in design.output_ports(n):
            base = var_name(n) if len(design.output_ports(n)) == 1 else f"{var_name(n)}_{p}"
            names[(n, p)] = _unique(base, taken)
    return Plan(design, analysis, order, fields, blocks, names, axes)


def _unique(base: str, taken: set) -> str:
    name = base
    i = 2
    while name in taken:
        name = f"{base}_{i}"
        i += 1
    taken.add(name)
    return name


def block_type(path: str) -> str:
    return block_class_name(path)


def dim_expr(d, axes: dict, lang: str = "python") -> str | None:
    """An axis size (an int, an axis name or a `Dim`) as a Python or Rust expression over the
    bound axis names (`h - 2`, `(h - 1) // 2`; Rust divides with `/`), or None if it uses a
    name that is not bound."""
    try:
        dim = as_dim(d)
    except TypeError:
        return None
    if any(n not in axes for n in dim.names()):
        return None
    return dim.rust() if lang == "rust" else dim.python()


def shape_pattern(dims, axes: dict, skip: str) -> str:
    """A shape contract as a pattern list: each axis as an expression over the bound names, or
    `skip` (Python's None, Rust's _) where it is not one."""
    lang = "rust" if skip == "_" else "python"
    parts = []
    for d in dims:
        e = dim_expr(d, axes, lang)
        parts.append(e if e is not None else skip)
    return "[" + ", ".join(parts) + "]"


def bound_axis_names(plan: Plan, inputs) -> list[tuple[str, list[str]]]:
    """Per input (in order) that names at least one axis first: the node and, per axis, the
    axis name it binds or "_". Each named axis is bound once, by its first input."""
    bound: set = set()
    out = []
    for n in inputs:
        names = []
        for i, a in enumerate(plan.design.config(n)["shape"]):
            if isinstance(a, str) and plan.axes.get(a) == (n, i) and a not in bound:
                names.append(a)
                bound.add(a)
            else:
                names.append("_")
        if any(x != "_" for x in names):
            out.append((n, names))
    return out
