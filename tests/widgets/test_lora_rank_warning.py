"""Issue 18, item 9: the LoRA dialog warns when the rank is not below min(d_in, d_out) of a target."""
from tests.widgets.models import Mlp
from tests.widgets.qt_helpers import type_into
from widgets.lora_dialog import LoraDialog


def test_a_rank_as_large_as_a_layer_is_warned_about(qtbot):
    d = LoraDialog(Mlp())
    qtbot.addWidget(d)
    d.show()
    type_into(qtbot, d.rank, "2")
    assert d.rank_warning.isHidden()
    type_into(qtbot, d.rank, "500")
    assert not d.rank_warning.isHidden()
    text = d.rank_warning.text()
    assert "rank 500" in text and "min(d_in, d_out)" in text, text
    assert d.ok_button().isEnabled()  # a warning, not an error
    type_into(qtbot, d.rank, "1")
    assert d.rank_warning.isHidden()
