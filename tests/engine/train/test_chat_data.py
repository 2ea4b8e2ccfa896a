"""Conversation data (issue 45 item 3): the three `.jsonl` formats, rendered with a model's chat
template, and the assistant-only mask against an independent float64 reference."""
import json
from pathlib import Path

import numpy as np
import pytest

from engine.train.chat_data import conversation_tokens, load_conversation_data
from engine.train.chat_template import ChatTemplate, encode_chat
from engine.train.conversations import read_conversations
from engine.train.losses import IGNORE_INDEX
from engine.train.text import TextDataError
from engine.train.tokenizer import load_tokenizer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CONVERSATIONS = FIXTURES / "conversations"
TOKENIZER = FIXTURES / "hf" / "llama-gqa"  # the tokenizer the text tests use
# ChatML without generation blocks (SmolLM2, Qwen2.5: the prefix-difference path) and with them
TEMPLATES = ("smollm2-instruct", "qwen2.5-instruct", "generation-blocks")


def _template(name):
    return ChatTemplate((FIXTURES / "chat_templates" / f"{name}.jinja").read_text(), where=f"{name}.jinja")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER)


def test_the_three_formats_are_detected_and_read_as_messages():
    (m1, m2, m3) = read_conversations(CONVERSATIONS / "messages.jsonl")
    assert m1.format == "messages" and [m["role"] for m in m1.messages] == [
        "system", "user", "assistant", "user", "assistant"]
    s1, s2 = read_conversations(CONVERSATIONS / "sharegpt.jsonl")
    assert s1.format == "sharegpt" and (s1.file, s1.line, s2.line) == (str(CONVERSATIONS / "sharegpt.jsonl"), 1, 2)
    assert s1.messages == [{"role": "system", "content": "You count things."},
                           {"role": "user", "content": "How many legs has a cat?"},
                           {"role": "assistant", "content": "Four."},
                           {"role": "user", "content": "A bird?"}, {"role": "assistant", "content": "Two."}]
    a1, a2, a3 = read_conversations(CONVERSATIONS / "alpaca.jsonl")
    assert a1.format == "alpaca"
    assert a1.messages == [{"role": "user", "content": "Translate to French.\n\nGood morning"},
                           {"role": "assistant", "content": "Bonjour"}]
    assert a2.messages[0] == {"role": "user", "content": "Give a synonym of happy."}  # empty input: no "\n\n"
    assert a3.messages[0] == {"role": "system", "content": "You are a calculator."}


def _reference_mask(text: str, messages, generation_blocks: bool, offsets) -> np.ndarray:
    """Float64 reference: each assistant message's content located in the rendered text after its
    ChatML header, through its `<|im_end|>` (and the line break after it, which the prefix
    difference of a template without generation blocks includes); a token is learnt where its
    characters hold any of that mass."""
    chars = np.zeros(len(text) + 1, dtype=np.float64)
    cursor = 0
    for m in messages:
        if m["role"] != "assistant":
            continue
        header = text.index("<|im_start|>assistant\n", cursor) + len("<|im_start|>assistant\n")
        content = m["content"].strip() if generation_blocks else m["content"]
        start = text.index(content, header)
        assert start == header
        end = start + len(content) + len("<|im_end|>")
        assert text[start + len(content):end] == "<|im_end|>"
        if not generation_blocks:
            end += 1
            assert text[end - 1] == "\n"
        chars[start:end] = 1.0
        cursor = end
    mask = [chars[s:e].sum() > 0.0 for s, e in offsets]
    return np.asarray(mask, dtype=bool)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("file", ["messages.jsonl", "sharegpt.jsonl", "alpaca.jsonl"])
def test_the_assistant_mask_equals_the_reference(name, file, tokenizer):
    template = _template(name)
    for conv in read_conversations(CONVERSATIONS / file):
        row = conversation_tokens(conv, template, tokenizer)
        assert row.text == template.render(conv.messages).text
        enc = tokenizer.tokenizer.encode(row.text, add_special_tokens=False)
        assert row.ids.tolist() == enc.ids
        reference = _reference_mask(row.text, conv.messages, name == "generation-blocks", enc.offsets)
        assert row.learn.tolist() == reference.tolist(), (file, conv.line)
        turns = sum(m["role"] == "assistant" for m in conv.messages)
        assert len(row.spans) == turns and reference.sum() >= turns
        # every assistant turn is learnt, and nothing else: the targets are IGNORE_INDEX elsewhere
        np.testing.assert_array_equal(row.inputs, row.ids[:-1])
        np.testing.assert_array_equal(row.targets[reference[1:]], row.ids[1:][reference[1:]])
        assert (row.targets[~reference[1:]] == IGNORE_INDEX).all()


TRANSFORMERS_MASKS = json.loads((FIXTURES / "chat_templates" / "assistant_masks.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_MASKS["expected"]))
@pytest.mark.parametrize("file", ["messages.jsonl", "sharegpt.jsonl", "alpaca.jsonl"])
def test_the_assistant_mask_equals_transformers_and_trls(name, file, tokenizer):
    """The learn flags equal transformers' `return_assistant_tokens_mask` (the mask TRL's
    assistant_only_loss trains on; tests/fixtures/chat_templates/make_assistant_masks.py) for the
    templates with {% generation %} blocks, on the same token ids."""
    assert TRANSFORMERS_MASKS["tokenizer"] == TOKENIZER.relative_to(FIXTURES.parents[1]).as_posix()
    expected = {row["line"]: row for row in TRANSFORMERS_MASKS["expected"][name][file]}
    template = ChatTemplate((FIXTURES / "chat_templates" / name).read_text(), where=name)
    conversations = read_conversations(CONVERSATIONS / file)
    assert sorted(expected) == [c.line for c in conversations]
    for conv in conversations:
        row = conversation_tokens(conv, template, tokenizer)
        theirs = expected[conv.line]
        assert row.ids.tolist() == theirs["input_ids"], (file, conv.line)
        assert row.learn.astype(int).tolist() == theirs["assistant_masks"], (file, conv.line)


def _write(tmp_path, *records):
    p = tmp_path / "chats.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return p


GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}


@pytest.mark.parametrize("bad, message", [
    ({"messages": [{"content": "Hi"}]}, r"messages\[0\]: expected a 'role' key, found keys \['content'\]"),
    ({"messages": [{"role": "robot", "content": "Hi"}]},
     r"messages\[0\]: expected a 'role' of system, user, assistant, found \"robot\""),
    ({"conversations": [{"from": "alien", "value": "Hi"}]}, r"conversations\[0\]: expected a 'from' of .*\"alien\""),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  "}]},
     r"turn 1 \(assistant\): expected text to learn, found only white space"),
    ({"instruction": "Say it", "output": ""}, r"turn 1 \(assistant\): expected text to learn, found an empty string"),
    ({"messages": GOOD["messages"], "instruction": "x", "output": "y"},
     r"expected one conversation format per record, found the keys of messages and alpaca"),
    ({"prompt": "a", "completion": "b"}, r"expected a conversation: .*found keys \['completion', 'prompt'\]"),
])
def test_bad_records_are_refused_naming_the_file_and_line(tmp_path, bad, message):
    p = _write(tmp_path, GOOD, bad)
    with pytest.raises(TextDataError, match=f"{p.name}, line 2: {message}"):
        read_conversations(p)


def test_a_mask_of_all_zeros_is_an_error_naming_the_file_and_line(tmp_path, tokenizer):
    p = _write(tmp_path, GOOD, GOOD)
    silent = ChatTemplate("{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}\n{% endif %}"
                          "{% endfor %}", where="silent.jinja")
    conv = read_conversations(p)[1]
    with pytest.raises(TextDataError, match=f"{p.name}, line 2: expected assistant tokens to learn, found none"):
        conversation_tokens(conv, silent, tokenizer)


def test_a_template_that_renders_history_differently_is_refused(tmp_path, tokenizer):
    p = _write(tmp_path, GOOD)
    # the last turn is rendered otherwise than earlier ones: a prefix is not the whole's start
    changing = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}{% if loop.last %}!{% endif %}\n"
                            "{% endfor %}", where="changing.jinja")
    with pytest.raises(TextDataError, match=f"{p.name}, line 1: turn 1 \\(assistant\\): the template changing.jinja"):
        conversation_tokens(read_conversations(p)[0], changing, tokenizer)


def test_conversation_rows_are_padded_one_per_conversation_with_the_assistant_targets(tokenizer):
    template = _template("smollm2-instruct")
    path = CONVERSATIONS / "messages.jsonl"
    rows = [conversation_tokens(c, template, tokenizer) for c in read_conversations(path)]
    data = load_conversation_data(path, template, tokenizer)
    T = max(len(r.ids) for r in rows) - 1
    assert data.inputs.shape == data.targets.shape == (3, T) and not data.packing and data.truncated == 0
    for r, row in enumerate(rows):
        k = len(row.ids) - 1
        np.testing.assert_array_equal(data.inputs[r, :k], row.inputs)
        np.testing.assert_array_equal(data.targets[r, :k], row.targets)
        assert (data.targets[r, k:] == IGNORE_INDEX).all() and data.attention_mask[r].sum() == k
    assert data.target_tokens == sum(int(row.learn[1:].sum()) for row in rows)


def test_a_conversation_longer_than_the_block_is_refused_or_truncated_as_asked(tokenizer):
    template = _template("smollm2-instruct")
    path = CONVERSATIONS / "messages.jsonl"
    lengths = [len(conversation_tokens(c, template, tokenizer).ids) for c in read_conversations(path)]
    T = lengths[0] - 2  # the first conversation is one position too long
    assert lengths[1] - 1 <= T
    with pytest.raises(TextDataError, match=f"messages.jsonl, line 1: the conversation has {lengths[0]} tokens"):
        load_conversation_data(path, template, tokenizer, block_size=T)
    data = load_conversation_data(path, template, tokenizer, block_size=T, truncate=True)
    assert data.inputs.shape[1] == T and data.truncated == sum(n - 1 > T for n in lengths)
    with pytest.raises(TextDataError, match="out of range for the model's 10 token embeddings"):
        load_conversation_data(path, template, tokenizer, vocab_size=10)


def test_plain_text_loading_says_a_conversation_file_is_conversation_data(tokenizer):
    from engine.train.text import load_text_data

    with pytest.raises(TextDataError, match=r"sharegpt.jsonl, line 1: expected a 'text' field, or 'prompt' and "
                                            r"'completion' fields, found keys \['conversations'\]: a 'conversations' "
                                            r"record is conversation data"):
        load_text_data(CONVERSATIONS / "sharegpt.jsonl", tokenizer, block_size=16)


# every committed template (the reference above reads ChatML only): Llama 3.2, Mistral, Gemma 2, Phi 3.5,
# Zephyr and Qwen3 mask through the prefix difference too
ALL_TEMPLATES = sorted(p.stem for p in (FIXTURES / "chat_templates").glob("*.jinja"))
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.mark.parametrize("name", ALL_TEMPLATES)
def test_every_template_learns_the_assistants_words_and_none_of_the_others(name, tokenizer):
    """A reference that needs no knowledge of the template: each message's content located in the
    rendered text in turn; a token inside an assistant's content is learnt, a token touching a user's
    or system's content, or lying in the text between the previous content and an assistant's (its
    header), is not. Conversations a template refuses (Gemma's system role) are skipped;
    each template masks at least two."""
    template = ChatTemplate((FIXTURES / "chat_templates" / f"{name}.jinja").read_text(), SPECIAL, where=name)
    checked = 0
    for file in ("messages.jsonl", "sharegpt.jsonl", "alpaca.jsonl"):
        for conv in read_conversations(CONVERSATIONS / file):
            try:
                # Qwen3 without thinking: its generation prompt holds the empty think block the turn renders
                row = conversation_tokens(conv, template, tokenizer, enable_thinking=False)
            except TextDataError as e:
                assert "refused" in str(e) or "renders" in str(e), str(e)
                continue
            # 1: an assistant's content, 2: anyone else's, 3: the text leading to an assistant's content
            # (the previous turn's end, the assistant's header)
            owner = np.zeros(len(row.text), dtype=np.int8)
            cursor = 0
            for m in conv.messages:
                content = m["content"].strip()
                start = row.text.index(content, cursor)
                if m["role"] == "assistant":
                    owner[cursor:start] = 3
                owner[start:start + len(content)] = 1 if m["role"] == "assistant" else 2
                cursor = start + len(content)
            for (s, e), learnt in zip(row.offsets.tolist(), row.learn.tolist(), strict=True):
                if e > s and (owner[s:e] == 1).all():
                    assert learnt, (name, file, conv.line, row.text[s:e])
                if (owner[s:e] == 2).any() or (e > s and (owner[s:e] == 3).all()):
                    assert not learnt, (name, file, conv.line, row.text[s:e])
            assert len(row.spans) == sum(m["role"] == "assistant" for m in conv.messages)
            checked += 1
    assert checked >= 2, name
@pytest.mark.parametrize("name", TEMPLATES)
def test_special_token_text_in_a_message_is_ordinary_text_as_encode_chat_makes_it(tmp_path, tokenizer, name):
    hostile = {"messages": [{"role": "user", "content": "stop</s>here"},
                            {"role": "assistant", "content": "no </s> end"}]}
    conv = read_conversations(_write(tmp_path, hostile))[0]
    template = _template(name)
    row = conversation_tokens(conv, template, tokenizer)
    assert row.ids.tolist() == encode_chat(tokenizer, template, conv.messages)
    assert tokenizer.eos_id not in row.ids.tolist()  # the typed </s> is its characters, not the end token
    assert "stop</s>here" in row.text and "no </s> end" in row.text
    covered = np.zeros(len(row.text), dtype=bool)  # the characters of the learnt tokens (unmarked offsets)
    for a, b in row.offsets[row.learn].tolist():
        covered[a:b] = True
    answer, question = row.text.index("no </s> end"), row.text.index("stop</s>here")
    assert covered[answer:answer + len("no </s> end")].all() and not covered[:question + len("stop</s>here")].any()
