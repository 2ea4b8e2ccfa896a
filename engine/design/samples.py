"""Designs that ship with the app: the burn-mnist CNN and a small residual MLP.

`mnist_design()` mirrors `shared/fixtures/burn-mnist.bpk` (Burn's mnist-inference-web model):
its node names make the parameter paths `conv1.conv.weight`, `conv1.norm.gamma`, ...,
`fc3.bias`, so the built model loads that checkpoint as it is.
"""
from __future__ import annotations

from .graph import Design
from .layout import auto_layout

__all__ = ["mnist_design", "residual_design", "SAMPLES"]


def _chain(d: Design, names: list[str]) -> None:
    for a, b in zip(names, names[1:]):
        d.connect(a, d.output_ports(a)[0], b, d.input_ports(b)[0])


def mnist_design() -> Design:
    d = Design("Model")
    d.add_node("Input", "input", {"shape": ["batch", 28, 28]})
    d.add_node("Reshape", "reshape", {"shape": ["batch", 1, 28, 28]})
    for block, ch in (("conv1", [1, 64]), ("conv2", [64, 64])):
        d.add_node("Conv2d", f"{block}.conv", {"channels": ch, "kernel_size": [3, 3]})
        d.add_node("BatchNorm", f"{block}.norm", {"num_features": ch[1]})
        d.add_node("Relu", f"{block}.activation")
        d.add_node("MaxPool2d", f"{block}.pool", {"kernel_size": [2, 2], "strides": [2, 2]})
    d.add_node("Flatten", "flatten", {"start_dim": 1, "end_dim": 3})
    d.add_node("Linear", "fc1", {"d_input": 1600, "d_output": 128})
    d.add_node("Gelu", "gelu1")
    d.add_node("Dropout", "dropout1", {"prob": 0.25})
    d.add_node("Linear", "fc2", {"d_input": 128, "d_output": 128})
    d.add_node("Gelu", "gelu2")
    d.add_node("Dropout", "dropout2", {"prob": 0.25})
    d.add_node("Linear", "fc3", {"d_input": 128, "d_output": 10})
    d.add_node("Output", "logits")
    _chain(d, d.nodes())
    auto_layout(d)
    return d


def residual_design() -> Design:
    """input [batch, 64] -> fc1 -> relu -> fc2, added back to the input -> LayerNorm -> head."""
    d = Design("ResidualMlp")
    d.add_node("Input", "input", {"shape": ["batch", 64]})
    d.add_node("Linear", "mlp.fc1", {"d_input": 64, "d_output": 256})
    d.add_node("Relu", "mlp.activation")
    d.add_node("Linear", "mlp.fc2", {"d_input": 256, "d_output": 64})
    d.add_node("Add", "residual")
    d.add_node("LayerNorm", "norm", {"d_model": 64})
    d.add_node("Linear", "head", {"d_input": 64, "d_output": 10})
    d.add_node("Output", "output")
    _chain(d, ["input", "mlp.fc1", "mlp.activation", "mlp.fc2"])
    d.connect("mlp.fc2", "output", "residual", "in0")
    d.connect("input", "output", "residual", "in1")
    _chain(d, ["residual", "norm", "head", "output"])
    auto_layout(d)
    return d


SAMPLES = {"mnist": mnist_design, "residual": residual_design}
