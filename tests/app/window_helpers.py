"""What the app's tests do to a window again and again: wait for its tasks, open a file through
its own actions (the dialog answered)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

LLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama-gqa"


def wait_idle(qtbot, window, timeout=30_000):
    """Until the window runs no task (workers finished and their results shown)."""
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=timeout)


def open_onnx(qtbot, window, monkeypatch, path, close_report=False):
    """File ▸ Open ONNX… with the dialog answering `path`; `close_report` closes the import
    report (or refusal) the window shows after."""
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    window.actions.open_onnx.trigger()
    wait_idle(qtbot, window)
    if close_report:
        window.last_message.close()


def open_llama(qtbot, window, folders, timeout=60_000):
    """File ▸ Open Pretrained… on the tiny GQA Llama fixture (`folders`: the conftest's folder
    dialog answers)."""
    folders.append(LLAMA)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, timeout)
    assert window.document.module is not None
