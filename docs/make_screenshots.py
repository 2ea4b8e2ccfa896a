"""Make the user guide's screenshots with the app's own --screenshot mode.

    .venv/bin/python docs/make_screenshots.py [--only guide-lora.png] [--out docs/screenshots]

Each picture is one run of `python -m app … --screenshot PATH`: the window opens offscreen with
default settings, renders once, saves the PNG and exits. The states the guide shows (a frozen
block, LoRA attached, an edited contract, a design) are written as small project files
(`.ember.json`: a model source plus the edits to replay) in a temporary folder and opened with
`--open`, exactly as a user's saved project would be. Every picture is checked (a valid PNG
of the requested size, not blank) before the script reports success.

`--designer PNG [--design FILE]` renders the window with the designer tab showing a design
instead (in this process: `designer_screenshot`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
SIZE = "1400x860"


@dataclass
class Shot:
    """One screenshot: the app's arguments, and the project file to write first (if any)."""

    name: str
    caption: str
    args: list[str] = field(default_factory=list)
    project: dict | None = None
    project_path: Path | None = None

    def argv(self, png: Path) -> list[str]:
        """The arguments of `python -m app` that make this picture at `png`."""
        args = list(self.args)
        if self.project_path is not None:
            args = ["--open", str(self.project_path)] + args
        return args + ["--size", SIZE, "--screenshot", str(png)]


def project(source: dict, edits=(), contracts=None) -> dict:
    return {"format": 1, "application": "ember", "source": source, "edits": list(edits),
            "contracts": dict(contracts or {}), "runs": []}


def subtree(path: str) -> dict:
    """The group of every parameter at or below `path` (as the app's tree menu makes it)."""
    return {"kind": "regex", "pattern": "^" + path.replace(".", r"\.") + r"(\.|$)"}


def design_source() -> dict | None:
    """The MNIST sample design as a project source, when engine.design provides it and the
    app can open design sources."""
    try:
        from engine.design import design_source as source_of  # noqa: PLC0415
        from engine.design import mnist_design  # noqa: PLC0415
        from app.core.opening import OpenError, build  # noqa: PLC0415
        from app.core.schema import DesignSource  # noqa: PLC0415
    except ImportError:
        return None
    source = source_of(mnist_design())
    try:
        build(DesignSource(source))
    except OpenError:
        return None
    return source


def planned_shots(folder: Path) -> list[Shot]:
    """Every picture of the user guide; project files go to `folder`."""
    digits = {"kind": "example", "name": "digits"}
    lora_edit = {"op": "lora", "rank": 8, "alpha": 16.0, "init_std": None, "qlora": None,
                 "group": {"kind": "regex", "pattern": r"^fc[12]\."}}
    shots = [
        Shot("guide-open.png", "The digits example opened: module tree, display, inspector and contract editor.",
             ["--example", "digits", "--expand", "1"]),
        Shot("guide-lazy.png", "A 6.7-billion-parameter model opens at once: its parameters stay lazy.",
             ["--example", "llama-7b", "--expand", "2"]),
        Shot("guide-inspect.png", "A layer selected: its display line, parameters with ids and shapes.",
             ["--example", "digits", "--expand", "2", "--select", "conv1.conv"]),
        Shot("guide-freeze.png", "Both convolution blocks frozen: the trainable column and the status line.",
             ["--expand", "1", "--select", "conv1"],
             project(digits, [{"op": "freeze", "group": subtree("conv1")},
                              {"op": "freeze", "group": subtree("conv2")}])),
        Shot("guide-lora.png", "LoRA (rank 8, alpha 16) on fc1 and fc2: L badges, factors in the inspector.",
             ["--expand", "1", "--select", "fc1"],
             project(digits, [lora_edit])),
        Shot("guide-contracts.png", "Shape contracts checked against the example's own input.",
             ["--expand", "1", "--check", "example"],
             project(digits)),
        Shot("guide-contract-error.png", "An edited contract that the model breaks, reported at the module.",
             ["--expand", "1", "--select", "fc1", "--check", "example"],
             project(digits, contracts={"fc1": "[batch_size, 1024] -> [batch_size, 128]"})),
        Shot("guide-export.png", "After Model ▸ Materialize: the adapters folded into plain weights, ready to export.",
             ["--expand", "2", "--select", "fc1"],
             project(digits, [lora_edit, {"op": "materialize"}])),
        Shot("guide-dark.png", "The dark theme.",
             ["--expand", "1", "--select", "fc2", "--theme", "dark"],
             project(digits, [lora_edit])),
    ]
    design = design_source()
    if design is not None:
        shots.append(Shot("guide-design.png", "A model built from a design graph (the MNIST sample design).",
                          ["--expand", "1"], project(design)))
    shots.append(Shot("guide-train.png", "The spirals example after 600 training steps in the Training tab.",
                      ["--example", "spirals", "--train-steps", "600"]))
    for shot in shots:
        if shot.project is not None:
            shot.project_path = folder / (shot.name.removesuffix(".png") + ".ember.json")
    return shots


def check_picture(path: Path, size: str) -> str:
    """Reuse the bundle smoke test's checks: a valid PNG of `size`, not blank."""
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import smoke  # noqa: PLC0415
    finally:
        sys.path.pop(0)
    w, _, h = size.partition("x")
    stats = smoke.check_png(path, (int(w), int(h)))
    return f"{stats['bytes']:,} bytes, {stats['colours']} colours"


def designer_screenshot(png_path, design_path=None, select: str | None = "conv2.conv", size=(1800, 1000)) -> bool:
    """Render the main window with the designer tab showing a design (the MNIST sample when no
    path is given) and save it as PNG."""
    from PySide6.QtCore import Qt  # noqa: PLC0415
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415

    from app.main_window import MainWindow  # noqa: PLC0415
    from app.settings import Settings  # noqa: PLC0415
    from engine.design import mnist_design, save_design  # noqa: PLC0415

    app = QApplication.instance() or QApplication([])
    app.setStyle("Fusion")
    tmp = Path(tempfile.mkdtemp(prefix="ember-designer-shot-"))
    window = MainWindow(settings=Settings.at(str(tmp / "settings.ini")))  # design autosaves go to tmp/autosave
    window.resize(*size)
    window.show()
    window.inspector_dock.hide()  # room for the canvas
    window.contract_dock.hide()
    window.resizeDocks([window.tree_dock], [470], Qt.Orientation.Horizontal)
    if design_path is None:
        design_path = save_design(mnist_design(), tmp / "mnist.ember.json")
    ok = window.open_design(design_path)
    panel = window.designer
    for _ in range(3):
        app.processEvents()
    panel.splitter.setSizes([200, 1000, 330])
    panel.canvas.resetTransform()
    panel.canvas.scale(0.85, 0.85)
    if select and select in panel.design:
        panel.canvas.select([select])
        panel.canvas.centerOn(panel.canvas.nodes[select])
    for _ in range(3):
        app.processEvents()
    saved = window.grab().save(str(png_path), "PNG")
    panel.shutdown()
    window.close()
    return bool(ok and saved)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help="where the PNGs go (default docs/screenshots)")
    ap.add_argument("--only", action="append", help="make only this picture (repeatable)")
    ap.add_argument("--designer", metavar="PNG", help="render the designer tab to PNG instead (see designer_screenshot)")
    ap.add_argument("--design", help="with --designer: the design file to show (default: the MNIST sample)")
    ap.add_argument("--select", default="conv2.conv", help="with --designer: the node to select")
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if args.designer:
        os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
        sys.path.insert(0, str(ROOT))
        return 0 if designer_screenshot(args.designer, args.design, args.select) else 1
    from PySide6.QtGui import QGuiApplication  # noqa: PLC0415

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QImage decoding)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYQTGRAPH_QT_LIB="PySide6")
    failed = []
    with tempfile.TemporaryDirectory(prefix="ember-guide-") as tmp:
        shots = planned_shots(Path(tmp))
        unknown = set(args.only or ()) - {s.name for s in shots}
        if unknown:
            ap.error(f"unknown picture(s) {sorted(unknown)}: expected some of {[s.name for s in shots]}")
        for shot in shots:
            if args.only and shot.name not in args.only:
                continue
            if shot.project is not None:
                shot.project_path.write_text(json.dumps(shot.project, indent=2) + "\n", encoding="utf-8")
            png = out / shot.name
            cmd = [sys.executable, "-m", "app", *shot.argv(png)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
            took = time.perf_counter() - t0
            if proc.returncode != 0:
                failed.append(shot.name)
                print(f"FAILED {shot.name}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            try:
                report = check_picture(png, SIZE)
            except AssertionError as e:
                failed.append(shot.name)
                print(f"FAILED {shot.name}: {e}", file=sys.stderr)
                continue
            print(f"{shot.name}: {took:.1f} s, {report}")
    if failed:
        print(f"{len(failed)} picture(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
