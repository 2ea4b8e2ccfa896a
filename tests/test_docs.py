"""The documentation stays true: the engine guide's examples run, the user guide's pictures and
commands exist, the changelog covers the released version.

Each ```python block of docs/engine-guide.md is a complete program. It runs here on its own, in
a fresh namespace, compiled under the guide's own file name and line numbers, so a failure
points at the line of the guide (and `assert_shape` quotes the guide's source in its message,
as it would quote yours).
"""
from __future__ import annotations

import ast
import re
import struct
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ENGINE_GUIDE = DOCS / "engine-guide.md"
USER_GUIDE = DOCS / "user-guide.md"
CHANGELOG = DOCS / "CHANGELOG.md"

FENCE = re.compile(r"^```(\w*)\s*$")


def code_blocks(path: Path, language: str = "python") -> list[tuple[int, str]]:
    """(first line number, code) of every fenced block in `language`."""
    blocks, current, start, lang = [], None, 0, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if current is None and m and m.group(1):
            current, start, lang = [], number + 1, m.group(1)
        elif current is not None and line.strip() == "```":
            if lang == language:
                blocks.append((start, "\n".join(current) + "\n"))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, f"{path}: a code block opened at line {start - 1} is never closed"
    return blocks


def headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("## ")]


GUIDE_BLOCKS = code_blocks(ENGINE_GUIDE) if ENGINE_GUIDE.is_file() else []


# ------------------------------------------------------------------------------ engine guide
def test_code_block_parser_finds_blocks_and_their_lines(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n```python\na = 1\n```\ntext\n```sh\nls\n```\n```python\nb = 2\nc = 3\n```\n")
    assert code_blocks(doc) == [(3, "a = 1\n"), (10, "b = 2\nc = 3\n")]
    assert code_blocks(doc, "sh") == [(7, "ls\n")]


def test_engine_guide_covers_every_concept():
    wanted = ["Devices and tensors", "Autodiff", "Modules and parameters", "Lazy initialization",
              "Display", "to_device", "Training and validation", "Freezing and parameter groups",
              "Visitors and mappers", "Shape contracts", "Records", "Optimizers", "LoRA and QLoRA"]
    found = headings(ENGINE_GUIDE)
    missing = [w for w in wanted if not any(w in h for h in found)]
    assert not missing, f"engine-guide.md has no section for {missing}; sections: {found}"
    # every section shows code that runs
    text = ENGINE_GUIDE.read_text(encoding="utf-8")
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0]
        assert "```python" in section, f"section {title!r} has no runnable example"


def test_every_example_checks_what_it_claims():
    assert len(GUIDE_BLOCKS) >= 13
    for line, code in GUIDE_BLOCKS:
        tree = ast.parse(code)  # also: every block is valid Python on its own
        asserts = [n for n in ast.walk(tree) if isinstance(n, (ast.Assert, ast.Raise))]
        assert asserts, f"engine-guide.md:{line}: the example asserts nothing"


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Run an example in a scratch folder, and undo the global switches it may flip."""
    from engine.module import shape  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)
    debug = shape.debug_assertions_enabled()
    yield tmp_path
    shape.set_debug_assertions(debug)


@pytest.mark.parametrize("line,code", GUIDE_BLOCKS, ids=[f"line{line}" for line, _ in GUIDE_BLOCKS])
def test_engine_guide_example_runs(line, code, isolated):
    # pad with blank lines so that tracebacks and assert_shape messages point into the guide
    compiled = compile("\n" * (line - 1) + code, str(ENGINE_GUIDE), "exec")
    namespace = {"__name__": "__engine_guide__"}
    exec(compiled, namespace)  # noqa: S102 (the project's own documentation)


def test_a_failing_example_is_reported_at_its_line_in_the_guide():
    line, _ = GUIDE_BLOCKS[0]
    compiled = compile("\n" * (line + 1) + "assert 1 == 2, 'boom'\n", str(ENGINE_GUIDE), "exec")
    with pytest.raises(AssertionError, match="boom") as info:
        exec(compiled, {})  # noqa: S102
    assert info.traceback[-1].lineno + 1 == line + 2
    assert Path(info.traceback[-1].path) == ENGINE_GUIDE


# ------------------------------------------------------------------------------ user guide
def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG file"
    assert data[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", data[16:24])


def test_user_guide_pictures_exist_and_are_screenshots():
    text = USER_GUIDE.read_text(encoding="utf-8")
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(pictures) >= 7, f"expected a screenshot for each task, found {pictures}"
    for ref in pictures:
        path = (USER_GUIDE.parent / ref).resolve()
        assert path.is_file(), f"user-guide.md shows {ref}, which does not exist (run docs/make_screenshots.py)"
        width, height = _png_size(path)
        assert width >= 600 and height >= 400, f"{ref}: {width}x{height} is too small for a window"
        assert path.stat().st_size > 20_000, f"{ref}: {path.stat().st_size} bytes looks blank"


def test_user_guide_mentions_every_task():
    text = USER_GUIDE.read_text(encoding="utf-8").lower()
    for task in ("open", "freeze", "lora", "contract", "train", "design", "export"):
        assert re.search(rf"^## .*{task}", text, re.M), f"user-guide.md: no section on {task!r}"


def test_screenshot_script_uses_only_flags_the_app_accepts(monkeypatch):
    """Every command line in docs/make_screenshots.py parses with the app's own parser."""
    import importlib.util  # noqa: PLC0415

    from app.__main__ import parse_args  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("make_screenshots", DOCS / "make_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_screenshots", module)  # dataclasses look the module up
    spec.loader.exec_module(module)
    shots = module.planned_shots(Path("/nonexistent-project-folder"))
    assert len(shots) >= 7
    names = [s.name for s in shots]
    assert len(set(names)) == len(names)
    for shot in shots:
        assert shot.name.startswith("guide-") and shot.name.endswith(".png")
        args = parse_args(shot.argv(Path("/tmp/x.png")))  # argparse exits on an unknown flag
        assert args.screenshot == "/tmp/x.png"


# ------------------------------------------------------------------------------ changelog
def test_changelog_has_the_current_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    text = CHANGELOG.read_text(encoding="utf-8")
    assert re.search(rf"^## \[?{re.escape(version)}\]?", text, re.M), \
        f"CHANGELOG.md has no section for version {version} (pyproject.toml)"


def test_user_guide_shortcuts_are_the_apps(qapp):
    """Every key combination in the guide's shortcut table is bound to an action of the app."""
    from PySide6.QtWidgets import QWidget  # noqa: PLC0415

    from app.actions import Actions  # noqa: PLC0415

    host = QWidget()
    try:
        bound = {seq.toString() for action in Actions(host).all() for seq in action.shortcuts()}
    finally:
        host.deleteLater()
    text = USER_GUIDE.read_text(encoding="utf-8")
    table = text[text.index("## Keyboard shortcuts"):]
    keys = re.findall(r"\b((?:(?:Ctrl|Shift|Alt)\+)+(?:[A-Z0-9]\b|Right|Left)|F\d+)\b", table)
    assert len(keys) >= 20, keys
    missing = sorted(set(keys) - bound)
    assert not missing, f"user-guide.md lists shortcuts the app does not have: {missing}"


README = ROOT / "README.md"
README_BLOCKS = code_blocks(README)


def test_readme_has_the_scripting_example():
    assert README_BLOCKS, "README.md should show how to script the engine in a python block"


@pytest.mark.parametrize("line,code", README_BLOCKS, ids=[f"line{line}" for line, _ in README_BLOCKS])
def test_readme_example_runs(line, code, isolated):
    compiled = compile("\n" * (line - 1) + code, str(README), "exec")
    namespace = {"__name__": "__readme__"}
    exec(compiled, namespace)  # noqa: S102 (the project's own documentation)
    # what the example claims, checked here so the README stays free of test scaffolding
    assert (isolated / "model.bpk").is_file()
    tuned = namespace["tuned"]
    from engine.module import trainable_counts  # noqa: PLC0415

    counts = trainable_counts(tuned)
    assert counts.trainable == (784 * 8 + 8 * 256) + (256 * 8 + 8 * 10)  # only the LoRA factors
    restored, model = namespace["restored"], namespace["model"]
    x = namespace["x"]
    assert (restored.forward(x) - model.forward(x)).abs().max().item() == 0.0
