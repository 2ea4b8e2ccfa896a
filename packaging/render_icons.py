"""Render the application icon (resources/icons/app/ember.svg) to PNGs of every size.

    .venv/bin/python packaging/render_icons.py [--check]

Writes resources/icons/app/ember-<N>.png for N in SIZES with Qt's own SVG renderer (QtSvg is
part of PySide6-Essentials), so no other tool is needed. With --check nothing is written; the
exit status says whether the committed PNGs are present and match a fresh rendering.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ICON_DIR = ROOT / "resources" / "icons" / "app"
SVG = ICON_DIR / "ember.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def png_path(size: int) -> Path:
    return ICON_DIR / f"ember-{size}.png"


def render(size: int):
    """The icon as a premultiplied-alpha QImage of size x size pixels."""
    from PySide6.QtCore import Qt  # noqa: PLC0415
    from PySide6.QtGui import QImage, QPainter  # noqa: PLC0415
    from PySide6.QtSvg import QSvgRenderer  # noqa: PLC0415

    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"{SVG}: Qt could not read it as SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return image.convertToFormat(QImage.Format.Format_ARGB32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed PNGs, write nothing")
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication, QImage  # noqa: PLC0415

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (fonts, plugins)
    stale = []
    for size in SIZES:
        image = render(size)
        path = png_path(size)
        if args.check:
            old = QImage(str(path))
            if old.isNull() or old.convertToFormat(QImage.Format.Format_ARGB32) != image:
                stale.append(path.name)
            continue
        if not image.save(str(path), "PNG"):
            raise SystemExit(f"could not write {path}")
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")
    if stale:
        print("stale or missing icons (run packaging/render_icons.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
