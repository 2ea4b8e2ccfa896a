"""Issue 48, items 1 and 6: the Training tab's settings, data, status, progress, plots and gradient
norms belong to the document's model and follow it; the block size stays within a language
model's positions, refused as the user types."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.window_helpers import LLAMA, open_llama, wait_idle
from tests.widgets.qt_helpers import type_into

TIMEOUT = 120_000


@pytest.fixture
def panel(window, monkeypatch):
    monkeypatch.setattr(window, "maybe_discard", lambda *a, **k: True, raising=False)  # nothing to ask here
    p = window.training_panel
    window.tabs.setCurrentWidget(p)
    yield p
    p.shutdown()


def corpus_file(tmp_path):
    words = ["the cat sat on the mat.", "a dog ran to the log.", "the bird looked at a box."]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(words[i % 3] for i in range(60)) + "\n", encoding="utf-8")
    return path


def task(panel) -> str:
    return panel.data_form.field_widget("task").currentText()


def metric_title(panel) -> str:
    return panel.curves.plots["metric"].titleLabel.text


def train_steps(qtbot, panel, steps=2):
    panel.training_form.set_field("num_epochs", 1)
    run = panel.start(max_steps=steps)
    assert run is not None, panel.last_error
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    assert run.status in ("finished", "stopped"), panel.last_error
    return run


def train_llama(qtbot, panel, tmp_path):
    panel.run_settings.choose_data_file(str(corpus_file(tmp_path)))
    panel.data_form.set_field("block_size", 16)
    panel.training_form.set_field("batch_size", 4)
    assert panel.settings_valid(), panel.data_form.errors()
    return train_steps(qtbot, panel)


def assert_clean(panel):
    """Nothing of a run of another model shows."""
    assert panel.controls.status_label.text() == "Ready."
    assert panel.controls.bar.value() == 0 and panel.controls.rate_label.text() == ""
    assert panel.grad_table.rowCount() == 0 and panel.grad_table.norms == {}
    assert not panel.lm_label.isVisible() and panel.lm_label.text() == ""
    assert not panel.apply_button.isEnabled()


def test_a_language_model_opened_after_digits_trains_causal_lm_with_its_tokenizer(window, panel, qtbot, folders):
    assert window.open_example("digits")
    assert task(panel) == "digits" and panel.curves.metric_combo.currentText() == "accuracy"
    open_llama(qtbot, window, folders)
    assert task(panel) == "causal-lm"
    assert panel.data_form.field_widget("tokenizer").text() == str(LLAMA)
    assert panel.curves.metric_combo.currentText() == "perplexity"
    assert metric_title(panel) == "perplexity per epoch"
    assert [panel.curves.metric_combo.itemText(i) for i in range(panel.curves.metric_combo.count())] == \
        ["perplexity"]


def test_a_trained_example_leaves_no_status_progress_or_norms_on_the_next_model(window, panel, qtbot, folders):
    assert window.open_example("spirals")
    train_steps(qtbot, panel)
    assert panel.grad_table.rowCount() > 0 and panel.controls.bar.value() > 0
    assert panel.controls.status_label.text() != "Ready."
    open_llama(qtbot, window, folders)
    assert_clean(panel)


def test_a_model_opened_after_a_trained_language_model_gets_its_own_settings(window, panel, qtbot, folders,
                                                                               mlp_script, tmp_path):
    open_llama(qtbot, window, folders)
    train_llama(qtbot, panel, tmp_path)
    assert "embed_tokens" in panel.grad_table.norms
    assert window.open_script(str(mlp_script))
    assert_clean(panel)
    assert task(panel) == "spirals"  # the defaults, not the language model's
    values, _errors = panel.data_form.field_values()
    assert values["tokenizer"] == "" and values["file"] == "" and values["block_size"] == 128
    assert panel.curves.metric_combo.currentText() == "accuracy"

    assert window.open_example("spirals")
    assert metric_title(panel) == "accuracy per epoch"
    y_low, y_high = panel.curves.plots["metric"].vb.viewRange()[1]
    assert y_high <= 1.5  # not the perplexity's axis of the run before


def test_a_reopened_language_model_project_plots_perplexity(window, panel, qtbot, folders, tmp_path):
    open_llama(qtbot, window, folders)
    run = train_llama(qtbot, panel, tmp_path)
    project = tmp_path / "llama.ember.json"
    assert window.projects.save_to(project)
    assert window.open_example("digits")
    assert panel.curves.metric_combo.currentText() == "accuracy"
    assert window.projects.open_project(str(project))
    wait_idle(qtbot, window, TIMEOUT)
    qtbot.waitUntil(lambda: window.document.project_path is not None, timeout=TIMEOUT)
    assert [r.name for r in panel.curves.runs()] == [run.name]
    assert task(panel) == "causal-lm"
    assert panel.curves.metric_combo.currentText() == "perplexity"
    assert metric_title(panel) == "perplexity per epoch"


# ---- item 6: the block size within the model's positions ---------------------------------------
def test_the_block_size_defaults_within_the_models_positions_and_more_is_refused_as_typed(
        window, panel, qtbot, folders, tmp_path):
    open_llama(qtbot, window, folders)  # 64 positions (max_position_embeddings)
    assert panel.data_form.field_values()[0]["block_size"] == 64
    panel.run_settings.choose_data_file(str(corpus_file(tmp_path)))
    assert panel.settings_valid(), panel.data_form.errors()
    assert panel.controls.start_button.isEnabled()
    type_into(qtbot, panel.data_form.field_widget("block_size"), "65")
    errors = panel.data_form.errors()
    assert "64 positions" in errors.get("block_size", ""), errors
    assert panel.data_form.error_labels["block_size"].isVisible()
    assert not panel.controls.start_button.isEnabled()  # before Start is clicked
    type_into(qtbot, panel.data_form.field_widget("block_size"), "64")
    assert panel.settings_valid() and panel.controls.start_button.isEnabled()
    qtbot.mouseClick(panel.controls.start_button, Qt.MouseButton.LeftButton)  # and it trains
    assert panel.active is not None
    panel.stop()
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)


# ---- item 9: a run stopped, then resumed, keeps each applied model's weights ----------------------
def test_a_resumed_run_writes_its_weights_beside_those_applied_before(window, panel, qtbot):
    assert window.open_example("spirals")
    panel.training_form.set_field("num_epochs", 300)
    panel.training_form.set_field("checkpoint_every", 1)
    run = panel.start()
    qtbot.waitUntil(lambda: len(run.history.checkpoints) >= 1, timeout=TIMEOUT)
    panel.stop()
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    first = window.document.edits[-1].to_json()
    assert first["op"] == "load", first
    first_bytes = open(first["path"], "rb").read()
    resumed = panel.resume_from_checkpoint(max_steps=3)
    assert resumed is not None, panel.last_error
    qtbot.waitUntil(lambda: panel.active is None, timeout=TIMEOUT)
    loads = [e.to_json()["path"] for e in window.document.edits if e.to_json()["op"] == "load"]
    assert len(loads) == 2 and loads[0] == first["path"] and loads[1] != loads[0], loads
    assert open(loads[0], "rb").read() == first_bytes  # the first edit still loads what it applied
