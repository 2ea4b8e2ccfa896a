"""LoRA and QLoRA, built on `engine.module.reparam`.

`Lora(rank, alpha, init_std=None, param_group=ParamGroup.all(), dtype=None)` freezes every
float parameter (and the training flags of modules with running state: a BatchNorm under LoRA
keeps its statistics) and attaches a `LoraAdapter` to each rank-2 parameter of the group:
`a` `[d_in, rank]` drawn from N(0, std) with std = `init_std` or `1 / rank` (Burn's default:
the standard deviation, not the variance, is 1/rank), `b` `[rank, d_out]` of zeros, so the
output is unchanged at first; the effective value is `base + (alpha / rank) * a @ b`. The
factors are built at the base's float dtype (or `dtype`) on the base's device, from that
device's random generator, and are trainable. Paths: `<param path>.lora.a`, `….lora.b`.

`QLora(lora, block_size=64, double_quant=True)` packs each weight that gets an adapter as NF4
(see `engine.module.nf4`) and attaches a `QLoraAdapter`: the same `a` / `b` factors plus the
packed weight in an `NF4Weight` module. Every forward pass dequantizes; gradients reach only
the factors. Weights outside the group and parameters of other ranks are frozen as with `Lora`,
not packed.

Where the packed base lives. The engine has no quantized tensor type (Burn stores a QFloat
tensor at `…weight`), so the packed data are parameters of the adapter, and the parameter's own
base becomes a placeholder: a lazy float tensor of the logical shape whose values are zeros
backed by a single element (a zero-stride view, no memory), never trained. `Param.shape`,
`kind` and `device` keep answering for the logical weight, so layers are unaffected. In a
record the packed weight appears as

    fc1.weight.lora.a              F32 [d_in, rank]
    fc1.weight.lora.b              F32 [rank, d_out]
    fc1.weight.lora.nf4.codes      U8  [ceil(n / block) * block / 2]   two codes a byte, high nibble first
    fc1.weight.lora.nf4.absmax     F32 [ceil(n / block)]               without double quantization
    fc1.weight.lora.nf4.absmax_q     I8  [ceil(n / block)]             with double quantization:
    fc1.weight.lora.nf4.absmax_scale F32 [ceil(ceil(n / block) / 256)]   absmax ≈ absmax_q * scale
    fc1.weight.lora.nf4.absmax_mean  F32 [1]                               + mean

and the placeholder at `fc1.weight` (zeros of the logical shape) for as long as module traversal
shows it; `QLoraAdapter.base()` gives the dequantized weight. The adapter-only group
`ParamGroup.from_regex(r"(^|\\.)lora\\.(a|b)$")` selects `a` and `b` for LoRA and QLoRA alike.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..tensor import Tensor
from ..tensor.raw import array
from .group import ParamGroup
from .module import Module
from .nf4 import DEFAULT_BLOCK_SIZE, DoubleQuantized, NF4Packed, quantize_nf4
from .param import Param
from .reparam import Reparameterization, Reparameterizer, apply_reparameterization

__all__ = ["Lora", "LoraAdapter", "LoraPreview", "NF4Weight", "QLora", "QLoraAdapter", "apply_lora", "apply_qlora"]


@dataclass(frozen=True)
class LoraPreview:
    """`Lora.preview`: the parameters that would get factors, how many values the factors add, and
    the trainable counts after attaching (every other parameter frozen, as `Lora` freezes them)."""

    targets: list
    added: int
    counts: "TrainableCounts"  # noqa: F821 - engine.module.summary.TrainableCounts


# ---------------------------------------------------------------------------------- adapters
class LoraAdapter(Reparameterization):
    """Trainable low-rank factors: the value is `base + scale * (a @ b)`."""

    NAME = "lora"

    def __init__(self, a: Param, b: Param, scale: float):
        self.a = a
        self.b = b
        self.scale = float(scale)

    def delta(self) -> Tensor:
        """`scale * (a @ b)`, `[d_in, d_out]`, read through `val()` so gradients reach the factors."""
        return (self.a.val() @ self.b.val()) * self.scale

    def apply(self, base: Tensor) -> Tensor:
        delta = self.delta()
        if tuple(delta.shape) != tuple(base.shape):
            delta = delta.reshape(base.shape)
        return base + delta


class NF4Weight(Module):
    """A weight packed as NF4: codes (uint8), and the per-block absmax constants, either as
    float32 (`absmax`) or double-quantized (`absmax_q` int8, `absmax_scale` float32 per 256,
    `absmax_mean` float32 [1]). None of them is trainable."""

    def __init__(self, codes: Param, absmax: Param | None, absmax_q: Param | None, absmax_scale: Param | None,
                 absmax_mean: Param | None, shape, block_size: int, dtype: str):
        self.codes = codes
        self.absmax = absmax
        self.absmax_q = absmax_q
        self.absmax_scale = absmax_scale
        self.absmax_mean = absmax_mean
        self.shape = tuple(int(s) for s in shape)
        self.block_size = int(block_size)
        self.dtype = str(dtype)

    @staticmethod
    def from_packed(packed: NF4Packed, device) -> "NF4Weight":
        def frozen(array, dtype):
            return Param(Tensor.from_data(array, device=device, dtype=dtype), require_grad=False)

        if packed.absmax_dq is None:
            absmax, q, scale, mean = frozen(packed.absmax, "float32"), None, None, None
        else:
            d = packed.absmax_dq
            absmax = None
            q = frozen(d.values, "int8")
            scale = frozen(d.scales, "float32")
            mean = frozen(np.array([d.mean], dtype=np.float32), "float32")
        return NF4Weight(frozen(packed.codes, "uint8"), absmax, q, scale, mean, packed.shape, packed.block_size,
                         np.dtype(packed.dtype).name)

    @property
    def double_quant(self) -> bool:
        return self.absmax is None

    def numel(self) -> int:
        """The number of logical weight elements (not the bytes they are packed into)."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    def packed(self) -> NF4Packed:
        """The packed data as arrays on the parameters' device (no copy)."""
        if self.absmax is not None:
            absmax, dq = array(self.absmax.val()), None
        else:
            dq = DoubleQuantized(array(self.absmax_q.val()), array(self.absmax_scale.val()),
                                 float(self.absmax_mean.val().numpy().reshape(-1)[0]))
            absmax = None
        return NF4Packed(array(self.codes.val()), absmax, dq, self.shape, np.dtype(self.dtype), self.block_size)

    def dequantize(self) -> Tensor:
        """The dense weight (code value × block absmax), a constant: no gradient flows into it."""
        codes = self.codes.val()
        return Tensor.from_data(self.packed().dequantize(), device=codes.device, dtype=self.dtype)

    def bits_per_weight(self) -> float:
        return self.packed().bits_per_weight


class QLoraAdapter(LoraAdapter):
    """LoRA over an NF4-packed base: the value is `dequantize(nf4) + scale * (a @ b)`.

    The parameter's own base is a zero placeholder of the logical shape (see this file's doc);
    `apply` takes only its shape from it.
    """

    NAME = "lora"
    # The packed weight is the stored base; the parameter's own base is a placeholder. Module
    # traversal that honours this flag leaves the placeholder out of visits, records and
    # optimizers, and Param.val() passes None instead of materializing it.
    STORES_BASE = True

    def __init__(self, a: Param, b: Param, scale: float, nf4: NF4Weight):
        super().__init__(a, b, scale)
        self.nf4 = nf4

    def base(self) -> Tensor:
        """The dequantized base weight."""
        return self.nf4.dequantize()

    def apply(self, base: Tensor) -> Tensor:
        dense = self.nf4.dequantize()
        if base is not None and tuple(base.shape) != tuple(dense.shape):
            raise ValueError(
                f"QLoraAdapter.apply: the parameter's base has dims {list(base.shape)}, the packed weight "
                f"{list(dense.shape)}"
            )
        return dense + self.delta().reshape(dense.shape)


# ---------------------------------------------------------------------------------- reparameterizers
def _check_group(group) -> ParamGroup:
    if not isinstance(group, ParamGroup):
        raise TypeError(f"Lora: param_group must be a ParamGroup, got {type(group).__name__}")
    return group


class Lora(Reparameterizer):
    """LoRA (see this file's doc). `Lora(8, 16.0)`; `set_param_group(group)`, `set_dtype(dtype)`.

    The base is frozen structurally, running state included: the training flags of modules
    that own running state (BatchNorm) are frozen too, so they normalize with their saved
    statistics and never update them, and the adapters alone hold what training changed.
    """

    FREEZES_RUNNING_STATE = True

    def __init__(self, rank: int, alpha: float, init_std: float | None = None,
                 param_group: ParamGroup | None = None, dtype=None):
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank <= 0:
            raise ValueError(f"Lora: rank must be a positive integer, got {rank!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
            raise ValueError(f"Lora: alpha must be a number, got {alpha!r}")
        if init_std is not None and (isinstance(init_std, bool) or not isinstance(init_std, numbers.Real)
                                     or not init_std > 0):
            raise ValueError(f"Lora: init_std must be a positive number or None, got {init_std!r}")
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.init_std = None if init_std is None else float(init_std)
        self.param_group = ParamGroup.all() if param_group is None else _check_group(param_group)
        self.dtype = dtype

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def set_param_group(self, group: ParamGroup) -> "Lora":
        return Lora(self.rank, self.alpha, self.init_std, _check_group(group), self.dtype)

    def set_dtype(self, dtype) -> "Lora":
        return Lora(self.rank, self.alpha, self.init_std, self.param_group, dtype)

    def __repr__(self) -> str:
        return (f"Lora(rank={self.rank}, alpha={self.alpha}, init_std={self.init_std}, "
                f"param_group={self.param_group!r})")

    def adapts(self, path: str, param: Param) -> bool:
        """Whether the parameter at `path` gets an adapter: rank 2 and in the group."""
        return param.rank == 2 and self.param_group.matches(param.id, path)

    def _factor_dtype(self, param: Param):
        if self.dtype is not None:
            return self.dtype
        if param.is_initialized():
            return param.base().dtype
        return param.lazy_device().default_float_dtype

    def factor_count(self, param: Param) -> int:
        """How many values the factors `a` and `b` of a rank-2 `param` hold: `rank * (d_in + d_out)`."""
        d_in, d_out = param.shape
        return self.rank * (d_in + d_out)

    def preview(self, params) -> "LoraPreview":
        """What attaching this LoRA would give, without attaching it or reading a value: `params`
        is the model's `(path, param)` list (`module.named_params()`); the targets are those the
        group selects and `adapts` accepts."""
        from .summary import TrainableCounts  # noqa: PLC0415 - summary imports this file (NF4Weight)

        params = list(params)
        targets = [(path, p) for path, p in params if p.kind == "float" and self.adapts(path, p)]
        added = sum(self.factor_count(p) for _, p in targets)
        total = sum(p.numel() for _, p in params) + added
        return LoraPreview(targets, added, TrainableCounts(added, total))

    def factors(self, param: Param) -> tuple[Param, Param]:
        """Fresh trainable `a` ~ N(0, std) `[d_in, rank]` and `b` = 0 `[rank, d_out]` for `param`."""
        d_in, d_out = param.shape
        device = param.lazy_device()
        dtype = self._factor_dtype(param)
        std = self.init_std if self.init_std is not None else 1.0 / self.rank
        a = Tensor.random((d_in, self.rank), ("normal", 0.0, std), device=device, dtype=dtype)
        b = Tensor.zeros((self.rank, d_out), device=device, dtype=dtype)
        return Param(a), Param(b)

    def reparameterize(self, path: str, param: Param):
        base = param.set_require_grad(False)
        if not self.adapts(path, param):
            return base, None
        a, b = self.factors(param)
        adapter = LoraAdapter(a, b, self.scale)
        return base, adapter if param.is_autodiff() else adapter.valid()


def _zeros_placeholder(dtype_name: str, shape):
    def init(device, require_grad):
        xp = device.xp
        zeros = xp.broadcast_to(xp.zeros((), dtype=np.dtype(dtype_name)), shape)
        return Tensor.from_data(zeros, device=device, dtype=dtype_name)

    return init


class QLora(Reparameterizer):
    """QLoRA: NF4-packed bases with LoRA adapters. `QLora(Lora(8, 16.0))`. Running state is
    frozen as with `Lora`."""

    FREEZES_RUNNING_STATE = True

    def __init__(self, lora: Lora, block_size: int = DEFAULT_BLOCK_SIZE, double_quant: bool = True):
        if not isinstance(lora, Lora):
            raise TypeError(f"QLora expects a Lora as its first argument, got {type(lora).__name__}")
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size <= 0 \
                or block_size % 2:
            raise ValueError(f"QLora: block_size must be a positive even integer, got {block_size!r}")
        self.lora = lora
        self.block_size = int(block_size)
        self.double_quant = bool(double_quant)

    def __repr__(self) -> str:
        return f"QLora({self.lora!r}, block_size={self.block_size}, double_quant={self.double_quant})"

    def reparameterize(self, path: str, param: Param):
        if not self.lora.adapts(path, param):
            return param.set_require_grad(False), None
        weight = param.base()
        packed = quantize_nf4(array(weight), self.block_size, self.double_quant)
        device = weight.device
        nf4 = NF4Weight.from_packed(packed, device)
        lora = self.lora if self.lora.dtype is not None else self.lora.set_dtype(weight.dtype)
        a, b = lora.factors(param)
        adapter = QLoraAdapter(a, b, lora.scale, nf4)
        dtype = np.dtype(packed.dtype).name
        placeholder = Param.uninitialized(_zeros_placeholder(dtype, packed.shape), device, False, packed.shape,
                                          id=param.id)
        if not param.is_autodiff():
            return placeholder.valid(), adapter.valid()
        return placeholder, adapter


# ---------------------------------------------------------------------------------- applying
def apply_lora(module: Module, lora) -> Module:
    """`module` with LoRA adapters (`Module.apply_lora`)."""
    if not isinstance(lora, Lora):
        raise TypeError(f"apply_lora expects a Lora, got {type(lora).__name__}; use apply_qlora for a QLora")
    return apply_reparameterization(module, lora)


def apply_qlora(module: Module, qlora) -> Module:
    """`module` with NF4-packed bases and LoRA adapters (`Module.apply_qlora`)."""
    if not isinstance(qlora, QLora):
        raise TypeError(f"apply_qlora expects a QLora, got {type(qlora).__name__}")
    return apply_reparameterization(module, qlora)
