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
