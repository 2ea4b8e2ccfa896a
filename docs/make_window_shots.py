"""Screenshots of the main window in a real window: three sizes, light and dark theme.

    .venv/bin/python docs/make_window_shots.py [--out docs/screenshots] [--example digits]

Each picture is one run of `python -m app --example NAME --size WxH --theme T --screenshot PNG`
under a real X server (`QT_QPA_PLATFORM=xcb`): a private `Xvfb` display started here, or the
current `DISPLAY` with `--display`. Without Xvfb (and without `--display`) it says so and stops:
offscreen pictures are what `docs/make_screenshots.py` makes. Files: `window-WxH-THEME.png`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
SIZES = ("1024x640", "1366x768", "1600x1000")
THEMES = ("light", "dark")


def shoot(display: str, out: Path, example: str, size: str, theme: str) -> tuple[Path, str]:
    """One picture; returns its path and the problems (empty when it is a valid PNG of `size`)."""
    png = out / f"window-{size}-{theme}.png"
    env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb", PYQTGRAPH_QT_LIB="PySide6")
    env.pop("WAYLAND_DISPLAY", None)
    run = subprocess.run([sys.executable, "-m", "app", "--example", example, "--expand", "1", "--size", size,
                          "--theme", theme, "--screenshot", str(png)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    if run.returncode != 0:
        return png, f"exit {run.returncode}: {run.stderr.strip()[-400:]}"
    data = png.read_bytes() if png.exists() else b""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return png, "not a PNG"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    want = tuple(int(v) for v in size.split("x"))
    if (w, h) != want:
        return png, f"the picture is {w}x{h}, expected {size}"
    return png, ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--example", default="digits")
    p.add_argument("--display", help="use this X display instead of starting Xvfb")
    args = p.parse_args(argv)
    if args.display:
        return _shoot_all(args, args.display)
    sys.path.insert(0, str(ROOT))
    from tests.app.window_helpers import xvfb_display  # noqa: PLC0415 - the project's one Xvfb start-up

    with xvfb_display() as display:
        return _shoot_all(args, display)


def _shoot_all(args, display) -> int:
    if display is None:
        print("make_window_shots: Xvfb is not installed (or did not start) and no --display was given: "
              "no real-window pictures made", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for size in SIZES:
        for theme in THEMES:
            png, problem = shoot(display, args.out, args.example, size, theme)
            print(f"{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}: {problem or 'ok'}")
            failed += bool(problem)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
