"""Before a run trains: two items of its data through the model and the loss, so that data that
does not fit fails at once with the shapes and the module where it failed."""
from __future__ import annotations

from ..autodiff import no_recording
from ..module import contracts
from .data import DataLoader
from .losses import causal_lm_loss, cross_entropy, mse_loss


class TrainingSetupError(ValueError):
    """The run could not start: the data, the loss or the model do not fit together."""


def _dims(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def preflight(model, train, kind: str, loss: str, device, name: str) -> None:
    """Run two items through the model and the loss; a `TrainingSetupError` says what does not
    fit and at which module."""
    if len(train) == 0:
        raise TrainingSetupError(f"the data set {name} has no training items")
    batch = next(iter(DataLoader(train, min(2, len(train)), shuffle=False, device=device)))
    what = (f"the data set {name} (inputs {_dims(batch.inputs.shape[1:])} {batch.inputs.dtype} per item, "
            f"targets {_dims(batch.targets.shape[1:])} {batch.targets.dtype})")
    vmodel = model.valid() if hasattr(model, "valid") else model
    with no_recording():
        result = contracts.check(vmodel, [batch.inputs], {}, list(vmodel.named_modules()))
        if not result.ok or result.error:
            where = (result.failure.path or "the model's own forward") if result.failure else "the model"
            raise TrainingSetupError(f"{what} does not fit the model: at {where}: {result.error}")
        output = vmodel.forward(batch.inputs)
        if kind == "causal-lm":
            loss_name, loss_fn = "next-token cross-entropy", causal_lm_loss
        else:
            loss_name = loss if loss != "auto" else ("cross-entropy" if kind == "classification" else "mse")
            loss_fn = cross_entropy if loss_name == "cross-entropy" else mse_loss
        try:
            loss_fn(output, batch.targets)
        except Exception as e:  # noqa: BLE001 - reported with the shapes
            raise TrainingSetupError(f"{what} does not fit the {loss_name} loss: the model outputs "
                                     f"{_dims(output.shape)}, the targets are {_dims(batch.targets.shape)}: "
                                     f"{e}") from None
