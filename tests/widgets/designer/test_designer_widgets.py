"""The designer's views: the palette filters and emits kinds, the canvas shows shapes and errors
and emits connections, the form validates as the user types and emits finished values."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtTest import QTest

from engine.design import CATEGORIES, analyze, catalog, mnist_design, spec_for
from widgets.designer.canvas import DesignCanvas
from widgets.designer.config_form import ConfigForm
from widgets.designer.palette import Palette


def test_palette_groups_filters_and_activates(qtbot):
    p = Palette()
    qtbot.addWidget(p)
    assert [p.tree.topLevelItem(i).text(0) for i in range(p.tree.topLevelItemCount())] == list(CATEGORIES)
    assert len(p.visible_kinds()) == len(catalog())
    qtbot.keyClicks(p.search, "conv2")
    assert p.visible_kinds() == ["Conv2d"]
    p.search.clear()
    qtbot.keyClicks(p.search, "pool")
    assert set(p.visible_kinds()) == {"AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AvgPool1d", "AvgPool2d",
                                      "MaxPool1d", "MaxPool2d"}  # the whole Pooling group
    p.search.clear()
    qtbot.keyClicks(p.search, "relu")
    assert p.current_kind() == "Relu"  # the exact name first
    with qtbot.waitSignal(p.kind_activated) as sig:
        QTest.keyClick(p.search, Qt.Key.Key_Return)
    assert sig.args == ["Relu"]


def test_canvas_labels_edges_marks_errors_and_emits_connections(qtbot):
    c = DesignCanvas()
    qtbot.addWidget(c)
    c.resize(900, 700)
    c.show()
    qtbot.waitExposed(c)
    d = mnist_design()
    d.set_field("fc1", "d_input", 1000)
    a = analyze(d)
    c.show_design(d, a)
    assert c.edge_label(("flatten", "output", "fc1", "input")) == "[batch, 1600]"
    assert c.nodes["fc1"].error.startswith("assert_shape(input, [..., d_input]): axis 1 expected 1000")
    assert c.nodes["fc2"].blocked and c.nodes["fc2"].error is None
    assert c.nodes["conv1.pool"].shape_text == "[batch, 64, 13, 13]"
    c.fit()
    # click an output port, then an input port
    with qtbot.waitSignal(c.connect_requested) as sig:
        QTest.mouseClick(c.viewport(), Qt.MouseButton.LeftButton, pos=c.port_view_pos("fc1", "output", False))
        QTest.mouseClick(c.viewport(), Qt.MouseButton.LeftButton, pos=c.port_view_pos("fc3", "input", True))
    assert sig.args == ["fc1", "output", "fc3", "input"]
    # input to input is refused with a reason
    with qtbot.waitSignal(c.connection_refused) as sig:
        QTest.mouseClick(c.viewport(), Qt.MouseButton.LeftButton, pos=c.port_view_pos("fc1", "input", True))
        QTest.mouseClick(c.viewport(), Qt.MouseButton.LeftButton, pos=c.port_view_pos("fc3", "input", True))
    assert "both inputs" in sig.args[0]


def test_canvas_keys_win_over_window_shortcuts(qtbot):
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QMainWindow

    w = QMainWindow()
    qtbot.addWidget(w)
    c = DesignCanvas()
    w.setCentralWidget(c)
    window_undo = QAction("Undo", w)
    window_undo.setShortcut(QKeySequence("Ctrl+Z"))
    w.addAction(window_undo)
    fired = []
    window_undo.triggered.connect(lambda: fired.append("window"))
    w.show()
    qtbot.waitExposed(w)
    c.setFocus()
    commands = []
    c.command_requested.connect(commands.append)
    QTest.keyClick(c, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(c, Qt.Key.Key_Delete)
    QTest.keyClick(c, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert commands == ["undo", "delete", "copy"]
    assert fired == []


def test_form_is_generated_from_the_config_and_validates_as_typed(qtbot):
    f = ConfigForm()
    qtbot.addWidget(f)
    f.show()
    spec = spec_for("Conv2d")
    f.set_node("conv1.conv", spec, spec.defaults())
    assert set(f.editors) == {"channels", "kernel_size", "stride", "dilation", "groups", "padding", "bias"}
    assert f.editor("channels").text() == "1, 1"
    assert f.editor("padding").text() == "Valid"
    edits = []
    f.field_edited.connect(lambda *a: edits.append(a))
    ch = f.editor("channels")
    ch.clear()
    qtbot.keyClicks(ch, "1, x")
    assert f.field_error("channels") == "channels: expected integers separated by commas, got 'x'"
    QTest.keyClick(ch, Qt.Key.Key_Return)
    assert edits == []  # an invalid value is never emitted
    ch.clear()
    qtbot.keyClicks(ch, "1, 64, 3")
    assert f.field_error("channels") == "channels: expected 2 values, got 3 ([1, 64, 3])"
    ch.clear()
    qtbot.keyClicks(ch, "1, 64")
    assert f.field_error("channels") == ""
    QTest.keyClick(ch, Qt.Key.Key_Return)
    assert edits == [("conv1.conv", "channels", [1, 64])]
    f.editor("bias").setChecked(False)
    assert edits[-1] == ("conv1.conv", "bias", False)
    # enums are combo boxes with the Enum's names
    spec = spec_for("Interpolate2d")
    f.set_node("up", spec, spec.defaults())
    mode = f.editor("mode")
    assert [mode.itemText(i) for i in range(mode.count())] == ["Nearest", "NearestExact", "Linear", "Cubic"]
    # names are checked as typed too
    name = f.editor("name")
    name.clear()
    qtbot.keyClicks(name, "2up")
    assert "must start with a letter" in f.field_error("name")


def test_the_form_lists_what_the_input_sizes_must_satisfy(qtbot):
    from engine.design import Design

    d = Design()
    d.add_node("Input", "x", {"shape": ["batch", 1, "h", "w"]})
    d.add_node("PixelUnshuffle", "unshuffle", {"downscale_factor": 2})
    d.connect("x", "output", "unshuffle", "input")
    a = analyze(d)
    form = ConfigForm()
    qtbot.addWidget(form)
    form.set_node("unshuffle", d.spec("unshuffle"), d.config("unshuffle"), a.state("unshuffle"))
    assert form.shapes.text().splitlines() == ["in  input: [batch, 1, h, w]", "out output: [batch, 4, h//2, w//2]",
                                               "needs h must be even", "needs w must be even"]


def test_the_form_offers_the_input_width_and_the_panel_takes_it(qtbot, tmp_path):
    """A Linear whose d_input differs from the incoming [batch, 1600]: the form's button fills it."""
    from PySide6.QtCore import Qt

    from app.designer_panel import DesignerPanel

    panel = DesignerPanel(autosave_dir=tmp_path / "autosave", autosave_ms=60_000)
    qtbot.addWidget(panel)
    panel.resize(1400, 900)
    panel.show()
    qtbot.waitExposed(panel)
    try:
        panel.set_design(mnist_design())
        panel.canvas.select(["fc1"])
        assert panel.form.node == "fc1" and not panel.form.fill.isVisible()  # the sample's 1600 fits
        panel.set_field("fc1", "d_input", 100)
        panel.canvas.select(["fc1"])
        assert panel.analysis.errors()["fc1"].startswith("assert_shape(input, [..., d_input])")
        assert panel.form.fill.isVisible() and panel.form.fill.text() == "Use d_input = 1600 from the input"
        qtbot.mouseClick(panel.form.fill, Qt.MouseButton.LeftButton)
        assert panel.design.config("fc1")["d_input"] == 1600
        assert panel.analysis.ok and not panel.form.fill.isVisible()
    finally:
        panel.shutdown()
