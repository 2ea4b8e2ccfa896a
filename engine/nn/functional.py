"""Functions behind the losses, public for the code that computes a loss without a loss module
(the training loop's masked cross entropy, `engine.train.losses`), as PyTorch's
`torch.nn.functional` is for its losses."""
from ._ops import first_bad_target, softmax_cross_entropy

__all__ = ["first_bad_target", "softmax_cross_entropy"]
