"""500 seeded random UI actions (freeze, unfreeze, no grad, attach / detach LoRA, materialize,
undo, redo, select, display settings, expand, fork, transfer), then the tree, the status line,
the display and the inspector are checked against the engine model. Any exception in a Qt slot
fails the test (pytest-qt)."""
import random

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
