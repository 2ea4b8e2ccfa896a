"""`python -m app [--example NAME | --open FILE] [--screenshot PATH]`.

`--open` takes a project (`.ember.json`), a model script (`net.py` or `net.py:factory`), a Hugging
Face model folder (config.json plus its weights: Llama, Mistral, Qwen2, GPT-2, BERT, ViT), a GGUF file
(`.gguf`: Llama, Mistral, Mixtral, Qwen2/3 and their mixtures, Phi-3, Gemma 1-3, its quantized weights
kept quantized), or a
checkpoint (`.bpk`, `.safetensors`) together with `--example NAME` as its architecture, or an
ONNX file (`.onnx`, imported into the designer with its weights).
With `--screenshot` the window renders once with default settings, is saved as PNG, and the
app exits (non-zero when the model could not be opened).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

import engine  # noqa: F401  (first: it configures OpenBLAS before NumPy, Qt or pyqtgraph load it)


def window_size(text: str) -> tuple[int, int]:
    """`WIDTHxHEIGHT` (such as 1400x860) as (width, height); argparse reports anything else."""
    m = re.fullmatch(r"\s*(\d{1,5})\s*[xX×]\s*(\d{1,5})\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, such as 1400x860, got {text!r}")
    w, h = int(m.group(1)), int(m.group(2))
    if not (1 <= w <= 16384 and 1 <= h <= 16384):
        raise argparse.ArgumentTypeError(f"expected a width and height from 1 to 16384 pixels, got {w}x{h}")
    return w, h


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ember", description="Ember: design, inspect and fine-tune neural networks.")
    p.add_argument("--example", help="open a built-in example model by name")
    p.add_argument("--open", dest="open_path", help="open a project, model script (path.py[:factory]), Hugging Face model folder, GGUF file, checkpoint "
                   "or ONNX file (.onnx, imported into the designer)")
    p.add_argument("--screenshot", help="render the window once, save it as PNG, and exit")
    p.add_argument("--train-steps", type=int, metavar="N",
                   help="train the opened model N steps in the Training tab (an example with a task)")
    p.add_argument("--theme", choices=("light", "dark"), help="the colour theme (remembered)")
    p.add_argument("--select", help="with --screenshot: select this module path in the tree")
    p.add_argument("--size", default="1400x860", type=window_size,
                   help="with --screenshot: the window size, WIDTHxHEIGHT")
    p.add_argument("--expand", type=int, help="with --screenshot: expand the tree to this depth")
    p.add_argument("--check", metavar="INPUT", help="with --screenshot: run the shape-contract check with this "
                   "example input ('example', or shapes such as [2, 784]) before the shot")
    return p.parse_args(argv)


def open_requested(window, args) -> bool:
    from pathlib import Path  # noqa: PLC0415

    if args.open_path and Path(args.open_path.rsplit(":", 1)[0]).suffix.lower() in (".bpk", ".safetensors"):
        if not args.example:
            window.error("Open", f"{args.open_path} is a checkpoint: give its architecture with --example NAME, "
                         "or open it with File ▸ Open Checkpoint into Architecture")
            return False
        from .core.schema import CheckpointSource, ExampleSource  # noqa: PLC0415

        source = CheckpointSource(str(Path(args.open_path).resolve()), ExampleSource(args.example))
        return window.projects.open_source(source)
    if args.open_path:
        return window.open_path(args.open_path)
    if args.example:
        return window.open_example(args.example)
    return True


def train_steps(window, steps: int, timeout: float = 600.0) -> bool:
    """Show the Training tab, train the open model `steps` steps with the default settings and
    wait until the run has ended and the trained model is the document's (`--train-steps`)."""
    panel = window.training_panel
    window.tabs.setCurrentWidget(panel)
    if panel.start(max_steps=steps) is None:
        return False
    done = panel.wait(timeout)
    return done and panel.runs[-1].history.status != "failed" and not panel.last_error


def no_display() -> bool:
    """True on Linux without an X or Wayland display and no platform chosen (Qt would abort)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
    if args.screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    elif no_display():
        print("ember: no display found (neither DISPLAY nor WAYLAND_DISPLAY is set). Run it on a desktop, "
              "or render a picture with --screenshot PATH.", file=sys.stderr)
        return 2
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415

    from .main_window import MainWindow  # noqa: PLC0415
    from .settings import Settings  # noqa: PLC0415

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Ember")
    app.setOrganizationName("Ember")
    app.setStyle("Fusion")
    app.setDesktopFileName("org.emberstudio.Ember")  # matches packaging/org.emberstudio.Ember.desktop
    # a screenshot shows the default layout and never touches the user's settings
    settings = Settings.at(os.path.join(tempfile.mkdtemp(prefix="ember-shot-"), "settings.ini")) \
        if args.screenshot else Settings()
    if args.theme:
        settings.set_theme(args.theme)
    window = MainWindow(settings=settings, confirm_close=not args.screenshot)
    if args.screenshot:
        window.resize(*args.size)
    window.show()
    if not args.screenshot:
        from engine.tensor import cpu  # noqa: PLC0415

        cpu.warm_up()  # compile (first run) or load the engine's kernels off the GUI thread
    opened = []  # every model the document was given (a checkpoint arrives later, from a worker)
    window.document.source_changed.connect(lambda: opened.append(window.document.module))
    problems: list[str] = []
    ok = open_requested(window, args)
    if ok and (args.open_path or args.example) and (args.screenshot or args.train_steps):
        settle(app, window)  # a checkpoint loads on a worker: wait for it before judging
        if not opened or window.document.module is None:
            ok = False
    if not ok:
        problems.append(shown_error(window) or f"{describe_request(args)} did not open")
    if ok and args.train_steps:
        ok = train_steps(window, args.train_steps)
        if not ok:
            problems.append(f"--train-steps {args.train_steps}: " + (window.training_panel.last_error or (
                shown_error(window) or "the run did not finish")))
    if not args.screenshot:  # on every start, whatever was opened: an autosave that is not offered stays
        window.projects.offer_recoveries()  # an untitled model's or a recent project's changes, kept by a crash
        window.designer.offer_recovery()  # a design's edits, kept when the app last crashed
    if args.screenshot:
        return screenshot(app, window, args, problems)
    for problem in problems:
        print(f"ember: {problem}", file=sys.stderr)
    return app.exec()


def describe_request(args) -> str:
    if args.open_path and args.example:
        return f"--open {args.open_path} into --example {args.example}"
    return f"--open {args.open_path}" if args.open_path else f"--example {args.example}"


def shown_error(window) -> str:
    """The text of the error or warning the window shows (its last message box), if any."""
    box = window.last_message
    if box is None:
        return ""
    try:
        parts = [box.windowTitle(), box.text(), box.informativeText()]
    except RuntimeError:  # the box was closed and deleted
        return ""
    return ": ".join(p for p in parts if p)


def settle(app, window, timeout: float = 120.0) -> None:
    """Process events until no background task (a load, a check) is running."""
    import time  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while window.running_tasks and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    app.processEvents()


def screenshot(app, window, args, problems: list[str]) -> int:
    """Render the window once, save it, and exit: non-zero, with the reasons on stderr, when the
    requested model, project or checkpoint did not open, training failed, the selection names no
    module, or the picture could not be written."""
    settle(app, window)
    window.default_dock_sizes()  # the first-start layout, whatever the model's widgets asked for
    if args.expand is not None:
        window.tree.expand_to_depth(args.expand)
    if args.select is not None and not window.tree.select_path(args.select):
        problems.append(f"--select {args.select}: no module has this path in the open model"
                        + ("" if window.document.module is not None else " (no model is open)"))
    if args.check:
        window.contract_editor.input.setText(args.check)
        window.run_check(args.check)
        settle(app, window)
    for _ in range(3):
        app.processEvents()
    window.display.display_text()  # render the display now
    app.processEvents()
    saved = window.grab().save(args.screenshot, "PNG")
    window.close()
    if not saved:
        problems.append(f"--screenshot {args.screenshot}: the picture could not be written")
    for problem in problems:
        print(f"ember: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
