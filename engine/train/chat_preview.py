"""A training row as the loss sees it, beside the renderings the model sees at inference.

    row = preview_row(conv, template, tokenizer)   # row.tokens.ids / .learn, row.special, row.inference
    a_spans, b_spans = differing_spans(row.text, row.inference[0].text)

`preview_row` renders one conversation (`engine.train.chat_data.conversation_tokens`: the ids and
the learnt flags training uses) and the texts the model is given when it talks:

- "history": the messages up to the last user turn with the generation prompt (what the model
  reads before it writes the last answer);
- one per assistant turn: the conversation up to and including that turn, rendered with that turn
  last (what the model writes at inference when it gives that answer). A template that drops
  reasoning from the history (Qwen3's `<think>` blocks of answers before the last user turn) keeps
  it here and drops it from the training row, and `differing_spans` shows where.

`differing_spans` diffs two texts by words, spaces and punctuation (not by characters: fast on long
rows, and a difference reads as whole pieces), and gives each text's character spans that the
other does not have.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import numpy as np

from .chat_data import ConversationTokens, conversation_tokens
from .chat_template import ChatTemplate, ChatTemplateError
from .text import TextDataError

__all__ = ["InferenceRendering", "RowPreview", "differing_spans", "inference_renderings", "preview_row",
           "special_token_ids"]

_PIECES = re.compile(r"\s+|\w+|[^\w\s]", re.UNICODE)


@dataclass
class InferenceRendering:
    """A text the model is given at inference (`error`: why the template would not render it)."""

    label: str
    text: str
    error: str = ""


@dataclass
class RowPreview:
    """One conversation's training rendering (`text`), its row (`tokens`), each token's vocabulary
    string (`pieces`) and whether it is a special token (`special`), and the inference renderings of
    the same messages. Where training refuses the conversation, `tokens` is None and `error` says
    why (the renderings still show: a template that drops history is refused, and they show what)."""

    text: str
    tokens: ConversationTokens | None
    pieces: list[str]
    special: np.ndarray  # bool, one per token
    inference: list[InferenceRendering] = field(default_factory=list)
    error: str = ""

    @property
    def trained(self) -> int:
        return int(self.tokens.learn.sum()) if self.tokens is not None else 0


def special_token_ids(tokenizer) -> set[int]:
    """The ids of the tokenizer's special tokens (`tokenizer`: a `TextTokenizer`)."""
    tok = tokenizer.tokenizer
    decoder = tok.get_added_tokens_decoder() if hasattr(tok, "get_added_tokens_decoder") else {}
    return {int(i) for i, t in decoder.items() if getattr(t, "special", False)}


def _rendering(label: str, template: ChatTemplate, messages, generation_prompt: bool, variables) -> InferenceRendering:
    try:
        return InferenceRendering(label, template.render(messages, add_generation_prompt=generation_prompt,
                                                         **variables).text)
    except ChatTemplateError as e:
        return InferenceRendering(label, "", str(e))


def inference_renderings(messages, template: ChatTemplate, **variables) -> list[InferenceRendering]:
    """The history up to the last user turn with the generation prompt, then, for every assistant
    turn, the conversation up to it with that turn rendered last."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    out = []
    if users:
        out.append(_rendering("History up to the last user turn, with the generation prompt", template,
                              messages[:users[-1] + 1], True, variables))
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k, i in enumerate(answers):
        out.append(_rendering(f"As the model writes answer {k + 1} of {len(answers)} (message {i + 1})", template,
                              messages[:i + 1], False, variables))
    return out


def preview_row(conv, template: ChatTemplate, tokenizer, **variables) -> RowPreview:
    """`conv` (an `engine.train.conversations.Conversation`) as training renders, tokenizes and
    masks it, with its inference renderings. A conversation training refuses (`TextDataError`) comes
    back with `tokens` None and the refusal in `error`; one the template will not render at all raises
    the template's `ChatTemplateError`."""
    inference = inference_renderings(conv.messages, template, **variables)
    try:
        row = conversation_tokens(conv, template, tokenizer, **variables)
    except TextDataError as e:
        text = template.render(conv.messages, **variables).text
        return RowPreview(text, None, [], np.zeros(0, dtype=bool), inference, str(e))
    specials = special_token_ids(tokenizer)
    ids = [int(i) for i in row.ids]
    pieces = [tokenizer.id_to_token(i) or "" for i in ids]
    special = np.fromiter((i in specials for i in ids), dtype=bool, count=len(ids))
    return RowPreview(row.text, row, pieces, special, inference)


def _split(text: str) -> tuple[list[str], list[int]]:
    pieces, starts = [], []
    for m in _PIECES.finditer(text):
        pieces.append(m.group(0))
        starts.append(m.start())
    return pieces, starts


def differing_spans(a: str, b: str, prefix: bool = True) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The [start, end) character spans of `a` not in `b`, and of `b` not in `a` (a word diff). An
    empty span of `a` marks where `b` has text that `a` lacks (nothing of `a` differs there).
    `prefix`: `b` renders the start of what `a` renders (the conversation so far), so what `a` has
    after all of `b` (the turns still to come) is not a difference."""
    pa, sa = _split(a)
    pb, sb = _split(b)
    sa.append(len(a))
    sb.append(len(b))
    only_a: list[tuple[int, int]] = []
    only_b: list[tuple[int, int]] = []
    matcher = difflib.SequenceMatcher(None, pa, pb, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        only_a.append((sa[i1], sa[i2]))  # empty where `b` has text that `a` lacks: the place it is missing
        if j2 > j1:
            only_b.append((sb[j1], sb[j2]))
    if prefix and only_a and only_a[-1][1] == len(a) and (not pb or matcher.get_opcodes()[-1][0] == "delete"):
        only_a.pop()  # the rest of the conversation, after everything `b` holds
    return only_a, only_b
