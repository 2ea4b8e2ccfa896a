"""Loss functions under Burn's names, each a module with a `…Config` where Burn has one.

Reduced losses are tensors of dims `[1]`, as Burn returns them; `forward_no_reduction` keeps
the element-wise values. `_ReducedLoss` (engine/nn/_loss_ops.py, with `Reduction` and the cross
entropies' computations) holds what those losses share: the reduction and the one-line display
of their settings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..tensor import TensorError
from . import _loss_ops, _ops
from ._loss_ops import Reduction, _f32, _reduce, _ReducedLoss
from ._base import Config, Layer, Module, assert_shape, f64
from .misc import cosine_similarity, lp_norm

__all__ = [
    "Reduction",
    "CrossEntropyLossConfig", "CrossEntropyLoss",
    "BinaryCrossEntropyLossConfig", "BinaryCrossEntropyLoss",
    "MseLoss",
    "HuberLossConfig", "HuberLoss",
    "SmoothL1LossConfig", "SmoothL1Loss",
    "KLDivLossConfig", "KLDivLoss",
    "CosineEmbeddingLossConfig", "CosineEmbeddingLoss",
    "MarginRankingLossConfig", "MarginRankingLoss",
    "TripletMarginLossConfig", "TripletMarginLoss",
    "GaussianNLLLossConfig", "GaussianNLLLoss",
    "PoissonNllLossConfig", "PoissonNllLoss",
    "HingeEmbeddingLossConfig", "HingeEmbeddingLoss",
    "MultiMarginLossConfig", "MultiMarginLoss",
    "SoftMarginLoss",
]


# ---------------------------------------------------------------------- cross entropy
@dataclass
class CrossEntropyLossConfig(Config):
    """Configuration of a [`CrossEntropyLoss`]: pad tokens, class weights, label smoothing."""

    pad_tokens: list | None = None
    weights: list | None = None
    smoothing: float | None = None
    logits: bool = True

    def init(self, device=None) -> "CrossEntropyLoss":
        weights = _loss_ops.class_weights(self.smoothing, self.weights, device)
        pads = None if self.pad_tokens is None else [int(p) for p in self.pad_tokens]
        return CrossEntropyLoss(pads, weights, self.smoothing, self.logits)


class CrossEntropyLoss(Layer):
    """Cross entropy of logits (or of probabilities, with `logits=False`) against integer
    class targets, reduced to the mean over the rows that count: PyTorch's
    `F.cross_entropy(x, t, weight=w, ignore_index=pad, label_smoothing=a)`, which current Burn
    computes too. With `logits=False` the input holds probabilities and `log p` takes the place
    of log_softmax, smoothed or not: PyTorch's `F.nll_loss(torch.log(p), ...)`. Unlike Burn,
    the probabilities are not clamped away from 0 first: a 0 where the target has weight gives
    an infinite loss, as in PyTorch.

    With `p` the softmax of the logits (or the input itself with `logits=False`) and `d_i` the
    target distribution of row `i` (one-hot; with label smoothing `a`, `(1 - a) one_hot + a /
    classes`), the loss is

        -sum_i sum_c r_i w_c d_ic log p_ic / sum_i r_i w[t_i]

    where `r_i` is 0 for a row whose target is one of the pad tokens (several may be given; a
    pad token need not be a valid class, e.g. -100) and 1 otherwise, and `w` the class weights
    (all 1 without). Without weights that is the mean over the non-pad rows; with weights the
    weighted mean, normalised by the non-pad rows' target weights, as PyTorch does (with
    smoothing too). Pad rows get a zero gradient. With probabilities, an entry whose target
    weight `d_ic` is 0 counts for nothing even where `p_ic` is 0 (no `0 * log 0`).

    A batch in which no row counts (every target a pad, or no rows) gives a loss of 0 and a
    zero gradient, not the `nan` (0 / 0) of PyTorch and Burn: such a batch carries nothing to
    learn, and a NaN would spoil every parameter it reached.
    """

    def __init__(self, pad_tokens, weights, smoothing, logits: bool):
        super().__init__()
        self.pad_tokens = pad_tokens
        self.weights = weights
        self.smoothing = None if smoothing is None else float(smoothing)
        self.logits = bool(logits)

    def forward(self, logits, targets):
        """Compute the criterion on the input tensor.

        # Shapes

        - logits: `[batch_size, num_targets]` (probabilities with `logits=False`)
        - targets: `[batch_size]`
        - output: `[1]`
        """
        assert_shape(logits, [None, None])
        batch_size, num_targets = logits.dims()
        assert_shape(targets, [batch_size])
        if targets.kind != "int":
            raise TensorError(f"CrossEntropyLoss: expected int class targets, got {targets.dtype}")
        return _loss_ops.cross_entropy(logits, targets, self.pad_tokens, self.weights, self.smoothing, self.logits)

    def custom_content(self, content):
        pads = "None" if self.pad_tokens is None else f"Vec<0..{len(self.pad_tokens)}>"
        return (
            content.add("pad_tokens", pads)
            .add("weights", self.weights)
            .add("smoothing", _f32(self.smoothing))
            .add("logits", self.logits)
            .optional()
        )


@dataclass
class BinaryCrossEntropyLossConfig(Config):
    """Configuration of a [`BinaryCrossEntropyLoss`]."""

    weights: list | None = None
    smoothing: float | None = None
    logits: bool = False

    def init(self, device=None) -> "BinaryCrossEntropyLoss":
        weights = _loss_ops.class_weights(self.smoothing, self.weights, device)
        return BinaryCrossEntropyLoss(weights, self.smoothing, self.logits)


class BinaryCrossEntropyLoss(Layer):
    """Binary (or multi-label) cross entropy of probabilities, or of logits with `logits=True`."""

    def __init__(self, weights, smoothing, logits: bool):
        super().__init__()
        self.weights = weights
        self.smoothing = None if smoothing is None else float(smoothing)
        self.logits = bool(logits)

    def forward(self, logits, targets):
        """Compute the criterion on the input tensor.

        # Shapes

        Binary:
        - logits: `[batch_size]`
        - targets: `[batch_size]`

        Multi-label:
        - logits: `[batch_size, num_classes]`
        - targets: `[batch_size, num_classes]`
        - output: `[1]`
        """
        assert_shape(targets, list(logits.dims()))
        if self.weights is not None and logits.rank > 1:
            assert_shape(self.weights, [logits.dims()[-1]])
        return _loss_ops.binary_cross_entropy(logits, targets, self.weights, self.smoothing, self.logits)

    def custom_content(self, content):
        return (
            content.add("weights", self.weights)
            .add("smoothing", _f32(self.smoothing))
            .add("logits", self.logits)
            .optional()
        )


# ---------------------------------------------------------------------- regression losses
class MseLoss(_ReducedLoss):
    """Mean squared error: `(logits - targets)^2`, reduced."""

    def __init__(self):
        super().__init__()

    def forward(self, logits, targets, reduction=Reduction.Auto):
        """Compute the criterion on the input tensor.

        # Shapes

        - logits: `[batch_size, num_targets]`
        - targets: `[batch_size, num_targets]`
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(logits, targets), reduction)

    def forward_no_reduction(self, logits, targets):
        """The element-wise squared errors (same dims as the inputs)."""
        assert_shape(targets, list(logits.dims()))
        d = logits - targets
        return d * d


@dataclass
class HuberLossConfig(Config):
    """Configuration of a [`HuberLoss`]."""

    delta: float

    def init(self, device=None) -> "HuberLoss":
        if not self.delta >= 0.0:
            raise ValueError("Delta for Huber loss must be a non-negative number.")
        return HuberLoss(self.delta)


class HuberLoss(_ReducedLoss):
    """`0.5 r^2` where `|r| <= delta`, else `delta * |r| - 0.5 delta^2` (`r = targets - predictions`)."""

    _display = ("delta", "lin_bias")

    def __init__(self, delta: float):
        super().__init__()
        self.delta = np.float32(delta)
        self.lin_bias = np.float32(self.delta * self.delta * np.float32(0.5))

    def forward(self, predictions, targets, reduction=Reduction.Auto):
        """Compute the loss element-wise, then reduce to a single value.

        # Shapes

        - predictions: `[...dims]`
        - targets: `[...dims]`
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(predictions, targets), reduction)

    def forward_no_reduction(self, predictions, targets):
        """The element-wise loss (same dims as the inputs)."""
        assert_shape(targets, list(predictions.dims()))
        return self.forward_residuals(targets - predictions)

    def forward_residuals(self, residuals):
        """The element-wise loss of residuals `targets - predictions`."""
        d = float(self.delta)
        large = residuals.abs() > d
        outside = residuals.clamp(-d, d) * residuals - float(self.lin_bias)
        inside = residuals * residuals * 0.5
        return inside.mask_where(large, outside)


@dataclass
class SmoothL1LossConfig(Config):
    """Configuration of a [`SmoothL1Loss`]."""

    beta: float = 1.0

    def init(self, device=None) -> "SmoothL1Loss":
        if not self.beta > 0.0:
            raise ValueError("The parameter beta must be positive.")
        return SmoothL1Loss(self.beta)


class SmoothL1Loss(Module):
    """`0.5 e^2 / beta` where `|e| < beta`, else `|e| - 0.5 beta` (`e = predictions - targets`)."""

    def __init__(self, beta: float = 1.0):
        super().__init__()
        self.beta = np.float32(beta)

    def forward(self, predictions, targets):
        """The element-wise smooth L1 loss (Burn's `forward` does not reduce).

        # Shapes

        - predictions: `[...dims]`
        - targets: `[...dims]`
        - output: `[...dims]`
        """
        assert_shape(targets, list(predictions.dims()))
        beta = float(self.beta)
        err = predictions - targets
        absd = err.abs()
        return (absd - 0.5 * beta).mask_where(absd < beta, err * err * (0.5 / beta))

    def forward_with_reduction(self, predictions, targets, reduction=Reduction.Auto):
        """The loss reduced to dims `[1]`."""
        return _reduce(self.forward(predictions, targets), reduction, "SmoothL1Loss")

    def forward_reduce_dims(self, predictions, targets, dims):
        """The loss averaged over `dims` (kept with size 1)."""
        out = self.forward(predictions, targets)
        for d in sorted(dims, reverse=True):
            out = out.mean(d, keepdim=True)
        return out


@dataclass
class KLDivLossConfig(Config):
    """Configuration of a [`KLDivLoss`]."""

    log_target: bool = False

    def init(self, device=None) -> "KLDivLoss":
        return KLDivLoss(self.log_target)


class KLDivLoss(_ReducedLoss):
    """Kullback-Leibler divergence of log-probability predictions against targets.

    `Auto` (and `BatchMean`) divide the sum by the batch size, as the definition wants.
    """

    _display = ("log_target",)
    _batch_mean = True

    def __init__(self, log_target: bool = False):
        super().__init__()
        self.log_target = bool(log_target)

    def forward(self, predictions, targets, reduction=Reduction.Auto):
        """Compute the criterion on the input tensor.

        # Shapes

        - predictions: `[batch_size, num_targets]`
        - targets: `[batch_size, num_targets]`
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(predictions, targets), reduction)

    def forward_no_reduction(self, predictions, targets):
        """The element-wise divergence terms."""
        assert_shape(targets, list(predictions.dims()))
        if self.log_target:
            return targets.exp() * (targets - predictions)
        return targets * (targets.clamp(1e-8, 1.0).log() - predictions)


# ---------------------------------------------------------------------- embedding / ranking losses
@dataclass
class CosineEmbeddingLossConfig(Config):
    """Configuration of a [`CosineEmbeddingLoss`]."""

    margin: float = 0.0
    reduction: Reduction = Reduction.Mean

    def init(self, device=None) -> "CosineEmbeddingLoss":
        return CosineEmbeddingLoss(self.margin, Reduction.of(self.reduction))


class CosineEmbeddingLoss(_ReducedLoss):
    """`1 - cos(x1, x2)` for target 1, `max(0, cos(x1, x2) - margin)` for target -1."""

    def __init__(self, margin: float = 0.0, reduction: Reduction = Reduction.Mean):
        super().__init__()
        self.margin = np.float32(margin)
        self.reduction = Reduction.of(reduction)

    def forward(self, input1, input2, target):
        """Compute the loss with the configured reduction.

        # Shapes

        - input1: `[batch_size, embedding_dim]`
        - input2: `[batch_size, embedding_dim]`
        - target: `[batch_size]` with values 1 or -1
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(input1, input2, target), self.reduction)

    def forward_no_reduction(self, input1, input2, target):
        """The loss of each pair, dims `[batch_size]`."""
        assert_shape(input1, [None, None])
        batch_size, embedding_dim = input1.dims()
        assert_shape(input2, [batch_size, embedding_dim])
        assert_shape(target, [batch_size])
        cos = cosine_similarity(input1, input2, 1).squeeze(1)
        t = target.to_device(cos.device)
        zero = cos * 0.0
        loss = zero.mask_where(t.equal(1), 1.0 - cos)
        return loss.mask_where(t.equal(-1), (cos - float(self.margin)).relu())

    def custom_content(self, content):
        return content.add("margin", self.margin).add("reduction", self.reduction.name).optional()


@dataclass
class MarginRankingLossConfig(Config):
    """Configuration of a [`MarginRankingLoss`]."""

    margin: float = 0.0

    def init(self, device=None) -> "MarginRankingLoss":
        if not self.margin >= 0.0:
            raise ValueError("Margin for margin ranking loss must be a non-negative number.")
        return MarginRankingLoss(self.margin)


class MarginRankingLoss(_ReducedLoss):
    """`max(0, -y * (x1 - x2) + margin)` for targets `y` of +1 or -1."""

    _display = ("margin",)

    def __init__(self, margin: float = 0.0):
        super().__init__()
        self.margin = float(margin)

    def forward(self, first, second, target, reduction=Reduction.Auto):
        """Compute the loss element-wise, then reduce to a single value.

        # Shapes

        - first: `[...dims]`
        - second: `[...dims]`
        - target: `[...dims]`
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(first, second, target), reduction)

    def forward_no_reduction(self, first, second, target):
        """The element-wise loss."""
        dims = list(first.dims())
        assert_shape(second, dims)
        assert_shape(target, dims)
        return (target * (first - second) * -1.0 + self.margin).relu()


@dataclass
class TripletMarginLossConfig(Config):
    """Configuration of a [`TripletMarginLoss`]."""

    margin: float = 1.0
    p: float = 2.0

    def init(self, device=None) -> "TripletMarginLoss":
        return TripletMarginLoss(self.margin, self.p)


class TripletMarginLoss(_ReducedLoss):
    """`max(0, |a - p|_p - |a - n|_p + margin)` per triplet."""

    _display = ("margin", "p")

    def __init__(self, margin: float = 1.0, p: float = 2.0):
        super().__init__()
        self.margin = float(margin)
        self.p = float(p)

    def forward(self, anchor, positive, negative, reduction=Reduction.Auto):
        """Compute the loss for each triplet, then reduce to a single value.

        # Shapes

        - anchor: `[batch_size, embedding_dim]`
        - positive: `[batch_size, embedding_dim]`
        - negative: `[batch_size, embedding_dim]`
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(anchor, positive, negative), reduction)

    def forward_no_reduction(self, anchor, positive, negative):
        """The loss of each triplet, dims `[batch_size]`."""
        assert_shape(anchor, [None, None])
        batch_size, embedding_dim = anchor.dims()
        assert_shape(positive, [batch_size, embedding_dim])
        assert_shape(negative, [batch_size, embedding_dim])
        dp = lp_norm(anchor - positive, self.p, 1).squeeze(1)
        dn = lp_norm(anchor - negative, self.p, 1).squeeze(1)
        return (dp - dn + self.margin).clamp_min(0.0)


@dataclass
class GaussianNLLLossConfig(Config):
    """Configuration of a [`GaussianNLLLoss`]."""

    eps: float = 1e-6
    full: bool = False

    def init(self, device=None) -> "GaussianNLLLoss":
        return GaussianNLLLoss(self.eps, self.full)


_HALF_LN_TWO_PI = 0.5 * math.log(2.0 * math.pi)


class GaussianNLLLoss(_ReducedLoss):
    """`0.5 * (log(var) + (input - target)^2 / var)`, var clamped to at least `eps`."""

    _display = ("eps", "full")

    def __init__(self, eps: float = 1e-6, full: bool = False):
        super().__init__()
        self.eps = float(eps)
        self.full = bool(full)

    def forward(self, input, target, var, reduction=Reduction.Auto):
        """Compute the loss element-wise, then reduce to a single value.

        # Shapes

        - input: `[...dims]` (predicted mean)
        - target: `[...dims]`
        - var: `[...dims]` (predicted variance, positive)
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(input, target, var), reduction)

    def forward_no_reduction(self, input, target, var):
        """The element-wise loss."""
        dims = list(input.dims())
        assert_shape(target, dims)
        assert_shape(var, dims)
        v = var.clamp_min(self.eps)
        d = input - target
        loss = (v.log() + d * d / v) * 0.5
        return loss + _HALF_LN_TWO_PI if self.full else loss


@dataclass
class PoissonNllLossConfig(Config):
    """Configuration of a [`PoissonNllLoss`]."""

    log_input: bool = True
    full: bool = False
    eps: float = 1e-8

    def init(self, device=None) -> "PoissonNllLoss":
        if not self.eps > 0.0:
            raise ValueError("eps for PoissonNllLoss must be a positive number.")
        return PoissonNllLoss(self.log_input, self.full, self.eps)


class PoissonNllLoss(_ReducedLoss):
    """Poisson negative log likelihood: `exp(p) - t p` (log input) or `p - t log(p + eps)`.

    With `full`, Stirling's term `t log t - t + 0.5 log(2 pi t)` is added where `t > 1`.
    """

    _display = ("log_input", "full", "eps")

    def __init__(self, log_input: bool = True, full: bool = False, eps: float = 1e-8):
        super().__init__()
        self.log_input = bool(log_input)
        self.full = bool(full)
        self.eps = float(eps)

    def forward(self, predictions, targets, reduction=Reduction.Auto):
        """Compute the loss element-wise, then reduce to a single value.

        # Shapes

        - predictions: `[...dims]`
        - targets: `[...dims]`
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(predictions, targets), reduction)

    def forward_no_reduction(self, predictions, targets):
        """The element-wise loss."""
        assert_shape(targets, list(predictions.dims()))
        if bool((targets < 0).any()):
            raise ValueError("All the values of `targets` must be non-negative.")
        if not self.log_input and bool((predictions < 0).any()):
            raise ValueError("When `log_input` is `false`, all the values of `predictions` must be non-negative.")
        if self.log_input:
            loss = predictions.exp() - targets * predictions
        else:
            loss = predictions - targets * (predictions + self.eps).log()
        if self.full:
            safe = targets.clamp_min(1.0)
            stirling = safe * safe.log() - safe + (safe * (2.0 * math.pi)).log() * 0.5
            loss = loss + stirling.mask_fill(targets <= 1.0, 0.0)
        return loss


@dataclass
class HingeEmbeddingLossConfig(Config):
    """Configuration of a [`HingeEmbeddingLoss`]."""

    margin: float = 1.0

    def init(self, device=None) -> "HingeEmbeddingLoss":
        return HingeEmbeddingLoss(self.margin)


class HingeEmbeddingLoss(_ReducedLoss):
    """`x` where the target is 1, `max(0, margin - x)` where it is -1."""

    _display = ("margin",)

    def __init__(self, margin: float = 1.0):
        super().__init__()
        self.margin = float(margin)

    def forward(self, input, target, reduction=Reduction.Auto):
        """Compute the loss element-wise, then reduce to a single value.

        # Shapes

        - input: `[...dims]`
        - target: `[...dims]` (values in `{-1, 1}`)
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(input, target), reduction)

    def forward_no_reduction(self, input, target):
        """The element-wise loss."""
        assert_shape(target, list(input.dims()))
        negative = (input * -1.0 + self.margin).clamp_min(0.0)
        return negative.mask_where(target.equal(1), input)


@dataclass
class MultiMarginLossConfig(Config):
    """Configuration of a [`MultiMarginLoss`]."""

    margin: float = 1.0
    p: int = 1

    def init(self, device=None) -> "MultiMarginLoss":
        if not self.margin >= 0.0:
            raise ValueError(f"Margin for multi margin loss must be non-negative, got {f64(self.margin)}")
        if self.p not in (1, 2):
            raise ValueError(f"Multi margin loss only supports p = 1 or p = 2, got {self.p}")
        return MultiMarginLoss(self.margin, self.p)


class MultiMarginLoss(_ReducedLoss):
    """`(1 / C) * sum over i != y of max(0, margin - x[y] + x[i])^p` per sample."""

    _display = ("margin", "p")

    def __init__(self, margin: float = 1.0, p: int = 1):
        super().__init__()
        self.margin = float(margin)
        self.p = int(p)

    def forward(self, input, target, reduction=Reduction.Auto):
        """Compute the loss for each sample, then reduce to a single value.

        # Shapes

        - input: `[batch_size, num_classes]`
        - target: `[batch_size]` (class indices in `0..num_classes`)
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(input, target), reduction)

    def forward_no_reduction(self, input, target):
        """The loss of each sample, dims `[batch_size]`."""
        assert_shape(input, [None, None])
        batch_size, num_classes = input.dims()
        assert_shape(target, [batch_size])
        correct = input.gather(1, target.reshape(batch_size, 1))
        h = (input - correct + self.margin).clamp_min(0.0)
        if self.p == 2:
            h = h * h
        margin_p = self.margin**self.p
        return (h.sum(1) - margin_p) * (1.0 / num_classes)


class SoftMarginLoss(_ReducedLoss):
    """`log(1 + exp(-target * logit))` for targets of +1 or -1."""

    def __init__(self):
        super().__init__()

    def forward(self, logits, targets, reduction=Reduction.Auto):
        """Compute the criterion on the input tensor.

        # Shapes

        - logits: `[batch_size, num_targets]`
        - targets: `[batch_size, num_targets]` (values in `{-1, 1}`)
        - output: `[1]`
        """
        return self._reduced(self.forward_no_reduction(logits, targets), reduction)

    def forward_no_reduction(self, logits, targets):
        """The element-wise loss."""
        assert_shape(targets, list(logits.dims()))
        return _ops.softplus(targets * logits * -1.0, 1.0)
