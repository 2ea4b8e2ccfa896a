"""A small MLP paired with the built-in `spirals` task (two interleaved spirals in the unit
disc, two classes; see engine/train/tasks.py)."""
from engine import Tensor, nn
from engine.module import Module

DESCRIPTION = "MLP 2 -> 64 -> 64 -> 2 (Relu) on two interleaved spirals"


class Model(Module):
    def __init__(self, device=None, hidden: int = 64):
        self.fc1 = nn.LinearConfig(2, hidden).init(device)
        self.fc2 = nn.LinearConfig(hidden, hidden).init(device)
        self.fc3 = nn.LinearConfig(hidden, 2).init(device)
        self.activation = nn.Relu()

    def forward(self, input):
        """# Shapes

        - input: `[batch_size, 2]`
        - output: `[batch_size, 2]`
        """
        x = self.activation.forward(self.fc1.forward(input))
        x = self.activation.forward(self.fc2.forward(x))
        return self.fc3.forward(x)


def build(device=None) -> Model:
    return Model(device)


def example_input(batch: int = 1, device=None) -> Tensor:
    return Tensor.random((batch, 2), ("uniform", -1.0, 1.0), device=device)


def task() -> str:
    """The built-in task this example trains on (`engine.train.build_task`)."""
    return "spirals"
