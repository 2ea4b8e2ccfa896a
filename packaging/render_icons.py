"""Render the application icon (resources/icons/app/ember.svg) to PNGs of every size.

    .venv/bin/python packaging/render_icons.py [--check] [--svg PATH] [--icons DIR]

Writes resources/icons/app/ember-<N>.png for N in SIZES with Qt's own SVG renderer (QtSvg is
part of PySide6-Essentials), so no other tool is needed. With --check nothing is written; the
exit status says whether the committed PNGs are present and match a fresh rendering.
`--svg` and `--icons` choose another SVG and another folder of PNGs (the tests use them).

The check allows for the rasteriser: Qt's antialiasing rounds differently on different CPUs
(its SIMD paths; an Intel Xeon with AVX-512 renders this icon 1 unit off in 4-13 bytes per
size against an AMD EPYC), so a pixel-exact comparison would fail on one of them. A committed
PNG matches when, compared with the fresh rendering in premultiplied ARGB (the renderer's own
format, where these differences are 1 unit):

- no channel of any pixel differs by more than MAX_CHANNEL_DIFFERENCE (2 units of 255), and
- at most MAX_DIFFERING_FRACTION (1 %) of the pixels differ at all, or MIN_DIFFERING_PIXELS
  (16) where 1 % is fewer (the 16 and 24 pixel icons).

A changed SVG still fails: any visible change moves some pixel by far more than 2 units at
one size or another (an edge moved by 1/8 pixel at 512 pixels already does), and a colour
changed by as little as 3 units fails everywhere it is drawn.
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

MAX_CHANNEL_DIFFERENCE = 2  # units of 255, per channel of a premultiplied ARGB pixel
MAX_DIFFERING_FRACTION = 0.01  # of a size's pixels
MIN_DIFFERING_PIXELS = 16  # allowed to differ even where 1 % of the pixels is fewer


def png_path(size: int, icon_dir: Path = ICON_DIR) -> Path:
    return Path(icon_dir) / f"ember-{size}.png"


def render(size: int, svg: Path = SVG):
    """The icon as an (unpremultiplied) ARGB32 QImage of size x size pixels."""
    from PySide6.QtCore import Qt  # noqa: PLC0415
    from PySide6.QtGui import QImage, QPainter  # noqa: PLC0415
    from PySide6.QtSvg import QSvgRenderer  # noqa: PLC0415

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: Qt could not read it as SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return image.convertToFormat(QImage.Format.Format_ARGB32)


def premultiplied_pixels(image):
    """The pixels of a QImage as a uint8 array [height, width, 4] of premultiplied ARGB."""
    import numpy as np  # noqa: PLC0415
    from PySide6.QtGui import QImage  # noqa: PLC0415

    image = image.convertToFormat(QImage.Format.Format_ARGB32_Premultiplied)
    width, height, stride = image.width(), image.height(), image.bytesPerLine()
    data = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    return data.reshape(height, stride)[:, : width * 4].reshape(height, width, 4).copy()


def allowed_differing_pixels(n_pixels: int) -> int:
    return max(MIN_DIFFERING_PIXELS, int(n_pixels * MAX_DIFFERING_FRACTION))


def mismatch(committed, fresh) -> str | None:
    """None when the image `committed` matches `fresh` within the stated tolerance, else what
    differs (sizes, or how many pixels by how much)."""
    import numpy as np  # noqa: PLC0415

    if committed.isNull():
        return "missing or unreadable"
    if committed.size() != fresh.size():
        return (f"{committed.width()}x{committed.height()} pixels, expected "
                f"{fresh.width()}x{fresh.height()}")
    a = premultiplied_pixels(committed).astype(np.int16)
    b = premultiplied_pixels(fresh).astype(np.int16)
    diff = np.abs(a - b)
    largest = int(diff.max()) if diff.size else 0
    differing = int((diff.max(axis=2) > 0).sum())
    n_pixels = fresh.width() * fresh.height()
    allowed = allowed_differing_pixels(n_pixels)
    if largest <= MAX_CHANNEL_DIFFERENCE and differing <= allowed:
        return None
    return (f"{differing} of {n_pixels} pixels differ, by up to {largest} units "
            f"(allowed: {allowed} pixels, by up to {MAX_CHANNEL_DIFFERENCE})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed PNGs within the stated tolerance, write nothing")
    ap.add_argument("--svg", type=Path, default=SVG, help=f"the SVG to render (default {SVG.relative_to(ROOT)})")
    ap.add_argument("--icons", type=Path, default=ICON_DIR,
                    help=f"the folder of the PNGs (default {ICON_DIR.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication, QImage  # noqa: PLC0415

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (fonts, plugins)
    stale = []
    for size in SIZES:
        image = render(size, args.svg)
        path = png_path(size, args.icons)
        if args.check:
            problem = mismatch(QImage(str(path)), image)
            if problem is not None:
                stale.append(f"{path.name} ({problem})")
            continue
        if not image.save(str(path), "PNG"):
            raise SystemExit(f"could not write {path}")
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"wrote {shown} ({path.stat().st_size} bytes)")
    if stale:
        print(f"stale or missing icons for {args.svg} (run packaging/render_icons.py): " + "; ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
