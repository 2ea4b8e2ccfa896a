"""Generate and Train on a 7 B folder in the window (issue 43, item 12): each is refused before it
starts with the estimate and what the machine has, as an edit or an export that would not fit
(Generate ran 28 s into a MemoryError before); nothing is read, the window and the document stay
as they were. Under an address-space limit, so a regression that starts allocating the model
fails instead of filling memory (the wait for a worker stays inside the limit)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from engine.module import memory
from tests.app.window_helpers import wait_idle
from tests.engine.models.test_big_model_refusals import GIB, llama_7b_folder
from tests.limits import address_space_growth_limit


def _open(qtbot, window, folders, folder):
    folders.append(folder)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window)
    assert window.document.source.path == str(folder.resolve())


def _initialized(model) -> int:
    return sum(p.is_initialized() for _, p in model.named_params())


def test_generate_on_a_7b_folder_is_refused_with_its_estimate(window, qtbot, folders, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 8 * GIB)  # an 8 GiB machine
    folder = llama_7b_folder(tmp_path / "llama-2-7b")
    panel = window.generate_panel
    v = panel.view
    with address_space_growth_limit(3 * GIB):
        _open(qtbot, window, folders, folder)
        model = window.document.module
        window.tabs.setCurrentWidget(panel)
        v.prompt.setPlainText("the cat")
        v.max_new_tokens.setValue(16)
        qtbot.mouseClick(v.generate_button, Qt.MouseButton.LeftButton)
        started = panel.is_running()
        assert panel.wait(120)
    assert not started and not window.running_tasks
    text = v.error.error()
    assert text.startswith("Not enough memory: Generation needs about 28.0 GB (parameters to initialize 27.0 GB"), text
    assert "but this machine has 8.6 GB available; refused. Nothing was generated" in text, text
    assert window.isVisible() and window.document.module is model and _initialized(model) == 0
    assert v.generate_button.isEnabled()  # a smaller setting or another model can still run


def test_train_on_a_7b_folder_is_refused_with_its_estimate(window, qtbot, folders, files, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 8 * GIB)
    folder = llama_7b_folder(tmp_path / "llama-2-7b")
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("the cat sat on the mat.\n" * 50)
    panel = window.training_panel
    with address_space_growth_limit(3 * GIB):
        _open(qtbot, window, folders, folder)
        model = window.document.module
        window.tabs.setCurrentWidget(panel)
        files.append(text_file)
        qtbot.mouseClick(panel.browse_button, Qt.MouseButton.LeftButton)
        assert panel.data_form.field_widget("task").currentText() == "causal-lm"
        panel.data_form.set_field("block_size", 16)
        qtbot.mouseClick(panel.controls.start_button, Qt.MouseButton.LeftButton)
        started = panel.active is not None
        assert panel.wait(120)
    assert not started and not panel.runs and not window.running_tasks
    text = panel.last_error
    assert text.startswith("Not enough memory: Training needs about "), text
    assert "(parameters to initialize 27.0 GB, initializer working arrays 1.0 GB, gradients 27.0 GB, optimizer " \
           "state 53.9 GB, updated weights 27.0 GB, activations " in text, text
    assert "8.6 GB available; refused. No run was started; the model was left as it was." in text, text
    assert panel.error_label.error() == text
    assert window.isVisible() and window.document.module is model and _initialized(model) == 0
    assert panel.controls.start_button.isEnabled()
