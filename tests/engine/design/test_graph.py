"""The design graph: node kinds from engine.nn, edits, names, cycles, copy / paste, layout."""
import dataclasses

import pytest

from engine import nn
from engine.design import (CATEGORIES, Design, DesignError, auto_layout, catalog, kinds, mnist_design, spec_for)
from engine.design.fields import FieldError


def test_every_nn_config_gives_a_palette_kind_in_burns_groups():
    cat = catalog()
    configs = [n[: -len("Config")] for n in dir(nn)
               if n.endswith("Config") and dataclasses.is_dataclass(getattr(nn, n))
               and isinstance(getattr(nn, n[: -len("Config")], None), type)]
    assert configs, "engine.nn has configs"
    for kind in configs:
        assert kind in cat, f"{kind}Config has no palette entry"
        assert cat[kind].config_class is getattr(nn, kind + "Config")
    assert {s.category for s in cat.values()} == set(CATEGORIES)
    assert kinds("Convolutions") == ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                                     "ConvTranspose3d"]
    assert {"Lstm", "Gru"} <= set(kinds("RNNs"))
    assert {"TransformerEncoder", "MultiHeadAttention"} <= set(kinds("Transformer"))
    assert {"CrossEntropyLoss", "MseLoss"} <= set(kinds("Loss"))
    assert kinds("Structure") == ["Input", "Output", "Add", "Concat", "Reshape", "Flatten", "Split", "Op"]
    # config-less modules come from their constructors; internal building blocks do not appear
    assert "Relu" in cat and "GLU" in cat and "GateController" not in cat


def test_fields_follow_the_config_dataclass():
    conv = spec_for("Conv2d")
    assert [f.name for f in conv.fields] == ["channels", "kernel_size", "stride", "dilation", "groups", "padding",
                                             "bias"]
    assert conv.field("channels").required and conv.field("channels").kind == "ints"
    assert conv.field("stride").default == [1, 1]
    pad = conv.field("padding")
    assert pad.kind == "padding" and pad.default == "Valid"
    assert pad.parse("same") == "Same" and pad.parse("1, 1, 2, 2") == [1, 1, 2, 2]
    with pytest.raises(FieldError, match="expected Valid, Same or 4 explicit paddings"):
        pad.parse("1, 2")
    mode = spec_for("Interpolate2d").field("mode")
    assert mode.kind == "enum" and mode.choices == ("Nearest", "NearestExact", "Linear", "Cubic")
    assert spec_for("Interpolate2d").make_config({**spec_for("Interpolate2d").defaults(),
                                                  "mode": "Cubic"}).mode is nn.InterpolateMode.Cubic
    lin = spec_for("Linear").field("d_input")
    with pytest.raises(FieldError, match=r"d_input: expected an integer, got 'abc'"):
        lin.parse("abc")
    with pytest.raises(FieldError, match=r"d_input: expected a value >= 1, got 0"):
        lin.parse("0")
    assert spec_for("Lstm").inputs == ("batched_input",)
    assert spec_for("CrossEntropyLoss").inputs == ("logits", "targets")


def test_add_connect_rename_remove():
    d = Design()
    assert d.add_node("Input", config={"shape": ["batch", 4]}) == "input"
    assert d.add_node("Linear", config={"d_input": 4, "d_output": 2}) == "linear1"
    assert d.add_node("Linear") == "linear2"
    d.add_node("Output")
    d.connect("input", "output", "linear1", "input")
    d.connect("linear1", "output", "output", "input")
    d.rename_node("linear1", "head.fc")
    assert d.nodes() == ["input", "head.fc", "linear2", "output"]  # the order is kept
    assert d.source_of("output", "input") == ("head.fc", "output")
    # an input port takes one edge: a new connection replaces the old one
    replaced = d.connect("linear2", "output", "output", "input")
    assert replaced == ("head.fc", "output", "output", "input")
    assert d.source_of("output", "input") == ("linear2", "output")
    removed = d.remove_node("linear2")
    assert ("linear2", "output", "output", "input") in removed
    assert d.source_of("output", "input") is None


def test_cycles_are_refused_and_nothing_changes():
    d = mnist_design()
    before = d.to_dict()
    with pytest.raises(DesignError, match=r"fc3 -> conv1.conv would make a cycle: conv1.conv -> conv1.norm") as e:
        d.connect("fc3", "output", "conv1.conv", "input")
    assert e.value.node == "conv1.conv"
    with pytest.raises(DesignError, match="to itself"):
        d.connect("fc1", "output", "fc1", "input")
    assert d.to_dict() == before


@pytest.mark.parametrize("name, why", [
    ("2fc", "must start with a letter"), ("fc-1", "must start with a letter"), ("type", "keyword"),
    ("fn", "keyword"), ("train", "Module method"), ("a..b", "must start with a letter"), ("conv1", "block"),
    ("conv1.conv.weight", "is a node"),
])
def test_bad_names_are_refused_with_a_reason(name, why):
    d = mnist_design()
    with pytest.raises(DesignError, match=why):
        d.add_node("Relu", name)


def test_ports_and_bad_configs():
    d = Design()
    d.add_node("Input", "x")
    d.add_node("Add", "sum", {"inputs": 3})
    assert d.input_ports("sum") == ("in0", "in1", "in2")
    for p in ("in0", "in1", "in2"):
        d.connect("x", "output", "sum", p)
    d.set_field("sum", "inputs", 2)  # the edge into the vanished port goes with it
    assert [e[3] for e in d.in_edges("sum")] == ["in0", "in1"]
    with pytest.raises(DesignError, match="has no input port 'rhs'"):
        d.connect("x", "output", "sum", "rhs")
    with pytest.raises(DesignError, match=r"sum: inputs: expected a value >= 2, got 1"):
        d.set_field("sum", "inputs", 1)
    with pytest.raises(DesignError, match="Linear has no field 'd_in'"):
        d.add_node("Linear", "fc", {"d_in": 3})
    with pytest.raises(DesignError, match="unknown node kind 'Dense'"):
        d.add_node("Dense")
    d.add_node("Split", "split", {"sizes": [2, 3, 4]})
    assert d.output_ports("split") == ("out0", "out1", "out2")


def test_to_dict_round_trip_and_equality():
    d = mnist_design()
    again = Design.from_dict(d.to_dict())
    assert again == d and again.to_dict() == d.to_dict()
    assert again.edges() == d.edges()
    with pytest.raises(DesignError, match="names a node 'nope' that does not exist"):
        Design.from_dict({"nodes": [], "edges": [{"from": "nope", "from_port": "output", "to": "x",
                                                  "to_port": "input"}]})


def test_copy_paste_renames_on_conflict_and_keeps_inner_edges():
    d = mnist_design()
    frag = d.fragment(["fc2", "gelu2", "dropout2"])
    assert len(frag["nodes"]) == 3 and len(frag["edges"]) == 2
    new = d.paste(frag)
    assert new == ["fc2_2", "gelu2_2", "dropout2_2"]
    assert d.source_of("gelu2_2", "input") == ("fc2_2", "output")
    assert d.source_of("fc2_2", "input") is None  # edges from outside the selection are not copied
    x, y = d.position("fc2")
    assert d.position("fc2_2") == (x + 40, y + 40)


def test_layout_rows_follow_topological_generations():
    d = Design()
    d.add_node("Input", "x", {"shape": ["batch", 4]})
    d.add_node("Linear", "a", {"d_input": 4, "d_output": 4})
    d.add_node("Linear", "b", {"d_input": 4, "d_output": 4})
    d.add_node("Add", "sum")
    d.connect("x", "output", "a", "input")
    d.connect("x", "output", "b", "input")
    d.connect("a", "output", "sum", "in0")
    d.connect("b", "output", "sum", "in1")
    pos = auto_layout(d)
    assert pos["x"][1] < pos["a"][1] == pos["b"][1] < pos["sum"][1]
    assert pos["a"][0] != pos["b"][0]
