"""The training loop's default losses, each one recorded node with its own backward rule.

- `cross_entropy(logits, targets, pad_token=None)`: mean over items of
  `logsumexp(logits) - logits[target]`; logits `[..., classes]`, integer targets `[...]`, a
  rank-0 result. Items whose target is `pad_token` count for nothing. It checks the targets
  and hands the arithmetic to `engine.nn`'s fused softmax cross entropy (the kernel
  `CrossEntropyLoss` uses too), whose backward rule is `(softmax - one_hot) / n`: one node
  per step instead of four.
- `mse_loss(output, targets)`: mean of squared differences (targets as a constant).
- `causal_lm_loss(logits, targets)`: next-token cross entropy, logits `[batch, seq, vocab]`,
  targets `[batch, seq]` (already shifted, `engine.train.text`); targets equal to
  `IGNORE_INDEX` (-100: pads, prompt tokens) count for nothing, the mean is over the others
  (`nn.CrossEntropyLoss(pad_tokens=[-100])`'s semantics; no kept target: 0).

`engine.nn` has Burn's loss modules (CrossEntropyLoss, MseLoss, ...); a training step may use
those instead. These are what the loop uses when the step is left to it.
"""
from __future__ import annotations

from ..nn.functional import first_bad_target, softmax_cross_entropy
from ..tensor import Tensor, TensorError
from ..tensor.raw import array, record

IGNORE_INDEX = -100  # a target that counts for nothing (PyTorch's ignore_index default)


def cross_entropy(logits: Tensor, targets: Tensor, pad_token: int | None = None) -> Tensor:
    x = array(logits)
    y = array(targets) if isinstance(targets, Tensor) else targets
    xp = logits.device.xp
    if logits.kind != "float":
        raise TensorError(f"cross_entropy: expected float logits, got {logits.dtype}")
    if y.dtype.kind not in "iu":
        raise TensorError(f"cross_entropy: expected integer class targets, got dtype {y.dtype}")
    if x.ndim < 1 or tuple(y.shape) != tuple(x.shape[:-1]):
        raise TensorError(
            f"cross_entropy: expected targets of dims {list(x.shape[:-1])} (the logits' dims without the "
            f"class axis), got logits {list(x.shape)} and targets {list(y.shape)}"
        )
    c = x.shape[-1]
    y1 = y.reshape(-1)
    keep = None
    if pad_token is not None:
        keep = y1 != pad_token
    i = first_bad_target(y1, c, keep)
    if i is not None:
        pad = "" if pad_token is None else f", or the pad token {pad_token}"
        raise TensorError(
            f"cross_entropy: class index {int(y1[i])} is out of range for {c} classes at item {i} of the "
            f"flattened targets (expected 0 <= target < {c}{pad})"
        )
    row_weights = None
    if keep is not None:
        y1 = xp.where(keep, y1, 0)  # pad items read class 0 and are weighted 0
        row_weights = keep
    n = int(keep.sum()) if keep is not None else y1.shape[0]
    return softmax_cross_entropy(logits, y1, max(n, 1), row_weights, dims=())


def mse_loss(output: Tensor, targets: Tensor) -> Tensor:
    x = array(output)
    y = array(targets) if isinstance(targets, Tensor) else targets
    xp = output.device.xp
    if tuple(y.shape) != tuple(x.shape):
        raise TensorError(f"mse_loss: expected targets of dims {list(x.shape)} like the output, got {list(y.shape)}")
    diff = x - y.astype(x.dtype, copy=False)
    n = diff.size
    out = xp.asarray((diff * diff).sum() / max(n, 1), dtype=x.dtype)

    def rule(g):
        return (diff * (g * (2.0 / max(n, 1))).astype(diff.dtype),)

    return record(out, output.device, (output,), rule, "mse_loss")


def causal_lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross entropy over the targets that are not `IGNORE_INDEX`."""
    return cross_entropy(logits, targets, IGNORE_INDEX)
