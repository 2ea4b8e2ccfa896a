"""ONNX in the window and the graph of any model (issue 21, must-show 5): an .onnx file opened
through File > Open ONNX, a layer replaced in the designer, built, trained a few steps, exported
through File > Export > ONNX and checked with onnx's reference evaluator; the Graph page on
burn-mnist, on a script model and on llama-7b (shapes only, nothing allocated)."""
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from engine import Tensor
from tests.widgets.qt_helpers import type_into

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"


def _wait(window, qtbot, timeout=30000):
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=timeout)


def _open_onnx(window, qtbot, monkeypatch, path):
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    window.actions.open_onnx.trigger()
    _wait(window, qtbot)


def test_onnx_opened_edited_built_trained_and_exported_through_the_menus(window, qtbot, monkeypatch, tmp_path):
    _open_onnx(window, qtbot, monkeypatch, FIXTURES / "cnn_bn.onnx")
    panel = window.designer
    assert window.tabs.currentWidget() is panel and panel.pages.currentIndex() == 0  # the editable canvas
    assert "relu" in panel.design.nodes() and panel.design.kind("conv1_conv") == "Conv2d"
    # the report: every ONNX node and what it became, in the message's details
    box = window.last_message
    assert "ONNX import" == box.windowTitle() and "/conv1/Conv: conv1_conv (Conv2d)" in box.detailedText()
    box.close()
    # the document's model is the imported one, with the file's weights: onnx's reference evaluator agrees
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    ref = ReferenceEvaluator(onnx.load(str(FIXTURES / "cnn_bn.onnx"))).run(None, {"x": x})[0]
    got = window.document.module.valid().forward(Tensor(x)).numpy()
    assert np.allclose(got, ref, atol=1e-4)

    # replace the first Relu by a Gelu in the designer: delete it, add a Gelu after bn1, wire it to the pool
    panel.canvas.select(["relu"])
    assert panel.delete_selection()
    panel.canvas.select(["bn1_batchnormalization"])
    gelu = panel.add_node("Gelu")
    assert panel.connect_ports(gelu, panel.design.output_ports(gelu)[0], "pool_maxpool",
                               panel.design.input_ports("pool_maxpool")[0])
    assert panel.analysis.ok and panel.design.kind(gelu) == "Gelu"
    model = panel.build(ask=False)
    assert model is not None and window.document.module is model
    assert "tensors from cnn_bn.onnx" in panel.status.text()  # the file's weights kept where they fit

    # a few training steps from the Training tab (its default settings), as for any design's model
    from app.__main__ import train_steps

    data = tmp_path / "images.npz"
    rng = np.random.default_rng(1)
    np.savez(data, x=rng.standard_normal((64, 3, 16, 16)).astype(np.float32), y=rng.integers(0, 10, 64))
    form = window.training_panel.data_form
    form.set_field("task", "file")
    type_into(qtbot, form.field_widget("file"), str(data))
    assert form.is_valid(), form.errors()
    before = {p: np.array(v.val().numpy(), copy=True) for p, v in window.document.module.named_params()}
    assert train_steps(window, 3, timeout=120), window.training_panel.last_error
    after = {p: v.val().numpy() for p, v in window.document.module.named_params()}
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # the steps changed the weights
    window.training_panel.shutdown()

    # File > Export > ONNX, with the contract editor's example input
    out = tmp_path / "edited.onnx"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    window.contract_editor.set_example_input("[2, 3, 16, 16]")
    window.actions.export_onnx.trigger()
    _wait(window, qtbot)
    assert out.is_file() and window.onnx.last_export == out
    m = onnx.load(str(out))
    assert any(n.op_type == "Erf" or n.op_type == "Gelu" for n in m.graph.node)  # the Gelu went out too
    name = m.graph.input[0].name
    ref = ReferenceEvaluator(m).run(None, {name: x})[0]
    got = window.document.module.valid().forward(Tensor(x)).numpy()
    assert np.abs(got - ref).max() <= 1e-4


def test_a_file_that_cannot_be_imported_names_the_problem_and_changes_nothing(window, qtbot, monkeypatch, tmp_path):
    window.open_example("burn-mnist")
    before = window.document.module
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07\x12\x03not a model")
    _open_onnx(window, qtbot, monkeypatch, bad)
    assert window.document.module is before
    assert "broken.onnx" in window.last_message.text() and "Nothing was changed" in window.last_message.text()


def test_unsaved_design_is_asked_about_before_an_onnx_file_replaces_it(window, qtbot, monkeypatch):
    window.designer.load_sample(next(iter(__import__("engine.design", fromlist=["SAMPLES"]).SAMPLES)))
    assert window.designer.is_dirty()
    import app.prompts as prompts

    asked = []
    monkeypatch.setattr(prompts, "ask_question", lambda _p, _t, text, *_a: asked.append(text)
                        or QMessageBox.StandardButton.Cancel)
    design = window.designer.design.to_dict()
    _open_onnx(window, qtbot, monkeypatch, FIXTURES / "cnn_bn.onnx")
    assert asked and window.designer.design.to_dict() == design


def _graph(window, qtbot):
    window.tabs.setCurrentWidget(window.designer)
    assert window.designer.pages.currentIndex() == 1
    try:
        qtbot.waitUntil(lambda: window.designer.graph.trace is not None and not window.running_tasks, timeout=30000)
    except Exception:
        raise AssertionError(f"{window.designer.graph._message} {window.running_tasks}")
    return window.designer.graph


def test_the_graph_page_draws_burn_mnist_with_shapes_and_expands_a_box(window, qtbot):
    assert window.open_example("burn-mnist")
    view = _graph(window, qtbot)
    texts = view.texts()
    assert "+ conv1 · ConvBlock" in texts and "+ fc1 · Linear" in texts
    assert "[2, 1, 28, 28]" in texts and "[2, 10]" in texts
    assert any(t.startswith("[") and "]" in t for t in texts)  # shapes on the edges
    module_boxes = [k for k, b in view.boxes.items() if b.unit.kind == "module"]
    first = "conv1"
    assert first in module_boxes and not any(k.startswith("conv1.") for k in view.boxes)
    n = len(view.boxes)
    view.expand(first)
    assert len(view.boxes) > n  # its child modules are drawn now
    assert "+ conv · Conv2d" in view.texts() and "conv1.conv" in view.boxes
    view.expand("conv1.norm")  # a module with no children: its ops
    norm_ops = [b.unit.label for b in view.boxes.values() if b.unit.kind == "op" and b.unit.depth == 2]
    assert norm_ops
    view.collapse("conv1.norm")
    view.collapse(first)
    assert len(view.boxes) == n
    # the module tree's selection is highlighted
    window.tree.select_path(first)
    assert view.highlighted() == first


SCRIPT = """
from engine import Module, nn


class Net(Module):
    def __init__(self):
        self.fc1 = nn.LinearConfig(12, 32).init()
        self.act = nn.Relu()
        self.fc2 = nn.LinearConfig(32, 5).init()

    def forward(self, x):
        '''Shapes:
            - input: [batch, 12]
            - output: [batch, 5]
        '''
        return self.fc2.forward(self.act.forward(self.fc1.forward(x)))


def build():
    return Net()
"""


def test_the_graph_page_draws_a_script_model(window, qtbot, tmp_path):
    path = tmp_path / "net.py"
    path.write_text(SCRIPT)
    assert window.open_script(str(path))
    view = _graph(window, qtbot)
    texts = view.texts()
    assert "+ fc1 · Linear" in texts and "+ fc2 · Linear" in texts
    assert "[2, 32]" in texts and "[2, 5]" in texts
    view.expand("fc1")
    assert any(view.boxes[k].unit.kind == "op" for k in view.boxes)


def test_llama_7b_graph_draws_with_no_parameter_allocated(window, qtbot):
    assert window.open_example("llama-7b")
    view = _graph(window, qtbot)
    module = window.document.module
    assert sum(1 for _, p in module.named_params() if p.is_initialized()) == 0
    texts = view.texts()
    assert any(type(module).__name__ in t and "shapes only" in t for t in texts), texts
    assert any(t.startswith("[2, ") for t in texts)  # the shapes on the edges
    assert len(view.boxes) < 50  # lazy: only the top level is drawn


def test_a_dropped_onnx_file_and_open_path_import_it(window, qtbot, monkeypatch):
    import app.prompts as prompts

    asked = []
    monkeypatch.setattr(prompts, "ask_question", lambda _p, _t, text, *_a: asked.append(text)
                        or QMessageBox.StandardButton.Discard)
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    from app.__main__ import open_requested, parse_args

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(FIXTURES / "mlp_ln_gelu.onnx"))])
    event = QDropEvent(QPointF(20, 20), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)
    assert event.isAccepted()
    _wait(window, qtbot)
    assert "LayerNorm" in {window.designer.design.kind(n) for n in window.designer.design.nodes()}
    assert window.document.module is not None
    # --open file.onnx (what `python -m app --open` does)
    assert open_requested(window, parse_args(["--open", str(FIXTURES / "cnn_bn.onnx")]))
    _wait(window, qtbot)
    assert "conv1_conv" in window.designer.design.nodes()
    assert not any("design" in t for t in asked)  # an imported design not edited since is not asked about
