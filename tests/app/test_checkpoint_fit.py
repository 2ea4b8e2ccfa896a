"""A checkpoint that fits nothing is refused, even with Allow partial ticked (issue 18, item 13)."""
import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QMessageBox


def test_import_with_allow_partial_refuses_a_checkpoint_that_matches_nothing(opened, qtbot, tmp_path):
    from engine.store import ModuleRecord, TensorEntry

    hf = ModuleRecord([TensorEntry.from_array(f"model.layers.{i}.mlp.up_proj.weight", np.ones((4, 4), np.float32))
                       for i in range(4)])
    path = hf.save(tmp_path / "model.safetensors")
    before = opened.document.module
    dialog = opened.checkpoints.ask_import()
    qtbot.keyClicks(dialog.path, str(path))
    if not dialog.allow_partial.isChecked():
        qtbot.mouseClick(dialog.allow_partial, Qt.MouseButton.LeftButton)
    assert dialog.allow_partial.isChecked()
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    task = opened.running_tasks[0]
    with qtbot.waitSignal(task.done, timeout=20000):
        pass
    doc = opened.document
    assert doc.module is before and doc.undo_stack.count() == 0  # nothing loaded, nothing to undo
    box = opened.last_message
    assert box.icon() == QMessageBox.Icon.Critical and box.windowTitle() == "Checkpoint not loaded"
    text = box.text()
    assert str(path) in text and "no tensor of the record fits" in text
    assert "blocks.0." in text  # what the model expects
    assert "model.layers.0.mlp.up_proj.weight [4, 4]" in text  # what the file holds
    assert "missing" in box.detailedText()
