"""Live training curves on pyqtgraph: loss per step and per epoch, a chosen metric per epoch,
the tokens per second of a language model's epochs, and the learning rate, for any number of
overlaid runs.

Controls: a plot selector (Loss, Metric, LR: which of the three plots to show; on a short window
only as many as fit at `MIN_PLOT_HEIGHT` pixels each are shown, the most recently chosen first,
so every plot shown is tall enough for its curves and tick labels), a smoothing slider (a
debiased EMA of the step losses), a log-scale toggle for the loss, a crosshair whose read-out gives every visible run's values at the step under the mouse,
a check box per run to show or hide it, and export as CSV (every run), TensorBoard event files
(`engine.train.tensorboard_export`, one folder a run) or PNG (the plots). The Tokens/s plot is
offered once a run reports `tokens_per_second` (a causal-LM run) and shown the first time one does.
`clear_runs()` forgets every run and resets the axes (another model was opened). The plots
follow the application's palette (light or dark theme): background, axes, titles, grid.

Redrawing is throttled: `mark_dirty()` arms a single-shot timer, so however many events
arrive, the plots are drawn at most `max_fps` times a second, and only runs whose data changed
are touched.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPalette
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QGraphicsItem, QHBoxLayout, QLabel, QListWidget,
                               QListWidgetItem, QMenu, QMessageBox, QPushButton, QSlider, QSplitter, QToolButton,
                               QVBoxLayout, QWidget)

from engine.train.run_history import RunHistory, write_csv

from ..common import monospace_font

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
LOSS, METRIC, SPEED, LR = "loss", "metric", "speed", "lr"
PLOTS = (LOSS, METRIC, SPEED, LR)  # top to bottom
PLOT_BUTTONS = {LOSS: "Loss", METRIC: "Metric", SPEED: "Tokens/s", LR: "LR"}
PLOT_TIPS = {LOSS: "the step and per-epoch losses", METRIC: "the chosen metric per epoch",
             SPEED: "the target tokens trained per second, per epoch (language models)", LR: "the learning rate"}
PLOT_STRETCH = {LOSS: 3, METRIC: 2, SPEED: 2, LR: 2}
TOKENS_PER_SECOND = "tokens_per_second"  # the causal-LM runs' epoch metric (engine.train.tasks)
MIN_PLOT_HEIGHT = 150  # pixels a plot needs (title and tick labels included) to stay readable
AXIS_HEIGHT = 40  # the shared step axis under the last plot
_UNLIMITED = 16777215  # Qt's QWIDGETSIZE_MAX


def _slack_range(lo: float, hi: float, current: tuple | None, floor: float | None = None) -> tuple[float, float]:
    """A y range holding [lo, hi] that changes rarely (each change redraws the axis): the current
    one while it holds the data and the data fill at least half of it; else the data with 15 %
    slack on each side, from `floor` (0 for losses) when the data lie above it."""
    if current is not None:
        c_lo, c_hi = current
        if c_lo <= lo and hi <= c_hi and (hi - (c_lo if floor is not None and lo >= floor else lo)) >= 0.5 * (c_hi - c_lo):
            return current
    span = hi - lo
    pad = 0.15 * span if span > 0 else max(abs(hi) * 0.1, 1e-3)
    low = floor if floor is not None and lo >= floor else lo - pad
    return (low, hi + pad)


MAX_POINTS = 2000  # a step curve longer than this is drawn decimated (min and max per bucket)


def decimate(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about `max_points` points keeping every bucket's extremes, so spikes stay visible."""
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max_points // 2
    size = -(-n // buckets)
    pad = buckets * size - n
    yy = np.concatenate([y, np.full(pad, y[-1])]).reshape(buckets, size)
    xx = np.concatenate([x, np.full(pad, x[-1])]).reshape(buckets, size)
    lo, hi = yy.argmin(axis=1), yy.argmax(axis=1)
    rows = np.arange(buckets)
    first = np.minimum(lo, hi)
    second = np.maximum(lo, hi)
    xs = np.stack([xx[rows, first], xx[rows, second]], axis=1).ravel()
    ys = np.stack([yy[rows, first], yy[rows, second]], axis=1).ravel()
    return xs, ys


class _RunCurves:
    """The plot items of one run: plain curve and scatter items (PlotDataItem's per-update
    bookkeeping costs more than drawing these), fed already decimated and, for a log axis,
    already in decades."""

    def __init__(self, run: RunHistory, color: QColor, plots: dict):
        self.run = run
        self.color = color
        faint = QColor(color)
        faint.setAlpha(70)

        def curve(key, pen):
            item = pg.PlotCurveItem(pen=pen)
            plots[key].addItem(item)
            return item

        def points(key):
            item = pg.ScatterPlotItem(symbol="t1", size=8, brush=pg.mkBrush(color), pen=pg.mkPen(color))
            plots[key].addItem(item)
            return item

        self.raw = curve(LOSS, pg.mkPen(faint, width=1))
        self.smooth = curve(LOSS, pg.mkPen(color, width=2))
        self.epoch_train = curve(LOSS, pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine))
        self.epoch_valid = curve(LOSS, pg.mkPen(color, width=2, style=Qt.PenStyle.DotLine))
        self.epoch_valid_points = points(LOSS)
        self.metric_train = curve(METRIC, pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine))
        self.metric_valid = curve(METRIC, pg.mkPen(color, width=2))
        self.metric_valid_points = points(METRIC)
        self.speed = curve(SPEED, pg.mkPen(color, width=2))
        self.speed_points = points(SPEED)
        self.lr = curve(LR, pg.mkPen(color, width=2))
        self.drawn_version = -1
        self.drawn_key = None
        self.drawn_epochs = None  # (epoch_version, key) of the per-epoch curves
        self.data: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # what each curve shows, undecimated

    def set_raw_emphasis(self, strong: bool) -> None:
        """Without smoothing the raw step losses are the curve: draw them in full colour."""
        pen_color = QColor(self.color)
        if not strong:
            pen_color.setAlpha(70)
        self.raw.setPen(pg.mkPen(pen_color, width=2 if strong else 1))

    def items(self):
        return (self.raw, self.smooth, self.epoch_train, self.epoch_valid, self.epoch_valid_points, self.metric_train,
                self.metric_valid, self.metric_valid_points, self.speed, self.speed_points, self.lr)

    def set(self, which: str, x, y, log: bool = False) -> None:
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self.data[which] = (x, y)
        if log and len(y):
            keep = y > 0
            x, y = x[keep], np.log10(y[keep])
        if which in ("raw", "smooth", "lr"):
            x, y = decimate(x, y)
        getattr(self, which).setData(x, y)
        if which in ("epoch_valid", "metric_valid", "speed"):
            getattr(self, which + "_points").setData(x, y)

    def set_visible(self, on: bool) -> None:
        for item in self.items():
            item.setVisible(on)

    def remove(self, plots: dict) -> None:
        for item in self.items():
            for plot in plots.values():
                if item.scene() is not None and item.parentItem() is plot.vb.childGroup:
                    plot.removeItem(item)


class _Graphics(pg.GraphicsLayoutWidget):
    resized = Signal()

    """The plots' canvas. It remembers how long its last paint took (the dashboard budgets its
    redraws by it) and says when a paint begins and ends (`paint_began`, `paint_ended`, emitted
    on the GUI thread inside the paint): a paint calls back into Python for every item many
    times, and the dashboard holds the training thread between two steps meanwhile, so those
    calls do not each queue for the GIL."""

    paint_began = Signal()
    paint_ended = Signal()
    paint_seconds = 0.0

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.resized.emit()

    def paintEvent(self, event) -> None:
        t = time.perf_counter()
        self.paint_began.emit()
        try:
            super().paintEvent(event)
        finally:
            self.paint_ended.emit()
        self.paint_seconds = time.perf_counter() - t


class TrainingCurves(QWidget):
    """The curves of several runs; feed it `RunHistory` objects and call `mark_dirty()`."""

    run_toggled = Signal(str, bool)  # run name, visible
    overlay_requested = Signal()  # "Overlay run…": the app picks a run folder and adds its curves

    def __init__(self, parent=None, max_fps: float = 12.0):
        super().__init__(parent)
        self._curves: dict[str, _RunCurves] = {}
        self._smoothing = 0.6
        self._log = False
        self._metric = "accuracy"
        self._cursor_step: float | None = None
        self.redraws = 0  # how many times the plots were actually redrawn (tests, benchmarks)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(max(1, int(1000 / max_fps)))
        self._timer.timeout.connect(self.redraw)

        pg.setConfigOptions(antialias=False)
        self.graphics = _Graphics()
        self.graphics.setObjectName("curves-graphics")
        self.graphics.setBackground("w")  # then the palette's (`apply_palette`, on every palette change)
        self.plots = {
            LOSS: self.graphics.addPlot(row=0, col=0, title="Loss"),
            METRIC: self.graphics.addPlot(row=1, col=0, title=f"{self._metric} per epoch"),
            SPEED: self.graphics.addPlot(row=2, col=0, title="Tokens/s per epoch"),
            LR: self.graphics.addPlot(row=3, col=0, title="Learning rate"),
        }
        self._shown: list[str] = []  # the plots shown, top to bottom (set by _layout_plots)
        # the wanted plots, the most recently chosen first; Tokens/s joins once a run has it
        self._priority: list[str] = [k for k in PLOTS if k != SPEED]
        self._speed_offered = False
        # Cheap frames: the ranges are set here (x: the runs' planned steps; y: with slack, so they
        # change rarely) instead of pyqtgraph's auto range, and the axes (which draw the grid)
        # are cached as pixmaps, so a frame mostly redraws curves.
        self._follow = True  # False once the user pans or zooms; 'Fit' turns it back on
        self._ranges: dict[str, tuple] = {}
        for key, plot in self.plots.items():
            plot.showGrid(x=True, y=True, alpha=0.25)
            plot.disableAutoRange()
            plot.hideButtons()
            plot.setMenuEnabled(False)  # its log / transform options would bypass this widget's own
            plot.vb.sigRangeChangedManually.connect(self._on_manual_range)
            left = plot.getAxis("left")
            left.enableAutoSIPrefix(False)
            left.setWidth(52)  # aligned plots, and no relayout as tick labels change
            if key != LOSS:
                plot.setXLink(self.plots[LOSS])
            plot.hideAxis("bottom")  # the shared x axis is drawn once, under the last plot shown
            for name in ("left", "bottom"):
                plot.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        for plot in self.plots.values():
            plot.setLabel("bottom", "step")
        self.crosshair = {k: pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#888888", width=1,
                                                                                  style=Qt.PenStyle.DashLine))
                          for k in self.plots}
        for k, line in self.crosshair.items():
            line.setVisible(False)
            self.plots[k].addItem(line, ignoreBounds=True)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)

        # controls
        self.plot_buttons: dict[str, QToolButton] = {}
        for key in PLOTS:
            b = QToolButton()
            b.setText(PLOT_BUTTONS[key])
            b.setObjectName(f"show-{key}")
            b.setCheckable(True)
            b.setChecked(key in self._priority)
            b.clicked.connect(lambda on, k=key: self.choose_plot(k, on))
            self.plot_buttons[key] = b
        self.smoothing_slider = QSlider(Qt.Orientation.Horizontal)
        self.smoothing_slider.setObjectName("smoothing")
        self.smoothing_slider.setRange(0, 99)
        self.smoothing_slider.setValue(int(round(self._smoothing * 100)))
        self.smoothing_slider.setMinimumWidth(80)
        self.smoothing_slider.setMaximumWidth(160)
        self.smoothing_slider.setToolTip("Smoothing of the step losses: the weight of an exponential moving average")
        self.smoothing_label = QLabel()
        self.smoothing_slider.valueChanged.connect(self._on_smoothing)
        self.log_check = QCheckBox("Log scale")
        self.log_check.setObjectName("log-scale")
        self.log_check.setToolTip("Show the loss on a logarithmic axis")
        self.log_check.toggled.connect(self.set_log_scale)
        self.metric_combo = QComboBox()
        self.metric_combo.setObjectName("metric")
        self.metric_combo.setToolTip("The per-epoch metric in the middle plot")
        # its items change with the model (accuracy, perplexity, ...): sized to them, not to the first shown
        self.metric_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.metric_combo.addItem(self._metric)
        self.metric_combo.currentTextChanged.connect(self._on_metric)
        self.fit_button = QPushButton("Fit")
        self.fit_button.setObjectName("fit")
        self.fit_button.setToolTip("Show all the data again (after zooming or panning)")
        self.fit_button.clicked.connect(self.fit)
        self.key_label = QLabel("— step loss (smoothed over faint raw) · - - train per epoch · ▲ validation per epoch")
        self.key_label.setObjectName("key")
        self.key_label.setStyleSheet("color: #666;")
        self.overlay_button = QPushButton("Overlay run…")
        self.overlay_button.setObjectName("overlay-run")
        self.overlay_button.setToolTip("Add the curves of another run folder (another model's or project's run) "
                                       "to these, to compare them")
        self.overlay_button.clicked.connect(self.overlay_requested)
        # one button for the three exports: the side column keeps its height (the window's minimum)
        self.export_button = QPushButton("Export")
        self.export_button.setObjectName("export")
        self.export_button.setToolTip("Every run's curves as CSV or TensorBoard event files, or the plots as PNG")
        menu = QMenu(self.export_button)
        self.export_csv_action = menu.addAction("CSV…", self._ask_csv)
        self.export_tensorboard_action = menu.addAction("TensorBoard Event Files…", self._ask_tensorboard)
        self.export_tensorboard_action.setToolTip("One folder a run: tensorboard --logdir FOLDER")
        self.export_png_action = menu.addAction("PNG…", self._ask_png)
        self.export_button.setMenu(menu)
        self.readout = QLabel("")
        self.readout.setObjectName("readout")
        self.readout.setFont(monospace_font())
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.readout.setWordWrap(True)
        self.run_list = QListWidget()
        self.run_list.setObjectName("runs")
        self.run_list.setMaximumWidth(220)
        self.run_list.setMinimumWidth(90)
        self.run_list.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.run_list.setToolTip("Runs: tick to overlay, untick to hide")
        self.run_list.itemChanged.connect(self._on_run_item)

        # two rows: in one, the plot buttons, smoothing, log scale and metric were squeezed and
        # clipped at 1024 px once the Tokens/s plot joined them
        plots_row = QHBoxLayout()
        plots_row.addWidget(QLabel("Plots"))
        for key in PLOTS:
            plots_row.addWidget(self.plot_buttons[key])
        plots_row.addStretch(1)
        plots_row.addWidget(QLabel("Metric"))
        plots_row.addWidget(self.metric_combo)
        view_row = QHBoxLayout()
        view_row.addWidget(QLabel("Smoothing"))
        view_row.addWidget(self.smoothing_slider)
        view_row.addWidget(self.smoothing_label)
        view_row.addSpacing(12)
        view_row.addWidget(self.log_check)
        view_row.addStretch(1)
        controls = QVBoxLayout()
        controls.setSpacing(2)
        controls.addLayout(plots_row)
        controls.addLayout(view_row)
        split = QSplitter(Qt.Orientation.Horizontal)
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(QLabel("Runs"))
        side_layout.addWidget(self.run_list, 1)
        for b in (self.fit_button, self.overlay_button, self.export_button):
            side_layout.addWidget(b)
        split.addWidget(side)
        split.addWidget(self.graphics)
        split.setStretchFactor(1, 1)
        split.setSizes([130, 700])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(controls)
        layout.addWidget(split, 1)
        layout.addWidget(self.key_label)
        layout.addWidget(self.readout)
        self._on_smoothing(self.smoothing_slider.value())
        self.apply_palette()
        self._layout_plots()
        self.graphics.resized.connect(self._layout_plots)

    # ---- which plots are shown -----------------------------------------------------------------
    def plot_capacity(self) -> int:
        """How many plots fit the canvas's height at `MIN_PLOT_HEIGHT` each (at least one)."""
        return max(1, (self.graphics.viewport().height() - AXIS_HEIGHT) // MIN_PLOT_HEIGHT)

    def shown_plots(self) -> list[str]:
        """The plots shown now, top to bottom (`LOSS`, `METRIC`, `LR`)."""
        return list(self._shown)

    def choose_plot(self, key: str, on: bool) -> None:
        """Show (`on`) or hide the plot `key`. A plot chosen is shown at once: on a short window
        it takes the place of the one chosen longest ago. The last plot shown stays."""
        if on:
            self._priority = [key] + [k for k in self._priority if k != key]
        elif key in self._shown and len(self._shown) == 1:
            pass  # never no plot at all
        else:
            self._priority = [k for k in self._priority if k != key]
        self._layout_plots()

    def _layout_plots(self) -> None:
        wanted = self._priority[:self.plot_capacity()]
        shown = [k for k in PLOTS if k in wanted]
        for key, b in self.plot_buttons.items():
            b.setChecked(key in shown)
            room = "" if key in shown or key not in self._priority else \
                " (chosen, but there is no room at this height: untick another plot or make the window taller)"
            b.setToolTip(f"Show {PLOT_TIPS[key]}{room}")
        if shown == self._shown:
            return
        # hidden plots stay in the scene and the grid, at no height: nothing is removed or added
        # again, so no plot item ever lives outside the scene that owns it
        layout = self.graphics.ci
        for row, key in enumerate(PLOTS):
            plot = self.plots[key]
            on = key in shown
            layout.layout.setRowStretchFactor(row, PLOT_STRETCH[key] if on else 0)
            plot.setMinimumHeight(MIN_PLOT_HEIGHT - 10 if on and len(shown) > 1 else 0)
            plot.setMaximumHeight(_UNLIMITED if on else 0)  # a hidden item would keep its minimum height
            plot.showAxis("bottom", on and key == shown[-1])
            plot.setVisible(on)
        if self._shown:  # a plot shown again takes the x range of one that stayed
            x_range = self.plots[self._shown[0]].vb.viewRange()[0]
            for key in shown:
                if key not in self._shown:
                    self.plots[key].vb.setXRange(*x_range, padding=0)
        self._shown = shown
        # the layout, activated, sizes its top item by its own hint: give it the canvas's size again
        layout.layout.activate()
        layout.setGeometry(self.graphics.range)

    # ---- theme -------------------------------------------------------------------------------
    def apply_palette(self, palette: QPalette | None = None) -> None:
        """Colour the plots as the palette (the app's theme): background from Base, axes,
        tick labels and titles from Text."""
        pal = palette if palette is not None else self.palette()
        background = pal.color(QPalette.ColorRole.Base)
        text = pal.color(QPalette.ColorRole.Text)
        self.background_color = background.name()
        self.graphics.setBackground(background)
        for key, plot in self.plots.items():
            for name in ("left", "bottom"):
                axis = plot.getAxis(name)
                axis.setPen(pg.mkPen(text))
                axis.setTextPen(pg.mkPen(text))
                axis.picture = None  # the cached drawing is made again in the new colours
                axis.update()
            title = plot.titleLabel.text
            if title:
                plot.setTitle(title, color=text.name())
        dark = background.lightness() < 128
        self.key_label.setStyleSheet(f"color: {'#a0a4aa' if dark else '#666'};")

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.apply_palette()
        super().changeEvent(event)

    # ---- runs --------------------------------------------------------------------------------
    def add_run(self, run: RunHistory, visible: bool = True) -> None:
        if run.name in self._curves:
            raise ValueError(f"a run named {run.name!r} is already shown")
        color = QColor(PALETTE[len(self._curves) % len(PALETTE)])
        self._curves[run.name] = _RunCurves(run, color, self.plots)
        item = QListWidgetItem(run.name)
        item.setData(Qt.ItemDataRole.UserRole, run.name)
        item.setForeground(color)
        item.setToolTip(run.description or run.name)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        self.run_list.blockSignals(True)
        item.setCheckState(Qt.CheckState.Checked if visible else Qt.CheckState.Unchecked)
        self.run_list.addItem(item)
        self.run_list.blockSignals(False)
        self._curves[run.name].set_visible(visible)
        self._curves[run.name].set_raw_emphasis(self._smoothing == 0)
        self.mark_dirty()

    def remove_run(self, name: str) -> None:
        curves = self._curves.pop(name)
        curves.remove(self.plots)
        for i in range(self.run_list.count()):
            if self.run_list.item(i).data(Qt.ItemDataRole.UserRole) == name:
                self.run_list.takeItem(i)
                break

    def runs(self) -> list[RunHistory]:
        return [c.run for c in self._curves.values()]

    def clear_runs(self) -> None:
        """Forget every run and follow the data again from an empty view (another model)."""
        for name in list(self._curves):
            self.remove_run(name)
        if self._speed_offered:  # the next model's runs offer Tokens/s again if they have it
            self._speed_offered = False
            self.choose_plot(SPEED, False)
        self._follow = True
        self._ranges.clear()
        for key in PLOTS:  # no run: the y axes of the runs before do not stay
            self._set_range(key, "y", (0.0, 1.0))
        self._update_ranges()
        self._update_readout()

    def run(self, name: str) -> RunHistory:
        return self._curves[name].run

    def is_run_visible(self, name: str) -> bool:
        return self._curves[name].raw.isVisible()

    def _on_run_item(self, item: QListWidgetItem) -> None:
        name = item.data(Qt.ItemDataRole.UserRole)
        on = item.checkState() == Qt.CheckState.Checked
        if name in self._curves:
            self._curves[name].set_visible(on)
            self.run_toggled.emit(name, on)
            self._update_readout()

    # ---- drawing -----------------------------------------------------------------------------
    def mark_dirty(self) -> None:
        """Ask for a redraw; several requests within one frame interval draw once."""
        if not self._timer.isActive():
            self._timer.start()

    def redraw(self) -> None:
        """Draw every run whose data (or the view settings) changed since it was last drawn."""
        self._timer.stop()
        key = (self._smoothing, self._metric, self._log)
        names = set()
        for c in self._curves.values():
            names.update(c.run.metric_names())
            if c.drawn_version == c.run.version and c.drawn_key == key:
                continue
            self._draw(c)
            c.drawn_version, c.drawn_key = c.run.version, key
        self._update_metric_choices(names)
        if TOKENS_PER_SECOND in names and not self._speed_offered:
            self._speed_offered = True  # shown once; the user's untick stays
            self.choose_plot(SPEED, True)
        self._update_ranges()
        self.redraws += 1
        if self._cursor_step is not None:
            self._update_readout()

    def _draw(self, c: _RunCurves) -> None:
        run = c.run
        x, y = run.step_series()
        log = self._log
        c.set("raw", x, y, log)
        if self._smoothing > 0 and len(y):
            c.set("smooth", x, run.step_series(self._smoothing)[1], log)
        else:
            c.set("smooth", [], [])
        c.set("lr", *run.lr_series())
        epochs_key = (run.epoch_version, self._metric, log)
        if c.drawn_epochs != epochs_key:  # per-epoch curves change once an epoch
            c.drawn_epochs = epochs_key
            c.set("epoch_train", *run.epoch_series("train", "loss"), log)
            c.set("epoch_valid", *run.epoch_series("valid", "loss"), log)
            c.set("metric_train", *run.epoch_series("train", self._metric))
            c.set("metric_valid", *run.epoch_series("valid", self._metric))
            c.set("speed", *run.epoch_series("train", TOKENS_PER_SECOND))

    # ---- ranges ------------------------------------------------------------------------------
    def _on_manual_range(self, *_args) -> None:
        self._follow = False

    def fit(self) -> None:
        """Follow the data again: every visible run in full."""
        self._follow = True
        self._ranges.clear()
        self._update_ranges()

    def _visible(self) -> list[_RunCurves]:
        return [c for c in self._curves.values() if c.raw.isVisible()]

    def _update_ranges(self) -> None:
        if not self._follow:
            return
        shown = self._visible()
        x_end = max([1.0] + [float(max(c.run.total_steps, c.run.global_step)) for c in shown])
        self._set_range(LOSS, "x", (0.0, x_end))
        for key in PLOTS:
            ys = [y for c in shown for y in self._y_data(c.run, key) if y.size]
            if not ys:
                continue
            y = np.concatenate(ys)
            if key == LOSS and self._log:
                y = np.log10(y[y > 0])  # the log view's coordinates are decades
            y = y[np.isfinite(y)]
            if y.size:
                floor = 0.0 if key == LOSS and not self._log else None  # losses sit on zero
                self._set_range(key, "y", _slack_range(float(y.min()), float(y.max()), self._ranges.get((key, "y")),
                                                       floor))

    def _y_data(self, run: RunHistory, key: str) -> list[np.ndarray]:
        """The values a plot shows for a run (the smoothed curve lies within the raw one's range)."""
        if key == LOSS:
            return [np.asarray(run.losses, dtype=np.float64), run.epoch_series("train", "loss")[1],
                    run.epoch_series("valid", "loss")[1]]
        if key == METRIC:
            return [run.epoch_series("train", self._metric)[1], run.epoch_series("valid", self._metric)[1]]
        if key == SPEED:
            return [run.epoch_series("train", TOKENS_PER_SECOND)[1]]
        return [np.asarray(run.lrs, dtype=np.float64)]

    def _set_range(self, key: str, axis: str, span: tuple) -> None:
        if self._ranges.get((key, axis)) == span:
            return
        self._ranges[(key, axis)] = span
        vb = self.plots[key].vb
        if axis == "x":  # on every plot: the links line up only plots in the scene
            for plot in self.plots.values():
                plot.vb.setXRange(*span, padding=0.01)
        else:
            vb.setYRange(*span, padding=0)

    def _update_metric_choices(self, names: set[str]) -> None:
        wanted = sorted(n for n in names if n != "loss")
        have = [self.metric_combo.itemText(i) for i in range(self.metric_combo.count())]
        missing = [n for n in wanted if n not in have]
        if missing:
            self.metric_combo.blockSignals(True)
            self.metric_combo.addItems(missing)
            self.metric_combo.blockSignals(False)

    # ---- settings ----------------------------------------------------------------------------
    def smoothing(self) -> float:
        return self._smoothing

    def _on_smoothing(self, value: int) -> None:
        self._smoothing = value / 100.0
        self.smoothing_label.setText(f"{self._smoothing:.2f}")
        for c in self._curves.values():
            c.set_raw_emphasis(self._smoothing == 0)
        self.mark_dirty()

    def set_log_scale(self, on: bool) -> None:
        self._log = bool(on)
        if self.log_check.isChecked() != self._log:
            self.log_check.setChecked(self._log)
        self.plots[LOSS].getAxis("left").setLogMode(False, self._log)  # ticks as powers of ten
        self._ranges.pop((LOSS, "y"), None)
        self.redraw()

    def log_scale(self) -> bool:
        return self._log

    def set_metric(self, name: str) -> None:
        if self.metric_combo.findText(name) < 0:
            self.metric_combo.addItem(name)
        self.metric_combo.setCurrentText(name)

    def reset_metric(self, name: str) -> None:
        """Offer `name` only (the runs shown add theirs when drawn) and plot it: another model."""
        self.metric_combo.blockSignals(True)
        self.metric_combo.clear()
        self.metric_combo.addItem(name)
        self.metric_combo.blockSignals(False)
        self._on_metric(name)
        self.redraw()

    def _on_metric(self, name: str) -> None:
        if name:
            self._metric = name
            self.plots[METRIC].setTitle(f"{name} per epoch")
            self.mark_dirty()

    # ---- what is drawn (for tests and the read-out) -------------------------------------------
    def curve_data(self, run: str, which: str) -> tuple[np.ndarray, np.ndarray]:
        """The points a curve shows (before decimation; in decades on a log axis): which is raw |
        smooth | epoch_train | epoch_valid | metric_train | metric_valid | lr."""
        c = self._curves[run]
        x, y = c.data.get(which, (np.zeros(0), np.zeros(0)))
        if self._log and which in ("raw", "smooth", "epoch_train", "epoch_valid") and len(y):
            keep = y > 0
            return x[keep], np.log10(y[keep])
        return x, y

    def drawn_data(self, run: str, which: str) -> tuple[np.ndarray, np.ndarray]:
        """What the plot item itself holds (decimated)."""
        x, y = getattr(self._curves[run], which).getData()
        return (np.zeros(0), np.zeros(0)) if x is None else (np.asarray(x), np.asarray(y))

    # ---- crosshair ---------------------------------------------------------------------------
    def _on_mouse_moved(self, pos) -> None:
        for plot in (self.plots[k] for k in self._shown):
            if plot.sceneBoundingRect().contains(pos):
                step = plot.vb.mapSceneToView(pos).x()
                self.set_cursor(step)
                return

    def set_cursor(self, step: float | None) -> str:
        """Put the crosshair at `step` (None hides it); returns the read-out text."""
        self._cursor_step = step
        for line in self.crosshair.values():
            line.setVisible(step is not None)
            if step is not None:
                line.setPos(step)
        return self._update_readout()

    def _update_readout(self) -> str:
        step = self._cursor_step
        if step is None:
            self.readout.setText("")
            return ""
        parts = []
        for c in self._curves.values():
            if not c.raw.isVisible():
                continue
            parts.append(self._readout_for(c.run, step))
        text = "\n".join(p for p in parts if p)
        self.readout.setText(text)
        return text

    def _readout_for(self, run: RunHistory, step: float) -> str:
        if not run.steps:
            return ""
        x = np.asarray(run.steps)
        i = int(np.clip(np.searchsorted(x, step), 0, len(x) - 1))
        if i > 0 and abs(x[i - 1] - step) <= abs(x[i] - step):
            i -= 1
        s = int(x[i])
        fields = [f"{run.name}: step {s}", f"loss {run.losses[i]:.4g}"]
        if self._smoothing:
            fields.append(f"smoothed {run.step_series(self._smoothing)[1][i]:.4g}")
        if run.lr_steps:
            j = min(int(np.searchsorted(np.asarray(run.lr_steps), s)), len(run.lrs) - 1)
            fields.append(f"lr {run.lrs[j]:.3g}")
        row = None
        for r in run.epochs:
            if r["global_step"] <= s:
                row = r
        if row is not None:
            fields.append(f"epoch {row['epoch']}")
            for split in ("train", "valid"):
                for k, v in row.get(split, {}).items():
                    if isinstance(v, float) and math.isfinite(v):
                        fields.append(f"{split} {k} {v:.4g}")
        return " · ".join(fields)

    # ---- export ------------------------------------------------------------------------------
    def export_csv(self, path) -> int:
        """Every run's curves to one CSV file; returns the number of data rows."""
        return write_csv(path, self.runs())

    def export_tensorboard(self, folder) -> list:
        """Every run's scalars as TensorBoard event files under `folder`, one folder a run;
        returns the run folders written (`engine.train.tensorboard_export`)."""
        from engine.train.tensorboard_export import write_tensorboard  # noqa: PLC0415 - loads protobuf

        return write_tensorboard(folder, self.runs())

    def export_png(self, path, size: tuple[int, int] | None = None) -> bool:
        """The plots as a PNG with a legend naming the shown runs: at `size`, else at twice the
        plots' size and at least 1600 pixels wide (the aspect kept)."""
        self.redraw()
        plot = self.plots[self._shown[0]]
        legend = pg.LegendItem(offset=(-10, 10))
        legend.setParentItem(plot.getViewBox())
        for name, curves in self._curves.items():
            if curves.smooth.isVisible():
                legend.addItem(curves.smooth, name)
        try:
            w, h = max(self.graphics.width(), 1), max(self.graphics.height(), 1)
            if size is None:
                scale = max(2.0, 1600 / w)
                size = (int(round(w * scale)), int(round(h * scale)))
            image = QImage(size[0], size[1], QImage.Format.Format_ARGB32)
            image.fill(QColor(getattr(self, "background_color", "#ffffff")))
            painter = QPainter(image)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
            self.graphics.render(painter, QRectF(0, 0, size[0], size[1]), self.graphics.viewport().rect(),
                                 Qt.AspectRatioMode.KeepAspectRatio)
            painter.end()
            return image.save(str(path), "PNG")
        finally:
            if legend.scene() is not None:
                legend.scene().removeItem(legend)

    def _ask_csv(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export curves as CSV", "curves.csv", "CSV (*.csv)")
        if path:
            self.export_csv(path)

    def _ask_tensorboard(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export runs as TensorBoard event files (a log folder)")
        if not folder:
            return
        try:
            written = self.export_tensorboard(folder)
        except (OSError, ImportError) as exc:
            self._tell(QMessageBox.Icon.Warning, f"{folder}: {exc}")
            return
        self._tell(QMessageBox.Icon.Information, f"Wrote {len(written)} run(s) under {folder}: "
                                                 f"tensorboard --logdir \"{folder}\"")

    def _tell(self, icon, text: str) -> QMessageBox:
        """A message that does not block (window-modal), kept as `last_message`."""
        box = QMessageBox(icon, "Export TensorBoard", text, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.last_message = box
        return box

    def _ask_png(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export curves as PNG", "curves.png", "PNG image (*.png)")
        if path:
            self.export_png(path)
