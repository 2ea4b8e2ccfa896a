"""The designer in the main window: its tab, a design opened as the window's model, and keys."""
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.designer_panel import DesignerPanel
from engine.design import DesignModel, mnist_design, save_design


def test_the_designer_takes_the_graph_tab_and_builds_the_windows_model(window, tmp_path):
    panel = window.designer
    assert isinstance(panel, DesignerPanel)
    index = window.tabs.indexOf(panel)
    assert window.tabs.tabText(index) == "Graph / Designer"
    path = save_design(mnist_design(), tmp_path / "mnist.ember.json")
    assert window.open_design(path)
    assert window.tabs.currentWidget() is panel
    model = window.document.module
    assert isinstance(model, DesignModel) and type(model).__name__ == "Model"
    assert model.num_params() == 260810
    assert window.document.source.kind == "design"
    assert window.document.source.to_json()["design"] == mnist_design().to_dict()
    panel.shutdown()


def test_canvas_keys_edit_the_design_not_the_window_document(window, tmp_path):
    panel = window.designer
    window.tabs.setCurrentWidget(panel)
    panel.load_sample("residual")
    panel.canvas.select(["head"])
    panel.canvas.setFocus()
    QTest.keyClick(panel.canvas, Qt.Key.Key_Delete)
    assert "head" not in panel.design
    QTest.keyClick(panel.canvas, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert "head" in panel.design
    panel.shutdown()
