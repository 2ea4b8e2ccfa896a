"""Initializers: Burn's `Initializer` enum, applied lazily through `Param.uninitialized`.

    Initializer.KaimingUniform(gain=1 / math.sqrt(3), fan_out_only=False).init_with(
        [d_input, d_output], fan_in=d_input, device=device)

returns a lazy `Param`: nothing is allocated until the value is first used, and the values are
drawn from the generator of the device the parameter is on by then, in that device's default
float dtype. Formulas (Burn's):

- Uniform(min, max), Normal(mean, std), Constant(value), Ones, Zeros
- KaimingUniform(gain, fan_out_only): U(-a, a), a = sqrt(3) * gain / sqrt(fan)
- KaimingNormal(gain, fan_out_only): N(0, gain / sqrt(fan)); fan = fan_out if fan_out_only else fan_in
- XavierUniform(gain): U(-a, a), a = sqrt(3) * gain * sqrt(2 / (fan_in + fan_out))
- XavierNormal(gain): N(0, gain * sqrt(2 / (fan_in + fan_out)))
- Orthogonal(gain): a (semi-)orthogonal matrix from the QR decomposition of a standard normal
  [rows, numel / rows] draw (transposed when rows < cols), columns' signs fixed by diag(R),
  reshaped, times gain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..tensor import Tensor
from ..tensor.raw import array, wrap
from ..tensor.device import as_device
from .param import Param

__all__ = [
    "Initializer",
    "Constant",
    "Ones",
    "Zeros",
    "Uniform",
    "Normal",
    "KaimingUniform",
    "KaimingNormal",
    "XavierUniform",
    "XavierNormal",
    "Orthogonal",
]


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    try:
        return tuple(map(int, shape))
    except TypeError:
        raise TypeError(f"initializer: expected a shape (a sequence of ints), got {shape!r}") from None


def _fmt(x) -> str:
    from .display import rust_debug

    return rust_debug(x)


class Initializer:
    """Base of the initializers; `Initializer.KaimingUniform(...)` etc. name the variants."""

    def init(self, shape, device=None) -> Param:
        """A lazy trainable parameter of `shape` (fans are needed by Kaiming and Xavier: use init_with)."""
        return self.init_with(shape, None, None, device)

    def init_with(self, shape, fan_in: int | None = None, fan_out: int | None = None, device=None) -> Param:
        """A lazy trainable parameter of `shape`, the initializer run on first use."""
        dims = _shape(shape)
        self._check_fans(fan_in, fan_out)
        dev = as_device(device)

        def init(d, require_grad):
            t = self.init_tensor(dims, fan_in, fan_out, d)
            return t.require_grad() if require_grad else t

        return Param.uninitialized(init, dev, True, dims)

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        """The values right away (a plain tensor without autodiff)."""
        raise NotImplementedError

    def _check_fans(self, fan_in, fan_out) -> None:
        pass

    def __rust_debug__(self) -> str:
        fields = getattr(self, "__dataclass_fields__", {})
        name = type(self).__name__
        if not fields:
            return name
        return name + " { " + ", ".join(f"{k}: {_fmt(getattr(self, k))}" for k in fields) + " }"


@dataclass(frozen=True)
class Constant(Initializer):
    value: float

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        return Tensor.full(_shape(shape), float(self.value), device=as_device(device))


@dataclass(frozen=True)
class Ones(Initializer):
    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        return Tensor.ones(_shape(shape), device=as_device(device))


@dataclass(frozen=True)
class Zeros(Initializer):
    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        return Tensor.zeros(_shape(shape), device=as_device(device))


@dataclass(frozen=True)
class Uniform(Initializer):
    min: float
    max: float

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        return Tensor.random(_shape(shape), ("uniform", float(self.min), float(self.max)), device=as_device(device))


@dataclass(frozen=True)
class Normal(Initializer):
    mean: float
    std: float

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        return Tensor.random(_shape(shape), ("normal", float(self.mean), float(self.std)), device=as_device(device))


def _kaiming_std(name: str, fan_out_only: bool, fan_in, fan_out) -> float:
    fan = fan_out if fan_out_only else fan_in
    if fan is None:
        which = "fan_out" if fan_out_only else "fan_in"
        raise ValueError(f"{name}: Kaiming initialization needs {which}; use init_with(shape, fan_in=..., fan_out=...)")
    return 1.0 / math.sqrt(fan)


def _xavier_std(name: str, fan_in, fan_out) -> float:
    if fan_in is None or fan_out is None:
        raise ValueError(f"{name}: Xavier initialization needs fan_in and fan_out; use init_with(shape, fan_in=..., fan_out=...)")
    return math.sqrt(2.0 / (fan_in + fan_out))


@dataclass(frozen=True)
class KaimingUniform(Initializer):
    gain: float
    fan_out_only: bool

    def _check_fans(self, fan_in, fan_out):
        _kaiming_std("KaimingUniform", self.fan_out_only, fan_in, fan_out)

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        a = math.sqrt(3.0) * self.gain * _kaiming_std("KaimingUniform", self.fan_out_only, fan_in, fan_out)
        return Tensor.random(_shape(shape), ("uniform", -a, a), device=as_device(device))


@dataclass(frozen=True)
class KaimingNormal(Initializer):
    gain: float
    fan_out_only: bool

    def _check_fans(self, fan_in, fan_out):
        _kaiming_std("KaimingNormal", self.fan_out_only, fan_in, fan_out)

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        std = self.gain * _kaiming_std("KaimingNormal", self.fan_out_only, fan_in, fan_out)
        return Tensor.random(_shape(shape), ("normal", 0.0, std), device=as_device(device))


@dataclass(frozen=True)
class XavierUniform(Initializer):
    gain: float

    def _check_fans(self, fan_in, fan_out):
        _xavier_std("XavierUniform", fan_in, fan_out)

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        a = math.sqrt(3.0) * self.gain * _xavier_std("XavierUniform", fan_in, fan_out)
        return Tensor.random(_shape(shape), ("uniform", -a, a), device=as_device(device))


@dataclass(frozen=True)
class XavierNormal(Initializer):
    gain: float

    def _check_fans(self, fan_in, fan_out):
        _xavier_std("XavierNormal", fan_in, fan_out)

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        std = self.gain * _xavier_std("XavierNormal", fan_in, fan_out)
        return Tensor.random(_shape(shape), ("normal", 0.0, std), device=as_device(device))


@dataclass(frozen=True)
class Orthogonal(Initializer):
    gain: float

    def init_tensor(self, shape, fan_in=None, fan_out=None, device=None) -> Tensor:
        dims = _shape(shape)
        if len(dims) < 2:
            raise ValueError(f"Orthogonal: expected a shape of rank >= 2, got {list(dims)}")
        dev = as_device(device)
        rows = dims[0]
        cols = math.prod(dims) // rows if rows else 0
        draw = Tensor.random((rows, cols), ("normal", 0.0, 1.0), device=dev)
        xp = dev.xp
        a = array(draw).astype(xp.float64)
        if rows < cols:
            a = a.T
        with dev.context():
            q, r = xp.linalg.qr(a)
            d = xp.sign(xp.diagonal(r))
            d = xp.where(d == 0, 1.0, d)
            q = q * d[None, :]
        if rows < cols:
            q = q.T
        out = (q.reshape(dims) * float(self.gain)).astype(array(draw).dtype)
        return wrap(out, dev)


# The variants, as Burn's enum names them: Initializer.KaimingUniform(...)
for _cls in (Constant, Ones, Zeros, Uniform, Normal, KaimingUniform, KaimingNormal, XavierUniform, XavierNormal,
             Orthogonal):
    setattr(Initializer, _cls.__name__, _cls)
del _cls
