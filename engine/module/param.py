"""Parameters: a tensor with an identity, lazily initialized, with a configured trainability.

A `Param` holds:

- `id`: a `ParamId`, a random unsigned 64-bit integer that names the parameter in records and
  optimizer state. Every transition (clone, map, to_device, valid, ...) keeps it.
- its base tensor, or, until first use, a lazy state: the initializer, the device it will run
  on, the shape and kind. `shape`, `lazy_shape()`, `lazy_device()`, `kind` and
  `is_require_grad()` answer from the lazy state without initializing. `val()` / `base()`
  initialize on first use. Every Param derived from a lazy one (clones, `to_device`, `fork`,
  `valid`, `train`, copies) shares its lazy state, so the initializer runs once, on the device
  of the first Param that needs the value, and every other Param with that id gets the same
  values on its own device: one id never gives two different values (see "Lazy parameters and
  live clones" in docs/engine-guide.md).
- its configured trainability (Burn's `is_active`): whether the parameter should retain its
  gradient while autodiff is on. It survives `valid()` (which turns autodiff off) and is applied
  again by `train()`.
- `reparameterization`: None, or a module whose `apply(base)` gives the effective value
  (`val()`); see `engine.module.reparam`.
- whether it is running state (Burn's `RunningState`, e.g. BatchNorm's `running_mean`): saved
  in records and counted by `num_params`, but never trainable: no setter, group, mapper,
  optimizer or `unfreeze()` makes it require grad.

A Param never changes after construction: methods return new Params.
"""
from __future__ import annotations

import base64
import os
import random
import threading
import weakref

from ..tensor import Device, Tensor, TensorError
from ..tensor.device import as_device
from ..tensor.raw import array, op_of, wrap

__all__ = ["Param", "ParamId"]

# A private generator so that seeding Python's or a device's generator never repeats ids.
_ID_RNG = random.Random(int.from_bytes(os.urandom(16), "little"))
_INIT_LOCK = threading.RLock()


class ParamId:
    """A parameter id: an unsigned 64-bit integer, shown as 13 base32hex characters.

    `str(ParamId(123456)) == "83h0200000000"`: the 8 little-endian bytes in lowercase base32hex
    without padding, as Burn shows it. `ParamId()` draws a fresh random id.
    """

    __slots__ = ("_value",)

    def __init__(self, value: int | None = None):
        if value is None:
            value = _ID_RNG.getrandbits(64)
        elif isinstance(value, ParamId):
            value = value._value
        else:
            value = int(value)
            if not 0 <= value < 1 << 64:
                raise ValueError(f"ParamId: expected an unsigned 64-bit integer, got {value}")
        self._value = value

    def val(self) -> int:
        """The id as an int."""
        return self._value

    def __int__(self) -> int:
        return self._value

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def encode(self) -> str:
        return base64.b32hexencode(self._value.to_bytes(8, "little")).decode("ascii").rstrip("=").lower()

    @staticmethod
    def decode(text: str) -> "ParamId":
        """The id whose `str()` is `text` (13 base32hex characters)."""
        if not isinstance(text, str) or len(text) != 13:
            raise ValueError(f"ParamId.decode: expected 13 base32hex characters, got {text!r}")
        try:
            raw = base64.b32hexdecode(text.upper() + "===")
        except Exception:
            raise ValueError(f"ParamId.decode: {text!r} is not base32hex") from None
        return ParamId(int.from_bytes(raw, "little"))

    def __str__(self) -> str:
        return self.encode()

    def __repr__(self) -> str:
        return f"ParamId({self.encode()})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ParamId) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self):
        return (ParamId, (self._value,))


class _Lazy:
    """The lazy state shared by every Param derived from one `Param.uninitialized`.

    `device` is where it was created. The initializer runs once, on the device of the first
    Param that asks for the value (`initialize(device, ...)`); `ran_on` records that device and
    `default_dtype` its default float dtype at that moment, so that a Param on another device
    gets the same values converted as its own initializer would have made them.
    """

    __slots__ = ("init", "device", "shape", "kind", "value", "ran_on", "default_dtype", "itemsize")

    def __init__(self, init, device: Device, shape: tuple, kind: str, itemsize: int | None = None):
        self.init = init
        self.device = device
        self.shape = shape
        self.kind = kind
        self.itemsize = itemsize  # bytes per element the initializer will make, when it said so
        self.value: Tensor | None = None
        self.ran_on: Device | None = None
        self.default_dtype = None

    def initialize(self, device: Device, require_grad: bool) -> Tensor:
        if self.value is not None:
            return self.value
        with _INIT_LOCK:  # two threads reading one lazy parameter must not initialize it twice
            if self.value is None:
                self._run(device, require_grad)
        return self.value

    def _run(self, device: Device, require_grad: bool) -> None:
        t = self.init(device, require_grad)
        if not isinstance(t, Tensor):
            raise TypeError(f"a parameter initializer must return a Tensor, it returned {type(t).__name__}")
        if tuple(t.shape) != self.shape:
            raise TensorError(
                f"a parameter initializer returned dims {list(t.shape)}, expected {list(self.shape)} "
                f"(the shape given to Param.uninitialized)"
            )
        if t.device is not device:
            raise TensorError(f"a parameter initializer returned a tensor on {t.device}, expected {device}")
        self.ran_on = device
        self.default_dtype = device.default_float_dtype
        self.value = t
        self.init = None  # release the closure

    def value_on(self, device: Device) -> Tensor:
        """The initialized value as a Param on `device` holds it: the same tensor on the device it
        ran on; elsewhere a copy (never a recorded transfer), in `device`'s default float dtype
        when the initializer made the default dtype of the device it ran on."""
        t = self.value
        if device is self.ran_on:
            return t
        out = t.inner().to_device(device)  # a copy: devices never share memory
        target = device.default_float_dtype
        if self.kind == "float" and t.dtype == self.default_dtype and target != t.dtype:
            out = out.cast(target)
        return out


def _adapt(t: Tensor, autodiff: bool, require_grad: bool) -> Tensor:
    """`t` with the requested autodiff association and gradient retention (never mutates `t`)."""
    if not autodiff:
        if t.is_autodiff() or t.is_tracked():
            return t.inner()
        return t
    if require_grad:
        if t.is_require_grad():
            return t
        return wrap(array(t), t.device, True).set_require_grad(True)
    if t.is_require_grad():
        return wrap(array(t), t.device, True)
    if not t.is_autodiff():
        return t.autodiff()
    return t


def _view(t: Tensor, autodiff: bool, active: bool) -> Tensor:
    """The tensor a parameter shows: float tensors follow autodiff and trainability, others
    only the autodiff association."""
    if array(t).dtype.kind == "f":
        return _adapt(t, autodiff, active and autodiff)
    if autodiff:
        return t if t.is_autodiff() else t.autodiff()
    return t.inner() if t.is_autodiff() else t


_UNSET = object()


class Param:
    """A module parameter: an id, a (possibly lazy) tensor, and a configured trainability.

    `Param(tensor)` makes a trainable parameter (a float tensor retains its gradient).
    `Param.uninitialized(init, device, require_grad, shape)` defers `init(device, require_grad)`
    until the value is first needed.
    """

    __slots__ = ("id", "_value", "_lazy", "_dev", "_active", "_ad", "_state", "reparameterization", "__weakref__")

    def __init__(self, tensor: Tensor, id: ParamId | None = None, require_grad: bool | None = None):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"Param expects a Tensor, got {type(tensor).__name__}")
        is_float = array(tensor).dtype.kind == "f"
        active = is_float if require_grad is None else bool(require_grad)
        if active and not is_float:
            raise TensorError(f"Param: only float tensors can require grad, this one is {tensor.dtype}")
        self.id = ParamId() if id is None else ParamId(id)
        self._value = _adapt(tensor, True, active) if is_float else tensor
        self._lazy = None
        self._dev = None
        self._active = active
        self._ad = True
        self._state = False
        self.reparameterization = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def _make(cls, id, value, lazy, active, ad, reparameterization, dev=None, state=False) -> "Param":
        p = object.__new__(cls)
        p.id = id
        p._value = value
        p._lazy = lazy
        p._dev = (lazy.device if dev is None else dev) if lazy is not None else None
        p._active = active and not state
        p._ad = ad
        p._state = state
        p.reparameterization = reparameterization
        return p

    @classmethod
    def initialized(cls, tensor: Tensor, id: ParamId | None = None, active: bool | None = None) -> "Param":
        """A parameter holding `tensor` exactly as it is (its autodiff state untouched).

        `active` is the configured trainability; by default whether `tensor` retains its gradient
        (or, for a tensor without autodiff, whether it is a float tensor).
        """
        if not isinstance(tensor, Tensor):
            raise TypeError(f"Param.initialized expects a Tensor, got {type(tensor).__name__}")
        is_float = array(tensor).dtype.kind == "f"
        if active is None:
            active = tensor.is_require_grad() if tensor.is_autodiff() else is_float
        return cls._make(ParamId() if id is None else ParamId(id), tensor, None, bool(active) and is_float,
                         tensor.is_autodiff(), None)

    @classmethod
    def uninitialized(cls, init, device=None, require_grad: bool = True, shape=(), *, kind: str = "float",
                      id: ParamId | None = None, itemsize: int | None = None) -> "Param":
        """A lazy parameter: `init(device, require_grad) -> Tensor` runs on first use.

        `shape` (and `kind`: "float", "int" or "bool") describe the tensor `init` will return, so
        that counting, display and shape queries never initialize; `itemsize`, when given, its
        bytes per element (memory estimates otherwise assume the kind's widest: int64 for ints).
        """
        if not callable(init):
            raise TypeError(f"Param.uninitialized: init must be callable, got {type(init).__name__}")
        if kind not in ("float", "int", "bool"):
            raise ValueError(f"Param.uninitialized: kind must be 'float', 'int' or 'bool', got {kind!r}")
        try:
            dims = tuple(map(int, shape))
        except TypeError:
            raise TypeError(f"Param.uninitialized: shape must be a sequence of ints, got {shape!r}") from None
        active = bool(require_grad) and kind == "float"
        dev = device if type(device) is Device else as_device(device)
        lazy = _Lazy(init, dev, dims, kind, None if itemsize is None else int(itemsize))
        # a ParamId is immutable (copies are itself): one given is shared, not wrapped again
        pid = ParamId() if id is None else (id if type(id) is ParamId else ParamId(id))
        return cls._make(pid, None, lazy, active, True, None)

    # ------------------------------------------------------------------ values
    def val(self) -> Tensor:
        """The effective value: the base, through the reparameterization when there is one."""
        v = self._value
        r = self.reparameterization
        if r is None:
            return v if v is not None else self._materialize()
        if getattr(r, "STORES_BASE", False):
            return r.apply(None)  # the reparameterization holds the base (QLoRA's packed weight)
        return r.apply(v if v is not None else self._materialize())

    def base(self) -> Tensor:
        """The stored base tensor (initializing it if needed), without any reparameterization."""
        r = self.reparameterization
        if r is not None and getattr(r, "STORES_BASE", False):
            return r.base()
        v = self._value
        return v if v is not None else self._materialize()

    def _materialize(self) -> Tensor:
        lazy = self._lazy
        dev = self._dev
        lazy.initialize(dev, self._active and self._ad)
        t = _view(lazy.value_on(dev), self._ad, self._active)
        self._value = t
        self._lazy = None
        return t

    def is_initialized(self) -> bool:
        """Whether the value exists (this Param's, or one that another Param with the same lazy
        state made; reading it then runs no initializer)."""
        return self._value is not None or self._lazy.value is not None

    def lazy_state(self):
        """The initialization this parameter waits for (None after it initialized itself): an
        opaque token whose identity tells whether a parameter still waits for the same
        initializer as when it was made (`from_pretrained` records it, so a save copies a weight
        never read since from its file). Never initializes."""
        return self._lazy

    def lazy_itemsize(self) -> int | None:
        """Bytes per element of the value a lazy parameter's initializer will make, when it was
        given (`Param.uninitialized(..., itemsize=)`); None otherwise. Never initializes."""
        return self._lazy.itemsize if self._value is None and self._lazy is not None else None

    def lazy_shape(self) -> tuple[int, ...]:
        """The shape, without initializing."""
        v = self._value
        return tuple(v.shape) if v is not None else self._lazy.shape

    @property
    def shape(self) -> tuple[int, ...]:
        """The base's shape; never initializes."""
        return self.lazy_shape()

    def dims(self) -> tuple[int, ...]:
        return self.lazy_shape()

    @property
    def rank(self) -> int:
        return len(self.lazy_shape())

    def numel(self) -> int:
        n = 1
        for s in self.lazy_shape():
            n *= s
        return n

    def lazy_device(self) -> Device:
        """The device the parameter is on, or will be initialized on; never initializes."""
        v = self._value
        return v.device if v is not None else self._dev

    @property
    def device(self) -> Device:
        return self.lazy_device()

    @property
    def kind(self) -> str:
        """'float', 'int' or 'bool'; never initializes."""
        v = self._value
        return v.kind if v is not None else self._lazy.kind

    def is_require_grad(self) -> bool:
        """Whether the base retains its gradient now (lazily: whether it will)."""
        v = self._value
        if v is not None:
            return v.is_require_grad()
        return self._active and self._ad and self._lazy.kind == "float"

    def lazy_is_require_grad(self) -> bool:
        return self.is_require_grad()

    def is_autodiff(self) -> bool:
        v = self._value
        return v.is_autodiff() if v is not None else self._ad

    def is_active(self) -> bool:
        """The configured trainability, applied whenever autodiff is on (kept across valid())."""
        return self._active

    def is_running_state(self) -> bool:
        """Whether this is running state (e.g. BatchNorm's statistics): saved, counted, never trainable."""
        return self._state

    def as_running_state(self) -> "Param":
        """This parameter as running state: its gradient retention dropped, and no later setter,
        group, mapper, optimizer or `unfreeze()` can turn it on."""
        if self.kind != "float":
            raise TensorError(f"as_running_state: running state is a float tensor, this one is {self.kind}")
        v = self._value
        if v is not None and v.is_autodiff():
            v = _adapt(v, True, False)
        return Param._make(self.id, v, self._lazy, False, self._ad, self.reparameterization, self._dev, True)

    # ------------------------------------------------------------------ derived params
    def _derive(self, value=_UNSET, lazy=_UNSET, active=_UNSET, ad=_UNSET, reparameterization=_UNSET,
                dev=None) -> "Param":
        return Param._make(
            self.id,
            self._value if value is _UNSET else value,
            self._lazy if lazy is _UNSET else lazy,
            self._active if active is _UNSET else active,
            self._ad if ad is _UNSET else ad,
            self.reparameterization if reparameterization is _UNSET else reparameterization,
            self._dev if dev is None else dev,
            self._state,
        )

    def clone(self) -> "Param":
        """Same id, shared value or shared lazy state (like Burn's clone)."""
        return self._derive()

    def with_id(self, id: ParamId) -> "Param":
        """The same values under another id (a lazy one gets its own lazy state: values belong
        to an id)."""
        lazy = self._lazy
        if lazy is not None and lazy.value is None:
            lazy = _Lazy(lazy.init, self._dev, lazy.shape, lazy.kind, lazy.itemsize)
        elif lazy is not None:
            return Param._make(ParamId(id), self.base(), None, self._active, self._ad, self.reparameterization,
                               None, self._state)
        return Param._make(ParamId(id), self._value, lazy, self._active, self._ad, self.reparameterization,
                           self._dev, self._state)

    def with_reparameterization(self, reparameterization) -> "Param":
        return self._derive(reparameterization=reparameterization)

    def without_reparameterization(self) -> "Param":
        return self._derive(reparameterization=None)

    def map(self, fn) -> "Param":
        """A parameter with base `fn(base)`; keeps the id, the reparameterization and the
        configured trainability, which a later `train()` applies again: a value that `fn` left
        inside a graph (a clamp without `detach()`) becomes a leaf retaining its gradient there.
        Running state stays running state."""
        t = fn(self.base())
        if not isinstance(t, Tensor):
            raise TypeError(f"Param.map: the function must return a Tensor, it returned {type(t).__name__}")
        if self._state and t.is_require_grad():
            t = _adapt(t, True, False)
        return self._derive(value=t, lazy=None, ad=t.is_autodiff())

    def set_require_grad(self, flag: bool) -> "Param":
        """Configure trainability; applied now when autodiff is on, else at the next train().

        Running state (`is_running_state()`) is never trainable: `True` is refused for it here,
        and module-level setters (`set_require_grad`, `unfreeze`, groups) pass over it.
        """
        flag = bool(flag)
        if self.kind != "float":
            if flag:
                raise TensorError(f"set_require_grad: only float parameters have gradients, this one is {self.kind}")
            return self._derive()
        if self._state:
            if flag:
                raise TensorError(
                    "set_require_grad(True): this parameter is running state (like BatchNorm's running_mean), "
                    "which is saved but never trained"
                )
            return self._derive()
        if self._value is None:
            return self._derive(active=flag)
        t = self._value
        if t.is_autodiff():
            t = _adapt(t, True, flag)
        return self._derive(value=t, active=flag)

    def no_grad(self) -> "Param":
        return self.set_require_grad(False)

    # ------------------------------------------------------------------ transitions
    # Each public transition applies to the base and to the reparameterization module; the
    # `_..._base` forms leave the reparameterization object as it is (module traversal walks it
    # separately, with paths).
    def _reparam(self, method: str, *args):
        r = self.reparameterization
        return None if r is None else getattr(r, method)(*args)

    def to_device(self, device) -> "Param":
        """On `device`. An initialized tensor's transfer is recorded by autodiff (gradients flow
        back to the source, none is retained here); a lazy parameter no other live Param shares
        just changes where it will be initialized."""
        dst = Device(device)
        return self._to_device_base(dst)._derive(reparameterization=self._reparam("to_device", dst))

    def fork(self, device) -> "Param":
        """On `device`, detached from the source's graph, gradient retention restored: the
        destination parameter can be optimized independently."""
        dst = Device(device)
        return self._fork_base(dst)._derive(reparameterization=self._reparam("fork", dst))

    def valid(self) -> "Param":
        """Without autodiff; the configured trainability is kept for `train()`."""
        return self._valid_base()._derive(reparameterization=self._reparam("valid"))

    def train(self) -> "Param":
        """With autodiff and the configured trainability applied (a tensor that is already part
        of a graph, e.g. a recorded transfer, is kept as it is)."""
        return self._train_base()._derive(reparameterization=self._reparam("train"))

    def _lazy_movable(self) -> bool:
        lazy = self._lazy
        return lazy is not None and lazy.value is None

    def _to_device_base(self, dst: Device) -> "Param":
        if self._lazy_movable():  # shares the lazy state: where it will be read changes, nothing runs
            return self._derive(dev=dst)
        t = self.base().to_device(dst)
        return self._derive(value=t, lazy=None, ad=t.is_autodiff())

    def _fork_base(self, dst: Device) -> "Param":
        if self._lazy_movable():
            return self._derive(dev=dst)
        src = self.base()
        if array(src).dtype.kind == "f":
            rg = src.is_require_grad()
            t = src.to_device(dst).detach()
            if rg:
                t = t.set_require_grad(True)
        else:
            t = src.to_device(dst)
        return self._derive(value=t, lazy=None, ad=t.is_autodiff())

    def _valid_base(self) -> "Param":
        if self._value is None:
            return self._derive(ad=False)
        return self._derive(value=_view(self._value, False, False), ad=False)

    def _train_base(self) -> "Param":
        if self._value is None:
            return self._derive(ad=True)
        t = self._value
        if t.is_tracked() and not t.is_require_grad():
            if t.is_autodiff() and op_of(t) == "to_device":
                return self._derive(ad=True)  # a recorded transfer: gradients flow to its source
            t = t.detach()  # e.g. a mapper's clamp without detach(): the configured state applies again
        return self._derive(value=_view(t, True, self._active), ad=True)

    # ------------------------------------------------------------------ copies
    def __copy__(self) -> "Param":
        return self.clone()

    def __deepcopy__(self, memo) -> "Param":
        """An independent parameter with the same id: copied values (a lazy one gets its own
        lazy state; a tensor inside a graph is copied as a leaf)."""
        import copy

        r = self.reparameterization
        r2 = None if r is None else copy.deepcopy(r, memo)
        if self._value is None and self._lazy.value is None:
            # values belong to the id: the copy shares the lazy state (initialized values are never
            # changed in place), so both read the same values whichever reads first
            return Param._make(self.id, None, self._lazy, self._active, self._ad, r2, self._dev, self._state)
        t = self.base()
        c = wrap(array(t).copy(), t.device, t.is_autodiff())
        if t.is_require_grad():
            c = c.set_require_grad(True)
        return Param._make(self.id, c, None, self._active, t.is_autodiff(), r2, None, self._state)

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        state = "initialized" if self.is_initialized() else "lazy"
        return (f"Param(id={self.id}, dims={list(self.lazy_shape())}, kind={self.kind}, device={self.lazy_device()}, "
                f"{state}{', require_grad' if self.is_require_grad() else ''})")

    def __str__(self) -> str:
        return f"Param: {self.id}"
