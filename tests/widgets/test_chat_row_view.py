"""The rendered training row (issue 45 item 4): each token's chip is trained or masked exactly as
`conversation_tokens` flags it, and a template that drops reasoning from the history shows where
the training rendering and the inference one differ."""
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QTextCursor

from engine.train.chat_data import conversation_tokens
from engine.train.chat_preview import preview_row, special_token_ids
from engine.train.chat_template import ChatTemplate
from engine.train.conversations import Conversation, read_conversations
from engine.train.tokenizer import load_tokenizer
from widgets.chat_row_view import MISSING, ChatRowView

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOKENIZER = FIXTURES / "hf" / "llama-gqa"


def _template(name):
    return ChatTemplate((FIXTURES / "chat_templates" / f"{name}.jinja").read_text(), where=f"{name}.jinja")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER)


@pytest.mark.parametrize("name", ["smollm2-instruct", "generation-blocks"])
@pytest.mark.parametrize("file", ["messages.jsonl", "sharegpt.jsonl", "alpaca.jsonl"])
def test_the_chips_are_trained_where_conversation_tokens_learns(qtbot, tokenizer, name, file):
    template = _template(name)
    view = ChatRowView()
    qtbot.addWidget(view)
    for conv in read_conversations(FIXTURES / "conversations" / file):
        row = conversation_tokens(conv, template, tokenizer)
        view.show_row(preview_row(conv, template, tokenizer))
        chips = view.chips()
        assert [i for i, _s, _b in chips] == list(range(len(row.ids)))
        assert [s == "trained" for _i, s, _b in chips] == row.learn.tolist()
        assert 0 < row.learn.sum() < len(row.ids)
        # the tokenizer's special tokens (here <unk> for the ChatML markers it lacks) are bold
        special = special_token_ids(tokenizer)
        assert [b for _i, _s, b in chips] == [int(i) in special for i in row.ids]
        n, t = len(row.ids), int(row.learn.sum())
        assert view.counts.text().startswith(f"{n:,} tokens · {t:,} trained")
        # hovering a token names its id and text, and its state
        k = int(row.learn.argmax())
        assert view.token_at(view.token_position(k)) == k
        tip = view.describe_token(k)
        assert f"id {int(row.ids[k])}" in tip and "trained" in tip


def test_the_mouse_over_a_chip_finds_its_token(qtbot, tokenizer):
    conv = read_conversations(FIXTURES / "conversations" / "messages.jsonl")[1]
    template = _template("smollm2-instruct")
    view = ChatRowView()
    view.resize(900, 400)
    qtbot.addWidget(view)
    view.show()
    qtbot.waitExposed(view)
    preview = preview_row(conv, template, tokenizer)
    view.show_row(preview)
    pane = view.training
    for k in (0, int(preview.tokens.learn.argmax()), len(preview.tokens.ids) - 1):
        cursor = QTextCursor(pane.document())
        cursor.setPosition(view.token_position(k))
        rect = pane.cursorRect(cursor)
        assert view.token_at_point(QPoint(rect.x() + 2, rect.center().y())) == k


QWEN3_CHAT = [{"role": "user", "content": "Sky?"},
              {"role": "assistant", "content": "<think>\nIt is day.\n</think>\n\nBlue"},
              {"role": "user", "content": "Grass?"},
              {"role": "assistant", "content": "<think>\nPlants.\n</think>\n\nGreen"}]


def test_a_template_that_drops_reasoning_shows_the_difference(qtbot, tokenizer):
    template = _template("qwen3-0.6b")
    view = ChatRowView()
    qtbot.addWidget(view)
    preview = preview_row(Conversation("chat.jsonl", 3, QWEN3_CHAT, "messages"), template, tokenizer)
    view.show_row(preview)
    # training refuses it (its history is not a prefix of the whole), and says so with the line
    assert preview.tokens is None and "chat.jsonl, line 3" in view.error.error()
    labels = [view.inference_combo.itemText(i) for i in range(view.inference_combo.count())]
    assert labels[0].startswith("History up to the last user turn")
    # the history with the generation prompt is the start of the training rendering: no difference
    view.inference_combo.setCurrentIndex(0)
    assert view.training_differs == [] and view.inference_differs == []
    assert view.inference.toPlainText().endswith("<|im_start|>assistant↵\n")
    # as the model writes its first answer, it writes the reasoning the training row dropped
    view.inference_combo.setCurrentIndex(1)
    text = preview.inference[1].text
    marked = "".join(text[a:b] for a, b in view.inference_differs)
    assert "It is day." in marked and "It is day." not in preview.text
    assert "Blue" not in marked
    # the training row marks where the reasoning is missing: just before its first answer
    blue = preview.text.index("Blue")
    assert view.training_differs == [(blue, blue)]
    shown = view.training.toPlainText()
    assert shown.index(MISSING) == shown.index("Blue") - 1
    assert view.difference_note.text().startswith("1 place(s) differ (29 characters")  # "<think>\nIt is day.\n</think>\n\n"
    # a template that keeps the history as it is (ChatML without reasoning) shows no difference
    plain = [dict(m, content=m["content"].split("</think>\n\n")[-1]) for m in QWEN3_CHAT]
    view.show_row(preview_row(Conversation("chat.jsonl", 3, plain, "messages"), _template("smollm2-instruct"),
                              tokenizer))
    for i in range(view.inference_combo.count()):
        view.inference_combo.setCurrentIndex(i)
        assert view.training_differs == [] and view.inference_differs == [], view.inference_combo.itemText(i)


def test_one_turn_of_the_reasoning_template_trains_and_shows_its_chips(qtbot, tokenizer):
    """With one answer nothing is dropped from a history: training accepts it, and the chips follow
    its learn flags."""
    source = (FIXTURES / "chat_templates" / "qwen3-0.6b.jinja").read_text()
    assert "{% generation %}" not in source
    template = _template("qwen3-0.6b")
    view = ChatRowView()
    qtbot.addWidget(view)
    one_turn = Conversation("chat.jsonl", 1, QWEN3_CHAT[:2], "messages")
    preview = preview_row(one_turn, template, tokenizer)
    view.show_row(preview)
    assert preview.tokens is not None and preview.trained > 0
    assert [s == "trained" for _i, s, _b in view.chips()] == preview.tokens.learn.tolist()
