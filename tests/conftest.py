"""Test configuration: Qt offscreen, pyqtgraph on PySide6, fixtures from ../shared/fixtures."""
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("PYTEST_QT_API", "pyside6")
os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT.parent / "shared" / "fixtures"


def pytest_collection_modifyitems(config, items):
    """`long` tests (the thousands-of-cases runs of the kill and fuzz tests; their bounded versions
    run every time) are skipped, visibly, unless EMBER_LONG_TESTS=1: the suite stays within its
    10 minutes on 2 cores."""
    if os.environ.get("EMBER_LONG_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="a long kill/fuzz run: set EMBER_LONG_TESTS=1 to run it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"the shared fixtures are missing: expected them at {FIXTURES}")
    return FIXTURES


@pytest.fixture(autouse=True)
def _unsaved_work_discarded(monkeypatch):
    """The Save / Discard / Cancel question asked before unsaved work is replaced
    (`app.prompts.ask_save_discard`) never blocks a test: it answers Discard, as if the user had
    chosen to go on. Tests of the question replace `app.prompts.ask_question` themselves."""
    import sys

    prompts = sys.modules.get("app.prompts")
    if prompts is None:
        try:
            import app.prompts as prompts  # noqa: PLC0415
        except ImportError:
            yield
            return
    monkeypatch.setattr(prompts, "ask_question", lambda *a, **k: prompts.Button.Discard)
    yield


@pytest.fixture(autouse=True)
def _run_script_question_answered_yes(monkeypatch):
    """Opening a project that names a Python file asks before running it (`ProjectIO.confirm_script`,
    a modal QMessageBox.question): in tests the scripts are the tests' own, so the answer is Yes.
    Tests of the question (tests/app/test_project_safety.py) patch QMessageBox.question themselves."""
    from PySide6.QtWidgets import QMessageBox  # noqa: PLC0415

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    yield
