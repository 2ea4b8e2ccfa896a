"""Issue 18, item 9: small things seen in the window."""
from PySide6.QtCore import Qt


def test_a_negative_contract_axis_is_explained_without_internal_names(opened, qtbot):
    w = opened
    editor = w.contract_editor
    editor.edit.clear()
    qtbot.keyClicks(editor.edit, "[batch, -5] -> [batch, 3]")
    text = editor.error.text()
    assert "-5" in text and "negative" in text, text
    assert "UnaryOp" not in text and "USub" not in text


def test_the_example_input_and_its_error_go_with_the_model(opened, qtbot):
    w = opened
    editor = w.contract_editor
    editor.input.clear()
    qtbot.keyClicks(editor.input, "x: [2, 999")
    assert editor.input_error.text()
    assert w.open_example("spirals")
    assert editor.input.text() != "x: [2, 999"
    assert not editor.input_error.text()
