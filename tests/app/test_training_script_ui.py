"""File ▸ Export ▸ Training script… (issue 20, the scale-out hand-off from the window): open the
fixture Llama folder through the menu, choose a generated text file on the Training tab, attach
LoRA through the dialog, export: train.py, train_config.json, the token rows and the initial
adapter are written, the config names the LoRA targets, the window's run settings and frozen
parameters, and the script compiles. Also: the action is disabled, saying why, without a model of
a known family or without causal-lm data; an engine refusal (a cosine schedule) is shown as its
message and nothing is written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QMenu, QMessageBox

from engine import Device
from widgets.lora_dialog import LoraDialog
from tests.app.window_helpers import LLAMA, open_llama, wait_idle

ROOT = Path(__file__).resolve().parents[2]


def corpus(path: Path, n=120, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    lines = [f"{rng.choice(['the cat', 'a dog', 'the bird'])} {rng.choice(['sat on', 'ran to', 'looked at'])} "
             f"{rng.choice(['the mat.', 'a box.', 'the log.'])}" for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def choose_text(qtbot, window, files, text: Path):
    panel = window.training_panel
    window.actions.train_show.trigger()
    files.append(text)
    qtbot.mouseClick(panel.browse_button, Qt.MouseButton.LeftButton)
    assert panel.data_form.field_widget("task").currentText() == "causal-lm"
    return panel


def attach_lora(qtbot, window, preset="q_proj, v_proj"):
    qtbot.keyClick(window, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    d = window.dialog
    assert isinstance(d, LoraDialog)
    d.set_targets(preset)
    d.set_variant("lora")
    button = d.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert button.isEnabled(), d.errors()
    button.click()
    assert window.document.stats.total.reparameterized > 0


def test_export_a_training_script_through_the_menu(window, qtbot, folders, files, tmp_path):
    action = window.actions.export_training_script
    assert action in window.findChild(QMenu, "menu.export").actions()
    open_llama(qtbot, window, folders)
    panel = choose_text(qtbot, window, files, corpus(tmp_path / "corpus.txt"))
    form = panel.data_form
    form.set_field("block_size", 16)
    tf = panel.training_form
    for name, value in (("num_epochs", 2), ("batch_size", 4), ("seed", 3), ("grad_accumulation", 2),
                        ("warmup_steps", 3), ("max_grad_norm", 1.0)):
        tf.set_field(name, value)
    panel.schedule_combo.setCurrentText("constant")
    panel.schedule_forms["constant"].set_field("lr", 2e-3)
    assert panel.settings_valid(), panel.run_settings.data_form.errors()
    Device("cpu").seed(0)
    attach_lora(qtbot, window)
    assert action.isEnabled(), action.toolTip()

    out = tmp_path / "export"
    folders.append(out)
    action.trigger()
    wait_idle(qtbot, window, 60_000)
    box = window.last_message
    assert box is not None and box.icon() == QMessageBox.Icon.Information, box.text() if box else None
    for command in ("python train.py", "accelerate launch train.py", "torchrun --nproc_per_node N train.py"):
        assert command in box.text()
    assert str(out / "train.py") in box.detailedText()

    script, config_path = out / "train.py", out / "train_config.json"
    assert script.is_file() and config_path.is_file()
    assert (out / "tokens.safetensors").is_file() and (out / "initial_adapter" / "adapter_config.json").is_file()
    compile(script.read_text(encoding="utf-8"), str(script), "exec")  # valid Python
    config = json.loads(config_path.read_text(encoding="utf-8"))
    layers = json.loads((LLAMA / "config.json").read_text())["num_hidden_layers"]
    assert sorted(config["lora"]["target_modules"]) == sorted(f"model.layers.{i}.self_attn.{m}" for i in range(layers)
                                                              for m in ("q_proj", "v_proj"))
    assert "q_proj, v_proj" in box.text()  # the message names the targets
    assert config["model"]["base"] == str(LLAMA.resolve())  # the base weights are the stored ones
    assert "model.layers.0.self_attn.q_proj.weight" in config["frozen_parameters"]  # LoRA froze the bases
    assert any("lora_A" in n for n in config["trainable_parameters"])
    opt, training, data = config["optimizer"], config["training"], config["data"]
    assert opt["name"] == panel.optimizer_combo.currentText()
    assert opt["lr"] == pytest.approx(2e-3) and opt["warmup_steps"] == 3 and opt["max_grad_norm"] == 1.0
    assert (training["num_epochs"], training["batch_size"], training["grad_accumulation"], training["seed"]) == \
        (2, 4, 2, 3)
    assert data["file"] == str((tmp_path / "corpus.txt").resolve()) and data["block_size"] == 16
    assert data["train_rows"] > 0 and data["valid_rows"] > 0
    # the window's model is left as it was: its adapters stay, nothing merged
    assert window.document.stats.total.reparameterized > 0


def test_a_schedule_pytorch_cannot_reproduce_is_refused_nothing_written(window, qtbot, folders, files, tmp_path):
    open_llama(qtbot, window, folders)
    panel = choose_text(qtbot, window, files, corpus(tmp_path / "corpus.txt"))
    panel.data_form.set_field("block_size", 16)
    panel.schedule_combo.setCurrentText("cosine")
    assert panel.settings_valid()
    action = window.actions.export_training_script
    assert action.isEnabled(), action.toolTip()
    out = tmp_path / "export"
    folders.append(out)
    action.trigger()
    wait_idle(qtbot, window, 60_000)
    box = window.last_message
    assert box is not None and box.icon() == QMessageBox.Icon.Critical
    assert "constant learning rate" in box.text() and "Nothing was written" in box.text()
    assert not (out / "train.py").exists() and not (out / "train_config.json").exists()


def test_disabled_with_a_tooltip_saying_why(window, qtbot, folders, files, tmp_path, mlp_script):
    action = window.actions.export_training_script
    assert not action.isEnabled() and "no model is open" in action.toolTip()
    # a model of no known family
    assert window.open_script(str(mlp_script))
    qtbot.waitUntil(lambda: window.document.module is not None, timeout=30_000)
    wait_idle(qtbot, window, 60_000)
    assert not action.isEnabled()
    assert "not from a Hugging Face family" in action.toolTip()
    # a known family, but no causal-lm data chosen on the Training tab
    open_llama(qtbot, window, folders)
    panel = window.training_panel
    if panel.data_form.field_values()[0].get("task") == "causal-lm":
        panel.data_form.set_field("task", "spirals")
    assert not action.isEnabled()
    assert "choose causal-lm data" in action.toolTip()
    # choosing a text file enables it
    choose_text(qtbot, window, files, corpus(tmp_path / "corpus.txt"))
    assert action.isEnabled(), action.toolTip()
