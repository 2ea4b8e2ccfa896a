"""A long Hugging Face open in the window (issue 43, item 6): the status bar's Cancel stops the
opening worker between layers (it ran on, growing, before), the document stays as it was; a
config whose layer count the folder does not hold is refused with the engine's message."""
from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from tests.engine.models.test_config_sizes import tiny_llama_folder


def test_cancel_stops_an_open_between_layers_and_the_document_is_unchanged(window, qtbot, tmp_path, monkeypatch):
    import engine.models.llama as llama

    folder = tiny_llama_folder(tmp_path / "deep", range(60))
    built, started, release = [], threading.Event(), threading.Event()
    build_layer = llama.LlamaDecoderLayer.__init__

    def slow_layer(self, *args, **kwargs):  # the first layer takes until Cancel was pressed
        built.append(threading.current_thread().name)
        if len(built) == 1:
            started.set()
            release.wait(30)
        build_layer(self, *args, **kwargs)

    monkeypatch.setattr(llama.LlamaDecoderLayer, "__init__", slow_layer)
    assert window.open_example("spirals")
    before, source, message = window.document.module, window.document.source, window.last_message
    task = window.pretrained.open_folder(folder, ask=False)
    assert task is not None
    qtbot.waitUntil(started.is_set, timeout=10_000)
    cancel = window.task_progress.cancel_button
    assert cancel.isVisible() and cancel.isEnabled()
    qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)
    release.set()
    assert task.wait_thread(30)  # the worker function returned
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=10_000)
    assert task.outcome == "cancelled"
    assert built == ["ember-task-Opening deep"]  # no layer was built after Cancel (all 60 were)
    assert not [t for t in threading.enumerate() if t.name.startswith("ember-task-Opening")]
    assert window.document.module is before and window.document.source == source
    assert window.last_message is message  # no error: the user cancelled
    assert "cancelled" in window.message_label.text()


def test_a_layer_count_the_folder_does_not_hold_is_refused_in_the_window(window, qtbot, tmp_path):
    folder = tiny_llama_folder(tmp_path / "claims", range(2), num_hidden_layers=100_000)
    assert window.open_example("spirals")
    before = window.document.module
    window.pretrained.open_folder(folder, ask=False)
    qtbot.waitUntil(lambda: not window.running_tasks, timeout=10_000)
    text = window.last_message.text()
    assert "'num_hidden_layers' is 100000" in text and "2 layer(s)" in text and "config.json" in text
    assert window.document.module is before
