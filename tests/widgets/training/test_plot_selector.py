"""The curves' plot selector (issue 18, item 2): on a short dashboard only as many plots are
shown as fit at MIN_PLOT_HEIGHT each, the one chosen last first; the step axis is drawn under
the last plot shown; every plot shown keeps the shared x range."""
import numpy as np
import pytest
from PySide6.QtCore import Qt

from engine.train.run_history import RunHistory
from tests.widgets.training.test_curves import feed
from widgets.training.curves import LOSS, LR, METRIC, MIN_PLOT_HEIGHT, SPEED, TrainingCurves


@pytest.fixture
def curves(qtbot):
    c = TrainingCurves()
    qtbot.addWidget(c)
    c.resize(800, 700)
    c.show()
    qtbot.waitExposed(c)
    h = RunHistory("run")
    c.add_run(h)
    feed(h)
    c.redraw()
    return c


def _resize(curves, qtbot, height):
    curves.resize(800, height)
    qtbot.waitUntil(lambda: curves.graphics.height() < height, timeout=2000)
    qtbot.wait(20)


def _heights(curves):
    return {k: curves.plots[k].sceneBoundingRect().height() for k in curves.shown_plots()}


def _bottom_axes(curves):
    return [k for k in curves.shown_plots() if curves.plots[k].getAxis("bottom").isVisible()]


def test_a_tall_dashboard_shows_every_plot_each_tall_enough(curves):
    assert curves.shown_plots() == [LOSS, METRIC, LR]
    assert all(h >= MIN_PLOT_HEIGHT - 10 for h in _heights(curves).values()), _heights(curves)
    assert _bottom_axes(curves) == [LR]
    # every plot but Tokens/s, which a run without tokens_per_second (a classifier's) does not offer
    assert all(b.isChecked() == (k != SPEED) for k, b in curves.plot_buttons.items())


def test_a_short_dashboard_shows_fewer_plots_and_the_selector_picks_them(curves, qtbot):
    _resize(curves, qtbot, 300)
    assert curves.plot_capacity() == 1
    assert curves.shown_plots() == [LOSS]
    assert not curves.plot_buttons[LR].isChecked()
    assert "no room" in curves.plot_buttons[LR].toolTip()
    assert _heights(curves)[LOSS] >= 120
    qtbot.mouseClick(curves.plot_buttons[LR], Qt.MouseButton.LeftButton)  # the user wants the learning rate
    assert curves.shown_plots() == [LR]
    assert curves.plot_buttons[LR].isChecked() and not curves.plot_buttons[LOSS].isChecked()
    assert _bottom_axes(curves) == [LR]
    loss_x = curves.plots[LOSS].vb.viewRange()[0]
    assert np.allclose(curves.plots[LR].vb.viewRange()[0], loss_x)  # the same steps
    qtbot.mouseClick(curves.plot_buttons[LR], Qt.MouseButton.LeftButton)  # unticking the only plot: it stays
    assert curves.shown_plots() == [LR] and curves.plot_buttons[LR].isChecked()
    _resize(curves, qtbot, 700)  # room again: every plot still wanted comes back
    qtbot.waitUntil(lambda: curves.shown_plots() == [LOSS, METRIC, LR], timeout=2000)
    assert _bottom_axes(curves) == [LR]


def test_unticking_a_plot_gives_its_room_to_the_others(curves, qtbot):
    before = _heights(curves)[LOSS]
    qtbot.mouseClick(curves.plot_buttons[LR], Qt.MouseButton.LeftButton)
    assert curves.shown_plots() == [LOSS, METRIC]
    assert _bottom_axes(curves) == [METRIC]  # the step axis moved up to the last plot shown
    qtbot.waitUntil(lambda: _heights(curves)[LOSS] > before, timeout=2000)
    curves.set_cursor(15)  # the read-out still reads every run
    assert "run" in curves.readout.text()
