"""The losses' shared base (`Reduction`, the reduced-loss layer) and the computations of the
cross entropies, which `engine.nn.loss`'s layers call (the classes, their configs and their
docstrings stay there: the designer's catalog reads them)."""
from __future__ import annotations

import enum

import numpy as np

from ..tensor import Tensor, TensorError
from ..tensor.raw import array, wrap
from . import _ops
from ._base import Layer, f64, member_of

__all__ = ["Reduction", "class_weights", "cross_entropy", "binary_cross_entropy"]


class Reduction(enum.Enum):
    """How a loss reduces its element-wise values: `Auto` is `Mean` (KLDivLoss: `BatchMean`)."""

    Mean = "Mean"
    Sum = "Sum"
    Auto = "Auto"
    BatchMean = "BatchMean"

    @staticmethod
    def of(value) -> "Reduction":
        return member_of(Reduction, value, "reduction", lambda r, v: r.name.lower() == v.replace("_", "").lower())


def _reduce(loss, reduction, owner: str, batch_mean: bool = False):
    r = Reduction.of(reduction)
    if r is Reduction.Sum:
        return loss.sum().reshape(1)
    if r is Reduction.Mean or (r is Reduction.Auto and not batch_mean):
        return loss.mean().reshape(1)
    if batch_mean:
        return (loss.sum() * (1.0 / loss.shape[0])).reshape(1)
    raise ValueError(f"{owner}: {r.name} reduction is not supported (expected Mean, Sum or Auto)")


def _f32(x):
    return None if x is None else np.float32(x)


class _ReducedLoss(Layer):
    """A loss with `forward_no_reduction` (the element-wise values) and a `forward` that reduces
    them (`_reduced`), displayed on one line with the settings named in `_display`.

    Each loss still writes its own `forward` and `forward_no_reduction`: their signatures and
    `Shapes` docstrings are what the designer's catalog and the shape contracts read."""

    _display: tuple[str, ...] = ()
    _batch_mean = False  # `Auto` divides the sum by the batch size (KLDivLoss)

    def _reduced(self, loss, reduction):
        return _reduce(loss, reduction, _owner(type(self)), self._batch_mean)

    def custom_content(self, content):
        for name in self._display:
            content = content.add(name, getattr(self, name))
        return content.optional()


def _owner(cls) -> str:
    """The name of the loss class that defines `forward_no_reduction` (errors name it)."""
    return next(c.__name__ for c in cls.__mro__ if "forward_no_reduction" in c.__dict__)


def class_weights(smoothing, weights, device):
    """Check a cross entropy config's smoothing and weights (as Burn does); the weights as a
    float64 tensor (the values given: the losses cast them to the input's dtype, so that float64
    inputs are not float32-accurate and float32 ones get the same bits as before), or None."""
    if smoothing is not None and not 0.0 <= smoothing <= 1.0:
        raise ValueError(
            f"Alpha of Cross-entropy loss with smoothed labels should be in interval [0, 1]. Got {f64(smoothing)}"
        )
    if weights is not None and not all(w > 0 for w in weights):
        raise ValueError("Weights of cross-entropy have to be positive.")
    if weights is None:
        return None
    return Tensor.from_data(np.asarray(weights, dtype=np.float64), dtype="float64", device=device)


def cross_entropy(logits, targets, pad_tokens, weights, smoothing, log_probs: bool):
    """`CrossEntropyLoss.forward` once the shapes are checked: the pad rows, the targets' range,
    the class weights and the smoothing, then the one softmax cross entropy (`_ops`)."""
    batch_size, num_targets = logits.dims()
    xp = logits.device.xp
    t = array(targets if targets.device is logits.device else targets.to_device(logits.device))
    keep = None
    if pad_tokens:
        keep = ~xp.isin(t, xp.asarray(pad_tokens))
        if bool(keep.all()):
            keep = None
    row = _ops.first_bad_target(t, num_targets, keep)
    if row is not None:
        pads = "" if not pad_tokens else f", or a pad token {pad_tokens}"
        raise TensorError(
            f"CrossEntropyLoss: target class {int(t[row])} is out of range for {num_targets} classes "
            f"at row {row} of the targets (expected 0 <= target < {num_targets}{pads})"
        )
    if keep is not None:
        t = xp.where(keep, t, 0)  # pad rows read class 0 and are scaled by 0
    dtype = array(logits).dtype
    w = None
    if weights is not None:
        if tuple(weights.shape) != (num_targets,):
            raise TensorError(
                f"CrossEntropyLoss: expected one class weight per class ({num_targets}), "
                f"got {weights.shape[0]} weights"
            )
        w = array(weights.to_device(logits.device)).astype(dtype)
    row_w = None if w is None else w[t]
    if keep is not None:
        row_w = keep.astype(dtype) if row_w is None else row_w * keep
    denom = float(batch_size) if row_w is None else float(row_w.sum())
    if denom == 0.0:  # no row counts: the numerator is 0 too, and so is the loss
        denom = 1.0
    if smoothing is None:
        return _ops.softmax_cross_entropy(logits, t, denom, row_w, log_probs=log_probs)
    dist = (t[:, None] == xp.arange(num_targets)[None, :]).astype(dtype)
    a = float(np.dtype(dtype).type(smoothing))  # in the input's precision, as PyTorch's
    dist = dist * (1.0 - a) + a / num_targets
    if w is not None:
        dist = dist * w[None, :]
    if keep is not None:
        dist = dist * keep[:, None]
    return _ops.softmax_cross_entropy(logits, dist, denom, log_probs=log_probs)


def binary_cross_entropy(logits, targets, weights, smoothing, use_logits: bool):
    """`BinaryCrossEntropyLoss.forward` once the shapes are checked."""
    t = targets.to_device(logits.device).cast(logits.dtype)
    if smoothing is not None:
        a = float(np.dtype(array(t).dtype).type(smoothing))  # in the input's precision
        classes = logits.shape[-1] if logits.rank > 1 else 2
        t = t * (1.0 - a) + a / classes
    if use_logits:
        loss = (1.0 - t) * logits - _ops.log_sigmoid(logits)
    else:
        with np.errstate(divide="ignore"):  # log(0) = -inf, clamped to -100 as in Burn
            loss = (t - 1.0) * logits.neg().log1p().clamp_min(-100.0) - t * logits.log().clamp_min(-100.0)
    if weights is not None:
        w = weights.to_device(logits.device).cast(logits.dtype)
        if logits.rank > 1:
            loss = loss * w
        else:
            idx = array(targets.to_device(logits.device))
            loss = loss * wrap(array(w)[idx], logits.device)
    return loss.mean().reshape(1)
