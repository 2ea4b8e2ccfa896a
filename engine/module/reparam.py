"""Reparameterization: change how a parameter's effective value is computed, not the model.

A `Reparameterizer` is offered every float parameter of a module with its path
(`reparameterize(path, param) -> (base_param, reparameterization or None)`). It decides which
parameters to transform, prepares their structural bases (freezing, packing, ...) and may attach
a `Reparameterization`: a regular `Module` whose `apply(base) -> Tensor` computes the value
`Param.val()` returns. Because it is a module attached to the parameter, its own parameters take
part in visitors, mappers, optimizers, records, device moves and autodiff, at paths below the
parameter's: `<param path>.<NAME>.<field>` (`fc1.weight.lora.a`). `Param.base()` is the stored
base, `Param.val()` the materialized value.

    model = model.apply_reparameterization(MyReparameterizer())
    model = model.apply_lora(Lora(8, 16.0))           # engine.module.lora
    merged = model.materialize()                       # plain weights, no structure

Reparameterizations are not nested: applying one to a module that already holds
reparameterized parameters is refused with a `ReparameterizationError` naming them.
`materialize()` folds every reparameterization into a plain parameter (same id, the base's
configured trainability, the value detached from the factors' graph); the receiver keeps its
reparameterizations, parameters without one are left as they are (lazy ones stay lazy).

The `Module` methods `apply_reparameterization` and `materialize` delegate to the functions of
the same names here, `apply_lora` and `apply_qlora` to those in `engine.module.lora`.
"""
from __future__ import annotations

from collections.abc import Iterator

from ..tensor import Tensor
from .module import Module
from .param import Param
from .tree import params
from .visitor import ModuleMapper

__all__ = [
    "Reparameterization",
    "ReparameterizationError",
    "Reparameterizer",
    "adapters_of",
    "apply_reparameterization",
    "detach_reparameterization",
    "detached_param",
    "iter_param_slots",
    "materialize",
]


class ReparameterizationError(ValueError):
    """A reparameterization cannot be applied: nesting, or a reparameterizer broke its contract."""


class Reparameterization(Module):
    """The state attached to a parameter; `apply(base)` computes its effective value.

    Subclass it as any module (its `Param` fields are trained, saved and moved with the model)
    and set `NAME`, the path segment its parameters appear under (`weight.<NAME>.<field>`).
    """

    NAME: str = ""

    def apply(self, base: Tensor) -> Tensor:
        """The effective value computed from the stored base tensor."""
        raise NotImplementedError(f"{type(self).__name__}.apply(base) is not implemented")

    # A Reparameterization has no forward pass of its own; `apply` is its computation.


class Reparameterizer:
    """Decides, for every float parameter, its structural base and optional reparameterization.

    `FREEZES_RUNNING_STATE`: when True (LoRA and QLoRA), the training flags of every module
    that owns running state (BatchNorm's statistics) are frozen as well, so that training
    changes only what the reparameterizations hold and an adapter-only record loses nothing.
    """

    FREEZES_RUNNING_STATE: bool = False

    def reparameterize(self, path: str, param: Param) -> tuple[Param, Reparameterization | None]:
        """Return `(base_param, reparameterization or None)` for the float parameter at `path`.

        The default leaves every parameter unchanged and attaches nothing.
        """
        return param, None


# ---------------------------------------------------------------------------------- walking
def iter_param_slots(module: Module, skip=None) -> Iterator[tuple[str, Param]]:
    """`(path, param)` for every parameter as it is stored in the tree (with its
    reparameterization attached), followed by the parameters of that reparameterization.

    `skip(module) -> bool` prunes modules (inside reparameterizations too). Never initializes.
    """
    prune = None if skip is None else (lambda v: isinstance(v, Module) and skip(v))
    return params(module, prune=prune)


def adapters_of(module: Module) -> dict:
    """{path: reparameterization} of the parameters that carry an adapter (LoRA, DoRA, QLoRA, ...):
    a reparameterization that is only a stored base (`TAKES_ADAPTER`: a GGUF weight kept in its
    quantized blocks) is the parameter's base, not an adapter, and is left out."""
    return {path: p.reparameterization for path, p in iter_param_slots(module)
            if p.reparameterization is not None and not getattr(p.reparameterization, "TAKES_ADAPTER", False)}


def _reparameterized(module: Module) -> list[tuple[str, Param]]:
    return [(path, p) for path, p in iter_param_slots(module) if p.reparameterization is not None]


def _below(path: str, owners) -> bool:
    """Whether `path` lies below one of `owners` (paths): one of its dot-prefixes is one of them."""
    i = path.rfind(".")
    while i > 0:
        if path[:i] in owners:
            return True
        i = path.rfind(".", 0, i)
    return False


# ---------------------------------------------------------------------------------- applying
class _ApplyReparameterization(ModuleMapper):
    """A module mapper that offers every float parameter, with its path, to a reparameterizer."""

    def __init__(self, reparameterizer, stateful=frozenset(), attached=None):
        self.reparameterizer = reparameterizer
        self.attached = attached or {}  # path -> Param of the parameters that already have one
        self.path: list[str] = []
        self.stateful = stateful  # paths of the modules whose training flags freeze

    def map_flag(self, flag):
        if ".".join(self.path[:-1]) in self.stateful:
            return flag.with_value(False)
        return flag

    def enter_module(self, name, container_type):
        self.path.append(name)

    def exit_module(self, name, container_type):
        self.path.pop()

    def map_float(self, param: Param) -> Param:
        path = ".".join(self.path)
        name = type(self.reparameterizer).__name__
        if self.attached and _below(path, self.attached):  # a factor of an attached reparameterization: as it is
            return param
        out = self.reparameterizer.reparameterize(path, param)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ReparameterizationError(
                f"{name}.reparameterize must return (base_param, reparameterization or None), it returned "
                f"{type(out).__name__} for '{path}'"
            )
        base, r = out
        if not isinstance(base, Param):
            raise ReparameterizationError(
                f"{name}.reparameterize must return a Param as the base, it returned {type(base).__name__} "
                f"for '{path}'"
            )
        if base.kind != "float" or base.rank != param.rank:
            raise ReparameterizationError(
                f"{name}.reparameterize must return a float base of rank {param.rank} for '{path}', it "
                f"returned a {base.kind} base of dims {list(base.shape)}"
            )
        if base.reparameterization is not None:
            raise ReparameterizationError(
                f"{name}.reparameterize returned a base for '{path}' that already has a reparameterization "
                f"({type(base.reparameterization).__name__}); reparameterizations cannot be nested"
            )
        existing = self.attached.get(path)
        if existing is not None:
            if r is not None:
                raise ReparameterizationError(
                    f"{name}.reparameterize would attach a {type(r).__name__}, but reparameterizations cannot be "
                    f"nested and '{path}' ({type(existing.reparameterization).__name__}) already has one. Call "
                    f"detach_reparameterization() or materialize() first, or leave '{path}' out of the group"
                )
            return existing  # keeps its reparameterization (and its frozen base)
        if r is None:
            return base
        if not isinstance(r, Module) or not callable(getattr(r, "apply", None)):
            raise ReparameterizationError(
                f"{name}.reparameterize must return a Reparameterization (a Module with apply(base)) or None "
                f"for '{path}', it returned {type(r).__name__}"
            )
        inner = _reparameterized(r)
        if inner:
            raise ReparameterizationError(
                f"{name}.reparameterize returned a {type(r).__name__} for '{path}' whose own parameter "
                f"'{inner[0][0]}' is reparameterized; reparameterizations cannot be nested"
            )
        return base.with_reparameterization(r)


def apply_reparameterization(module: Module, reparameterizer) -> Module:
    """`module` with every float parameter passed through `reparameterizer` (see the module doc)."""
    if not isinstance(module, Module):
        raise TypeError(f"apply_reparameterization expects a Module, got {type(module).__name__}")
    if not callable(getattr(reparameterizer, "reparameterize", None)):
        raise TypeError(
            f"apply_reparameterization expects a Reparameterizer (an object with reparameterize(path, param)), "
            f"got {type(reparameterizer).__name__}"
        )
    bind = getattr(reparameterizer, "bound_to", None)
    if callable(bind):  # a LoRA learns which weights of this model share an `a` factor (engine.module.lora)
        reparameterizer = bind(module)
    slots = list(iter_param_slots(module))
    attached = {path: p for path, p in slots if p.reparameterization is not None}  # nesting: refused in map_float
    adapted = _adapt_stored_bases(module, reparameterizer, attached)
    if adapted is not module:
        module = adapted
        slots = list(iter_param_slots(module))
        attached = {path: p for path, p in slots if p.reparameterization is not None}
    stateful = frozenset()
    if getattr(reparameterizer, "FREEZES_RUNNING_STATE", False):
        stateful = frozenset(path.rpartition(".")[0] for path, p in slots if p.is_running_state())
    return module.map(_ApplyReparameterization(reparameterizer, stateful, attached))


def _adapt_stored_bases(module: Module, reparameterizer, attached: dict) -> Module:
    """`module` with the reparameterizer's adapter attached over each stored base that takes one.

    A reparameterization that is only a stored base (`TAKES_ADAPTER = True`: a GGUF weight kept in
    its quantized blocks) is no adapter of its own, so LoRA may go over it, as QLoRA's factors go
    over its NF4 weight: the reparameterizer is offered the parameter (its value is the stored
    base's), and the adapter it returns is combined with the base by `with_adapter(adapter)`."""
    out = module
    for path, p in attached.items():
        r = p.reparameterization
        if not getattr(r, "TAKES_ADAPTER", False):
            continue
        _base, adapter = reparameterizer.reparameterize(path, p)
        if adapter is not None:
            out = out.with_child(path, p.with_reparameterization(r.with_adapter(adapter)))
    return out


# ---------------------------------------------------------------------------------- detaching
def detached_param(param: Param) -> Param:
    """`param` without its reparameterization: the structural base, with the same id and the
    base's configured trainability (LoRA froze it: unfreeze it to train it again). A base the
    reparameterization stores itself (QLoRA's packed weight) comes back dequantized."""
    r = param.reparameterization
    if r is None:
        return param.clone()
    if not getattr(r, "STORES_BASE", False):
        return param.without_reparameterization()
    value = r.base().detach()
    value = value.autodiff() if param.is_autodiff() else value.inner()
    return Param.initialized(value, id=param.id, active=param.is_active())


def detach_reparameterization(module: Module, group=None) -> Module:
    """A module whose parameters in `group` (default: all) lose their reparameterization (the
    adapters are dropped, the bases kept); everything else, other adapters included, is kept.
    A group that selects no reparameterized parameter is refused (the detach would change nothing)."""
    if not isinstance(module, Module):
        raise TypeError(f"detach_reparameterization expects a Module, got {type(module).__name__}")
    selected = [(path, p) for path, p in _reparameterized(module) if group is None or group.matches(p.id, path)]
    if not selected:
        raise ReparameterizationError(
            f"detach_reparameterization: none of the selected parameters of this {type(module).__name__} has a "
            f"reparameterization (LoRA) attached")
    out = module.clone()
    for path, p in selected:
        out = out.with_child(path, detached_param(p))
    return out


# ---------------------------------------------------------------------------------- materializing
def materialized_param(param: Param) -> Param:
    """`param` with its reparameterization folded in: a plain parameter with the same id whose
    value is `param.val()` cut from the factors' graph, with the base's configured trainability
    and autodiff association."""
    if param.reparameterization is None:
        return param.clone()
    value = param.val().detach()
    active = param.is_active()
    if param.is_autodiff():
        value = value.autodiff()
        if active:
            value = value.set_require_grad(True)
    else:
        value = value.inner()
    return Param.initialized(value, id=param.id, active=active)


def materialize(module: Module) -> Module:
    """A module whose reparameterized parameters are plain weights (the receiver is unchanged)."""
    if not isinstance(module, Module):
        raise TypeError(f"materialize expects a Module, got {type(module).__name__}")
    out = module.clone()
    for path, p in _reparameterized(module):
        out = out.with_child(path, materialized_param(p))
    return out
