"""Devices: where a tensor's memory lives and which array library computes on it.

`Device("cpu")` is the default. `Device("cpu:1")`, `Device("cpu:2")`, ... are further CPU
devices, each with its own random generator and default float dtype, so that moving and
forking modules is real and testable without a GPU. `Device("cuda:N")` runs on CuPy and
exists only where a GPU is present.
"""
from __future__ import annotations

import threading

import numpy as np

from . import dtype as _dt


class DeviceError(RuntimeError):
    """An operation met a device it cannot use: unknown, absent, or mixed with another."""


_cupy = None
_cupy_probed = False


def cupy_module():
    """CuPy when it is installed and a GPU answers, else None (probed once)."""
    global _cupy, _cupy_probed
    if not _cupy_probed:
        _cupy_probed = True
        try:
            import cupy  # noqa: PLC0415

            if cupy.cuda.is_available():
                _cupy = cupy
        except Exception:  # ImportError, or a broken CUDA install
            _cupy = None
    return _cupy


def cuda_device_count() -> int:
    cp = cupy_module()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def _parse(spec: str) -> tuple[str, int]:
    if not isinstance(spec, str):
        raise TypeError(f"Device expects a string such as 'cpu', 'cpu:1' or 'cuda:0', got {type(spec).__name__}")
    text = spec.strip().lower()
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda"):
        raise DeviceError(f"unknown device {spec!r}: expected 'cpu', 'cpu:N' or 'cuda:N'")
    if index == "":
        return kind, 0
    if not index.isdigit():
        raise DeviceError(f"bad device index in {spec!r}: expected a non-negative integer after ':'")
    return kind, int(index)


class Device:
    """A device. Instances are unique per name: `Device("cpu") is Device("cpu:0")`."""

    __slots__ = ("kind", "index", "xp", "_rng", "_default_float", "_lock", "__weakref__")
    _instances: dict[tuple[str, int], "Device"] = {}
    _creation_lock = threading.RLock()

    def __new__(cls, spec: "str | Device" = "cpu"):
        if isinstance(spec, Device):
            return spec
        key = _parse(spec)
        inst = cls._instances.get(key)
        if inst is not None:
            return inst
        with cls._creation_lock:
            inst = cls._instances.get(key)
            if inst is not None:
                return inst
            kind, index = key
            if kind == "cuda":
                cp = cupy_module()
                if cp is None:
                    raise DeviceError(
                        f"device {spec!r} is not available: CuPy with a working GPU was not found "
                        f"(install the 'cuda' extra on a machine with an NVIDIA GPU); "
                        f"available devices: {[str(d) for d in available_devices()]}"
                    )
                if index >= cuda_device_count():
                    raise DeviceError(f"device {spec!r} is not available: {cuda_device_count()} GPU(s) present")
                xp = cp
            else:
                xp = np
            inst = object.__new__(cls)
            inst.kind = kind
            inst.index = index
            inst.xp = xp
            inst._rng = None
            inst._default_float = _dt.float32
            inst._lock = threading.Lock()
            cls._instances[key] = inst
            return inst

    # ---- identity -------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Device({str(self)!r})"

    def __str__(self) -> str:
        if self.kind == "cpu" and self.index == 0:
            return "cpu"
        return f"{self.kind}:{self.index}"

    def __reduce__(self):
        return (Device, (str(self),))

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    # ---- random numbers -------------------------------------------------------------
    @property
    def rng(self):
        """This device's random generator (NumPy's PCG64, or CuPy's on a GPU)."""
        if self._rng is None:
            self.seed(None)
        return self._rng

    def seed(self, seed: int | None) -> None:
        """Reseed this device's generator; `None` draws fresh entropy."""
        if self.kind == "cuda":
            with self.xp.cuda.Device(self.index):
                self._rng = self.xp.random.default_rng(seed)
        else:
            self._rng = np.random.default_rng(seed)

    # ---- default dtype --------------------------------------------------------------
    @property
    def default_float_dtype(self) -> _dt.DType:
        return self._default_float

    def set_default_float_dtype(self, dtype) -> None:
        d = _dt.as_dtype(dtype)
        if d.kind != "float":
            raise ValueError(f"default float dtype must be a float dtype, got {d}")
        self._default_float = d

    # ---- memory ---------------------------------------------------------------------
    def asarray(self, data, dtype=None):
        """Put `data` on this device as an array of `dtype` (NumPy dtype)."""
        if self.kind == "cpu":
            if hasattr(data, "get") and not isinstance(data, np.ndarray):  # a CuPy array
                data = data.get()
            return np.asarray(data, dtype=dtype)
        with self.xp.cuda.Device(self.index):
            return self.xp.asarray(data, dtype=dtype)

    def context(self):
        """A context manager that makes this device current (a no-op on the CPU)."""
        if self.kind == "cuda":
            return self.xp.cuda.Device(self.index)
        return _NULL


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()

_default_device = None


def default_device() -> Device:
    global _default_device
    if _default_device is None:
        _default_device = Device("cpu")
    return _default_device


def set_default_device(device) -> None:
    global _default_device
    _default_device = Device(device)


def as_device(device) -> Device:
    if device is None:
        return default_device()
    return Device(device)


def available_devices() -> list[Device]:
    """The devices that exist here: `cpu`, `cpu:1`, `cpu:2`, `cpu:3`, and `cuda:N` per GPU."""
    devices = [Device("cpu")] + [Device(f"cpu:{i}") for i in (1, 2, 3)]
    devices += [Device(f"cuda:{i}") for i in range(cuda_device_count())]
    return devices
