"""The curves widget: what it plots, smoothing, log scale, the crosshair read-out, overlaid runs,
export, and redraws throttled to one per frame interval."""
import csv

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from engine.train import events as ev
from engine.train.run_history import RunHistory, ema
from widgets.training.curves import TrainingCurves, _slack_range


@pytest.fixture
def curves(qtbot):
    c = TrainingCurves()
    qtbot.addWidget(c)
    c.resize(800, 600)
    c.show()
    qtbot.waitExposed(c)
    return c


def feed(h, epochs=3, steps=10, scale=1.0, lr=0.01):
    h.apply(ev.Started(epochs, steps, 1, 0))
    rng = np.random.default_rng(len(h.name))
    g = 0
    for e in range(1, epochs + 1):
        for s in range(1, steps + 1):
            g += 1
            h.apply(ev.StepLoss(e, s, steps, g, scale * (np.exp(-g / 10) + 0.05 * rng.random())))
            h.apply(ev.LearningRate(e, s, g, lr))
        h.apply(ev.EpochMetrics(e, {"loss": scale * np.exp(-g / 10), "accuracy": 1 - np.exp(-g / 10)}))
        h.apply(ev.ValidationMetrics(e, {"loss": scale * 1.1 * np.exp(-g / 10), "accuracy": 0.9 - np.exp(-g / 10)}))
    h.apply(ev.Finished(epochs, {}))


def test_long_curves_are_drawn_decimated_keeping_the_spikes(curves):
    from widgets.training.curves import MAX_POINTS, decimate

    h = RunHistory("long")
    curves.add_run(h)
    n = 25_000
    h.apply(ev.Started(1, n, 1, 0))
    for g in range(1, n + 1):
        h.apply(ev.StepLoss(1, g, n, g, 5.0 if g == 12_345 else 1.0 / np.sqrt(g)))
    curves.smoothing_slider.setValue(0)
    curves.redraw()
    x, y = curves.drawn_data("long", "raw")
    assert len(x) <= MAX_POINTS and 12_345 in x and y.max() == 5.0  # the spike survives
    assert np.all(np.diff(x) >= 0)  # still in step order
    assert len(curves.curve_data("long", "raw")[0]) == n  # the full data is kept
    xs, ys = decimate(np.arange(10.0), np.arange(10.0), 100)
    assert len(xs) == 10  # short curves are drawn as they are


def test_a_run_is_plotted_per_step_and_per_epoch(curves):
    h = RunHistory("one")
    curves.add_run(h)
    feed(h)
    curves.redraw()
    x, y = curves.curve_data("one", "raw")
    assert list(x) == list(range(1, 31)) and np.allclose(y, h.losses)
    assert np.allclose(curves.curve_data("one", "smooth")[1], ema(h.losses, 0.6))
    ex, ey = curves.curve_data("one", "epoch_valid")
    assert list(ex) == [10, 20, 30] and np.allclose(ey, [r["valid"]["loss"] for r in h.epochs])
    assert np.allclose(curves.curve_data("one", "metric_valid")[1], [r["valid"]["accuracy"] for r in h.epochs])
    assert np.allclose(curves.curve_data("one", "lr")[1], 0.01)
    # the view follows the data: x spans the planned steps, y holds every loss
    (x0, x1), (y0, y1) = curves.plots["loss"].vb.viewRange()
    assert x0 <= 0 and x1 >= 30 and y0 <= min(h.losses) and y1 >= max(h.losses)


def test_smoothing_slider_and_log_scale(curves, qtbot):
    h = RunHistory("one")
    curves.add_run(h)
    feed(h)
    curves.smoothing_slider.setValue(90)
    curves.redraw()
    assert curves.smoothing() == 0.9 and curves.smoothing_label.text() == "0.90"
    assert np.allclose(curves.curve_data("one", "smooth")[1], ema(h.losses, 0.9))
    curves.smoothing_slider.setValue(0)
    curves.redraw()
    assert len(curves.curve_data("one", "smooth")[0]) == 0  # raw alone
    qtbot.mouseClick(curves.log_check, Qt.MouseButton.LeftButton, pos=curves.log_check.rect().center())
    assert curves.log_scale()
    assert curves.plots["loss"].getAxis("left").logMode  # ticks as powers of ten
    assert np.allclose(curves.drawn_data("one", "raw")[1], np.log10(h.losses))  # drawn in decades
    _, (y0, y1) = curves.plots["loss"].vb.viewRange()
    assert y0 <= np.log10(min(h.losses)) and y1 >= np.log10(max(h.losses))  # the range is in decades


def test_crosshair_reads_every_visible_run_at_the_step(curves):
    a, b = RunHistory("a"), RunHistory("b")
    curves.add_run(a)
    curves.add_run(b)
    feed(a)
    feed(b, scale=2.0, lr=0.05)
    curves.redraw()
    text = curves.set_cursor(14.3)
    lines = text.splitlines()
    assert lines[0].startswith("a: step 14") and lines[1].startswith("b: step 14")
    assert f"loss {a.losses[13]:.4g}" in lines[0] and f"loss {b.losses[13]:.4g}" in lines[1]
    assert "lr 0.05" in lines[1] and "epoch 1" in lines[0] and "valid accuracy" in lines[0]
    assert curves.crosshair["loss"].isVisible() and curves.crosshair["loss"].value() == pytest.approx(14.3)
    assert curves.readout.text() == text
    # hiding a run in the list hides its curves and its read-out
    item = curves.run_list.item(1)
    item.setCheckState(Qt.CheckState.Unchecked)
    assert not curves.is_run_visible("b") and curves.is_run_visible("a")
    assert "b:" not in curves.readout.text()
    assert curves.set_cursor(None) == "" and not curves.crosshair["lr"].isVisible()


def test_mouse_moves_drive_the_crosshair(curves, qtbot):
    h = RunHistory("one")
    curves.add_run(h)
    feed(h)
    curves.redraw()
    vb = curves.plots["loss"].vb
    scene_pos = vb.mapViewToScene(vb.mapToView(vb.rect().center()))
    curves._on_mouse_moved(scene_pos)
    step = vb.mapSceneToView(scene_pos).x()
    assert curves.crosshair["metric"].value() == pytest.approx(step)
    assert curves.readout.text().startswith(f"one: step {int(round(step))}")


def test_runs_overlay_with_their_own_colours(curves):
    a, b = RunHistory("a"), RunHistory("b")
    curves.add_run(a)
    curves.add_run(b)
    feed(a, epochs=2)
    feed(b, epochs=4)
    curves.redraw()
    assert len(curves.curve_data("a", "raw")[0]) == 20 and len(curves.curve_data("b", "raw")[0]) == 40
    ca, cb = curves._curves["a"].color, curves._curves["b"].color
    assert ca != cb
    assert curves.run_list.item(0).foreground().color() == ca
    assert curves.plots["loss"].vb.viewRange()[0][1] >= 40  # the longer run fits
    with pytest.raises(ValueError, match="already shown"):
        curves.add_run(RunHistory("a"))
    curves.remove_run("a")
    assert [r.name for r in curves.runs()] == ["b"] and curves.run_list.count() == 1


def test_zooming_by_hand_stops_following_until_fit(curves):
    h = RunHistory("one")
    curves.add_run(h)
    feed(h, epochs=1)
    curves.redraw()
    vb = curves.plots["loss"].vb
    vb.setXRange(2, 5, padding=0)
    vb.sigRangeChangedManually.emit([True, True])
    feed(h, epochs=1)  # more data
    curves.redraw()
    assert vb.viewRange()[0] == pytest.approx([2, 5])
    curves.fit_button.click()
    assert vb.viewRange()[0][1] >= 10


def test_export_csv_and_png(curves, tmp_path):
    a, b = RunHistory("a"), RunHistory("b")
    curves.add_run(a)
    curves.add_run(b)
    feed(a)
    feed(b, epochs=1)
    rows = curves.export_csv(tmp_path / "c.csv")
    with open(tmp_path / "c.csv", newline="") as f:
        data = list(csv.reader(f))
    assert len(data) == rows + 1 and {r[0] for r in data[1:]} == {"a", "b"}
    assert curves.export_png(tmp_path / "c.png")
    img = QImage(str(tmp_path / "c.png"))
    # issue 18: exported at twice the plots' size, at least 1600 wide, the aspect kept
    assert not img.isNull() and img.width() >= max(1600, 2 * curves.graphics.width())
    assert abs(img.width() / img.height() - curves.graphics.width() / curves.graphics.height()) < 0.02
    # the plots are not blank: more than the background colour
    colours = {img.pixel(x, y) for x in range(0, img.width(), 7) for y in range(0, img.height(), 7)}
    assert len(colours) > 5


def test_many_dirty_marks_redraw_once_per_frame(curves, qtbot):
    h = RunHistory("one")
    curves.add_run(h)
    qtbot.waitUntil(lambda: not curves._timer.isActive())
    before = curves.redraws
    for i in range(50):
        h.apply(ev.StepLoss(1, i + 1, 50, i + 1, 1.0))
        curves.mark_dirty()
    assert curves.redraws == before  # nothing drawn synchronously
    qtbot.waitUntil(lambda: curves.redraws > before)
    qtbot.wait(150)
    assert curves.redraws == before + 1
    assert len(curves.curve_data("one", "raw")[0]) == 50


def test_metric_choices_come_from_the_runs(curves):
    h = RunHistory("one")
    curves.add_run(h)
    h.apply(ev.EpochMetrics(1, {"loss": 1.0, "accuracy": 0.5, "top5": 0.9}))
    curves.redraw()
    items = [curves.metric_combo.itemText(i) for i in range(curves.metric_combo.count())]
    assert items == ["accuracy", "top5"]
    curves.set_metric("top5")
    curves.redraw()
    assert list(curves.curve_data("one", "metric_train")[1]) == [0.9]
    assert curves.plots["metric"].titleLabel.text == "top5 per epoch"


def test_y_ranges_change_only_when_the_data_leaves_or_shrinks():
    r = _slack_range(0.0, 1.0, None)
    assert r[0] < 0 < 1 < r[1]
    assert _slack_range(0.1, 0.9, r) == r  # still fits and fills it
    assert _slack_range(0.0, 2.0, r) != r  # outgrew it
    assert _slack_range(0.0, 0.1, r) != r  # fills less than half
    lo, hi = _slack_range(5.0, 5.0, None)
    assert lo < 5.0 < hi
    # a loss range starts at zero and stays while the loss falls
    r = _slack_range(0.2, 0.7, None, floor=0.0)
    assert r[0] == 0.0 and r[1] > 0.7
    assert _slack_range(0.01, 0.7, r, floor=0.0) == r
