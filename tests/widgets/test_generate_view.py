"""The Generate tab's sampling boxes start at, and return to, one table of defaults."""
from widgets.generate_view import DEFAULTS, GenerateView


def _boxes(view):
    return {"max_new_tokens": view.max_new_tokens.value(), "temperature": view.temperature.value(),
            "top_k": view.top_k.value(), "top_p": view.top_p.value(),
            "repetition_penalty": view.repetition_penalty.value()}


def test_the_boxes_start_at_the_defaults_and_a_model_without_its_own_returns_them(qtbot):
    view = GenerateView()
    qtbot.addWidget(view)
    assert _boxes(view) == DEFAULTS
    view.set_defaults({"max_new_tokens": 7, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.3})
    assert _boxes(view) != DEFAULTS
    view.set_defaults({})  # a model whose folder names none: the same values the tab opened with
    assert _boxes(view) == DEFAULTS
