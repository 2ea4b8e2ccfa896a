"""llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) whose split Ember knows: the regex each
applies before byte-level BPE, as the models' own tokenizer.json files spell it.

Read by `engine.train.gguf_tokenizer` (a GGUF's tokenizer rebuilt for `tokenizers`) and by
`engine.models.gguf_vocab` (a folder's tokenizer.json written as GGUF metadata), so both sides
agree on what each name means. A name not listed here uses GPT-2's split ("gpt-2", "smollm" after
its digit split: `DIGITS_FIRST`).
"""
from __future__ import annotations

__all__ = ["DIGITS_FIRST", "LLAMA3_SPLIT", "PRE_TOKENIZER_SPLITS", "QWEN2_SPLIT"]

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {
    "llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT, "smaug-bpe": LLAMA3_SPLIT,
    "dbrx": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT,
}
# the names whose split isolates each digit first, then applies GPT-2's (llama.cpp's "\\p{N}" pass)
DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})
