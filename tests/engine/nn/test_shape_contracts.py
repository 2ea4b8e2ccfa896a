"""A violated shape contract at a layer's boundary raises ShapeError, naming the layer's
assert_shape call, before any kernel runs (no tensor is produced, no parameter initialized)."""
import pytest

from engine import ShapeError, Tensor, nn
from engine.module.param import Param

I = Tensor.from_data  # noqa: E741


def _cases():
    mha = nn.MultiHeadAttentionConfig(8, 2).init()
    return [
        ("Linear", nn.LinearConfig(3, 5).init(), lambda m, x: m.forward(x), [Tensor.zeros([2, 4])],
         "assert_shape(input, [..., d_input]): axis 1 expected 3, got 4 (dims [2, 4])"),
        ("Embedding", nn.EmbeddingConfig(10, 4).init(), lambda m, x: m.forward(x), [I([1, 2, 3])],
         "assert_shape(input, [None, None]): rank 2 expected, got 1"),
        ("LayerNorm", nn.LayerNormConfig(6).init(), lambda m, x: m.forward(x), [Tensor.zeros([2, 5])],
         "assert_shape(input, [..., d_model]): axis 1 expected 6, got 5"),
        ("BatchNorm", nn.BatchNormConfig(3).init(), lambda m, x: m.forward(x), [Tensor.zeros([2, 4, 5])],
         "assert_shape(input, [None, channels, ...]): axis 1 expected 3, got 4"),
        ("GroupNorm", nn.GroupNormConfig(2, 4).init(), lambda m, x: m.forward(x), [Tensor.zeros([2, 6, 3])],
         "assert_shape(input, [None, self.num_channels, None, ...]): axis 1 expected 4, got 6"),
        ("RmsNorm", nn.RmsNormConfig(4).init(), lambda m, x: m.forward(x), [Tensor.zeros([3])],
         "assert_shape(input, [..., d_model]): axis 0 expected 4, got 3"),
        ("Conv2d", nn.Conv2dConfig([5, 3], [3, 3]).init(), lambda m, x: m.forward(x), [Tensor.zeros([1, 4, 10, 10])],
         "assert_shape(input, [None, channels_in, None, None]): axis 1 expected 5, got 4"),
        ("Conv1d", nn.Conv1dConfig(5, 3, 3).init(), lambda m, x: m.forward(x), [Tensor.zeros([1, 5, 10, 2])],
         "assert_shape(input, [None, channels_in, None]): rank 3 expected, got 4"),
        ("ConvTranspose2d", nn.ConvTranspose2dConfig([5, 3], [3, 3]).init(), lambda m, x: m.forward(x),
         [Tensor.zeros([1, 4, 10, 10])], "axis 1 expected 5, got 4"),
        ("MaxPool2d", nn.MaxPool2dConfig([2, 2]).init(), lambda m, x: m.forward(x), [Tensor.zeros([1, 10, 10])],
         "assert_shape(input, [None, None, None, None]): rank 4 expected, got 3"),
        ("Lstm", nn.LstmConfig(2, 3, True).init(), lambda m, x: m.forward(x), [Tensor.zeros([4, 5, 3])],
         "assert_shape(batched_input, [None, None, d_input]): axis 2 expected 2, got 3"),
        ("Gru", nn.GruConfig(2, 3, True).init(), lambda m, x: m.forward(x), [Tensor.zeros([4, 5, 3])],
         "axis 2 expected 2, got 3"),
        ("MultiHeadAttention", mha, lambda m, q, k: m.forward(nn.MhaInput(q, k, k)),
         [Tensor.zeros([2, 5, 8]), Tensor.zeros([3, 5, 8])],
         "assert_shape(input.key, [batch_size, None, self.d_model]): axis 0 expected 2, got 3"),
        ("TransformerEncoder", nn.TransformerEncoderConfig(8, 16, 2, 1).init(), lambda m, x: m.forward(x),
         [Tensor.zeros([2, 5, 6])], "assert_shape(x, [None, None, self.d_model]): axis 2 expected 8, got 6"),
        ("CrossEntropyLoss", nn.CrossEntropyLossConfig().init(), lambda m, a, b: m.forward(a, b),
         [Tensor.zeros([4, 5]), I([1, 2, 3])], "assert_shape(targets, [batch_size]): axis 0 expected 4, got 3"),
        ("MseLoss", nn.MseLoss(), lambda m, a, b: m.forward(a, b), [Tensor.zeros([4, 5]), Tensor.zeros([4, 4])],
         "assert_shape(targets, list(logits.dims())): axis 1 expected 5, got 4"),
        ("PixelShuffle", nn.PixelShuffleConfig(2).init(), lambda m, x: m.forward(x), [Tensor.zeros([4, 4, 4])],
         "rank 4 expected, got 3"),
        ("RotaryEncoding", nn.RotaryEncodingConfig(10, 4).init(), lambda m, x: m.forward(x), [Tensor.zeros([2, 3, 6])],
         "assert_shape(x, [..., None, self.d_model]): axis 2 expected 4, got 6"),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_contract_violation_raises_before_any_kernel(case, monkeypatch):
    name, module, call, inputs, message = case

    def kernel_ran(*args, **kwargs):
        raise AssertionError(f"{name}: a kernel produced a tensor before the shape check")

    monkeypatch.setattr(Tensor, "_wrap", staticmethod(kernel_ran))
    with pytest.raises(ShapeError) as info:
        call(module, *inputs)
    monkeypatch.undo()
    text = str(info.value)
    assert text.startswith("assert_shape("), text
    assert message in text
    params = [p for _, p in module.named_params()]
    assert all(isinstance(p, Param) and not p.is_initialized() for p in params), "a parameter was initialized"
