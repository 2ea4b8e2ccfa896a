"""The burn-mnist architecture paired with the built-in `digits` task (stroke-font digits
0-9 at 28x28, MNIST-normalized; see engine/train/tasks.py).

The model is the `burn-mnist` example's (the architecture of `shared/fixtures/burn-mnist.bpk`),
so a checkpoint trained here loads into it and the other way round.
"""
from engine import Tensor
from resources.examples import build_example

DESCRIPTION = "burn-mnist CNN on digits 0-9 rendered from the built-in stroke font"


def build(device=None):
    return build_example("burn-mnist", device)


def example_input(batch: int = 1, device=None) -> Tensor:
    return Tensor.random((batch, 28, 28), ("normal", 0.0, 1.0), device=device)


def task() -> str:
    """The built-in task this example trains on (`engine.train.build_task`)."""
    return "digits"
