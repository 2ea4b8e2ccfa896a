"""Live shape inference over a design, with named axes.

A tensor flowing along an edge has symbolic dims: exact integer expressions (`Dim`, see `dims`)
over the names of the axes that vary at run time (`[batch, seq, 512]`, `[batch, 8, seq-2]`,
`[batch, 64, (h-3)//2+1]`). Each layer kind states its output dims as expressions of its input
dims in each layer's shape rule (declared beside its class, `engine.nn.spec`; one rule per layer type, reading only the layer's settings and parameter
shapes: nothing is initialized and no kernel runs); the structural nodes (Add, Concat, Reshape,
Flatten, Split) have rules of their own here. A layer whose contract refuses its input gives
the message its own `assert_shape` gives for a real tensor, with the named axes in place
(`axis 1 expected 16, got seq (dims [batch, seq, 16])`). What an input must satisfy beyond its
fixed sizes is kept at the node as constraints in the user's axis names (`w must be divisible
by 2`, `seq must be even`): they depend on the sizes given at run time, so they are not errors.

The layer of a node is made from its config once (lazy parameters: nothing random is drawn)
and cached, so re-running the inference after each edit costs little.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field

from ..tensor import Device, Tensor
from ..nn import spec as layer_spec
from ..shapes.rules import RuleError, Shape
from .catalog import NodeSpec
from ..shapes.dims import Constraint, Dim, as_dim
from .fields import is_axis_name
from .graph import Design

__all__ = ["SymTensor", "NodeState", "Analysis", "analyze", "format_dims", "call_layer", "NodeError", "incoming_fields",
           "fields_from_input"]


class NodeError(Exception):
    """Why a node produces no shape: the message shown at the node."""


def format_dims(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


@dataclass(frozen=True)
class SymTensor:
    """A tensor's symbolic dims (`sym`, one `Dim` per axis) and its kind ("float", "int", "bool").

    `dims` shows them as the designer does: ints for fixed sizes, text for the others
    (`("batch", 8, "seq-2")`)."""

    sym: tuple
    dtype: str = "float"

    @property
    def dims(self) -> tuple:
        return tuple(d.label() for d in self.sym)

    @property
    def rank(self) -> int:
        return len(self.sym)

    def evaluate(self, sizes: dict) -> tuple:
        """The concrete dims for concrete sizes of the named axes ({name: int})."""
        return tuple(d.evaluate(sizes) for d in self.sym)

    def text(self) -> str:
        return format_dims(self.dims)

    def __str__(self) -> str:
        return self.text()


@dataclass
class NodeState:
    """What inference found for one node: its output tensors by port, or why there are none.

    `blocked` means an upstream node has no shape (its own error is shown there).
    `constraints` are what the node's inputs must satisfy at run time (`w must be divisible by 2`)."""

    outputs: dict | None = None
    error: str | None = None
    blocked: bool = False
    inputs: dict = field(default_factory=dict)
    kind: str = ""
    constraints: list = field(default_factory=list)

    def constraint_texts(self) -> list[str]:
        return [c.text() for c in self.constraints]


@dataclass
class Analysis:
    """The inference of a whole design. `env` maps each named axis to the (Input node, axis)
    that first binds it."""

    nodes: dict
    env: dict
    problems: list

    def state(self, name: str) -> NodeState:
        return self.nodes[name]

    def errors(self) -> dict:
        """{node: message} for every node whose input does not fit or whose config is bad."""
        return {n: s.error for n, s in self.nodes.items() if s.error}

    def constraints(self) -> dict:
        """{node: ["w must be divisible by 2", ...]} for the nodes whose inputs must satisfy more
        than their fixed sizes."""
        return {n: s.constraint_texts() for n, s in self.nodes.items() if s.constraints}

    def edge_shape(self, edge) -> SymTensor | None:
        src, sp, _dst, _dp = edge
        st = self.nodes.get(src)
        if st is None or st.outputs is None:
            return None
        return st.outputs.get(sp)

    def output_shapes(self) -> dict:
        """{Output node: its tensor} for the outputs that have a shape."""
        return {n: s.inputs["input"] for n, s in self.nodes.items()
                if s.kind == "Output" and s.error is None and "input" in s.inputs}

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.error is None and not s.blocked for s in self.nodes.values())

    def messages(self) -> list[str]:
        """Every problem, design-level first, then `node: message` per node."""
        return list(self.problems) + [f"{n}: {m}" for n, m in self.errors().items()]


def _env_of(design: Design) -> dict:
    env = {}
    for n in design.inputs():
        for i, d in enumerate(design.config(n).get("shape", [])):
            if isinstance(d, str) and d not in env:
                env[d] = (n, i)
    return env


# ---------------------------------------------------------------------------------- analysis
def analyze(design: Design) -> Analysis:
    """Infer every node's output shapes; nothing raises, problems are reported per node."""
    env = _env_of(design)
    states: dict[str, NodeState] = {}
    problems = []
    if not design.inputs():
        problems.append("the design has no Input node: add one for each argument of forward")
    if not design.outputs():
        problems.append("the design has no Output node: add one for each result of forward")
    for name in design.topological_order():
        spec = design.spec(name)
        values = design.config(name)
        st = NodeState(kind=spec.kind)
        states[name] = st
        missing, blocked = [], False
        ins = []
        for port in spec.input_ports(values):
            src = design.source_of(name, port)
            if src is None:
                missing.append(port)
                continue
            up = states[src[0]]
            t = None if up.outputs is None else up.outputs.get(src[1])
            if t is None:
                blocked = True
                continue
            st.inputs[port] = t
            ins.append(t)
        bad_config = None if spec.structural else _config_error(spec, values)
        if bad_config:
            st.error = bad_config
            continue
        if missing:
            if spec.kind == "Output":
                st.error = "not connected: connect the tensor this output returns"
            else:
                which = ", ".join(repr(p) for p in missing)
                st.error = f"input port{'s' if len(missing) > 1 else ''} {which} not connected"
            continue
        if blocked:
            st.blocked = True
            continue
        try:
            st.outputs = _infer(spec, values, ins, env, st.constraints)
        except (NodeError, RuleError) as e:
            st.error = str(e)
            st.constraints.clear()
        except Exception as e:  # noqa: BLE001 - a node's problem never breaks the analysis
            st.error = f"{type(e).__name__}: {e}"
            st.constraints.clear()
    return Analysis(states, env, problems)


def _infer(spec: NodeSpec, values: dict, ins: list, env: dict, constraints: list) -> dict:
    k = spec.kind
    if k == "Input":
        dims = tuple(values["shape"])
        if not dims:
            raise NodeError("shape: an input needs at least one axis")
        return {"output": SymTensor(tuple(as_dim(d) for d in dims), values["dtype"])}
    if k == "Output":
        return {}
    if k == "Add":
        return {"output": _add(ins)}
    if k == "Concat":
        return {"output": _concat(ins, values["dim"])}
    if k == "Reshape":
        return {"output": _reshape(ins[0], values["shape"], env, constraints)}
    if k == "Flatten":
        return {"output": _flatten(ins[0], values["start_dim"], values["end_dim"])}
    if k == "Split":
        return _split(ins[0], values["dim"], values["sizes"])
    return {"output": _layer(spec, values, ins, constraints)}


# ---------------------------------------------------------------------------------- structure
def _axis(dim: int, rank: int, what: str) -> int:
    d = dim + rank if dim < 0 else dim
    if not 0 <= d < rank:
        raise NodeError(f"{what} {dim} is out of range for a tensor of rank {rank}")
    return d


def _add(ins: list) -> SymTensor:
    first = ins[0]
    for i, t in enumerate(ins[1:], start=1):
        if t.sym != first.sym:
            raise NodeError(f"input in{i} has dims {t.text()}, expected {first.text()} (the dims of in0)")
    return first


def _concat(ins: list, dim: int) -> SymTensor:
    first = ins[0]
    d = _axis(dim, first.rank, "dim")
    for i, t in enumerate(ins[1:], start=1):
        if t.rank != first.rank:
            raise NodeError(f"input in{i} has rank {t.rank} ({t.text()}), expected {first.rank} like in0 "
                            f"({first.text()})")
        for a in range(first.rank):
            if a != d and t.sym[a] != first.sym[a]:
                raise NodeError(f"input in{i} has dims {t.text()}: axis {a} must match in0 {first.text()} "
                                f"(only axis {d} may differ)")
    total = Dim()
    for t in ins:
        total = total + t.sym[d]
    return SymTensor(first.sym[:d] + (total,) + first.sym[d + 1:], first.dtype)


def _product(dims) -> Dim:
    p = as_dim(1)
    for d in dims:
        p = p * d
    return p


def _monomial_quotient(num: Dim, den: Dim) -> Dim | None:
    """num / den when den is one term (c * atoms) that divides every term of num, else None."""
    if len(den.terms) != 1:
        return None
    (dm, dc), = den.terms.items()
    out = {}
    for m, c in num.terms.items():
        rest = list(m)
        for a in dm:
            if a not in rest:
                return None
            rest.remove(a)
        if c % dc:
            return None
        out[tuple(rest)] = c // dc
    return Dim(out)


def _reshape(t: SymTensor, shape: list, env: dict, constraints: list) -> SymTensor:
    target = format_dims(shape)
    if not shape:
        raise NodeError("shape: give at least one axis")
    labels = t.dims
    out: list = []
    for s in shape:
        if isinstance(s, str):
            if s in labels:
                out.append(t.sym[labels.index(s)])
            elif s in env:  # a named axis of the model's inputs
                out.append(as_dim(s))
            else:
                names = sorted(set(env) | {d for d in labels if isinstance(d, str) and is_axis_name(d)})
                raise NodeError(f"{s!r} is not a named axis of the input {t.text()} nor of the model's "
                                f"inputs: use a size, -1, or one of {', '.join(names) or 'no names'}")
        else:
            out.append(s)
    total = _product(t.sym)
    if -1 in out:
        i = out.index(-1)
        known = _product(d for d in out if not (isinstance(d, int) and d == -1))
        if known == 0:
            raise NodeError(f"cannot reshape {t.text()} into {target}: no size for -1 makes the number of "
                            f"elements agree")
        q = _monomial_quotient(total, known)
        if q is None and known.is_const():
            k = known.value()
            c = Constraint(total, "multiple", k)
            if c.decided() is False:
                raise NodeError(f"cannot reshape {t.text()} into {target}: no size for -1 makes the number of "
                                f"elements agree")
            constraints.append(c)
            q = total // k
        if q is None:
            raise NodeError(f"cannot reshape {t.text()} into {target}: no size for -1 makes the number of "
                            f"elements agree")
        out[i] = q
    sym = tuple(as_dim(d) for d in out)
    if _product(sym) != total:
        raise NodeError(f"cannot reshape {t.text()} into {target}: the number of elements differs")
    return SymTensor(sym, t.dtype)


def _flatten(t: SymTensor, start: int, end: int) -> SymTensor:
    s = _axis(start, t.rank, "start_dim")
    e = _axis(end, t.rank, "end_dim")
    if s > e:
        raise NodeError(f"start_dim {start} comes after end_dim {end} (for {t.text()})")
    return SymTensor(t.sym[:s] + (_product(t.sym[s:e + 1]),) + t.sym[e + 1:], t.dtype)


def _split(t: SymTensor, dim: int, sizes: list) -> dict:
    d = _axis(dim, t.rank, "dim")
    if not sizes:
        raise NodeError("sizes: give the size of each piece")
    size = t.sym[d]
    if not size.is_const():
        raise NodeError(f"axis {d} of {t.text()} is the named axis {size}: only an axis of fixed size can be "
                        f"split into fixed sizes")
    if sum(sizes) != size.value():
        raise NodeError(f"sizes {format_dims(sizes)} add up to {sum(sizes)}, but axis {d} of {t.text()} has "
                        f"{size.value()}")
    return {f"out{i}": SymTensor(t.sym[:d] + (as_dim(n),) + t.sym[d + 1:], t.dtype) for i, n in enumerate(sizes)}


# ---------------------------------------------------------------------------------- layers
def call_layer(spec: NodeSpec, module, xs: list):
    """Run a layer's forward on the tensors of its input ports; returns one tensor."""
    from .. import nn  # noqa: PLC0415

    call = spec.call
    if call == "self_attn":
        out = module.forward(nn.MhaInput.self_attn(xs[0])).context
    elif call == "encoder":
        out = module.forward(nn.TransformerEncoderInput(xs[0]))
    elif call == "decoder":
        out = module.forward(nn.TransformerDecoderInput(xs[0], xs[1]))
    elif call == "first":
        out = module.forward(*xs)[0]
    else:
        out = module.forward(*xs)
    if not isinstance(out, Tensor):
        raise NodeError(f"{spec.kind}.forward returned {type(out).__name__}, expected a tensor")
    return out


_CACHE_SIZE = 512
_CONFIG_DEVICE = "cpu"
_MODULES: OrderedDict = OrderedDict()


def _module(spec: NodeSpec, values: dict):
    """("ok", module) or ("error", message) for the node's configuration (cached)."""
    key = (spec.kind, json.dumps(values, sort_keys=True))
    hit = _MODULES.get(key)
    if hit is not None:
        _MODULES.move_to_end(key)
        return hit
    try:
        hit = ("ok", spec.create(values, Device(_CONFIG_DEVICE)))
    except Exception as e:  # noqa: BLE001 - the config's own check, shown at the node
        hit = ("error", _config_message(e))
    _MODULES[key] = hit
    if len(_MODULES) > _CACHE_SIZE:
        _MODULES.popitem(last=False)
    return hit


def _config_error(spec: NodeSpec, values: dict) -> str | None:
    """Why the node's configuration cannot make its layer (checked even while inputs are missing)."""
    status, payload = _module(spec, values)
    return payload if status == "error" else None


def _config_message(e: Exception) -> str:
    return f"configuration: {e}" if not isinstance(e, (TypeError,)) else f"configuration: {type(e).__name__}: {e}"


def _layer(spec: NodeSpec, values: dict, ins: list, constraints: list) -> SymTensor:
    status, module = _module(spec, values)
    if status == "error":
        raise NodeError(module)
    if not layer_spec.has_rule(module):
        raise NodeError(f"{spec.kind} has no shape rule (declare(..., shape=...) beside its class: engine/nn/spec.py)")
    result = layer_spec.infer(module, [Shape(t.sym, t.dtype) for t in ins])
    constraints.extend(result.constraints)
    return SymTensor(result.shape.dims, result.shape.dtype)


# ---------------------------------------------------------------------------------- fields from the input
# (field, input axis) of the settings an incoming tensor decides: a layer's input width
_INCOMING = {
    "Linear": (("d_input", -1),), "SwiGlu": (("d_input", -1),), "Lstm": (("d_input", -1),),
    "Gru": (("d_input", -1),), "BiLstm": (("d_input", -1),), "BiGru": (("d_input", -1),),
    "LayerNorm": (("d_model", -1),), "RmsNorm": (("d_model", -1),), "PositionWiseFeedForward": (("d_model", -1),),
    "BatchNorm": (("num_features", 1),), "GroupNorm": (("num_channels", 1),), "InstanceNorm": (("num_channels", 1),),
    "Conv1d": (("channels_in", 1),),
}


def incoming_fields(design: Design, node: str, analysis: Analysis | None = None) -> dict:
    """{field: value} for the settings of `node` that its incoming tensor fixes and that differ
    from the node's values: `{"d_input": 1600}` for a Linear after `[batch, 1600]` (and channel
    counts, `d_model` of norms, ...). Empty when the input has no shape yet or its axis is named."""
    analysis = analysis if analysis is not None else analyze(design)
    return fields_from_input(design.spec(node), design.config(node), analysis.nodes.get(node))


def fields_from_input(spec: NodeSpec, values: dict, state: NodeState | None) -> dict:
    """`incoming_fields` for a node given by its kind, values and analysed state."""
    ports = spec.input_ports(values)
    if state is None or not ports or ports[0] not in state.inputs:
        return {}
    t = state.inputs[ports[0]]
    out = {}
    rules = list(_INCOMING.get(spec.kind, ()))
    if spec.kind in ("Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"):
        rules = [("channels", 1)]
    for name, axis in rules:
        if not -t.rank <= axis < t.rank or not t.sym[axis].is_const():
            continue
        size = t.sym[axis].value()
        if name == "channels":
            new = [size, list(values["channels"])[1]]
            if new != list(values["channels"]):
                out[name] = new
        elif values.get(name) != size:
            out[name] = size
    return out
