"""What a built-in layer declares next to its class: its shape rule, its place in the designer's catalog,
its ONNX import mapping and its Burn (Rust) name.

Each layer file of `engine.nn` ends with its `declare(...)` calls; the designer (`engine.design`: the
catalog and the live shapes) and the exporters (`engine.interop`) ask this registry and keep no per-layer
tables of their own. Adding a layer is its class, its `declare(...)` line(s) and its test:

    def _shape(m, ins, ctx):                       # the output's symbolic dims (engine.shapes.rules)
        expect("assert_shape(input, [None, ...])", ins[0], [None, ...])
        return same(ins[0])

    declare(MyLayer, shape=_shape, activation=True, onnx={"MyOnnxOp": {}}, burn=Burn("", config=False))

- `shape(module, inputs, ctx) -> Shape`: the rule (`engine.shapes.rules`; `ctx.require(...)` records what
  the input must satisfy); a subclass uses its base's rule unless it declares its own;
- `category`: the designer palette's group (default: by the layer's file, `catalog._FILE_CATEGORY`);
- `call`: how the designer calls `forward` with the node's input tensors (`catalog.call_layer`);
- `activation`: offered where a layer takes an activation (the `activation` fields' choices);
- `onnx`: ONNX op type -> the layer's design config, for the import: a dict (that config), or a function
  of the node's attributes giving the config, or None where these attributes are not this layer's;
- `burn`: how Burn names and builds it (`Burn(module, config, device, call, extra_imports)`), for the Rust
  export; None: the Rust export refuses the layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..shapes.dims import as_dim
from ..shapes.rules import Ctx, RuleResult, Shape

__all__ = ["Burn", "LayerSpec", "declare", "spec_of", "layer_specs", "has_rule", "infer"]


@dataclass(frozen=True)
class Burn:
    """Where a layer lives in Burn and how it is built and called (the Rust export's template)."""

    module: str = ""  # the path under burn::nn where the type lives ("" for burn::nn itself)
    config: bool = True  # built from a `…Config` (else `Type::new()`)
    device: bool = True  # `init(device)` (else `init()`)
    call: str = "{m}.forward({x})"
    extra_imports: tuple = ()


@dataclass(frozen=True)
class LayerSpec:
    shape: Callable | None = None
    category: str | None = None
    call: str | None = None
    activation: bool = False
    onnx: dict = field(default_factory=dict)
    burn: Burn | None = None


_SPECS: dict[type, LayerSpec] = {}


def declare(*classes: type, **fields) -> None:
    """Declare these fields of the layers' specs (a later declaration adds to an earlier one)."""
    unknown = set(fields) - set(LayerSpec.__dataclass_fields__)
    if unknown:
        raise TypeError(f"declare(): unknown field(s) {sorted(unknown)}; a layer declares "
                        f"{', '.join(LayerSpec.__dataclass_fields__)}")
    for cls in classes:
        _SPECS[cls] = replace(_SPECS.get(cls, LayerSpec()), **fields)


def spec_of(cls: type) -> LayerSpec:
    """The declarations of exactly this class (an empty spec where it declares nothing)."""
    return _SPECS.get(cls, LayerSpec())


def layer_specs() -> dict:
    """Every declared class and its spec (a copy)."""
    return dict(_SPECS)


def _rule(module):
    for c in type(module).__mro__:
        spec = _SPECS.get(c)
        if spec is not None and spec.shape is not None:
            return spec.shape
    return None


def has_rule(module) -> bool:
    """Whether the module's class (or a base) declares a shape rule."""
    return _rule(module) is not None


def infer(module, inputs: list) -> RuleResult:
    """The output shape of `module.forward(*inputs)` and the constraints on the inputs (`inputs`: `Shape`s)."""
    fn = _rule(module)
    if fn is None:
        raise KeyError(f"no shape rule for {type(module).__name__}")
    ctx = Ctx()
    shape = fn(module, list(inputs), ctx)
    return RuleResult(Shape(tuple(as_dim(d) for d in shape.dims), shape.dtype), ctx.constraints)
