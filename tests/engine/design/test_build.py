"""A built design is an ordinary Module: paths follow node names, it loads Burn's checkpoint,
gives the hand-written model's logits, and takes LoRA, freezing and training."""
import numpy as np
import pytest

from engine import Device, Tensor, optim
from engine.design import BuildError, Design, build_model, mnist_design, residual_design
from engine.module import Lora, ParamGroup, ShapeError
from engine.store import ModuleRecord
from resources.examples import build_example, list_examples


def _mnist_example_name():
    return "burn-mnist" if "burn-mnist" in list_examples() else "digits"


def test_paths_follow_node_names_and_nest_on_dots():
    model = build_model(mnist_design())
    paths = [p for p, _ in model.named_params()]
    assert paths[:6] == ["conv1.conv.weight", "conv1.conv.bias", "conv1.norm.gamma", "conv1.norm.beta",
                         "conv1.norm.running_mean", "conv1.norm.running_var"]
    assert paths[-2:] == ["fc3.weight", "fc3.bias"]
    assert type(model).__name__ == "Model" and type(model.conv1).__name__ == "Conv1Block"
    assert str(model).startswith("Model {\n  conv1: Conv1Block {\n    conv: Conv2d {ch_in: 1, ch_out: 64")
    assert model.num_params() == build_example(_mnist_example_name()).num_params()
    assert not any(p.is_initialized() for _, p in model.named_params())  # lazy until used


def test_mnist_design_loads_burns_checkpoint_and_matches_the_example(fixtures_dir):
    path = fixtures_dir / "burn-mnist.bpk"
    model = build_model(mnist_design()).load_record(ModuleRecord.load(path))
    reference = build_example(_mnist_example_name()).load_record(ModuleRecord.load(path))
    x = Tensor.random((3, 28, 28), ("normal", 0.0, 1.0))
    got = model.valid().forward(x).numpy()
    want = reference.valid().forward(x).numpy()
    assert got.shape == (3, 10)
    # two implementations of one model (the design's graph walk and the hand-written example):
    # equal up to float32 rounding, not bit for bit, since BLAS kernels and NumPy's SIMD loops
    # depend on the CPU and on memory layout
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # saving the loaded design model gives back Burn's very file
    assert model.into_record().to_bytes() == path.read_bytes()


def test_forward_checks_its_inputs_against_the_input_nodes():
    model = build_model(mnist_design())
    with pytest.raises(ShapeError, match=r"Model.forward\(input: \[batch, 28, 28\]\): axis 2 expected 28, got 27 "
                                         r"\(dims \[4, 28, 27\]\)"):
        model.forward(Tensor.zeros((4, 28, 27)))
    with pytest.raises(TypeError, match="takes 1 input"):
        model.forward(Tensor.zeros((4, 28, 28)), Tensor.zeros((1,)))
    d = Design("Two")
    d.add_node("Input", "a", {"shape": ["batch", 3]})
    d.add_node("Input", "b", {"shape": ["batch", 3]})
    d.add_node("Add", "sum")
    d.add_node("Output", "out")
    d.add_node("Output", "copy")
    d.connect("a", "output", "sum", "in0")
    d.connect("b", "output", "sum", "in1")
    d.connect("sum", "output", "out", "input")
    d.connect("a", "output", "copy", "input")
    two = build_model(d)
    out, copy = two.forward(Tensor.ones((2, 3)), b=Tensor.ones((2, 3)))
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 2.0, np.float32))
    with pytest.raises(ShapeError, match=r"axis 0 \(batch\) expected 2 as in input 'a', got 5"):
        two.forward(Tensor.ones((2, 3)), Tensor.ones((5, 3)))


def test_an_incomplete_design_is_refused_with_every_problem():
    d = mnist_design()
    d.set_field("fc1", "d_input", 100)
    d.set_field("dropout2", "prob", 2.0)
    with pytest.raises(BuildError) as e:
        build_model(d)
    text = "\n".join(e.value.messages)
    assert "fc1: assert_shape(input, [..., d_input]): axis 1 expected 100, got 1600" in text
    assert "dropout2: configuration: Dropout probability should be between 0 and 1, but got 2" in text


def test_structural_nodes_compute_what_they_say():
    d = Design()
    d.add_node("Input", "x", {"shape": ["batch", 6]})
    d.add_node("Split", "split", {"sizes": [2, 4]})
    d.add_node("Concat", "cat", {"dim": 1})
    d.add_node("Reshape", "r", {"shape": ["batch", 3, -1]})
    d.add_node("Flatten", "f", {"start_dim": 1})
    d.add_node("Output", "out")
    d.connect("x", "output", "split", "input")
    d.connect("split", "out1", "cat", "in0")
    d.connect("split", "out0", "cat", "in1")
    d.connect("cat", "output", "r", "input")
    d.connect("r", "output", "f", "input")
    d.connect("f", "output", "out", "input")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    y = build_model(d).forward(Tensor.from_data(x)).numpy()
    np.testing.assert_array_equal(y, np.concatenate([x[:, 2:], x[:, :2]], axis=1))


def test_built_model_takes_lora_freezing_and_a_training_step():
    model = build_model(residual_design(), Device("cpu"))
    lora = model.apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(r"mlp\.fc1\.weight")))
    paths = [p for p, _ in lora.named_params()]
    assert "mlp.fc1.weight.lora.a" in paths and "mlp.fc1.weight.lora.b" in paths
    frozen = model.freeze_group(ParamGroup.from_predicate("mlp"))
    assert not dict(frozen.named_params())["mlp.fc1.weight"].is_require_grad()
    # one optimizer step changes the head and leaves the frozen block alone
    trainable = frozen.train()
    x = Tensor.random((4, 64), ("normal", 0.0, 1.0)).autodiff()
    loss = trainable.forward(x).sum()
    grads = optim.GradientsParams.from_grads(loss.backward(), trainable)
    before = {p: v.val().numpy().copy() for p, v in trainable.named_params()}
    stepped = optim.SgdConfig().init().step(0.1, trainable, grads)
    after = {p: v.val().numpy() for p, v in stepped.named_params()}
    assert not np.array_equal(before["head.weight"], after["head.weight"])
    np.testing.assert_array_equal(before["mlp.fc1.weight"], after["mlp.fc1.weight"])
    # the model is still the design's model after transitions
    assert stepped.design() == residual_design()
    assert isinstance(stepped.forward(Tensor.zeros((1, 64))), Tensor)
