"""Autosave and crash recovery: a designer process killed with SIGKILL while editing leaves its
edits behind, and the next session's recovery API finds them."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.designer_panel import DesignerPanel

ROOT = Path(__file__).resolve().parents[2]

EDITOR = r"""
import sys, time
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.designer_panel import DesignerPanel
panel = DesignerPanel(autosave_dir=sys.argv[1], autosave_ms=50)
panel.load_sample("residual")
panel.canvas.select(["head"])
panel.add_node("Relu", "head_activation")
panel.set_field("norm", "epsilon", 0.001)
panel.rename_node("head", "classifier")
deadline = time.time() + 60
while not panel.autosave_file().exists() or panel._autosaved != panel.design.to_dict():
    app.processEvents()
    time.sleep(0.02)
    if time.time() > deadline:
        sys.exit("no autosave within 60 s")
print("READY", flush=True)
while True:  # still editing when the kill comes
    app.processEvents()
    time.sleep(0.05)
"""


def test_a_killed_editor_leaves_recoverable_edits(qtbot, tmp_path):
    autosave = tmp_path / "autosave"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", EDITOR, str(autosave)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        line = ""
        while time.time() < deadline:
            line = proc.stdout.readline()
            if line.strip() == "READY" or proc.poll() is not None:
                break
        assert line.strip() == "READY", proc.stderr.read() if proc.poll() is not None else "no READY"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    panel = DesignerPanel(autosave_dir=autosave, autosave_ms=60_000)
    qtbot.addWidget(panel)
    found = panel.recoverable()
    assert len(found) == 1
    assert found[0].original is None and "an unsaved design" in found[0].describe()
    assert panel.recover(found[0])
    d = panel.design
    assert "classifier" in d and "head" not in d
    assert d.source_of("head_activation", "input") == ("classifier", "output")
    assert d.config("norm")["epsilon"] == 0.001
    assert panel.is_dirty()  # recovered edits are unsaved edits
    assert not found[0].path.exists()  # the copy was taken over by this session
    assert panel.recoverable() == []
    panel.shutdown()


def test_a_clean_session_leaves_nothing_to_recover(qtbot, tmp_path):
    panel = DesignerPanel(autosave_dir=tmp_path, autosave_ms=60_000)
    qtbot.addWidget(panel)
    panel.load_sample("mnist")
    assert panel.autosave() and panel.autosave_file().exists()
    assert not panel.autosave()  # nothing changed since the last copy
    record = json.loads(panel.autosave_file().read_text())
    assert record["pid"] == os.getpid() and record["source"]["kind"] == "design"
    panel.save(tmp_path / "m.ember.json")
    assert not panel.autosave_file().exists()  # saved: the copy goes
    panel.set_field("fc1", "bias", False)
    assert panel.autosave()
    panel.undo_stack.undo()  # back to the saved state: nothing unsaved, nothing to keep
    panel.shutdown()
    assert not panel.autosave_file().exists()
