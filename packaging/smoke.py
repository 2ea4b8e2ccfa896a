"""Smoke test of a built bundle: start it offscreen with --screenshot and check the picture.

    .venv/bin/python packaging/smoke.py [dist/ember] [--example NAME] [--checkpoint FILE]

The bundle's own executable runs (not this Python), in a clean environment with a temporary
HOME, so it finds nothing of the development checkout. It must exit 0 within the time limit
and leave a PNG that

- is a well-formed PNG file (signature, every chunk's CRC, IHDR, IDAT, IEND),
- has the requested size and a non-trivial file size,
- is not blank: many distinct colours, and no single colour covering almost everything.

With --checkpoint (by default the Burn MNIST fixture when ../shared/fixtures has it) a second
run opens that checkpoint into the example's architecture, which exercises the store in the
bundle as well; the bundle must open it (exit 0). A last run opens a file that is no checkpoint
and must fail: a non-zero exit with the reason on stderr. Prints the bundle's size and the start-up times (launch to exit, screenshot
written); the exit status is 0 only when every check passed.
"""
from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIZE = (1200, 800)
MIN_FILE_BYTES = 20_000
MIN_COLOURS = 32
MAX_DOMINANT_SHARE = 0.97


class SmokeError(AssertionError):
    pass


# ---------------------------------------------------------------------------- the PNG file
def png_structure(data: bytes, where: str) -> tuple[int, int]:
    """Check the chunk structure of a PNG and return (width, height)."""
    if not data.startswith(PNG_SIGNATURE):
        raise SmokeError(f"{where}: expected the PNG signature, found {data[:8]!r}")
    pos, chunks, idat = 8, [], 0
    while pos < len(data):
        if pos + 8 > len(data):
            raise SmokeError(f"{where}: truncated chunk header at byte {pos}")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length or pos + 12 + length > len(data):
            raise SmokeError(f"{where}: chunk {kind!r} at byte {pos} runs past the end of the file")
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise SmokeError(f"{where}: chunk {kind!r} at byte {pos} has a wrong CRC")
        chunks.append(kind)
        if kind == b"IDAT":
            idat += length
        pos += 12 + length
    if not chunks or chunks[0] != b"IHDR":
        raise SmokeError(f"{where}: expected IHDR first, found {chunks[:1]}")
    if chunks[-1] != b"IEND":
        raise SmokeError(f"{where}: expected IEND last, found {chunks[-1:]}")
    if idat == 0:
        raise SmokeError(f"{where}: no image data (IDAT)")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def pixel_stats(path: Path) -> tuple[int, float]:
    """(distinct colours, share of the most common colour), decoded with Qt."""
    import numpy as np  # noqa: PLC0415
    from PySide6.QtGui import QImage  # noqa: PLC0415

    image = QImage(str(path))
    if image.isNull():
        raise SmokeError(f"{path}: Qt cannot decode it")
    image = image.convertToFormat(QImage.Format.Format_RGB32)
    w, h = image.width(), image.height()
    buf = np.frombuffer(image.constBits(), dtype=np.uint32, count=image.bytesPerLine() // 4 * h)
    pixels = buf.reshape(h, image.bytesPerLine() // 4)[:, :w].ravel()
    values, counts = np.unique(pixels, return_counts=True)
    return len(values), float(counts.max()) / pixels.size


def check_png(path: Path, size: tuple[int, int]) -> dict:
    if not path.is_file():
        raise SmokeError(f"{path}: the bundle exited but wrote no screenshot")
    data = path.read_bytes()
    if len(data) < MIN_FILE_BYTES:
        raise SmokeError(f"{path}: expected at least {MIN_FILE_BYTES} bytes, found {len(data)}")
    width, height = png_structure(data, str(path))
    if (width, height) != size:
        raise SmokeError(f"{path}: expected {size[0]}x{size[1]} pixels, found {width}x{height}")
    colours, dominant = pixel_stats(path)
    if colours < MIN_COLOURS:
        raise SmokeError(f"{path}: looks blank: expected at least {MIN_COLOURS} colours, found {colours}")
    if dominant > MAX_DOMINANT_SHARE:
        raise SmokeError(f"{path}: looks blank: one colour covers {dominant:.1%} of the picture "
                         f"(expected at most {MAX_DOMINANT_SHARE:.0%})")
    return {"bytes": len(data), "colours": colours, "dominant": dominant}


# ---------------------------------------------------------------------------- the bundle
def executable(bundle: Path) -> Path:
    exe = bundle / ("ember.exe" if os.name == "nt" else "ember")
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise SmokeError(f"{bundle}: expected the executable {exe.name} in the bundle; build it with "
                         "`make package`")
    return exe


def bundle_bytes(bundle: Path) -> int:
    return sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and not p.is_symlink())


def bundle_examples(bundle: Path) -> list[str]:
    folder = bundle / "_internal" / "resources" / "examples"
    return sorted(p.stem.replace("_", "-") for p in folder.glob("*.py") if not p.name.startswith("_"))


def bundle_env(home: Path) -> dict:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_RUNTIME_DIR": str(home),
        "QT_QPA_PLATFORM": "offscreen",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }


def start_bundle(exe: Path, args: list[str], shot: Path, home: Path, timeout: float):
    cmd = [str(exe), *args, "--screenshot", str(shot), "--size", f"{SIZE[0]}x{SIZE[1]}"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=bundle_env(home), cwd=str(home), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise SmokeError(f"{' '.join(cmd)}: no exit within {timeout:.0f} s") from e
    return cmd, proc, time.perf_counter() - t0


def run_bundle(exe: Path, args: list[str], shot: Path, home: Path, timeout: float) -> float:
    cmd, proc, elapsed = start_bundle(exe, args, shot, home, timeout)
    if proc.returncode != 0:
        raise SmokeError(f"{' '.join(cmd)}: exit status {proc.returncode}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return elapsed


def expect_refusal(exe: Path, args: list[str], shot: Path, home: Path, timeout: float) -> str:
    """A start that must fail (a file that is no checkpoint): a non-zero exit with the reason on
    stderr, or the bundle would pass its smoke test whatever it opened. Returns the reason."""
    cmd, proc, _ = start_bundle(exe, args, shot, home, timeout)
    reasons = [line for line in proc.stderr.splitlines() if line.startswith("ember:")]
    if proc.returncode == 0:
        raise SmokeError(f"{' '.join(cmd)}: expected a non-zero exit (nothing it names can be opened), "
                         f"found exit status 0")
    if not reasons:
        raise SmokeError(f"{' '.join(cmd)}: exit status {proc.returncode} without a reason on stderr "
                         f"(a line 'ember: ...')\n--- stderr ---\n{proc.stderr[-4000:]}")
    return reasons[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", default=str(ROOT / "dist" / "ember"), help="the one-folder bundle")
    ap.add_argument("--example", help="the example to open (default: digits when bundled, else the first)")
    ap.add_argument("--checkpoint", help="a .bpk to open into the example (default: the Burn MNIST fixture)")
    ap.add_argument("--runs", type=int, default=3, help="start-ups to time (the first is the cold one)")
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication  # noqa: PLC0415

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QImage decoding)

    bundle = Path(args.bundle).resolve()
    try:
        exe = executable(bundle)
        examples = bundle_examples(bundle)
        if not examples:
            raise SmokeError(f"{bundle}: no example models in _internal/resources/examples")
        example = args.example or ("digits" if "digits" in examples else examples[0])
        checkpoint = args.checkpoint
        fixture = ROOT.parent / "shared" / "fixtures" / "burn-mnist.bpk"
        if checkpoint is None and example == "digits" and fixture.is_file():
            checkpoint = str(fixture)
        if checkpoint and not Path(checkpoint).is_file():
            raise SmokeError(f"--checkpoint {checkpoint}: no such file")
        print(f"bundle: {bundle} ({bundle_bytes(bundle) / 2**20:.1f} MiB, "
              f"{sum(1 for p in bundle.rglob('*') if p.is_file())} files)")
        print(f"examples in the bundle: {', '.join(examples)}")
        with tempfile.TemporaryDirectory(prefix="ember-smoke-") as tmp:
            tmp = Path(tmp)
            times = []
            for i in range(max(1, args.runs)):
                shot = tmp / f"example-{i}.png"
                times.append(run_bundle(exe, ["--example", example], shot, tmp, args.timeout))
                stats = check_png(shot, SIZE)
                print(f"start {i + 1}: --example {example}: {times[-1]:.2f} s to a {stats['bytes']:,}-byte "
                      f"screenshot ({stats['colours']} colours, the commonest covers {stats['dominant']:.0%})")
            if checkpoint:
                shot = tmp / "checkpoint.png"
                t = run_bundle(exe, ["--open", checkpoint, "--example", example], shot, tmp, args.timeout)
                stats = check_png(shot, SIZE)
                print(f"checkpoint: --open {Path(checkpoint).name} --example {example}: {t:.2f} s "
                      f"({stats['bytes']:,} bytes, {stats['colours']} colours)")
            broken = tmp / "not-a-checkpoint.bpk"
            broken.write_bytes(b"not a burnpack")
            reason = expect_refusal(exe, ["--open", str(broken), "--example", example], tmp / "broken.png", tmp,
                                    args.timeout)
            print(f"a broken checkpoint is refused: {reason}")
        print(f"start-up to screenshot: first {times[0]:.2f} s, best {min(times):.2f} s")
    except SmokeError as e:
        print(f"SMOKE TEST FAILED: {e}", file=sys.stderr)
        return 1
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
