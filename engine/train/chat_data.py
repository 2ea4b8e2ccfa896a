"""Conversations rendered with the model's chat template, and the loss on the assistant's tokens only.

    from engine.train.conversations import read_conversations
    from engine.train.chat_data import conversation_tokens
    template = read_chat_template(folder); tokenizer = load_tokenizer(folder)
    for conv in read_conversations("chats.jsonl"):
        row = conversation_tokens(conv, template, tokenizer)   # row.ids, row.learn, row.targets
    data = load_conversation_data("chats.jsonl", template, tokenizer, block_size=512)  # a TextDataset

`engine.train.conversations` reads the records, this module renders and masks them.

Which characters the assistant said: the template's `{% generation %}` spans where it has them;
else, for every assistant turn, the conversation is rendered up to and including that turn and up
to the turn before it with the generation prompt, and the difference of the two texts is the turn
(its text and what the template closes it with, the end-of-turn token). A template that renders a
prefix as other than the start of the whole conversation (one that drops history) is refused, not
guessed at. Character spans become token flags through the tokenizer's offsets: a token is learnt
when its characters overlap a span -- never by searching for token patterns. A conversation in which
no token is learnt is an error naming its file and line.

Message text is tokenized as `encode_chat` tokenizes it: special-token text inside a message is
ordinary text.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .losses import IGNORE_INDEX
from .conversations import read_conversations
from .text import TextDataError, TextDataset, Tokens, check_rows_fit, padded_rows
from .chat_template import _CLOSE, _OPEN, ChatTemplate, ChatTemplateError, _encode_marked, _mark_specials

__all__ = ["ConversationTokens", "assistant_spans", "conversation_tokens", "load_conversation_data", "pack_rows",
           "describe_conversation_data",
           "packed_conversation_rows"]


@dataclass
class ConversationTokens:
    """A rendered conversation: `text` (as the template renders it), the assistant's character
    `spans` in it, the token `ids`, `learn` (True: the token is the assistant's), and `offsets`."""

    text: str
    spans: list[tuple[int, int]]
    ids: np.ndarray  # int64
    learn: np.ndarray  # bool
    offsets: np.ndarray  # (n, 2) character [start, end) of each token in `text`

    @property
    def inputs(self) -> np.ndarray:
        return self.ids[:-1]

    @property
    def targets(self) -> np.ndarray:
        """ids[1:], IGNORE_INDEX where the next token is not the assistant's."""
        return np.where(self.learn[1:], self.ids[1:], IGNORE_INDEX).astype(np.int64)


def _render(conv, template: ChatTemplate, messages, generation_prompt: bool, variables):
    try:
        return template.render(messages, add_generation_prompt=generation_prompt, **variables)
    except ChatTemplateError as e:
        raise TextDataError(conv.file, str(e), line=conv.line) from None


def assistant_spans(conv, template: ChatTemplate, messages=None, **variables) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character spans of its assistant turns."""
    messages = conv.messages if messages is None else messages
    full = _render(conv, template, messages, False, variables)
    if template.has_generation_blocks:
        return full.text, list(full.generation_spans)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(conv, template, messages[:i], True, variables).text
        upto = _render(conv, template, messages[:i + 1], False, variables).text
        if not (upto.startswith(before) and full.text.startswith(upto)):
            raise TextDataError(conv.file, f"turn {i} (assistant): the template {template.where} renders the "
                                           f"conversation up to this turn as other than the start of the whole "
                                           f"conversation, so the assistant's text cannot be told from the rest; use "
                                           f"a template with {{% generation %}} blocks", line=conv.line)
        spans.append((len(before), len(upto)))
    return full.text, spans


def conversation_tokens(conv, template: ChatTemplate, tokenizer, **variables) -> ConversationTokens:
    """`conv` (an `engine.train.conversations.Conversation`) rendered with `template`, tokenized with
    `tokenizer` (a `TextTokenizer`), and the flags of the assistant's tokens."""
    messages, marked_variables = _mark_specials(tokenizer, conv.messages, variables)
    marked, spans = assistant_spans(conv, template, messages, **marked_variables)
    ids, offsets = _encode_marked(tokenizer, marked)
    ids_a = np.asarray(ids, dtype=np.int64)
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    learn = np.zeros(len(ids_a), dtype=bool)
    for a, b in spans:
        learn |= (offs[:, 0] < b) & (offs[:, 1] > a)
    if not learn[1:].any():
        raise TextDataError(conv.file, f"expected assistant tokens to learn, found none: the template "
                                       f"{template.where} rendered {len(spans)} assistant span(s) holding no token "
                                       f"after the first, so the loss would be empty", line=conv.line)
    # the text and offsets without the marks
    keep = np.array([c not in (_OPEN, _CLOSE) for c in marked], dtype=bool)
    shift = np.concatenate([[0], np.cumsum(~keep)])
    text = "".join(c for c, k in zip(marked, keep) if k)
    offs = offs - shift[offs]
    spans = [(a - int(shift[a]), b - int(shift[b])) for a, b in spans]
    return ConversationTokens(text, spans, ids_a, learn, offs)


def load_conversation_data(path, template: ChatTemplate, tokenizer, block_size: int | None = None,
                           truncate: bool = False, vocab_size: int | None = None,
                           max_positions: int | None = None, packing: bool = False, **variables) -> TextDataset:
    """Token rows of a conversation file, targets IGNORE_INDEX but on the assistant's tokens: a
    `TextDataset` as `engine.train.text.load_text_data` makes.

    Without `packing`, one right-padded row per conversation. With `packing` (needs `block_size`),
    whole conversations are packed into rows of `block_size` positions (best fit, longest first;
    a conversation is never split across rows): the dataset's `segment_ids` (1.. per conversation
    of a row, 0 on pads) and `position_ids` (from 0 in each conversation) make each conversation
    attend only to itself, so a packed row's loss is the sum of its conversations' unpacked ones.

    `block_size`: positions per row (without: the longest conversation's). A conversation longer
    than the block is refused unless `truncate`; then it is cut at the block and the dataset's
    `truncated` counts the conversations cut (the app says so). `vocab_size` / `max_positions`:
    the model's limits, refused past. The dataset's `target_tokens` counts the assistant tokens learnt."""
    if packing and block_size is None:
        raise ValueError("load_conversation_data: packing needs a block size (positions per row)")
    rows = [(conv, conversation_tokens(conv, template, tokenizer, **variables)) for conv in read_conversations(path)]
    if vocab_size is not None:
        for conv, row in rows:
            if row.ids.size and int(row.ids.max()) >= vocab_size:
                raise TextDataError(conv.file, f"token id {int(row.ids.max())} is out of range for the model's "
                                               f"{vocab_size} token embeddings: the tokenizer does not match the "
                                               f"model", line=conv.line)
    longest = max(len(row.ids) for _, row in rows) - 1
    T = int(block_size) if block_size is not None else longest
    if max_positions is not None and T > max_positions:
        raise TextDataError(path, f"{T} positions a row is more than the model's {max_positions} positions "
                                  f"(max_position_embeddings): choose a block size of at most {max_positions}")
    windows, truncated = [], 0
    for conv, row in rows:
        ids, learn = row.ids, row.learn
        if len(ids) - 1 > T:
            if not truncate:
                raise TextDataError(conv.file, f"the conversation has {len(ids)} tokens, {len(ids) - 1} positions "
                                               f"after the shift, more than the block size {T}: raise the block "
                                               f"size, or truncate longer conversations", line=conv.line)
            ids, learn, truncated = ids[:T + 1], learn[:T + 1], truncated + 1
        if learn[1:].any():  # cut before the first answer: nothing to learn, dropped
            windows.append((ids, learn))
    if not windows:
        raise TextDataError(path, f"expected conversations with assistant tokens to learn within the block size "
                                  f"{T}, found none")
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_id or 0)
    bins = pack_rows([len(w[0]) - 1 for w in windows], T) if packing else [[i] for i in range(len(windows))]
    all_ids = np.concatenate([w[0] for w in windows]).astype(np.uint32)
    check_rows_fit(path, Tokens(all_ids, np.concatenate([w[1] for w in windows]),
                             np.cumsum([len(w[0]) for w in windows])), len(bins), T)
    if packing:
        inputs, targets, mask, segments, positions = packed_conversation_rows(windows, bins, T, pad_id)
        extra = {"segment_ids": segments, "position_ids": positions}
    else:
        inputs, targets, mask = padded_rows(windows, T, pad_id)
        extra = {}
    data = TextDataset(inputs, targets, mask, T, packing, Path(path).name, len(rows), tokenizer, **extra)
    data.truncated = truncated
    return data


def describe_conversation_data(data: TextDataset, chat_format: str) -> str:
    """What a conversation dataset holds, for the user: its format, conversations, the assistant
    tokens learnt, the rows, and how many conversations were cut at the block size."""
    def n(count, what):
        return f"{count} {what}" + ("" if count == 1 else "s")

    rows = (f"packed into {n(len(data), 'row')}" if data.packing else n(len(data), "padded row")) + \
        f" of {data.block_size} positions"
    cut = getattr(data, "truncated", 0)
    return (f"conversation data ({chat_format} format): {n(data.documents, 'conversation')}, "
            f"{n(data.target_tokens, 'assistant token')} learnt, {rows}"
            + (f"; {n(cut, 'conversation')} truncated at the block size, the rest of their turns not learnt"
               if cut else ""))


def pack_rows(lengths, block_size: int) -> list[list[int]]:
    """Indices of sequences of `lengths` (each at most `block_size`) grouped into rows of at most
    `block_size` positions: best fit, longest first (each sequence goes to the fullest row it
    fits in, else a new row); each row's indices in file order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free: list[tuple[int, int]] = []  # (room left, row), sorted
    bins: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        if n > block_size:
            raise ValueError(f"pack_rows: a sequence of {n} positions does not fit a row of {block_size}")
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            room, row = free.pop(k)
        else:
            room, row = block_size, len(bins)
            bins.append([])
        bins[row].append(i)
        if room - n > 0:
            bisect.insort(free, (room - n, row))
    return [sorted(b) for b in bins]


def packed_conversation_rows(windows, bins, block_size: int, pad_id: int):
    """(inputs, targets, attention_mask, segment_ids, position_ids) `[rows, block_size]` int64 of
    (ids, learn) `windows` packed as `bins` says: each window shifted (inputs ids[:-1], targets
    ids[1:], IGNORE_INDEX where not learnt), its segment 1.. in its row, its positions from 0."""
    shape = (len(bins), block_size)
    inputs = np.full(shape, pad_id, dtype=np.int64)
    targets = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros(shape, dtype=np.int64)
    segments = np.zeros(shape, dtype=np.int64)
    positions = np.zeros(shape, dtype=np.int64)
    for r, members in enumerate(bins):
        at = 0
        for seg, i in enumerate(members, start=1):
            ids, learn = windows[i]
            k = len(ids) - 1
            inputs[r, at:at + k] = ids[:-1]
            targets[r, at:at + k] = np.where(learn[1:], ids[1:], IGNORE_INDEX)
            mask[r, at:at + k] = 1
            segments[r, at:at + k] = seg
            positions[r, at:at + k] = np.arange(k)
            at += k
    return inputs, targets, mask, segments, positions
