"""Small real engine models the widget and app tests open (built from engine.nn layers)."""
from engine import Tensor, nn
from engine.module import Module, Param


class Block(Module):
    """A linear layer and an activation.

    # Shapes

    - input: `[batch, d_in]`
    - output: `[batch, d_out]`
    """

    def __init__(self, d_in, d_out):
        self.linear = nn.LinearConfig(d_input=d_in, d_output=d_out).init()
        self.activation = nn.Relu()
        self.d_in = d_in
        self.d_out = d_out

    def forward(self, x):
        return self.activation.forward(self.linear.forward(x))


class Mlp(Module):
    """Two blocks, a head, a scale parameter and a constant.

    # Shapes

    - input: `[batch, 8]`
    - output: `[batch, 3]`
    """

    def __init__(self):
        self.blocks = [Block(8, 16), Block(16, 16)]
        self.head = nn.LinearConfig(d_input=16, d_output=3).init()
        self.scale = Param(Tensor.ones([3]))
        self.offsets = Tensor.arange(3)
        self.dropout = nn.DropoutConfig(prob=0.1).init()

    def forward(self, x):
        for b in self.blocks:
            x = b.forward(x)
        return self.head.forward(self.dropout.forward(x)) * self.scale.val()


def mlp_param_count():
    return (8 * 16 + 16) + (16 * 16 + 16) + (16 * 3 + 3) + 3


class Wide(Module):
    """`n` lazy linear layers in a list: a large model that allocates nothing until used."""

    def __init__(self, n, d=4):
        self.layers = [nn.LinearConfig(d_input=d, d_output=d).init() for _ in range(n)]
