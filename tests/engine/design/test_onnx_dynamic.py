"""ONNX files with shapes computed at run time (issue 47): a tiny BERT, GPT-2 and ResNet-like CNN as PyTorch
2.13 exports them by default with dynamic batch and sequence (image size) axes, by the TorchScript exporter
(`dynamo=False`: Range, Slice to a run-time end, Where(Equal(shape, -1), 1, shape) before Expand) and by the
dynamo exporter (GatherND, Shape with start / end, Range), imported once and run at two batch sizes and two
sequence lengths against onnxruntime's outputs (tests/fixtures/onnx/make_dynamic_fixtures.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from engine import Tensor
from engine.design import build_model
from engine.interop import import_onnx

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
NAMES = [f"dyn_{m}_{e}" for m in ("bert", "gpt2", "resnet") for e in ("ts", "dynamo")]


def _cases(name: str) -> list:
    data = np.load(FIX / f"{name}.npz")
    cases: dict = {}
    for key in data.files:
        k, rest = key.split(":", 1)
        feeds, outs = cases.setdefault(int(k), ({}, []))
        if rest.startswith("out:"):
            outs.append(data[key])
        else:
            feeds[rest] = data[key]
    return [cases[k] for k in sorted(cases)]


@pytest.mark.parametrize("name", NAMES)
def test_dynamic_export_matches_onnxruntime_at_each_size(name):
    imported = import_onnx(FIX / f"{name}.onnx")
    assert imported.report.ok
    graph = onnx.load(str(FIX / f"{name}.onnx")).graph
    assert len(imported.report.mapping) == len(graph.node)  # every node said, none skipped
    model = build_model(imported.design).load_record(imported.record).valid()
    cases = _cases(name)
    shapes = {tuple(next(iter(f.values())).shape) for f, _ in cases}
    assert len({s[0] for s in shapes}) >= 2 and len({s[-1] for s in shapes}) >= 2  # two batches, two lengths
    for feeds, want in cases:
        y = model.forward(*[Tensor.from_data(feeds[v.name]) for v in graph.input
                            if v.name not in {t.name for t in graph.initializer}])
        got = [t.numpy() for t in (y if isinstance(y, tuple) else (y,))]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (name, g.shape, w.shape)
            assert np.abs(g - w).max() <= 1e-4, (name, g.shape, float(np.abs(g - w).max()))


def test_inputs_keep_their_named_axes():
    imported = import_onnx(FIX / "dyn_gpt2_ts.onnx")
    shapes = {n: imported.design.config(n)["shape"] for n in imported.design.inputs()}
    assert sorted(map(tuple, shapes.values())) == [("batch", "sequence"), ("batch", "sequence")]


def _graph(tmp_path, nodes, inits, outs, name):
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * r) for o, r in outs.items()],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_range_slice_and_gather_nd_on_a_run_time_batch_equal_the_reference(tmp_path):
    from onnx import TensorProto, helper  # noqa: PLC0415
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    i64 = np.int64
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"]),
             helper.make_node("Range", ["zero", "b", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["rf", "ax12"], ["rr"]), helper.make_node("Add", ["x", "rr"], ["y1"]),
             helper.make_node("Slice", ["s", "start0", "end1"], ["e"]),
             helper.make_node("Slice", ["table", "start0", "e", "start0"], ["t"]),
             helper.make_node("Unsqueeze", ["t", "ax1"], ["tt"]), helper.make_node("Mul", ["x", "tt"], ["y2"]),
             helper.make_node("GatherND", ["x", "idx"], ["y3"])]
    inits = {"zero": np.asarray(0, i64), "one": np.asarray(1, i64), "ax12": np.asarray([1, 2], i64),
             "start0": np.asarray([0], i64), "end1": np.asarray([1], i64), "ax1": np.asarray([1], i64),
             "table": np.linspace(-1, 1, 50).reshape(10, 5).astype(np.float32),
             "idx": np.asarray([[0, 1], [0, 3], [-1, 2]], i64)}
    path = _graph(tmp_path, nodes, inits, {"y1": 3, "y2": 3, "y3": 2}, "runtime")
    imported = import_onnx(path)
    assert "Op Range along axis 0" in " ".join(imported.report.mapping.values())
    model = build_model(imported.design).load_record(imported.record).valid()
    ref = ReferenceEvaluator(str(path))
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 4, 5)).astype(np.float32)
        got = [t.numpy() for t in model.forward(Tensor.from_data(x))]
        for g, w in zip(got, ref.run(None, {"x": x}), strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)


def test_a_run_time_range_of_another_form_is_refused_by_name(tmp_path):
    from onnx import helper  # noqa: PLC0415

    from engine.interop import OnnxImportError  # noqa: PLC0415

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"]),
             helper.make_node("Range", ["one", "b", "one"], ["r"]),
             helper.make_node("CastLike", ["r", "x"], ["y"])]
    path = _graph(tmp_path, nodes, {"zero": np.asarray(0, np.int64), "one": np.asarray(1, np.int64)}, {"y": 1}, "rng")
    with pytest.raises(OnnxImportError, match=r"Range .*Range\(0, <an axis's size>, 1\)"):
        import_onnx(path)


def test_gather_nd_out_of_range_says_which_axis():
    from engine.design.primitive import OpError, run_op  # noqa: PLC0415

    x = Tensor.from_data(np.zeros((2, 3), np.float32))
    with pytest.raises(OpError, match="axis 1 of size 3"):
        run_op("GatherND", {}, [x, Tensor.from_data(np.asarray([[0, 3]], np.int64))])
    got = run_op("GatherND", {}, [Tensor.from_data(np.arange(6.0, dtype=np.float32).reshape(2, 3)),
                                  Tensor.from_data(np.asarray([[1], [0]], np.int64))]).numpy()
    np.testing.assert_array_equal(got, [[3, 4, 5], [0, 1, 2]])


def test_a_reshape_reading_the_sizes_of_two_unrelated_tensors_is_refused_naming_the_node(tmp_path):
    """A run-time Reshape target is read from one tensor's axes (or axes of one name in one of them or in the
    data): sizes of two inputs whose axes share no name are refused, the node, its op and the tensors named."""
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    from engine.interop import OnnxImportError  # noqa: PLC0415

    i64 = np.int64
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["y"], ["sy"]),
             helper.make_node("Slice", ["sx", "z", "o"], ["ax"]), helper.make_node("Slice", ["sy", "z", "o"], ["by"]),
             helper.make_node("Concat", ["by", "ax", "m1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["out"], name="mixed")]
    inits = [numpy_helper.from_array(np.asarray(v, i64), k) for k, v in (("z", [0]), ("o", [1]), ("m1", [-1]))]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", 4, 5]),
                                               helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None] * 3)], initializer=inits)
    path = tmp_path / "mixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with pytest.raises(OnnxImportError, match=r"Reshape \(mixed: its target shape reads the sizes of 2 tensors "
                                              r"\(x, y; expected one"):
        import_onnx(path)
