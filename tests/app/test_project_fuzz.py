"""Fuzzed project files opened in the window (issue 18, item 14 / must-show 4).

Real projects of several examples are saved from the window (freeze, LoRA, detach, a checkpoint
source, a contract, a training run, a design), then mutated with a seeded generator: keys
deleted, values of the wrong type, strings for objects, huge, negative and non-finite numbers,
integers of 4,400 digits, nesting 100,000 deep, very long names and paths, unicode (lone
surrogates, NUL, right-to-left marks), traversing and absolute example names, truncation, binary
garbage and duplicate keys. Each file is opened through the function File ▸ Open Project and
Recent Files use (`ProjectIO.open_path` / `open_project`), in one window. For every file: no
exception escapes (neither from the call nor from the Qt event loop), the window's own work for
it stays within a budget of calls (counted on the GUI thread; loads and replays on workers are
bounded by time only as a guard against a hang, far above the normal 0.2 s), and when it is refused the document (and the design) is exactly what it was and an error dialog
names the file and what was expected.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.core.schema import ExampleSource, GroupSpec, GroupEdit, LoraEdit, DetachEdit
from tests.app.window_helpers import wait_idle
from tests.work import counted_calls

N_FILES = 560
# a hang guard only (a busy machine must not fail the test): the longest file took 0.21 s on a
# 2-core machine under a load of 5, so 20 s is about 100x that
PER_FILE_S = 20.0
# the calls the GUI thread may make for one file (59,772 at most measured for a project, 25,623 for a
# design): a reader or replay that loops over what a file claims goes far past it
FILE_CALLS = 600_000
# what a refusal's message says besides naming the file: what was expected, or what failed and why
CLEAR = ("expected", "no such", "cannot", "unknown", "failed", "does not", "not a ")


# ---- the real projects the mutations start from -------------------------------------------------

def _train_one_epoch(qtbot, window):
    from tests.widgets.qt_helpers import type_into

    panel = window.training_panel
    window.tabs.setCurrentWidget(panel)
    type_into(qtbot, panel.training_form.field_widget("num_epochs"), "1")
    qtbot.mouseClick(panel.controls.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.active is None, timeout=60_000)
    assert panel.runs[-1].outcome.status == "finished", panel.last_error


def _saved_projects(window, qtbot, folder: Path) -> list[Path]:
    folder.mkdir()
    out = []

    def save(name):
        path = folder / f"{name}.ember.json"
        assert window.projects.save_to(path)
        out.append(path)

    assert window.open_example("spirals")
    assert window.apply_edit(GroupEdit("freeze", GroupSpec.subtree("")))
    assert window.apply_edit(GroupEdit("unfreeze", GroupSpec("regex", pattern=r"\.weight$")))
    path = next(p for p, _ in window.document.module.named_params())
    window.document.set_contract(path.rsplit(".", 1)[0], "[batch, d] -> [batch, e]")
    _train_one_epoch(qtbot, window)  # a run: its folder beside the project, once saved
    save("spirals")

    assert window.open_example("digits")
    assert window.apply_edit(LoraEdit(4, 8.0, group=GroupSpec("all")))
    assert window.apply_edit(GroupEdit("no_grad", GroupSpec("predicate", text="bias")))
    assert window.apply_edit(DetachEdit(GroupSpec.subtree("fc2")))
    save("digits")

    assert window.open_example("burn-mnist")
    assert window.apply_edit(GroupEdit("freeze", GroupSpec("regex", pattern=r"^conv\d\.")))
    assert window.apply_edit(GroupEdit("unfreeze", GroupSpec("paths", paths=("conv1.conv.weight", "fc1.weight"))))
    save("mnist")

    assert window.open_example("spirals")
    bpk = folder / "spirals-weights.bpk"
    window.document.module.into_record().save(bpk)
    window.projects._open_checkpoint_choice({"path": str(bpk), "allow_partial": False,
                                             "architecture": ExampleSource("spirals").to_json()})
    wait_idle(qtbot, window)
    assert window.apply_edit(GroupEdit("freeze", GroupSpec("path", path=next(
        p for p, _ in window.document.module.named_params()))))
    save("checkpoint")

    window.designer.load_sample("mnist")
    design = folder / "design.ember.json"
    assert window.designer.save(design) is not None
    out.append(design)
    return out


# ---- mutations ------------------------------------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000
BIG_INT = "9" * 4_400
NUMBERS = [10 ** 30, -1, -(10 ** 9), 0, 2.5, -0.5, 1e308, math.nan, math.inf, -math.inf, 2 ** 63, 2 ** 64 + 1]
TEXTS = ["", " ", "a" * 300, "n" * 5_000, "x" * 100_000, "ü名前🙂", "\u202egnp.live", "\ud800", "nul\x00byte",
         "../" * 12 + "tmp/evil/net", "/tmp/evil/net", "..\\..\\evil", "/dev/zero", "/proc/self/mem", ".", "..", "/",
         "C:\\Windows\\system32", "spirals ", "SPIRALS", "burn-mnist/../spirals", "~/net.py", "$HOME", "%s%n{0}",
         "(", "[a-", "^(.*?.*?)*(?!.)\\W", "(?{print(1)})", "__import__('os').system('true')"]
NAMES = ["spirals", "digits", "burn-mnist", "llama-7b-nope", "transformer", "../spirals", "/abs/spirals"]
OPS = ["freeze", "unfreeze", "no_grad", "lora", "materialize", "detach", "fork", "to_device", "load", "eval", "",
       "__class__"]


def _slots(data, where=()):
    """Every (container, key, where) of the JSON tree, the root's children first."""
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append((data, k, where + (k,)))
            out.extend(_slots(v, where + (k,)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.append((data, i, where + (i,)))
            out.extend(_slots(v, where + (i,)))
    return out


def _other_value(rng: random.Random, old):
    choices = [lambda: rng.choice(NUMBERS), lambda: rng.choice(TEXTS), lambda: None, lambda: rng.choice([True, False]),
               lambda: [], lambda: {}, lambda: [rng.choice(TEXTS)], lambda: {"kind": rng.choice(TEXTS)},
               lambda: {"op": rng.choice(OPS)}, lambda: rng.choice(NAMES), lambda: rng.choice(OPS)]
    if isinstance(old, dict):  # a string (or number) for an object
        choices += [lambda: json.dumps(old), lambda: rng.choice(TEXTS), lambda: 7]
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        choices += [lambda: str(old), lambda: -old, lambda: old * 10 ** 12, lambda: old + 0.5]
    return rng.choice(choices)()


def _tree_mutation(rng: random.Random, data) -> tuple[str, str]:
    """Mutate the parsed project in place (1 to 3 changes); returns (kind, text to write)."""
    kinds = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        slots = _slots(data)
        if not slots:
            break
        box, key, _where = rng.choice(slots)
        kind = rng.choice(["delete", "retype", "retype", "name", "op", "wrap"])
        if kind == "delete":
            del box[key]
        elif kind == "retype":
            box[key] = _other_value(rng, box[key])
        elif kind == "name":  # an example name, a path or a pattern replaced by a hostile text
            box[key] = rng.choice(TEXTS + NAMES)
        elif kind == "op":
            if isinstance(box[key], dict):
                box[key]["op" if rng.random() < 0.5 else "kind"] = rng.choice(OPS + ["example", "script", "checkpoint",
                                                                                     "design", "regex", "paths"])
            else:
                box[key] = rng.choice(OPS)
        else:  # nested a little deeper than expected
            box[key] = [box[key]] if rng.random() < 0.5 else {"value": box[key]}
        kinds.append(kind)
    return "+".join(kinds) or "none", json.dumps(data, allow_nan=True, ensure_ascii=rng.random() < 0.5)


def _text_mutation(rng: random.Random, text: str) -> tuple[str, str | bytes]:
    kind = rng.choice(["truncate", "garbage", "splice", "bigint", "deep", "duplicate", "bom", "utf16", "empty",
                       "toplevel"])
    if kind == "truncate":
        return kind, text[:rng.randrange(len(text))]
    if kind == "garbage":
        return kind, bytes(rng.randrange(256) for _ in range(rng.choice([1, 64, 4096])))
    if kind == "splice":  # garbage bytes inside a valid file
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return kind, bytes(data)
    if kind == "bigint":
        digits = [i for i, c in enumerate(text) if c.isdigit()]
        if digits:
            i = rng.choice(digits)
            return kind, text[:i] + BIG_INT + text[i + 1:]
        return kind, text.replace("{", "{\"n\": " + BIG_INT + ", ", 1)
    if kind == "deep":
        colons = [i for i, c in enumerate(text) if c == ":"]
        i = rng.choice(colons)
        return kind, text[:i + 1] + " " + DEEP + ", \"after\":" + text[i + 1:]
    if kind == "duplicate":  # the same key twice in an object: which one counts is ambiguous
        keys = [m for m in ("\"format\": ", "\"source\": ", "\"kind\": ", "\"name\": ", "\"op\": ", "\"edits\": ",
                            "\"path\": ", "\"pattern\": ") if m in text]
        key = rng.choice(keys)
        i = text.index(key)
        return kind, text[:i] + key + json.dumps(rng.choice(TEXTS + NAMES)) + ", " + text[i:]
    if kind == "bom":
        return kind, "\ufeff" + text
    if kind == "utf16":
        return kind, text.encode("utf-16")
    if kind == "empty":
        return kind, ""
    return kind, rng.choice(["[]", "null", "1", "\"project\"", "true", "[{}]", "{}", "{\"format\": 1}"])


def _mutants(bases: list[Path], folder: Path, n: int, seed: int = 18):
    """`n` mutated files beside the real projects (so that relative paths in them resolve)."""
    rng = random.Random(seed)
    texts = [p.read_text() for p in bases]
    for i in range(n):
        b = rng.randrange(len(bases))
        if rng.random() < 0.6:
            kind, content = _tree_mutation(rng, json.loads(texts[b]))
        else:
            kind, content = _text_mutation(rng, texts[b])
        path = folder / f"m{i:03d}-{bases[b].name}"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        yield path, f"{bases[b].name} {kind}"
    # paths that are not there, too long to be, or not files
    for i, p in enumerate([folder / ("x" * 5_000 + ".ember.json"), folder / "missing.ember.json", folder,
                           folder / ("y" * 255 + ".ember.json"), Path("/dev/null.ember.json")]):
        yield p, f"path {i}"


# ---- the document's state, compared before and after a refused open -------------------------------
def _state(window):
    doc = window.document
    return {"module": doc.module, "source": doc.source, "edits": list(doc.edits), "contracts": dict(doc.contracts),
            "runs": list(doc.runs), "project_path": doc.project_path, "dirty": doc.is_dirty(),
            "undo": doc.undo_stack.count(), "design": window.designer.design.to_dict(),
            "design_path": window.designer.path, "title": window.windowTitle()}


def _weights(module) -> bytes:
    return module.into_record().to_bytes() if module is not None else b""


def test_fuzzed_projects_open_or_are_refused_cleanly(window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(window, "maybe_discard", lambda *a, **k: True)  # no unsaved-work question between files
    bases = _saved_projects(window, qtbot, tmp_path / "real")
    assert len(bases) == 5
    for base in bases:  # the real projects open
        assert window.open_path(str(base)), window.last_message and window.last_message.text()
        wait_idle(qtbot, window)

    escaped, slow, changed, silent, opened, refused, longest, most = [], [], [], [], 0, 0, 0.0, 0
    start = time.monotonic()
    for i, (path, what) in enumerate(_mutants(bases, bases[0].parent, N_FILES)):
        before = _state(window)
        weights = _weights(before["module"]) if i % 10 == 0 else None  # the model's values, not only its identity
        shown = window.last_message
        with qtbot.captureExceptions() as exceptions:
            t0 = time.monotonic()
            try:
                with counted_calls() as calls:
                    (window.open_path if i % 2 else window.projects.open_project)(str(path))
                qtbot.waitUntil(lambda: not window.running_tasks, timeout=int(PER_FILE_S * 1000))
            except BaseException as e:  # noqa: BLE001 - counted, reported below
                escaped.append(f"{path.name} ({what}): {type(e).__name__}: {str(e)[:200]}")
            QApplication.processEvents()
            elapsed = time.monotonic() - t0
        escaped += [f"{path.name} ({what}): from the event loop: {e[0].__name__}: {str(e[1])[:200]}"
                    for e in exceptions]
        longest, most = max(longest, elapsed), max(most, calls.n)
        if elapsed > PER_FILE_S or calls.n > FILE_CALLS:
            slow.append(f"{path.name} ({what}): {elapsed:.1f} s, {calls.n} calls")
        after = _state(window)
        now_open = window.document.project_path is not None and window.document.module is not before["module"]
        design_opened = after["design_path"] != before["design_path"] or after["design"] != before["design"]
        if (now_open and Path(window.document.project_path) == path) or \
                (design_opened and window.designer.path == path):
            opened += 1
        else:
            refused += 1
            if after != before or weights is not None and _weights(after["module"]) != weights:
                diff = [k for k in before if before[k] != after[k]] or ["the model's values"]
                changed.append(f"{path.name} ({what}): {diff}")
            box = window.last_message
            text = box.text() if box is not None and box is not shown else ""
            if not any(word in text for word in CLEAR):
                silent.append(f"{path.name} ({what}): {text[:200]!r}")
            elif path.name[:40] not in text and str(path.name)[-30:] not in text:
                silent.append(f"{path.name} ({what}): does not name the file: {text[:200]!r}")
        if window.last_message is not None and window.last_message is not shown:
            window.last_message.done(0)
    total = time.monotonic() - start
    print(f"\n{N_FILES + 5} fuzzed project files in {total:.1f} s (the longest {longest:.2f} s, the most calls "
          f"{most}): {opened} opened, {refused} refused")
    faults = [f"{len(escaped)} escaped:", *escaped[:30],
              f"{len(slow)} took over {PER_FILE_S} s or {FILE_CALLS} calls:", *slow[:30],
              f"{len(changed)} refusals changed the document:", *changed[:30],
              f"{len(silent)} refusals without a clear message:", *silent[:30]]
    assert not (escaped or slow or changed or silent), "\n".join(f[:300] for f in faults)
    assert refused >= N_FILES // 2 and opened >= 20


# ---- designs, opened in the designer panel ---------------------------------------------------------
N_DESIGNS = 320

SCHEMA_1 = {"ember_design": 1, "name": "Tiny", "nodes": {
    "x": {"type": "Input", "params": {"shape": ["batch", 4]}, "x": 0, "y": 0},
    "fc": {"type": "Linear", "params": {"d_input": 4, "d_output": 2}, "x": 0, "y": 90},
    "x2": {"type": "Input", "params": {"shape": ["batch", 2]}, "x": 200, "y": 90},
    "sum": {"type": "Add", "params": {}, "x": 0, "y": 180},
    "out": {"type": "Output", "params": {}, "x": 0, "y": 270}},
    "links": [["x", "fc"], ["fc", "sum"], ["x2", "sum", "in1"], ["sum", "out"]]}


def _designer_state(panel):
    return {"design": panel.design.to_dict(), "path": panel.path, "dirty": panel.is_dirty(),
            "undo": panel.undo_stack.count()}


def test_fuzzed_designs_open_in_the_designer_or_are_refused_cleanly(window, qtbot, tmp_path, monkeypatch):
    from engine.design import SAMPLES, save_design

    panel = window.designer
    monkeypatch.setattr(panel, "confirm_discard", lambda *a, **k: True)  # no unsaved-design question between files
    folder = tmp_path / "designs"
    folder.mkdir()
    bases = [save_design(make(), folder / f"{name}.ember.json") for name, make in SAMPLES.items()]
    bare = folder / "tiny.ember.json"
    bare.write_text(json.dumps(SCHEMA_1))
    bases.append(bare)
    for base in bases:
        assert panel.open_design(base), panel.status.text()

    escaped, slow, changed, silent, opened, longest, most = [], [], [], [], 0, 0.0, 0
    start = time.monotonic()
    for i, (path, what) in enumerate(_mutants(bases, folder, N_DESIGNS, seed=4)):
        before = _designer_state(panel)
        panel.status.setText("")
        with qtbot.captureExceptions() as exceptions:
            t0 = time.monotonic()
            try:
                with counted_calls() as calls:
                    ok = panel.open_design(path)
            except BaseException as e:  # noqa: BLE001 - counted, reported below
                escaped.append(f"{path.name} ({what}): {type(e).__name__}: {str(e)[:200]}")
                ok = None
            QApplication.processEvents()
            elapsed = time.monotonic() - t0
        escaped += [f"{path.name} ({what}): from the event loop: {e[0].__name__}: {str(e[1])[:200]}"
                    for e in exceptions]
        longest, most = max(longest, elapsed), max(most, calls.n)
        if elapsed > PER_FILE_S or calls.n > FILE_CALLS:
            slow.append(f"{path.name} ({what}): {elapsed:.1f} s, {calls.n} calls")
        if ok:
            opened += 1
            assert panel.path == path
            continue
        if _designer_state(panel) != before:
            changed.append(f"{path.name} ({what})")
        text = panel.status.text()
        if not any(word in text for word in CLEAR + ("must", "names", "is not", "twice")) or path.name[:40] not in text and \
                path.name[-30:] not in text:
            silent.append(f"{path.name} ({what}): {text[:200]!r}")
    total = time.monotonic() - start
    print(f"\n{N_DESIGNS + 5} fuzzed design files in {total:.1f} s (the longest {longest:.2f} s, the most calls "
          f"{most}): {opened} opened")
    faults = [f"{len(escaped)} escaped:", *escaped[:30],
              f"{len(slow)} took over {PER_FILE_S} s or {FILE_CALLS} calls:", *slow[:30],
              f"{len(changed)} refusals changed the design:", *changed[:30],
              f"{len(silent)} refusals without a clear message:", *silent[:30]]
    assert not (escaped or slow or changed or silent), "\n".join(f[:300] for f in faults)
    assert opened >= 5
