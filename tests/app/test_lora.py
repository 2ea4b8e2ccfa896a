"""LoRA in the window: attach through the dialog, see it in the tree and the status line,
detach (undo), materialize, export the adapters only."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QFileDialog

from app.core.schema import QLoraSettings
from engine.module.summary import trainable_summary
from tests.widgets.qt_helpers import click_box, type_into
from widgets.module_tree import TRAINABLE


def attach(qtbot, window, rank="4", alpha="8", pattern=None, qlora=False):
    qtbot.keyClick(window, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    d = window.dialog
    type_into(qtbot, d.rank, rank)
    type_into(qtbot, d.alpha, alpha)
    if pattern is not None:
        d.group.mode.setCurrentIndex(d.group.mode.findData("regex"))
        type_into(qtbot, d.group.pattern, pattern)
    if qlora:
        click_box(qtbot, d.qlora)
        type_into(qtbot, d.block_size, "16")
    button = d.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert button.isEnabled(), d.errors()
    button.click()
    return d


def reparameterized(module):
    return sorted(p for p, v in module.named_params() if v.reparameterization is not None or ".lora." in p)


def test_attach_lora_through_the_dialog(opened, qtbot):
    opened.tree.select_path("blocks")
    d = attach(qtbot, opened)
    doc = opened.document
    m = doc.module
    # the dialog opened on the selection: only the blocks' weights
    assert d.edit()["group"] == {"kind": "regex", "pattern": r"^blocks(\.|$)"}
    assert [p for p, v in m.named_params() if p.endswith((".lora.a", ".lora.b"))] == [
        "blocks.0.linear.weight.lora.a", "blocks.0.linear.weight.lora.b",
        "blocks.1.linear.weight.lora.a", "blocks.1.linear.weight.lora.b"]
    assert opened.summary_label.text() == trainable_summary(m)
    assert opened.summary_label.text().startswith("trainable params: 224 ||")
    model = opened.tree.model
    assert model.index_of("blocks.0.linear.weight").data(Qt.ItemDataRole.DecorationRole) is not None
    assert model.index_of("head").data(Qt.ItemDataRole.DecorationRole) is None
    lora = model.index_of("blocks.0.linear.weight.lora")
    assert lora.data() == "lora" and lora.siblingAtColumn(1).data() == "LoraAdapter"
    assert model.index_of("head").siblingAtColumn(TRAINABLE).data(Qt.ItemDataRole.CheckStateRole) == \
        Qt.CheckState.Unchecked  # LoRA freezes every base parameter
    assert doc.undo_stack.undoText().startswith("Attach LoRA (rank 4, alpha 8) to blocks")
    assert opened.actions.materialize.isEnabled() and opened.actions.detach_lora.isEnabled()


def test_detach_is_an_edit_that_keeps_every_later_change(opened, qtbot):
    """Issue 18, item 5: detaching removes the adapters and nothing else (an unfreeze made after
    the attachment stays), is one undo step, and replays from the project's edits."""
    attach(qtbot, opened)
    attached = opened.document.module
    opened.group_op("unfreeze", "head")
    opened.tree.select_path("")
    qtbot.keyClick(opened, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    m = opened.document.module
    assert reparameterized(m) == []
    assert m.head.weight.is_require_grad()  # the later unfreeze is kept
    assert opened.document.edits[-1].to_json() == {"op": "detach", "group": {"kind": "all"}}
    assert opened.document.undo_stack.undoText() == "Detach LoRA from all parameters"
    assert not opened.actions.detach_lora.isEnabled()
    opened.actions.undo.trigger()
    assert reparameterized(opened.document.module) != [] and opened.document.module is not attached


def test_lora_on_a_second_layer_while_the_first_has_one(opened, qtbot):
    attach(qtbot, opened, pattern=r"^blocks\.0\.")
    attach(qtbot, opened, pattern=r"^head\.")
    m = opened.document.module
    assert m.blocks[0].linear.weight.reparameterization is not None and m.head.weight.reparameterization is not None
    qtbot.keyClick(opened, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    d = opened.dialog
    d.group.mode.setCurrentIndex(d.group.mode.findData("regex"))
    type_into(qtbot, d.group.pattern, r"^head\.")
    assert not d.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    assert "already have LoRA" in " ".join(d.errors())
    d.reject()


def test_materialize_folds_the_adapters(opened, qtbot):
    attach(qtbot, opened)
    opened.actions.materialize.trigger()
    m = opened.document.module
    assert reparameterized(m) == []
    assert opened.tree.model.index_of("blocks.0.linear.weight").data(Qt.ItemDataRole.DecorationRole) is None
    assert not opened.actions.materialize.isEnabled()
    assert opened.document.edits[-1].to_json() == {"op": "materialize"}


def test_qlora_attach_and_counts(opened, qtbot):
    attach(qtbot, opened, pattern=r"^head\.", qlora=True)
    m = opened.document.module
    assert type(m.head.weight.reparameterization).__name__ == "QLoraAdapter"
    assert opened.summary_label.text() == trainable_summary(m)
    assert opened.document.edits[-1].qlora == QLoraSettings(block_size=16, double_quant=True)


def test_export_adapters_only(opened, qtbot, tmp_path, monkeypatch):
    from engine.store import ModuleRecord

    assert not opened.actions.export_adapters.isEnabled()
    attach(qtbot, opened)
    out = tmp_path / "adapters.bpk"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    opened.actions.export_adapters.trigger()
    task = opened.running_tasks[0]
    with qtbot.waitSignal(task.done, timeout=20000):
        pass
    assert task.outcome == "finished", task.result
    names = ModuleRecord.load(out).names()
    assert sorted(names) == sorted(p for p, _ in opened.document.module.named_params() if ".lora." in p)


def test_attaching_twice_is_refused_in_the_dialog(opened, qtbot):
    attach(qtbot, opened)
    qtbot.keyClick(opened, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    d = opened.dialog
    assert "do not nest" in d.group.error.error()
    assert not d.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
