"""A GGUF file's tokenizer and chat template, from its metadata (`tokenizer.ggml.*`).

A GGUF has no tokenizer.json: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`), the
token types (`token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte),
the merges, the special token ids and the pre-tokenizer's name (`tokenizer.ggml.pre`). This
builds the `tokenizers.Tokenizer` those describe, as transformers' GGUF conversion builds it, so
that ids and text agree with it:

- `tokenizer.ggml.model` "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen2, SmolLM, ...): a BPE
  model over the vocabulary (a token spelled outside the byte-level alphabet is respelled
  through it) and the merges; the pre-tokenizer is byte-level with GPT-2's split, or, for the
  pre-tokenizer names whose split is known (`PRE_TOKENIZER_SPLITS`), that split then byte-level,
  or for those that split digits one by one first ("smollm", "starcoder", ...: `DIGITS_FIRST`),
  that then GPT-2's;
  the decoder byte-level;
- control tokens (type 3) are special tokens (kept whole, skipped when decoding; in a byte-level
  vocabulary only those spelled in its alphabet), user-defined ones (type 4) plain added tokens;

- `tokenizer.ggml.model` "llama" (SentencePiece BPE: Llama 2, Mistral, TinyLlama): a BPE with byte
  fallback over the vocabulary, '▁' for spaces, the merges the file lists or, when it lists none,
  those the tokens' scores imply (`merges_from_scores`); a '▁' before the text as llama.cpp puts it
  when the file says (`tokenizer.ggml.add_space_prefix`: true, before the text and after every
  special token; false, none), else as transformers' GGUF reading does (Metaspace, before the text
  unless it starts with a space);
- the tokens the special ids name (bos, eos, unk, padding) are special tokens too; the text
  gets the BOS token before it when `tokenizer.ggml.add_bos_token` says so (default: yes for
  "llama", no for "gpt2"), the EOS after it likewise (`add_eos_token`, default no).

Other tokenizer models ("t5", "rwkv", ...) are refused, naming them. The chat
template is `tokenizer.chat_template`, with the special tokens' texts (`bos_token`, ...).
"""
from __future__ import annotations

from ..store.errors import RecordError
from ..store.gguf_file import GGUFFile, open_gguf
from ..store.gguf_pre import DIGITS_FIRST, PRE_TOKENIZER_SPLITS
from .chat_template import ChatTemplate
from .tokenizer import TextTokenizer, TokenizerError

__all__ = ["PRE_TOKENIZER_SPLITS", "gguf_chat_template", "load_gguf_tokenizer", "merges_from_scores"]

CONTROL, USER_DEFINED = 3, 4


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _open(path) -> GGUFFile:
    try:
        return open_gguf(path)
    except RecordError as exc:
        raise TokenizerError(str(exc.where or path), exc.reason) from None


def _metadata_list(file: GGUFFile, key: str, required: bool = True):
    value = file.metadata.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, list) and not hasattr(value, "tolist"):
        raise TokenizerError(str(file.path), f"metadata {key!r}: expected an array, found "
                                             f"{'nothing' if value is None else type(value).__name__}")
    return value if isinstance(value, list) else value.tolist()


def load_gguf_tokenizer(source) -> TextTokenizer:
    """The tokenizer of a GGUF file (a path or an open `GGUFFile`); see this file's doc."""
    file = source if isinstance(source, GGUFFile) else _open(source)
    try:
        return _build(file)
    finally:
        if file is not source:
            file.close()


def _special_ids(file: GGUFFile, count: int) -> dict:
    ids = {}
    for name, key in (("pad", "padding"), ("eos", "eos"), ("bos", "bos"), ("unk", "unknown")):
        value = file.metadata.get(f"tokenizer.ggml.{key}_token_id")
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count
        ids[name] = value if ok else None
    return ids


def _merges(file: GGUFFile, where: str) -> list | None:
    merges = _metadata_list(file, "tokenizer.ggml.merges", required=False)
    if merges is None:
        return None
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2:
            raise TokenizerError(where, f"metadata 'tokenizer.ggml.merges'[{i}]: expected two tokens separated by "
                                        f"one space, found {m!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def merges_from_scores(tokens: list, scores: list) -> list:
    """The merges a SentencePiece BPE vocabulary implies (its file lists none), best first: every
    split of a token into two tokens of the vocabulary, ordered by the token's score (higher
    first), then by the longer left and right pieces; the splits of one token by their ids."""
    vocab = {t: i for i, t in enumerate(tokens)}
    scored = dict(zip(tokens, scores))
    found = []
    for token, score in scored.items():
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _build(file: GGUFFile) -> TextTokenizer:
    from tokenizers import AddedToken, processors  # noqa: PLC0415

    where = str(file.path)
    kind = file.metadata.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise TokenizerError(where, f"the GGUF tokenizer model {kind!r} is not supported; Ember reads 'gpt2' "
                                    f"(byte-level BPE) and 'llama' (SentencePiece BPE)")
    tokens = _metadata_list(file, "tokenizer.ggml.tokens")
    if not all(isinstance(t, str) for t in tokens):
        raise TokenizerError(where, "metadata 'tokenizer.ggml.tokens': expected an array of strings")
    types = _metadata_list(file, "tokenizer.ggml.token_type", required=False) or []
    try:
        if kind == "gpt2":
            tok, spelled = _byte_level(file, tokens, where)
        else:
            tok, spelled = _sentencepiece(file, tokens, where), None
    except TokenizerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's message says what is wrong
        raise TokenizerError(where, f"the tokenizers library refused the vocabulary and merges: {exc}") from None
    ids = _special_ids(file, len(tokens))
    special = [t for t, ty in zip(tokens, types) if ty == CONTROL and (spelled is None or set(t) <= spelled)]
    special += [tokens[i] for i in ids.values() if i is not None and tokens[i] not in special]
    if special:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    have = tok.get_vocab(with_added_tokens=True)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
            if ty == USER_DEFINED and t in have]
    if user:
        tok.add_tokens(user)
    add_bos = file.metadata.get("tokenizer.ggml.add_bos_token", kind == "llama") is True and ids["bos"] is not None
    add_eos = file.metadata.get("tokenizer.ggml.add_eos_token", False) is True and ids["eos"] is not None
    if add_bos or add_eos:
        bos, eos = tokens[ids["bos"]] if add_bos else None, tokens[ids["eos"]] if add_eos else None
        single = " ".join(([f"{bos}:0"] if bos else []) + ["$A:0"] + ([f"{eos}:0"] if eos else []))
        pair = single + " " + " ".join(([f"{bos}:1"] if bos else []) + ["$B:1"] + ([f"{eos}:1"] if eos else []))
        marks = [(t, ids[n]) for t, n in ((bos, "bos"), (eos, "eos")) if t is not None]
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=marks)
    context = None
    arch = file.metadata.get("general.architecture")
    if isinstance(arch, str) and isinstance(file.metadata.get(f"{arch}.context_length"), int):
        context = file.metadata[f"{arch}.context_length"]
    return TextTokenizer(tok, where, ids["pad"], ids["eos"], ids["bos"], ids["unk"], context)


def _byte_level(file: GGUFFile, tokens: list, where: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415

    pairs = _merges(file, where)
    if pairs is None:
        raise TokenizerError(where, "metadata 'tokenizer.ggml.merges' is missing (a byte-level BPE needs them)")
    alphabet = _byte_alphabet()
    letters = set(alphabet.values())
    vocab = {}
    for i, t in enumerate(tokens):
        key = t if set(t) <= letters else "".join(alphabet[b] for b in t.encode("utf-8"))
        vocab[key] = i  # a later duplicate wins, as in a dict comprehension
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    pre = file.metadata.get("tokenizer.ggml.pre")
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if pre in DIGITS_FIRST:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
    elif split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, letters


def _sentencepiece(file: GGUFFile, tokens: list, where: str):
    """SentencePiece BPE (Llama 2, Mistral, TinyLlama): byte fallback, '▁' for spaces, one
    prepended to the text's start; the merges from the file or, when it lists none, from the
    tokens' scores (`merges_from_scores`)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: PLC0415

    pairs = _merges(file, where)
    if pairs is None:
        scores = _metadata_list(file, "tokenizer.ggml.scores")
        if len(scores) != len(tokens) or not all(isinstance(x, (int, float)) for x in scores):
            raise TokenizerError(where, f"metadata 'tokenizer.ggml.scores': expected {len(tokens)} numbers, one a "
                                        f"token, found {len(scores)} values")
        pairs = merges_from_scores(tokens, scores)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True, dropout=None))
    space = file.metadata.get("tokenizer.ggml.add_space_prefix")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if isinstance(space, bool):  # llama.cpp's own rule: '▁' before the text and after each special token
        spaces = normalizers.Replace(" ", "\u2581")
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), spaces]) if space else spaces
    else:  # transformers' reading of a file that does not say
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1, right=0)] if space is not False
                                             else []))
    return tok


def gguf_chat_template(source) -> ChatTemplate | None:
    """The chat template of a GGUF file (`tokenizer.chat_template`), None when it has none."""
    file = source if isinstance(source, GGUFFile) else _open(source)
    try:
        text = file.metadata.get("tokenizer.chat_template")
        if text is None:
            return None
        tokens = file.metadata.get("tokenizer.ggml.tokens")
        special = {}
        for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                          ("pad_token", "padding")):
            value = file.metadata.get(f"tokenizer.ggml.{key}_token_id")
            if isinstance(tokens, list) and isinstance(value, int) and 0 <= value < len(tokens):
                special[name] = tokens[value]
        return ChatTemplate(text, special, where=f"{file.path} (tokenizer.chat_template)")
    finally:
        if file is not source:
            file.close()
