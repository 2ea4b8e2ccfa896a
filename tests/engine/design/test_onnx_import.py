"""ONNX import (issue 21): graphs exported by torch import as designs whose built models give
onnxruntime's outputs.

The fixtures in tests/fixtures/onnx/ were exported once with torch 2.13 (make_fixtures.py there)
and hold onnxruntime's outputs (.npz), so the Ember side always runs; the test with onnxruntime
live is optional and skips visibly without it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Tensor
from engine.design import analyze, build_model, read_design, save_design
from engine.interop import ImportReport, OnnxImportError, import_onnx

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
FIXTURES = ["cnn_bn", "cnn_folded", "mlp_ln_gelu", "encoder_layer", "llama_dynamo"]


def _run(imported, feeds: dict):
    model = build_model(imported.design).load_record(imported.record).valid()
    y = model.forward(*[Tensor.from_data(v) for v in feeds.values()])
    return [t.numpy() for t in (y if isinstance(y, tuple) else (y,))]


def _feeds_and_outputs(name: str):
    data = np.load(FIX / f"{name}.npz")
    feeds = {k: data[k] for k in data.files if not k.startswith("out:")}
    outs = [data[k] for k in data.files if k.startswith("out:")]
    return feeds, outs


@pytest.mark.parametrize("name", FIXTURES)
def test_imported_fixture_matches_onnxruntime(name):
    imported = import_onnx(FIX / f"{name}.onnx")
    feeds, want = _feeds_and_outputs(name)
    got = _run(imported, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert np.abs(g - w).max() <= 1e-4, name
    # every ONNX node is in the report, nothing skipped silently
    graph = onnx.load(str(FIX / f"{name}.onnx")).graph
    assert len(imported.report.mapping) == len(graph.node)
    assert all(isinstance(v, str) and v for v in imported.report.mapping.values())
    assert imported.report.ok


def test_the_report_says_what_each_node_became():
    bn = import_onnx(FIX / "cnn_bn.onnx")
    counts = bn.report.counts()
    assert counts["Conv2d"] == 2 and counts["BatchNorm"] == 2 and counts["Linear"] == 1  # Conv + BN: two nodes
    assert bn.report.mapping["/bn1/BatchNormalization"].endswith("(BatchNorm)")
    assert bn.report.mapping["/fc/Gemm"].endswith("(Linear)")
    assert "BatchNorm" not in import_onnx(FIX / "cnn_folded.onnx").report.counts()  # folded by the exporter

    mlp = import_onnx(FIX / "mlp_ln_gelu.onnx")
    gelu = [f for f in mlp.report.fused if f[1] == "Gelu"]
    assert len(gelu) == 1 and sorted(op.split("/")[-1] for op in gelu[0][2]) == ["Add", "Div", "Erf", "Mul", "Mul_1"]
    assert mlp.report.counts() == {"Linear": 2, "LayerNorm": 1, "Gelu": 1, "Sigmoid": 1}

    llama = import_onnx(FIX / "llama_dynamo.onnx")
    c = llama.report.counts()
    assert c["RmsNorm"] == 5 and c["Linear"] == 15 and c["Embedding"] == 1 and c["SiLU"] == 2
    rms = [f for f in llama.report.fused if f[1] == "RmsNorm"]
    assert len(rms) == 5 and all(len(f[2]) == 7 for f in rms)  # Pow ReduceMean Add Sqrt Reciprocal Mul Mul
    assert "Op" in c  # the rest: primitive ops (Transpose, Slice, Where, ...)
    text = llama.report.text()
    assert "node_embedding: embedding (Embedding)" in text and "(Op Where)" in text


def test_weights_are_named_by_design_node_and_the_record_fits_exactly():
    imported = import_onnx(FIX / "cnn_bn.onnx")
    names = set(imported.record.names())
    model = build_model(imported.design)
    assert names == {p for p, _ in model.named_params()}
    assert "bn1_batchnormalization.running_var" in names and "fc_gemm.weight" in names
    w = onnx.load(str(FIX / "cnn_bn.onnx")).graph.initializer
    fc = numpy_helper.to_array(next(t for t in w if t.name == "fc.weight"))
    assert np.array_equal(imported.record["fc_gemm.weight"].array, fc.T)  # Gemm transB -> Burn's [d_in, d_out]


def test_dynamic_batch_is_a_named_axis():
    imported = import_onnx(FIX / "cnn_bn.onnx")
    (inp,) = imported.design.inputs()
    assert imported.design.config(inp)["shape"] == ["batch", 3, 16, 16]
    assert analyze(imported.design).output_shapes()["logits"].dims == ("batch", 10)
    feeds, (want,) = _feeds_and_outputs("cnn_bn")
    x = feeds["x"]
    (one,) = _run(imported, {"x": x[:1]})
    (four,) = _run(imported, {"x": np.concatenate([x, x[::-1]])})
    assert np.abs(one - want[:1]).max() <= 1e-4
    assert np.abs(four - np.concatenate([want, want[::-1]])).max() <= 1e-4


def test_the_design_saves_reopens_and_builds(tmp_path):
    imported = import_onnx(FIX / "llama_dynamo.onnx")
    path = save_design(imported.design, tmp_path / "llama")
    again = read_design(path)
    assert again == imported.design
    feeds, (want,) = _feeds_and_outputs("llama_dynamo")
    model = build_model(again).load_record(imported.record).valid()
    got = model.forward(Tensor.from_data(feeds["input_ids"])).numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_an_imported_design_edits_and_trains():
    imported = import_onnx(FIX / "mlp_ln_gelu.onnx")
    d = imported.design
    gelu = next(n for n in d.topological_order() if d.kind(n) == "Gelu")
    (src,) = [(u, sp) for u, sp, v, dp in d.in_edges(gelu)]
    outs = d.out_edges(gelu)
    d.remove_node(gelu)
    d.add_node("Relu", "relu_new")
    d.connect(src[0], src[1], "relu_new", "input")
    for _, _, v, dp in outs:
        d.connect("relu_new", "output", v, dp)
    model = build_model(d).load_record(imported.record)
    x = Tensor.from_data(np.ones((3, 16), np.float32)).autodiff()
    loss = model.forward(x).sum()
    grads = loss.backward()
    w = next(p for n, p in model.named_params() if n.endswith("fc1_gemm.weight"))
    assert w.val().grad(grads) is not None


def _model(nodes, inputs, outputs, initializers=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def test_every_unsupported_op_is_listed_at_once(tmp_path):
    f = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu0"),
        helper.make_node("NonZero", ["r"], ["s"], name="scatter_a"),
        helper.make_node("Frobnicate", ["s"], ["t"], name="frob_b", domain="com.example"),
        helper.make_node("NonZero", ["t"], ["y"], name="scatter_c"),
    ]
    inits = []  # (ScatterND and CumSum import now)
    m = _model(nodes, [f("x", TensorProto.FLOAT, [2, 4])], [f("y", TensorProto.FLOAT, [2, 4])], inits,
               domains=["com.example"])
    path = tmp_path / "bad.onnx"
    onnx.save(m, str(path))
    with pytest.raises(OnnxImportError) as e:
        import_onnx(path)
    msg = str(e.value)
    assert "NonZero (scatter_a, scatter_c)" in msg and "com.example::Frobnicate (frob_b" in msg
    report = e.value.report
    assert isinstance(report, ImportReport)
    assert sorted(report.unsupported) == ["NonZero", "com.example::Frobnicate"]
    assert report.unsupported["NonZero"] == ["scatter_a", "scatter_c"]
    assert report.mapping["relu0"] == "relu0 (Relu)"  # what could be mapped is reported too


def test_onnxruntime_live_on_another_batch_size():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is an optional oracle (run with the torch venv)")
    rng = np.random.default_rng(3)
    for name in ("cnn_bn", "mlp_ln_gelu"):
        path = FIX / f"{name}.onnx"
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        shape = [5] + [d.dim_value for d in onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[1:]]
        x = rng.standard_normal(shape).astype(np.float32)
        (want,) = sess.run(None, {sess.get_inputs()[0].name: x})
        (got,) = _run(import_onnx(path), {"x": x})
        assert np.abs(got - want).max() <= 1e-4


def test_a_design_file_with_a_bad_op_node_is_refused_where_it_is(tmp_path):
    import json

    from engine.design import DesignFileError

    imported = import_onnx(FIX / "encoder_layer.onnx")
    path = save_design(imported.design, tmp_path / "enc")
    data = json.loads(path.read_text())
    nodes = data["source"]["design"]["nodes"]
    i = next(k for k, n in enumerate(nodes) if n["kind"] == "Op")
    for key, bad, said in (("op", "os.system", "a primitive op"), ("operands", "in0,__import__", "operands such as"),
                           ("constants", "float32[99999999999,99999999999]", "at most"),
                           ("operands", "in7", "input port")):
        broken = json.loads(json.dumps(data))
        broken["source"]["design"]["nodes"][i]["config"][key] = bad
        path.write_text(json.dumps(broken))
        with pytest.raises(DesignFileError) as e:
            read_design(path)
        assert f"nodes[{i}].config.{key}" in str(e.value) and said in str(e.value), str(e.value)


# ---- ops real exports use: each against onnx's ReferenceEvaluator at batch 1 and 3 -------------------
def _one_graph(tmp_path, nodes, inits, in_dims, out_names=("y",), name="ops"):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_dims)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * len(in_dims)) for o in out_names],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _against_reference(path, dims_of, tmp_path):
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    imported = import_onnx(path)
    assert imported.report.ok
    design = read_design(save_design(imported.design, tmp_path / "again"))  # the file keeps the Op settings
    model = build_model(design).load_record(imported.record).valid()
    ref = ReferenceEvaluator(str(path))
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal(dims_of(b)).astype(np.float32)
        want = ref.run(None, {"x": x})
        got = model.forward(Tensor.from_data(x))
        got = [t.numpy() for t in (got if isinstance(got, tuple) else (got,))]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    return imported


_F = np.float32
_OP_CASES = {
    "clip": ([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"lo": _F(-0.5), "hi": _F(0.7)}),
    "clip_min_only": ([helper.make_node("Clip", ["x", "lo"], ["y"])], {"lo": _F(0.1)}),
    "pad_constant": ([helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode="constant")],
                     {"pads": np.asarray([0, 1, 2, 0, 0, 1], np.int64), "v": _F(1.5)}),
    "pad_reflect": ([helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
                    {"pads": np.asarray([0, 0, 1, 0, 2, 3], np.int64)}),
    "pad_edge_axes": ([helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode="edge")],
                      {"pads": np.asarray([2, 1], np.int64), "axes": np.asarray([-1], np.int64)}),
    "tile": ([helper.make_node("Tile", ["x", "reps"], ["y"])], {"reps": np.asarray([1, 2, 3], np.int64)}),
    "trilu_upper": ([helper.make_node("Trilu", ["x", "k"], ["y"], upper=1)], {"k": np.asarray(1, np.int64)}),
    "trilu_lower": ([helper.make_node("Trilu", ["x"], ["y"], upper=0)], {}),
    "min_max_variadic": ([helper.make_node("Max", ["x", "a", "b"], ["m"]), helper.make_node("Min", ["m", "c"], ["y"])],
                         {"a": _F(-0.2), "b": np.full((5,), 0.1, _F), "c": _F(0.9)}),
    "sum_mean": ([helper.make_node("Sum", ["x", "a", "x"], ["s"]), helper.make_node("Mean", ["s", "x"], ["y"])],
                 {"a": np.linspace(0, 1, 5).astype(_F)}),
    "einsum_matmul_const": ([helper.make_node("Einsum", ["x", "w"], ["y"], equation="bij,jk->bki")],
                            {"w": np.linspace(-1, 1, 15).reshape(5, 3).astype(_F)}),
    "einsum_attention": ([helper.make_node("Einsum", ["x", "x"], ["y"], equation="bid, bjd -> bij")], {}),
    "einsum_transpose": ([helper.make_node("Einsum", ["x"], ["y"], equation="bij->jbi")], {}),
    "einsum_sum_out": ([helper.make_node("Einsum", ["x", "w"], ["y"], equation="bij,kl->bik")],
                       {"w": np.ones((2, 3), _F)}),
    "argmax_gather_elements": ([helper.make_node("ArgMax", ["x"], ["i"], axis=2, keepdims=1),
                                helper.make_node("GatherElements", ["x", "i"], ["y"], axis=2)], {}),
    "argmin_cast": ([helper.make_node("ArgMin", ["x"], ["i"], axis=-2, keepdims=1),
                     helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)], {}),
    "scatter_nd_rows": ([helper.make_node("ScatterND", ["x", "i", "u"], ["y"])],
                        {"i": np.asarray([[0, 3], [0, 1]], np.int64), "u": np.full((2, 5), 7.0, _F)}),
    "scatter_nd_add": ([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add")],
                       {"i": np.asarray([[0, 2, 4], [0, 0, 0], [0, 2, 4]], np.int64), "u": np.asarray([1, 2, 3], _F)}),
    "cumsum": ([helper.make_node("CumSum", ["x", "ax"], ["y"])], {"ax": np.asarray(1, np.int64)}),
    "cumsum_exclusive_reverse": ([helper.make_node("CumSum", ["x", "ax"], ["y"], exclusive=1, reverse=1)],
                                 {"ax": np.asarray(-1, np.int64)}),
    "cumsum_reverse": ([helper.make_node("CumSum", ["x", "ax"], ["y"], reverse=1)], {"ax": np.asarray(2, np.int64)}),
    "erf_sin_cos": ([helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Sin", ["e"], ["s"]),
                     helper.make_node("Cos", ["s"], ["y"])], {}),
}


@pytest.mark.parametrize("case", sorted(_OP_CASES))
def test_an_op_imports_with_the_reference_evaluators_outputs(case, tmp_path):
    nodes, inits = _OP_CASES[case]
    path = _one_graph(tmp_path, nodes, inits, ["batch", 4, 5], name=case)
    imported = _against_reference(path, lambda b: (b, 4, 5), tmp_path)
    assert "Op" in imported.report.counts()


@pytest.mark.parametrize("how", ["sizes", "num_outputs"])
def test_split_becomes_one_slice_an_output(how, tmp_path):
    if how == "sizes":
        node = helper.make_node("Split", ["x", "split"], ["a", "b", "c"], axis=-1)
        inits = {"split": np.asarray([1, 3, 2], np.int64)}
    else:
        node = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=2, num_outputs=3)
        inits = {}
    nodes = [node, helper.make_node("Relu", ["b"], ["rb"])]
    path = _one_graph(tmp_path, nodes, inits, ["batch", 2, 6], out_names=("a", "rb", "c"), name=f"split_{how}")
    imported = _against_reference(path, lambda b: (b, 2, 6), tmp_path)
    assert imported.report.counts()["Op"] == 3


@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_values_and_indices(largest, tmp_path):
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=largest),
             helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT)]
    path = _one_graph(tmp_path, nodes, {"k": np.asarray([3], np.int64)}, ["batch", 4, 5], out_names=("v", "fi"),
                      name=f"topk{largest}")
    imported = _against_reference(path, lambda b: (b, 4, 5), tmp_path)
    assert imported.report.counts()["Op"] == 3  # values, indices, the Cast


def test_pad_and_trilu_settings_that_do_not_fit_are_refused(tmp_path):
    path = _one_graph(tmp_path, [helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")],
                      {"pads": np.asarray([0, 0, 1, 0, 0, 1], np.int64)}, ["batch", 4, 5], name="wrap")
    with pytest.raises(OnnxImportError, match=r"Pad \(.*mode 'wrap'"):
        import_onnx(path)
    from engine.design.design_schema import DesignSchemaError, check_design  # noqa: PLC0415

    node = {"name": "t", "kind": "Op", "config": {"op": "Trilu", "mode": "sideways"}}
    with pytest.raises(DesignSchemaError, match=r"nodes\[0\]\.config\.mode.*'upper' or 'lower'.*sideways"):
        check_design({"name": "M", "nodes": [node], "edges": []})
    node = {"name": "p", "kind": "Op", "config": {"op": "Pad", "starts": [1], "ends": [1, 2]}}
    with pytest.raises(DesignSchemaError, match=r"config\.mode.*pads before"):
        check_design({"name": "M", "nodes": [node], "edges": []})
