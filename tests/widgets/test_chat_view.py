"""The chat view's conversation: what each compared column's model is shown, how an answer ends, and
the buttons that follow the conversation and whether an answer is being generated."""
from widgets.chat_view import ChatView, Conversation


def test_each_column_is_shown_its_own_answers_and_a_pending_answer_is_not_history():
    c = Conversation()
    c.add_user("hi")
    c.begin_answer(2)
    assert c.messages(0, "Be kind") == [{"role": "system", "content": "Be kind"}, {"role": "user", "content": "hi"}]
    c.append(0, "hel")
    c.append(0, "lo")
    c.append(1, "hey")
    c.end_answer()
    c.add_user("ok")
    assert c.messages(1) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"},
                             {"role": "user", "content": "ok"}]
    assert c.messages(0, "  ")[1] == {"role": "assistant", "content": "hello"}  # a blank system prompt is none
    c.begin_answer(1)  # compared no more: the second column would see the first's answer to this turn
    c.end_answer(["sure"], stopped=True)
    assert c.turns[-1]["stopped"] == [True]
    assert c.messages(1)[-1] == {"role": "assistant", "content": "sure"}
    c.drop_answer()
    assert c.messages(0)[-1] == {"role": "user", "content": "ok"} and c.can_regenerate()
    c.clear()
    assert len(c) == 0 and not c.can_regenerate()


def test_the_transcripts_and_buttons_follow_the_conversation(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_columns(["Before", "After"])
    assert not view.clear_button.isEnabled() and not view.regenerate_button.isEnabled()
    sent = []
    view.send_requested.connect(sent.append)
    view.input.setPlainText("a <b> question")
    view.send_button.click()
    assert sent == ["a <b> question"]
    view.conversation.add_user(sent[0])
    view.conversation.begin_answer(2)
    view.set_running(True)
    view.refresh()
    view.append(0, "first")
    view.append(1, "second")
    assert not view.send_button.isEnabled() and not view.clear_button.isEnabled()
    assert "a <b> question" in view.transcript(0) and view.transcript(0).rstrip().endswith("first")
    assert view.transcript(1).rstrip().endswith("second")
    view.conversation.end_answer(stopped=True)
    view.set_running(False)
    view.refresh()
    assert "stopped" in view.transcript(0) and view.regenerate_button.isEnabled() and view.clear_button.isEnabled()
    view.set_can_send(False, "no tokenizer")
    assert not view.send_button.isEnabled() and view.send_button.toolTip() == "no tokenizer"


def test_a_transcript_showing_its_end_keeps_the_latest_answer_in_view_when_made_smaller(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 700)
    view.show()
    qtbot.waitExposed(view)
    for i in range(6):
        view.conversation.add_user(f"question {i}")
        view.conversation.begin_answer(1)
        view.conversation.end_answer([f"answer {i}"])
    view.refresh()
    bar = view.transcripts[0].verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() == 0)  # all of it fits: shown from the top, which is its end
    view.resize(600, 260)
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    assert bar.value() == bar.maximum()  # the latest answer, not the first question
    bar.setValue(0)  # a user who scrolled up stays where they are
    view.resize(600, 240)
    qtbot.wait(50)
    assert bar.value() == 0
