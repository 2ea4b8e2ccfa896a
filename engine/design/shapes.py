"""Live shape inference over a design, with named axes.

A tensor flowing along an edge has symbolic dims: ints, and names for the axes that vary at
run time (`[batch, seq, 512]`). Inference reuses each layer's own contract instead of restating
it: the layer is made from its config (lazy parameters, replaced by zeros so that no random
numbers are drawn and the device's generator is untouched), put in validation mode, and its
forward runs on small tensors of zeros. Every named axis stands for a small size, twice over
with different sizes (two *runs*): an output axis that keeps its size in both runs is an int; one
that follows a named axis is that name; one that follows it affinely (`seq - 2` after a valid
convolution, `16 * seq` after a flatten) gets that expression. A layer whose contract refuses
its input raises the same `ShapeError` its `assert_shape` raises for real tensors; the message
is shown at the node with the named axes put back (`(dims [batch, 1, 28, 28])`).

Structural nodes (Add, Concat, Reshape, Flatten, Split) have rules of their own here. Results
of a layer for given inputs are cached, so re-running the inference after each edit costs only
the changed nodes.
"""
from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from ..autodiff import no_recording
from ..module import ModuleMapper, Param
from ..tensor import Device, Tensor
from .catalog import NodeSpec
from .fields import is_axis_name
from .graph import Design

__all__ = ["SymTensor", "NodeState", "Analysis", "analyze", "format_dims", "call_layer", "NodeError", "probe_sizes"]


class NodeError(Exception):
    """Why a node produces no shape: the message shown at the node."""


def format_dims(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


@dataclass(frozen=True)
class SymTensor:
    """A tensor's symbolic dims, its concrete dims in the two probe runs, and its kind."""

    dims: tuple
    runs: tuple
    dtype: str = "float"

    @property
    def rank(self) -> int:
        return len(self.dims)

    def text(self) -> str:
        return format_dims(self.dims)

    def __str__(self) -> str:
        return self.text()


@dataclass
class NodeState:
    """What inference found for one node: its output tensors by port, or why there are none.

    `blocked` means an upstream node has no shape (its own error is shown there)."""

    outputs: dict | None = None
    error: str | None = None
    blocked: bool = False
    inputs: dict = field(default_factory=dict)
    kind: str = ""


@dataclass
class Analysis:
    """The inference of a whole design."""

    nodes: dict
    env: dict
    problems: list

    def state(self, name: str) -> NodeState:
        return self.nodes[name]

    def errors(self) -> dict:
        """{node: message} for every node whose input does not fit or whose config is bad."""
        return {n: s.error for n, s in self.nodes.items() if s.error}

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


# ---------------------------------------------------------------------------------- probe sizes
_PROBES = [(10, 14), (11, 17), (13, 19), (9, 16), (12, 21), (15, 22), (18, 25), (20, 27)]


def probe_sizes(names) -> dict:
    """The two sizes each named axis takes in the two probe runs (`batch`-like axes stay small)."""
    env = {}
    k = 0
    for n in names:
        if n in env:
            continue
        if "batch" in n.lower() and (2, 3) not in env.values():
            env[n] = (2, 3)
        else:
            a, b = _PROBES[k % len(_PROBES)]
            extra = 8 * (k // len(_PROBES))
            env[n] = (a + extra, b + 2 * extra)
            k += 1
    return env


def _env_of(design: Design) -> dict:
    names = []
    for n in design.inputs():
        for d in design.config(n).get("shape", []):
            if isinstance(d, str):
                names.append(d)
    return probe_sizes(names)


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
            st.outputs = _infer(spec, values, ins, env)
        except NodeError as e:
            st.error = str(e)
        except Exception as e:  # noqa: BLE001 - a node's problem never breaks the analysis
            st.error = f"{type(e).__name__}: {e}"
    return Analysis(states, env, problems)


def _infer(spec: NodeSpec, values: dict, ins: list, env: dict) -> dict:
    k = spec.kind
    if k == "Input":
        dims = tuple(values["shape"])
        if not dims:
            raise NodeError("shape: an input needs at least one axis")
        runs = tuple(tuple(env[d][r] if isinstance(d, str) else d for d in dims) for r in range(2))
        return {"output": SymTensor(dims, runs, values["dtype"])}
    if k == "Output":
        return {}
    if k == "Add":
        return {"output": _add(ins)}
    if k == "Concat":
        return {"output": _concat(ins, values["dim"], env)}
    if k == "Reshape":
        return {"output": _reshape(ins[0], values["shape"], env)}
    if k == "Flatten":
        return {"output": _flatten(ins[0], values["start_dim"], values["end_dim"], env)}
    if k == "Split":
        return _split(ins[0], values["dim"], values["sizes"])
    return {"output": _layer(spec, values, ins, env)}


# ---------------------------------------------------------------------------------- structure
def _axis(dim: int, rank: int, what: str) -> int:
    d = dim + rank if dim < 0 else dim
    if not 0 <= d < rank:
        raise NodeError(f"{what} {dim} is out of range for a tensor of rank {rank}")
    return d


def _add(ins: list) -> SymTensor:
    first = ins[0]
    for i, t in enumerate(ins[1:], start=1):
        if t.runs != first.runs:
            raise NodeError(f"input in{i} has dims {t.text()}, expected {first.text()} (the dims of in0)")
    return first


def _concat(ins: list, dim: int, env: dict) -> SymTensor:
    first = ins[0]
    d = _axis(dim, first.rank, "dim")
    for i, t in enumerate(ins[1:], start=1):
        if t.rank != first.rank:
            raise NodeError(f"input in{i} has rank {t.rank} ({t.text()}), expected {first.rank} like in0 "
                            f"({first.text()})")
        for a in range(first.rank):
            if a != d and [r[a] for r in t.runs] != [r[a] for r in first.runs]:
                raise NodeError(f"input in{i} has dims {t.text()}: axis {a} must match in0 {first.text()} "
                                f"(only axis {d} may differ)")
    runs = tuple(tuple(sum(t.runs[r][d] for t in ins) if a == d else first.runs[r][a] for a in range(first.rank))
                 for r in range(2))
    dims = list(first.dims)
    parts = [t.dims[d] for t in ins]
    dims[d] = _derive_one(runs[0][d], runs[1][d], ins, env, fallback=_sum_text(parts))
    return SymTensor(tuple(dims), runs, first.dtype)


def _sum_text(parts) -> str:
    total = sum(p for p in parts if isinstance(p, int))
    names = [str(p) for p in parts if not isinstance(p, int)]
    return "+".join(names + ([str(total)] if total else []))


def _reshape(t: SymTensor, shape: list, env: dict) -> SymTensor:
    target = format_dims(shape)
    if not shape:
        raise NodeError("shape: give at least one axis")
    runs = []
    for r in range(2):
        out = []
        for s in shape:
            if isinstance(s, str):
                if s in t.dims:
                    out.append(t.runs[r][t.dims.index(s)])
                elif s in env:  # a named axis of the model's inputs
                    out.append(env[s][r])
                else:
                    names = sorted(set(env) | {d for d in t.dims if isinstance(d, str) and is_axis_name(d)})
                    raise NodeError(f"{s!r} is not a named axis of the input {t.text()} nor of the model's "
                                    f"inputs: use a size, -1, or one of {', '.join(names) or 'no names'}")
            else:
                out.append(s)
        total = math.prod(t.runs[r])
        if -1 in out:
            known = math.prod(v for v in out if v != -1)
            if known == 0 or total % known:
                raise NodeError(f"cannot reshape {t.text()} into {target}: no size for -1 makes the number of "
                                f"elements agree")
            out[out.index(-1)] = total // known
        if math.prod(out) != total:
            raise NodeError(f"cannot reshape {t.text()} into {target}: the number of elements differs")
        runs.append(tuple(out))
    dims = []
    for a, s in enumerate(shape):
        if s == -1:
            q = _mono_quotient(_mono_product(t.dims), _mono_product([d for d in shape if d != -1]))
            exact = _mono_text(*q) if q is not None else None
            dims.append(exact if exact is not None else _derive_one(runs[0][a], runs[1][a], [t], env, fallback="?"))
        else:
            dims.append(s)
    return SymTensor(tuple(dims), tuple(runs), t.dtype)


def _flatten(t: SymTensor, start: int, end: int, env: dict) -> SymTensor:
    s = _axis(start, t.rank, "start_dim")
    e = _axis(end, t.rank, "end_dim")
    if s > e:
        raise NodeError(f"start_dim {start} comes after end_dim {end} (for {t.text()})")
    runs = tuple(r[:s] + (math.prod(r[s:e + 1]),) + r[e + 1:] for r in t.runs)
    product = _mono_product(t.dims[s:e + 1])
    fallback = _mono_text(*product) if product is not None else None
    merged = _derive_one(runs[0][s], runs[1][s], [t], {}, fallback=fallback)
    return SymTensor(t.dims[:s] + (merged,) + t.dims[e + 1:], runs, t.dtype)


def _mono(d):
    """An axis size as (coefficient, {name: power}), or None for a sum or a derived size."""
    if isinstance(d, int):
        return d, {}
    coeff, powers = 1, {}
    for p in str(d).split("*"):
        p = p.strip()
        if p.isdigit():
            coeff *= int(p)
        elif is_axis_name(p):
            powers[p] = powers.get(p, 0) + 1
        else:
            return None
    return coeff, powers


def _mono_product(dims):
    coeff, powers = 1, {}
    for d in dims:
        m = _mono(d)
        if m is None:
            return None
        coeff *= m[0]
        for n, k in m[1].items():
            powers[n] = powers.get(n, 0) + k
    return coeff, powers


def _mono_quotient(num, den):
    if num is None or den is None or den[0] == 0 or num[0] % den[0]:
        return None
    powers = dict(num[1])
    for n, k in den[1].items():
        if powers.get(n, 0) < k:
            return None
        powers[n] -= k
    return num[0] // den[0], {n: k for n, k in powers.items() if k}


def _mono_text(coeff: int, powers: dict):
    names = [n for n, k in powers.items() for _ in range(k)]
    if not names:
        return int(coeff)
    return "*".join(([str(coeff)] if coeff != 1 else []) + names)


def _split(t: SymTensor, dim: int, sizes: list) -> dict:
    d = _axis(dim, t.rank, "dim")
    if not sizes:
        raise NodeError("sizes: give the size of each piece")
    v0, v1 = t.runs[0][d], t.runs[1][d]
    if v0 != v1:
        raise NodeError(f"axis {d} of {t.text()} is the named axis {t.dims[d]}: only an axis of fixed size can be "
                        f"split into fixed sizes")
    if sum(sizes) != v0:
        raise NodeError(f"sizes {format_dims(sizes)} add up to {sum(sizes)}, but axis {d} of {t.text()} has {v0}")
    out = {}
    for i, n in enumerate(sizes):
        runs = tuple(r[:d] + (n,) + r[d + 1:] for r in t.runs)
        out[f"out{i}"] = SymTensor(t.dims[:d] + (n,) + t.dims[d + 1:], runs, t.dtype)
    return out


# ---------------------------------------------------------------------------------- layers
class _Zeros(ModuleMapper):
    """Every lazy float parameter becomes a lazy tensor of zeros: nothing random is drawn."""

    def map_float(self, param):
        if param.is_initialized():
            return param
        shape = tuple(param.lazy_shape())
        return Param.uninitialized(lambda d, rg, s=shape: Tensor.zeros(s, device=d), param.lazy_device(), False,
                                   shape)


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


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 512
_DTYPES = {"float": None, "int": "int64", "bool": "bool"}
_PROBE_DEVICE = "cpu"


def _layer_runs(spec: NodeSpec, values: dict, ins: list):
    """((out dims run 0, run 1), dtype) or raises NodeError(message, run)."""
    key = (spec.kind, json.dumps(values, sort_keys=True), tuple((t.runs, t.dtype) for t in ins))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
    else:
        hit = _CACHE[key] = _compute_runs(spec, values, ins)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return hit


def _compute_runs(spec: NodeSpec, values: dict, ins: list):
    device = Device(_PROBE_DEVICE)
    try:
        module = spec.create(values, device)
    except Exception as e:  # noqa: BLE001 - the config's own check, shown at the node
        return ("error", _config_message(e), None)
    try:
        module = module.map(_Zeros()).valid()
    except Exception as e:  # noqa: BLE001
        return ("error", f"{type(e).__name__}: {e}", None)
    outs = []
    kind = "float"
    for r in range(2):
        xs = [Tensor.zeros(t.runs[r], device=device, dtype=_DTYPES[t.dtype]) for t in ins]
        try:
            with no_recording():
                y = call_layer(spec, module, xs)
        except NodeError as e:
            return ("error", str(e), r)
        except Exception as e:  # noqa: BLE001 - the layer's contract refused the input
            return ("error", _error_text(e), r)
        outs.append(tuple(int(s) for s in y.shape))
        kind = y.kind
    return ("ok", tuple(outs), kind)


_CONFIG_CACHE: OrderedDict = OrderedDict()


def _config_error(spec: NodeSpec, values: dict) -> str | None:
    """Why the node's configuration cannot make its layer (checked even while inputs are missing)."""
    key = (spec.kind, json.dumps(values, sort_keys=True))
    if key not in _CONFIG_CACHE:
        try:
            spec.create(values, Device(_PROBE_DEVICE))
            _CONFIG_CACHE[key] = None
        except Exception as e:  # noqa: BLE001 - the config's own check
            _CONFIG_CACHE[key] = _config_message(e)
        if len(_CONFIG_CACHE) > _CACHE_SIZE:
            _CONFIG_CACHE.popitem(last=False)
    return _CONFIG_CACHE[key]


def _config_message(e: Exception) -> str:
    return f"configuration: {e}" if not isinstance(e, (TypeError,)) else f"configuration: {type(e).__name__}: {e}"


def _error_text(e: Exception) -> str:
    from ..module import ShapeError  # noqa: PLC0415

    if isinstance(e, ShapeError):
        return str(e)
    text = str(e)
    return text if type(e).__name__ in ("TensorError", "ValueError") else f"{type(e).__name__}: {text}"


def _layer(spec: NodeSpec, values: dict, ins: list, env: dict) -> SymTensor:
    status, payload, extra = _layer_runs(spec, values, ins)
    if status == "error":
        raise NodeError(_symbolize(payload, ins, extra) if extra is not None else payload)
    r0, r1 = payload
    if len(r0) != len(r1):
        raise NodeError(f"the output's rank depends on the input sizes ({format_dims(r0)} vs {format_dims(r1)})")
    dims = tuple(_derive_one(a, b, ins, env, fallback=None, axis=i) for i, (a, b) in enumerate(zip(r0, r1)))
    return SymTensor(dims, (r0, r1), extra)


def _symbolize(message: str, ins: list, run: int) -> str:
    """Put the named axes back into a message about the probe tensors of run `run`."""
    for t in ins:
        concrete = format_dims(t.runs[run])
        message = message.replace(f"(dims {concrete})", f"(dims {t.text()})")
        message = message.replace(f"dims {concrete}", f"dims {t.text()}")

    def got(m):
        axis, expected, actual, dims = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        parts = [p.strip() for p in dims.split(",")]
        if axis < len(parts) and not parts[axis].lstrip("-").isdigit():
            actual = parts[axis]
        return f"axis {axis} expected {expected}, got {actual} (dims [{dims}])"

    return re.sub(r"axis (\d+) expected (\S+), got (\d+) \(dims \[([^\]]*)\]\)", got, message)


def _derive_one(v0: int, v1: int, ins: list, env: dict, fallback=None, axis: int | None = None):
    """The symbolic size of an axis that measured v0 and v1 in the two runs."""
    if v0 == v1:
        return int(v0)
    if axis is not None:  # the same axis of an input first (a layer that keeps it)
        for t in ins:
            if axis < t.rank and not isinstance(t.dims[axis], int) and (t.runs[0][axis], t.runs[1][axis]) == (v0, v1):
                return t.dims[axis]
    for t in ins:
        for i, d in enumerate(t.dims):
            if not isinstance(d, int) and (t.runs[0][i], t.runs[1][i]) == (v0, v1):
                return d
    for name, (a0, a1) in env.items():
        if (a0, a1) == (v0, v1):
            return name
    near = [t.dims[axis] for t in ins if axis is not None and axis < t.rank and t.dims[axis] in env]
    for name in near:  # an affine function of the axis in the same place (a convolution)
        a0, a1 = env[name]
        slope = (v1 - v0) / (a1 - a0)
        if slope and float(slope).is_integer():
            slope = int(slope)
            b = v0 - slope * a0
            head = name if slope == 1 else f"{slope}*{name}"
            return head if b == 0 else f"{head}{'+' if b > 0 else '-'}{abs(b)}"
    if fallback is not None:
        return fallback
    if axis is not None:
        for t in ins:
            if axis < t.rank and not isinstance(t.dims[axis], int):
                return f"{t.dims[axis]}'"
    return "?"
