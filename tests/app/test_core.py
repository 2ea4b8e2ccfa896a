"""app.core is the document's Qt-free core: it imports without Qt or the widgets, and its edits
replay a project's JSON on a model without a window."""
import subprocess
import sys
from pathlib import Path

from app.core import edits
from app.core.schema import GroupSpec, Project

ROOT = Path(__file__).resolve().parents[2]


def test_app_core_imports_without_qt_or_widgets():
    code = "import sys, app.core.schema, app.core.edits, app.core.opening, app.core.checkpoints, app.core.project; " \
           "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6', 'widgets')]; " \
           "assert not bad, bad"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_projects_edits_replay_without_a_window():
    from resources.examples import build_example

    project = Project.from_json({"format": 1, "source": {"kind": "example", "name": "spirals"}, "edits": [
        {"op": "freeze", "group": GroupSpec.subtree("fc1").to_json()},
        {"op": "lora", "rank": 2, "alpha": 4.0, "init_std": None, "group": {"kind": "regex", "pattern": r"^fc2\."},
         "qlora": None}]})
    model = edits.replay(build_example(project.source.name), project.edits)
    trainable = {p for p, v in model.named_params() if v.is_require_grad()}
    assert not any(p.startswith("fc1.") for p in trainable)
    assert {"fc2.weight.lora.a", "fc2.weight.lora.b"} <= trainable
    assert [edits.describe(e) for e in project.edits] == ["Freeze fc1", "Attach LoRA (rank 2, alpha 4) to /^fc2\\./"]
