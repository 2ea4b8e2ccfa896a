"""Export -> import round trip of every exported family (issue 21): each pretrained fixture family,
burn-mnist with Burn's weights and a LoRA-attached model are exported with a dynamic batch,
read back by import_onnx, built, loaded and run at batch 1 and 3; the outputs equal Ember's own
forward of the original model (<= 1e-4). Also: a run-time shape computed from a dynamic batch
(Shape -> Gather -> Unsqueeze -> Concat -> Reshape / Expand) imports with the batch's named axis
flowing through, checked against onnx's ReferenceEvaluator."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.design import build_model
from engine.interop import export_onnx, import_onnx
from engine.module.lora import Lora
from engine.store import ModuleRecord
from engine.tensor.trace import flat_tensors
from resources.examples import build_example

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
HF = ROOT / "tests" / "fixtures" / "hf"


def _tokens(batch, seq=5):
    return Tensor.from_data(np.random.default_rng(batch).integers(0, 100, size=(batch, seq)))


def _images(size):
    def make(batch):
        return Tensor.from_data(np.random.default_rng(batch).standard_normal((batch, 3, size, size))
                                .astype(np.float32))
    return make


def _digits(batch):
    rng = np.random.default_rng(batch)
    return Tensor.from_data(((rng.random((batch, 28, 28)) > 0.7) - 0.1307) / 0.3081)


def _arrays(out):
    return [t.numpy() for t in flat_tensors(out)]


def _round_trip(model, make, tmp_path, stem):
    path = export_onnx(model, tmp_path / f"{stem}.onnx", make(2), dynamic_sequence=False)  # the form import reads
    imported = import_onnx(path)
    assert imported.report.ok
    back = build_model(imported.design).load_record(imported.record).valid()
    for b in (1, 3):
        want, got = _arrays(model.forward(make(b))), _arrays(back.forward(make(b)))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.shape[0] == b
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
    return imported


@pytest.mark.parametrize("family", ["llama-gqa", "mistral", "qwen2", "gpt2", "bert", "vit"])
def test_every_pretrained_family_exports_and_imports_back_with_embers_outputs(family, tmp_path):
    from engine.models import from_pretrained  # noqa: PLC0415

    model = from_pretrained(str(HF / family)).valid()
    if family == "vit":
        make = _images(json.loads((HF / "vit" / "config.json").read_text())["image_size"])
    else:
        make = _tokens
    imported = _round_trip(model, make, tmp_path, family)
    if family in ("gpt2", "bert", "vit"):
        # their masks / token types / class token follow the batch through a run-time Expand target
        assert any(v.startswith("a run-time shape") for v in imported.report.mapping.values())


def test_burn_mnist_with_burns_weights_round_trips(tmp_path):
    model = build_example("burn-mnist").load_record(
        ModuleRecord.load(ROOT.parent / "shared" / "fixtures" / "burn-mnist.bpk")).valid()
    _round_trip(model, _digits, tmp_path, "mnist")


def test_a_lora_attached_model_round_trips_materialized(tmp_path):
    from engine.models import from_pretrained  # noqa: PLC0415

    model = from_pretrained(str(HF / "qwen2")).valid().apply_lora(Lora(2, 4.0)).valid()
    _round_trip(model, _tokens, tmp_path, "lora")


# ---- run-time shapes from a dynamic batch -------------------------------------------------------------
def _save(tmp_path, nodes, inits, inp, out_dims, name="m"):
    graph = helper.make_graph(nodes, name, [inp], [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _check_batches(path, shape_of, batches=(1, 3)):
    imported = import_onnx(path)
    model = build_model(imported.design).load_record(imported.record).valid()
    ref = ReferenceEvaluator(str(path))
    for b in batches:
        x = np.random.default_rng(b).standard_normal(shape_of(b)).astype(np.float32)
        (want,) = ref.run(None, {"x": x})
        got = model.forward(Tensor.from_data(x)).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    return imported


def test_shape_gather_concat_reshape_of_a_dynamic_batch(tmp_path):
    """x [batch, 4, 6] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [2, 12])): the batch's size
    flows through the shape arithmetic instead of being refused."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = {"zero": np.asarray(0, np.int64), "ax0": np.asarray([0], np.int64),
             "rest": np.asarray([2, 12], np.int64)}
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 6])
    imported = _check_batches(_save(tmp_path, nodes, inits, inp, ["batch", 2, 12]), lambda b: (b, 4, 6))
    assert imported.report.ok
    assert "run-time shape" in imported.report.mapping["#0 (Shape)"]


def test_a_constant_expanded_to_the_batch_then_added(tmp_path):
    """The ViT class-token form: Expand(c [1, 1, 6], Concat(Slice(Shape(x), 0:1), [1, 6])) follows the batch."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["b"]),
             helper.make_node("Concat", ["b", "rest"], ["target"], axis=0),
             helper.make_node("Expand", ["c", "target"], ["e"]),
             helper.make_node("Concat", ["e", "x"], ["y"], axis=1)]
    inits = {"st": np.asarray([0], np.int64), "en": np.asarray([1], np.int64),
             "rest": np.asarray([1, 6], np.int64),
             "c": np.arange(6, dtype=np.float32).reshape(1, 1, 6)}
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 6])
    _check_batches(_save(tmp_path, nodes, inits, inp, ["batch", 4, 6]), lambda b: (b, 3, 6))


def test_two_run_time_sizes_in_one_reshape_target(tmp_path):
    """Reshape(x [batch, seq, 8], [batch, seq, 2, 4]): two named axes, both from the same tensor."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["bs"]),
             helper.make_node("Concat", ["bs", "rest"], ["target"], axis=0),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["xt", "target"], ["y"])]
    inits = {"st": np.asarray([0], np.int64), "en": np.asarray([2], np.int64),
             "rest": np.asarray([2, 4], np.int64)}
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    _check_batches(_save(tmp_path, nodes, inits, inp, ["seq", "batch", 2, 4]), lambda b: (b, b + 1, 8))


def test_a_run_time_shape_read_as_a_tensor_is_still_computed(tmp_path):
    """Shape(x) cast to float and added: the shape is made as Op nodes where a tensor reads it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "sf"], ["y"])]
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])
    _check_batches(_save(tmp_path, nodes, {}, inp, ["batch", 2]), lambda b: (b, 2))


# ---- the exporter's forms of more ops import back ------------------------------------------------------
def _op_forms():
    from tests.engine.design.test_onnx_export import _OP_FORMS, _Fn, _activation  # noqa: PLC0415

    forms = {k: _Fn(f) for k, f in _OP_FORMS.items()}
    for name in ("Celu", "HardSwish", "Mish", "LogSigmoid", "HardShrink", "SoftShrink", "Tanhshrink", "PRelu", "GLU"):
        forms[name] = _activation(name).valid()
    return forms


_FORMS = sorted(["flip", "pad_constant", "pad_reflect", "pad_replicate", "tril", "triu", "gather", "select",
                 "index_new_axes", "index_ellipsis_new_axis", "repeat", "repeat_dim", "argmax", "argmin_keepdim",
                 "logsumexp", "one_hot", "Celu", "HardSwish", "Mish", "LogSigmoid", "HardShrink", "SoftShrink",
                 "Tanhshrink", "PRelu", "GLU"])


@pytest.mark.parametrize("form", _FORMS)
def test_an_exported_op_form_imports_back(form, tmp_path):
    model = _op_forms()[form]

    def make(b):
        return Tensor.from_data(np.random.default_rng(b).standard_normal((b, 3, 4)).astype(np.float32) * 2)
    _round_trip(model, make, tmp_path, form)
