"""What the compiled kernels (engine/tensor/cpu/jit.py, numba) cost to get ready (issue 22).

Three fresh processes, each with numba's cache in one new folder:
1. the first `jit.kernels()` on a machine: compile every kernel and write the cache;
2. the same call in a later process: load them from the cache;
3. the app's case: a Qt event loop ticking every 10 ms while `jit.warm_up()` compiles on its
   thread from an empty cache, then again loading from that cache; the table gives the longest
   gap between two ticks (how long the GUI thread waited at worst) against the same loop with
   nothing else running.

    .venv/bin/python benchmarks/jit_compile.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import machine_line, print_table  # noqa: E402

READY = """
import json, time
t0 = time.perf_counter()
from engine.tensor.cpu import jit
t1 = time.perf_counter()
k = jit.kernels()
print(json.dumps({"import_s": t1 - t0, "ready_s": time.perf_counter() - t1, "reason": jit.unavailable_reason()}))
"""

GUI = """
import json, os, sys, time
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from engine.tensor.cpu import jit
app = QApplication([])
ticks = []
timer = QTimer(); timer.setInterval(10); timer.timeout.connect(lambda: ticks.append(time.perf_counter())); timer.start()
def gaps(seconds):
    ticks.clear(); end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.001)
    return max(b - a for a, b in zip(ticks, ticks[1:]))
idle = gaps(1.0)
t0 = time.perf_counter(); th = jit.warm_up()
ticks.clear()
while th.is_alive():
    app.processEvents(); time.sleep(0.001)
busy = max(b - a for a, b in zip(ticks, ticks[1:])) if len(ticks) > 1 else float("nan")
print(json.dumps({"idle_gap_s": idle, "busy_gap_s": busy, "compile_s": time.perf_counter() - t0}))
"""


def run(code: str, cache: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ember-jit-cache-") as cache:
        first = run(READY, cache)
        if first["reason"]:
            print(f"compiled kernels unavailable: {first['reason']}")
            return
        cached = run(READY, cache)
    with tempfile.TemporaryDirectory(prefix="ember-jit-cache-") as cache:
        gui = run(GUI, cache)
        gui_cached = run(GUI, cache)
    ms = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731
    rows = [
        ["first use on a machine (compile, write the cache)", ms(first["ready_s"]), f"engine import {ms(first['import_s'])}"],
        ["a later process (load from the cache)", ms(cached["ready_s"]), f"engine import {ms(cached['import_s'])}"],
        ["app: warm_up() on its thread, longest GUI timer gap", ms(gui["busy_gap_s"]),
         f"idle loop {ms(gui['idle_gap_s'])}; compile took {ms(gui['compile_s'])}"],
        ["app: the same from the cache, longest GUI timer gap", ms(gui_cached["busy_gap_s"]),
         f"idle loop {ms(gui_cached['idle_gap_s'])}; loading took {ms(gui_cached['compile_s'])}"],
    ]
    print_table(f"Compiled kernels: time to get ready ({machine_line()})", ["case", "time", "beside"], rows)


if __name__ == "__main__":
    main()
