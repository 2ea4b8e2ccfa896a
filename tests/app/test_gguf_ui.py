"""GGUF in the window (issue 46): File ▸ Open GGUF…, File ▸ Export ▸ GGUF… and GGUF LoRA Adapter…
on a worker (each refused, saying why, when it cannot run), and the quantization shown."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt

from app.core.schema import PretrainedSource
from engine.models import from_pretrained
from engine.module.lora import LoraAdapter
from engine.module.param import Param
from engine.module.tree import params
from engine.store.gguf_file import open_gguf
from engine.tensor import Tensor
from tests.app.test_pretrained_ui import LLAMA, lora_on_query_value_through_the_dialog
from tests.app.window_helpers import wait_idle

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "tests" / "fixtures" / "gguf" / "tiny-qwen2-q8.gguf"
BPE = ROOT / "tests" / "fixtures" / "hf" / "qwen2-bpe"
CHAT_TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"


def _open(qtbot, window, files):
    files.append(str(GGUF))
    window.actions.open_gguf.trigger()
    wait_idle(qtbot, window)
    assert window.document.source == PretrainedSource(str(GGUF.resolve()))


def test_open_gguf_from_the_menu_and_the_exports_say_when_they_cannot_run(window, qtbot, files):
    a = window.actions
    assert not a.export_gguf.isEnabled() and "no model is open" in a.export_gguf.toolTip()
    _open(qtbot, window, files)
    assert a.export_gguf.isEnabled()
    assert not a.export_gguf_lora.isEnabled() and "no LoRA adapters" in a.export_gguf_lora.toolTip()
    window.document.set_model(from_pretrained(LLAMA), PretrainedSource(str(LLAMA.resolve())))
    window._update_actions()
    # llama-gqa's tokenizer is SentencePiece-style (Metaspace): no faithful GGUF form, the export says so
    assert not a.export_gguf.isEnabled() and "SentencePiece-style" in a.export_gguf.toolTip()
    assert window.gguf.export_gguf(ROOT / "never.gguf") is None  # refused, nothing written
    assert not (ROOT / "never.gguf").exists()


def test_a_model_opened_from_a_folder_exports_with_its_tokenizer_and_warns_of_an_unknown_chat_format(
        window, qtbot, tmp_path):
    from PySide6.QtWidgets import QMessageBox

    folder = tmp_path / "chat-model"
    shutil.copytree(BPE, folder)
    window.document.set_model(from_pretrained(folder), PretrainedSource(str(folder)))
    window._update_actions()
    a = window.actions
    assert a.export_gguf.isEnabled(), a.export_gguf.toolTip()
    assert not a.export_gguf_lora.isEnabled() and "opened from a folder" in a.export_gguf_lora.toolTip()
    window.gguf.export_gguf(tmp_path / "chat.gguf", "F16")
    wait_idle(qtbot, window)
    with open_gguf(tmp_path / "chat.gguf") as f:
        assert f.metadata["tokenizer.ggml.pre"] == "qwen2" and f.metadata["general.name"] == "chat-model"
    text = (tmp_path / "chat.Modelfile").read_text()
    assert "# TEMPLATE: the ChatML chat format" in text and "{{ .Content }}<|im_end|>" in text
    assert window.last_message is None or "template" not in window.last_message.windowTitle().lower()
    # a chat format Ember has no Ollama template for: no TEMPLATE, a comment and a warning say so
    (folder / "chat_template.jinja").write_text((CHAT_TEMPLATES / "zephyr-7b-beta.jinja").read_text())
    window.document.set_model(from_pretrained(folder), PretrainedSource(str(folder)))
    window.gguf.export_gguf(tmp_path / "zephyr.gguf", "F16")
    wait_idle(qtbot, window)
    text = (tmp_path / "zephyr.Modelfile").read_text()
    assert "TEMPLATE \"\"\"" not in text and "# no TEMPLATE: the model's chat template is not one Ember" in text
    box = window.last_message
    assert box.icon() == QMessageBox.Icon.Warning and "zephyr.Modelfile" in box.text()
    assert "not one Ember writes an Ollama TEMPLATE for" in box.text()


def test_lora_from_the_dialog_exports_as_an_adapter_and_merged(window, qtbot, files, tmp_path):
    _open(qtbot, window, files)
    lora_on_query_value_through_the_dialog(qtbot, window, targets=2)
    rng = np.random.default_rng(2)
    for path, p in params(window.document.module):  # trained factors (b starts at zero)
        r = p.reparameterization
        if isinstance(r, LoraAdapter):
            r.b = Param(Tensor.from_data((rng.standard_normal(r.b.shape) * 0.1).astype(np.float32)))
    window._update_actions()
    assert window.actions.export_gguf_lora.isEnabled(), window.actions.export_gguf_lora.toolTip()

    window.gguf.export_lora(tmp_path / "tuned-lora.gguf")
    wait_idle(qtbot, window)
    with open_gguf(tmp_path / "tuned-lora.gguf") as f:
        assert f.metadata["general.type"] == "adapter" and f.metadata["general.architecture"] == "qwen2"
        assert sorted(f.tensors) == ["blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b",
                                     "blk.0.attn_v.weight.lora_a", "blk.0.attn_v.weight.lora_b"]
    modelfile = (tmp_path / "tuned-lora.Modelfile").read_text()
    assert modelfile.startswith(f"FROM {GGUF.resolve()}\nADAPTER {(tmp_path / 'tuned-lora.gguf').resolve()}")

    window.gguf.export_gguf(tmp_path / "merged.gguf", "Q8_0")
    wait_idle(qtbot, window)
    merged = from_pretrained(tmp_path / "merged.gguf")
    ids = Tensor.from_data(np.array([[1, 5, 9, 40]]), dtype="int64")
    ours, theirs = window.document.module.forward(ids).numpy(), merged.forward(ids).numpy()
    assert np.linalg.norm(ours - theirs) <= 0.05 * np.linalg.norm(ours)  # Q8_0 of the merged weights


def test_the_tree_inspector_and_status_line_show_the_quantization(window, qtbot, files):
    from engine.models.gguf_model import gguf_storage
    from widgets.module_tree import NAME, TYPE

    _open(qtbot, window, files)
    storage = gguf_storage(window.document.module)
    stored = sum(n for _, _, n in storage.values())
    assert f"{stored / 1e6:.1f} MB as stored" in window.summary_label.text()
    assert "Q8_0 ×" in window.summary_label.text()
    stats = window.document.stats
    assert stats.total.reparameterized == 0  # a GGUF weight is the base, not an adapter
    assert stats.total.quantized == sum(1 for _, t, _ in storage.values() if t not in ("F32", "F16", "BF16"))
    model = window.tree.model
    path = "layers.0.mlp.up_proj.weight"
    qtype, nbytes = storage[path][1], storage[path][2]

    assert window.tree.select_path(path)
    index = window.tree.view.currentIndex()
    text = model.index(index.row(), TYPE, index.parent()).data()
    assert f"{qtype}, {nbytes / 1024:.1f} KiB" in text
    assert model.index(index.row(), NAME, index.parent()).data(Qt.ItemDataRole.DecorationRole) is None  # no "L"
    row = window.inspector.params.item(0, 3).text()
    assert row.startswith(f"{qtype} (")


def test_export_gguf_from_the_menu_asks_the_type_then_the_file(window, qtbot, files, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog, QInputDialog

    from app.gguf_actions import TYPE_CHOICES

    _open(qtbot, window, files)
    label = next(k for k, v in TYPE_CHOICES.items() if v == "Q4_0")
    asked = []
    monkeypatch.setattr(QInputDialog, "getItem", lambda *a, **k: (asked.append(a[3]) or label, True))
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "out.gguf"), ""))
    window.actions.export_gguf.trigger()
    wait_idle(qtbot, window)
    assert asked and set(TYPE_CHOICES) == set(asked[0])
    with open_gguf(tmp_path / "out.gguf") as f:
        assert f.tensors["blk.0.ffn_up.weight"].type == "Q4_0" and f.tensors["output_norm.weight"].type == "F32"
        assert f.metadata["tokenizer.chat_template"]
    assert (tmp_path / "out.Modelfile").read_text().startswith(f"FROM {(tmp_path / 'out.gguf').resolve()}\n# TEMPLATE: "
                                                               f"the ChatML chat format")


def test_the_training_note_names_the_gguf_files_own_chat_template():
    from app.training_data_note import chat_template_note

    assert chat_template_note(str(GGUF)) == f"rendered with the chat template of {GGUF.name} (tokenizer.chat_template)"
