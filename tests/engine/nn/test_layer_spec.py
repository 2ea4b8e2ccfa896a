"""The layer registry (engine.nn.spec): what a layer declares beside its class, and who reads it."""
from __future__ import annotations

import pytest

from engine import nn
from engine.design import spec_for
from engine.nn.spec import Burn, declare, has_rule, infer, spec_of
from engine.shapes import as_dim
from engine.shapes.rules import Shape


def test_a_subclass_uses_its_bases_rule_unless_it_declares_its_own():
    class Scaled(nn.Relu):
        pass

    x = Shape((as_dim("batch"), as_dim(8)))
    assert has_rule(Scaled()) and infer(Scaled(), [x]).shape == x
    assert spec_of(Scaled).shape is None  # nothing declared for the class itself: the rule is Relu's


def test_declare_refuses_a_field_no_reader_knows():
    class Odd(nn.Relu):
        pass

    with pytest.raises(TypeError, match=r"unknown field\(s\) \['rust_name'\]"):
        declare(Odd, rust_name="Odd")
    assert spec_of(Odd).burn is None


def test_the_readers_take_the_declarations():
    # the catalog's forward call and activation choices, the Rust export's Burn template
    assert spec_for("Lstm").call == "first" and spec_of(nn.Lstm).call == "first"
    assert spec_for("MultiHeadAttention").inputs == ("input",)
    choices = next(f for f in spec_for("Lstm").fields if f.name == "gate_activation").choices
    assert choices[:3] == ("Gelu", "Relu", "Relu6") and "PRelu" in choices and "GeluTanh" not in choices
    assert spec_of(nn.Conv2d).burn == Burn("conv")
    assert spec_of(nn.LeakyRelu).onnx["LeakyRelu"]({"alpha": 0.2}) == {"negative_slope": 0.2}
