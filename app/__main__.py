"""`python -m app [--example NAME | --open FILE] [--screenshot PATH]`."""
from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ember", description="Ember: design, inspect and fine-tune neural networks.")
    p.add_argument("--example", help="open a built-in example model by name")
    p.add_argument("--open", dest="open_path", help="open a project, design, checkpoint or model script")
    p.add_argument("--screenshot", help="render the window once, save it as PNG, and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
    if args.screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415

    from .main_window import MainWindow  # noqa: PLC0415

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setStyle("Fusion")
    window = MainWindow()
    window.show()
    if args.screenshot:
        app.processEvents()
        ok = window.grab().save(args.screenshot, "PNG")
        window.close()
        return 0 if ok else 1
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
