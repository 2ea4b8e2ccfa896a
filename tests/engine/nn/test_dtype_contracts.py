"""A layer's input meets its parameters' dtype at the layer's boundary.

A float32 layer refuses a float64 input (it would silently compute, and answer, in float64),
a float64 layer refuses float32, and a float layer refuses an int or bool input (it would
silently compute in float64). The error is a `DTypeError` (a `TensorError` and a `TypeError`)
that names the layer, the input, the expected dtype and the found one. Embedding is the other
way round: int indices only. Matching dtypes keep working, and the result keeps the dtype.
"""
import numpy as np
import pytest

from engine import Device, Tensor, TensorError, nn
from engine.tensor import DTypeError


def _x(shape, dtype, device=None):
    rng = np.random.default_rng(0)
    data = rng.standard_normal(shape) if dtype.startswith("float") else rng.integers(0, 3, shape)
    return Tensor.from_data(data, device=device, dtype=dtype)


def _mha_call(m, x):
    return m.forward(nn.MhaInput.self_attn(x)).context


def _decoder_call(m, x):
    return m.forward(nn.TransformerDecoderInput(x, x))


def _cases():
    """(name in messages, config -> module, call(module, input), input dims, weight name)."""
    return [
        ("Linear", lambda d: nn.LinearConfig(3, 5).init(d), None, (2, 3), "weight"),
        ("Conv1d", lambda d: nn.Conv1dConfig(2, 3, 3).init(d), None, (1, 2, 8), "weight"),
        ("Conv2d", lambda d: nn.Conv2dConfig([2, 3], [3, 3]).init(d), None, (1, 2, 6, 6), "weight"),
        ("Conv3d", lambda d: nn.Conv3dConfig([2, 3], [2, 2, 2]).init(d), None, (1, 2, 4, 4, 4), "weight"),
        ("ConvTranspose1d", lambda d: nn.ConvTranspose1dConfig([2, 3], 3).init(d), None, (1, 2, 5), "weight"),
        ("ConvTranspose2d", lambda d: nn.ConvTranspose2dConfig([2, 3], [3, 3]).init(d), None, (1, 2, 5, 5), "weight"),
        ("ConvTranspose3d", lambda d: nn.ConvTranspose3dConfig([2, 3], [2, 2, 2]).init(d), None, (1, 2, 3, 3, 3),
         "weight"),
        ("LayerNorm", lambda d: nn.LayerNormConfig(4).init(d), None, (2, 4), "gamma"),
        ("BatchNorm", lambda d: nn.BatchNormConfig(3).init(d), None, (2, 3, 4), "gamma"),
        ("GroupNorm", lambda d: nn.GroupNormConfig(2, 4).init(d), None, (2, 4, 3), "gamma"),
        ("InstanceNorm", lambda d: nn.InstanceNormConfig(4).init(d), None, (2, 4, 3), "gamma"),
        ("RmsNorm", lambda d: nn.RmsNormConfig(4).init(d), None, (2, 4), "gamma"),
        ("PRelu", lambda d: nn.PReluConfig().init(d), None, (2, 3), "alpha"),
        ("SwiGlu", lambda d: nn.SwiGluConfig(3, 4).init(d), None, (2, 3), "weight"),
        ("PositionWiseFeedForward", lambda d: nn.PositionWiseFeedForwardConfig(4, 8).init(d), None, (2, 3, 4),
         "linear_inner weight"),
        ("MultiHeadAttention", lambda d: nn.MultiHeadAttentionConfig(8, 2).init(d), _mha_call, (2, 5, 8),
         "query weight"),
        ("Lstm", lambda d: nn.LstmConfig(2, 3, True).init(d), lambda m, x: m.forward(x)[0], (4, 5, 2), "weight"),
        ("BiLstm", lambda d: nn.BiLstmConfig(2, 3, True).init(d), lambda m, x: m.forward(x)[0], (4, 5, 2), "weight"),
        ("Gru", lambda d: nn.GruConfig(2, 3, True).init(d), None, (4, 5, 2), "weight"),
        ("BiGru", lambda d: nn.BiGruConfig(2, 3, True).init(d), lambda m, x: m.forward(x)[0], (4, 5, 2), "weight"),
        ("TransformerEncoder", lambda d: nn.TransformerEncoderConfig(8, 16, 2, 1).init(d), None, (2, 5, 8),
         "attention weight"),
        ("TransformerEncoderLayer", lambda d: nn.TransformerEncoderConfig(8, 16, 2, 1).init(d).layers[0], None,
         (2, 5, 8), "attention weight"),
        ("TransformerDecoder", lambda d: nn.TransformerDecoderConfig(8, 16, 2, 1).init(d), _decoder_call, (2, 5, 8),
         "attention weight"),
        ("TransformerDecoderLayer", lambda d: nn.TransformerDecoderConfig(8, 16, 2, 1).init(d).layers[0],
         lambda m, x: m.forward(nn.TransformerDecoderInput(x, x)).target, (2, 5, 8), "attention weight"),
    ]


CASES = _cases()
IDS = [c[0] for c in CASES]


def _run(case, module, x):
    _, _, call, _, _ = case
    return call(module, x) if call is not None else module.forward(x)


def _input_name(name):
    if name in ("Lstm", "BiLstm", "Gru", "BiGru"):
        return "batched_input"
    if name.startswith("TransformerDecoder"):
        return "target"
    if name == "MultiHeadAttention":
        return "query"
    return "input"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_float64_input_to_a_float32_layer_is_refused_naming_both_dtypes(case):
    name, make, _, dims, weight = case
    module = make(None)
    x = _x(dims, "float64")
    with pytest.raises(DTypeError) as info:
        _run(case, module, x)
    text = str(info.value)
    arg = _input_name(name)
    assert text.startswith(f"{name}: {arg} dtype float64 does not match the {weight}'s float32 "
                           f"({arg} dims {list(dims)}); convert the {arg} with {arg}.cast(\"float32\")"), text
    assert isinstance(info.value, TensorError) and isinstance(info.value, TypeError)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_int_input_to_a_float_layer_is_refused(case):
    name, make, _, dims, _ = case
    module = make(None)
    with pytest.raises(DTypeError) as info:
        _run(case, module, _x(dims, "int64"))
    arg = _input_name(name)
    assert str(info.value) == (f"{name}: expected a float tensor, got int64 ({arg} dims {list(dims)}); "
                               f"convert the {arg} with {arg}.cast(\"float32\")")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_float64_layer_takes_float64_and_refuses_float32(case, dev64):
    name, make, _, dims, weight = case
    module = make(dev64)
    out = _run(case, module, _x(dims, "float64", dev64))
    out = out.target if isinstance(out, nn.TransformerDecoderInput) else out
    assert out.dtype == "float64"
    with pytest.raises(DTypeError, match=rf"^{name}: {_input_name(name)} dtype float32 does not match the "
                                         rf"{weight}'s float64"):
        _run(case, module, _x(dims, "float32", dev64))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matching_float32_input_keeps_float32(case):
    _, make, _, dims, _ = case
    out = _run(case, make(None), _x(dims, "float32"))
    out = out.target if isinstance(out, nn.TransformerDecoderInput) else out
    assert out.dtype == "float32"


def test_batch_norm_checks_in_training_and_in_validation():
    bn = nn.BatchNormConfig(3).init()
    x = _x((2, 3, 4), "float64")
    with pytest.raises(DTypeError, match="^BatchNorm: input dtype float64 does not match the gamma's float32"):
        bn.forward(x.autodiff())  # the training path (batch statistics)
    with pytest.raises(DTypeError, match="^BatchNorm: input dtype float64 does not match the gamma's float32"):
        bn.valid().forward(x)  # the running statistics
    assert bn.running_mean.val().numpy().tolist() == [0.0, 0.0, 0.0]  # nothing updated


def test_group_norm_without_affine_takes_any_float_but_no_int():
    gn = nn.GroupNormConfig(2, 4, affine=False).init()
    assert gn.forward(_x((2, 4, 3), "float64")).dtype == "float64"  # no parameter to match
    with pytest.raises(DTypeError, match=r"^GroupNorm: expected a float tensor, got int64 \(input dims \[2, 4, 3\]\)"):
        gn.forward(_x((2, 4, 3), "int64"))


def test_recurrent_states_must_match_the_weights_too():
    lstm = nn.LstmConfig(2, 3, True).init()
    x = _x((4, 5, 2), "float32")
    cell, hidden = _x((4, 3), "float32"), _x((4, 3), "float64")
    with pytest.raises(DTypeError, match=r"^Lstm: state\.hidden dtype float64 does not match the weight's float32"):
        lstm.forward(x, nn.LstmState(cell, hidden))
    gru = nn.GruConfig(2, 3, True).init()
    with pytest.raises(DTypeError, match=r"^Gru: state dtype float64 does not match the weight's float32"):
        gru.forward(x, _x((4, 3), "float64"))
    bigru = nn.BiGruConfig(2, 3, True).init()
    with pytest.raises(DTypeError, match=r"^BiGru: state dtype float64 does not match the weight's float32"):
        bigru.forward(x, _x((2, 4, 3), "float64"))


def test_attention_checks_key_and_value_as_well_as_query():
    mha = nn.MultiHeadAttentionConfig(8, 2).init()
    q, kv = _x((2, 5, 8), "float32"), _x((2, 4, 8), "float64")
    with pytest.raises(DTypeError, match=r"^MultiHeadAttention: key dtype float64 does not match"):
        mha.forward(nn.MhaInput(q, kv, kv))
    with pytest.raises(DTypeError, match=r"^MultiHeadAttention: value dtype float64 does not match"):
        mha.forward(nn.MhaInput(q, kv.cast("float32"), kv))


def test_parameter_free_float_layers_follow_the_input_float_dtype_but_refuse_ints():
    pe = nn.PositionalEncodingConfig(4).init()
    assert pe.forward(_x((2, 3, 4), "float64")).dtype == "float64"
    with pytest.raises(DTypeError, match=r"^PositionalEncoding: expected a float tensor, got int64"):
        pe.forward(_x((2, 3, 4), "int64"))  # would add the sinusoids cast to int (zeros)
    rope = nn.RotaryEncodingConfig(10, 4).init()
    with pytest.raises(DTypeError, match=r"^RotaryEncoding: expected a float tensor, got int64 \(x dims"):
        rope.forward(_x((2, 3, 4), "int64"))
    lrn = nn.LocalResponseNormConfig(3).init()
    with pytest.raises(DTypeError, match=r"^LocalResponseNorm: expected a float tensor, got int64"):
        lrn.forward(_x((1, 4, 5), "int64"))


def test_embedding_takes_int_indices_of_any_int_dtype_and_refuses_floats_and_bools():
    emb = nn.EmbeddingConfig(10, 4).init()
    for dtype in ("int64", "int32", "uint8"):
        out = emb.forward(Tensor.from_data(np.array([[1, 2], [3, 9]]), dtype=dtype))
        assert out.shape == (2, 2, 4) and out.dtype == "float32"
    with pytest.raises(DTypeError) as info:
        emb.forward(Tensor.from_data([[1.0, 2.0]]))
    assert str(info.value) == ('Embedding: expected an int tensor of indices, got float32 (input dims [1, 2]); '
                               'convert the input with input.cast("int64")')
    with pytest.raises(DTypeError, match=r"^Embedding: expected an int tensor of indices, got bool"):
        emb.forward(Tensor.from_data([[True, False]]))


def test_non_tensor_inputs_name_the_layer_when_no_shape_check_sees_them_first():
    mha = nn.MultiHeadAttentionConfig(8, 2).init()
    x = _x((2, 5, 8), "float32")
    with pytest.raises(TypeError, match=r"^assert_shape\(input\.key, .*expected an engine Tensor, got numpy\.ndarray"):
        mha.forward(nn.MhaInput(x, x.numpy(), x))
    dec = nn.TransformerDecoderConfig(8, 16, 2, 1).init().layers[0]
    with pytest.raises(TypeError, match=r"^TransformerDecoderLayer: expected an engine Tensor as memory, got list"):
        dec.forward(nn.TransformerDecoderInput(x, [[0.0]]))


def test_the_conversion_the_message_suggests_works():
    linear = nn.LinearConfig(3, 5).init()
    x = _x((2, 3), "float64")
    with pytest.raises(DTypeError):
        linear.forward(x)
    assert linear.forward(x.cast("float32")).dtype == "float32"
    dev = Device("cpu:4")
    old = dev.default_float_dtype
    dev.set_default_float_dtype("float64")
    try:
        assert nn.LinearConfig(3, 5).init(dev).forward(x.to_device(dev)).dtype == "float64"
    finally:
        dev.set_default_float_dtype(old)
