"""What an action on a module will allocate, worked out before it runs, and what the machine has.

Each estimate is a walk of the parameter tree that reads shapes, dtypes, devices and whether a
value exists, never a value: on a lazy 7 B model it allocates nothing and takes milliseconds.

- `estimate_lora(module, lora)`: `Lora` allocates its factors `a` and `b` (DoRA also its
  magnitudes, from the bases' column norms: lazy bases are initialized); `QLora` also
  initializes every lazy base it packs (the dense weight: the lazy state is shared, so the
  original model keeps it), the NF4 codes and scales, and, for the largest weight, the
  quantizer's working arrays (about five float32 copies of it, measured).
- `estimate_move(module, device)`: `fork` and `to_device` copy the initialized parameters and
  constants that change device; a lazy parameter moves for free.
- `estimate_materialize(module)`: folding adapters initializes lazy bases, makes one plain
  weight per reparameterized parameter, and, while folding the largest, its delta `a @ b`
  (and the dequantized base under QLoRA).

`available_memory()` is what the process can still allocate: MemAvailable from /proc/meminfo,
and no more than the address space RLIMIT_AS leaves above the process's current size.
`MemoryEstimate.refusal(available)` gives the message that refuses an action that does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .lora import QLora
from .param import Param
from .reparam import _below, iter_param_slots
from .tree import FieldKind, params, walk

__all__ = ["MemoryEstimate", "NotEnoughMemory", "available_memory", "estimate_lora", "estimate_materialize",
           "estimate_move", "size_text", "NF4_WORKING_COPIES"]

# quantize_nf4's transient arrays at their peak, in float32 copies of the weight (measured: 5.04)
NF4_WORKING_COPIES = 5.1
_KIND_ITEMSIZE = {"int": 8, "bool": 1}


def size_text(n: int) -> str:
    """`27.0 GB`, `80.6 MB`, `512 bytes` (decimal units)."""
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} bytes"


class NotEnoughMemory(MemoryError):
    """An action would need more memory than the machine has: says how much, and for what."""


@dataclass(frozen=True)
class MemoryEstimate:
    """The bytes an action allocates, by what for (`parts`, in the order they are named)."""

    action: str
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def detail(self) -> str:
        return ", ".join(f"{k} {size_text(v)}" for k, v in self.parts.items() if v)

    def text(self) -> str:
        """`QLoRA needs about 31.2 GB (dense bases to initialize 27.0 GB, ...)`."""
        if not self.total:
            return f"{self.action} allocates nothing"
        return f"{self.action} needs about {size_text(self.total)} ({self.detail()})"

    def fits(self, available: int | None) -> bool:
        return available is None or self.total <= available

    def refusal(self, available: int | None) -> str | None:
        """The message refusing the action when it does not fit in `available` bytes (None: it fits,
        or nothing is known about the machine)."""
        if self.fits(available):
            return None
        return f"{self.text()}, but this machine has {size_text(available)} available; refused"

    def check(self, available: int | None = None) -> "MemoryEstimate":
        """Raise `NotEnoughMemory` when the action does not fit (`available`: default what
        `available_memory()` says); else return the estimate."""
        message = self.refusal(available_memory() if available is None else available)
        if message:
            raise NotEnoughMemory(message)
        return self


# ---- what the machine has --------------------------------------------------------------------
def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os  # noqa: PLC0415

        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _vm_size() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def address_space_left() -> int | None:
    """How far RLIMIT_AS lets this process's address space grow (None: no limit, or unknown)."""
    try:
        import resource  # noqa: PLC0415 - not on every platform
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    vm = _vm_size()
    return None if vm is None else max(0, soft - vm)


def available_memory() -> int | None:
    """Bytes this process can still allocate: the smaller of MemAvailable and what RLIMIT_AS
    leaves; None where neither is known. Tests replace this function to pose as another machine."""
    figures = [n for n in (_meminfo_available(), address_space_left()) if n is not None]
    return min(figures) if figures else None


# ---- sizes of parameters, without reading a value ----------------------------------------------
def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _stores_base(p: Param) -> bool:
    return bool(getattr(p.reparameterization, "STORES_BASE", False))


def _itemsize(p: Param) -> int:
    """Bytes per element of `p`'s stored value (what a lazy one will be when initialized)."""
    if p.is_initialized() and not _stores_base(p):
        return p.base().dtype.itemsize  # the value exists: no initializer runs
    if p.kind != "float" and p.lazy_itemsize() is not None:
        return p.lazy_itemsize()  # the initializer said what it makes (a GGUF weight's uint8 blocks)
    if p.kind == "float":
        return p.lazy_device().default_float_dtype.itemsize
    return _KIND_ITEMSIZE.get(p.kind, 4)


def param_bytes(p: Param) -> int:
    return p.numel() * _itemsize(p)


def _float_itemsize(p: Param, dtype=None) -> int:
    if dtype is not None:
        from engine.tensor.dtype import as_dtype  # noqa: PLC0415

        return as_dtype(dtype).itemsize
    return _itemsize(p) if p.kind == "float" else 4


def _nf4_bytes(numel: int, block_size: int, double_quant: bool) -> int:
    blocks = -(-numel // block_size)
    codes = (blocks * block_size) // 2
    if double_quant:
        return codes + blocks + 4 * -(-blocks // 256) + 4
    return codes + 4 * blocks


def _lora_targets(module, lora) -> list[tuple[str, Param]]:
    """The parameters `apply_lora` / `apply_qlora` would adapt: float, without a
    reparameterization, not a factor of one, and accepted by `lora.adapts`."""
    slots = list(iter_param_slots(module))
    owners = {path for path, p in slots if p.reparameterization is not None}
    out = []
    for path, p in slots:
        if p.kind != "float" or p.reparameterization is not None:
            continue
        if owners and _below(path, owners):
            continue
        if lora.adapts(path, p):
            out.append((path, p))
    return out


# ---- the estimates -----------------------------------------------------------------------------
def estimate_lora(module, lora) -> MemoryEstimate:
    """What `module.apply_lora(lora)` or, for a `QLora`, `module.apply_qlora(lora)` allocates."""
    qlora = isinstance(lora, QLora)
    base_lora = lora.lora if qlora else lora
    targets = _lora_targets(module, base_lora)
    rank_for = getattr(base_lora, "rank_for", lambda _path: base_lora.rank)
    factors = sum(base_lora.factor_count(p, path) * _float_itemsize(p, base_lora.dtype) for path, p in targets)
    # the parts of a fused module share one `a` (lora_shared_a), which factor_count counts once per part
    factors -= base_lora.bound_to(module).shared_savings(dict(targets), lambda p: _float_itemsize(p, base_lora.dtype))
    # the random draw of the largest `a` factor, in float64, before its cast
    draw = 8 * max((p.shape[0] * rank_for(path) for path, p in targets), default=0)
    dense = sum(param_bytes(p) for _, p in targets if not p.is_initialized())
    largest = max((p.numel() for _, p in targets), default=0)
    if not qlora:
        if getattr(base_lora, "use_dora", False):  # the magnitudes start at the bases' column norms
            return MemoryEstimate("DoRA", {"dense bases to initialize": dense, "LoRA factors": factors,
                                           "column-norm working arrays": 8 * largest + draw})
        return MemoryEstimate("LoRA", {"LoRA factors": factors, "random-draw working arrays": draw})
    nf4 = sum(_nf4_bytes(p.numel(), lora.block_size, lora.double_quant) for _, p in targets)
    return MemoryEstimate("QLoRA", {
        "dense bases to initialize": dense,
        "NF4 weights": nf4,
        "LoRA factors": factors,
        "quantizer working arrays": int(NF4_WORKING_COPIES * 4 * largest),
    })


def estimate_move(module, device, fork: bool = True) -> MemoryEstimate:
    """What `module.fork(device)` (or `to_device`) copies: initialized parameters and constants
    that are not on `device` already. Lazy parameters stay lazy: they cost nothing."""
    from engine.tensor.device import Device  # noqa: PLC0415

    dst = Device(device)
    params = constants = 0
    for _path, kind, value in walk(module):
        if kind is FieldKind.PARAM:
            if value.is_initialized() and value.lazy_device() is not dst:
                params += param_bytes(value)
        elif kind is FieldKind.CONSTANT:
            if value.device is not dst:
                constants += _numel(value.shape) * value.dtype.itemsize
    return MemoryEstimate("Fork" if fork else "Transfer",
                          {"copies of initialized parameters": params, "copies of constants": constants})


# a lazy weight's initializer holds about two more copies of it at its peak (a float64 random draw
# before its cast; a BF16 file's bytes and a permuted copy beside the result), measured
INIT_WORKING_COPIES = 2


def estimate_initialize(module) -> MemoryEstimate:
    """What using every lazy parameter of `module` allocates: each one initialized, and the
    largest one's initializer working on `INIT_WORKING_COPIES` more copies of it at its peak.
    Generation and training (`estimate_generation`, `estimate_training`) start from these parts."""
    sizes = [param_bytes(p) for _path, p in params(module) if not p.is_initialized()]
    return MemoryEstimate("Initialize", {"parameters to initialize": sum(sizes),
                                         "initializer working arrays": INIT_WORKING_COPIES * max(sizes, default=0)})


def estimate_materialize(module) -> MemoryEstimate:
    """What `module.materialize()` allocates: lazy bases initialized, one plain weight per
    reparameterized parameter, and the largest fold's temporaries."""
    lazy_bases = folded = 0
    largest = largest_quantized = 0
    for _path, p in iter_param_slots(module):
        if p.reparameterization is None:
            continue
        size = p.numel() * _float_itemsize(p)
        folded += size
        largest = max(largest, size)
        if _stores_base(p):
            largest_quantized = max(largest_quantized, size)
        elif not p.is_initialized():
            lazy_bases += size
    return MemoryEstimate("Materialize", {
        "lazy bases to initialize": lazy_bases,
        "folded weights": folded,
        "fold working arrays": 2 * largest + largest_quantized,
    })

