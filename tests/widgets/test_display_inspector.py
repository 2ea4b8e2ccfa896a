"""The display panel renders Burn's display with the chosen settings; the inspector lists the
selection's parameters and constants without initializing lazy ones."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from engine.module import DisplaySettings, ParamGroup
from tests.widgets.models import Mlp
from tests.widgets.qt_helpers import click_box
from widgets.display_panel import DisplayPanel
from widgets.inspector import Inspector


def test_display_follows_every_setting(qtbot):
    panel = DisplayPanel()
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    m = Mlp()
    panel.set_value(m)
    assert panel.display_text() == m.format(DisplaySettings())
    # a click cycles: each module's own -> on -> off
    click_box(qtbot, panel.num_params)
    assert panel.num_params.checkState() == Qt.CheckState.Checked
    click_box(qtbot, panel.num_params)
    assert "params:" not in panel.display_text()
    click_box(qtbot, panel.param_ids)
    assert str(m.scale.id) in panel.display_text()
    assert str(m.head.weight.id) not in panel.display_text()  # Linear shows its config, not its fields
    click_box(qtbot, panel.new_line)
    click_box(qtbot, panel.new_line)
    panel.indent.setValue(4)
    click_box(qtbot, panel.show_all)
    expected = m.format(DisplaySettings().with_show_all_attributes(True).with_new_line_after_attribute(False)
                        .with_show_num_parameters(False).with_indentation_size(4).with_show_param_id(True))
    assert panel.display_text() == expected
    assert str(m.head.weight.id) in panel.display_text()  # all attributes: every field, with its id
    panel.new_line.setCheckState(Qt.CheckState.Checked)
    assert "Linear {\n" in panel.display_text()  # forced on, Linear's own one-line display is overridden
    assert panel.text.font().fixedPitch() or panel.text.font().styleHint() == panel.text.font().StyleHint.Monospace


def test_display_of_a_child_and_copy(qtbot):
    panel = DisplayPanel()
    qtbot.addWidget(panel)
    panel.show()
    m = Mlp()
    panel.set_value(m.head, "head")
    assert panel.display_text() == "Linear {d_input: 16, d_output: 3, bias: true, params: 51}"
    assert panel.title.text() == "head"
    click_box(qtbot, panel.copy_button)
    assert QGuiApplication.clipboard().text() == panel.display_text()


def test_rendering_is_deferred_and_coalesced(qtbot):
    panel = DisplayPanel()
    qtbot.addWidget(panel)
    panel.show()
    m = Mlp()
    panel.set_value(m.head, "head")
    panel.set_value(m, "")
    assert panel.text.toPlainText() == ""  # nothing rendered yet
    qtbot.waitUntil(lambda: panel.text.toPlainText() == str(m), timeout=2000)


def test_inspector_lists_parameters_of_the_selection(qtbot):
    ins = Inspector()
    qtbot.addWidget(ins)
    m = Mlp().freeze_group(ParamGroup.from_path("head.bias"))
    ins.set_selection(m, "head")
    rows = ins.rows()
    assert [r[0] for r in rows] == ["head.weight", "head.bias"]
    w, b = rows
    assert w[1] == str(m.head.weight.id) and w[2] == "[16, 3]" and w[4] == "cpu"
    assert w[5] == "lazy" and w[6] == "yes" and b[6] == "no" and w[7] == ""
    assert not m.head.weight.is_initialized()
    assert "partly" in ins.state.text() and "lazy" in ins.state.text()


def test_inspector_shows_initialized_dtype_and_constants(qtbot):
    ins = Inspector()
    qtbot.addWidget(ins)
    m = Mlp()
    ins.set_selection(m, "")
    rows = {r[0]: r for r in ins.rows()}
    assert rows["scale"][5] == "initialized" and rows["scale"][3] == "float32"
    assert ins.rows(ins.consts) == [["offsets", "[3]", str(m.offsets.dtype), "cpu"]]
    ins.set_selection(m, "nope.x")
    assert "not in the model" in ins.header.text() and ins.rows() == []
