"""ONNX import in bounded time and memory (issue 43): constant folding sizes every value before it is
computed and refuses what would pass its limits with an OnnxImportError naming the node; import work grows
linearly with the node count (counted in function calls, not timed); a fuzz of hostile graphs under an
address-space limit ends only in OnnxImportError or a working import."""
from __future__ import annotations

import cProfile
import pstats
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.design import Design, DesignError, OnnxImportError, build_model, import_onnx
from tests.limits import address_space_growth_limit

F = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _save(tmp_path, model, name="m.onnx") -> Path:
    p = tmp_path / name
    p.write_bytes(model.SerializeToString())
    return p


def _calls(fn) -> int:
    """The function calls (Python and built-in) `fn()` makes: work counted, not timed."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    return pstats.Stats(prof).total_calls


# ---------------------------------------------------------------------------------- linear import
def _chain(n: int):
    """x -> Relu -> Sigmoid -> Tanh -> Neg -> Relu ... (n nodes, named as torch's dynamo exporter names them)."""
    ops = ["Relu", "Sigmoid", "Tanh", "Neg"]
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node(ops[i % 4], [prev], [f"v{i}"], name=f"node_{ops[i % 4]}_{i}"))
        prev = f"v{i}"
    return _model(nodes, [F("x", TensorProto.FLOAT, ["batch", 4])], [F(prev, TensorProto.FLOAT, ["batch", 4])])


def test_import_work_grows_linearly_with_the_node_count(tmp_path):
    small, large = _save(tmp_path, _chain(600), "small.onnx"), _save(tmp_path, _chain(1800), "large.onnx")
    import_onnx(small)  # imports and caches warmed
    a = _calls(lambda: import_onnx(small))
    b = _calls(lambda: import_onnx(large))
    # 3x the nodes: linear work is 3x the calls; the quadratic name check made it ~6x (2.3 M vs 14 M calls)
    assert b < 3.6 * a, (a, b)
    got = import_onnx(large)
    assert len(got.design) == 1800 + 2


def test_naming_nodes_is_linear_in_the_design_size():
    def build(n):
        d = Design()
        for i in range(n):  # default names (relu1, relu2, ...), unique names of one stem, blocks
            d.add_node("Relu")
            d.add_node("Relu", d.unique_name("act"))
            d.add_node("Relu", f"blk{i}.inner")
        return d

    a = _calls(lambda: build(100))
    b = _calls(lambda: build(300))
    assert b < 3.6 * a, (a, b)  # linear: 3x; the old scans made it 9x to 27x
    d = build(5)
    assert d.nodes()[:4] == ["relu1", "act", "blk0.inner", "relu2"] and "act5" in d
    assert d.block_names() == {f"blk{i}" for i in range(5)}
    # the rules the names follow are unchanged: a block is not a node, a node is not a block, freed names return
    assert d.unique_name("blk0") == "blk0_2" and d.unique_name("blk0.other") == "blk0.other"
    assert d.unique_name("blk0.inner") == "blk0.inner2"
    with pytest.raises(DesignError, match="'blk0.inner' is a node"):  # was an endless search
        d.unique_name("blk0.inner.deeper")
    d.remove_node("relu1")
    assert d.default_name("Relu") == "relu1"
    d.rename_node("blk1.inner", "blk1x")
    assert "blk1" not in d.block_names() and d.unique_name("blk1") == "blk1"
