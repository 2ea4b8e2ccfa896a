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

Variants (PEFT's, as options of `Lora`; keyword-only):

- `use_rslora=True`: rank-stabilized LoRA, scale `alpha / sqrt(rank)` instead of `alpha / rank`.
- `use_dora=True`: DoRA, a `DoraAdapter` with a trainable magnitude per output column,
  `….lora.magnitude` `[d_out]`, initialized to the column norms of the base: the value is
  `m * (W + s·a@b) / ||W + s·a@b||`, the norm taken over axis 0 of Ember's `[d_in, d_out]`
  layout (per output feature, as peft 0.21's `DoraLinearLayer.get_weight_norm` takes it over
  torch's `[out, in]` rows) and detached from the graph (peft, after the DoRA paper's section
  4.3): gradients reach `m`, `a` and `b` but not through the norm.
- `rank_pattern` / `alpha_pattern`: `{pattern: rank}` / `{pattern: alpha}` overriding `rank` /
  `alpha` per layer; a key matches a parameter's module name as peft matches it (the regex
  `(.*\\.)?(key)$`, the first key in order that matches wins). The module name is
  `module_names[path]` when `module_names` (`{param path: module name}`, e.g. Hugging Face's) is
  given, else the parameter's path less its last segment (`layers.0.fc1` for `layers.0.fc1.weight`).

Shared A factors (the parts of a fused module). A model whose layers are the parts of one fused
module elsewhere (Phi-3's q / k / v of the files' `qkv_proj`, a mixture's gate and up projections of
one expert in transformers 5's `gate_up_proj`) answers `lora_shared_a() -> {weight path: key}`; when
such a model gets a LoRA, the adapted weights of one key share ONE `a` (the same `Param`: one id, one
gradient, the sum over the parts, one optimizer state, saved once, counted once, see
`engine.module.tree.params`) and keep their own `b` (the row blocks of the fused module's B), so the
parts train exactly as peft's one LoRA over the fused module. The parts must have the same rank
(they share a module name); a part whose rank differs keeps its own `a`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import regex as _regex  # matches take a timeout: patterns come from files (adapter_config.json, projects)

import numpy as np

from ..tensor import Tensor
from ..tensor.raw import array
from .group import MATCH_TIMEOUT_S, ParamGroup
from .module import Module
from .nf4 import DEFAULT_BLOCK_SIZE, DoubleQuantized, NF4Packed, quantize_nf4
from .param import Param
from .reparam import Reparameterization, Reparameterizer, apply_reparameterization, iter_param_slots

__all__ = ["DoraAdapter", "Lora", "LoraAdapter", "LoraPreview", "NF4Weight", "QLora", "QLoraAdapter", "RsLoraAdapter",
           "apply_lora", "apply_qlora", "pattern_key", "scale_adapters"]


@dataclass(frozen=True)
class LoraPreview:
    """`Lora.preview`: the parameters that would get factors, how many values the factors add
    (DoRA's magnitudes included), and the trainable counts after attaching (every other parameter
    frozen, as `Lora` freezes them; adapters attached before keep their trainable factors).
    `nested`: selected parameters that have a reparameterization already, which attaching
    refuses (reparameterizations do not nest); they are not in `targets`. `shared`: {target path: the
    earlier target whose `a` it would share} (the later parts of a fused module; `added` counts that `a` once)."""

    targets: list
    added: int
    counts: "TrainableCounts"  # noqa: F821 - engine.module.summary.TrainableCounts
    nested: list = field(default_factory=list)
    shared: dict = field(default_factory=dict)


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


class RsLoraAdapter(LoraAdapter):
    """Rank-stabilized LoRA: a `LoraAdapter` whose `scale` is `alpha / sqrt(rank)` (the class says
    so in displays and to `save_peft_adapter`, which writes `use_rslora`)."""

    NAME = "lora"


class DoraAdapter(LoraAdapter):
    """DoRA: low-rank factors plus a trainable magnitude per output column (see this file's doc).

    The value is `(W + scale * a @ b) * (magnitude / norm)` with `norm` the column norms (over
    axis 0) of `W + scale * a @ b`, detached, as peft computes it."""

    NAME = "lora"

    def __init__(self, a: Param, b: Param, scale: float, magnitude: Param, rslora: bool = False):
        super().__init__(a, b, scale)
        self.magnitude = magnitude
        self.rslora = bool(rslora)  # whether `scale` is alpha / sqrt(rank)

    def apply(self, base: Tensor) -> Tensor:
        if base.rank != 2:
            raise ValueError(f"DoraAdapter.apply: expected a rank-2 weight, found dims {list(base.shape)}")
        w = super().apply(base)
        d_out = int(base.shape[1])
        m = self.magnitude.val()
        if tuple(m.shape) != (d_out,):
            raise ValueError(f"DoraAdapter.apply: the magnitude has dims {list(m.shape)}, the weight "
                             f"{list(base.shape)} needs [{d_out}]")
        norm = w.detach().square().sum_dim(0).sqrt()  # [1, d_out], a constant
        return w * (m.reshape(1, d_out) / norm)


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


def _check_pattern(name: str, pattern, value_ok) -> dict:
    if pattern is None:
        return {}
    if not isinstance(pattern, dict):
        raise ValueError(f"Lora: {name} must be a dict {{module pattern: value}}, got {type(pattern).__name__}")
    out = {}
    for key, value in pattern.items():
        if not isinstance(key, str):
            raise ValueError(f"Lora: {name} keys must be module name patterns (text), got {key!r}")
        try:
            _regex.compile(rf"(.*\.)?({key})$")
        except (_regex.error, RecursionError, OverflowError, ValueError) as exc:
            raise ValueError(f"Lora: {name} key {key!r} is not a valid regex: {exc}") from None
        if not value_ok(value):
            what = "positive integer" if name == "rank_pattern" else "number"
            raise ValueError(f"Lora: {name}[{key!r}] must be a {what}, got {value!r}")
        out[key] = int(value) if name == "rank_pattern" else float(value)
    return out


def _positive_int(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Integral) and v > 0


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real)


def pattern_key(patterns, module_name: str):
    r"""The first key of `patterns` that matches `module_name` as peft's `get_pattern_key` matches
    (`re.match(rf"(.*\.)?({key})$", name)`), or None."""
    for key in patterns:
        try:
            hit = _regex.match(rf"(.*\.)?({key})$", module_name, timeout=MATCH_TIMEOUT_S)
        except TimeoutError:
            raise ValueError(f"pattern {key!r} took longer than {MATCH_TIMEOUT_S:g} s to match the module name "
                             f"{module_name!r}: expected a pattern without nested repetition") from None
        if hit:
            return key
    return None


class Lora(Reparameterizer):
    """LoRA (see this file's doc). `Lora(8, 16.0)`; `set_param_group(group)`, `set_dtype(dtype)`.
    Variants: `Lora(8, 16.0, use_rslora=True)`, `Lora(8, 16.0, use_dora=True)`,
    `Lora(8, 16.0, rank_pattern={"o_proj": 4}, alpha_pattern={"o_proj": 8.0})`.

    The base is frozen structurally, running state included: the training flags of modules
    that own running state (BatchNorm) are frozen too, so they normalize with their saved
    statistics and never update them, and the adapters alone hold what training changed.
    """

    FREEZES_RUNNING_STATE = True

    def __init__(self, rank: int, alpha: float, init_std: float | None = None,
                 param_group: ParamGroup | None = None, dtype=None, *, use_rslora: bool = False,
                 use_dora: bool = False, rank_pattern: dict | None = None, alpha_pattern: dict | None = None,
                 module_names: dict | None = None):
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
        self.use_rslora = bool(use_rslora)
        self.use_dora = bool(use_dora)
        self.rank_pattern = _check_pattern("rank_pattern", rank_pattern, _positive_int)
        self.alpha_pattern = _check_pattern("alpha_pattern", alpha_pattern, _number)
        if module_names is not None and not isinstance(module_names, dict):
            raise ValueError(f"Lora: module_names must be a dict {{param path: module name}}, got "
                             f"{type(module_names).__name__}")
        self.module_names = None if module_names is None else dict(module_names)
        self.shared_a: dict = {}  # weight path -> key: the weights whose adapters share one `a` (bound_to)
        self._made_a: dict = {}  # (key, d_in, rank) -> the shared `a` made by this application

    def _replace(self, **changes) -> "Lora":
        kw = dict(init_std=self.init_std, param_group=self.param_group, dtype=self.dtype, use_rslora=self.use_rslora,
                  use_dora=self.use_dora, rank_pattern=self.rank_pattern or None,
                  alpha_pattern=self.alpha_pattern or None, module_names=self.module_names)
        kw.update(changes)
        out = Lora(self.rank, self.alpha, **kw)
        out.shared_a, out._made_a = self.shared_a, self._made_a  # one application's (QLoRA sets the dtype per weight)
        return out

    def bound_to(self, module) -> "Lora":
        """This LoRA for one application to `module`: a copy that knows which of its weights share an
        `a` factor (`module.lora_shared_a()`, see this file's doc), with no factor made yet.
        `apply_reparameterization` calls it."""
        out = self._replace()
        ask = getattr(module, "lora_shared_a", None)
        shared = ask() if callable(ask) else None
        out.shared_a, out._made_a = dict(shared or {}), {}
        return out

    def shared_groups(self, targets) -> list[list[str]]:
        """The groups of more than one of `targets` ((path, param)) that share an `a`."""
        groups: dict = {}
        for path, p in targets:
            key = self.shared_a.get(path)
            if key is not None:
                groups.setdefault((key, p.shape[0], self.rank_for(path)), []).append(path)
        return [paths for paths in groups.values() if len(paths) > 1]

    @property
    def scale(self) -> float:
        """The scale of a parameter no pattern covers: `alpha / rank` (rsLoRA: `alpha / sqrt(rank)`)."""
        return self._scale(self.rank, self.alpha)

    def _scale(self, rank: int, alpha: float) -> float:
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    def module_name(self, path: str) -> str:
        """The name the patterns match for the parameter at `path` (see this file's doc)."""
        if self.module_names is not None and path in self.module_names:
            return self.module_names[path]
        return path.rpartition(".")[0]

    def rank_for(self, path: str) -> int:
        key = pattern_key(self.rank_pattern, self.module_name(path)) if self.rank_pattern else None
        return self.rank if key is None else self.rank_pattern[key]

    def alpha_for(self, path: str) -> float:
        key = pattern_key(self.alpha_pattern, self.module_name(path)) if self.alpha_pattern else None
        return self.alpha if key is None else self.alpha_pattern[key]

    def scale_for(self, path: str) -> float:
        """The scale of the adapter of the parameter at `path`, patterns and rsLoRA applied."""
        return self._scale(self.rank_for(path), self.alpha_for(path))

    def set_param_group(self, group: ParamGroup) -> "Lora":
        return self._replace(param_group=_check_group(group))

    def set_dtype(self, dtype) -> "Lora":
        return self._replace(dtype=dtype)

    def __repr__(self) -> str:
        extra = ""
        if self.use_rslora:
            extra += ", use_rslora=True"
        if self.use_dora:
            extra += ", use_dora=True"
        if self.rank_pattern:
            extra += f", rank_pattern={self.rank_pattern!r}"
        if self.alpha_pattern:
            extra += f", alpha_pattern={self.alpha_pattern!r}"
        return (f"Lora(rank={self.rank}, alpha={self.alpha}, init_std={self.init_std}, "
                f"param_group={self.param_group!r}{extra})")

    def adapts(self, path: str, param: Param) -> bool:
        """Whether the parameter at `path` gets an adapter: rank 2 and in the group."""
        return param.rank == 2 and self.param_group.matches(param.id, path)

    def _factor_dtype(self, param: Param):
        if self.dtype is not None:
            return self.dtype
        if param.is_initialized():
            return param.base().dtype
        return param.lazy_device().default_float_dtype

    def factor_count(self, param: Param, path: str | None = None) -> int:
        """How many values the factors `a` and `b` of a rank-2 `param` hold: `rank * (d_in + d_out)`
        (the rank `rank_pattern` gives `path`), plus `d_out` magnitudes with DoRA."""
        d_in, d_out = param.shape
        rank = self.rank if path is None else self.rank_for(path)
        return rank * (d_in + d_out) + (d_out if self.use_dora else 0)

    def preview(self, model) -> "LoraPreview":
        """What attaching this LoRA to `model` would give, without attaching it or reading a value.
        `model` is the module, or its `(path, param)` list (`module.named_params()`: the total then
        counts every parameter's elements, a QLoRA model's packed storage too; the module's counts
        are `trainable_counts`'). The targets are the parameters the group selects and `adapts`
        accepts, less the factors of adapters attached before (left as they are, trainable when
        they were, as attaching leaves them) and less those that have an adapter (`nested`)."""
        from .summary import ModelStats, TrainableCounts, param_trainable  # noqa: PLC0415 - summary imports this file

        stats = ModelStats(model) if isinstance(model, Module) else None
        params = list(model.named_params() if stats is not None else model)
        # a parameter with parameters below it has a reparameterization (its factors are listed below it)
        paths = {path for path, _ in params}
        owners = {prefix for path in paths for prefix in _prefixes(path)} & paths

        def below_owner(path: str) -> bool:
            return any(prefix in owners for prefix in _prefixes(path))

        # a weight whose reparameterization is only its stored base (a GGUF weight's blocks) takes LoRA
        stored = set() if stats is None else {
            path for path, p in iter_param_slots(model) if getattr(p.reparameterization, "TAKES_ADAPTER", False)}
        selected = [(path, p) for path, p in params
                    if p.kind == "float" and not below_owner(path) and self.adapts(path, p)]
        targets = [(path, p) for path, p in selected if path not in owners or path in stored]
        nested = [(path, p) for path, p in selected if path in owners and path not in stored]
        shapes = dict(targets)
        added = sum(self.factor_count(p, path) for path, p in targets)
        # the module says which weights share an `a` (a LoRA not yet bound to it, as the dialog's, learns it here)
        bound = self.bound_to(model) if stats is not None else self
        added -= bound.shared_savings(shapes)
        shared = {path: paths[0] for paths in bound.shared_groups(targets) for path in paths[1:]}
        if stats is not None:
            total = stats.total.numel
            kept = sum(stats.get(owner).trainable for owner in owners)
        else:
            total = sum(p.numel() for _, p in params)
            kept = sum(p.numel() for path, p in params
                       if (path in owners or below_owner(path)) and param_trainable(p))
        return LoraPreview(targets, added, TrainableCounts(added + kept, total + added), nested, shared)

    def shared_savings(self, targets: dict, itemsize=None) -> int:
        """How many values fewer the factors of `targets` ({path: param}) hold because some share an
        `a` (every part after the first of a group adds no `a` of its own); bytes with `itemsize(param)`
        (the bytes of one value of that weight's factors)."""
        return sum((len(paths) - 1) * targets[paths[0]].shape[0] * self.rank_for(paths[0])
                   * (1 if itemsize is None else itemsize(targets[paths[0]]))
                   for paths in self.shared_groups(targets.items()))

    def factors(self, param: Param, rank: int | None = None) -> tuple[Param, Param]:
        """Fresh trainable `a` ~ N(0, std) `[d_in, rank]` and `b` = 0 `[rank, d_out]` for `param`."""
        d_in, d_out = param.shape
        rank = self.rank if rank is None else int(rank)
        device = param.lazy_device()
        dtype = self._factor_dtype(param)
        std = self.init_std if self.init_std is not None else 1.0 / rank
        a = Tensor.random((d_in, rank), ("normal", 0.0, std), device=device, dtype=dtype)
        b = Tensor.zeros((rank, d_out), device=device, dtype=dtype)
        return Param(a), Param(b)

    def shared_factors(self, path: str, param: Param) -> tuple[Param, Param]:
        """Fresh factors for the weight at `path`; its `a` is the one made for an earlier part of the
        same fused module in this application, if any (see this file's doc)."""
        rank = self.rank_for(path)
        a, b = self.factors(param, rank)
        key = self.shared_a.get(path)
        if key is None:
            return a, b
        return self._made_a.setdefault((key, param.shape[0], rank), a), b

    def reparameterize(self, path: str, param: Param):
        base = param.set_require_grad(False)
        if not self.adapts(path, param):
            return base, None
        a, b = self.shared_factors(path, param)
        scale = self.scale_for(path)
        if self.use_dora:  # the magnitude starts at the base's column norms (b = 0: the value is unchanged)
            weight = param.base()
            m = Tensor.from_data(np.linalg.norm(np.asarray(weight.numpy(), dtype=np.float64), axis=0),
                                 device=weight.device, dtype=self._factor_dtype(param))
            adapter = DoraAdapter(a, b, scale, Param(m), self.use_rslora)
        else:
            adapter = (RsLoraAdapter if self.use_rslora else LoraAdapter)(a, b, scale)
        return base, adapter if param.is_autodiff() else adapter.valid()


def _prefixes(path: str):
    """`a.b.c` -> `a`, `a.b`: the paths above a parameter's."""
    parts = path.split(".")
    return (".".join(parts[:i]) for i in range(1, len(parts)))


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
        if lora.use_dora:
            raise ValueError("QLora: DoRA over an NF4-packed base is not supported; expected a Lora without use_dora")
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size <= 0 \
                or block_size % 2:
            raise ValueError(f"QLora: block_size must be a positive even integer, got {block_size!r}")
        self.lora = lora
        self.block_size = int(block_size)
        self.double_quant = bool(double_quant)

    def __repr__(self) -> str:
        return f"QLora({self.lora!r}, block_size={self.block_size}, double_quant={self.double_quant})"

    def bound_to(self, module) -> "QLora":
        """This QLoRA for one application to `module` (its LoRA's `bound_to`)."""
        return QLora(self.lora.bound_to(module), self.block_size, self.double_quant)

    def reparameterize(self, path: str, param: Param):
        if not self.lora.adapts(path, param):
            return param.set_require_grad(False), None
        weight = param.base()
        packed = quantize_nf4(array(weight), self.block_size, self.double_quant)
        device = weight.device
        nf4 = NF4Weight.from_packed(packed, device)
        lora = self.lora if self.lora.dtype is not None else self.lora.set_dtype(weight.dtype)
        a, b = lora.shared_factors(path, param)
        adapter = QLoraAdapter(a, b, lora.scale_for(path), nf4)
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


def scale_adapters(module: Module, scale: float) -> Module:
    """A model whose every LoRA adapter's delta is `scale` times its own (llama.cpp's `--lora-scaled`):
    0 gives the base weights, 1 the adapted model, 2 twice the fine-tune's change. Nothing is
    copied but the adapters' small records (the factors and weights are shared) and `module` is
    unchanged, so a panel can generate at any strength without touching the document's model. For
    DoRA the low-rank delta is scaled and the learned magnitudes kept (scale 0 is then the base's
    direction at the adapter's magnitudes, not the base). A module without adapters, or a scale that
    is not a finite number, is a ValueError."""
    if not isinstance(module, Module):
        raise TypeError(f"scale_adapters expects a Module, got {type(module).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"scale_adapters: expected the adapter scale to be a finite number, found {scale!r}")
    adapted = [(path, p) for path, p in iter_param_slots(module) if isinstance(p.reparameterization, LoraAdapter)]
    if not adapted:
        raise ValueError(f"scale_adapters: expected a model with LoRA adapters, found a {type(module).__name__} "
                         f"without any")
    out = module.clone()
    for path, p in adapted:
        r = object.__new__(type(p.reparameterization))  # the adapter's fields shared, its scale its own
        r.__dict__.update(p.reparameterization.__dict__)
        r.scale = p.reparameterization.scale * float(scale)
        out = out.with_child(path, p.with_reparameterization(r))
    return out
