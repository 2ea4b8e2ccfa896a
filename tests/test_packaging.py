"""Cheap checks of packaging/: the desktop entry, the AppStream metainfo, the icon set, the
PyInstaller recipe and the smoke script's picture checks. The bundle itself is built by
`make package`, never here.
"""
from __future__ import annotations

import ast
import importlib.util
import random
import shutil
import struct
import subprocess
import tomllib
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
APP_ID = "org.emberstudio.Ember"
DESKTOP = PACKAGING / f"{APP_ID}.desktop"
METAINFO = PACKAGING / f"{APP_ID}.metainfo.xml"
ICONS = ROOT / "resources" / "icons" / "app"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# freedesktop menu spec: the registered main categories
MAIN_CATEGORIES = {"AudioVideo", "Audio", "Video", "Development", "Education", "Game", "Graphics",
                   "Network", "Office", "Science", "Settings", "System", "Utility"}


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, PACKAGING / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_desktop(path: Path) -> dict[str, dict[str, str]]:
    """A desktop entry file as {group: {key: value}}; refuses what the spec does not allow."""
    groups: dict[str, dict[str, str]] = {}
    current = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            assert current not in groups, f"{path.name}:{number}: group [{current}] appears twice"
            groups[current] = {}
            continue
        assert current is not None, f"{path.name}:{number}: a key before the first group"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: expected key=value, found {line!r}"
        key = key.strip()
        assert key not in groups[current], f"{path.name}:{number}: key {key} appears twice"
        groups[current][key] = value.strip()
    return groups


# ------------------------------------------------------------------------------ desktop entry
def test_desktop_entry_is_complete_and_consistent():
    groups = parse_desktop(DESKTOP)
    assert list(groups) == ["Desktop Entry"]
    entry = groups["Desktop Entry"]
    for key in ("Type", "Name", "Exec", "Icon", "Comment", "Categories"):
        assert entry.get(key), f"{DESKTOP.name}: expected a {key} key"
    assert entry["Type"] == "Application"
    # the command is the console script pyproject.toml installs (and the bundle's executable)
    program = entry["Exec"].split()[0]
    assert program in PYPROJECT["project"]["scripts"], f"Exec runs {program!r}, not an installed script"
    assert entry.get("TryExec", program) == program
    # the icon is named after the application id, and the icon set can provide it
    assert entry["Icon"] == APP_ID
    assert (ICONS / "ember.svg").is_file()
    categories = [c for c in entry["Categories"].split(";") if c]
    assert entry["Categories"].endswith(";")
    assert len(MAIN_CATEGORIES.intersection(categories)) == 1, f"expected one main category in {categories}"
    assert entry["Terminal"] == "false"
    assert entry["Keywords"].endswith(";")


def test_desktop_parser_refuses_broken_files(tmp_path):
    bad = tmp_path / "bad.desktop"
    bad.write_text("[Desktop Entry]\nName=Ember\nName=Other\n")
    with pytest.raises(AssertionError, match="appears twice"):
        parse_desktop(bad)
    bad.write_text("Name=Ember\n")
    with pytest.raises(AssertionError, match="before the first group"):
        parse_desktop(bad)


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils not installed")
def test_desktop_file_validate_accepts_it():
    proc = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


# ------------------------------------------------------------------------------ AppStream
def test_metainfo_describes_this_application():
    root = ET.parse(METAINFO).getroot()
    assert root.tag == "component" and root.get("type") == "desktop-application"
    assert root.findtext("id") == APP_ID
    assert root.findtext("metadata_license") == "CC0-1.0"
    assert root.findtext("project_license") == PYPROJECT["project"]["license"]["text"]
    assert root.findtext("name") == parse_desktop(DESKTOP)["Desktop Entry"]["Name"]
    summary = root.findtext("summary")
    assert summary and not summary.endswith(".") and len(summary) <= 80
    assert root.find("description/p") is not None
    launchable = root.find("launchable")
    assert launchable.get("type") == "desktop-id" and launchable.text == DESKTOP.name
    assert root.findtext("provides/binary") in PYPROJECT["project"]["scripts"]
    releases = root.findall("releases/release")
    assert releases, "expected at least one release"
    assert releases[0].get("version") == PYPROJECT["project"]["version"], \
        "the newest release in the metainfo must be pyproject.toml's version"
    assert root.find("content_rating") is not None


@pytest.mark.skipif(shutil.which("appstreamcli") is None, reason="appstream not installed")
def test_appstreamcli_validates_it():
    proc = subprocess.run(["appstreamcli", "validate", "--no-net", str(METAINFO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------ icons
def png_header(path: Path) -> tuple[int, int, int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name}: not a PNG"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    return width, height, depth, colour


def test_icon_set_has_every_size_with_transparency():
    render = load_script("render_icons")
    assert render.SIZES[0] == 16 and render.SIZES[-1] == 512
    for size in render.SIZES:
        width, height, depth, colour = png_header(render.png_path(size))
        assert (width, height) == (size, size), f"ember-{size}.png is {width}x{height}"
        assert colour == 6 and depth == 8, f"ember-{size}.png: expected 8-bit RGBA"
    svg = ET.parse(ICONS / "ember.svg").getroot()
    assert svg.tag.endswith("svg") and svg.get("viewBox") == "0 0 512 512"


def test_committed_pngs_match_the_svg(qapp):
    """The PNGs are what packaging/render_icons.py makes of the SVG today (within the
    rasteriser's tolerance: see the next tests)."""
    render = load_script("render_icons")
    assert render.main(["--check"]) == 0


@pytest.fixture
def icon_copy(tmp_path):
    """The SVG and the committed PNGs, copied into a scratch folder."""
    render = load_script("render_icons")
    shutil.copy(render.SVG, tmp_path / "ember.svg")
    for size in render.SIZES:
        shutil.copy(render.png_path(size), render.png_path(size, tmp_path))
    return render, tmp_path


def _check(render, folder) -> int:
    return render.main(["--check", "--svg", str(folder / "ember.svg"), "--icons", str(folder)])


def _nudge(render, folder, size, pixels: int, by: int):
    """Change one colour channel of `pixels` opaque pixels of ember-<size>.png by `by` units."""
    from PySide6.QtGui import QColor, QImage  # noqa: PLC0415

    path = render.png_path(size, folder)
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_ARGB32)
    done = 0
    for y in range(image.height()):
        for x in range(image.width()):
            colour = image.pixelColor(x, y)
            if done < pixels and colour.alpha() == 255:
                red = colour.red() + by if colour.red() + by <= 255 else colour.red() - by
                image.setPixelColor(x, y, QColor(red, colour.green(), colour.blue(), 255))
                done += 1
    assert done == pixels, f"ember-{size}.png has fewer than {pixels} opaque pixels"
    assert image.save(str(path), "PNG")


def test_check_tolerates_the_rasteriser_rounding_of_another_cpu(qapp, icon_copy):
    """What an Intel Xeon renders differs by 1 unit in 4-13 bytes per size: still a match."""
    render, folder = icon_copy
    assert (render.MAX_CHANNEL_DIFFERENCE, render.MAX_DIFFERING_FRACTION, render.MIN_DIFFERING_PIXELS) == (2, 0.01, 16)
    for size in render.SIZES[:-1]:
        _nudge(render, folder, size, pixels=13, by=1)
    _nudge(render, folder, 512, pixels=2000, by=2)  # 2 units in 0.8 % of the biggest
    assert _check(render, folder) == 0


def test_check_fails_beyond_the_tolerance(qapp, icon_copy, capsys):
    render, folder = icon_copy
    _nudge(render, folder, 64, pixels=1, by=3)  # one channel of one pixel, 3 units off
    assert _check(render, folder) == 1
    assert "ember-64.png (1 of 4096 pixels differ, by up to 3 units (allowed: 40 pixels, by up to 2))" \
        in capsys.readouterr().err
    shutil.copy(render.png_path(64), render.png_path(64, folder))
    _nudge(render, folder, 16, pixels=17, by=1)  # 1 unit, but in more pixels than allowed
    assert _check(render, folder) == 1
    assert "ember-16.png (17 of 256 pixels differ, by up to 1 units (allowed: 16 pixels" in capsys.readouterr().err
    render.png_path(16, folder).unlink()
    assert _check(render, folder) == 1
    assert "ember-16.png (missing or unreadable)" in capsys.readouterr().err


@pytest.mark.parametrize("edit", [
    ("#ffa531", "#ffa534"),  # a gradient stop of the flame, 3 units bluer
    ('<ellipse cx="256" cy="404"', '<ellipse cx="257" cy="404"'),  # the coal moved by 1/512 of the icon
])
def test_a_changed_svg_fails_the_check(qapp, icon_copy, capsys, edit):
    render, folder = icon_copy
    svg = folder / "ember.svg"
    text = svg.read_text(encoding="utf-8")
    assert text.count(edit[0]) == 1
    svg.write_text(text.replace(*edit), encoding="utf-8")
    assert _check(render, folder) == 1
    assert "ember-512.png" in capsys.readouterr().err
    svg.write_text(text, encoding="utf-8")
    assert _check(render, folder) == 0  # the unchanged copy matches


# ------------------------------------------------------------------------------ the recipe
def test_spec_collects_the_app_and_leaves_the_peers_out():
    text = (PACKAGING / "ember.spec").read_text()
    tree = ast.parse(text)  # a spec file is Python
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for package in ("engine", "widgets", "app", "resources"):
        assert package in strings, f"the spec does not collect {package}"
    for peer in ("torch", "cupy", "pytest"):
        assert peer in strings, f"the spec does not exclude {peer}"
    assert "launcher.py" in strings and (PACKAGING / "launcher.py").is_file()
    assert "ember" in strings  # the executable's name is the console script's
    launcher = ast.parse((PACKAGING / "launcher.py").read_text())
    imports = [n for n in ast.walk(launcher) if isinstance(n, ast.ImportFrom)]
    assert any(n.module == "app.__main__" and n.names[0].name == "main" for n in imports)


# ------------------------------------------------------------------------------ smoke checks
def _png(width: int, height: int, rows: list[bytes]) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_smoke_png_structure_check_catches_damage(tmp_path):
    smoke = load_script("smoke")
    good = _png(3, 2, [bytes(9), bytes(range(9))])
    assert smoke.png_structure(good, "good") == (3, 2)
    corrupt = bytearray(good)
    corrupt[40] ^= 0xFF  # inside IDAT
    with pytest.raises(smoke.SmokeError, match="wrong CRC"):
        smoke.png_structure(bytes(corrupt), "corrupt")
    with pytest.raises(smoke.SmokeError, match="signature"):
        smoke.png_structure(b"GIF89a" + good[6:], "gif")
    with pytest.raises(smoke.SmokeError, match="IEND last|past the end"):
        smoke.png_structure(good[:-12], "truncated")


def test_smoke_refuses_blank_and_accepts_a_real_window(tmp_path, qapp):
    from PySide6.QtGui import QColor, QImage  # noqa: PLC0415
    from PySide6.QtWidgets import QLabel, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget  # noqa: PLC0415

    smoke = load_script("smoke")
    size = (640, 480)
    blank = QImage(*size, QImage.Format.Format_RGB32)
    blank.fill(QColor("#efefef"))
    # random pixels in one corner (2.8% of the picture): enough bytes and colours to pass the
    # file-size and colour-count checks, and still a blank window
    rng = random.Random(0)
    for y in range(90):
        for x in range(96):
            blank.setPixel(x, y, QColor(rng.randrange(256), rng.randrange(256), rng.randrange(256)).rgb())
    blank_path = tmp_path / "blank.png"
    blank.save(str(blank_path))
    assert blank_path.stat().st_size > smoke.MIN_FILE_BYTES
    with pytest.raises(smoke.SmokeError, match="looks blank: one colour covers 97"):
        smoke.check_png(blank_path, size)
    tiny = tmp_path / "tiny.png"
    blank.copy(0, 0, 64, 48).save(str(tiny))
    with pytest.raises(smoke.SmokeError, match="expected at least"):
        smoke.check_png(tiny, (64, 48))

    window = QWidget()
    layout = QVBoxLayout(window)
    tree = QTreeWidget()
    tree.setHeaderLabels(["Name", "Type", "Parameters"])
    for i in range(40):
        QTreeWidgetItem(tree, [f"layer{i}", "Linear", f"{1000 + 37 * i:,}"])
    layout.addWidget(QLabel("Model { fc1: Linear {d_input: 3, d_output: 5, bias: true, params: 20} }"))
    layout.addWidget(tree)
    window.resize(*size)
    window.show()
    qapp.processEvents()
    shot = tmp_path / "window.png"
    assert window.grab().save(str(shot), "PNG")
    window.close()
    stats = smoke.check_png(shot, size)
    assert stats["colours"] >= smoke.MIN_COLOURS
    with pytest.raises(smoke.SmokeError, match="expected 800x600"):
        smoke.check_png(shot, (800, 600))
