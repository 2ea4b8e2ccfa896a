"""What a user reaches for (issue 48, items 10 and 12): File ▸ Import ▸ PEFT Adapter… loads a PEFT
adapter folder onto the open model as one undoable, replayable edit, refusing an adapter for
another base or a folder without its files; the LoRA dialog opened on the whole model starts on the
family's PEFT preset rather than on every rank-2 weight."""
from __future__ import annotations

import json

import numpy as np
from PySide6.QtWidgets import QMenu
from safetensors.numpy import load_file, save_file

from app.core.edits import replay
from app.core.project import project_data_at
from app.core.schema import PeftEdit, edit_from_json
from engine import Device, Tensor
from engine.models import from_pretrained, load_peft_adapter
from engine.models.peft import peft_lora, save_peft_adapter
from engine.module.tree import params
from tests.app.window_helpers import LLAMA, open_llama, wait_idle


def logits(model) -> np.ndarray:
    ids = np.load(LLAMA / "expected.npz")["input_ids"]
    return model.valid().forward(Tensor.from_data(ids)).numpy()


def write_adapter(folder, targets=("q_proj", "v_proj")):
    """A PEFT adapter for the Llama fixture with non-zero B factors (so it changes the logits)."""
    Device("cpu").seed(1)
    base = from_pretrained(LLAMA)
    save_peft_adapter(base.apply_lora(peft_lora(base, r=4, lora_alpha=8, target_modules=list(targets))), folder)
    weights = folder / "adapter_model.safetensors"
    tensors = load_file(weights)
    rng = np.random.default_rng(0)
    for name in tensors:
        if "lora_B" in name:
            tensors[name] = rng.normal(0, 0.5, tensors[name].shape).astype(tensors[name].dtype)
    save_file(tensors, weights)
    return folder


def adapted(module) -> list[str]:
    return [path for path, p in params(module) if p.reparameterization is not None]


def test_import_peft_adapter_is_one_undoable_replayable_edit(window, qtbot, folders, tmp_path):
    open_llama(qtbot, window, folders)
    base = window.document.module
    assert window.actions.import_peft.isEnabled()
    menu = window.menuBar().findChild(QMenu, "menu.import")
    assert menu is not None and window.actions.import_peft in menu.actions()
    adapter = write_adapter(tmp_path / "adapter")
    expected = logits(load_peft_adapter(from_pretrained(LLAMA), adapter))
    assert not np.allclose(expected, logits(base), atol=1e-4)  # the adapter changes what the model computes

    folders.append(adapter)
    window.actions.import_peft.trigger()
    wait_idle(qtbot, window, 60_000)
    model = window.document.module
    assert model is not base
    assert len(adapted(model)) == 4 and all(".query." in p or ".value." in p for p in adapted(model))
    np.testing.assert_allclose(logits(model), expected, atol=1e-5)
    stack = window.document.undo_stack
    assert stack.undoText() == "Load PEFT adapter adapter"
    edit = window.document.edits[-1]
    assert edit == PeftEdit(str(adapter.resolve()))
    assert edit_from_json(json.loads(json.dumps(edit.to_json()))) == edit  # the project file keeps it
    np.testing.assert_allclose(logits(replay(from_pretrained(LLAMA), [edit])), expected, atol=1e-5)
    # a saved project keeps the adapter's folder relative to itself, as it keeps a checkpoint's
    data = project_data_at(window.document.project(), tmp_path / "p.ember.json")
    assert data["edits"][-1] == {"op": "peft", "path": "adapter"}

    stack.undo()
    assert window.document.module is base and not adapted(window.document.module)
    stack.redo()
    assert len(adapted(window.document.module)) == 4


def test_import_peft_adapter_refusals_name_the_problem_and_keep_the_model(window, qtbot, folders, tmp_path):
    open_llama(qtbot, window, folders)
    base, steps = window.document.module, window.document.undo_stack.count()

    def refused(folder) -> str:
        folders.append(folder)
        window.actions.import_peft.trigger()
        wait_idle(qtbot, window, 60_000)
        assert window.document.module is base and window.document.undo_stack.count() == steps
        box = window.last_message
        assert box is not None and box.windowTitle() == "Import PEFT Adapter"
        text = box.text()
        box.close()
        assert "The model was not changed" in text
        return text

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    assert "no adapter_config.json" in refused(empty) and "notes.txt" in refused(empty)

    no_weights = tmp_path / "no-weights"
    write_adapter(no_weights)
    (no_weights / "adapter_model.safetensors").unlink()
    assert "no adapter_model.safetensors" in refused(no_weights)

    # an adapter written for another architecture: GPT-2's attention has no q_proj / v_proj modules
    gpt2 = from_pretrained(LLAMA.parent / "gpt2")
    other = tmp_path / "gpt2-adapter"
    save_peft_adapter(gpt2.apply_lora(peft_lora(gpt2, r=2, lora_alpha=4, target_modules=["c_attn"])), other)
    text = refused(other)
    assert "another base model" in text and "c_attn" in text


def test_lora_dialog_on_the_whole_model_starts_on_the_familys_preset(window, qtbot, folders, mlp_script):
    open_llama(qtbot, window, folders)
    d = window.edit_actions.open_lora_dialog("")
    assert d.targets.currentData() == "q_proj, v_proj"
    assert d.preview_counts["targets"] == 4  # q and v of two layers: no embeddings, no head
    d.ok_button().click()
    paths = adapted(window.document.module)
    assert len(paths) == 4 and not any("embed" in p or "lm_head" in p for p in paths)
    window.document.undo_stack.undo()
    # a subtree chosen in the tree keeps the parameter group: the user's selection
    d = window.edit_actions.open_lora_dialog("layers.0")
    assert d.targets.currentData() == "group"
    d.reject()
    # a model of no known family has no preset: the group (all) as before
    assert window.open_script(str(mlp_script))
    d = window.edit_actions.open_lora_dialog("")
    assert d.targets.currentData() == "group"
    d.reject()
