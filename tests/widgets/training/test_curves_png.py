"""Issue 18, item 9: the exported curves PNG is large and has a legend naming the runs."""
import pyqtgraph as pg
from PySide6.QtGui import QImage

from engine.train.run_history import RunHistory
from tests.widgets.training.test_curves import curves, feed  # noqa: F401 (the fixture)


def test_the_png_is_large_and_names_the_runs(curves, tmp_path, monkeypatch):  # noqa: F811
    named = []
    add = pg.LegendItem.addItem
    monkeypatch.setattr(pg.LegendItem, "addItem", lambda self, item, name: (named.append(name), add(self, item, name)))
    a, b = RunHistory("run-a"), RunHistory("run-b")
    curves.add_run(a)
    curves.add_run(b)
    feed(a)
    feed(b, epochs=1)
    assert curves.export_png(tmp_path / "c.png")
    img = QImage(str(tmp_path / "c.png"))
    assert img.width() >= 1600 and img.height() >= 600, (img.width(), img.height())
    assert named == ["run-a", "run-b"]
    # the legend was only for the file: the window's plot has none afterwards
    assert not [i for i in curves.plots["loss"].getViewBox().childItems() if isinstance(i, pg.LegendItem)]
