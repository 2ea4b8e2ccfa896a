"""Issue 48, item 8: save dialogs start in the folder last saved to, not the open model's folder;
Import Checkpoint on a folder says what it expects, and takes a training checkpoint's folder."""
from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QDialogButtonBox, QFileDialog

from widgets.checkpoint_dialog import CheckpointDialog


def test_a_save_starts_where_the_last_save_went_not_in_the_opened_models_folder(window, tmp_path, monkeypatch):
    saves, models = tmp_path / "saves", tmp_path / "models"
    saves.mkdir()
    models.mkdir()
    starts: list[str] = []
    assert window.open_example("spirals")
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        lambda _p, _t, start, _f: (starts.append(start), (str(saves / "one.ember.json"), ""))[1])
    window.actions.save_project_as.trigger()
    assert (saves / "one.ember.json").is_file()
    # a model opened from its own folder (the open dialog answers a file there)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(models / "other.ember.json"), ""))
    window.actions.open_project.trigger()  # the file does not exist: refused, the folder remembered
    assert window.settings.last_folder() == str(models)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda _p, _t, start, _f: (starts.append(start), ("", ""))[1])
    window.actions.save_project_as.trigger()
    window.designer.action_save_as.trigger()
    assert starts[1:] == [str(saves), str(saves)]


def arrays(module) -> dict:
    return {path: p.val().numpy() for path, p in module.named_params()}


def _import_dialog(window) -> CheckpointDialog:
    window.actions.import_checkpoint.trigger()
    dialog = window.dialog
    assert isinstance(dialog, CheckpointDialog)
    return dialog


def _ok(dialog) -> None:
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()


def test_import_checkpoint_on_a_training_checkpoint_folder_loads_its_model(window, qtbot, tmp_path):
    assert window.open_example("spirals")
    trained = window.document.module.into_record()
    folder = tmp_path / "epoch-3"
    folder.mkdir()
    trained.save(folder / "model.bpk")
    (folder / "optimizer.bpk").write_bytes(b"the optimizer's state")
    assert window.open_example("spirals")  # fresh weights
    fresh = arrays(window.document.module)
    assert any(not np.array_equal(fresh[p], v) for p, v in arrays(window.document.module.load_record(trained)).items())
    before = window.document.undo_stack.count()
    dialog = _import_dialog(window)
    dialog.path.setText(str(folder))
    _ok(dialog)
    assert not dialog.isVisible() and dialog.path_error.error() in (None, "")
    qtbot.waitUntil(lambda: window.document.undo_stack.count() == before + 1, timeout=30_000)
    loaded = arrays(window.document.module)
    for path, value in arrays(window.document.module.load_record(trained)).items():
        assert np.array_equal(loaded[path], value), path


def test_import_checkpoint_on_another_folder_says_what_is_expected(window, tmp_path):
    assert window.open_example("spirals")
    empty, peft, several = tmp_path / "empty", tmp_path / "adapter", tmp_path / "several"
    for folder in (empty, peft, several):
        folder.mkdir()
    (peft / "adapter_config.json").write_text("{}")
    (several / "a.bpk").write_bytes(b"")
    (several / "b.safetensors").write_bytes(b"")
    expected = {empty: ["holding no .bpk or .safetensors file", "expected a checkpoint file (.bpk"],
                peft: ["PEFT adapter folder", "expected a checkpoint file"],
                several: ["2 checkpoint files (a.bpk, b.safetensors)", "choose one"]}
    dialog = _import_dialog(window)
    for folder, parts in expected.items():
        dialog.path.setText(str(folder))
        _ok(dialog)
        shown = dialog.path_error.error() or ""
        assert dialog.isVisible() and "no such file" not in shown, shown
        assert str(folder) in shown and all(p in shown for p in parts), shown
    dialog.reject()
