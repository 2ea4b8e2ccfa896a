"""The shape-only contract check (engine.design.shape_check): shapes flow through the module
boundaries by the layers' shape rules; no layer kernel runs and no parameter is allocated."""
import tracemalloc

import pytest

from engine import Module, Param, Tensor, nn
from engine.design.shape_check import activation_bytes, check_shapes, has_unallocated_params, unallocated_bytes
from engine.module import contracts
from resources.examples import build_example, example_input, llama_7b


def _check(model, inputs, full=False):
    mods = list(model.named_modules())
    wanted = {p: contracts.docstring_contract(m) for p, m in mods}
    wanted = {p: t for p, t in wanted.items() if t}
    if full:
        return contracts.check(model, inputs, wanted, mods)
    return check_shapes(model, inputs, wanted, mods)


def _same_flow(shape_only, full):
    """Every module call the shape-only check saw has the real run's shapes (a layer with a rule is
    not entered, so its sublayers are absent)."""
    seen = {c.path for c in shape_only.flow}
    real = [(c.path, c.inputs, c.outputs) for c in full.flow if c.path in seen]
    assert [(c.path, c.inputs, c.outputs) for c in shape_only.flow] == real


def test_llama_7b_shape_only_allocates_nothing():
    # its speed (< 1 s) is measured by benchmarks/gui_open.py, not here: no timed unit tests
    model = llama_7b.build()
    x = llama_7b.example_input(2)
    tracemalloc.start()
    try:
        r = _check(model, [x])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ok and r.complete, (r.error, r.not_checked)
    assert r.shape_only
    assert r.output_shapes == [(2, 8, 32000)]
    assert peak < 50e6
    assert all(not p.is_initialized() for _, p in model.named_params())
    assert r.nodes["layers.31.mlp.gate_proj"].outputs == [(2, 8, 11008)]
    assert r.nodes["layers.31.self_attn"].outputs == [(2, 32, 8, 8), (2, 8, 4096)]  # weights, context
    assert has_unallocated_params(model)
    assert unallocated_bytes(model) == 6_738_415_616 * 4
    assert 0 < activation_bytes(r) < 1e9


@pytest.mark.parametrize("name", ["burn-book", "burn-mnist", "transformer", "digits", "spirals"])
def test_examples_shape_only_agree_with_the_real_run(name):
    model = build_example(name)
    x = example_input(name, 2)
    shape_only = _check(model, [x])
    full = _check(model, [x], full=True)
    assert shape_only.ok and shape_only.complete, (shape_only.error, shape_only.not_checked)
    assert shape_only.output_shapes == [tuple(model.forward(x).shape)]
    assert full.ok, full.error  # transformer: MultiHeadAttention's contract now names both of its outputs
    _same_flow(shape_only, full)


def test_a_tiny_llama_agrees_with_the_real_run():
    model = llama_7b.build_config(d_model=16, n_layers=2, n_heads=2, d_ff=24, vocab_size=50, max_seq_length=16)
    x = llama_7b.example_input(1)
    x = Tensor.from_data([[1, 2, 3, 4]])
    a, b = _check(model, [x]), _check(model, [x], full=True)
    assert a.ok and b.ok and a.output_shapes == b.output_shapes == [(1, 4, 50)]
    _same_flow(a, b)


def test_a_violated_contract_is_reported_at_its_layer_without_allocating():
    model = llama_7b.build()
    r = _check(model, [Tensor.from_data([[1.0, 2.0]])])  # floats into the embedding
    assert not r.ok
    assert r.failure.path == "embed_tokens"
    assert "expected an int tensor" in r.error
    assert all(not p.is_initialized() for _, p in model.named_params())


class Scale(Module):
    """A user module that reads its own parameter: no shape rule can see through it."""

    def __init__(self):
        self.w = Param.uninitialized(lambda device, grad: Tensor.ones([4], device=device), shape=(4,))

    def forward(self, x):
        return x * self.w.val()


class Net(Module):
    def __init__(self):
        self.a = nn.LinearConfig(3, 4).init()
        self.scale = Scale()
        self.b = nn.LinearConfig(4, 2).init()

    def forward(self, x):
        return self.b.forward(self.scale.forward(self.a.forward(x)))


def test_a_module_it_cannot_see_through_is_reported_not_checked():
    model = Net()
    r = _check(model, [Tensor.zeros([2, 3])])
    assert r.ok and not r.complete
    assert r.status("scale") == contracts.NOT_CHECKED
    assert "not checked (no shape rule for Scale" in r.not_checked[0]
    assert r.status("b") == contracts.NOT_RUN
    assert not model.scale.w.is_initialized()
