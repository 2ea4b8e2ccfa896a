"""The LoRA dialog's "Also train fully" (issue 47): peft's modules_to_save for the embedding and
the output head, and peft's bias, resolved by the engine to exact parameters; the edit replays
them (unfrozen beside the adapters) and the PEFT export writes them as peft does."""
import json
from pathlib import Path

import pytest

from app.core.edits import apply_edit, describe
from app.core.schema import edit_from_json
from engine.models import from_pretrained, save_peft_adapter
from widgets.lora_dialog import LoraDialog

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _dialog(qtbot, folder):
    model = from_pretrained(HF / folder)
    d = LoraDialog(model)
    qtbot.addWidget(d)
    d.show()
    d.set_targets("q_proj, v_proj")
    return model, d


def test_embedding_and_head_train_fully_and_export_as_modules_to_save(qtbot, tmp_path):
    model, d = _dialog(qtbot, "llama-gqa")
    assert sorted(d.full_modules) == ["embed_tokens", "lm_head"] and not d.bias.isEnabled()  # Llama has no biases
    d.full_modules["embed_tokens"].setChecked(True)
    d.full_modules["lm_head"].setChecked(True)
    edit = d.edit()
    assert edit["train_fully"] == {"kind": "paths", "paths": ["embed_tokens.weight", "lm_head.weight"]}
    assert d.summary.text().endswith("trainable%: 5.3209. Trained fully beside the adapters: 2 parameter(s), "
                                     "12,288 values.")
    typed = edit_from_json(json.loads(json.dumps(edit)))  # the project file's round trip
    assert edit_from_json(typed.to_json()) == typed
    assert describe(typed).endswith("training embed_tokens.weight, lm_head.weight fully")
    tuned = apply_edit(model, typed)
    trainable = sorted(p for p, q in tuned.named_params() if q.is_active() and ".lora." not in p)
    assert trainable == ["embed_tokens.weight", "lm_head.weight"]
    save_peft_adapter(tuned, tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["modules_to_save"] == ["lm_head", "model.embed_tokens"] and cfg["bias"] == "none"


def test_biases_of_the_adapted_modules(qtbot):
    model, d = _dialog(qtbot, "qwen2")
    assert d.bias.isEnabled()
    d.bias.setCurrentIndex(d.bias.findData("lora_only"))
    assert d.edit()["train_fully"]["paths"] == [f"layers.{i}.self_attn.{n}.bias" for i in (0, 1)
                                                for n in ("query", "value")]
    d.bias.setCurrentIndex(d.bias.findData("all"))
    assert len(d.edit()["train_fully"]["paths"]) == 6  # k_proj's biases too


def test_a_tied_head_is_refused_beside_the_choice(qtbot):
    _, d = _dialog(qtbot, "llama-tied")
    d.full_modules["embed_tokens"].setChecked(True)
    assert "output head is tied to it" in d.full_error.error()
    assert not d.ok_button().isEnabled() and d.edit() is None
    d.full_modules["embed_tokens"].setChecked(False)
    assert d.ok_button().isEnabled() and "train_fully" not in d.edit()


@pytest.mark.parametrize("data", [{"kind": "paths", "paths": ["x"]}, None])
def test_a_lora_edit_round_trips_with_and_without_train_fully(data):
    """An edit without train_fully (a project written before) reads and writes as it did."""
    raw = {"op": "lora", "rank": 2, "alpha": 4.0, "init_std": None, "group": {"kind": "all"}, "qlora": None}
    if data is not None:
        raw["train_fully"] = data
    typed = edit_from_json(raw)
    assert typed.to_json() == raw
