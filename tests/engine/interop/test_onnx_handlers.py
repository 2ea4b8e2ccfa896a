"""ONNX import's handlers: one per op type, registered by the module of its op family (engine.interop.onnx_import)."""
from __future__ import annotations

import pytest
from onnx import TensorProto, helper, save

from engine.interop import import_onnx
from engine.interop.onnx_import import HANDLERS, handles

F = helper.make_tensor_value_info


def _erf_model(tmp_path):
    node = helper.make_node("Erf", ["x"], ["y"], name="erf")
    graph = helper.make_graph([node], "g", [F("x", TensorProto.FLOAT, ["batch", 4])],
                              [F("y", TensorProto.FLOAT, ["batch", 4])])
    path = tmp_path / "erf.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_each_op_family_registers_its_handlers():
    families = {"Conv": "ops_conv_pool", "MaxPool": "ops_conv_pool", "BatchNormalization": "ops_norm",
                "Gemm": "ops_matmul", "MatMul": "ops_matmul", "Dropout": "ops_activation", "Reshape": "ops_shape",
                "Split": "ops_shape"}
    for op, family in families.items():
        assert HANDLERS[op].__module__ == f"engine.interop.onnx_import.{family}", op


def test_a_registered_handler_decides_how_its_op_imports(tmp_path, monkeypatch):
    path = _erf_model(tmp_path)
    assert import_onnx(path).design.kind("erf") == "Op"  # no handler: the primitive Op node kind

    def as_tanh(imp, node, name):
        return imp.add("Tanh", name, node.op_type, {}, [node.input[0]], node.output[0])

    monkeypatch.setitem(HANDLERS, "Erf", as_tanh)
    imported = import_onnx(path)
    assert imported.design.kind("erf") == "Tanh"
    assert imported.report.mapping["erf"] == "erf (Tanh)"


def test_an_op_type_takes_one_handler():
    with pytest.raises(ValueError, match="'Conv' has two handlers"):
        handles("Conv")(lambda imp, node, name: None)
