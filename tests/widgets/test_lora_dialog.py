"""The LoRA dialog: every field validated in place, and a live preview that matches what the
engine then does."""
import pytest
from PySide6.QtCore import Qt

from engine.module import ParamGroup
from engine.module.lora import Lora
from engine.module.summary import trainable_counts
from tests.widgets.models import Mlp
from tests.widgets.qt_helpers import click_box, type_into
from widgets.lora_dialog import LoraDialog


@pytest.fixture
def dialog(qtbot):
    d = LoraDialog(Mlp())
    qtbot.addWidget(d)
    d.show()
    return d


def test_preview_counts_match_the_engine(dialog, qtbot):
    type_into(qtbot, dialog.rank, "4")
    type_into(qtbot, dialog.alpha, "8")
    m = Mlp()
    after = trainable_counts(m.apply_lora(Lora(4, 8.0)))
    pv = dialog.preview_counts
    assert (pv["trainable"], pv["all"]) == (after.trainable, after.total)
    assert dialog.summary.text().startswith("LoRA on 3 weight(s) adds 300 parameters. After: "
                                            f"trainable params: 300 || all params: 770 || trainable%: {after.percent:.4f}")
    rows = [[dialog.preview.item(r, c).text() for c in range(5)] for r in range(dialog.preview.rowCount())]
    assert rows[0] == ["blocks.0.linear.weight", "[8, 16]", "[8, 4]", "[4, 16]", "96"]
    assert dialog.edit() == {"op": "lora", "rank": 4, "alpha": 8.0, "init_std": None, "group": {"kind": "all"},
                             "qlora": None}


@pytest.mark.parametrize("field, text, message", [
    ("rank", "0", "rank must be ≥ 1, got 0"),
    ("rank", "2.5", "rank must be a whole number ≥ 1, got '2.5'"),
    ("rank", "", "rank is required"),
    ("alpha", "abc", "alpha must be a number, got 'abc'"),
    ("alpha", "inf", "alpha must be finite, got inf"),
    ("init_std", "-1", "init std must be > 0, got -1"),
])
def test_bad_fields_are_explained_next_to_them(dialog, qtbot, field, text, message):
    type_into(qtbot, getattr(dialog, field), text)
    label = getattr(dialog, f"{field}_error")
    assert label.error() == message and label.isVisible()
    assert not dialog.ok_button().isEnabled() and dialog.edit() is None
    emitted = []
    dialog.lora_chosen.connect(emitted.append)
    qtbot.keyClick(dialog, Qt.Key.Key_Return)
    assert emitted == [] and dialog.isVisible()


def test_group_errors_and_targets(dialog, qtbot):
    dialog.group.mode.setCurrentIndex(dialog.group.mode.findData("regex"))
    type_into(qtbot, dialog.group.pattern, "blocks[")
    assert "invalid regex pattern" in dialog.group.error.error()
    assert not dialog.ok_button().isEnabled()
    type_into(qtbot, dialog.group.pattern, r"\.bias$")
    assert "none of the selected parameters is a rank-2 float weight" in dialog.group.error.error()
    type_into(qtbot, dialog.group.pattern, r"^head\.")
    assert dialog.group.error.error() == "" and dialog.ok_button().isEnabled()
    assert dialog.preview.rowCount() == 1


def test_qlora_fields(dialog, qtbot):
    assert not dialog.block_size.isEnabled()
    click_box(qtbot, dialog.qlora)
    assert dialog.block_size.isEnabled()
    type_into(qtbot, dialog.block_size, "7")
    assert dialog.block_size_error.error() == "block size must be even (two 4-bit codes a byte), got 7"
    type_into(qtbot, dialog.block_size, "16")
    assert "about 4.508 bits per weight" in dialog.summary.text()  # 4 + 8/16 + 32/(16*256)
    click_box(qtbot, dialog.double_quant)
    assert "about 6.000 bits per weight" in dialog.summary.text()  # 4 + 32/16
    assert dialog.edit()["qlora"] == {"block_size": 16, "double_quant": False}


def test_a_model_with_lora_refuses_a_second(qtbot):
    d = LoraDialog(Mlp().apply_lora(Lora(2, 2.0)))
    qtbot.addWidget(d)
    assert "do not nest" in d.group.error.error() and not d.ok_button().isEnabled()


@pytest.mark.parametrize("variant", ["lora", "dora"])
def test_the_preview_counts_the_adapters_a_model_has_already(qtbot, variant):
    """Issue 44: on a model with LoRA on the head, LoRA or DoRA on the blocks' weights: the preview
    said "After" as if only the new factors trained (the head's factors stay trainable too), and
    the dialog added DoRA's magnitudes itself; the counts are now the engine's preview."""
    from engine.module import ParamGroup

    model = Mlp().apply_lora(Lora(2, 2.0, param_group=ParamGroup.from_regex(r"^head\.")))
    d = LoraDialog(model, group_mode="regex", group_text=r"^blocks\.")
    qtbot.addWidget(d)
    d.set_variant(variant)
    type_into(qtbot, d.rank, "4")
    assert d.ok_button().isEnabled(), d.errors()
    after = trainable_counts(model.apply_lora(Lora(4, 16.0, param_group=ParamGroup.from_regex(r"^blocks\."),
                                                   use_dora=variant == "dora")))
    pv = d.preview_counts
    assert (pv["trainable"], pv["all"], pv["targets"]) == (after.trainable, after.total, 2)
    added = 4 * (8 + 16) + 4 * (16 + 16) + (16 + 16 if variant == "dora" else 0)
    assert pv["added"] == added and pv["trainable"] == added + 2 * (16 + 3)  # the head's factors train too
    assert f"adds {added:,} parameters. After: {after}" in d.summary.text()


@pytest.mark.parametrize("name, layers", [("gemma", 2), ("gemma2", 2), ("gemma3", 3), ("qwen2-swa", 2)])
def test_the_gemma_and_sliding_window_families_get_peft_presets(qtbot, name, layers):
    """Issue 47: the family's presets (peft's default q_proj, v_proj for Gemma 1-3), and all-linear takes the
    7 projections of each layer, never Gemma 3's q/k norms or the tied head."""
    from pathlib import Path

    from engine.models import from_pretrained

    model = from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" / "hf" / name)
    d = LoraDialog(model)
    qtbot.addWidget(d)
    keys = [d.targets.itemData(i) for i in range(d.targets.count())]
    assert keys[:3] == ["q_proj, v_proj", "q_proj, k_proj, v_proj, o_proj", "all-linear"]
    d.set_targets("all-linear")
    assert d.preview_counts["targets"] == 7 * layers
    d.set_targets("q_proj, v_proj")
    assert d.preview_counts["targets"] == 2 * layers


@pytest.mark.parametrize("name, experts", [("mixtral", True), ("qwen3-moe", False)])
def test_a_mixture_of_experts_gets_router_and_expert_presets(qtbot, name, experts):
    """Issue 47: the attention with the router ("gate", adapted as peft adapts it), and Mixtral's experts."""
    from pathlib import Path

    from engine.models import from_pretrained

    model = from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" / "hf" / name)
    d = LoraDialog(model)
    qtbot.addWidget(d)
    keys = [d.targets.itemData(i) for i in range(d.targets.count())]
    assert "q_proj, k_proj, v_proj, o_proj, gate" in keys
    assert ("w1, w2, w3" in keys) == experts
    d.set_targets("q_proj, k_proj, v_proj, o_proj, gate")
    sparse = sum(type(layer.mlp).__name__ == "SparseMoe" for layer in model.layers)
    assert d.preview_counts["targets"] == 4 * len(model.layers) + sparse
    if experts:
        d.set_targets("w1, w2, w3")
        assert d.preview_counts["targets"] == 3 * 4 * len(model.layers)


@pytest.mark.parametrize("name", ["qwen2-moe", "qwen3-moe", "mixtral"])
def test_a_mixture_gets_an_experts_and_an_attention_and_experts_preset(qtbot, name):
    """Issue 47: the routed experts alone and with the attention, for Qwen2-MoE and Qwen3-MoE (their experts'
    gate_proj / up_proj / down_proj, never the dense layers' MLP or Qwen2-MoE's shared expert, which have the
    same names) as for Mixtral (w1, w2, w3)."""
    from pathlib import Path

    from engine.models import from_pretrained
    from widgets.lora_dialog import MIXTRAL_ATTENTION_EXPERTS, QWEN_ATTENTION_EXPERTS, QWEN_EXPERTS

    model = from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" / "hf" / name)
    d = LoraDialog(model)
    qtbot.addWidget(d)
    keys = [d.targets.itemData(i) for i in range(d.targets.count())]
    mixtral = name == "mixtral"
    experts_key, both_key = ("w1, w2, w3", MIXTRAL_ATTENTION_EXPERTS) if mixtral else (QWEN_EXPERTS,
                                                                                     QWEN_ATTENTION_EXPERTS)
    assert {experts_key, both_key} <= set(keys) and (QWEN_EXPERTS in keys) != mixtral
    assert keys.index(experts_key) + 1 == keys.index(both_key) < keys.index("all-linear")
    sparse = [layer.mlp for layer in model.layers if type(layer.mlp).__name__ == "SparseMoe"]
    experts = 3 * sum(len(m.experts) for m in sparse)
    if not mixtral:  # the plain names would also take the dense layers' MLP and Qwen2-MoE's shared expert
        d.set_targets("custom", custom="gate_proj, up_proj, down_proj")
        assert d.preview_counts["targets"] > experts > 0
    d.set_targets(experts_key)
    assert d.preview_counts["targets"] == experts
    # each expert's gate and up share one `a`: the summary says what attaching adds, not one `a` a part
    rank = int(d.rank.text())
    chosen = [v.id for path, v in model.named_params() if ".experts." in path and path.endswith(".weight")]
    attached = model.apply_lora(Lora(rank, 1.0, param_group=ParamGroup.from_ids(chosen)))
    added = sum(v.numel() for path, v in attached.named_params() if ".lora." in path)  # a shared `a` listed once
    assert d.preview_counts["added"] == added
    assert f"adds {added:,} parameters" in d.summary.text()
    rows = [[d.preview.item(r, c).text() for c in range(d.preview.columnCount())] for r in range(d.preview.rowCount())]
    shared_rows = [r for r, row in enumerate(rows) if not row[2].startswith("[")]  # a shared `a`: no shape of its own
    assert shared_rows and all(rows[r][2] == "gate_proj's" and ".up_proj." in rows[r][0]
                               and "shares the a factor of" in d.preview.item(r, 2).toolTip() for r in shared_rows)
    if len(rows) == experts:  # every row shown: the table adds up to the summary
        assert sum(int(row[4].replace(",", "")) for row in rows) == added
    d.set_targets(both_key)
    assert d.preview_counts["targets"] == experts + 4 * len(model.layers)
