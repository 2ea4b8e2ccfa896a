"""Live shape inference: named axes through layers and structural nodes, errors at the node."""
import pytest

from engine import Device, Tensor, assert_shape, nn
from engine.design import Design, analyze, mnist_design, residual_design
from engine.module import ShapeError


def _dims(a, node, port="output"):
    return a.state(node).outputs[port].dims


def test_mnist_shapes_with_a_named_batch():
    d = mnist_design()
    a = analyze(d)
    assert a.ok, a.messages()
    assert _dims(a, "reshape") == ("batch", 1, 28, 28)
    assert _dims(a, "conv1.conv") == ("batch", 64, 26, 26)
    assert _dims(a, "conv1.pool") == ("batch", 64, 13, 13)
    assert _dims(a, "conv2.pool") == ("batch", 64, 5, 5)
    assert _dims(a, "flatten") == ("batch", 1600)
    assert a.output_shapes()["logits"].text() == "[batch, 10]"
    # the edges carry the same shapes (the canvas labels them)
    edge = ("flatten", "output", "fc1", "input")
    assert a.edge_shape(edge).text() == "[batch, 1600]"


def test_sequence_axes_follow_layers_and_structure():
    d = Design()
    d.add_node("Input", "x", {"shape": ["batch", "seq", 16]})
    d.add_node("Input", "y", {"shape": ["batch", 16, "seq"]})
    nodes = {
        "lin": ("Linear", {"d_input": 16, "d_output": 8}, "x"),
        "lstm": ("Lstm", {"d_input": 16, "d_hidden": 4, "bias": True}, "x"),
        "mha": ("MultiHeadAttention", {"d_model": 16, "n_heads": 2}, "x"),
        "enc": ("TransformerEncoder", {"d_model": 16, "d_ff": 32, "n_heads": 2, "n_layers": 1}, "x"),
        "conv": ("Conv1d", {"channels_in": 16, "channels_out": 8, "kernel_size": 3}, "y"),
        "same": ("Conv1d", {"channels_in": 16, "channels_out": 8, "kernel_size": 3, "padding": "Same"}, "y"),
        "pool": ("MaxPool1d", {"kernel_size": 2}, "y"),
        "flat": ("Flatten", {"start_dim": 1, "end_dim": 2}, "x"),
        "rows": ("Reshape", {"shape": [-1, 16]}, "x"),
        "cols": ("Reshape", {"shape": ["batch", -1]}, "x"),
    }
    for name, (kind, cfg, src) in nodes.items():
        d.add_node(kind, name, cfg)
        d.connect(src, "output", name, d.input_ports(name)[0])
    a = analyze(d)
    assert not a.errors(), a.errors()
    assert _dims(a, "lin") == ("batch", "seq", 8)
    assert _dims(a, "lstm") == ("batch", "seq", 4)
    assert _dims(a, "mha") == ("batch", "seq", 16)
    assert _dims(a, "enc") == ("batch", "seq", 16)
    assert _dims(a, "conv") == ("batch", 8, "seq-2")
    assert _dims(a, "same") == ("batch", 8, "seq")
    assert _dims(a, "pool") == ("batch", 16, "seq//2")  # exact: floor((seq - 2) / 2) + 1
    assert _dims(a, "flat") == ("batch", "16*seq")
    assert _dims(a, "rows") == ("batch*seq", 16)
    assert _dims(a, "cols") == ("batch", "16*seq")


def test_a_mismatched_input_gets_the_message_assert_shape_gives():
    d = mnist_design()
    d.set_field("fc1", "d_input", 1000)
    a = analyze(d)
    assert not a.ok
    errors = a.errors()
    assert list(errors) == ["fc1"]
    # the same message as the layer's own assert_shape on a real tensor, with the named axes put back
    linear = nn.LinearConfig(1000, 128).init()
    with pytest.raises(ShapeError) as real:
        linear.forward(Tensor.zeros((2, 1600)))
    assert str(real.value) == "assert_shape(input, [..., d_input]): axis 1 expected 1000, got 1600 (dims [2, 1600])"
    assert errors["fc1"] == "assert_shape(input, [..., d_input]): axis 1 expected 1000, got 1600 (dims [batch, 1600])"
    # everything downstream waits, without an error of its own
    assert a.state("fc2").blocked and a.state("fc2").error is None
    assert "logits" not in a.output_shapes()


def test_a_named_axis_in_the_wrong_place_is_named_in_the_message():
    d = Design()
    d.add_node("Input", "x", {"shape": ["batch", "seq", 16]})
    d.add_node("Conv1d", "conv", {"channels_in": 16, "channels_out": 8, "kernel_size": 3})
    d.connect("x", "output", "conv", "input")
    msg = analyze(d).errors()["conv"]
    assert msg == ("assert_shape(input, [None, channels_in, None]): axis 1 expected 16, got seq "
                   "(dims [batch, seq, 16])")


def test_bad_config_missing_input_and_structure_errors():
    d = mnist_design()
    d.set_field("dropout1", "prob", 1.5)
    d.disconnect("gelu2", "output", "dropout2", "input")
    d.add_node("Add", "sum")
    d.connect("fc2", "output", "sum", "in0")
    d.connect("fc1", "output", "sum", "in1")
    d.set_field("reshape", "shape", ["batch", 2, 28, 28])
    errors = analyze(d).errors()
    assert errors["dropout1"] == "configuration: Dropout probability should be between 0 and 1, but got 1.5"
    assert errors["dropout2"] == "input port 'input' not connected"
    assert errors["reshape"] == ("cannot reshape [batch, 28, 28] into [batch, 2, 28, 28]: the number of "
                                 "elements differs")
    d2 = residual_design()
    d2.set_field("mlp.fc2", "d_output", 32)
    d2.set_field("norm", "d_model", 32)
    assert analyze(d2).errors()["residual"] == "input in1 has dims [batch, 64], expected [batch, 32] (the dims of in0)"
    d3 = Design()
    assert analyze(d3).problems == ["the design has no Input node: add one for each argument of forward",
                                    "the design has no Output node: add one for each result of forward"]


def test_split_concat_and_reshape_names():
    d = Design()
    d.add_node("Input", "x", {"shape": ["batch", 10]})
    d.add_node("Split", "split", {"dim": 1, "sizes": [4, 6]})
    d.add_node("Concat", "cat", {"dim": -1})
    d.add_node("Reshape", "r", {"shape": ["seq", -1]})
    d.connect("x", "output", "split", "input")
    d.connect("split", "out1", "cat", "in0")
    d.connect("split", "out0", "cat", "in1")
    d.connect("cat", "output", "r", "input")
    a = analyze(d)
    assert _dims(a, "split", "out0") == ("batch", 4) and _dims(a, "split", "out1") == ("batch", 6)
    assert _dims(a, "cat") == ("batch", 10)
    assert a.errors()["r"].startswith("'seq' is not a named axis of the input [batch, 10]")
    d.set_field("split", "sizes", [4, 4])
    assert analyze(d).errors()["split"] == "sizes [4, 4] add up to 8, but axis 1 of [batch, 10] has 10"


def test_inference_draws_no_random_numbers_and_is_cached():
    device = Device("cpu")
    device.seed(7)
    expected = Tensor.random((3,), ("normal", 0.0, 1.0), device=device).numpy()
    device.seed(7)
    d = mnist_design()
    d.set_field("fc2", "d_output", 64)  # a new layer configuration: not in the cache
    d.set_field("fc3", "d_input", 64)
    analyze(d)
    got = Tensor.random((3,), ("normal", 0.0, 1.0), device=device).numpy()
    assert (got == expected).all()


def test_int_inputs_reach_an_embedding():
    d = Design()
    d.add_node("Input", "tokens", {"shape": ["batch", "seq"], "dtype": "int"})
    d.add_node("Embedding", "emb", {"n_embedding": 100, "d_model": 8})
    d.connect("tokens", "output", "emb", "input")
    a = analyze(d)
    t = a.state("emb").outputs["output"]
    assert t.dims == ("batch", "seq", 8) and t.dtype == "float"
    x = Tensor.zeros((2, 5), dtype="int64")
    assert_shape(nn.EmbeddingConfig(100, 8).init().forward(x), [2, 5, 8])


def test_incoming_fields_reads_the_input_width_from_the_incoming_shape():
    from engine.design.shapes import incoming_fields

    d = mnist_design()
    assert incoming_fields(d, "fc1") == {}  # 1600 already
    d.set_field("fc1", "d_input", 8)
    assert incoming_fields(d, "fc1") == {"d_input": 1600}
    d.set_field("conv2.conv", "channels", [3, 64])
    assert incoming_fields(d, "conv2.conv") == {"channels": [64, 64]}
    d2 = Design()
    d2.add_node("Input", "x", {"shape": ["batch", "seq", "features"]})
    d2.add_node("Linear", "fc", {"d_input": 8, "d_output": 4})
    d2.connect("x", "output", "fc", "input")
    assert incoming_fields(d2, "fc") == {}  # a named axis fixes no size
