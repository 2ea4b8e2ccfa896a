"""Issue 48, item 9: the Hugging Face name of a module named as in Hugging Face (lm_head), the
dtype of a parameter not read yet, a ViT's example input from its config."""
from __future__ import annotations

from pathlib import Path

import pytest

from widgets.module_tree import HF_NAME
from tests.app.window_helpers import LLAMA, open_llama, wait_idle

VIT = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "vit"


def test_lm_head_shows_its_hugging_face_name_and_lazy_parameters_their_dtype(window, qtbot, folders):
    open_llama(qtbot, window, folders)
    model = window.tree.model
    assert model.index_of("lm_head").siblingAtColumn(HF_NAME).data() == "lm_head"
    assert model.index_of("lm_head.weight").siblingAtColumn(HF_NAME).data() == "lm_head.weight"
    assert not any(p.is_initialized() for _, p in window.document.module.named_params())  # lazy
    window.tree.select_path("layers.0.self_attn.query")
    rows = window.inspector.rows()
    dtype = window.inspector.params.horizontalHeaderItem(3).text()
    assert dtype == "DType" and rows[0][3] == "float32", rows[0]  # as it will be read, beside read ones


def test_a_vit_starts_with_an_example_image_batch_from_its_config(window, qtbot, folders):
    folders.append(VIT)
    window.actions.open_pretrained.trigger()
    wait_idle(qtbot, window, 60_000)
    assert type(window.document.module).__name__ == "ViTForImageClassification"
    assert window.contract_editor.input.text() == "[2, 3, 16, 16]"  # num_channels 3, image_size 16
    window.checks.run_check(window.contract_editor.input.text())
    wait_idle(qtbot, window, 60_000)
    assert window.document.check_result.ok, window.document.check_result.error


def test_hovering_a_toolbar_button_keeps_the_trainable_summary(opened, qtbot):
    from PySide6.QtGui import QStatusTipEvent
    from PySide6.QtWidgets import QApplication

    w = opened
    summary = w.summary_label.text()
    assert summary and w.summary_label.isVisible()
    button = w.toolbar.widgetForAction(w.actions.freeze)
    assert button is not None
    tip = w.actions.freeze.statusTip() or "Freeze the selection"
    QApplication.sendEvent(button, QStatusTipEvent(tip))  # what Qt sends when the pointer enters it
    assert w.summary_label.isVisible() and w.summary_label.text() == summary
    assert w.statusBar().currentMessage() == "" and w.message_label.text() == tip
    w.status("Saved p.ember.json")
    QApplication.sendEvent(button, QStatusTipEvent(tip))
    QApplication.sendEvent(button, QStatusTipEvent(""))  # the pointer leaves: the note comes back
    assert w.message_label.text() == "Saved p.ember.json" and w.summary_label.isVisible()


def test_the_docks_keep_their_share_of_a_wider_window(opened, qtbot):
    from PySide6.QtWidgets import QApplication

    w = opened
    w.resize(1024, 640)
    qtbot.waitUntil(lambda: w.width() == 1024)
    w.default_dock_sizes()
    QApplication.processEvents()
    share = w.inspector_dock.width() / w.width()
    tree_share = w.tree_dock.width() / w.width()
    w.resize(1600, 1000)
    qtbot.waitUntil(lambda: w.width() == 1600)
    QApplication.processEvents()
    assert w.inspector_dock.width() / 1600 == pytest.approx(share, abs=0.02), w.inspector_dock.width()
    assert w.tree_dock.width() / 1600 == pytest.approx(tree_share, abs=0.02)
