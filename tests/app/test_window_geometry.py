"""The real window at real sizes: every interactive widget of every tab and main dialog is
visible, not overlapped by a sibling and not clipped by its parents; on the Training tab every
plot shown is at least 120 px high and no two tick labels of its axes overlap (issue 18). The
Generate tab too, and both again with the fixture Llama fine-tuned on a text file (LoRA, a short
causal-lm run, a before/after generation: the causal-lm settings, the perplexity line and two
output panes shown), whose screenshots `--finetune-shots DIR` writes for the user guide (issue 20).

The window runs in a child process (the rest of the suite runs offscreen in this pytest
process): under a real X server when `Xvfb` is on PATH (started here, `QT_QPA_PLATFORM=xcb`),
offscreen otherwise (the test says so). Screenshots of every tab and dialog at every size go to
`$EMBER_UI_SHOTS` when set, else to the test's temporary folder, for review.

`python tests/app/test_window_geometry.py --shots DIR [--sizes 1400x860,...]` runs the child part
alone on the current display (e.g. `DISPLAY=:99 QT_QPA_PLATFORM=xcb`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIZES = ((1024, 640), (1400, 860), (1920, 1080))
EXAMPLE = "spirals"


# ---- the child: the window, the geometry checks, the screenshots --------------------------------------------
def interactive_widgets(top):
    """The widgets a user works with under `top`: buttons, line edits, combo and spin boxes, check
    boxes, sliders, the canvas and the plot (graphics views) and scroll areas (a scrolled form is
    fine, a clipped scroll area is not). Parts of other widgets (a combo box's line edit, a tab
    bar's scroll buttons, a scroll area's scroll bars, item views' editors) are left out."""
    from PySide6.QtWidgets import (QAbstractButton, QAbstractItemView, QAbstractScrollArea, QAbstractSlider,
                                   QAbstractSpinBox, QComboBox, QGraphicsView, QLineEdit, QScrollBar, QTabBar,
                                   QToolBar)

    kinds = (QAbstractButton, QLineEdit, QComboBox, QAbstractSpinBox, QAbstractSlider, QGraphicsView,
             QAbstractScrollArea)
    found = []
    for w in top.findChildren(QWidget_()):
        if not isinstance(w, kinds) or isinstance(w, QScrollBar) or not w.isVisible() or w.isWindow() \
                and w is not top:
            continue
        if isinstance(w, QAbstractItemView) and not isinstance(w, QGraphicsView):
            pass  # the tree and tables: checked as scroll areas
        parent = w.parentWidget()
        if isinstance(parent, (QComboBox, QAbstractSpinBox, QTabBar)):
            continue
        if isinstance(parent, QToolBar) and w.objectName() == "qt_toolbar_ext_button":
            continue
        if any(isinstance(a, QAbstractItemView) for a in ancestors(w, top)):
            continue  # editors inside a tree or table
        if w.window() is not top:
            continue
        found.append(w)
    return found


def QWidget_():
    from PySide6.QtWidgets import QWidget

    return QWidget


def ancestors(w, top):
    out = []
    p = w.parentWidget()
    while p is not None and p is not top:
        out.append(p)
        p = p.parentWidget()
    return out


def describe(w) -> str:
    name = w.objectName() or ""
    text = ""
    for attr in ("text", "windowTitle"):
        try:
            text = getattr(w, attr)() or ""
        except Exception:  # noqa: BLE001
            pass
        if text:
            break
    chain = []
    p = w.parentWidget()
    while p is not None and len(chain) < 3:
        if p.objectName():
            chain.append(p.objectName())
        p = p.parentWidget()
    return f"{type(w).__name__}({name!r}{', ' + repr(text) if text else ''}) in {'/'.join(reversed(chain))}"


def geometry_problems(top) -> list[str]:
    """What is wrong with the interactive widgets of `top` (a window or a dialog)."""
    from PySide6.QtCore import QRect
    from PySide6.QtWidgets import QAbstractScrollArea, QGraphicsView, QRubberBand, QSplitterHandle

    def in_top(w, r=None):
        r = w.rect() if r is None else r
        return QRect(w.mapTo(top, r.topLeft()), r.size())

    problems = []
    for w in interactive_widgets(top):
        what = describe(w)
        rect = in_top(w)
        # squeezed: a button or box smaller than it needs shows its text cut off
        hint = w.minimumSizeHint()
        if not isinstance(w, (QGraphicsView, QAbstractScrollArea)) and hint.isValid() and (
                w.width() < hint.width() - 1 or w.height() < hint.height() - 1):
            problems.append(f"{what}: squeezed to {w.width()}x{w.height()}, needs {hint.width()}x{hint.height()}")
        if w.width() <= 0 or w.height() <= 0:
            problems.append(f"{what}: no room ({w.width()}x{w.height()})")
            continue
        # clipped by a parent (inside a scroll area's viewport, the viewport's scrolling is fine)
        scrolled = False
        for p in ancestors(w, top) + [top]:
            if isinstance(p.parentWidget(), QAbstractScrollArea) and p is p.parentWidget().viewport() \
                    and not isinstance(p.parentWidget(), QGraphicsView):
                scrolled = True
                break
            if not in_top(p).contains(rect):
                problems.append(f"{what}: clipped by {describe(p)} ({fmt(rect)} outside {fmt(in_top(p))})")
                break
        # Qt's visible region leaves out opaque children (a scroll area's viewport): checked on leaves
        leaf = not any(isinstance(c, QWidget_()) and c.isVisible() and not c.isWindow() for c in w.children())
        if not scrolled and leaf:
            visible = w.visibleRegion()
            if not visible.contains(w.rect()) and visible.boundingRect() != w.rect():
                problems.append(f"{what}: only {fmt(visible.boundingRect())} of {fmt(w.rect())} visible")
        # overlapped by a sibling of it or of one of its parents (a later sibling paints on top)
        chain = [w] + ancestors(w, top)
        for a in chain:
            parent = a.parentWidget()
            if parent is None:
                break
            a_rect = in_top(a).intersected(rect)
            for s in parent.children():
                if s is a or not isinstance(s, QWidget_()) or not s.isVisible() or s.isWindow() \
                        or isinstance(s, (QRubberBand, QSplitterHandle)):
                    continue
                if s.objectName().startswith("qt_") or type(s).__name__ in ("QFocusFrame", "QToolBarExtension"):
                    continue
                overlap = in_top(s).intersected(a_rect)
                if overlap.width() > 1 and overlap.height() > 1:
                    problems.append(f"{what}: overlapped by {describe(s)} at {fmt(overlap)}")
            if parent is top:
                break
    return problems


def fmt(r) -> str:
    return f"{r.width()}x{r.height()}+{r.x()}+{r.y()}"


def required_problems(window) -> list[str]:
    """The working area of each tab: always there, and big enough to work in."""
    out = []
    tab = window.tabs.currentWidget()
    need = []
    if tab is window.training_panel:
        c = window.training_panel.controls
        need = [(c.start_button, 0, 0), (c.pause_button, 0, 0), (c.resume_button, 0, 0), (c.stop_button, 0, 0),
                (c.checkpoint_button, 0, 0), (window.training_panel.curves.graphics, 300, 200)]
    elif tab is window.designer:
        # a model that is not a design is shown as its traced graph (the Graph page), a design on its canvas
        shown = window.designer.graph if window.designer.pages.currentIndex() == 1 else window.designer.canvas
        need = [(shown, 400, 250)]
    elif tab is window.generate_panel:
        v = window.generate_panel.view
        need = [(v.prompt, 200, 40), (v.generate_button, 0, 0), (v.stop_button, 0, 0), (v.compare, 0, 0),
                (v.max_new_tokens, 0, 0), (v.temperature, 0, 0), (v.top_k, 0, 0), (v.top_p, 0, 0), (v.seed, 0, 0),
                (v.outputs[0], 200, 60)]
    for w, min_w, min_h in need:
        if not w.isVisible():
            out.append(f"{describe(w)}: not shown")
        elif w.width() < min_w or w.height() < min_h:
            out.append(f"{describe(w)}: only {w.width()}x{w.height()}, the tab's working area needs "
                       f"at least {min_w}x{min_h}")
    return out


MIN_PLOT_PX = 120  # a plot shown is at least this high (its title, curves and tick labels)


def tick_label_rects(axis):
    """The rectangles (in the axis's coordinates) pyqtgraph draws the axis's tick labels in."""
    from PySide6.QtGui import QImage, QPainter

    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    if specs is None:
        return []
    return [(rect, text) for rect, _flags, text in specs[2]]


def plot_problems(curves) -> list[str]:
    """The training curves: at least one plot, each plot shown at least MIN_PLOT_PX high and
    inside the canvas, and no two tick labels of an axis drawn over each other."""
    out = []
    shown = curves.shown_plots()
    if not shown:
        return ["the training curves show no plot"]
    view = curves.graphics
    canvas = view.mapToScene(view.viewport().rect()).boundingRect()
    for key in shown:
        plot = curves.plots[key]
        rect = plot.sceneBoundingRect()
        if not plot.isVisible() or plot.scene() is None:
            out.append(f"plot {key}: said to be shown but not in the canvas")
            continue
        if rect.height() < MIN_PLOT_PX:
            out.append(f"plot {key}: only {rect.height():.0f} px high, needs {MIN_PLOT_PX}")
        if not canvas.adjusted(-1, -1, 1, 1).contains(rect):
            out.append(f"plot {key}: {rect.getRect()} outside the canvas {canvas.getRect()}")
        for name in ("left", "bottom"):
            axis = plot.getAxis(name)
            if not axis.isVisible():
                continue
            labels = tick_label_rects(axis)
            for i, (a, ta) in enumerate(labels):
                for b, tb in labels[i + 1:]:
                    overlap = a.intersected(b)
                    if overlap.width() > 0.5 and overlap.height() > 0.5:
                        out.append(f"plot {key}, {name} axis: tick labels {ta!r} and {tb!r} overlap")
    return out


def feed_curves(curves) -> None:
    """A finished run of 3 epochs in the dashboard, so the axes carry real ranges and tick labels."""
    import math

    from engine.train import events as ev
    from engine.train.run_history import RunHistory

    h = RunHistory("geometry-run")
    steps = 40
    h.apply(ev.Started(3, steps, 1, 0))
    g = 0
    for e in range(1, 4):
        for s in range(1, steps + 1):
            g += 1
            h.apply(ev.StepLoss(e, s, steps, g, 1.2 * math.exp(-g / 30) + 0.05 * ((g * 7919) % 13) / 13))
            h.apply(ev.LearningRate(e, s, g, 0.01 * (1 - g / 130)))
        h.apply(ev.EpochMetrics(e, {"loss": math.exp(-g / 30), "accuracy": 1 - 0.8 * math.exp(-g / 30)}))
        h.apply(ev.ValidationMetrics(e, {"loss": 1.1 * math.exp(-g / 30), "accuracy": 0.95 - 0.8 * math.exp(-g / 30)}))
    h.apply(ev.Finished(3, {}))
    curves.add_run(h)
    curves.redraw()


def settle(app, window, seconds=0.3):
    deadline = time.monotonic() + 60
    while window.running_tasks and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def child_main(shots: str, sizes) -> dict:
    os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
    import engine  # noqa: F401
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings

    app = QApplication.instance() or QApplication(["ember-geometry"])
    app.setStyle("Fusion")
    shots_dir = Path(shots)
    shots_dir.mkdir(parents=True, exist_ok=True)
    report = {"platform": app.platformName(), "problems": {}, "shots": []}
    settings = Settings.at(Path(tempfile.mkdtemp(prefix="ember-geometry-")) / "settings.ini")
    window = MainWindow(settings=settings)
    window.show()
    assert window.open_example(EXAMPLE), "the example did not open"
    settle(app, window)
    feed_curves(window.training_panel.curves)
    tabs = (("display", window.display), ("designer", window.designer), ("training", window.training_panel),
            ("generate", window.generate_panel))
    window.designer.canvas.setFocus()
    for width, height in sizes:
        window.resize(width, height)
        settle(app, window)
        for name, tab in tabs:
            window.tabs.setCurrentWidget(tab)
            settle(app, window)
            key = f"{width}x{height}-{name}"
            shot = shots_dir / f"{key}.png"
            grab_window(app, window).save(str(shot), "PNG")
            report["shots"].append(str(shot))
            report["problems"][key] = required_problems(window) + geometry_problems(window)
            if tab is window.training_panel:
                report["problems"][key] += plot_problems(window.training_panel.curves)
                report.setdefault("plots", {})[key] = window.training_panel.curves.shown_plots()
        window.tabs.setCurrentWidget(window.display)
        settle(app, window)
        for name, opener in (("lora", lambda: window.edit_actions.open_lora_dialog("")),
                             ("group", window.edit_actions.open_group_dialog),
                             ("checkpoint", window.checkpoints.ask_import)):
            dialog = opener()
            settle(app, window)
            key = f"{width}x{height}-dialog-{name}"
            if dialog is None:
                report["problems"][key] = [f"the {name} dialog did not open"]
                continue
            shot = shots_dir / f"{key}.png"
            dialog.grab().save(str(shot), "PNG")
            report["shots"].append(str(shot))
            report["problems"][key] = geometry_problems(dialog)
            dialog.reject()
            settle(app, window, 0.1)
    guide = os.environ.get("EMBER_FINETUNE_SHOTS")
    finetune_phase(app, window, shots_dir, sizes, report, Path(guide) if guide else None)
    window.close()
    return report


LLAMA = ROOT / "tests" / "fixtures" / "hf" / "llama-gqa"


def finetune_phase(app, window, shots_dir: Path, sizes, report: dict, guide_dir: Path | None = None) -> None:
    """The fixture Llama: LoRA on q/v, a short causal-lm run on a generated text file, a
    before/after generation; the Training and Generate tabs checked (and shot) at every size."""
    import numpy as np

    from app.core.schema import GroupSpec, LoraEdit

    folder = Path(tempfile.mkdtemp(prefix="ember-finetune-"))
    rng = np.random.default_rng(0)
    lines = [f"{rng.choice(['the cat', 'the dog', 'a bird'])} {rng.choice(['sat on', 'ran to'])} "
             f"{rng.choice(['the mat.', 'a box.'])}" for _ in range(300)]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    window.pretrained.open_folder(LLAMA)
    settle(app, window)
    window.edit_actions.apply_edit(LoraEdit(8, 16.0, None, GroupSpec("regex", pattern=r"\.(query|value)\.weight$")))
    panel = window.training_panel
    panel.run_settings.choose_data_file(str(folder / "corpus.txt"))
    panel.data_form.set_field("block_size", 32)
    for name, value in (("num_epochs", 10), ("batch_size", 16), ("warmup_steps", 5), ("max_grad_norm", 1.0),
                        ("checkpoint_every", 0)):
        panel.training_form.set_field(name, value)
    panel.schedule_forms["constant"].set_field("lr", 2e-2)
    window.tabs.setCurrentWidget(panel)
    panel._runs_dir = folder / "runs"
    run = panel.start()
    assert run is not None, panel.last_error
    assert panel.wait(300), "the fine-tuning run did not end"
    settle(app, window)
    gen = window.generate_panel
    v = gen.view
    v.prompt.setPlainText("the cat sat on")
    v.max_new_tokens.setValue(24)
    v.compare.setCurrentIndex(v.compare.findData("run"))
    gen.generate()
    assert gen.wait(60), "the generation did not end"
    for width, height in sizes:
        window.resize(width, height)
        settle(app, window)
        for name, tab in (("training", panel), ("generate", gen)):
            window.tabs.setCurrentWidget(tab)
            settle(app, window)
            key = f"{width}x{height}-llama-{name}"
            shot = shots_dir / f"{key}.png"
            image = grab_window(app, window)
            image.save(str(shot), "PNG")
            report["shots"].append(str(shot))
            report["problems"][key] = required_problems(window) + geometry_problems(window)
            if tab is panel:
                report["problems"][key] += plot_problems(panel.curves)
            if guide_dir is not None and (width, height) == (1400, 860):
                guide_dir.mkdir(parents=True, exist_ok=True)
                image.save(str(guide_dir / f"guide-finetune-{name}.png"), "PNG")
    report["finetune"] = {"lm_metrics": panel.lm_label.text(), "outputs": [v.text(0), v.text(1)],
                          "status": v.status.text()}


def grab_window(app, window):
    """What the screen shows (the real X server's pixels) where there is one, else the widget's paint."""
    screen = window.screen()
    if app.platformName() == "xcb" and screen is not None:
        window.raise_()
        app.processEvents()
        return screen.grabWindow(window.winId())
    return window.grab()


# ---- the test: an X server when there is one, the child process, the report -------------------------------------
@pytest.fixture(scope="module")
def x_display():
    """A fresh Xvfb display (its name), or None when Xvfb is not installed."""
    from tests.app.window_helpers import xvfb_display  # noqa: PLC0415 (the child runs this file without the root on its path)

    with xvfb_display() as display:
        yield display


def test_every_widget_is_visible_unclipped_and_not_overlapped(x_display, tmp_path, capsys):
    shots = Path(os.environ.get("EMBER_UI_SHOTS") or tmp_path / "shots")
    env = dict(os.environ, PYQTGRAPH_QT_LIB="PySide6", PYTEST_QT_API="pyside6")
    if x_display is not None:
        env.update(DISPLAY=x_display, QT_QPA_PLATFORM="xcb")
        env.pop("WAYLAND_DISPLAY", None)
    else:
        env["QT_QPA_PLATFORM"] = "offscreen"
    sizes = ",".join(f"{w}x{h}" for w, h in SIZES)
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--shots", str(shots), "--sizes", sizes,
                           "--report", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and out.exists(), f"the window's child process failed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(out.read_text())
    with capsys.disabled():
        where = f"a real X server (Xvfb {x_display})" if report["platform"] == "xcb" else \
            "the offscreen platform (Xvfb is not installed: no real X server)"
        print(f"\nwindow geometry checked on {where}; screenshots in {shots}")
    failures = {k: v for k, v in report["problems"].items() if v}
    assert not failures, "\n".join(f"{k}:\n  " + "\n  ".join(v) for k, v in failures.items())



def test_each_tab_keeps_its_own_docks(window, settings, qtbot):
    """The designer and the dashboard start without docks; a dock shown on a tab from the View menu
    stays on that tab only, and comes back so on the next start."""
    from app.main_window import MainWindow

    docks = (window.tree_dock, window.inspector_dock, window.contract_dock)
    assert all(not d.isHidden() for d in docks)  # the display: tree, contract, inspector
    window.tabs.setCurrentWidget(window.training_panel)
    assert all(d.isHidden() for d in docks)
    window.tree_dock.toggleViewAction().trigger()  # View ▸ Module Tree on the Training tab
    assert not window.tree_dock.isHidden()
    window.tabs.setCurrentWidget(window.designer)
    assert all(d.isHidden() for d in docks)
    window.tabs.setCurrentWidget(window.display)
    window.inspector_dock.toggleViewAction().trigger()  # closed on the display
    window.tabs.setCurrentWidget(window.training_panel)
    assert not window.tree_dock.isHidden() and window.inspector_dock.isHidden()
    window.tabs.setCurrentWidget(window.display)
    assert window.inspector_dock.isHidden() and not window.tree_dock.isHidden()
    window.close()
    w2 = MainWindow(settings=settings)
    qtbot.addWidget(w2)
    w2.show()
    w2.tabs.setCurrentWidget(w2.training_panel)
    assert not w2.tree_dock.isHidden() and w2.inspector_dock.isHidden() and w2.contract_dock.isHidden()

if __name__ == "__main__":
    import argparse

    sys.path.insert(0, str(ROOT))
    p = argparse.ArgumentParser()
    p.add_argument("--shots", required=True)
    p.add_argument("--sizes", default=",".join(f"{w}x{h}" for w, h in SIZES))
    p.add_argument("--report")
    p.add_argument("--finetune-shots", help="also write guide-finetune-{training,generate}.png (1400x860) here")
    a = p.parse_args()
    if a.finetune_shots:
        os.environ["EMBER_FINETUNE_SHOTS"] = a.finetune_shots
    result = child_main(a.shots, [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")])
    text = json.dumps(result, indent=1)
    if a.report:
        Path(a.report).write_text(text)
    else:
        print(text)
    sys.exit(0)
