"""A design: a dataflow graph of nodes held in networkx.

Nodes are keyed by their name, which is also where the node's module lives in the built model:
`fc1` is the field `fc1`, and a dotted name `conv1.conv` is the field `conv` of a block `conv1`
(so parameter paths come out as `conv1.conv.weight`). Each node has a kind (a layer of
`engine.nn` or a structural node, see `catalog`), its configuration in design form (plain JSON
values) and a position on the canvas. An edge runs from an output port of one node to an input
port of another; an input port takes one edge.

Every edit checks what it is given and raises `DesignError` (saying what was expected, what was
found, and which node) without changing the design. A connection that would close a cycle is
refused. `to_dict()` / `Design.from_dict()` give the plain data that design files and undo
snapshots hold.
"""
from __future__ import annotations

import copy
import keyword
import re
from typing import Any, Iterable

import networkx as nx

from ..module import Module
from .catalog import NodeSpec, snake_name, spec_for, UnknownKind
from .fields import FieldError

__all__ = ["Design", "DesignError", "Edge", "RUST_KEYWORDS", "check_node_name"]

# Rust keywords (strict and reserved): a field or variable named so would not compile.
RUST_KEYWORDS = frozenset("""as break const continue crate else enum extern false fn for if impl in let loop match mod
move mut pub ref return self Self static struct super trait true type unsafe use where while async await dyn abstract
become box do final macro override priv typeof unsized virtual yield try gen""".split())
_SEGMENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class DesignError(ValueError):
    """An edit the design refuses; `node` names the node it is about (or None)."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


Edge = tuple  # (src, src_port, dst, dst_port)


def check_node_name(name: str) -> None:
    """Raise `DesignError` unless `name` is a valid node name (dot-separated identifiers)."""
    if not isinstance(name, str) or not name:
        raise DesignError(f"a node name must be non-empty text, got {name!r}")
    for seg in name.split("."):
        if not _SEGMENT.match(seg):
            raise DesignError(f"invalid node name {name!r}: each part between dots must start with a letter and "
                              f"hold only letters, digits and _ (found {seg!r})", name)
        if keyword.iskeyword(seg) or seg in RUST_KEYWORDS:
            raise DesignError(f"invalid node name {name!r}: {seg!r} is a keyword in Python or Rust", name)
        if hasattr(Module, seg):
            raise DesignError(f"invalid node name {name!r}: {seg!r} is a Module method "
                              f"(a field of that name would hide it)", name)


class Design:
    """A model as a dataflow graph. `name` is the built model's class name (`Model`)."""

    def __init__(self, name: str = "Model"):
        self.name = name
        self.graph = nx.MultiDiGraph()

    @property
    def graph(self) -> nx.MultiDiGraph:
        """The networkx graph (edit it through the Design's methods: they keep the name index)."""
        return self._graph

    @graph.setter
    def graph(self, g: nx.MultiDiGraph) -> None:
        self._graph = g
        self._index = None  # rebuilt from the new graph when a name is next checked

    # ------------------------------------------------------------------ reading
    def __contains__(self, name: str) -> bool:
        return name in self.graph

    def __len__(self) -> int:
        return self.graph.number_of_nodes()

    def nodes(self) -> list[str]:
        """Node names in insertion order."""
        return list(self.graph.nodes)

    def kind(self, name: str) -> str:
        return self._node(name)["kind"]

    def spec(self, name: str) -> NodeSpec:
        return spec_for(self.kind(name))

    def config(self, name: str) -> dict:
        """A copy of the node's configuration (design form)."""
        return copy.deepcopy(self._node(name)["config"])

    def position(self, name: str) -> tuple[float, float]:
        return tuple(self._node(name)["position"])

    def edges(self) -> list[Edge]:
        """(src, src_port, dst, dst_port) for every edge, in insertion order."""
        return [(u, d["src_port"], v, d["dst_port"]) for u, v, d in self.graph.edges(data=True)]

    def in_edges(self, name: str) -> list[Edge]:
        self._node(name)
        return [(u, d["src_port"], v, d["dst_port"]) for u, v, d in self.graph.in_edges(name, data=True)]

    def out_edges(self, name: str) -> list[Edge]:
        self._node(name)
        return [(u, d["src_port"], v, d["dst_port"]) for u, v, d in self.graph.out_edges(name, data=True)]

    def source_of(self, name: str, port: str) -> tuple[str, str] | None:
        """(src, src_port) feeding `port` of `name`, or None when the port is not connected."""
        for u, v, d in self.graph.in_edges(name, data=True):
            if d["dst_port"] == port:
                return u, d["src_port"]
        return None

    def input_ports(self, name: str) -> tuple[str, ...]:
        return self.spec(name).input_ports(self._node(name)["config"])

    def output_ports(self, name: str) -> tuple[str, ...]:
        return self.spec(name).output_ports(self._node(name)["config"])

    def inputs(self) -> list[str]:
        """The Input nodes (the forward's arguments), in insertion order."""
        return [n for n in self.graph.nodes if self.graph.nodes[n]["kind"] == "Input"]

    def outputs(self) -> list[str]:
        """The Output nodes (what forward returns), in insertion order."""
        return [n for n in self.graph.nodes if self.graph.nodes[n]["kind"] == "Output"]

    def topological_order(self) -> list[str]:
        """Nodes so that every edge runs forward; ties keep insertion order."""
        index = {n: i for i, n in enumerate(self.graph.nodes)}
        return list(nx.lexicographical_topological_sort(self.graph, key=index.__getitem__))

    def _node(self, name: str) -> dict:
        try:
            return self.graph.nodes[name]
        except KeyError:
            raise DesignError(f"no node named {name!r} in the design", name) from None

    # ------------------------------------------------------------------ naming
    def _names(self) -> "_NameIndex":
        """The index of node and block names (built in one pass over the nodes when the graph was replaced, or
        changed other than through these methods; kept up to date by `add_node` and `remove_node`)."""
        idx = self._index
        if idx is None or idx.nodes != self._graph.number_of_nodes():
            idx = self._index = _NameIndex(self._graph.nodes)
        return idx

    def _taken(self, name: str) -> bool:
        return name in self._graph or self._names().blocks.get(name, 0) > 0 or self._conflicts(name)

    def unique_name(self, stem: str) -> str:
        """`stem` if free, else `stem2`, `stem3`, ... (a stem ending in a digit gets `_2`)."""
        if not self._taken(stem):
            return stem
        parts = stem.split(".")
        for p in (".".join(parts[:i]) for i in range(1, len(parts))):
            if p in self._graph:  # no number on the last part frees it: refused, not searched for ever
                raise DesignError(f"no free name for {stem!r}: {p!r} is a node, so {stem!r} and its numbered "
                                  f"variants would make it a block", stem)
        sep = "_" if stem[-1:].isdigit() else ""
        return self._first_free(("unique", stem), lambda i: f"{stem}{sep}{i}", 2)

    def default_name(self, kind: str) -> str:
        """The name a new node of `kind` gets: `input`, `output`, `linear1`, `conv2d1`, ..."""
        stem = snake_name(kind)
        if kind in ("Input", "Output"):
            return self.unique_name(stem)
        sep = "_" if stem[-1:].isdigit() else ""
        return self._first_free(("default", stem), lambda i: f"{stem}{sep}{i}", 1)

    def _first_free(self, key: tuple, candidate, first: int) -> str:
        """The candidate of the lowest number >= `first` that is free. Names only become taken while nodes are
        added, so the search resumes where the last one for this stem ended (the hints are dropped when a node
        goes): adding n nodes of one kind checks O(n) names in all, not O(n^2)."""
        idx = self._names()
        i = max(first, idx.hints.get(key, first))
        while self._taken(candidate(i)):
            i += 1
        idx.hints[key] = i
        return candidate(i)

    def block_names(self) -> set[str]:
        """The blocks the dotted names make: `conv1` for `conv1.conv` (and `a`, `a.b` for `a.b.c`)."""
        return {b for b, count in self._names().blocks.items() if count > 0}

    def _conflicts(self, name: str, ignore: str | None = None) -> bool:
        """Whether `name` is a block of another node's name, or has another node's name as a block (O(the
        number of dots in `name`), whatever the design's size)."""
        blocks = self._names().blocks.get(name, 0)
        if ignore is not None and ignore.startswith(name + "."):
            blocks -= 1
        if blocks > 0:
            return True
        parts = name.split(".")
        return any(p in self._graph and p != ignore for p in (".".join(parts[:i]) for i in range(1, len(parts))))

    def _name_conflict(self, name: str, ignore: str | None = None) -> str | None:
        """Why `name` cannot be added next to the existing nodes (a node and a block of one name)."""
        if not self._conflicts(name, ignore):
            return None
        parts = name.split(".")
        for p in (".".join(parts[:i]) for i in range(1, len(parts))):
            if p in self._graph and p != ignore:
                return f"{name!r} would make {p!r} a block, but {p!r} is a node"
        inside = next(n for n in self._graph.nodes if n != ignore and n.startswith(name + "."))
        return f"{name!r} is a block holding {inside!r}, so it cannot also be a node"

    def _check_new_name(self, name: str, ignore: str | None = None) -> None:
        check_node_name(name)
        if name in self.graph and name != ignore:
            raise DesignError(f"a node named {name!r} already exists", name)
        why = self._name_conflict(name, ignore)
        if why:
            raise DesignError(f"cannot name a node {name!r}: {why}", name)

    # ------------------------------------------------------------------ editing
    def add_node(self, kind: str, name: str | None = None, config: dict | None = None,
                 position: Iterable[float] | None = None) -> str:
        """Add a node of `kind` (its defaults, overridden by `config`); returns its name."""
        try:
            spec = spec_for(kind)
        except UnknownKind as e:
            raise DesignError(str(e)) from None
        name = self.default_name(kind) if name is None else name
        self._check_new_name(name)
        values = spec.defaults()
        if config:
            values.update(config)
        try:
            values = spec.check_values(values)
        except FieldError as e:
            raise DesignError(f"{name}: {e}", name) from None
        if kind in ("Input", "Output") and "." in name:
            raise DesignError(f"an {kind} node's name is an argument or result name: {name!r} may not contain dots",
                              name)
        idx = self._names()
        self.graph.add_node(name, kind=kind, config=values, position=_position(position))
        idx.add(name)
        return name

    def remove_node(self, name: str) -> list[Edge]:
        """Remove a node and its edges; returns the removed edges."""
        removed = self.in_edges(name) + self.out_edges(name)
        idx = self._names()
        self.graph.remove_node(name)
        idx.remove(name)
        return removed

    def rename_node(self, old: str, new: str) -> None:
        """Rename a node, keeping its place in the order and its edges."""
        self._node(old)
        if old == new:
            return
        self._check_new_name(new, ignore=old)
        if self.kind(old) in ("Input", "Output") and "." in new:
            raise DesignError(f"an {self.kind(old)} node's name may not contain dots: {new!r}", new)
        self._rebuild({old: new})

    def set_config(self, name: str, values: dict) -> None:
        """Replace the node's configuration (design form); edges into ports that no longer exist go."""
        spec = self.spec(name)
        try:
            checked = spec.check_values(values)
        except FieldError as e:
            raise DesignError(f"{name}: {e}", name) from None
        node = self._node(name)
        node["config"] = checked
        ins, outs = set(spec.input_ports(checked)), set(spec.output_ports(checked))
        drop = [e for e in self.in_edges(name) if e[3] not in ins] + [e for e in self.out_edges(name) if e[1] not in outs]
        for e in drop:
            self._remove_edge(e)

    def set_field(self, name: str, field: str, value) -> None:
        values = self.config(name)
        spec = self.spec(name)
        try:
            spec.field(field)
        except KeyError as e:
            raise DesignError(str(e.args[0]), name) from None
        values[field] = value
        self.set_config(name, values)

    def set_position(self, name: str, position: Iterable[float]) -> None:
        self._node(name)["position"] = _position(position)

    def connect(self, src: str, src_port: str, dst: str, dst_port: str) -> Edge | None:
        """Connect an output port to an input port; an edge already on that input port is replaced
        (and returned). A connection that would close a cycle is refused."""
        if src_port not in self.output_ports(src):
            raise DesignError(f"{src} ({self.kind(src)}) has no output port {src_port!r}: "
                              f"expected one of {list(self.output_ports(src)) or 'none'}", src)
        if dst_port not in self.input_ports(dst):
            raise DesignError(f"{dst} ({self.kind(dst)}) has no input port {dst_port!r}: "
                              f"expected one of {list(self.input_ports(dst)) or 'none'}", dst)
        if src == dst:
            raise DesignError(f"connecting {src} to itself would make a cycle", dst)
        if nx.has_path(self.graph, dst, src):
            path = nx.shortest_path(self.graph, dst, src)
            raise DesignError(f"connecting {src} -> {dst} would make a cycle: "
                              f"{' -> '.join(path + [dst])}", dst)
        old = self.source_of(dst, dst_port)
        replaced = None
        if old is not None:
            replaced = (old[0], old[1], dst, dst_port)
            if old == (src, src_port):
                return None
            self._remove_edge(replaced)
        self.graph.add_edge(src, dst, src_port=src_port, dst_port=dst_port)
        return replaced

    def disconnect(self, src: str, src_port: str, dst: str, dst_port: str) -> None:
        edge = (src, src_port, dst, dst_port)
        if edge not in self.edges():
            raise DesignError(f"there is no edge {src}.{src_port} -> {dst}.{dst_port}", dst)
        self._remove_edge(edge)

    def _remove_edge(self, edge: Edge) -> None:
        src, sp, dst, dp = edge
        for key, d in list(self.graph.get_edge_data(src, dst, default={}).items()):
            if d["src_port"] == sp and d["dst_port"] == dp:
                self.graph.remove_edge(src, dst, key)
                return

    def _rebuild(self, renames: dict[str, str]) -> None:
        g = nx.MultiDiGraph()
        for n, d in self.graph.nodes(data=True):
            g.add_node(renames.get(n, n), **d)
        for u, v, d in self.graph.edges(data=True):
            g.add_edge(renames.get(u, u), renames.get(v, v), **d)
        self.graph = g

    # ------------------------------------------------------------------ data
    def to_dict(self) -> dict:
        """Plain data: `{"name", "nodes": [{name, kind, config, position}], "edges": [{from, ...}]}`."""
        nodes = []
        for n, d in self.graph.nodes(data=True):
            nodes.append({"name": n, "kind": d["kind"], "config": copy.deepcopy(d["config"]),
                          "position": [_num(d["position"][0]), _num(d["position"][1])]})
        edges = [{"from": u, "from_port": sp, "to": v, "to_port": dp} for u, sp, v, dp in self.edges()]
        return {"name": self.name, "nodes": nodes, "edges": edges}

    @classmethod
    def from_dict(cls, data: dict) -> "Design":
        """The design that `to_dict()` gave; `DesignError` names what is wrong in the data."""
        if not isinstance(data, dict):
            raise DesignError(f"a design must be a mapping, got {type(data).__name__}")
        name = data.get("name", "Model")
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise DesignError(f"the design's name must be a class name such as 'Model', got {name!r}")
        d = cls(name)
        nodes = data.get("nodes", [])
        if not isinstance(nodes, list):
            raise DesignError(f"'nodes' must be a list, got {type(nodes).__name__}")
        for i, nd in enumerate(nodes):
            if not isinstance(nd, dict) or "name" not in nd or "kind" not in nd:
                raise DesignError(f"node #{i} must be a mapping with 'name' and 'kind', got {nd!r}")
            d.add_node(nd["kind"], nd["name"], nd.get("config") or {}, nd.get("position"))
        edges = data.get("edges", [])
        if not isinstance(edges, list):
            raise DesignError(f"'edges' must be a list, got {type(edges).__name__}")
        for i, e in enumerate(edges):
            try:
                src, sp, dst, dp = e["from"], e["from_port"], e["to"], e["to_port"]
            except (TypeError, KeyError):
                raise DesignError(f"edge #{i} must have 'from', 'from_port', 'to' and 'to_port', got {e!r}") from None
            for n in (src, dst):
                if n not in d.graph:
                    raise DesignError(f"edge #{i} ({src}.{sp} -> {dst}.{dp}) names a node {n!r} that does not exist",
                                      n)
            if d.source_of(dst, dp) is not None:
                raise DesignError(f"edge #{i}: input port {dst}.{dp} is connected twice", dst)
            d.connect(src, sp, dst, dp)
        return d

    def copy(self) -> "Design":
        return Design.from_dict(self.to_dict())

    def load(self, data: dict) -> None:
        """Replace this design's content by `data` (used by undo / redo)."""
        other = Design.from_dict(data)
        self.name = other.name
        self.graph = other.graph

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Design) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Design({self.name!r}, {len(self)} nodes, {self.graph.number_of_edges()} edges)"

    # ------------------------------------------------------------------ copy / paste
    def fragment(self, names: Iterable[str]) -> dict:
        """The selected nodes and the edges between them, as plain data (for the clipboard)."""
        chosen = [n for n in self.graph.nodes if n in set(names)]
        nodes = [nd for nd in self.to_dict()["nodes"] if nd["name"] in chosen]
        edges = [{"from": u, "from_port": sp, "to": v, "to_port": dp} for u, sp, v, dp in self.edges()
                 if u in chosen and v in chosen]
        return {"ember": "design-fragment", "nodes": nodes, "edges": edges}

    def paste(self, fragment: dict, offset: tuple[float, float] = (40.0, 40.0)) -> list[str]:
        """Add a fragment's nodes (renamed where a name is taken) and edges; returns the new names."""
        if not isinstance(fragment, dict) or not isinstance(fragment.get("nodes"), list):
            raise DesignError("the clipboard holds no design nodes")
        trial = self.copy()
        renames = {}
        for nd in fragment["nodes"]:
            name = nd["name"]
            new = name if (name not in trial.graph and not trial._name_conflict(name)) else trial.unique_name(name)
            x, y = _position(nd.get("position"))
            trial.add_node(nd["kind"], new, nd.get("config") or {}, (x + offset[0], y + offset[1]))
            renames[name] = new
        for e in fragment.get("edges", []):
            if e["from"] in renames and e["to"] in renames:
                trial.connect(renames[e["from"]], e["from_port"], renames[e["to"]], e["to_port"])
        self.graph = trial.graph
        return [renames[nd["name"]] for nd in fragment["nodes"]]


class _NameIndex:
    """The names a design's nodes take: `blocks` counts the nodes under each block (`a` and `a.b` for `a.b.c`),
    `nodes` is the node count it describes, `hints` where each name search resumes (see `_first_free`)."""

    def __init__(self, names: Iterable[str]):
        self.blocks: dict = {}
        self.nodes = 0
        self.hints: dict = {}
        for n in names:
            self.add(n)

    def add(self, name: str) -> None:
        parts = name.split(".")
        for i in range(1, len(parts)):
            b = ".".join(parts[:i])
            self.blocks[b] = self.blocks.get(b, 0) + 1
        self.nodes += 1

    def remove(self, name: str) -> None:
        parts = name.split(".")
        for i in range(1, len(parts)):
            b = ".".join(parts[:i])
            self.blocks[b] -= 1
            if not self.blocks[b]:
                del self.blocks[b]
        self.nodes -= 1
        self.hints.clear()  # a name may be free again


def _num(v: float):
    f = float(v)
    return int(f) if f.is_integer() else round(f, 3)


def _position(position) -> tuple[float, float]:
    if position is None:
        return (0.0, 0.0)
    try:
        x, y = position
        return (float(x), float(y))
    except (TypeError, ValueError):
        raise DesignError(f"a position must be two numbers (x, y), got {position!r}") from None
