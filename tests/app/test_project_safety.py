"""Opening a project runs no code the user did not confirm (issue 18, items 10, 14, 15)."""
from __future__ import annotations

import json
import time

from PySide6.QtWidgets import QMessageBox


def _evil(tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "net.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef build():\n    raise SystemExit\n")
    return evil / "net.py", marker


def _project(tmp_path, source, edits=()):
    path = tmp_path / "p.ember.json"
    path.write_text(json.dumps({"format": 1, "application": "ember", "source": source, "edits": list(edits)}))
    return path


def test_a_traversing_or_absolute_example_name_runs_nothing(window, tmp_path):
    script, marker = _evil(tmp_path)
    for name in ["../" * 12 + str(script.with_suffix(""))[1:], str(script.with_suffix(""))]:
        before = window.document.module
        assert not window.projects.open_project(_project(tmp_path, {"kind": "example", "name": name}))
        assert "unknown example" in window.last_message.text()
        assert not marker.exists() and window.document.module is before


def test_a_script_source_runs_only_after_confirmation(window, tmp_path, monkeypatch):
    script, marker = _evil(tmp_path)
    asked = []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: asked.append(a) or QMessageBox.StandardButton.No)
    assert not window.projects.open_project(_project(tmp_path, {"kind": "script", "path": str(script)}))
    arch = {"kind": "checkpoint", "path": str(tmp_path / "w.bpk"), "architecture": {"kind": "script", "path": str(script)}}
    assert not window.projects.open_project(_project(tmp_path, arch))
    assert len(asked) == 2 and str(script) in asked[0][2]
    assert not marker.exists() and window.document.module is None


def test_a_malformed_project_is_an_error_naming_the_file(window, tmp_path):
    for text in ['{"format": 1, "source": {"kind": "example"}}', "[" * 100000, '{"format": 1' + "9" * 4400 + "}",
                 '{"format": 1, "source": {"kind": "example", "name": "spirals"}, "edits": ["freeze"]}']:
        path = tmp_path / "bad.ember.json"
        path.write_text(text)
        assert not window.projects.open_project(path)
        assert "bad.ember.json" in window.last_message.text() and window.document.module is None
    assert not window.projects.open_project(tmp_path / ("x" * 5000 + ".ember.json"))


def test_a_catastrophic_regex_in_a_project_opens_quickly(window, tmp_path):
    path = _project(tmp_path, {"kind": "example", "name": "burn-mnist"},
                    [{"op": "freeze", "group": {"kind": "regex", "pattern": "^(.*.*)*X$"}}])
    start = time.monotonic()
    assert window.projects.open_project(path)
    assert time.monotonic() - start < 10
