"""500 seeded random UI actions (freeze, unfreeze, no grad, attach / detach LoRA, materialize,
undo, redo, select, display settings, expand, fork, transfer), then the tree, the status line,
the display and the inspector are checked against the engine model. Any exception in a Qt slot
fails the test (pytest-qt).

Then 2,000 more over four seeds on the spirals example (marked slow; `make test` runs it): they
add training start/stop (short runs), contract edits, project save and reopen, checkpoint
import and LoRA attach/detach, and undo back to the start must give back the model the history
began with exactly (record bytes, every parameter's values and trainability, the contracts)."""
import random

import pytest

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from engine.module import DisplaySettings
from engine.module.lora import NF4Weight
from engine.module.reparam import iter_param_slots
from engine.module.summary import trainable_summary
from tests.widgets.qt_helpers import click_box, type_into
from engine.module.tree import find, join, params as tree_params
from widgets.module_tree import tree_children
from widgets.module_tree import DEVICE, NAME, PARAMS, TRAINABLE

N_ACTIONS = 500


def engine_counts(module):
    """Per tree path: (elements, trainable elements, float tensors, trainable float tensors,
    devices, reparameterized), counted straight from the engine's parameter slots."""
    out = {}
    for path, p in iter_param_slots(module, skip=lambda m: isinstance(m, NF4Weight)):
        parts = path.split(".")
        prefixes = [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for pre in prefixes:
            c = out.setdefault(pre, [0, 0, 0, 0, set(), 0])
            c[0] += p.numel()
            if p.kind == "float":
                c[2] += 1
                if p.is_active():
                    c[1] += p.numel()
                    c[3] += 1
            c[4].add(str(p.lazy_device()))
            if p.reparameterization is not None:
                c[5] += 1
    return out


def check_consistent(window):
    doc = window.document
    module = doc.module
    tree = window.tree
    model = tree.model
    assert model.module is module
    counts = engine_counts(module)
    assert window.summary_label.text() == trainable_summary(module)
    for node in model.fetched_nodes():
        found = find(module, node.path)
        assert found is not None, node.path
        assert found[1] is node.value, node.path
        if ".nf4" in node.path or node.path.endswith("nf4"):
            continue  # packed storage: counted by the base it stands for
        index = model.createIndex(node.row, NAME, node)
        numel, train, floats, train_floats, devices, reparam = counts.get(node.path, [0, 0, 0, 0, set(), 0])
        assert index.siblingAtColumn(PARAMS).data() == f"{numel:,}", node.path
        state = index.siblingAtColumn(TRAINABLE).data(Qt.ItemDataRole.CheckStateRole)
        if floats == 0:
            assert state is None, node.path
        elif train_floats == floats:
            assert state == Qt.CheckState.Checked, node.path
        elif train_floats == 0:
            assert state == Qt.CheckState.Unchecked, node.path
        else:
            assert state == Qt.CheckState.PartiallyChecked, node.path
        assert set(filter(None, index.siblingAtColumn(DEVICE).data().split(", "))) == devices, node.path
        assert (index.data(Qt.ItemDataRole.DecorationRole) is not None) == (reparam > 0), node.path
    selected = tree.selected_path() or ""
    value = find(module, selected)[1]
    if hasattr(value, "format"):
        assert window.display.display_text() == value.format(window.display.settings())
    rows = [r[0] for r in window.inspector.rows()]
    assert rows == [p for p, _ in tree_params(find(module, selected)[1], selected)][:len(rows)]


def test_500_random_actions_keep_the_tree_consistent(opened, qtbot):
    rng = random.Random(1234)
    w = opened
    doc = w.document
    display = w.display
    counts = {}
    happened = {"lora": 0, "lora_refused": 0, "detach": 0}

    def all_paths():
        return [p for p, _ in _walk(doc.module)]

    def select():
        w.tree.select_path(rng.choice(all_paths()))

    def group(op):
        def act():
            select()
            getattr(w.actions, op).trigger()
        return act

    def checkbox():
        path = rng.choice(all_paths())
        index = w.tree.model.index_of(path).siblingAtColumn(TRAINABLE)
        if index.flags() & Qt.ItemFlag.ItemIsUserCheckable:
            state = index.data(Qt.ItemDataRole.CheckStateRole)
            w.tree.model.setData(index, Qt.CheckState.Unchecked if state == Qt.CheckState.Checked
                                 else Qt.CheckState.Checked, Qt.ItemDataRole.CheckStateRole)

    def lora():
        w.actions.attach_lora.trigger()
        d = w.dialog
        type_into(qtbot, d.rank, str(rng.choice([1, 2, 4, 0])))
        type_into(qtbot, d.alpha, rng.choice(["8", "0.5", "x"]))
        if rng.random() < 0.2:
            click_box(qtbot, d.qlora)
            type_into(qtbot, d.block_size, rng.choice(["8", "16", "3"]))
        ok = d.buttons.button(QDialogButtonBox.StandardButton.Ok)
        if ok.isEnabled():
            ok.click()
            happened["lora"] += 1
        else:
            assert d.errors(), "a disabled OK must say why"
            happened["lora_refused"] += 1
            d.reject()

    def detach():
        if w.actions.detach_lora.isEnabled():
            w.actions.detach_lora.trigger()
            happened["detach"] += 1

    def materialize():
        if w.actions.materialize.isEnabled():
            w.actions.materialize.trigger()

    def undo():
        qtbot.keyClick(w, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)

    def redo():
        qtbot.keyClick(w, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)

    def display_setting():
        box = rng.choice([display.show_all, display.new_line, display.num_params, display.param_ids, None])
        if box is None:
            display.indent.setValue(rng.randint(-1, 4))
        else:
            click_box(qtbot, box)

    def move(fork):
        def act():
            w.device_selector.combo.setCurrentText(rng.choice(["cpu", "cpu:1", "cpu:2", "cpu:3"]))
            qtbot.mouseClick(w.device_selector.fork_button if fork else w.device_selector.transfer_button,
                             Qt.MouseButton.LeftButton)
        return act

    def expand():
        w.tree.depth_spin.setValue(rng.randint(0, 5))

    actions = [(select, 6), (group("freeze"), 4), (group("unfreeze"), 4), (group("no_grad"), 2), (checkbox, 4),
               (lora, 3), (detach, 2), (materialize, 1), (undo, 5), (redo, 4), (display_setting, 3),
               (move(True), 2), (move(False), 1), (expand, 2)]
    fns, weights = zip(*actions)
    for i in range(N_ACTIONS):
        k = rng.choices(range(len(fns)), weights)[0]
        counts[k] = counts.get(k, 0) + 1
        fn = fns[k]
        fn()
        if i % 10 == 9:
            check_consistent(w)
    check_consistent(w)
    assert doc.undo_stack.count() > 20
    assert sorted(counts) == list(range(len(actions)))  # every kind of action ran
    assert happened["lora"] > 0 and happened["lora_refused"] > 0 and happened["detach"] > 0
    assert isinstance(w.display.settings(), DisplaySettings)


def _walk(module):
    stack = [("", module)]
    while stack:
        path, value = stack.pop()
        yield path, value
        for seg, _k, v in tree_children(value):
            stack.append((join(path, seg), v))


def test_the_consistency_check_catches_a_stale_tree(opened):
    import pytest

    check_consistent(opened)
    opened.document.module = opened.document.module.freeze()  # behind the window's back: no signal
    with pytest.raises(AssertionError):
        check_consistent(opened)


# ---- 2,000 actions over four seeds, with training, contracts, projects and checkpoints --------------
SEEDS = (11, 22, 33, 44)
ACTIONS_PER_SEED = 500  # 2,000 in all


def snapshot(module):
    """Everything that must come back: the record's bytes (values, ids, dtypes, layout) and every
    parameter's values and trainability."""
    params = {path: (p.val().numpy().copy(), p.is_active(), p.kind) for path, p in module.named_params()}
    return module.into_record().to_bytes(), params


def assert_same_model(module, snap):
    data, params = snap
    now = {path: (p.val().numpy(), p.is_active(), p.kind) for path, p in module.named_params()}
    assert sorted(now) == sorted(params)
    for path, (values, active, kind) in params.items():
        v, a, k = now[path]
        assert (a, k) == (active, kind), path
        assert v.dtype == values.dtype and v.shape == values.shape and (v == values).all(), path
    assert module.into_record().to_bytes() == data


def close_message(w):
    from shiboken6 import isValid

    box = w.last_message
    if box is not None and isValid(box) and box.isVisible():
        box.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_random_actions_with_training_projects_and_checkpoints_undo_back_to_the_start(
        window, qtbot, tmp_path, monkeypatch, seed):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # training runs stay in the test's folder
    rng = random.Random(seed)
    w = window
    assert w.open_example("spirals")
    doc = w.document
    panel = w.training_panel
    weights = doc.module.into_record().save(tmp_path / "start.bpk")
    project = tmp_path / "p.ember.json"
    start = {"snap": snapshot(doc.module), "contracts": dict(doc.contracts)}
    happened = {k: 0 for k in ("train", "stop", "contract", "reopen", "import", "lora", "detach")}

    def paths():
        return [p for p, _ in _walk(doc.module)]

    def select():
        w.tree.select_path(rng.choice(paths()))

    def group(op):
        def act():
            select()
            getattr(w.actions, op).trigger()
        return act

    def lora():
        select()
        w.actions.attach_lora.trigger()
        d = w.dialog
        if d is None:
            return
        type_into(qtbot, d.rank, str(rng.choice([1, 2, 4])))
        type_into(qtbot, d.alpha, "8")
        ok = d.buttons.button(QDialogButtonBox.StandardButton.Ok)
        if ok.isEnabled():
            ok.click()
            happened["lora"] += 1
        else:
            d.reject()

    def detach():
        select()
        if w.actions.detach_lora.isEnabled():
            w.actions.detach_lora.trigger()
            happened["detach"] += 1

    def undo():
        w.actions.undo.trigger()

    def redo():
        w.actions.redo.trigger()

    def contract():
        select()
        editor = w.contract_editor
        if not editor.edit.isEnabled():
            return
        if rng.random() < 0.3 and editor.reset_button.isEnabled():
            qtbot.mouseClick(editor.reset_button, Qt.MouseButton.LeftButton)
        else:
            editor.edit.setText(rng.choice(["[batch, 2] -> [batch, n]", "[b, d] -> [b, d]", "[batch, 2] ->", "x"]))
            if editor.apply_button.isEnabled():
                qtbot.mouseClick(editor.apply_button, Qt.MouseButton.LeftButton)
        happened["contract"] += 1

    def train():
        stop = rng.random() < 0.4
        run = panel.start(max_steps=rng.randint(2, 4) if not stop else 10_000)
        if run is None:
            return
        happened["train"] += 1
        if stop:
            qtbot.waitUntil(lambda: panel.active is None or len(panel.runs[-1].history.steps) > 0, timeout=30000)
            if panel.controls.stop_button.isEnabled():
                qtbot.mouseClick(panel.controls.stop_button, Qt.MouseButton.LeftButton)
                happened["stop"] += 1
        assert panel.wait(60)
        qtbot.waitUntil(lambda: not w.running_tasks, timeout=30000)

    def import_checkpoint():
        task = w.checkpoints.import_checkpoint(str(weights), allow_partial=rng.random() < 0.5)
        with qtbot.waitSignal(task.done, timeout=30000):
            pass
        qtbot.waitUntil(lambda: not w.running_tasks, timeout=30000)
        happened["import"] += 1

    def save_and_reopen():
        assert w.projects.save_to(project)
        saved = {path: (p.shape, p.is_active()) for path, p in doc.module.named_params()}
        contracts = dict(doc.contracts)
        assert w.projects.open_project(project)
        qtbot.waitUntil(lambda: not w.running_tasks, timeout=60000)
        assert {path: (p.shape, p.is_active()) for path, p in doc.module.named_params()} == saved
        assert doc.contracts == contracts and doc.undo_stack.count() == 0
        # the reopened project is the new start: its history begins here
        start["snap"], start["contracts"] = snapshot(doc.module), dict(doc.contracts)
        happened["reopen"] += 1

    actions = [(select, 5), (group("freeze"), 4), (group("unfreeze"), 4), (group("no_grad"), 1), (lora, 3),
               (detach, 3), (undo, 5), (redo, 3), (contract, 3), (train, 0.4), (import_checkpoint, 0.6),
               (save_and_reopen, 0.3)]
    fns, weights_ = zip(*actions)
    for i in range(ACTIONS_PER_SEED):
        rng.choices(fns, weights_)[0]()
        close_message(w)  # a refused import or LoRA says so in a window-modal box
        if i % 25 == 24:
            check_consistent(w)
    check_consistent(w)
    assert happened["train"] and happened["contract"] and happened["import"] and happened["lora"]
    # undo back to the start: the model is the one the history began with, exactly
    for _ in range(doc.undo_stack.count()):
        w.actions.undo.trigger()  # Edit ▸ Undo (Ctrl+Z would undo the text of a focused field)
    assert not doc.undo_stack.canUndo()
    assert_same_model(doc.module, start["snap"])
    assert doc.contracts == start["contracts"]
    check_consistent(w)
