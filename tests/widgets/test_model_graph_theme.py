"""Issue 48, item 9: the graph's shape labels (and its messages) are readable in the dark theme."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QGraphicsSimpleTextItem

from app.theme import apply_theme
from engine import Tensor
from engine.interop import trace_model
from tests.widgets.models import Mlp
from widgets.model_graph import ModelGraphView, shape_text


def _contrast(view, text: str) -> int:
    """The lightness difference between a label and the view's background."""
    item = next(i for i in view.scene().items() if isinstance(i, QGraphicsSimpleTextItem) and i.text() == text)
    brush = view.backgroundBrush()
    background = brush.color() if brush.style() != Qt.BrushStyle.NoBrush else view.palette().color(view.backgroundRole())
    return abs(item.brush().color().lightness() - background.lightness())


def test_edge_shapes_and_messages_contrast_with_the_background_in_both_themes(qtbot):
    view = ModelGraphView()
    qtbot.addWidget(view)
    view.show()
    view.set_trace(trace_model(Mlp(), [Tensor.ones([2, 8])]))
    label = shape_text([2, 16])
    assert label in view.texts()
    try:
        for theme in ("light", "dark"):
            apply_theme(QApplication.instance(), theme)
            QApplication.processEvents()
            assert _contrast(view, label) > 100, theme
        view.set_message("Tracing the model…")
        assert _contrast(view, "Tracing the model…") > 100
    finally:
        apply_theme(QApplication.instance(), "light")


def test_fit_never_zooms_a_short_graph_past_its_own_size(qtbot):
    """Issue 48, item 9: BERT's few boxes were fitted into the view at several times their size."""
    view = ModelGraphView()
    qtbot.addWidget(view)
    view.resize(1400, 1000)
    view.show()
    view.set_trace(trace_model(Mlp(), [Tensor.ones([2, 8])]))
    view.fit()
    assert 0.55 <= view.transform().m11() <= 1.0
    centre = view.mapFromScene(view.scene().itemsBoundingRect().center())
    assert view.viewport().rect().contains(centre)  # still in view
