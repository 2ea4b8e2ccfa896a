"""Fork and Transfer in the window (issue 16, defect 5): a lazy model moves without allocating,
one ParamId shows one value in the document and in the undo history, and a move that copies a
lot runs on a worker thread."""
from __future__ import annotations


import numpy as np
import pytest

from app.core import edits
from app.core.schema import GroupSpec, LoraEdit, MoveEdit
from tests.limits import address_space_growth_limit


def test_fork_and_transfer_of_the_edited_7b_model_allocate_nothing(window, qtbot):
    with address_space_growth_limit(3 << 30):
        _fork_and_transfer_the_edited_7b_model(window)


def _fork_and_transfer_the_edited_7b_model(window):
    assert window.open_example("llama-7b")
    window.group_op("freeze", "layers.0")
    window.group_op("no_grad", "lm_head")
    window.apply_edit(LoraEdit(4, 8.0, group=GroupSpec("regex", pattern=r"^layers\.31\.self_attn\.query\.")))
    assert window.move_to("cpu:1", fork=True)
    assert not window.running_tasks  # nothing to copy: done at once, on this thread
    forked = window.document.module
    assert [str(d) for d in forked.devices()] == ["cpu:1"]
    assert window.move_to("cpu:2", fork=False)
    moved = window.document.module
    assert [str(d) for d in moved.devices()] == ["cpu:2"]
    big = [p for p in moved.params() if p.numel() > 10**6]
    assert big and not any(p.is_initialized() for p in big)
    assert window.document.undo_stack.count() == 5


def test_one_id_one_value_across_the_document_and_its_history(window, qtbot):
    assert window.open_example("burn-book")  # lazy parameters
    before = window.document.module
    assert window.move_to("cpu:1", fork=True)
    after = window.document.module
    window.document.undo_stack.undo()  # the user looks at the original first
    assert window.document.module is before
    for (path, p), (_, q) in zip(before.named_params(), after.named_params()):
        assert p.id == q.id
        np.testing.assert_array_equal(p.val().numpy(), q.val().numpy(), err_msg=path)


def test_a_move_that_copies_a_lot_runs_on_a_worker_thread(window, qtbot, monkeypatch):
    monkeypatch.setattr(edits, "HEAVY_EDIT_BYTES", 1000)  # the small test model counts as big
    assert window.open_example("spirals")
    module = window.document.module
    for p in module.params():
        p.val()  # initialized: a move copies
    assert edits.edit_cost_bytes(module, MoveEdit("cpu:1", fork=True)) > 1000
    assert window.move_to("cpu:1", fork=True)
    assert window.document.module is module  # not yet: the copy runs on a worker
    assert window.running_tasks
    qtbot.waitUntil(lambda: window.document.module is not module, timeout=10000)
    assert [str(d) for d in window.document.module.devices()] == ["cpu:1"]
    assert window.document.undo_stack.count() == 1


def test_a_background_move_is_dropped_when_the_model_changed_meanwhile(window, qtbot, monkeypatch):
    monkeypatch.setattr(edits, "HEAVY_EDIT_BYTES", 1000)
    assert window.open_example("spirals")
    module = window.document.module
    for p in module.params():
        p.val()
    gate = __import__("threading").Event()
    real = edits.apply_edit
    monkeypatch.setattr(edits, "apply_edit", lambda m, e: (gate.wait(5), real(m, e))[1])
    assert window.move_to("cpu:1", fork=True)
    monkeypatch.setattr(edits, "HEAVY_EDIT_BYTES", 1 << 40)
    window.group_op("freeze", "")  # the user edits on while the move runs
    edited = window.document.module
    gate.set()
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=10000)
    assert window.document.module is edited
    assert "dropped" in window.message_label.text()


@pytest.mark.parametrize("fork", [True, False])
def test_the_toolbar_actions_move_the_model(window, qtbot, fork):
    assert window.open_example("spirals")
    window.device_selector.combo.setCurrentText("cpu:1")
    device = window.device_selector.device()
    assert device == "cpu:1"
    (window.actions.fork if fork else window.actions.transfer).trigger()
    assert [str(d) for d in window.document.module.devices()] == [device]
