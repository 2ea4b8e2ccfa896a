"""A SentencePiece-style BPE tokenizer.json (Llama 2, Mistral v0.1, TinyLlama, Gemma) as llama.cpp's
"llama" GGUF tokenizer: the checks that llama.cpp tokenizes as transformers does, whether it puts a
space before the text (`add_space_prefix`), and the scores that make its merges transformers' merges.

llama.cpp's "llama" tokenizer (SentencePiece's BPE) starts from the text's characters (spaces as '▁')
and joins, again and again, the two neighbours whose concatenation is the vocabulary token of the
highest score (leftmost first on a tie); a character left alone that is no token becomes its byte
tokens `<0xNN>`. transformers' BPE with byte fallback joins the neighbours whose pair is the merge
listed first. The two agree when

- every way two symbols could be joined into a token is a listed merge (a symbol: one character, or
  a token some merge makes): transformers' conversion of a SentencePiece model lists every split of
  every piece, so Llama 2's and Mistral's files qualify, a BPE trained by the `tokenizers` library
  does not (it lists one merge a token);
- the merges making the same token are listed together, so that a token's score can be its place in
  the list: the score written is minus the rank of the token's first merge (0 for a token no merge
  makes: single characters, byte tokens, specials; llama.cpp never compares those).

Two merges making one token from overlapping neighbours (`ab a ba`, both making `aba`) are ordered by
their rank in transformers and by their place in the text in llama.cpp; transformers' SentencePiece
conversion lists them by the halves' ids. That case is not checked.

Where the space goes: a normalizer `Prepend('▁')` + `Replace(' ', '▁')` (Llama 2) puts '▁' before the
text and after every special token, as llama.cpp does with `add_space_prefix`; `Replace` alone (Gemma,
whose split at spaces then splits nothing) or a Metaspace pre-tokenizer prepending never puts none. A Metaspace prepending ("always", or "first":
before the first piece only, what transformers writes for `legacy=False`) is refused: it puts no '▁'
before a text that starts with a space, where llama.cpp puts one.
"""
from __future__ import annotations

import re

from .hf_folder import PretrainedError

__all__ = ["BYTE", "UNKNOWN", "spm_scores", "spm_space_prefix", "spm_types"]

UNKNOWN, BYTE = 2, 6
SPACE = "\u2581"
_BYTE = re.compile(r"<0x[0-9A-F]{2}>")


def _obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def _normalizer_steps(norm, where: str) -> list[str]:
    """The normalizer as 'prepend' / 'replace' steps; a PretrainedError for another one."""
    if norm is None:
        return []
    kind = _obj(norm).get("type")
    if kind == "Sequence" and isinstance(norm.get("normalizers"), list):
        return [s for sub in norm["normalizers"] for s in _normalizer_steps(sub, where)]
    if kind == "Prepend" and norm.get("prepend") == SPACE:
        return ["prepend"]
    if kind == "Replace" and _obj(norm.get("pattern")).get("String") == " " and norm.get("content") == SPACE:
        return ["replace"]
    raise PretrainedError(f"tokenizer.json's normalizer step {str(norm)[:160]} has no llama.cpp form: its "
                          f"SentencePiece tokenizer ('llama') only puts '▁' for spaces and, optionally, before "
                          f"the text", where=where)


def spm_space_prefix(doc: dict, model: dict, where: str) -> bool:
    """Whether llama.cpp must put a space before the text (`add_space_prefix`) to tokenize as this
    SentencePiece-style tokenizer.json; a PretrainedError naming what llama.cpp would do otherwise."""
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "ignore_merges"):
        if model.get(key):
            raise PretrainedError(f"tokenizer.json's BPE has {key}={model[key]!r}: llama.cpp's SentencePiece "
                                  f"tokenizer has no such setting", where=where)
    if not isinstance(model.get("vocab"), dict) or not isinstance(model.get("merges"), list):
        raise PretrainedError("tokenizer.json's BPE model has no vocab object or merges list", where=where)
    missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in model["vocab"]]
    if missing:
        raise PretrainedError(f"tokenizer.json's byte-fallback BPE lacks {len(missing)} of the 256 byte tokens "
                              f"(first {missing[0]}): llama.cpp would fall back to bytes it cannot name",
                              where=where)
    steps = _normalizer_steps(doc.get("normalizer"), where)
    pre = doc.get("pre_tokenizer")
    if "replace" in steps and _obj(pre).get("type") == "Split" and _obj(pre.get("pattern")).get("String") == " " \
            and not pre.get("invert"):
        pre = None  # Gemma's split at spaces, which the normalizer has made '▁': it splits nothing
    if pre is None:
        if "replace" not in steps:
            raise PretrainedError("tokenizer.json's SentencePiece-style BPE puts no '▁' for spaces (neither a "
                                  "Replace normalizer nor a Metaspace pre-tokenizer): llama.cpp always does",
                                  where=where)
        return "prepend" in steps
    pre = _obj(pre)
    if pre.get("type") != "Metaspace" or steps:
        raise PretrainedError(f"tokenizer.json's pre-tokenizer {str(pre)[:160]} (with the normalizer steps "
                              f"{steps or 'none'}) has no llama.cpp form: its SentencePiece tokenizer splits nothing",
                              where=where)
    if pre.get("replacement", SPACE) != SPACE or pre.get("split", True):
        raise PretrainedError(f"tokenizer.json's Metaspace pre-tokenizer (replacement {pre.get('replacement')!r}, "
                              f"split {pre.get('split', True)}) splits the text at spaces or spells them otherwise: "
                              f"llama.cpp's SentencePiece tokenizer joins across spaces", where=where)
    scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
    if scheme == "first":
        raise PretrainedError("tokenizer.json's Metaspace pre-tokenizer puts '▁' before the text's first piece "
                              "only (prepend_scheme 'first', transformers' legacy=False), and none before a text "
                              "starting with a space: llama.cpp puts one there and after every special token, so "
                              "it would tokenize chat prompts otherwise", where=where)
    if scheme != "never":
        raise PretrainedError(f"tokenizer.json's Metaspace pre-tokenizer (prepend_scheme {scheme!r}) puts no '▁' "
                              f"before a text that starts with a space: llama.cpp puts one before every text",
                              where=where)
    return False


def spm_scores(model: dict, tokens: list, where: str) -> list[float]:
    """One llama.cpp score a GGUF token (see this file's doc); a PretrainedError when the merges are not
    those llama.cpp's scores can express, naming one that breaks it."""
    vocab = model["vocab"]
    rank, listed, last = {}, set(), None
    for i, m in enumerate(model["merges"]):
        pair = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) and p for p in pair)):
            raise PretrainedError(f"tokenizer.json's merges[{i}]: expected two tokens, found {m!r}", where=where)
        made = pair[0] + pair[1]
        if made not in vocab:
            raise PretrainedError(f"tokenizer.json's merges[{i}] ({m!r}) makes {made!r}, which is no token",
                                  where=where)
        if made != last:
            if made in rank:
                raise PretrainedError(f"tokenizer.json's merges making {made!r} are not listed together (merges[{i}] "
                                      f"again after others): llama.cpp ranks a merge by the token it makes, so it "
                                      f"would join some neighbours in another order", where=where)
            rank[made] = len(rank)
            last = made
        listed.add((pair[0], pair[1]))
    for token in vocab:
        if not isinstance(token, str):
            continue
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if (len(left) == 1 or left in rank) and (len(right) == 1 or right in rank) and (left, right) not in listed:
                raise PretrainedError(f"tokenizer.json's merges lack {left!r} + {right!r}, which llama.cpp's "
                                      f"SentencePiece tokenizer would join into the token {token!r}: the merges "
                                      f"are not those of a SentencePiece model (a BPE trained by the tokenizers "
                                      f"library lists one merge a token)", where=where)
    return [-float(rank[t] + 1) if t in rank else 0.0 for t in tokens]


def spm_types(model: dict, tokens: list, types: list, unk: int | None) -> list[int]:
    """The token types with the byte tokens (`<0xNN>` of the BPE's vocabulary) and the unknown token marked."""
    vocab = model["vocab"]
    out = list(types)
    for i, t in enumerate(tokens):
        if _BYTE.fullmatch(t) and vocab.get(t) == i:
            out[i] = BYTE
    if unk is not None and unk < len(out):
        out[unk] = UNKNOWN
    return out
