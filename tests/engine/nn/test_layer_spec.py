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


def _bad_inputs_case(layer, shapes):
    """The rule's error on `shapes` and the forward's on zero tensors of those sizes."""
    import numpy as np  # noqa: PLC0415

    from engine.shapes.rules import RuleError  # noqa: PLC0415
    from engine.tensor import Tensor  # noqa: PLC0415

    with pytest.raises(RuleError) as rule:
        infer(layer, [Shape(tuple(as_dim(d) for d in s)) for s in shapes])
    with pytest.raises(Exception) as real:  # noqa: PT011 - the layer's own assert_shape error
        layer.forward(*[Tensor(np.zeros(s, np.float32)) for s in shapes])
    return str(rule.value), str(real.value)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_conv_rules_refuse_wrong_channels_with_the_forwards_call(n):
    size = 1 if n == 1 else [1] * n
    conv = (nn.Conv1dConfig(4, 6, 1) if n == 1 else getattr(nn, f"Conv{n}dConfig")([4, 6], size)).init()
    tconv = getattr(nn, f"ConvTranspose{n}dConfig")([4, 6], size).init()
    for layer in (conv, tconv):
        rule, real = _bad_inputs_case(layer, [[2, 3] + [5] * n])
        call = f"assert_shape(input, [None, channels_in{', None' * n}])"
        assert rule.startswith(call + ":") and call in real, (rule, real)


@pytest.mark.parametrize("layer, shapes, call", [
    (nn.CosineSimilarityConfig().init(), [[2, 3], [2, 4]], "assert_shape(x2, [batch_size, features])"),
    (nn.PairwiseDistanceConfig().init(), [[2, 3], [3, 3]], "assert_shape(x2, [batch_size, features])"),
    (nn.PairwiseDistanceConfig().init(), [[2, 3, 1], [2, 3]], "assert_shape(x1, [None, None])"),
    (nn.TripletMarginLossConfig().init(), [[2, 3], [2, 3], [2, 4]],
     "assert_shape(negative, [batch_size, embedding_dim])"),
    (nn.CosineEmbeddingLossConfig().init(), [[2, 3], [1, 3], [2]],
     "assert_shape(input2, [batch_size, embedding_dim])"),
])
def test_row_pair_rules_name_the_input_the_forward_names(layer, shapes, call):
    rule, real = _bad_inputs_case(layer, shapes)
    assert rule.startswith(call + ":") and call in real, (rule, real)


def test_setting_enums_take_their_members_spellings_and_name_the_members_otherwise():
    assert nn.Reduction.of(nn.Reduction.Sum) is nn.Reduction.Sum
    assert nn.Reduction.of("batch_mean") is nn.Reduction.BatchMean
    assert nn.Reduction.of("SUM") is nn.Reduction.Sum
    assert nn.InterpolateMode.of("nearest-exact") is nn.InterpolateMode.NearestExact
    assert nn.InterpolateMode.of("Cubic") is nn.InterpolateMode.Cubic
    with pytest.raises(ValueError, match=r"unknown reduction 'median': expected one of \['Mean', 'Sum', 'Auto', "):
        nn.Reduction.of("median")
    with pytest.raises(ValueError, match=r"unknown reduction 3: "):
        nn.Reduction.of(3)
    with pytest.raises(ValueError, match=r"unknown interpolate mode 'area': expected one of \['Nearest', "):
        nn.InterpolateMode.of("area")
