"""GeluTanh: GELU's tanh approximation as a layer (torch's nn.GELU(approximate="tanh")), added in one file
(engine/nn/activation.py: the class and its declare(...) line): its forward, its shape rule in the designer,
its catalog entry, its ONNX export (onnx's reference evaluator) and the import of ONNX Gelu(approximate="tanh")."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine import nn
from engine.design import Design, analyze, build_model, catalog, spec_for
from engine.interop import ExportError, export_onnx, export_python, export_rust, import_onnx
from engine.tensor import Tensor

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

X = np.linspace(-6.0, 6.0, 48).reshape(2, 3, 8)


def _reference(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _design():
    d = Design("Model")
    d.add_node("Input", "input", {"shape": ["batch", "seq", 8]})
    d.add_node("GeluTanh", "act")
    d.add_node("Output", "output")
    d.connect("input", "output", "act", "input")
    d.connect("act", "output", "output", "input")
    return d


def test_forward_is_the_tanh_approximation():
    got = nn.GeluTanh().forward(Tensor.from_data(X, dtype="float64")).numpy()
    np.testing.assert_allclose(got, _reference(X), rtol=1e-12, atol=1e-12)
    exact = nn.Gelu().forward(Tensor.from_data(X, dtype="float64")).numpy()
    assert np.abs(got - exact).max() > 1e-4  # not the erf form
    assert str(nn.GeluTanh()) == "GeluTanh"


def test_catalog_entry_and_shape_rule():
    assert "GeluTanh" in catalog()
    spec = spec_for("GeluTanh")
    assert spec.category == "General" and spec.fields == () and spec.inputs == ("input",)
    assert analyze(_design()).output_shapes()["output"].text() == "[batch, seq, 8]"
    # the designer builds it, and the Python export names it; Burn has no tanh GELU: the Rust export says so
    model = build_model(_design())
    np.testing.assert_allclose(model.forward(Tensor.from_data(X.astype(np.float32))).numpy(), _reference(X),
                               rtol=1e-5, atol=1e-6)
    assert "nn.GeluTanh()" in export_python(_design())
    with pytest.raises(ExportError, match="GeluTanh has no Burn counterpart"):
        export_rust(_design())


def test_onnx_export_matches_the_reference_evaluator(tmp_path):
    model = build_model(_design())
    x = X.astype(np.float32)
    path = export_onnx(model, tmp_path / "gelu_tanh.onnx", Tensor.from_data(x))
    (got,) = ReferenceEvaluator(str(path)).run(None, {"input": x})
    np.testing.assert_allclose(got, _reference(X), rtol=1e-5, atol=1e-6)


def test_onnx_gelu_with_tanh_imports_as_the_layer(tmp_path):
    node = helper.make_node("Gelu", ["x"], ["y"], name="act", approximate="tanh")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    path = tmp_path / "gelu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    imported = import_onnx(path)
    assert imported.report.ok and imported.design.kind("act") == "GeluTanh"
    x = X.reshape(-1, 8).astype(np.float32)
    (want,) = ReferenceEvaluator(str(path)).run(None, {"x": x})
    got = build_model(imported.design).forward(Tensor.from_data(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
