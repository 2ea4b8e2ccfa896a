"""Finished background tasks let go of what they made (issue 18, item 16): a checkpoint imported
again and again, with the undo history cleared each time, leaves no model and no open file behind."""
import gc
import os
import weakref

import pytest
from PySide6.QtWidgets import QDialogButtonBox


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_imported_models_are_released_once_delivered(opened, qtbot, tmp_path):
    from app.workers import BackgroundTask

    path = opened.document.module.into_record().save(tmp_path / "weights.bpk")
    doc = opened.document
    refs = []
    gc.collect()
    fds = open_fds()
    for _ in range(6):
        # what the user does: File ▸ Import Checkpoint…, the file, OK
        dialog = opened.checkpoints.ask_import()
        dialog.path.setText(str(path))
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
        task = opened.running_tasks[-1]
        assert isinstance(task, BackgroundTask)
        with qtbot.waitSignal(task.done, timeout=20000):
            pass
        qtbot.waitUntil(lambda: not opened.running_tasks, timeout=5000)
        assert doc.undo_stack.count() == 1 and doc.undo_stack.undoText() == "Load weights from weights.bpk"
        refs.append(weakref.ref(doc.module))
        doc.undo_stack.clear()  # nothing to undo back to: the models before this one are garbage
        del task, dialog
    qtbot.wait(50)  # deferred releases and deleteLater
    gc.collect()
    alive = [i for i, r in enumerate(refs[:-1]) if r() is not None]
    assert alive == [], f"imported models {alive} are still alive after their tasks were delivered"
    assert refs[-1]() is doc.module  # the document's own model, of course, stays
    assert open_fds() <= fds, "an import left a file descriptor open"


def test_a_second_import_replaces_a_running_one(opened, qtbot, tmp_path, monkeypatch):
    """Only the newest import delivers; the replaced one is cancelled, cut off and released."""
    import threading

    from app.core import checkpoints

    path = opened.document.module.into_record().save(tmp_path / "weights.bpk")
    gate = threading.Event()
    real = checkpoints.load

    def slow(module, p, partial, progress=None):
        gate.wait(10)
        return real(module, p, partial, progress)

    monkeypatch.setattr(checkpoints, "load", slow)
    first = opened.checkpoints.import_checkpoint(str(path), allow_partial=False)
    second = opened.checkpoints.import_checkpoint(str(path), allow_partial=False)
    assert first.is_cancel_requested() and not second.is_cancel_requested()
    gate.set()
    qtbot.waitUntil(lambda: not opened.running_tasks, timeout=20000)
    assert first.outcome == "cancelled" and second.outcome == "finished"
    assert opened.document.undo_stack.count() == 1  # one load, not two
    qtbot.wait(20)
    assert first.result is None and second.result is None  # released once delivered
