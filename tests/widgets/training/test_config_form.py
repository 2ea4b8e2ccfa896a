"""Forms generated from config dataclasses: an editor per field type, errors shown as the user
types, under the field they are about."""
from dataclasses import dataclass
from typing import Literal

import pytest
from PySide6.QtCore import Qt

from engine import optim
from engine.train import TrainingConfig
from tests.widgets.qt_helpers import click_box, type_into
from widgets.training.config_form import DataclassForm, FieldOptions, FormError


@pytest.fixture
def make(qtbot):
    def build(*args, **kwargs):
        form = DataclassForm(*args, **kwargs)
        qtbot.addWidget(form)
        form.show()
        return form
    return build


def test_editors_follow_the_field_types(make):
    from PySide6.QtWidgets import QCheckBox, QGroupBox, QLineEdit

    form = make(optim.AdamConfig, options={"grad_clipping": FieldOptions(hidden=True)})
    assert set(form.editors) == {"beta_1", "beta_2", "epsilon", "amsgrad", "weight_decay"}
    assert isinstance(form.field_widget("beta_1"), QLineEdit)
    assert form.field_widget("beta_1").text() == "0.9"
    assert isinstance(form.field_widget("amsgrad"), QCheckBox)
    box = form.field_widget("weight_decay")  # WeightDecayConfig | float | None: an optional group
    assert isinstance(box, QGroupBox) and box.isCheckable() and not box.isChecked()
    assert form.value() == optim.AdamConfig()


def test_a_field_that_does_not_parse_shows_its_error_as_typed(make, qtbot):
    form = make(optim.AdamConfig, options={"grad_clipping": FieldOptions(hidden=True)})
    seen = []
    form.validity_changed.connect(seen.append)
    edit = form.field_widget("beta_1")
    edit.end(False)
    qtbot.keyClicks(edit, "x")  # "0.9" -> "0.9x"
    assert not form.is_valid() and seen == [False]
    label = form.error_labels["beta_1"]
    assert label.isVisible() and "expected a number" in label.text() and "'0.9x'" in label.text()
    with pytest.raises(FormError) as err:
        form.value()
    assert set(err.value.errors) == {"beta_1"}
    qtbot.keyClick(edit, Qt.Key.Key_Backspace)
    qtbot.keyClick(edit, Qt.Key.Key_Backspace)
    qtbot.keyClicks(edit, "8")  # "0.8"
    assert form.is_valid() and seen == [False, True] and not label.isVisible()
    assert form.value().beta_1 == 0.8 and isinstance(form.value().beta_1, float)


def test_the_dataclasses_own_checks_land_under_the_field_they_name(make, qtbot):
    form = make(TrainingConfig, options={"device": FieldOptions(hidden=True)})
    type_into(qtbot, form.field_widget("num_epochs"), "0")
    assert "num_epochs must be at least 1, got 0" in form.error_labels["num_epochs"].text()
    type_into(qtbot, form.field_widget("num_epochs"), "2.5")
    assert "whole number" in form.error_labels["num_epochs"].text()
    type_into(qtbot, form.field_widget("num_epochs"), "3")
    type_into(qtbot, form.field_widget("checkpoint_every"), "2")  # without a checkpoint_dir
    assert "checkpoint_dir is not" in form.error_labels["checkpoint_every"].text()
    type_into(qtbot, form.field_widget("checkpoint_dir"), "/tmp/runs")
    assert form.is_valid()
    cfg = form.value()
    assert (cfg.num_epochs, cfg.checkpoint_every, cfg.checkpoint_dir) == (3, 2, "/tmp/runs")
    type_into(qtbot, form.field_widget("valid_batch_size"), "")
    assert form.value().valid_batch_size is None  # optional: empty is None


def test_check_runs_after_construction(make, qtbot):
    form = make(optim.LinearLrSchedulerConfig, value=dict(initial_lr=0.1, final_lr=0.0, num_iters=10),
                check=lambda c: c.init())
    assert form.is_valid()
    type_into(qtbot, form.field_widget("initial_lr"), "1.5")
    assert "initial_lr must be greater than 0 and at most 1, got 1.5" in form.error_labels["initial_lr"].text()
    type_into(qtbot, form.field_widget("initial_lr"), "0.5")
    type_into(qtbot, form.field_widget("num_iters"), "0")
    assert "num_iters" in form.error_labels["num_iters"].text()


def test_nested_optional_dataclass_and_choices(make, qtbot):
    from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionGroupBox

    form = make(optim.SgdConfig, options={"gradient_clipping": FieldOptions(
        type=optim.GradientClippingConfig | None, options={"kind": FieldOptions(choices=["norm", "value"])})})
    box = form.field_widget("momentum")
    opt = QStyleOptionGroupBox()
    box.initStyleOption(opt)
    rect = box.style().subControlRect(QStyle.ComplexControl.CC_GroupBox, opt, QStyle.SubControl.SC_GroupBoxCheckBox,
                                      box)
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=rect.center())
    assert box.isChecked()
    assert form.value().momentum == optim.MomentumConfig()
    inner = form.editors["momentum"].form
    type_into(qtbot, inner.field_widget("dampening"), "2")
    assert not form.is_valid()
    assert "dampening must be between 0 and 1" in form.error_labels["momentum"].text()
    type_into(qtbot, inner.field_widget("dampening"), "0.5")
    click_box(qtbot, inner.field_widget("nesterov"))
    assert form.value().momentum == optim.MomentumConfig(0.9, 0.5, True)
    clip = form.editors["gradient_clipping"]
    clip.group.setChecked(True)
    kind = clip.form.field_widget("kind")
    assert isinstance(kind, QComboBox) and [kind.itemText(i) for i in range(kind.count())] == ["norm", "value"]
    type_into(qtbot, clip.form.field_widget("threshold"), "1.5")
    kind.setCurrentIndex(1)
    assert form.value().gradient_clipping == optim.GradientClippingConfig("value", 1.5)


def test_literal_fields_are_combo_boxes_and_set_value_round_trips(make):
    @dataclass
    class Cfg:
        mode: Literal["fast", "exact"] = "exact"
        size: int = 3

    form = make(Cfg)
    assert form.field_widget("mode").currentText() == "exact"
    form.set_value(Cfg("fast", 7))
    assert form.value() == Cfg("fast", 7)


def test_only_dataclasses_make_forms():
    with pytest.raises(TypeError, match="expected a dataclass"):
        DataclassForm(dict)
