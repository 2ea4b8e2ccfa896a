"""The burn-mnist architecture paired with the built-in `digits` task (stroke-font digits
0-9 at 28x28, MNIST-normalized; see engine/train/tasks.py).

The model is the one of `shared/fixtures/burn-mnist.bpk` (Burn's mnist-inference-web example):
two conv blocks (Conv2d 3x3 Valid -> BatchNorm -> Relu -> MaxPool2d 2x2), dropout 0.25, and
three Linear layers 1600 -> 128 -> 128 -> 10 with exact Gelu between them.
"""
from engine import Tensor, nn
from engine.module import Module

DESCRIPTION = "burn-mnist CNN on digits 0-9 rendered from the built-in stroke font"


class ConvBlock(Module):
    def __init__(self, channels, device=None):
        self.conv = nn.Conv2dConfig(channels, (3, 3)).init(device)
        self.norm = nn.BatchNormConfig(channels[1]).init(device)
        self.pool = nn.MaxPool2dConfig((2, 2), strides=(2, 2)).init()
        self.activation = nn.Relu()

    def forward(self, x):
        x = self.activation.forward(self.norm.forward(self.conv.forward(x)))
        return self.pool.forward(x)


class Model(Module):
    def __init__(self, device=None):
        self.conv1 = ConvBlock((1, 64), device)
        self.conv2 = ConvBlock((64, 64), device)
        self.dropout = nn.DropoutConfig(0.25).init()
        self.fc1 = nn.LinearConfig(1600, 128).init(device)
        self.fc2 = nn.LinearConfig(128, 128).init(device)
        self.fc3 = nn.LinearConfig(128, 10).init(device)
        self.activation = nn.Gelu()

    def forward(self, input):
        """# Shapes

        - input: `[batch_size, 28, 28]`
        - output: `[batch_size, 10]`
        """
        batch = input.shape[0]
        x = input.reshape((batch, 1, 28, 28))
        x = self.conv2.forward(self.conv1.forward(x))
        x = x.reshape((batch, 1600))
        x = self.dropout.forward(self.activation.forward(self.fc1.forward(x)))
        x = self.dropout.forward(self.activation.forward(self.fc2.forward(x)))
        return self.fc3.forward(x)


def build(device=None) -> Model:
    return Model(device)


def example_input(batch: int = 1, device=None) -> Tensor:
    return Tensor.random((batch, 28, 28), ("normal", 0.0, 1.0), device=device)


def task() -> str:
    """The built-in task this example trains on (`engine.train.build_task`)."""
    return "digits"
