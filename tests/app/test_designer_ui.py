"""The designer driven through its UI: the burn-mnist CNN built from the palette, the canvas and the
form gives [batch, 10] at the output, builds, loads Burn's checkpoint and matches the example."""
import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest

from app.designer_panel import DesignerPanel
from engine import Tensor
from engine.design import mnist_design
from engine.store import ModuleRecord
from resources.examples import build_example, list_examples


@pytest.fixture
def panel(qtbot, tmp_path):
    p = DesignerPanel(autosave_dir=tmp_path / "autosave", autosave_ms=60_000)
    qtbot.addWidget(p)
    p.resize(1400, 900)
    p.show()
    qtbot.waitExposed(p)
    yield p
    p.shutdown()


def _type(qtbot, editor, text):
    editor.setFocus()
    editor.selectAll()
    QTest.keyClick(editor, Qt.Key.Key_Delete)
    qtbot.keyClicks(editor, text)
    QTest.keyClick(editor, Qt.Key.Key_Return)


def _add(qtbot, panel, search, name, fields=()):
    """Search the palette, press Enter, then name the node and fill its fields in the form."""
    _type(qtbot, panel.palette.search, search)
    assert panel.form.node is not None, f"no node was added for {search!r}"
    _type(qtbot, panel.form.editor("name"), name)
    assert panel.form.node == name, panel.status.text()
    for field, text in fields:
        _type(qtbot, panel.form.editor(field), text)
        assert panel.form.field_error(field) == "", panel.form.field_error(field)
    return name


def _click_port(panel, node, port, is_input):
    panel.canvas.centerOn(panel.canvas.nodes[node])
    QTest.mouseClick(panel.canvas.viewport(), Qt.MouseButton.LeftButton,
                     pos=panel.canvas.port_view_pos(node, port, is_input))


def _click_empty(panel):
    view = panel.canvas
    for pt in (QPoint(4, 4), QPoint(view.viewport().width() - 4, 4), QPoint(4, view.viewport().height() - 4)):
        if view.itemAt(pt) is None:
            QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pt)
            return
    raise AssertionError("no empty spot on the canvas to click")


def _click_node(panel, node):
    panel.canvas.centerOn(panel.canvas.nodes[node])
    QTest.mouseClick(panel.canvas.viewport(), Qt.MouseButton.LeftButton, pos=panel.canvas.node_view_pos(node))


def test_mnist_through_the_ui_matches_the_example_with_burns_weights(qtbot, panel, fixtures_dir):
    _add(qtbot, panel, "input", "input", [("shape", "batch, 28, 28")])
    _add(qtbot, panel, "reshape", "reshape", [("shape", "batch, 1, 28, 28")])
    for block, ch in (("conv1", "1, 64"), ("conv2", "64, 64")):
        _add(qtbot, panel, "conv2d", f"{block}.conv", [("channels", ch), ("kernel_size", "3, 3")])
        _add(qtbot, panel, "batchnorm", f"{block}.norm", [("num_features", "64")])
        _add(qtbot, panel, "relu", f"{block}.activation")
        _add(qtbot, panel, "maxpool2d", f"{block}.pool", [("kernel_size", "2, 2"), ("strides", "2, 2")])
    # a node added with nothing selected stands alone: connect it by clicking the ports
    _click_empty(panel)
    assert panel.canvas.selected_nodes() == []
    _add(qtbot, panel, "flatten", "flatten", [("start_dim", "1"), ("end_dim", "3")])
    assert panel.design.source_of("flatten", "input") is None
    _click_port(panel, "conv2.pool", "output", False)
    _click_port(panel, "flatten", "input", True)
    assert panel.design.source_of("flatten", "input") == ("conv2.pool", "output")
    assert panel.canvas.edge_label(("conv2.pool", "output", "flatten", "input")) == "[batch, 64, 5, 5]"
    _click_node(panel, "flatten")
    _add(qtbot, panel, "linear", "fc1", [("d_input", "1600"), ("d_output", "128")])
    _add(qtbot, panel, "gelu", "gelu1")
    _add(qtbot, panel, "dropout", "dropout1", [("prob", "0.25")])
    _add(qtbot, panel, "linear", "fc2", [("d_input", "128"), ("d_output", "128")])
    _add(qtbot, panel, "gelu", "gelu2")
    _add(qtbot, panel, "dropout", "dropout2", [("prob", "0.25")])
    _add(qtbot, panel, "linear", "fc3", [("d_input", "128"), ("d_output", "10")])
    _click_empty(panel)
    _add(qtbot, panel, "output", "logits")
    _click_port(panel, "fc3", "output", False)
    _click_port(panel, "logits", "input", True)

    assert panel.analysis.ok, panel.analysis.messages()
    assert panel.analysis.output_shapes()["logits"].text() == "[batch, 10]"
    assert panel.canvas.edge_label(("fc3", "output", "logits", "input")) == "[batch, 10]"
    assert panel.status.text().startswith("✓ 19 nodes · outputs: logits [batch, 10]")
    # the same graph as the sample design (positions aside)
    want = mnist_design().to_dict()
    got = panel.design.to_dict()
    strip = lambda d: [{k: v for k, v in n.items() if k != "position"} for n in d["nodes"]]  # noqa: E731
    assert strip(got) == strip(want) and got["edges"] == want["edges"]

    built = []
    panel.model_built.connect(lambda m, s: built.append((m, s)))
    panel.canvas.setFocus()
    QTest.keyClick(panel.canvas, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier)
    assert len(built) == 1
    model, source = built[0]
    assert source["kind"] == "design"
    path = fixtures_dir / "burn-mnist.bpk"
    model = model.load_record(ModuleRecord.load(path))
    name = "burn-mnist" if "burn-mnist" in list_examples() else "digits"
    reference = build_example(name).load_record(ModuleRecord.load(path))
    x = Tensor.random((5, 28, 28), ("normal", 0.0, 1.0))
    # the built design and the hand-written example: equal up to float32 rounding (BLAS and SIMD
    # results depend on the CPU and on memory layout, so not bit for bit)
    np.testing.assert_allclose(model.valid().forward(x).numpy(), reference.valid().forward(x).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_undo_redo_copy_paste_and_delete_by_keys(qtbot, panel):
    panel.load_sample("residual")
    start = panel.design.to_dict()
    panel.canvas.select(["head"])
    panel.canvas.setFocus()
    QTest.keyClick(panel.canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(panel.canvas, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert "head2" in panel.design and panel.canvas.selected_nodes() == ["head2"]
    QTest.keyClick(panel.canvas, Qt.Key.Key_Delete)
    assert "head2" not in panel.design
    QTest.keyClick(panel.canvas, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert "head2" in panel.design
    QTest.keyClick(panel.canvas, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert panel.design.to_dict() == start
    QTest.keyClick(panel.canvas, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlShiftModifier if hasattr(
        Qt.KeyboardModifier, "ControlShiftModifier") else Qt.KeyboardModifier.ControlModifier
        | Qt.KeyboardModifier.ShiftModifier)
    assert "head2" in panel.design
    # a form edit is one undo step
    panel.canvas.select(["norm"])
    _type(qtbot, panel.form.editor("d_model"), "32")
    assert panel.design.config("norm")["d_model"] == 32
    assert panel.undo_stack.undoText() == "Set norm.d_model"
    panel.undo_stack.undo()
    assert panel.design.config("norm")["d_model"] == 64
    assert panel.form.editor("d_model").text() == "64"


def test_invalid_edits_are_refused_with_a_message_at_the_node(qtbot, panel):
    panel.load_sample("mnist")
    before = panel.design.to_dict()
    # a cycle, asked for through the ports
    _click_port(panel, "fc3", "output", False)
    _click_port(panel, "conv1.conv", "input", True)
    assert panel.design.to_dict() == before
    assert "would make a cycle" in panel.status.text()
    # a value that does not parse never reaches the design
    panel.canvas.select(["fc1"])
    _type(qtbot, panel.form.editor("d_input"), "16x")
    assert panel.form.field_error("d_input") == "d_input: expected an integer, got '16x'"
    assert panel.design.to_dict() == before
    # a mismatched connection: accepted as an edit, marked at the node with assert_shape's message
    _type(qtbot, panel.form.editor("d_input"), "100")
    msg = "assert_shape(input, [..., d_input]): axis 1 expected 100, got 1600 (dims [batch, 1600])"
    assert panel.analysis.errors() == {"fc1": msg}
    assert panel.canvas.nodes["fc1"].error == msg
    assert panel.form.node_error.error() == msg
    # a bad config value the layer refuses
    panel.canvas.select(["dropout1"])
    _type(qtbot, panel.form.editor("prob"), "1.5")
    assert panel.canvas.nodes["dropout1"].error == ("configuration: Dropout probability should be between 0 "
                                                    "and 1, but got 1.5")
    # a missing input
    panel.canvas.select(["gelu2"])
    panel.canvas.setFocus()
    QTest.keyClick(panel.canvas, Qt.Key.Key_Delete)
    assert panel.canvas.nodes["dropout2"].error == "input port 'input' not connected"
    # nothing builds, nothing crashes
    assert panel.build() is None
    assert panel.status.text().startswith("⚠ cannot build:")
    # a taken name is refused in the form
    panel.canvas.select(["fc2"])
    _type(qtbot, panel.form.editor("name"), "fc3")
    assert panel.form.field_error("name") == "a node named 'fc3' already exists"
    assert "fc2" in panel.design


def test_files_export_and_moves(qtbot, panel, tmp_path):
    panel.load_sample("residual")
    assert panel.is_dirty()
    path = panel.save(tmp_path / "res")
    assert path.name == "res.ember.json" and not panel.is_dirty()
    panel.new_design()
    assert panel.open_design(path) and panel.design.name == "ResidualMlp"
    py = panel.export_python(tmp_path / "res_model")
    rs = panel.export_rust(tmp_path / "res_model")
    assert py.read_text().startswith('"""ResidualMlp: generated by Ember')
    assert "#[derive(Module, Debug)]\npub struct ResidualMlp {" in rs.read_text()
    # dragging a node is one undoable move
    item = panel.canvas.nodes["norm"]
    x, y = panel.design.position("norm")
    panel.canvas.centerOn(item)
    start = panel.canvas.node_view_pos("norm")
    QTest.mousePress(panel.canvas.viewport(), Qt.MouseButton.LeftButton, pos=start)
    for i in range(1, 6):
        QTest.mouseMove(panel.canvas.viewport(), start + QPoint(10 * i, 6 * i))
    QTest.mouseRelease(panel.canvas.viewport(), Qt.MouseButton.LeftButton, pos=start + QPoint(50, 30))
    nx, ny = panel.design.position("norm")
    assert (nx, ny) != (x, y), "the drag moved nothing"
    assert panel.undo_stack.undoText() == "Move"
    panel.undo_stack.undo()
    assert panel.design.position("norm") == (x, y)
