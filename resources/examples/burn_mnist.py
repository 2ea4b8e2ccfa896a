"""The MNIST classifier of Burn's `mnist-inference-web` example, the architecture of the
`burn-mnist.bpk` fixture: two conv blocks (conv, batch norm, relu, max pool), three linear
layers with Gelu and dropout 0.25. Parameter paths match the checkpoint (`conv1.conv.weight`,
`conv1.norm.gamma`, ..., `fc3.bias`)."""
from engine import Tensor, assert_shape, nn
from engine.module import Module

DESCRIPTION = "Burn's MNIST example (mnist-inference-web): 2 conv blocks + 3 linear layers"


class ConvBlock(Module):
    def __init__(self, channels, kernel_size, pool: bool, device=None):
        self.conv = nn.Conv2dConfig(channels, kernel_size, padding=nn.PaddingConfig2d.Valid).init(device)
        self.norm = nn.BatchNormConfig(channels[1]).init(device)
        self.pool = nn.MaxPool2dConfig([2, 2], strides=[2, 2]).init() if pool else None
        self.activation = nn.Relu()

    def forward(self, input):
        """conv -> norm -> relu -> pool.

        # Shapes

        - input: `[batch_size, channels_in, height, width]`
        - output: `[batch_size, channels_out, height_out, width_out]`
        """
        x = self.conv.forward(input)
        x = self.norm.forward(x)
        x = self.activation.forward(x)
        return self.pool.forward(x) if self.pool is not None else x


class Model(Module):
    def __init__(self, device=None):
        self.conv1 = ConvBlock([1, 64], [3, 3], True, device)
        self.conv2 = ConvBlock([64, 64], [3, 3], True, device)
        self.dropout = nn.DropoutConfig(0.25).init()
        self.fc1 = nn.LinearConfig(64 * 5 * 5, 128).init(device)
        self.fc2 = nn.LinearConfig(128, 128).init(device)
        self.fc3 = nn.LinearConfig(128, 10).init(device)
        self.activation = nn.Gelu()

    def forward(self, input):
        """Digit logits for a batch of normalized 28x28 images.

        # Shapes

        - input: `[batch_size, 28, 28]`
        - output: `[batch_size, 10]`
        """
        assert_shape(input, [None, 28, 28])
        batch_size = input.dims()[0]
        x = input.reshape(batch_size, 1, 28, 28)
        x = self.conv1.forward(x)
        x = self.conv2.forward(x)
        x = x.reshape(batch_size, 64 * 5 * 5)
        x = self.activation.forward(self.fc1.forward(x))
        x = self.dropout.forward(x)
        x = self.activation.forward(self.fc2.forward(x))
        x = self.dropout.forward(x)
        return self.fc3.forward(x)


def build(device=None) -> Model:
    return Model(device)


def example_input(batch: int, device=None):
    """Random pixels scaled as the checkpoint expects: ((pixel / 255) - 0.1307) / 0.3081."""
    pixels = Tensor.random([batch, 28, 28], device=device)
    return (pixels - 0.1307) * (1.0 / 0.3081)
