"""ONNX export by tracing (engine.design.export_onnx) and the traced graph (trace_model).

Every exported model is evaluated with the onnx package's pure-Python ReferenceEvaluator (always
run) and, where onnxruntime is installed (the oracle venv), with onnxruntime too, and compared to
Ember's own outputs at batch sizes other than the traced one (the dynamic batch axis)."""
from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from engine import Module, Tensor, nn
from engine.design import build_model, mnist_design, residual_design
from engine.interop import OnnxExportError, export_onnx, trace_model
from engine.module import ModuleMapper
from engine.module.lora import Lora, LoraAdapter
from engine.store import ModuleRecord
from resources.examples import build_example, example_input, llama_7b
from tests.work import counted_calls

onnx = pytest.importorskip("onnx")
from onnx.reference import ReferenceEvaluator  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "tests" / "fixtures" / "hf" / "llama-gqa"


def _ort():
    try:
        import onnxruntime  # noqa: PLC0415
    except ImportError:
        pytest.skip("onnxruntime is not installed (an optional oracle: run with the torch venv)")
    return onnxruntime


def _feed(path, x) -> dict:
    """The graph's inputs for `x`: a language model's export takes `input_ids` and an all-ones `attention_mask`."""
    names = [i.name for i in onnx.load(str(path)).graph.input]
    if names == ["input_ids", "attention_mask"]:
        ids = x.numpy().astype(np.int64)
        return {"input_ids": ids, "attention_mask": np.ones(ids.shape, dtype=np.int64)}
    return {"input": x.numpy()}


def _run_reference(path, x):
    return ReferenceEvaluator(str(path)).run(None, _feed(path, x))


def _run_ort(path, x):
    ort = _ort()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, _feed(path, x))


def _agree(model, path, inputs, run, tol=1e-4):
    for x in inputs:
        want = model.forward(x)
        want = want.numpy() if isinstance(want, Tensor) else want
        (got,) = run(path, x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=tol, rtol=0)


@pytest.fixture(scope="module")
def mnist():
    bpk = ROOT.parent / "shared" / "fixtures" / "burn-mnist.bpk"  # Burn's trained weights
    return build_example("burn-mnist").load_record(ModuleRecord.load(bpk)).valid()


def _digits(batch):
    rng = np.random.default_rng(batch)
    return Tensor.from_data(((rng.random((batch, 28, 28)) > 0.7) - 0.1307) / 0.3081)


@pytest.fixture(scope="module")
def llama():
    from engine.models import from_pretrained  # noqa: PLC0415

    return from_pretrained(str(LLAMA)).valid()


def _tokens(batch, seq=5):
    rng = np.random.default_rng(batch)
    return Tensor.from_data(rng.integers(0, 100, size=(batch, seq)))


# ---- the exported file ---------------------------------------------------------------------------
def test_burn_mnist_with_burns_weights_matches_the_reference_evaluator_at_batch_1_and_3(mnist, tmp_path):
    path = export_onnx(mnist, tmp_path / "mnist.onnx", _digits(2))
    assert path == tmp_path / "mnist.onnx"
    _agree(mnist, path, [_digits(1), _digits(3)], _run_reference)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    inits = {i.name: i for i in model.graph.initializer}
    assert {"conv1.conv.weight", "conv1.norm.running_var", "fc3.bias"} <= set(inits)
    stored = np.asarray(onnx.numpy_helper.to_array(inits["fc3.weight"]))
    np.testing.assert_array_equal(stored, mnist.fc3.weight.val().numpy())  # the weights as they are
    (inp,) = model.graph.input
    assert inp.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim[1:]] == [28, 28]
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    names = [n.name for n in model.graph.node]
    assert any(n.startswith("conv1.conv/Conv_") for n in names)
    assert any(n.startswith("conv2.pool/MaxPool_") for n in names)
    assert any(n.startswith("fc1/MatMul_") for n in names)


def test_a_design_is_built_and_exported(tmp_path):
    path = export_onnx(mnist_design(), tmp_path / "design.onnx", Tensor.zeros([2, 28, 28]))
    model = onnx.load(str(path))
    inits = {i.name for i in model.graph.initializer}
    assert {"conv1.conv.weight", "conv2.norm.gamma", "fc3.bias"} <= inits
    (out,) = _run_reference(path, _digits(3))
    assert out.shape == (3, 10) and np.isfinite(out).all()


def test_a_built_residual_design_matches_ember(tmp_path):
    model = build_model(residual_design())
    x = Tensor.from_data(np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32))
    path = export_onnx(model, tmp_path / "residual.onnx", x)
    xs = [Tensor.from_data(np.random.default_rng(b).standard_normal((b, 64)).astype(np.float32)) for b in (1, 3)]
    _agree(model.valid(), path, xs, _run_reference)


def test_a_pretrained_tiny_llama_matches_ember(llama, tmp_path):
    path = export_onnx(llama, tmp_path / "llama.onnx", _tokens(2))
    _agree(llama, path, [_tokens(1), _tokens(3)], _run_reference)
    model = onnx.load(str(path))
    names = [n.name for n in model.graph.node]
    assert any(re.fullmatch(r"layers\.0\.self_attn/MatMul_\d+", n) for n in names)
    assert any(n.startswith("layers.1.mlp.gate_proj/MatMul_") for n in names)
    inits = {i.name for i in model.graph.initializer}
    assert {"embed_tokens.weight", "layers.0.self_attn.query.weight", "norm.gamma"} <= inits
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64


class _Perturb(ModuleMapper):
    """Seeded noise on the LoRA factors (b starts at zero: without it the adapter adds nothing)."""

    def __init__(self):
        self.rng = np.random.default_rng(3)
        self.path = []

    def enter_module(self, name, ct):
        self.path.append(name)

    def exit_module(self, name, ct):
        self.path.pop()

    def map_float(self, param):
        if not re.search(r"(^|\.)lora\.(a|b)$", ".".join(self.path)):
            return param
        noise = (self.rng.standard_normal(param.shape) * 0.05).astype(np.float32)
        return param.map(lambda t: (t + Tensor.from_data(noise, device=t.device)).detach())


def test_a_lora_model_is_exported_materialized_on_a_copy(llama, tmp_path):
    tuned = llama.apply_lora(Lora(2, 4.0)).map(_Perturb()).valid()
    assert not np.allclose(tuned.forward(_tokens(1)).numpy(), llama.forward(_tokens(1)).numpy(), atol=1e-3)
    path = export_onnx(tuned, tmp_path / "lora.onnx", _tokens(2))
    _agree(tuned, path, [_tokens(1), _tokens(3)], _run_reference)
    assert isinstance(tuned.layers[0].self_attn.query.weight.reparameterization, LoraAdapter)  # unchanged
    inits = {i.name for i in onnx.load(str(path)).graph.initializer}
    assert "layers.0.self_attn.query.weight" in inits
    assert not any("lora" in n for n in inits)


@pytest.mark.parametrize("which", ["mnist", "llama", "lora"])
def test_onnxruntime_gives_embers_outputs(which, mnist, llama, tmp_path):
    _ort()
    if which == "mnist":
        model, x, xs = mnist, _digits(2), [_digits(1), _digits(3)]
    elif which == "llama":
        model, x, xs = llama, _tokens(2), [_tokens(1), _tokens(3)]
    else:
        model, x, xs = llama.apply_lora(Lora(2, 4.0)).map(_Perturb()).valid(), _tokens(2), [_tokens(1), _tokens(3)]
    path = export_onnx(model, tmp_path / f"{which}.onnx", x)
    _agree(model, path, xs, _run_ort)


def test_a_static_batch_when_asked(mnist, tmp_path):
    path = export_onnx(mnist, tmp_path / "static.onnx", _digits(2), dynamic_batch=False)
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [2, 28, 28]


class _Flipper(Module):
    def __init__(self):
        self.fc = nn.LinearConfig(4, 4).init()
        self.inner = _Flip()

    def forward(self, x):
        return self.inner.forward(self.fc.forward(x))


class _Flip(Module):
    def forward(self, x):
        idx = Tensor.from_data(np.zeros(x.shape, dtype=np.int64))
        return x.scatter_add(1, idx, x)  # (flip has a converter now; scatter_add has none)


def test_an_op_without_an_onnx_form_names_the_op_and_the_module(tmp_path):
    target = tmp_path / "flip.onnx"
    with pytest.raises(OnnxExportError, match=r"op 'scatter_add' in module 'inner' has no ONNX form"):
        export_onnx(_Flipper(), target, Tensor.zeros([2, 4]))
    assert not target.exists() and list(tmp_path.iterdir()) == []  # nothing written, no temporary left


def test_export_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(OnnxExportError, match="expects a Module or a Design, got str"):
        export_onnx("model", tmp_path / "x.onnx", Tensor.zeros([1, 4]))


# ---- the traced graph ----------------------------------------------------------------------------
def test_trace_of_a_small_model_lists_its_ops_and_scopes(llama):
    tr = trace_model(build_model(residual_design()), Tensor.zeros([2, 64]))
    assert [(o.scope, o.op) for o in tr.ops] == [
        ("mlp.fc1", "linear"), ("mlp.activation", "relu"), ("mlp.fc2", "linear"), ("", "add"),
        ("norm", "normalize"), ("head", "linear")]
    assert tr.ops[0].scopes == ("", "mlp.fc1")
    assert tr.ops[4].attrs["axes"] == (-1,) and tr.ops[4].attrs["eps"] == pytest.approx(1e-5)
    assert {t.name for t in tr.params().values()} >= {"mlp.fc1.weight", "head.bias"}
    assert [tr.tensors[i].shape for i in tr.outputs] == [(2, 10)]

    t2 = trace_model(llama, _tokens(2, seq=4))
    attn = [o.op for o in t2.ops_in("layers.0.self_attn")]
    assert attn.count("linear") == 4 and attn.count("rotary") == 2 and "softmax" in attn
    assert ("layers.0.mlp.act_fn", "SiLU") in t2.modules
    rs = [o for o in t2.ops_in("layers.0.self_attn") if o.op == "reshape"][0]
    assert rs.attrs["shape"] == (2, 4, 6, 8)


def test_shape_only_trace_of_llama_7b_is_fast_small_and_allocates_nothing():
    model = llama_7b.build()
    x = llama_7b.example_input(2)
    tracemalloc.start()
    try:
        with counted_calls() as calls:
            tr = trace_model(model, x, shape_only=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # fast, counted rather than timed (a loaded 2-core machine took 2.08 s of a normal 0.1): 137,088
    # calls measured for the 323 traced ops (424 an op); a walk of the model per op is several times more
    assert calls.n < 1000 * len(tr.ops), (calls.n, len(tr.ops))
    assert peak < 100e6
    assert all(not p.is_initialized() for _, p in model.named_params())
    assert [tr.tensors[i].shape for i in tr.outputs] == [(2, 8, 32000)]
    gate = [o for o in tr.ops if o.scope == "layers.31.mlp.gate_proj"]
    assert [(o.op, o.attrs["type"]) for o in gate] == [("module", "Linear")]
    assert tr.tensors[gate[0].outputs[0]].shape == (2, 8, 11008)
    residual = [o for o in tr.ops_in("layers.31") if o.op == "add"]
    assert len(residual) == 2  # the glue between the layers is traced op by op


def test_a_shape_only_trace_is_not_exportable(tmp_path):
    from engine.interop.onnx_export import trace_to_onnx  # noqa: PLC0415

    tr = trace_model(build_example("burn-mnist"), example_input("burn-mnist", 2), shape_only=True)
    with pytest.raises(OnnxExportError, match=r"op 'module' in module 'conv1.conv' has no ONNX form"):
        trace_to_onnx(tr)


@pytest.mark.parametrize("folder", ["bert", "vit", "gpt2"])
def test_pretrained_bert_vit_gpt2_match_ember_with_a_dynamic_batch(folder, tmp_path):
    """BERT makes its token types as zeros of the batch's size and ViT expands its class token to
    the batch: the two traces (batch B and B + 1) make both follow the input's batch."""
    from engine.models import from_pretrained  # noqa: PLC0415

    model = from_pretrained(str(ROOT / "tests" / "fixtures" / "hf" / folder)).valid()
    if folder == "vit":
        import json  # noqa: PLC0415

        config = json.loads((ROOT / "tests" / "fixtures" / "hf" / "vit" / "config.json").read_text())
        size = config["image_size"]

        def make(b):
            return Tensor.from_data(np.random.default_rng(b).standard_normal((b, 3, size, size)).astype(np.float32))
    else:
        make = _tokens
    path = export_onnx(model, tmp_path / f"{folder}.onnx", make(2))
    for b in (1, 3):
        want = model.forward(make(b))
        want = want.numpy() if isinstance(want, Tensor) else _flat_last(want)
        (got,) = _run_reference(path, make(b))[-1:]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def _flat_last(out):
    from engine.tensor.trace import flat_tensors  # noqa: PLC0415

    return flat_tensors(out)[-1].numpy()


def test_a_batch_equal_to_another_size_is_still_told_apart(llama, tmp_path):
    """Traced at batch 4 on 4 tokens: the reshapes' batch and sequence sizes are both 4, and only
    the batch follows the input."""
    path = export_onnx(llama, tmp_path / "square.onnx", _tokens(4, seq=4))
    _agree(llama, path, [_tokens(1, seq=4), _tokens(3, seq=4)], _run_reference)


def test_a_qlora_model_is_exported_dequantized(llama, tmp_path):
    from engine.module.lora import QLora  # noqa: PLC0415

    tuned = llama.apply_qlora(QLora(Lora(2, 4.0))).map(_Perturb()).valid()
    path = export_onnx(tuned, tmp_path / "qlora.onnx", _tokens(2))
    _agree(tuned, path, [_tokens(1), _tokens(3)], _run_reference)


class _RowIds(Module):
    """Adds each row's index squared: a constant that depends on the batch and differs between rows."""

    def forward(self, x):
        n = x.shape[0]
        return x + Tensor.from_data((np.arange(n) ** 2).astype(np.float32)).reshape(n, 1)


class _RowCount(Module):
    """Adds each row's index (`Tensor.arange`): positions counting up, computed in the graph at any batch."""

    def forward(self, x):
        return x + Tensor.arange(x.shape[0]).cast("float32").reshape(x.shape[0], 1)


def test_a_constant_that_differs_between_rows_refuses_a_dynamic_batch(tmp_path):
    with pytest.raises(OnnxExportError, match=r"depends on the batch.*rows that are all the same.*dynamic_batch=False"):
        export_onnx(_RowIds(), tmp_path / "rows.onnx", Tensor.zeros([2, 3]))
    path = export_onnx(_RowIds(), tmp_path / "rows.onnx", Tensor.zeros([2, 3]), dynamic_batch=False)
    (got,) = _run_reference(path, Tensor.zeros([2, 3]))
    np.testing.assert_array_equal(got, [[0, 0, 0], [1, 1, 1]])


def test_positions_counting_up_follow_the_run_time_batch(tmp_path):
    path = export_onnx(_RowCount(), tmp_path / "count.onnx", Tensor.zeros([2, 3]))
    (got,) = _run_reference(path, Tensor.zeros([4, 3]))
    np.testing.assert_array_equal(got, np.repeat(np.arange(4.0)[:, None], 3, axis=1))


@pytest.mark.parametrize("which", ["mnist", "llama", "lora"])
def test_an_exported_model_imports_back_with_the_same_outputs(which, mnist, llama, tmp_path):
    """Must-show 2's round trip: export, import_onnx, build, load the record, run."""
    from engine.interop import import_onnx  # noqa: PLC0415

    if which == "mnist":
        model, x, xs = mnist, _digits(2), [_digits(1), _digits(3)]
    elif which == "llama":
        model, x, xs = llama, _tokens(2), [_tokens(1), _tokens(3)]
    else:
        model, x, xs = llama.apply_lora(Lora(2, 4.0)).map(_Perturb()).valid(), _tokens(2), [_tokens(1), _tokens(3)]
    path = export_onnx(model, tmp_path / f"{which}.onnx", x, dynamic_sequence=False)  # the form import reads
    imported = import_onnx(path)
    back = build_model(imported.design).load_record(imported.record).valid()
    for xi in xs:
        np.testing.assert_allclose(back.forward(xi).numpy(), model.forward(xi).numpy(), atol=1e-4, rtol=0)


def test_module_calls_give_the_module_level_graph_with_shapes():
    tr = trace_model(build_example("burn-mnist"), example_input("burn-mnist", 2))
    calls = {c.path: c for c in tr.calls}
    conv = calls["conv1.conv"]
    assert conv.type_name == "Conv2d"
    assert [tr.tensors[i].shape for i in conv.inputs] == [(2, 1, 28, 28)]
    assert [tr.tensors[i].shape for i in conv.outputs] == [(2, 64, 26, 26)]
    assert [o.op for o in tr.ops[conv.first:conv.end]] == ["conv2d"]
    # an edge: what conv1.conv returned is what conv1.norm was given
    assert calls["conv1.norm"].inputs == conv.outputs
    assert calls[""].outputs == tr.outputs and calls[""].first == 0 and calls[""].end == len(tr.ops)

    lazy = trace_model(llama_7b.build(), llama_7b.example_input(1), shape_only=True)
    gate = {c.path: c for c in lazy.calls}["layers.0.mlp.gate_proj"]
    assert [lazy.tensors[i].shape for i in gate.outputs] == [(1, 8, 11008)]


class _Recurrent(Module):
    def __init__(self):
        self.rnn = nn.LstmConfig(4, 6, True).init()

    def forward(self, x):
        return self.rnn.forward(x)[0]


def test_an_lstm_exports_its_steps_and_its_batch_sized_initial_state(tmp_path):
    """The recurrent layers join their steps with `cat` / `stack` imported by name, and start from
    zeros of the batch's size: both are traced, and the state follows the input's batch."""
    model = _Recurrent()
    make = lambda b: Tensor.from_data(np.random.default_rng(b).standard_normal((b, 5, 4)).astype(np.float32))  # noqa: E731
    tr = trace_model(model, make(2))
    assert "stack" in tr.op_names()
    path = export_onnx(model, tmp_path / "lstm.onnx", make(2))
    _agree(model.valid(), path, [make(1), make(3)], _run_reference)


# ---- converters of more ops: each against the ReferenceEvaluator at batch 1 and 3 ----------------------
class _Fn(Module):
    def __init__(self, fn):
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


_SEL = Tensor.from_data(np.asarray([2, 0, 1]))
_OP_FORMS = {
    "flip": lambda x: x.flip([1, -1]),
    "pad_constant": lambda x: x.pad([1, 2, 0, 1], value=0.5),
    "pad_reflect": lambda x: x.pad([1, 2], mode="reflect"),
    "pad_replicate": lambda x: x.pad([1, 1, 2, 0], mode="replicate"),
    "tril": lambda x: x.tril(1),
    "triu": lambda x: x.triu(-1),
    "gather": lambda x: x.gather(2, Tensor.from_data(np.tile(np.asarray([[[0, 3], [1, 1], [2, 0]]]),
                                                             (x.shape[0], 1, 1)))),
    "select": lambda x: x.select(1, _SEL),
    "index_new_axes": lambda x: x[:, None, 1:, None, 2],
    "index_ellipsis_new_axis": lambda x: x[..., None, 1:3],
    "repeat": lambda x: x.repeat([1, 2, 1]),
    "repeat_dim": lambda x: x.repeat_dim(2, 2),
    "argmax": lambda x: x.argmax(2).cast("float32"),
    "argmin_keepdim": lambda x: x.argmin(1, keepdim=True).cast("float32"),
    "logsumexp": lambda x: x.logsumexp(1),
    "one_hot": lambda x: x.argmax(2).one_hot(4, "float32"),
}


def _three_batches(model, path):
    ref = ReferenceEvaluator(str(path))
    for b in (1, 3):
        x = Tensor.from_data(np.random.default_rng(b).standard_normal((b, 3, 4)).astype(np.float32) * 2)
        want = model.forward(x).numpy()
        (got,) = ref.run(None, {"input": x.numpy()})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("form", sorted(_OP_FORMS))
def test_more_ops_export_with_embers_outputs(form, tmp_path):
    model = _Fn(_OP_FORMS[form])
    path = export_onnx(model, tmp_path / f"{form}.onnx", Tensor.zeros([2, 3, 4]) + 0.25)
    _three_batches(model, path)


def _activation(name):
    if name == "GLU":
        return nn.GLU(-1)
    if name == "PRelu":
        return nn.PReluConfig(num_parameters=3, alpha=0.3).init()  # one slope a channel (axis 1)
    cfg = getattr(nn, f"{name}Config", None)
    return cfg().init() if cfg is not None else getattr(nn, name)()


@pytest.mark.parametrize("name", ["Celu", "HardSwish", "Mish", "LogSigmoid", "HardShrink", "SoftShrink", "Tanhshrink",
                                  "PRelu", "GLU"])
def test_the_remaining_activations_export(name, tmp_path):
    model = _activation(name).valid()
    path = export_onnx(model, tmp_path / f"{name}.onnx", Tensor.zeros([2, 3, 4]) + 0.25)
    _three_batches(model, path)
