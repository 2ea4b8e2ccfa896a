"""ONNX in the window and the graph of any model (issue 21, must-show 5): an .onnx file opened
through File > Open ONNX, a layer replaced in the designer, built, trained a few steps, exported
through File > Export > ONNX and checked with onnx's reference evaluator; the Graph page on
burn-mnist, on a script model and on llama-7b (shapes only, nothing allocated)."""
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from engine import Tensor
from tests.app.window_helpers import display_env, open_onnx, wait_idle, xvfb_display
from tests.widgets.qt_helpers import type_into

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"


def test_onnx_opened_edited_built_trained_and_exported_through_the_menus(window, qtbot, monkeypatch, tmp_path):
    open_onnx(qtbot, window, monkeypatch, FIXTURES / "cnn_bn.onnx")
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
    wait_idle(qtbot, window)
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
    open_onnx(qtbot, window, monkeypatch, bad)
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
    open_onnx(qtbot, window, monkeypatch, FIXTURES / "cnn_bn.onnx")
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
    assert not window.designer.status.isVisible()  # the design's status line is not the graph's
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
    # a click on a box selects its module in the tree; a double-click expands it
    from PySide6.QtCore import Qt

    box = view.boxes["conv2"]
    view.centerOn(box)
    at = view.mapFromScene(box.sceneBoundingRect().center())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at)
    assert window.tree.selected_path() == "conv2" and view.highlighted() == "conv2"
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at)
    assert "conv2.conv" in view.boxes and "− conv2 · ConvBlock" in view.texts()


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
    # the 32 identical decoder layers fold into one box "× 32", which expands into one box each
    fold = view.boxes["repeat:layers.0"]
    assert "× 32" in fold.unit.label and "layers.31" not in view.boxes
    view.expand("repeat:layers.0")
    assert "layers.0" in view.boxes and "layers.31" in view.boxes
    view.expand("layers.0")
    assert "layers.0.self_attn" in view.boxes and "layers.0.mlp" in view.boxes
    window.tree.select_path("layers.3.mlp")
    assert view.highlighted() == "layers.3"
    assert sum(1 for _, p in module.named_params() if p.is_initialized()) == 0


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
    wait_idle(qtbot, window)
    assert "LayerNorm" in {window.designer.design.kind(n) for n in window.designer.design.nodes()}
    assert window.document.module is not None
    # --open file.onnx (what `python -m app --open` does)
    assert open_requested(window, parse_args(["--open", str(FIXTURES / "cnn_bn.onnx")]))
    wait_idle(qtbot, window)
    assert "conv1_conv" in window.designer.design.nodes()
    assert not any("design" in t for t in asked)  # an imported design not edited since is not asked about


def test_a_lora_model_exports_materialized_and_the_window_model_keeps_its_adapters(window, qtbot, monkeypatch,
                                                                                   tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    from app.core.schema import GroupSpec, LoraEdit

    assert window.open_example("burn-mnist")
    assert window.apply_edit(LoraEdit(4, 8.0, group=GroupSpec("regex", pattern=r"^fc\d\.")))
    model = window.document.module
    assert window.document.stats.total.reparameterized > 0
    # the adapters' B factors start at zero: give them values so that the LoRA changes the outputs
    from engine.store.burnpack import TensorEntry
    from engine.store.record import ModuleRecord

    rng = np.random.default_rng(3)
    entries = [TensorEntry.from_array(n, (rng.standard_normal(e.shape) * 0.1).astype(np.float32))
               if n.endswith("lora.b") else e for n, e in window.document.module.into_record().items()]
    assert any(n.endswith("lora.b") for n, _ in window.document.module.into_record().items())
    model = window.document.module.load_record(ModuleRecord(entries))
    window.document.set_model(model, window.document.source)
    out = tmp_path / "lora.onnx"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    window.actions.export_onnx.trigger()  # the example's own input batch ("example")
    wait_idle(qtbot, window)
    assert out.is_file(), window.last_message.text() if window.last_message else ""
    m = onnx.load(str(out))
    assert not any("lora" in i.name for i in m.graph.initializer)  # materialized
    assert window.document.module is model and window.document.stats.total.reparameterized > 0
    x = np.random.default_rng(0).standard_normal((3, 28, 28)).astype(np.float32)
    ref = ReferenceEvaluator(m).run(None, {m.graph.input[0].name: x})[0]
    assert np.abs(model.valid().forward(Tensor(x)).numpy() - ref).max() <= 1e-4


def test_exporting_llama_7b_is_refused_with_its_estimate_when_it_does_not_fit(window, qtbot, monkeypatch, tmp_path):
    from engine.module import memory

    assert window.open_example("llama-7b")
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * 10**9)  # a 4 GB machine
    out = tmp_path / "llama.onnx"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    window.actions.export_onnx.trigger()
    assert not window.running_tasks and not out.exists()
    text = window.last_message.text()
    assert "GB" in text and "Nothing was written" in text
    assert sum(1 for _, p in window.document.module.named_params() if p.is_initialized()) == 0


# ---- screenshots in a real window (Xvfb when installed), for the user guide ------------------------------------
def _shots_child(folder: str) -> int:
    """Run in a child process on a real display: the ONNX design opened, and the Graph tab on
    burn-mnist with conv1 expanded; both saved as PNG into `folder`. Returns 0 when both were written."""
    import tempfile
    import time

    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings

    app = QApplication.instance() or QApplication([])
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    w = MainWindow(settings=Settings.at(Path(tempfile.mkdtemp()) / "settings.ini"))
    w.resize(1400, 860)
    w.show()

    def settle(until=lambda: True, timeout=60.0):
        deadline = time.monotonic() + timeout
        while (w.running_tasks or not until()) and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.01)
        for _ in range(20):
            app.processEvents()
            time.sleep(0.01)

    w.onnx.open_onnx(FIXTURES / "cnn_bn.onnx")
    settle(lambda: "conv1_conv" in w.designer.design.nodes())
    if w.last_message is not None:
        w.last_message.close()
    w.designer.canvas.fit()
    settle()
    w.grab().save(str(out / "onnx-design.png"))
    w.open_example("burn-mnist")
    w.tabs.setCurrentWidget(w.designer)
    settle(lambda: w.designer.graph.trace is not None)
    w.designer.graph.expand("conv1")
    w.tree.select_path("conv1.conv")
    w.designer.graph.fit()
    settle()
    w.grab().save(str(out / "graph-burn-mnist.png"))
    ok = (out / "onnx-design.png").is_file() and (out / "graph-burn-mnist.png").is_file()
    w.close()
    return 0 if ok else 1


def test_screenshots_of_the_onnx_design_and_the_graph_tab_in_a_real_window(tmp_path):
    import os
    import subprocess
    import sys

    shots = Path(os.environ.get("EMBER_UI_SHOTS") or tmp_path / "shots")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYQTGRAPH_QT_LIB="PySide6", PYTEST_QT_API="pyside6",
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    with xvfb_display() as display:
        env = display_env(display, env)
        run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--shots", str(shots)],
                             cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                             timeout=300)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert (shots / "onnx-design.png").stat().st_size > 10_000
    assert (shots / "graph-burn-mnist.png").stat().st_size > 10_000
    if display is None:
        print("screenshots taken on the offscreen platform: Xvfb is not installed")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(_shots_child(sys.argv[sys.argv.index("--shots") + 1]))
