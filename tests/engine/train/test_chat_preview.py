"""The word diff behind the training row's difference marks."""
from engine.train.chat_preview import differing_spans


def _pieces(text, spans):
    return [text[a:b] for a, b in spans]


def test_each_side_gets_the_words_the_other_lacks():
    a = "user: hi\nbot: Blue<end>\nuser: more"
    b = "user: hi\nbot: <think>day</think> Blue<end>\n"
    only_a, only_b = differing_spans(a, b)
    assert _pieces(b, only_b) == ["<think>day</think> "]
    # `a` lacks it before "Blue": an empty span there; what `a` has after all of `b` (the later
    # turns) is not a difference, but with prefix=False it is
    assert only_a == [(a.index("Blue"), a.index("Blue"))]
    only_a, _ = differing_spans(a, b, prefix=False)
    assert _pieces(a, only_a) == ["", "user: more"]


def test_equal_texts_and_a_replaced_word():
    assert differing_spans("one two three", "one two three") == ([], [])
    only_a, only_b = differing_spans("one two three", "one TWO three")
    assert (_pieces("one two three", only_a), _pieces("one TWO three", only_b)) == (["two"], ["TWO"])
