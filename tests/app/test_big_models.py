"""Big models in the window (issue 18, item 4): llama-7b's contract check is shape-only by
default and allocates nothing; a full check, QLoRA, Materialize or a Fork of initialized
weights that would not fit is refused with its estimate, and the model stays as it was; a lazy
model's Fork or Transfer allocates nothing and is never refused. The actions run under an
address-space limit, so a regression that allocates the 7 B model fails instead of filling memory."""
import re
import tracemalloc

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QDialogButtonBox

from app.core.schema import GroupSpec, LoraEdit

from engine.module import memory
from tests.limits import address_space_growth_limit


def _click_check(window, qtbot):
    ed = window.contract_editor
    qtbot.mouseClick(ed.check_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=20000)


def _allocated(model) -> int:
    return sum(p.is_initialized() for _, p in model.named_params())


def test_llama_check_is_shape_only_by_default_and_allocates_nothing(window, qtbot):
    assert window.open_example("llama-7b")
    ed = window.contract_editor
    assert ed.input.text() == "example"
    assert ed.shapes_only.isChecked()  # parameters not allocated: shapes only is the default
    _click_check(window, qtbot)  # its speed is measured by benchmarks/gui_open.py (no timed unit tests)
    tracemalloc.start()  # a second check, measured for memory (tracemalloc slows it down)
    try:
        _click_check(window, qtbot)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    r = window.document.check_result
    assert r is not None and r.ok and r.shape_only, ed.status.text()
    assert r.output_shapes == [(2, 8, 32000)]
    assert "✓ every contract held" in ed.status.text() and "shapes only" in ed.status.text()
    assert _allocated(window.document.module) == 0
    assert peak < 50e6, peak


def test_a_full_check_that_would_not_fit_is_refused_with_its_estimate(window, qtbot, monkeypatch):
    errors = []
    monkeypatch.setattr(window, "error", lambda title, text, details="": errors.append(text))
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * 10**9)  # a 4 GB machine
    assert window.open_example("llama-7b")
    ed = window.contract_editor
    qtbot.mouseClick(ed.shapes_only, Qt.MouseButton.LeftButton)  # untick: the full check
    assert not ed.shapes_only.isChecked()
    _click_check(window, qtbot)
    assert errors and "The full check needs about 27.1 GB" in errors[0], errors
    assert "parameters to allocate 27.0 GB" in errors[0] and "4.0 GB available; refused" in errors[0]
    assert "27.1 GB" in ed.status.text()
    assert window.document.check_result is None
    assert _allocated(window.document.module) == 0


def test_a_model_with_allocated_parameters_gets_the_full_check_by_default(opened, qtbot):
    assert not opened.contract_editor.shapes_only.isChecked()
    opened.contract_editor.input.setText("[2, 8]")
    _click_check(opened, qtbot)
    r = opened.document.check_result
    assert r.ok and not r.shape_only


# ---- QLoRA, Materialize, Fork / Transfer on llama-7b: the estimate first, a refusal when it does not fit ----

@pytest.fixture
def errors(window, monkeypatch):
    shown = []
    monkeypatch.setattr(window, "error", lambda title, text, details="": shown.append((title, text)))
    return shown


def _attach_qlora_through_the_dialog(window, qtbot):
    window.tree.select_path("")  # the whole model
    window.actions.attach_lora.trigger()
    dialog = window.dialog
    assert dialog is not None and dialog.isVisible()
    box = dialog.qlora
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))  # on the indicator
    assert dialog.qlora.isChecked()
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert ok.isEnabled(), dialog.errors()
    qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)


def test_qlora_on_llama_is_refused_with_its_estimate(window, qtbot, errors, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * 10**9)  # a 4 GB machine
    with address_space_growth_limit(3 << 30):
        assert window.open_example("llama-7b")
        before = window.document.module
        _attach_qlora_through_the_dialog(window, qtbot)  # timed by benchmarks/gui_open.py
    assert len(errors) == 1, errors
    title, text = errors[0]
    assert title == "Not enough memory"
    # the dialog starts on the family's preset (q_proj, v_proj: 64 weights), not every parameter
    assert text.startswith("Attach QLoRA (rank 8, alpha 16) to layers.0.self_attn.query.weight, "
                           "layers.0.self_attn.value.weight, "), text
    assert "layers.31.self_attn.value.weight: QLoRA needs about 5.2 GB (dense bases to initialize 4.3 GB, NF4 weights " \
           "553.9 MB, LoRA factors 16.8 MB, quantizer working arrays 342.3 MB), but this machine has 4.0 GB available; " \
           "refused" in text, text
    assert "5.2 GB" in window.message_label.text()
    assert window.document.module is before and window.document.undo_stack.count() == 0
    assert not window.running_tasks
    assert _allocated(before) == 0


def test_qlora_under_an_address_space_limit_is_refused_with_what_the_limit_leaves(window, qtbot, errors):
    """No figure injected: the window reads RLIMIT_AS itself (MemAvailable alone would be far more
    than the 3 GB the limit leaves)."""
    with address_space_growth_limit(3 << 30):
        assert window.open_example("llama-7b")
        _attach_qlora_through_the_dialog(window, qtbot)
        available = memory.available_memory()
    assert available <= 3 << 30
    assert len(errors) == 1 and "QLoRA needs about 5.2 GB" in errors[0][1], errors
    shown = re.search(r"but this machine has ([\d.]+) GB available; refused", errors[0][1])
    assert shown and 1.0 < float(shown.group(1)) <= 3.3, errors  # the limit's headroom, not MemAvailable
    assert window.document.undo_stack.count() == 0 and _allocated(window.document.module) == 0


def test_materialize_on_llama_with_lora_is_refused_with_its_estimate(window, qtbot, errors, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * 10**9)
    with address_space_growth_limit(3 << 30):
        assert window.open_example("llama-7b")
        assert window.apply_edit(LoraEdit(8, 16.0, group=GroupSpec("regex", pattern=r"^layers\.\d+\.self_attn\.")))
        with_lora = window.document.module
        assert window.actions.materialize.isEnabled()
        window.actions.materialize.trigger()
    assert len(errors) == 1, errors
    text = errors[0][1]
    assert "Materialize adapters: Materialize needs about 17.3 GB (lazy bases to initialize 8.6 GB, folded weights " \
           "8.6 GB, fold working arrays 134.2 MB), but this machine has 4.0 GB available; refused" in text, text
    assert window.document.module is with_lora and window.document.undo_stack.count() == 1
    assert not any(p.is_initialized() for path, p in with_lora.named_params() if ".lora." not in path)


def test_a_lazy_fork_or_transfer_of_llama_is_never_refused(window, qtbot, errors, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 10**6)  # 1 MB free: still fine, nothing is copied
    with address_space_growth_limit(3 << 30):
        assert window.open_example("llama-7b")
        window.group_op("freeze", "layers.0")
        window.device_selector.combo.setCurrentText("cpu:1")
        window.actions.fork.trigger()
        window.device_selector.combo.setCurrentText("cpu:2")
        window.actions.transfer.trigger()
    assert errors == []
    assert [str(d) for d in window.document.module.devices()] == ["cpu:2"]
    assert _allocated(window.document.module) == 0 and window.document.undo_stack.count() == 3


def test_a_fork_of_initialized_weights_that_would_not_fit_is_refused(window, qtbot, errors, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 100 * 10**6)  # 100 MB free
    with address_space_growth_limit(3 << 30):
        assert window.open_example("llama-7b")
        output = dict(window.document.module.named_params())["lm_head.weight"]
        output.val()  # the 32000 x 4096 head is allocated (524 MB): a fork would copy it
        before = window.document.module
        window.device_selector.combo.setCurrentText("cpu:1")
        window.actions.fork.trigger()
    assert len(errors) == 1, errors
    assert "Fork needs about 524.3 MB (copies of initialized parameters 524.3 MB), but this machine has 100.0 MB " \
           "available; refused" in errors[0][1], errors
    assert window.document.module is before and window.document.undo_stack.count() == 0
    assert _allocated(before) == 1


def test_an_edit_that_fits_shows_its_estimate_while_it_runs(window, qtbot, monkeypatch):
    from app.core import edits

    monkeypatch.setattr(edits, "HEAVY_EDIT_BYTES", 1000)  # the small model counts as big: a worker runs it
    monkeypatch.setattr(memory, "available_memory", lambda: 10**12)
    assert window.open_example("spirals")
    module = window.document.module
    for p in module.params():
        p.val()  # initialized: a fork copies them
    need = memory.estimate_move(module, "cpu:1").total
    assert need == 4 * module.num_params()
    window.device_selector.combo.setCurrentText("cpu:1")
    window.actions.fork.trigger()
    assert window.running_tasks
    assert f"Fork to cpu:1… (Fork needs about {memory.size_text(need)} (copies of initialized parameters " \
           f"{memory.size_text(need)}))" == window.message_label.text()
    qtbot.waitUntil(lambda: window.document.module is not module, timeout=10000)
    assert [str(d) for d in window.document.module.devices()] == ["cpu:1"]
