"""The example models under resources/examples: open by name, display, run, load the Burn
checkpoint fixture, and the 7 B Llama shape that stays lazy."""
import tracemalloc

import numpy as np
import pytest

from engine import Tensor
from resources.examples import ExampleError, build_example, describe_example, example_input, list_examples

BURN_BOOK = """Model {
  conv1: Conv2d {ch_in: 1, ch_out: 8, stride: [1, 1], kernel_size: [3, 3], dilation: [1, 1], groups: 1, padding: Valid, params: 80}
  conv2: Conv2d {ch_in: 8, ch_out: 16, stride: [1, 1], kernel_size: [3, 3], dilation: [1, 1], groups: 1, padding: Valid, params: 1168}
  pool: AdaptiveAvgPool2d {output_size: [8, 8]}
  dropout: Dropout {prob: 0.5}
  linear1: Linear {d_input: 1024, d_output: 512, bias: true, params: 524800}
  linear2: Linear {d_input: 512, d_output: 10, bias: true, params: 5130}
  activation: Relu
  params: 531178
}"""


def test_examples_are_listed_and_unknown_names_explain():
    names = list_examples()
    for name in ("burn-book", "burn-mnist", "transformer", "llama-7b"):
        assert name in names
        assert describe_example(name)
    with pytest.raises(ExampleError, match="unknown example 'nope': expected one of"):
        build_example("nope")


def test_burn_book_model_prints_as_in_the_book():
    model = build_example("burn-book")
    assert str(model) == BURN_BOOK
    out = model.valid().forward(example_input("burn-book", 3))
    assert out.shape == (3, 10)


def test_burn_mnist_loads_the_burn_checkpoint_and_reads_digits(fixtures_dir):
    from engine.store import ModuleRecord

    model = build_example("burn-mnist")
    paths = [p for p, _ in model.named_params()]
    assert paths[:6] == ["conv1.conv.weight", "conv1.conv.bias", "conv1.norm.gamma", "conv1.norm.beta",
                         "conv1.norm.running_mean", "conv1.norm.running_var"]
    assert paths[-1] == "fc3.bias" and len(paths) == 18
    record = ModuleRecord.load(fixtures_dir / "burn-mnist.bpk")
    model = model.load_record(record).valid()
    # hand-drawn digits (pixel 1.0 strokes on 0.0), normalized as the checkpoint expects
    imgs = np.zeros((3, 28, 28))
    imgs[0, 4:24, 13:15] = 1.0  # a one
    yy, xx = np.mgrid[:28, :28]
    r = np.sqrt((yy - 14) ** 2 / 1.6 + (xx - 14) ** 2)
    imgs[1][(r > 6) & (r < 8.5)] = 1.0  # a zero
    imgs[2, 5:7, 7:21] = 1.0  # a seven
    for i in range(14):
        imgs[2, 7 + i, 20 - i // 2:22 - i // 2] = 1.0
    logits = model.forward(Tensor.from_data((imgs - 0.1307) / 0.3081))
    assert logits.argmax(1).numpy().tolist() == [1, 0, 7]
    assert model.into_record().to_bytes() == (fixtures_dir / "burn-mnist.bpk").read_bytes()


def test_transformer_classifier_runs_and_trains():
    model = build_example("transformer")
    tokens = example_input("transformer", 4)
    logits = model.forward(tokens)
    assert logits.shape == (4, 4)
    grads = logits.sum().backward()
    assert model.embedding.weight.val().grad(grads) is not None


def test_llama_7b_stays_lazy():
    tracemalloc.start()
    try:
        model = build_example("llama-7b")
        n = model.num_params()
        text = str(model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 6_738_415_616
    assert text.startswith("LlamaForCausalLM {\n  embed_tokens: Embedding {n_embedding: 32000, d_model: 4096, "
                           "params: 131072000}")
    assert "params: 6738415616\n}" in text
    assert peak < 50_000_000, f"building and printing allocated {peak} bytes"
    assert not any(p.is_initialized() for _, p in model.named_params())


def test_llama_architecture_runs_at_a_tiny_size():
    from resources.examples import _module

    tiny = _module("llama-7b").build_config(vocab_size=50, d_model=16, n_layers=2, n_heads=4, d_ff=24, max_seq_length=16)
    tokens = Tensor.from_data([[1, 5, 7, 9], [3, 3, 2, 1]])
    logits = tiny.forward(tokens)
    assert logits.shape == (2, 4, 50)
    # causal: changing the last token leaves the earlier positions' logits unchanged
    other = tiny.forward(Tensor.from_data([[1, 5, 7, 2], [3, 3, 2, 8]]))
    np.testing.assert_allclose(logits.numpy()[:, :3], other.numpy()[:, :3], rtol=1e-5, atol=1e-6)
