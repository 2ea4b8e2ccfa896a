"""The layering contract: engine imports no Qt, widgets or app; widgets import no app."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_linter_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout, result.stdout


def test_engine_imports_without_qt():
    code = "import sys, engine, engine.nn, engine.module, engine.store, engine.optim, engine.train; " \
           "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'widgets', 'app')]; " \
           "assert not bad, bad"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
