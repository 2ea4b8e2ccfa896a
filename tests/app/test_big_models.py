"""Big models in the window (issue 18, item 4): llama-7b's contract check is shape-only by
default and allocates nothing; a full check that would not fit is refused with its estimate."""
import time
import tracemalloc

from PySide6.QtCore import Qt

from engine.design import shape_check


def _click_check(window, qtbot):
    ed = window.contract_editor
    qtbot.mouseClick(ed.check_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=20000)


def _allocated(model) -> int:
    return sum(p.is_initialized() for _, p in model.named_params())


def test_llama_check_is_shape_only_by_default_fast_and_allocates_nothing(window, qtbot):
    assert window.open_example("llama-7b")
    ed = window.contract_editor
    assert ed.input.text() == "example"
    assert ed.shapes_only.isChecked()  # parameters not allocated: shapes only is the default
    t0 = time.perf_counter()
    _click_check(window, qtbot)
    elapsed = time.perf_counter() - t0
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
    assert elapsed < 1.0, elapsed
    assert peak < 50e6, peak


def test_a_full_check_that_would_not_fit_is_refused_with_its_estimate(window, qtbot, monkeypatch):
    errors = []
    monkeypatch.setattr(window, "error", lambda title, text, details="": errors.append(text))
    monkeypatch.setattr(shape_check, "available_memory", lambda: 4 * 10**9)  # a 4 GB machine
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
