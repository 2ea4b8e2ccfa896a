"""Performance regression check that times nothing (issue 22, must-show 2).

For one training step of a fixed small MLP and of a fixed small transformer encoder layer it
counts the work the step does: the tape nodes the forward records (by op), the bytes the
forward's graph keeps alive for the backward, and the peak bytes NumPy holds during forward +
backward (tracemalloc sees NumPy's allocations). The bounds sit a little above today's numbers,
so that a change that records extra nodes per layer, keeps extra intermediates or allocates
twice the scratch fails here on any machine, without a timer. If a change lowers a number on
purpose, lower its bound with it.
"""
from __future__ import annotations


import numpy as np

from engine import Module, Tensor, nn
from engine.tensor.cpu.threads import num_threads, set_num_threads
from tests.engine.work_count import graph_ops, step_memory


def _measure(forward):
    """(ops of the graph, bytes held by the graph after the forward, peak bytes during the step)."""
    return step_memory(forward, lambda loss: loss.backward(), between=graph_ops)


class _Mlp(Module):
    def __init__(self):
        self.fc1 = nn.LinearConfig(64, 128).init()
        self.act = nn.Relu()
        self.fc2 = nn.LinearConfig(128, 10).init()

    def forward(self, x):
        return self.fc2.forward(self.act.forward(self.fc1.forward(x)))


def _single_thread(fn):
    old = num_threads()
    set_num_threads(1)  # the same blocks and scratch on every machine
    try:
        return fn()
    finally:
        set_num_threads(old)


def test_mlp_training_step_work():
    rng = np.random.default_rng(0)
    model = _Mlp()
    x = Tensor.from_data(rng.standard_normal((32, 64), dtype=np.float32))
    y = Tensor.from_data(rng.integers(0, 10, 32))
    loss_fn = nn.CrossEntropyLossConfig().init()
    ops, held, peak = _single_thread(lambda: _measure(lambda: loss_fn.forward(model.forward(x), y)))
    interior = sum(n for op, n in ops.items() if op != "leaf")
    assert interior <= 4, ops  # today: linear, relu, linear, the fused cross-entropy
    assert ops["leaf"] == 4, ops  # the four parameters
    # the graph keeps relu's output and the logits' softmax: 23.5 KB today
    assert held <= 28_000, held
    assert peak <= 96_000, peak  # the four parameters' gradients and scratch: 80.5 KB today


def test_transformer_layer_training_step_work():
    rng = np.random.default_rng(1)
    layer = nn.TransformerEncoderConfig(32, 64, 4, 1, dropout=0.0).init()
    x = Tensor.from_data(rng.standard_normal((2, 16, 32), dtype=np.float32))
    ops, held, peak = _single_thread(lambda: _measure(lambda: layer.forward(x).sum()))
    interior = sum(n for op, n in ops.items() if op != "leaf")
    # today 21: 6 linear, 4 swap_dims, 4 reshape, 2 normalize, 2 add, the fused attention (one
    # node for scores, mask, softmax and both products; 26 nodes before it), gelu and the sum;
    # 16 parameters
    assert ops["scaled_dot_product_attention"] == 1, ops
    assert interior <= 22, ops
    assert ops["leaf"] == 16, ops
    # 76.1 KB alone (83.6 KB with the unfused attention); 86.1 KB seen once inside the whole suite, where
    # a first-use cache of another module can land in the measurement
    assert held <= 90_000, held
    assert peak <= 130_000, peak  # 114.7 KB today (120.9 KB unfused)
