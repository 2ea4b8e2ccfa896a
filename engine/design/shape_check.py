"""The shape-only contract check: shapes flow through the module boundaries, no layer runs.

`check_shapes(root, inputs, contracts, modules)` is `engine.module.contracts.check` with one
difference: a module whose class has a shape rule (`engine.nn.spec.has_rule`: the built-in layers)
is not run; its rule gives the output's dims from the input's dims, reading only the layer's
settings and its parameters' *shapes*, so a lazy parameter stays unallocated. The output is a
stand-in tensor: the right dims and dtype over one zero broadcast to that shape (NumPy's
zero-stride view: no memory per element). A user module without a rule runs its own forward on
those stand-ins, so the glue between layers (`reshape`, `swap_dims`, `x + y`, a mask) runs on
tensors as small as the check input, never on a parameter.

What the check cannot see through it says, and stops there (`CheckResult.not_checked`, the
node's status `not checked`): a module without a rule whose forward reads its own parameters
while they are not allocated, and a layer whose rule gives only its main output (`Lstm`,
`BiLstm`, `BiGru` return a state too; `MultiHeadAttention` returns the attention weights and
takes separate key and value) while its parameters are not allocated; with allocated parameters
those run for real. `MultiHeadAttention` called on an `MhaInput` (query, key, value, masks) is
checked by its rule and gives both of its outputs, so a lazy decoder (llama-7b) is checked whole.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from engine.module import contracts
from engine.module.contracts import CheckResult, NotCheckable
from engine.module.tree import FieldKind, children
from engine.nn.attention import MhaInput, MhaOutput
from engine.tensor import Tensor, raw

from ..nn import spec as layer_spec
from ..shapes.rules import RuleError, Shape
from ..shapes.dims import as_dim

__all__ = ["check_shapes", "has_unallocated_params", "unallocated_bytes", "activation_bytes"]

# rules that describe the main output only: the real forward returns more, or takes more
MAIN_OUTPUT_ONLY = {"Lstm", "BiLstm", "BiGru", "MultiHeadAttention", "TransformerDecoder"}
_NP = {"float": np.float32, "int": np.int64, "bool": np.bool_}


def stand_in(dims: tuple[int, ...], kind: str, device) -> Tensor:
    """A tensor of `dims` that holds one value: a zero broadcast to the shape."""
    return raw.wrap(np.broadcast_to(np.zeros((), _NP[kind]), tuple(int(d) for d in dims)), device)


def tensors_in(value: Any, out: list, depth: int = 0) -> list:
    """The tensors in a forward's arguments, in order (inside lists, tuples and input objects
    such as `TransformerEncoderInput`)."""
    if depth > 4:
        return out
    if isinstance(value, Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            tensors_in(v, out, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            tensors_in(v, out, depth + 1)
    else:
        for v in contracts.input_fields(value):
            tensors_in(v, out, depth + 1)
    return out


def _own_lazy_params(module) -> list[str]:
    return [name for name, kind, value in children(module)
            if kind is FieldKind.PARAM and not value.is_initialized()]


def _int(d) -> int:
    d = as_dim(d)
    if not d.is_const():
        raise NotCheckable(f"a symbolic size {d} where a concrete one was expected")
    return int(d.value())


class ShapeRun(contracts.ModuleRun):
    def forward(self, module, original, args, kwargs, node):
        name = type(module).__name__
        where = f"{node.path or '(model)'} [{name}]"
        lazy = _own_lazy_params(module)
        if name == "MultiHeadAttention" and args and isinstance(args[0], MhaInput):
            return self._attention(module, args[0])
        if layer_spec.has_rule(module) and name not in MAIN_OUTPUT_ONLY:
            ins = tensors_in(list(args) + list(kwargs.values()), [])
            shapes = [Shape(tuple(as_dim(int(d)) for d in t.shape), t.kind) for t in ins]
            try:
                result = layer_spec.infer(module, shapes)
            except RuleError as e:
                raise contracts.ContractMismatch(str(e)) from None
            device = ins[0].device if ins else module.devices()[0]
            return stand_in(tuple(_int(d) for d in result.shape.dims), result.shape.dtype, device)
        if lazy:
            why = ("its shape rule gives only the main output" if layer_spec.has_rule(module)
                   else f"no shape rule for {name}")
            raise NotCheckable(f"{where}: not checked ({why}; its forward reads its own parameters "
                               f"{', '.join(lazy)}, which are not allocated)")
        try:
            return original(module, *args, **kwargs)
        except ValueError as e:
            if "read-only" in str(e):  # it wrote into a stand-in
                raise NotCheckable(f"{where}: not checked (its forward writes into its input; "
                                   f"no shape rule for {name})") from None
            raise


    def _attention(self, module, inp):
        """`MultiHeadAttention` on an `MhaInput`: both outputs (weights and context) from the rule."""
        ins = tensors_in(inp, [])
        shapes = [Shape(tuple(as_dim(int(d)) for d in t.shape), t.kind) for t in ins]
        try:
            context = layer_spec.infer(module, shapes).shape
        except RuleError as e:
            raise contracts.ContractMismatch(str(e)) from None
        device = ins[0].device
        batch, seq_1 = (_int(d) for d in context.dims[:2])
        weights = (batch, module.n_heads, seq_1, int(inp.key.shape[1]))
        return MhaOutput(stand_in(weights, "float", device),
                         stand_in(tuple(_int(d) for d in context.dims), context.dtype, device))


def check_shapes(root: Any, inputs: list[Any], contracts_by_path: dict, modules: list[tuple[str, Any]],
                 checkpoint: Callable[[], None] | None = None) -> CheckResult:
    """`contracts.check` with shape rules in place of the layers: no kernel of a layer runs and
    no parameter is allocated. `inputs` may be real tensors (only their dims and kind are used)."""
    stand_ins = [stand_in(t.shape, t.kind, t.device) if isinstance(t, Tensor) else t for t in inputs]
    result = contracts.check(root, stand_ins, contracts_by_path, modules, checkpoint, run_class=ShapeRun)
    result.shape_only = True
    return result


# ---- memory estimates ----------------------------------------------------------------------------
def _itemsize(p) -> int:
    return 8 if p.kind == "int" else (1 if p.kind == "bool" else 4)


def has_unallocated_params(module) -> bool:
    return any(not p.is_initialized() for _, p in module.named_params())


def unallocated_bytes(module, paths=None) -> int:
    """Bytes the parameters not yet allocated will take when they are (of `paths` only, if given)."""
    total = 0
    for path, p in module.named_params():
        if paths is not None and path not in paths:
            continue
        if not p.is_initialized():
            total += int(np.prod(p.shape, dtype=np.int64)) * _itemsize(p)
    return total


def activation_bytes(result: CheckResult) -> int:
    """What a full run's activations take, from a shape-only check's flow: every module's
    outputs, float32 (the tape keeps them for the backward pass of a training step too)."""
    total = 0
    for call in result.flow:
        for s in call.outputs:
            total += int(np.prod(s, dtype=np.int64)) * 4
    return total
