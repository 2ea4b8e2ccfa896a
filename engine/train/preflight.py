"""Before a run trains: the memory a training step needs against what the machine has
(`estimate_run`, checked before anything is read or allocated), then two items of its data
through the model and the loss, so that data that does not fit fails at once with the shapes
and the module where it failed."""
from __future__ import annotations

from ..autodiff import no_recording
from ..module import contracts, memory
from ..module.tree import params as tree_params
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


# ---- the memory of a training step, from shapes only ---------------------------------------------
# saved activations of one transformer layer, in values per token: about 16 of the width
# (the norms' outputs, q, k, v and their rotated copies, the context, the projections, the
# residuals) and 4 of the MLP's hidden width (gate, up, activation, product); the attention's
# scores and probabilities are 2 per head and key
_WIDTH_VALUES, _MLP_VALUES, _SCORE_VALUES = 16, 4, 2
_LOGIT_VALUES = 3  # logits, their log-softmax and its gradient


def optimizer_state_copies(optimizer_config) -> int:
    """The arrays an optimizer keeps per trainable parameter: Adam and AdamW their two moments
    (and the max of the second under AMSGrad), SGD its velocity with momentum; an unknown
    optimizer is counted as Adam."""
    if hasattr(optimizer_config, "amsgrad"):
        return 3 if optimizer_config.amsgrad else 2
    if hasattr(optimizer_config, "momentum"):
        return 1 if optimizer_config.momentum is not None else 0
    return 2


def _transformer_sizes(model) -> dict | None:
    """A transformer's sizes from its `config` (the families of `engine.models`, by their
    config.json names), or None for any other model."""
    cfg = getattr(model, "config", None)

    def first(*names):
        for n in names:
            v = getattr(cfg, n, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    sizes = {"hidden": first("hidden_size", "n_embd"), "layers": first("num_hidden_layers", "n_layer"),
             "heads": first("num_attention_heads", "n_head"),
             "inner": first("intermediate_size", "d_inner", "n_inner"), "vocab": first("vocab_size")}
    if cfg is None or None in (sizes["hidden"], sizes["layers"], sizes["heads"]):
        return None
    sizes["inner"] = sizes["inner"] or 4 * sizes["hidden"]
    sizes["vocab"] = sizes["vocab"] or 0
    return sizes


def estimate_training(model, optimizer_config, batch_size: int, seq_length: int | None = None,
                      device=None) -> memory.MemoryEstimate:
    """What training `model` allocates by its first optimizer step, from shapes only (nothing
    is read or allocated, a lazy 7 B model included): its lazy parameters initialized (and the
    largest one's initializer working arrays), copies of initialized ones moved to `device`, a
    gradient, the optimizer's state (`optimizer_state_copies`) and the step's new value (made
    beside the old one) for each trainable float parameter, and, for a transformer of
    `engine.models` (a `config` with its sizes) fed `batch_size` rows of `seq_length` tokens,
    the activations the forward keeps for the backward (about `batch x seq x (16 hidden +
    4 intermediate) x layers` values plus the attention scores and the logits)."""
    trainable = 0
    itemsize = 4
    for _path, p in tree_params(model):
        size = memory.param_bytes(p)
        if p.kind == "float":
            itemsize = size // p.numel() if p.numel() else itemsize  # the activations' dtype is the weights'
            if p.is_active():
                trainable += size
    moved = memory.estimate_move(model, device).total if device is not None else 0
    parts = {**memory.estimate_initialize(model).parts,
             "copies for the device": moved, "gradients": trainable,
             "optimizer state": optimizer_state_copies(optimizer_config) * trainable,
             "updated weights": trainable}
    sizes = _transformer_sizes(model)
    if sizes is not None and seq_length:
        b, s = int(batch_size), int(seq_length)
        per_layer = b * s * (_WIDTH_VALUES * sizes["hidden"] + _MLP_VALUES * sizes["inner"]) + \
            _SCORE_VALUES * b * sizes["heads"] * s * s
        parts["activations"] = itemsize * (sizes["layers"] * per_layer + _LOGIT_VALUES * b * s * sizes["vocab"])
    return memory.MemoryEstimate("Training", parts)


def estimate_run(model, spec) -> memory.MemoryEstimate:
    """`estimate_training` for a run's settings (`engine.train.run_spec.RunSpec`): its optimizer,
    batch size and device, and for a causal-lm run its block size as the sequence length."""
    from .run_spec import CAUSAL_LM_TASK  # noqa: PLC0415 - run_spec imports the data modules

    data, training = spec.data, spec.training
    seq = int(data.block_size) if data.task == CAUSAL_LM_TASK else None
    return estimate_training(model, spec.optimizer_config, training.batch_size, seq, training.device)
