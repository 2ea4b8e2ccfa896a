"""Module Display: literal strings as Burn prints them, every DisplaySettings option."""
import enum

from engine import Module, Param, Tensor
from engine.module import Content, DisplaySettings, ParamId, option, rust_debug, rust_display

from .helpers import Counter, Dropout, Gelu, Linear, Mlp


class PaddingConfig2d(enum.Enum):
    Valid = 0
    Same = 1


class Conv2d(Module):
    def __init__(self, ch_in, ch_out, kernel_size):
        k0, k1 = kernel_size
        self.weight = Counter([ch_out, ch_in, k0, k1]).param()
        self.bias = Counter([ch_out]).param()
        self.stride = [1, 1]
        self.kernel_size = [k0, k1]
        self.dilation = [1, 1]
        self.groups = 1
        self.padding = PaddingConfig2d.Valid

    def custom_settings(self):
        return DisplaySettings().with_new_line_after_attribute(False).optional()

    def custom_content(self, content):
        ch_out, ch_in = self.weight.shape[0], self.weight.shape[1] * self.groups
        return (content.add("ch_in", ch_in).add("ch_out", ch_out).add("stride", self.stride)
                .add("kernel_size", self.kernel_size).add("dilation", self.dilation).add("groups", self.groups)
                .add("padding", self.padding).optional())


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        self.output_size = output_size

    def custom_settings(self):
        return DisplaySettings().with_new_line_after_attribute(False).optional()

    def custom_content(self, content):
        return content.add("output_size", self.output_size).optional()


class Relu(Module):
    pass


class Model(Module):
    """The Burn book's basic workflow model (lazy parameters: nothing is allocated)."""

    def __init__(self):
        self.conv1 = Conv2d(1, 8, (3, 3))
        self.conv2 = Conv2d(8, 16, (3, 3))
        self.pool = AdaptiveAvgPool2d([8, 8])
        self.dropout = Dropout(0.5)
        self.linear1 = Linear(16 * 8 * 8, 512)
        self.linear2 = Linear(512, 10)
        self.activation = Relu()


BOOK = """\
Model {
  conv1: Conv2d {ch_in: 1, ch_out: 8, stride: [1, 1], kernel_size: [3, 3], dilation: [1, 1], groups: 1, padding: Valid, params: 80}
  conv2: Conv2d {ch_in: 8, ch_out: 16, stride: [1, 1], kernel_size: [3, 3], dilation: [1, 1], groups: 1, padding: Valid, params: 1168}
  pool: AdaptiveAvgPool2d {output_size: [8, 8]}
  dropout: Dropout {prob: 0.5}
  linear1: Linear {d_input: 1024, d_output: 512, bias: true, params: 524800}
  linear2: Linear {d_input: 512, d_output: 10, bias: true, params: 5130}
  activation: Relu
  params: 531178
}"""


def test_the_burn_book_model_prints_exactly_and_initializes_nothing():
    model = Model()
    assert str(model) == BOOK
    assert repr(model) == BOOK
    assert not any(p.is_initialized() for _, p in model.named_params())


def test_leaf_module_prints_inline():
    assert str(Linear(3, 5)) == "Linear {d_input: 3, d_output: 5, bias: true, params: 20}"
    assert str(Linear(3, 5, bias=False)) == "Linear {d_input: 3, d_output: 5, bias: false, params: 15}"


class PositionWiseFeedForward(Module):
    """The spec's custom display example."""

    def __init__(self):
        self.linear_inner = Linear(2, 3)
        self.linear_outer = Linear(3, 2)
        self.dropout = Dropout(0.1)
        self.gelu = Gelu()

    def custom_settings(self):
        return (DisplaySettings()
                .with_show_all_attributes(False)
                .with_new_line_after_attribute(True)
                .with_show_num_parameters(True)
                .with_indentation_size(2)
                .with_show_param_id(False)
                .optional())

    def custom_content(self, content):
        return (content
                .add("linear_inner", self.linear_inner)
                .add("linear_outer", self.linear_outer)
                .add("anything", "anything_else")
                .optional())


def test_spec_custom_display_example():
    # The parent sets new_line_after_attribute explicitly, so its children inherit it and
    # print on several lines too (Burn's DisplaySettings::inherit).
    assert str(PositionWiseFeedForward()) == """\
PositionWiseFeedForward {
  linear_inner: Linear {
    d_input: 2
    d_output: 3
    bias: true
    params: 9
  }
  linear_outer: Linear {
    d_input: 3
    d_output: 2
    bias: true
    params: 8
  }
  anything: anything_else
  params: 17
}"""


def test_default_settings_and_settings_are_inherited_from_the_parent():
    s = DisplaySettings()
    assert (s.show_param_id(), s.show_all_attributes(), s.show_num_parameters(),
            s.new_line_after_attribute(), s.indentation_size()) == (False, False, True, True, 2)
    child = DisplaySettings().with_new_line_after_attribute(False).with_indentation_size(3)
    merged = child.inherit(DisplaySettings().with_show_param_id(True).level_up())
    assert merged.new_line_after_attribute() is False and merged.indentation_size() == 3
    assert merged.show_param_id() is True and merged.level == 2


def test_new_line_after_attribute_off_prints_inline():
    assert Mlp().format(DisplaySettings().with_new_line_after_attribute(False)) == (
        "Mlp {linear1: Linear {d_input: 3, d_output: 4, bias: true, params: 16}, dropout: Dropout {prob: 0.5}, "
        "linear2: Linear {d_input: 4, d_output: 2, bias: true, params: 10}, params: 26}")


def test_show_num_parameters_off_hides_every_count():
    assert Mlp().format(DisplaySettings().with_show_num_parameters(False)) == """\
Mlp {
  linear1: Linear {d_input: 3, d_output: 4, bias: true}
  dropout: Dropout {prob: 0.5}
  linear2: Linear {d_input: 4, d_output: 2, bias: true}
}"""


def test_indentation_size():
    class Outer(Module):
        def __init__(self):
            self.inner = Mlp()

    assert Outer().format(DisplaySettings().with_indentation_size(4)) == """\
Outer {
    inner: Mlp {
        linear1: Linear {d_input: 3, d_output: 4, bias: true, params: 16}
        dropout: Dropout {prob: 0.5}
        linear2: Linear {d_input: 4, d_output: 2, bias: true, params: 10}
        params: 26
    }
    params: 26
}"""


def test_show_all_attributes_overrides_custom_content():
    lin = Linear(3, 5)
    assert lin.format(DisplaySettings().with_show_all_attributes(True)) == (
        "Linear {weight: ParamTensor {rank: 2, shape: [3, 5], kind: float}, "
        "bias: ParamTensor {rank: 1, shape: [5], kind: float}, d_input: 3, d_output: 5, params: 20}")


def test_show_param_id():
    class M(Module):
        def __init__(self):
            self.w = Param(Tensor.ones([2, 3]), id=ParamId(123456))
            self.idx = Param(Tensor.arange(4), id=ParamId(1))

    m = M()
    assert str(m) == """\
M {
  w: ParamTensor {rank: 2, shape: [2, 3], kind: float}
  idx: ParamTensor {rank: 1, shape: [4], kind: int}
  params: 10
}"""
    assert m.format(DisplaySettings().with_show_param_id(True)) == """\
M {
  w: ParamTensor {rank: 2, shape: [2, 3], kind: float, id: 83h0200000000}
  idx: ParamTensor {rank: 1, shape: [4], kind: int, id: 0400000000000}
  params: 10
}"""


def test_default_content_shows_fields_children_constants_and_debug_attributes():
    class Config(Module):
        def __init__(self):
            self.layers = [Linear(1, 1), Linear(1, 2, bias=False)]
            self.table = Tensor.arange(6).reshape(2, 3)
            self.norm = None
            self.name = 'a "b"'
            self.epsilon = 1e-5
            self.scale = 2.0
            self.flags = (True, False)
            self.mode = PaddingConfig2d.Same

    assert str(Config()) == """\
Config {
  layers: Vec<0..2> {
    0: Linear {d_input: 1, d_output: 1, bias: true, params: 2}
    1: Linear {d_input: 1, d_output: 2, bias: false, params: 2}
  }
  table: Tensor {rank: 2, shape: [2, 3]}
  norm: None
  name: "a \\"b\\""
  epsilon: 1e-5
  scale: 2.0
  flags: (true, false)
  mode: Same
  params: 4
}"""


def test_module_without_fields_prints_its_type_and_params_only_when_positive():
    assert str(Relu()) == "Relu"
    assert str(AdaptiveAvgPool2d([8, 8])) == "AdaptiveAvgPool2d {output_size: [8, 8]}"


def test_numbers_are_formatted_as_burn_formats_them():
    class Numbers(Module):
        def custom_settings(self):
            return DisplaySettings().with_new_line_after_attribute(False)

        def custom_content(self, content):
            return (content.add("epsilon", 0.00001).add("low", -10000.0).add("bias", True)
                    .add("scale", 2.0).add("momentum", 0.1).add("big", 1e20).add("count", 3)
                    .add("output_size", option([20, 20])).add("scale_factor", option(None))
                    .add("nan", float("nan")).optional())

    assert str(Numbers()) == ("Numbers {epsilon: 0.00001, low: -10000, bias: true, scale: 2, momentum: 0.1, "
                              "big: 100000000000000000000, count: 3, output_size: Some([20, 20]), "
                              "scale_factor: None, nan: NaN}")


def test_rust_display_and_debug_helpers():
    assert rust_display(1e-5) == "0.00001" and rust_debug(1e-5) == "1e-5"
    assert rust_display(-10000.0) == "-10000" and rust_debug(-10000.0) == "-10000.0"
    assert rust_debug(1e16) == "1e16" and rust_debug(1.5e-7) == "1.5e-7" and rust_debug(0.0001) == "0.0001"
    assert rust_display(False) == "false" and rust_debug([1, 2]) == "[1, 2]"
    assert rust_debug(PaddingConfig2d.Valid) == "Valid" and rust_display(PaddingConfig2d.Valid) == "Valid"
    assert option((2, 3)) == "Some((2, 3))" and rust_debug([option(1), option(None)]) == "[Some(1), None]"
    assert rust_debug("x") == '"x"' and rust_display("x") == "x"


def test_content_builder_rules():
    c = Content(DisplaySettings())
    assert c.optional() is None
    assert c.add_formatted("single").single_item == "single"
    try:
        c.add("x", 1)
    except ValueError as e:
        assert "single item" in str(e)
    else:
        raise AssertionError("adding an attribute after a single item must fail")


def test_custom_content_returning_none_falls_back_to_default_content():
    class Fallback(Module):
        def __init__(self):
            self.size = 3

        def custom_content(self, content):
            return None

    assert str(Fallback()) == "Fallback {\n  size: 3\n}"
