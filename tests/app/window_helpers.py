"""What the app's tests do to a window again and again: wait for its tasks, open a file through
its own actions (the dialog answered)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
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


@contextmanager
def xvfb_display(size: str = "1920x1200x24"):
    """A fresh Xvfb display for a child process's real window: its name (":N"), or None when Xvfb is
    not installed or did not start; stopped on leaving."""
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        yield None
        return
    number = next(n for n in range(120, 200) if not Path(f"/tmp/.X{n}-lock").exists()
                  and not Path(f"/tmp/.X11-unix/X{n}").exists())
    proc = subprocess.Popen([xvfb, f":{number}", "-screen", "0", size, "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    socket = Path(f"/tmp/.X11-unix/X{number}")
    deadline = time.monotonic() + 10
    while not socket.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    try:
        yield f":{number}" if proc.poll() is None and socket.exists() else None
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def display_env(display: str | None, env: dict | None = None) -> dict:
    """`env` (default: this process's) for a child whose window goes to `display` (Xvfb's), or
    offscreen when there is none."""
    env = dict(os.environ if env is None else env, PYQTGRAPH_QT_LIB="PySide6")
    if display is not None:
        env.update(DISPLAY=display, QT_QPA_PLATFORM="xcb")
        env.pop("WAYLAND_DISPLAY", None)
    else:
        env["QT_QPA_PLATFORM"] = "offscreen"
    return env
