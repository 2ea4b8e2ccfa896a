"""How fast the window shows a big model, and what opening it costs in memory.

Two models: the 6.7 B-parameter lazy Llama example and a generated model of about 10,000
modules. For each: the time from handing the model to the document until the module tree has
painted (targets: under 1 s and under 2 s), until the whole window has painted (the display
panel renders the model's text), the resident memory the opening added, and how many
parameters got initialized (should be none). Then the moves: the 6.7 B model after three edits
(freeze a block, no_grad the head, LoRA on one projection) forked and transferred through the
window's own Fork / Transfer (targets: under 1 s, under 50 MB, no parameter initialized, the
original in the undo history included). Last, the memory estimate and refusal of QLoRA and
Materialize on the 6.7 B model posing as a 4 GB machine (target: under 0.3 s, refused, nothing
initialized). And the shape-only contract check of the 6.7 B model (under 1 s, under 50 MB,
nothing initialized): the unit tests check what it computes and allocates, not its time.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui_open.py
"""
from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.core.schema import ExampleSource, GroupSpec, LoraEdit  # noqa: E402
from benchmarks._common import rss_mib  # noqa: E402


def generated_model(n_blocks: int = 1000):
    """`n_blocks` blocks of 4 Linear layers, a LayerNorm, a Relu and a Dropout (about 10 modules
    each, with the lists): about 10,000 modules, all parameters lazy."""
    from engine import nn
    from engine.module import Module

    class Block(Module):
        def __init__(self, d):
            self.layers = [nn.LinearConfig(d, d).init() for _ in range(4)]
            self.norm = nn.LayerNormConfig(d).init()
            self.extra = [nn.LinearConfig(d, d).init() for _ in range(2)]
            self.activation = nn.Relu()
            self.dropout = nn.DropoutConfig(0.1).init()

    class Generated(Module):
        def __init__(self, n):
            self.blocks = [Block(16) for _ in range(n)]

    return Generated(n_blocks)


def measure(app, window, name: str, make, target: float) -> dict:
    from engine.module.summary import ModelStats  # noqa: F401  (imported before timing)

    gc.collect()
    t0 = time.perf_counter()
    model = make()
    build_s = time.perf_counter() - t0
    n_modules = sum(1 for _ in model.named_modules())
    n_params = model.num_params()
    gc.collect()
    rss0 = rss_mib()
    t0 = time.perf_counter()
    window.document.set_model(model, ExampleSource(name))
    window.tree.select_path("")
    window.tree.view.viewport().repaint()
    tree_s = time.perf_counter() - t0
    app.processEvents()
    window.display.display_text()
    window.repaint()
    app.processEvents()
    window_s = time.perf_counter() - t0
    rss1 = rss_mib()
    initialized = sum(1 for _, p in model.named_params() if p.is_initialized())
    rows = sum(1 for _ in window.tree.model.fetched_nodes())
    return {"model": name, "modules": n_modules, "params": n_params, "build_s": build_s, "tree_s": tree_s,
            "window_s": window_s, "target_s": target, "rss_mib": rss1 - rss0, "initialized": initialized,
            "rows": rows}


def measure_moves(app, window) -> list[dict]:
    """Fork, then Transfer, of the edited 7 B model, each as the window's action does it."""
    from resources.examples import build_example

    window.document.set_model(build_example("llama-7b"), ExampleSource("llama-7b"))
    app.processEvents()
    window.group_op("freeze", "layers.0")
    window.group_op("no_grad", "lm_head")
    window.apply_edit(LoraEdit(8, 16.0, group=GroupSpec("regex", pattern=r"^layers\.31\.self_attn\.query\.")))
    app.processEvents()
    rows = []
    for name, device, fork in (("fork to cpu:1", "cpu:1", True), ("transfer to cpu:2", "cpu:2", False)):
        gc.collect()
        rss0 = rss_mib()
        t0 = time.perf_counter()
        window.move_to(device, fork=fork)
        while window.running_tasks:  # a move that copies runs on a worker; wait for it
            app.processEvents()
        app.processEvents()
        seconds = time.perf_counter() - t0
        rss = rss_mib() - rss0
        history = [window.document.undo_stack.command(i) for i in range(window.document.undo_stack.count())]
        modules = [window.document.module] + [getattr(c, "before", None) for c in history]
        initialized = len({p.id for m in modules if m is not None for path, p in m.named_params()
                           if p.is_initialized() and ".lora." not in path})
        rows.append({"move": name, "s": seconds, "rss_mib": rss, "initialized": initialized,
                     "devices": ",".join(str(d) for d in window.document.module.devices())})
    return rows


def measure_refusals(app, window) -> list[dict]:
    """The memory estimate and the refusal of actions that would not fit, through the window's
    own actions, posing as a 4 GB machine (`memory.available_memory` replaced): QLoRA on every
    weight of the 7 B model (the LoRA dialog answered with QLoRA ticked), and Materialize after
    LoRA on its attention projections. Nothing may be allocated (the head excepted: none here)."""
    from PySide6.QtWidgets import QDialogButtonBox

    from engine.module import memory
    from resources.examples import build_example

    real, shown = memory.available_memory, []
    real_error = window.error
    memory.available_memory = lambda: 4 * 10**9
    window.error = lambda title, text, details="": shown.append(text)
    rows = []
    try:
        window.document.set_model(build_example("llama-7b"), ExampleSource("llama-7b"))
        app.processEvents()

        def qlora():
            window.actions.attach_lora.trigger()
            dialog = window.dialog
            dialog.qlora.setChecked(True)
            dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()

        def materialize():
            window.apply_edit(LoraEdit(8, 16.0, group=GroupSpec("regex", pattern=r"^layers\.\d+\.(attention|self_attn)\.")))
            app.processEvents()
            t0 = time.perf_counter()
            window.actions.materialize.trigger()
            return time.perf_counter() - t0

        for name, action in (("QLoRA, all weights", qlora), ("Materialize (LoRA on attention)", materialize)):
            before = len(shown)
            gc.collect()
            t0 = time.perf_counter()
            timed = action()
            seconds = timed if timed is not None else time.perf_counter() - t0
            app.processEvents()
            initialized = sum(1 for path, p in window.document.module.named_params()
                              if p.is_initialized() and ".lora." not in path)
            refused = len(shown) > before and "refused" in shown[-1]
            rows.append({"action": name, "s": seconds, "refused": refused, "initialized": initialized,
                         "message": shown[-1] if refused else ""})
    finally:
        memory.available_memory = real
        window.error = real_error
    return rows


def measure_shape_check() -> list[dict]:
    """The shape-only contract check of the 6.7 B model on its example input (batch 2, 8 tokens):
    time (best of 3, untraced), the peak of traced allocation in a separate traced run, and the
    parameters it initialized (target: under 1 s, under 50 MB, none)."""
    import tracemalloc

    from engine.design.shape_check import check_shapes
    from engine.module import contracts
    from resources.examples import build_example, llama_7b

    model = build_example("llama-7b")
    x = llama_7b.example_input(2)
    mods = list(model.named_modules())
    wanted = {p: t for p, t in ((p, contracts.docstring_contract(m)) for p, m in mods) if t}
    best = float("inf")
    for _ in range(3):
        gc.collect()
        t0 = time.perf_counter()
        result = check_shapes(model, [x], wanted, mods)
        best = min(best, time.perf_counter() - t0)
    tracemalloc.start()
    try:
        check_shapes(model, [x], wanted, mods)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    initialized = sum(p.is_initialized() for _, p in model.named_params())
    return [{"check": "llama-7b shape-only", "s": best, "peak_mb": peak / 1e6, "initialized": initialized,
             "ok": result.ok and result.shape_only, "contracts": len(wanted)}]


def main() -> int:
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from resources.examples import build_example

    app = QApplication.instance() or QApplication([])
    window = MainWindow(settings=Settings.at(Path(tempfile.mkdtemp()) / "s.ini"))
    window.resize(1400, 860)
    window.show()
    app.processEvents()
    # warm up Qt and the code paths on a small model, so the first case pays no one-time costs
    measure(app, window, "warmup", lambda: build_example("spirals"), 1.0)
    results = [
        measure(app, window, "llama-7b (lazy)", lambda: build_example("llama-7b"), 1.0),
        measure(app, window, "generated 10k modules", generated_model, 2.0),
    ]
    print(f"{'model':24} {'modules':>8} {'parameters':>15} {'build s':>8} {'tree s':>7} {'target':>7} "
          f"{'window s':>9} {'RSS +MiB':>9} {'init':>5} {'rows':>5}")
    ok = True
    for r in results:
        met = r["tree_s"] < r["target_s"]
        ok &= met
        print(f"{r['model']:24} {r['modules']:>8,} {r['params']:>15,} {r['build_s']:>8.3f} {r['tree_s']:>7.3f} "
              f"{'<' + format(r['target_s'], 'g') + (' ok' if met else ' NO'):>7} {r['window_s']:>9.3f} "
              f"{r['rss_mib']:>9.1f} {r['initialized']:>5} {r['rows']:>5}")
    print("tree s: set_model until the tree has painted; window s: until the display text and the whole "
          "window have painted; RSS +MiB: resident memory added by opening (model built before); init: "
          "parameters initialized by opening (lazy ones must stay lazy); rows: tree rows created.")
    print()
    print("Moving the 6.7 B model after three edits (freeze layers.0, no_grad lm_head, LoRA on one projection)")
    print(f"{'move':20} {'seconds':>8} {'target':>7} {'RSS +MiB':>9} {'target':>7} {'init':>5} {'devices':>8}")
    for r in measure_moves(app, window):
        met = r["s"] < 1.0 and r["rss_mib"] < 50 and r["initialized"] == 0
        ok &= met
        print(f"{r['move']:20} {r['s']:>8.3f} {'<1':>7} {r['rss_mib']:>9.1f} {'<50':>7} {r['initialized']:>5} "
              f"{r['devices']:>8} {'ok' if met else 'NO'}")
    print("seconds: the action until the document shows the moved model; RSS +MiB: resident memory it "
          "added; init: parameters (not LoRA factors) initialized in the document or its undo history.")
    print()
    print("Memory estimate and refusal on the 6.7 B model, posing as a 4 GB machine")
    print(f"{'action':32} {'seconds':>8} {'target':>7} {'refused':>8} {'init':>5}")
    for r in measure_refusals(app, window):
        met = r["s"] < 0.3 and r["refused"] and r["initialized"] == 0
        ok &= met
        print(f"{r['action']:32} {r['s']:>8.3f} {'<0.3':>7} {'yes' if r['refused'] else 'NO':>8} "
              f"{r['initialized']:>5} {'ok' if met else 'NO'}")
        print(f"    {r['message']}")
    print("seconds: the action (the dialog's OK for QLoRA) until the refusal is shown: the estimate, a walk "
          "of the tree, and the check against the available memory; init: parameters initialized.")
    print()
    print("Shape-only contract check of the 6.7 B model (example input [2, 8] token ids)")
    print(f"{'check':24} {'seconds':>8} {'target':>7} {'peak MB':>8} {'target':>7} {'init':>5} {'contracts':>9}")
    for r in measure_shape_check():
        met = r["s"] < 1.0 and r["peak_mb"] < 50 and r["initialized"] == 0 and r["ok"]
        ok &= met
        print(f"{r['check']:24} {r['s']:>8.3f} {'<1':>7} {r['peak_mb']:>8.1f} {'<50':>7} {r['initialized']:>5} "
              f"{r['contracts']:>9} {'ok' if met else 'NO'}")
    print("seconds: best of 3 untraced runs; peak MB: tracemalloc's peak in a separate run; init: parameters "
          "initialized (the check runs no kernel and reads no weight).")
    window.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
