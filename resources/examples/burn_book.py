"""The model of Burn's book (basic workflow chapter): two convolutions, adaptive pooling,
dropout and two linear layers, classifying 28x28 images into 10 classes."""
from engine import Tensor, assert_shape, nn
from engine.module import Module

DESCRIPTION = "Burn book model: Conv2d x2, AdaptiveAvgPool2d, Dropout, Linear x2 (531,178 parameters)"


class Model(Module):
    def __init__(self, num_classes: int = 10, hidden_size: int = 512, dropout: float = 0.5, device=None):
        self.conv1 = nn.Conv2dConfig([1, 8], [3, 3]).init(device)
        self.conv2 = nn.Conv2dConfig([8, 16], [3, 3]).init(device)
        self.pool = nn.AdaptiveAvgPool2dConfig([8, 8]).init()
        self.dropout = nn.DropoutConfig(dropout).init()
        self.linear1 = nn.LinearConfig(16 * 8 * 8, hidden_size).init(device)
        self.linear2 = nn.LinearConfig(hidden_size, num_classes).init(device)
        self.activation = nn.Relu()

    def forward(self, images):
        """Classifies a batch of images.

        # Shapes

        - images: `[batch_size, height, width]`
        - output: `[batch_size, num_classes]`
        """
        assert_shape(images, [None, None, None])
        batch_size, height, width = images.dims()
        x = images.reshape(batch_size, 1, height, width)
        x = self.conv1.forward(x)
        x = self.dropout.forward(x)
        x = self.conv2.forward(x)
        x = self.dropout.forward(x)
        x = self.activation.forward(x)
        x = self.pool.forward(x)
        x = x.reshape(batch_size, 16 * 8 * 8)
        x = self.linear1.forward(x)
        x = self.dropout.forward(x)
        x = self.activation.forward(x)
        return self.linear2.forward(x)


def build(device=None) -> Model:
    return Model(device=device)


def example_input(batch: int, device=None):
    return Tensor.random([batch, 28, 28], device=device)
