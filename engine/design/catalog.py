"""The node kinds a design is made of: every layer of `engine.nn`, and structural nodes.

The layer kinds are derived from `engine.nn`, not listed by hand: each `…Config` dataclass
whose name, less `Config`, is a module class gives a kind whose fields are the config's fields
(types, defaults, enums); a module without a config whose constructor takes only plain values
(`Relu()`, `GLU(dim)`, `MseLoss()`) gives a kind whose fields are the constructor's. The input
ports are the names of `forward`'s required arguments. Kinds are grouped as Burn's book groups
its built-in modules: General, Convolutions, Pooling, Interpolation, RNNs, Transformer, Loss.

Structural kinds (category "Structure"): `Input`, `Output`, `Add` (residuals), `Concat`,
`Reshape`, `Flatten`, `Split`. They hold no module; the design's forward runs them itself.
`Op` is the one structural kind with a module: one primitive tensor operation, as ONNX import
makes them; its module (`primitive.PrimitiveOp`) holds the op's constants (as parameters that
never train) and runs it through engine Tensor ops; its shape rule is `shape_rules.primitive_op_shape`.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
from functools import lru_cache
from typing import Any

from .. import nn
from ..nn.spec import layer_specs, spec_of
from ..module import Module
from .fields import MISSING, FieldError, FieldSpec

__all__ = ["CATEGORIES", "NodeSpec", "catalog", "spec_for", "kinds", "snake_name", "UnknownKind"]

CATEGORIES = ("Structure", "General", "Convolutions", "Pooling", "Interpolation", "RNNs", "Transformer", "Loss")

_FILE_CATEGORY = {
    "linear": "General", "embedding": "General", "dropout": "General", "norm": "General",
    "activation": "General", "misc": "General", "conv": "Convolutions", "pool": "Pooling",
    "interpolate": "Interpolation", "rnn": "RNNs", "attention": "Transformer", "transformer": "Transformer",
    "pos_encoding": "Transformer", "moe": "Transformer", "loss": "Loss",
}

# How a layer's forward is called with the tensors on its input ports (see `call_layer`): each layer declares
# its `call` beside its class (engine.nn.spec); "default" is forward(*inputs).
_CALL_PORTS = {"self_attn": ("input",), "encoder": ("input",), "decoder": ("target", "memory")}

_ACTIVATION_FIELDS = {"activation", "gate_activation", "cell_activation", "hidden_activation"}
# Values a new node starts with where its config has no default (the user edits them).
_SUGGESTED = {"kernel_size": 3, "prob": 0.5, "std": 0.1, "delta": 1.0, "upscale_factor": 2,
              "downscale_factor": 2, "max_sequence_length": 512, "bias": True, "num_groups": 1, "n_heads": 1,
              "n_layers": 1, "d_model": 8, "d_ff": 16, "d_input": 8, "d_output": 8, "d_hidden": 8,
              "n_embedding": 16, "num_features": 8, "num_channels": 8, "size": 5}
_POSITIVE = re.compile(r"^(d_|n_|num_|channels|kernel_size|groups|stride|dilation|size$|upscale|downscale|"
                       r"max_sequence|output_size)")


class UnknownKind(KeyError):
    """A node kind that is neither a layer of engine.nn nor a structural node."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown node kind"


def snake_name(kind: str) -> str:
    """`BatchNorm` -> `batch_norm`, `Conv2d` -> `conv2d`, `GLU` -> `glu`: a node's default name stem."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", kind)
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return s.lower()


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """What a node of one kind is: fields, ports, and how its module is made and called."""

    kind: str
    category: str
    summary: str
    fields: tuple[FieldSpec, ...] = ()
    module_class: Any = None
    config_class: Any = None
    call: str = "default"
    inputs: tuple[str, ...] = ("input",)
    outputs: tuple[str, ...] = ("output",)
    structural: bool = False

    # ------------------------------------------------------------------ fields
    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.kind} has no field {name!r}: expected one of {[f.name for f in self.fields]}")

    def defaults(self) -> dict:
        """The design-form values a new node of this kind starts with."""
        out = {}
        for f in self.fields:
            out[f.name] = _suggest(self.kind, f) if f.required else _copy(f.default)
        return out

    def check_values(self, values: dict) -> dict:
        """Validate design-form values (unknown names refused, missing ones defaulted)."""
        if not isinstance(values, dict):
            raise FieldError(f"{self.kind}: expected the configuration as a mapping, got {type(values).__name__}")
        known = {f.name for f in self.fields}
        extra = sorted(set(values) - known)
        if extra:
            raise FieldError(f"{self.kind} has no field {', '.join(map(repr, extra))}: "
                             f"expected {', '.join(sorted(known)) or 'no fields'}")
        out = {}
        defaults = self.defaults()
        for f in self.fields:
            out[f.name] = f.check(values[f.name]) if f.name in values else defaults[f.name]
        return out

    # ------------------------------------------------------------------ ports
    def input_ports(self, values: dict | None = None) -> tuple[str, ...]:
        if self.kind in ("Add", "Concat", "Op"):
            n = int((values or {}).get("inputs", 1 if self.kind == "Op" else 2))
            return tuple(f"in{i}" for i in range(max(n, 0)))
        return self.inputs

    def output_ports(self, values: dict | None = None) -> tuple[str, ...]:
        if self.kind == "Split":
            sizes = (values or {}).get("sizes") or []
            return tuple(f"out{i}" for i in range(len(sizes)))
        return self.outputs

    # ------------------------------------------------------------------ modules
    def config_kwargs(self, values: dict) -> dict:
        return {f.name: f.to_config(values[f.name]) for f in self.fields if f.name in values}

    def make_config(self, values: dict):
        """The `…Config` instance for these design-form values (None for a kind without one)."""
        if self.config_class is None:
            return None
        return self.config_class(**self.config_kwargs(values))

    def create(self, values: dict, device=None) -> Module:
        """A fresh module of this kind (lazy parameters: nothing is drawn until first use)."""
        if self.structural and self.module_class is None:
            raise TypeError(f"{self.kind} is a structural node: it has no module")
        if self.config_class is not None:
            return self.make_config(values).init(device)
        return self.module_class(**self.config_kwargs(values))


def _copy(v):
    return list(v) if isinstance(v, list) else v


def _suggest(kind: str, f: FieldSpec):
    s = _SUGGESTED.get(f.name)
    if f.kind in ("ints", "floats"):
        if f.name == "channels":
            return [1, 1]
        base = s if isinstance(s, int) else 1
        return [base] * f.n if f.kind == "ints" else [float(base)] * f.n
    if f.kind == "int":
        return int(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else 1
    if f.kind == "float":
        return float(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else 1.0
    if f.kind == "bool":
        return True
    if f.kind == "enum":
        return f.choices[0]
    if f.kind in ("int_list", "float_list", "dims"):
        return []
    if f.kind == "padding":
        return "Valid"
    return ""


# ---------------------------------------------------------------------------------- layer kinds
def _rank_of(kind: str) -> int:
    m = re.search(r"([123])d", kind)
    return int(m.group(1)) if m else 1


def _layer_field(kind: str, f: dataclasses.Field) -> FieldSpec | None:
    if f.name == "initializer":
        return None
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = f.default_factory()  # type: ignore[misc]
    else:
        default = MISSING
    t = str(f.type)
    optional = "None" in t
    base = t.replace("| None", "").replace("None |", "").strip()
    minimum = 1 if _POSITIVE.match(f.name) else None
    common = {"name": f.name, "optional": optional, "minimum": minimum}
    if f.name in _ACTIVATION_FIELDS:
        spec = FieldSpec(kind="enum", choices=_activation_choices(), **{**common, "minimum": None})
    elif base == "int":
        spec = FieldSpec(kind="int", **common)
    elif base == "float":
        spec = FieldSpec(kind="float", **{**common, "minimum": None})
    elif base == "bool":
        spec = FieldSpec(kind="bool", **{**common, "minimum": None})
    elif base == "str":
        spec = FieldSpec(kind="str", **{**common, "minimum": None})
    elif base == "tuple":
        if isinstance(default, tuple):
            n = len(default)
        elif f.name == "channels":
            n = 2
        else:
            n = _rank_of(kind)
        elem = "floats" if f.name == "scale_factor" else "ints"
        spec = FieldSpec(kind=elem, n=n, **({**common, "minimum": None} if elem == "floats" else common))
    elif base == "list":
        elem = "int_list" if f.name == "pad_tokens" else "float_list"
        spec = FieldSpec(kind=elem, **{**common, "minimum": None})
    elif isinstance(default, enum.Enum) or base in ("InterpolateMode", "Reduction"):
        cls = type(default) if isinstance(default, enum.Enum) else getattr(nn, base)
        spec = FieldSpec(kind="enum", choices=tuple(cls.__members__), enum_class=cls, **{**common, "minimum": None})
    elif f.name == "padding" and default is not MISSING and hasattr(default, "pairs"):
        pc = type(default)
        spec = FieldSpec(kind="padding", n=pc.N, padding_class=pc, **{**common, "minimum": None})
    else:
        return None  # an object the form cannot edit: the config's default stays
    if default is not MISSING:
        spec = dataclasses.replace(spec, default=FieldSpec.from_config_value(spec, default))
    return spec


def _forward_ports(cls) -> tuple[str, ...]:
    fwd = getattr(cls, "forward", None)
    if fwd is None:
        return ("input",)
    names = []
    for p in list(inspect.signature(fwd).parameters.values())[1:]:
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return tuple(names) or ("input",)


def _summary(cls) -> str:
    doc = inspect.getdoc(cls) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    return first


def _plain_init_fields(cls) -> tuple[FieldSpec, ...] | None:
    """Fields of a config-less module from its constructor, or None when it takes non-plain values."""
    out = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = str(p.annotation)
        default = MISSING if p.default is inspect.Parameter.empty else p.default
        if ann in ("int", "<class 'int'>") or (isinstance(default, int) and not isinstance(default, bool)):
            kind = "int"
        elif ann in ("float", "<class 'float'>") or isinstance(default, float):
            kind = "float"
        elif ann in ("bool", "<class 'bool'>") or isinstance(default, bool):
            kind = "bool"
        else:
            return None
        out.append(FieldSpec(name=p.name, kind=kind, default=default))
    return tuple(out)


def _layer_specs() -> list[NodeSpec]:
    specs: dict[str, NodeSpec] = {}
    configured = set()
    for name in sorted(dir(nn)):
        obj = getattr(nn, name)
        if not (name.endswith("Config") and dataclasses.is_dataclass(obj)):
            continue
        mod = getattr(nn, name[: -len("Config")], None)
        if not (inspect.isclass(mod) and issubclass(mod, Module)) or mod.__name__ != name[: -len("Config")]:
            continue
        kind = mod.__name__
        fields = tuple(s for s in (_layer_field(kind, f) for f in dataclasses.fields(obj)) if s is not None)
        call = spec_of(mod).call or "default"
        specs[kind] = NodeSpec(kind=kind, category=_category(mod), summary=_summary(mod), fields=fields,
                               module_class=mod, config_class=obj, call=call,
                               inputs=_CALL_PORTS.get(call, _forward_ports(mod)))
        configured.add(mod)
    for name in sorted(dir(nn)):
        mod = getattr(nn, name)
        if not (inspect.isclass(mod) and issubclass(mod, Module)) or mod in configured or mod.__name__ != name:
            continue
        if not hasattr(mod, "forward") or mod.__module__.split(".")[-1] not in _FILE_CATEGORY:
            continue
        fields = _plain_init_fields(mod)
        if fields is None:
            continue  # built from other modules (GateController, encoder layers): not a palette entry
        call = spec_of(mod).call or "default"
        specs[name] = NodeSpec(kind=name, category=_category(mod), summary=_summary(mod), fields=fields,
                               module_class=mod, call=call, inputs=_CALL_PORTS.get(call, _forward_ports(mod)))
    return list(specs.values())


def _category(cls) -> str:
    return spec_of(cls).category or _FILE_CATEGORY.get(cls.__module__.split(".")[-1], "General")


@lru_cache(maxsize=None)
def _activation_choices() -> tuple:
    """The layers declared `activation=True`, in their file's `__all__` order (engine.nn.spec)."""
    def order(cls):
        names = list(getattr(sys.modules[cls.__module__], "__all__", ()))
        return (cls.__module__, names.index(cls.__name__) if cls.__name__ in names else len(names), cls.__name__)
    return tuple(c.__name__ for c in sorted((c for c, s in layer_specs().items() if s.activation), key=order))


# ---------------------------------------------------------------------------------- structure
def _structural_specs() -> list[NodeSpec]:
    dims = FieldSpec(name="shape", kind="dims", default=["batch", 8],
                     help="the input's dims: sizes, and names for the axes that vary (batch, seq)")
    dtype = FieldSpec(name="dtype", kind="enum", choices=("float", "int", "bool"), default="float")
    return [
        NodeSpec("Input", "Structure", "An input of the model's forward: a tensor with named axes.",
                 (dims, dtype), inputs=(), outputs=("output",), structural=True),
        NodeSpec("Output", "Structure", "An output of the model's forward.", (), inputs=("input",), outputs=(),
                 structural=True),
        NodeSpec("Add", "Structure", "Element-wise sum of tensors of the same dims (a residual connection).",
                 (FieldSpec(name="inputs", kind="int", default=2, minimum=2),), structural=True),
        NodeSpec("Concat", "Structure", "Joins tensors along an axis (their other dims must agree).",
                 (FieldSpec(name="dim", kind="int", default=1), FieldSpec(name="inputs", kind="int", default=2,
                                                                          minimum=2)), structural=True),
        NodeSpec("Reshape", "Structure", "New dims with the same number of elements: sizes, names of the "
                 "input's axes, and one -1 for the size that makes the count right.",
                 (FieldSpec(name="shape", kind="dims", default=["batch", -1], allow_infer=True),), structural=True),
        NodeSpec("Flatten", "Structure", "Merges the axes start_dim..end_dim (inclusive) into one.",
                 (FieldSpec(name="start_dim", kind="int", default=1), FieldSpec(name="end_dim", kind="int",
                                                                                default=-1)), structural=True),
        NodeSpec("Split", "Structure", "Cuts a tensor along an axis into pieces of the given sizes.",
                 (FieldSpec(name="dim", kind="int", default=1),
                  FieldSpec(name="sizes", kind="int_list", default=[1, 1], minimum=1)),
                 outputs=(), structural=True),
        _op_spec(),
    ]


def _op_spec() -> NodeSpec:
    """The primitive-op kind (`Op`, engine/design/primitive.py): one tensor operation (MatMul, Transpose,
    Gather, Slice, Where, ...) with its attributes as fields and its constants held by its module."""
    from .primitive import DTYPES, PRIMITIVE_OPS, PrimitiveOp  # noqa: PLC0415 - primitive imports engine.module

    ints = {"kind": "int_list", "default": None, "optional": True}
    fields = (
        FieldSpec(name="op", kind="enum", choices=PRIMITIVE_OPS, default="Identity"),
        FieldSpec(name="inputs", kind="int", default=1, minimum=0),
        FieldSpec(name="operands", kind="str", default="in0",
                  help="the op's operands in order: inN an input port, cK a constant, empty an absent one"),
        FieldSpec(name="constants", kind="str", default="", help="the constants' dtypes and dims: float32[2,3];int64[]"),
        FieldSpec(name="axis", kind="int", default=0),
        FieldSpec(name="axes", **ints), FieldSpec(name="perm", **ints),
        FieldSpec(name="keepdims", kind="bool", default=True),
        FieldSpec(name="starts", **ints), FieldSpec(name="ends", **ints), FieldSpec(name="steps", **ints),
        FieldSpec(name="shape", **ints),
        FieldSpec(name="alpha", kind="float", default=1.0), FieldSpec(name="beta", kind="float", default=1.0),
        FieldSpec(name="to", kind="enum", choices=DTYPES, default="float32"),
        FieldSpec(name="trans_a", kind="bool", default=False), FieldSpec(name="trans_b", kind="bool", default=False),
        FieldSpec(name="mode", kind="str", default="", help="Pad: constant, reflect or edge; Trilu: upper or lower; Slice: exact"),
    )
    return NodeSpec("Op", "Structure", "One primitive tensor operation (ONNX semantics) with its attributes; "
                    "its constants are held by the node.", fields, module_class=PrimitiveOp, structural=True)


@lru_cache(maxsize=1)
def catalog() -> dict[str, NodeSpec]:
    """Every node kind by name: the structural kinds first, then the layers of engine.nn."""
    out = {s.kind: s for s in _structural_specs()}
    for s in _layer_specs():
        out.setdefault(s.kind, s)
    return out


def kinds(category: str | None = None) -> list[str]:
    """Kind names (of one category), structural first, then by category and name."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    specs = [s for s in catalog().values() if category is None or s.category == category]
    return [s.kind for s in sorted(specs, key=lambda s: (order.get(s.category, 99),
                                                         "" if s.structural else s.kind.lower()))]


def spec_for(kind: str) -> NodeSpec:
    try:
        return catalog()[kind]
    except KeyError:
        raise UnknownKind(f"unknown node kind {kind!r}: expected a layer of engine.nn (Linear, Conv2d, ...) "
                          f"or a structural node (Input, Output, Add, Concat, Reshape, Flatten, Split, Op)") from None
