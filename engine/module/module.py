"""The Module base class: structure queries, visitors and mappers, and transitions.

What a field is and which children a node has is decided in one place, `engine.module.tree`
(`kind_of`, `children`, `walk`); everything here is built on it.

A module is a subclass of `Module` whose instance attributes are its fields, in the order they
were first assigned (names starting with `_` are private and never fields):

    class Mlp(Module):
        def __init__(self, device=None):
            self.linear = Linear(...)          # a child module
            self.scale = Param(Tensor.ones([4], device=device))   # a parameter
            self.table = Tensor.arange(4)      # a constant: recreated with the module
            self.blocks = [Block(), Block()]   # a list (tuple, dict) of children
            self.norm = None                   # an absent optional child
            self.d_model = 4                   # a plain attribute (int, float, str, enum, ...)

Modules, `Param`s, `Flag`s, constant `Tensor`s, lists / tuples / dicts holding them, and None
are traversed; anything else is a plain attribute, copied as it is.

Paths (burnpack names): field names joined with '.', list / tuple elements by index, dict
entries by key; an optional child (None or a module) adds no segment of its own; a parameter's
reparameterization adds its name (`weight.lora.a`).

Transitions (`clone`, `map`, `to_device`, `fork`, `train`, `valid`, `no_grad`,
`set_require_grad`, `freeze`, `unfreeze` and the `_group` variants) return a new module of the
same class, built without calling `__init__`: every field is carried over, traversed children
transformed; the receiver is left usable and unchanged. Parameters are immutable and shared
between the receiver and the result as Burn's clones share them (the same id, the same value
or lazy state).

Training behaviour owned by a module (dropout, batch-norm running statistics, noise) is a
`Flag` field, e.g. `self.training = Flag(True)`, read in `forward` with `if self.training:`.
Flags are the generic mechanism: `valid()` turns every flag off and keeps its configured value,
`train()` restores it, `freeze()` / `unfreeze()` (and `freeze_group` / `unfreeze_group`)
configure it persistently, `no_grad()` / `set_require_grad()` leave it alone. A module that
needs more than a flag (say, a cached mask to drop) may override `on_training_change(self,
enabled) -> Module` which every transition calls on the rebuilt module with whether its flags
are now on; the default returns the module unchanged.

Display: `str(module)` renders as Burn does; override `custom_settings(self)` and
`custom_content(self, content)` to customize (see `engine.module.display`).
"""
from __future__ import annotations

import math
from collections.abc import Iterator

from ..tensor import Device, Tensor
from .display import DisplaySettings, default_content, format_module
from .flag import Flag
from .group import ParamGroup
from .param import Param
from .tree import _KIND_OF_TYPE, FieldKind, ModuleBase, children, container_type, fields, join, kind_of, reparameterization_name

__all__ = ["Module"]

def _copy_plain(v):
    # Plain mutable containers are copied so that the result and the receiver never alias them
    # (Rust's clone copies a Vec<usize> field).
    if type(v) is list:
        return list(v)
    if type(v) is dict:
        return dict(v)
    if type(v) is set:
        return set(v)
    return v


def _rebuild_seq(v, items):
    if isinstance(v, list):
        return type(v)(items) if type(v) is not list else items
    if hasattr(v, "_fields"):  # a namedtuple
        return type(v)(*items)
    return type(v)(items) if type(v) is not tuple else tuple(items)


# ---------------------------------------------------------------------------------- walking
class _Walker:
    """One traversal: keeps the path, transforms (or only reads) params, flags, constants."""

    rebuild = True
    skips_stored_base = False  # see _walk_param

    def __init__(self):
        self.path: list[str] = []
        self.tied: dict = {}  # param id -> what this walk made of it (see _walk_param)

    def enter(self, name: str, container_type: str) -> None:
        self.path.append(name)

    def exit(self, name: str, container_type: str) -> None:
        self.path.pop()

    def path_str(self) -> str:
        return ".".join(self.path)

    def on_param(self, p: Param):  # must keep p.reparameterization as it is
        return p.clone()

    def on_flag(self, f: Flag):
        return f

    def on_const(self, t: Tensor):
        return t

    def on_module(self, old: "Module", new: "Module"):
        return new


_PLAIN, _NONE, _MODULE, _PARAM = FieldKind.PLAIN, FieldKind.NONE, FieldKind.MODULE, FieldKind.PARAM
_FLAG, _CONSTANT, _CONTAINER = FieldKind.FLAG, FieldKind.CONSTANT, FieldKind.CONTAINER


_STRUCT_OF_TYPE: dict[type, str] = {}  # a module class -> its container_type ("Struct:<ClassName>")


def _walk_module(m: "Module", w: _Walker):
    rebuild = w.rebuild
    new = object.__new__(type(m)) if rebuild else None
    nd = new.__dict__ if rebuild else None
    ct = _STRUCT_OF_TYPE.get(type(m))
    if ct is None:
        ct = container_type(m)
        if isinstance(m, ModuleBase):
            _STRUCT_OF_TYPE[type(m)] = ct
    kind_of_type = _KIND_OF_TYPE.get
    for name, v in list(m.__dict__.items()):
        if name[:1] == "_" or v is None:  # private, or an absent child (a Linear without bias): kept as is
            if rebuild:
                nd[name] = v
            continue
        # the common kinds inline, as _walk_value does them: a plain int / float / str (a type kind_of
        # caches as PLAIN is immutable: kept as is), a child module, a parameter
        k = kind_of_type(type(v))
        if k is _PLAIN:
            r = v
        elif k is _MODULE or k is _PARAM:
            w.enter(name, ct)
            r = _walk_module(v, w) if k is _MODULE else _walk_param(v, w)
            w.exit(name, ct)
        else:
            r = _walk_value(v, name, ct, w)
        if rebuild:
            nd[name] = r
    return w.on_module(m, new) if rebuild else None


def _walk_value(v, name: str, ct: str, w: _Walker):
    k = kind_of(v)
    if k is _PLAIN:
        return _copy_plain(v) if w.rebuild else None
    if k is _NONE:
        return None
    if k is _CONSTANT:
        return w.on_const(v)
    # no try/finally around enter/exit: an exception abandons the whole walk (and its path)
    w.enter(name, ct)
    if k is _MODULE:
        out = _walk_module(v, w)
    elif k is _PARAM:
        out = _walk_param(v, w)
    elif k is _FLAG:
        out = w.on_flag(v)
    elif not isinstance(v, dict):
        ct2 = container_type(v)
        items = [_walk_value(x, str(i), ct2, w) for i, x in enumerate(v)]
        out = _rebuild_seq(v, items) if w.rebuild else None
    else:
        items = {key: _walk_value(x, str(key), "Map", w) for key, x in v.items()}
        out = type(v)(items) if w.rebuild else None
    w.exit(name, ct)
    return out


def _walk_param(p: Param, w: _Walker):
    # a parameter held at several places (tied: the same id, as the shared A factor of a fused module's
    # parts) is one parameter: walked at its first place only, every other place gets that result (a
    # mapper maps it once, an optimizer steps it once, a visitor and a record see it once)
    if p.id in w.tied:
        return w.tied[p.id]
    out = _walk_param_once(p, w)
    w.tied[p.id] = out
    return out


def _walk_param_once(p: Param, w: _Walker):
    r = p.reparameterization
    if r is not None and w.skips_stored_base and getattr(r, "STORES_BASE", False):
        # the reparameterization holds the real base (QLoRA's packed weight); the param's own
        # base is a placeholder that visitors, mappers, records and optimizers never see
        newp = p
    else:
        newp = w.on_param(p)
    if r is None:
        return newp
    rname = reparameterization_name(r)
    w.enter(rname, "Reparameterization")
    try:
        nr = _walk_module(r, w)
    finally:
        w.exit(rname, "Reparameterization")
    if w.rebuild:
        if not isinstance(newp, Param):
            return newp
        return newp._derive(reparameterization=nr)
    return None


class _Apply(_Walker):
    """A transition: functions for params, flags and constants, optionally limited to a group.

    `floats_only`: the param function applies to float parameters only (others are cloned).
    """

    def __init__(self, param=None, flag=None, const=None, group: ParamGroup | None = None,
                 floats_only: bool = False, training=None):
        super().__init__()
        self.fp = param
        self.ff = flag
        self.fc = const
        self.group = group
        self.floats_only = floats_only
        self.training = training  # None, or the value given to on_training_change

    def _selected(self, item) -> bool:
        g = self.group
        return g is None or g.matches(item.id, self.path_str())

    def on_param(self, p):
        fp, g = self.fp, self.group
        if fp is None or (self.floats_only and p.kind != "float"):
            return p.clone()
        if g is not None and not g.matches(p.id, ".".join(self.path)):  # `_selected`, inline: once a parameter
            return p.clone()
        return fp(p)

    def on_flag(self, f):
        ff = self.ff
        if ff is None or not self._selected(f):
            return f.clone()
        return ff(f)

    def on_const(self, t):
        return t if self.fc is None else self.fc(t)

    def on_module(self, old, new):
        """Call the module's on_training_change after a transition that changes training state:
        valid() passes False, train() True, freeze/unfreeze whether the module's own flags are on
        (modules without flags are not called for those)."""
        t = self.training
        if t is None:
            return new
        value = _flags_on(new) if t is _Deferred else t
        if t is _Deferred and value is None:
            return new
        out = new.on_training_change(value)
        if not isinstance(out, Module):
            raise TypeError(
                f"{type(old).__name__}.on_training_change must return a Module, it returned {type(out).__name__}"
            )
        return out


class _MapWalker(_Walker):
    skips_stored_base = True

    def __init__(self, mapper):
        super().__init__()
        self.mapper = mapper

    def enter(self, name, ct):
        self.path.append(name)
        self.mapper.enter_module(name, ct)

    def exit(self, name, ct):
        self.mapper.exit_module(name, ct)
        self.path.pop()

    def on_param(self, p):
        view = p if p.reparameterization is None else p.without_reparameterization()
        kind = p.kind
        fn = self.mapper.map_float if kind == "float" else (self.mapper.map_int if kind == "int" else self.mapper.map_bool)
        out = fn(view)
        if not isinstance(out, Param):
            raise TypeError(
                f"{type(self.mapper).__name__}.map_{kind} must return a Param, it returned "
                f"{type(out).__name__} (at '{self.path_str()}')"
            )
        if p.is_running_state() and not out.is_running_state():
            out = out.as_running_state()  # a mapper (a loader, an optimizer) cannot make it trainable
        return out

    def on_flag(self, f):
        out = self.mapper.map_flag(f)
        if not isinstance(out, Flag):
            raise TypeError(
                f"{type(self.mapper).__name__}.map_flag must return a Flag, it returned {type(out).__name__} "
                f"(at '{self.path_str()}')"
            )
        return out


class _VisitWalker(_Walker):
    rebuild = False
    skips_stored_base = True

    def __init__(self, visitor):
        super().__init__()
        self.visitor = visitor

    def enter(self, name, ct):
        self.path.append(name)
        self.visitor.enter_module(name, ct)

    def exit(self, name, ct):
        self.visitor.exit_module(name, ct)
        self.path.pop()

    def on_param(self, p):
        view = p if p.reparameterization is None else p.without_reparameterization()
        kind = p.kind
        v = self.visitor
        (v.visit_float if kind == "float" else (v.visit_int if kind == "int" else v.visit_bool))(view)

    def on_flag(self, f):
        self.visitor.visit_flag(f)

    def on_const(self, t):
        return None


class _Collect(_Walker):
    """Reads params / flags / constants with their paths (no rebuild)."""

    rebuild = False

    def __init__(self, params=None, flags=None, consts=None):
        super().__init__()
        self.fp, self.ff, self.fc = params, flags, consts

    def on_param(self, p):
        if self.fp is not None:
            self.fp(self.path_str(), p)

    def on_flag(self, f):
        if self.ff is not None:
            self.ff(self.path_str(), f)

    def on_const(self, t):
        if self.fc is not None:
            self.fc(t)


class _Count(_Walker):
    """Sums the parameters' element counts (no paths made, no rebuild, nothing initialized)."""

    rebuild = False

    def __init__(self):
        super().__init__()
        self.total = 0

    def on_param(self, p):
        self.total += math.prod(p.lazy_shape())

    def on_flag(self, f):
        pass


# ---------------------------------------------------------------------------------- Module
class Module(ModuleBase):
    """Base class of every module; see this file's docstring for fields, paths and flags."""

    # ---------------------------------------------------------------- structure
    def named_fields(self) -> list[tuple[str, object]]:
        """Every field (traversed children and plain attributes) in assignment order."""
        return [(name, v) for name, _, v in fields(self)]

    def named_children(self) -> list[tuple[str, object]]:
        """The traversed fields: modules, params, flags, constants, containers of them."""
        return [(name, v) for name, _, v in children(self)]

    def named_params(self) -> list[tuple[str, Param]]:
        """`(path, param)` for every parameter in traversal order (float, int and bool).

        A reparameterized parameter appears as its base (a Param without reparameterization) at
        its own path, followed by the reparameterization's parameters (`weight.lora.a`, ...).
        """
        out: list[tuple[str, Param]] = []

        def add(path, p):
            out.append((path, p if p.reparameterization is None else p.without_reparameterization()))

        _walk_module(self, _Collect(params=add))
        return out

    def params(self) -> list[Param]:
        return [p for _, p in self.named_params()]

    def named_flags(self) -> list[tuple[str, Flag]]:
        """`(path, flag)` for every module-owned training flag."""
        out: list[tuple[str, Flag]] = []
        _walk_module(self, _Collect(flags=lambda path, f: out.append((path, f))))
        return out

    def named_modules(self) -> Iterator[tuple[str, "Module"]]:
        """`(path, module)` for this module (path "") and every descendant module, depth first."""
        stack = [("", self)]
        while stack:
            path, obj = stack.pop()
            if isinstance(obj, Module):
                yield path, obj
            kids = [(join(path, name), v) for name, k, v in children(obj)
                    if k is not _FLAG and k is not _CONSTANT and (k is not _PARAM or v.reparameterization is not None)]
            kids.reverse()
            stack.extend(kids)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def get_child(self, path: str):
        """The value at `path` (a module, param, flag, constant, list, ...); KeyError if none."""
        obj = self
        if path == "":
            return obj
        walked = []
        for seg in path.split("."):
            found = _MISSING
            for name, _, v in children(obj):
                if name == seg:
                    found = v
                    break
            if found is _MISSING:
                where = ".".join(walked) or type(self).__name__
                raise KeyError(f"no child '{seg}' under '{where}' (path '{path}')")
            walked.append(seg)
            obj = found
        return obj

    def set_child(self, path: str, value) -> None:
        """Replace the value at `path` in place, like assigning the field (`model.a.b = value`)."""
        parent_path, _, last = path.rpartition(".")
        parent = self.get_child(parent_path) if parent_path else self
        _assign(parent, last, value, path)

    def with_child(self, path: str, value) -> "Module":
        """A new module with `value` at `path`; the receiver is unchanged (modules along the path
        are shallow-copied, everything else is shared)."""
        if not path:
            raise KeyError("with_child: the path must not be empty")
        segs = path.split(".")

        def rebuild(obj, i):
            seg = segs[i]
            child = self_child(obj, seg, i)
            new_child = value if i == len(segs) - 1 else rebuild(child, i + 1)
            return _replaced(obj, seg, new_child, path)

        def self_child(obj, seg, i):
            for name, _, v in children(obj):
                if name == seg:
                    return v
            if i == len(segs) - 1 and isinstance(obj, Module) and seg in obj.__dict__:
                return obj.__dict__[seg]
            raise KeyError(f"no child '{seg}' at '{'.'.join(segs[:i]) or type(self).__name__}' (path '{path}')")

        return rebuild(self, 0)

    # ---------------------------------------------------------------- visitors, counts
    def visit(self, visitor):
        """Call the visitor on every parameter (and flag) in traversal order; returns the visitor."""
        _walk_module(self, _VisitWalker(visitor))
        return visitor

    def map(self, mapper) -> "Module":
        """A module whose parameters are the mapper's results."""
        return _walk_module(self, _MapWalker(mapper))

    def num_params(self) -> int:
        """The number of parameter elements (never initializes a lazy parameter)."""
        counter = _Count()
        _walk_module(self, counter)
        return counter.total

    def devices(self) -> list[Device]:
        """The devices of the parameters and constants, in traversal order, without repeats
        (a lazy parameter reports the device it will be initialized on)."""
        out: list[Device] = []

        def add_dev(d):
            if d not in out:
                out.append(d)

        _walk_module(self, _Collect(params=lambda _, p: add_dev(p.lazy_device()), consts=lambda t: add_dev(t.device)))
        return out

    # ---------------------------------------------------------------- transitions
    def clone(self) -> "Module":
        """A new module sharing parameter state (ids, values, lazy initialization) like Burn's clone."""
        return _walk_module(self, _Apply(param=Param.clone, flag=Flag.clone))

    def to_device(self, device) -> "Module":
        """Parameters and constants on `device`; initialized parameters' transfers are recorded
        so gradients flow back to the source parameters (which stay the ones to optimize)."""
        dst = Device(device)
        return _walk_module(self, _Apply(param=lambda p: p._to_device_base(dst), const=lambda t: t.to_device(dst)))

    def fork(self, device) -> "Module":
        """Parameters and constants on `device`, parameters detached with their gradient
        retention restored: a module to optimize on the destination."""
        dst = Device(device)
        return _walk_module(self, _Apply(param=lambda p: p._fork_base(dst), const=lambda t: t.to_device(dst)))

    def valid(self) -> "Module":
        """Autodiff and training flags off; their configured state is kept for `train()`."""
        return _walk_module(self, _Apply(param=Param._valid_base, flag=Flag.valid, const=Tensor.inner, training=False))

    def train(self) -> "Module":
        """Autodiff on, configured trainability and training flags restored (an explicit
        `no_grad()` or `freeze()` stays in force)."""
        return _walk_module(self, _Apply(param=Param._train_base, flag=Flag.train, const=_autodiff_const, training=True))

    def no_grad(self) -> "Module":
        """Float parameters stop retaining gradients (flags untouched)."""
        return self.set_require_grad(False)

    def set_require_grad(self, flag: bool) -> "Module":
        """Configure whether float parameters retain gradients; applied now where autodiff is
        on, and by `train()` otherwise. Training flags are untouched."""
        flag = bool(flag)
        return _walk_module(self, _Apply(param=_setter(flag), floats_only=True))

    def freeze(self) -> "Module":
        """No gradients for float parameters and every training flag off, persistently."""
        return self._configure(False, None)

    def unfreeze(self) -> "Module":
        """Float parameters trainable and every training flag configured on."""
        return self._configure(True, None)

    def no_grad_group(self, group: ParamGroup) -> "Module":
        return self.set_require_grad_group(group, False)

    def set_require_grad_group(self, group: ParamGroup, flag: bool) -> "Module":
        flag = bool(flag)
        return _walk_module(self, _Apply(param=_setter(flag), group=_group(group), floats_only=True))

    def freeze_group(self, group: ParamGroup) -> "Module":
        return self._configure(False, _group(group))

    def unfreeze_group(self, group: ParamGroup) -> "Module":
        return self._configure(True, _group(group))

    def _configure(self, on: bool, group):
        def flag_fn(f):
            return f.with_value(on)

        return _walk_module(self, _Apply(param=_setter(on), flag=flag_fn, group=group,
                                         floats_only=True, training=_Deferred))

    def on_training_change(self, enabled) -> "Module":
        """Hook called on the rebuilt module by valid() (False), train() (True), freeze(),
        unfreeze() and their group variants; returns the module to use. Default: unchanged."""
        return self

    # ---------------------------------------------------------------- records, reparameterization
    # engine.store (records) and reparam.py / lora.py are built on this class, so they are
    # imported when called (the import-linter contract lists the engine.store one as an exception).
    def into_record(self):
        """The module's parameters as a `ModuleRecord` (engine.store)."""
        from ..store.module_io import into_record

        return into_record(self)

    def into_record_group(self, group: ParamGroup):
        from ..store.module_io import into_record_group

        return into_record_group(self, group)

    def load_record(self, record) -> "Module":
        from ..store.module_io import load_record

        return load_record(self, record)

    def apply_reparameterization(self, reparameterizer) -> "Module":
        from .reparam import apply_reparameterization

        return apply_reparameterization(self, reparameterizer)

    def apply_lora(self, lora) -> "Module":
        from .lora import apply_lora

        return apply_lora(self, lora)

    def apply_qlora(self, qlora) -> "Module":
        from .lora import apply_qlora

        return apply_qlora(self, qlora)

    def materialize(self) -> "Module":
        from .reparam import materialize

        return materialize(self)

    def detach_reparameterization(self, group=None) -> "Module":
        """The module without the reparameterizations (LoRA adapters) of the parameters in `group`
        (default: all): their bases stay, as they are; nothing else changes."""
        from .reparam import detach_reparameterization

        return detach_reparameterization(self, group)

    # ---------------------------------------------------------------- display
    def custom_settings(self):
        """Override to return `DisplaySettings` for this module and its children (or None)."""
        return None

    def custom_content(self, content):
        """Override to return the `Content` to display (or None for the default: every field)."""
        return None

    def content(self, content):
        """The default content: every field, children formatted, plain attributes as Rust's Debug."""
        return default_content(self, content)

    def format(self, settings=None) -> str:
        """The display with the given `DisplaySettings` (defaults when None)."""
        return format_module(self, DisplaySettings() if settings is None else settings)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return self.format()


class _DeferredType:
    """Marker: freeze/unfreeze call on_training_change with whether the module's flags are on."""


_Deferred = _DeferredType()
_MISSING = object()


def _setter(flag: bool):
    """The per-parameter function of the trainability setters: running state is passed over
    (it is never trainable, whatever a setter, group or `unfreeze()` asks)."""
    def apply(p: Param) -> Param:
        return p.clone() if p.is_running_state() else p.set_require_grad(flag)

    return apply


def _autodiff_const(t: Tensor) -> Tensor:
    return t if t.is_autodiff() else t.autodiff()


def _group(group) -> ParamGroup:
    if not isinstance(group, ParamGroup):
        raise TypeError(f"expected a ParamGroup, got {type(group).__name__}")
    return group


def _flags_on(module: Module):
    """Whether the module's own flags are on (None when it has none)."""
    states = [bool(v) for name, v in module.__dict__.items() if name[:1] != "_" and isinstance(v, Flag)]
    return None if not states else any(states)


def _assign(parent, seg: str, value, path: str) -> None:
    if isinstance(parent, Module):
        if seg[:1] == "_":
            raise KeyError(f"set_child: '{seg}' is private, not a field (path '{path}')")
        setattr(parent, seg, value)
    elif isinstance(parent, list):
        parent[int(seg)] = value
    elif isinstance(parent, dict):
        key = next((k for k in parent if str(k) == seg), seg)
        parent[key] = value
    else:
        raise KeyError(f"set_child: cannot assign into a {type(parent).__name__} at '{path}'")


def _replaced(obj, seg: str, value, path: str):
    if isinstance(obj, Module):
        new = object.__new__(type(obj))
        new.__dict__.update(obj.__dict__)
        new.__dict__[seg] = value
        return new
    if isinstance(obj, (list, tuple)):
        items = list(obj)
        items[int(seg)] = value
        return _rebuild_seq(obj, items)
    if isinstance(obj, dict):
        new = type(obj)(obj)
        key = next((k for k in obj if str(k) == seg), seg)
        new[key] = value
        return new
    raise KeyError(f"with_child: cannot replace inside a {type(obj).__name__} at '{path}'")
