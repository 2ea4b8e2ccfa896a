"""`folder_gguf_tokenizer`: a Hugging Face folder's tokenizer as llama.cpp's GGUF tokenizer metadata,
so that a model opened from a folder can be exported as a GGUF llama.cpp tokenizes as transformers does.

What it reads: `tokenizer.json` (the vocabulary, merges, added tokens, normalizer, pre-tokenizer,
post-processor), `tokenizer_config.json` (the special tokens' texts, `add_bos_token` /
`add_eos_token`, the chat template), `chat_template.jinja` / `chat_template.json` (a chat template
kept outside the config), `config.json` and `generation_config.json` (special ids the tokenizer
files do not name). A SentencePiece-style BPE (byte fallback, '▁' for spaces: Llama 2, Mistral v0.1,
TinyLlama, Gemma) becomes llama.cpp's "llama" tokenizer: the tokens, their scores and types (byte
tokens, unknown, control, user-defined), `add_space_prefix`, the special ids and the chat template as
below, checked and scored by `gguf_spm` (see there what is refused). A byte-level BPE gets the keys
llama.cpp's `convert_hf_to_gguf.py` writes for it (`tokenizer.ggml.model` "gpt2"):

- `tokens`: one per id up to the model's `vocab_size` (an id the tokenizer lacks is `[PAD<id>]`,
  type unused); `token_type`: 1 normal, 3 control (an added token marked special, or one that looks
  special to llama.cpp: `<|...|>`, `<pad>`, `<unused...>`, ...), 4 user-defined (another added token);
- `merges` as "left right" strings; the special ids (`bos`, `eos`, `unk`, `sep`, `pad`, `cls`,
  `mask`: a token text of tokenizer_config.json matched to an added token, else the id
  config.json gives, else for eos the first of generation_config.json's); `add_bos_token` /
  `add_eos_token` always written (tokenizer_config.json's, else what the post-processor's template
  adds, else no), since llama.cpp's defaults differ between pre-tokenizers;
- `pre`: the llama.cpp pre-tokenizer whose split is the tokenizer.json's, recognised from its
  structure (llama.cpp's converter hashes the tokens of a test text instead, which names only the
  published models; the structure names the split itself, so a fine-tune or a small model of the
  same tokenizer design is recognised too):

  - `ByteLevel` with its own regex (GPT-2's split) -> "gpt-2";
  - `Digits(individual)` then `ByteLevel` with its regex -> "smollm";
  - `Split(Llama 3's regex)` then `ByteLevel` without one, merges ignored for whole words -> "llama-bpe";
  - `Split(Qwen2's regex)` then `ByteLevel` without one -> "qwen2" (with Qwen2's NFC normalizer,
    which llama.cpp does not apply, as in every Qwen2 GGUF: text not in NFC form may tokenize
    differently there).

Anything else is refused before a byte is written, naming what was found: another model type
(WordPiece, Unigram), a BPE with '▁' for spaces but no byte fallback, an unknown pre-tokenizer or normalizer, BPE dropout, an added token that strips its neighbours'
spaces, a post-processor adding other tokens than bos / eos -- never a silently different tokenization.
"""
from __future__ import annotations

from pathlib import Path

from ..store.gguf_pre import LLAMA3_SPLIT, QWEN2_SPLIT
from .gguf_spm import spm_scores, spm_space_prefix, spm_types
from .hf_folder import PretrainedError, read_json

__all__ = ["FolderTokenizer", "folder_gguf_tokenizer", "looks_special"]

MAX_TOKENIZER_BYTES = 64 * 2 ** 20  # tokenizer.json (a 256k vocabulary with its merges is ~20 MB)
MAX_CONFIG_BYTES = 16 * 2 ** 20
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
_SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "cls": "cls_token_id", "mask": "mask_token_id"}
# pre-tokenizer structure -> (llama.cpp's name, whether its BPE ignores merges for whole words, normalizers)
_PRE = {
    (("bytelevel", True),): ("gpt-2", False, (None,)),
    (("digits",), ("bytelevel", True)): ("smollm", False, (None,)),
    (("split", LLAMA3_SPLIT), ("bytelevel", False)): ("llama-bpe", True, (None,)),
    (("split", QWEN2_SPLIT), ("bytelevel", False)): ("qwen2", False, (None, "NFC")),
}


class FolderTokenizer:
    """The GGUF tokenizer keys of a folder (`metadata`: key -> value, as a GGUF file's reader gives
    them), standing in for the source GGUF file of `gguf_export`."""

    def __init__(self, path: Path, metadata: dict):
        self.path, self.metadata = path, metadata

    def close(self) -> None:
        pass


def looks_special(text: str) -> bool:
    """Whether an added token not marked special is still a control token for llama.cpp's converter."""
    return text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or \
        (text.startswith("<|") and text.endswith("|>")) or (text.startswith("<｜") and text.endswith("｜>")) or \
        (text.startswith("<unused") and text.endswith(">"))


def _obj(value) -> dict:
    """`value` when it is a JSON object, else an empty one (a missing or malformed part, refused where
    what it lacks is needed)."""
    return value if isinstance(value, dict) else {}


def _optional_json(path: Path, limit: int) -> dict:
    if not path.is_file():
        return {}
    doc = read_json(path, limit, path.name)
    if not isinstance(doc, dict):
        raise PretrainedError(f"expected a JSON object, found {type(doc).__name__}", where=str(path))
    return doc


def _steps(node, where: str) -> tuple:
    """The pre-tokenizer as a tuple of comparable steps; a PretrainedError for an unknown one."""
    if node is None:
        return ()
    kind = node.get("type") if isinstance(node, dict) else None
    if kind == "Sequence" and isinstance(node.get("pretokenizers"), list):
        out = ()
        for sub in node["pretokenizers"]:
            out += _steps(sub, where)
        return out
    if kind == "ByteLevel":
        if node.get("add_prefix_space", True):
            raise PretrainedError("tokenizer.json's ByteLevel pre-tokenizer adds a space before the text "
                                  "(add_prefix_space): llama.cpp's byte-level BPE has no such option", where=where)
        return (("bytelevel", bool(node.get("use_regex", True))),)
    if kind == "Digits" and node.get("individual_digits"):
        return (("digits",),)
    if kind == "Split":
        pattern = _obj(node.get("pattern"))
        if node.get("behavior") == "Isolated" and not node.get("invert") and isinstance(pattern.get("Regex"), str):
            return (("split", pattern["Regex"]),)
    if kind == "Metaspace":
        raise _sentencepiece(where, "a Metaspace pre-tokenizer, '▁' for spaces")
    raise PretrainedError(f"tokenizer.json's pre-tokenizer step {str(node)[:200]} is not one llama.cpp's GGUF "
                          f"tokenizers apply; Ember recognises GPT-2's, SmolLM's, Llama 3's and Qwen2's", where=where)


def _sentencepiece(where: str, found: str) -> PretrainedError:
    return PretrainedError(f"the tokenizer is SentencePiece-style BPE ({found}) without byte "
                           f"fallback: llama.cpp's SentencePiece tokenizer ('llama') falls back to byte tokens where "
                           f"transformers gives the unknown token", where=where)


def _pre_name(doc: dict, model: dict, where: str) -> str:
    steps = _steps(doc.get("pre_tokenizer"), where)
    hit = _PRE.get(steps)
    if hit is None:
        shown = ", ".join(s[0] if len(s) == 1 or s[0] != "split" else f"split({s[1][:60]}...)" for s in steps)
        raise PretrainedError(f"tokenizer.json's pre-tokenizer ({shown or 'none'}) is not one whose llama.cpp "
                              f"name Ember knows (GPT-2's, SmolLM's, Llama 3's or Qwen2's split): llama.cpp would "
                              f"split the text otherwise and tokenize differently", where=where)
    name, ignore_merges, normalizers = hit
    if bool(model.get("ignore_merges", False)) != ignore_merges:
        raise PretrainedError(f"tokenizer.json's BPE has ignore_merges={bool(model.get('ignore_merges', False))}, "
                              f"but llama.cpp's '{name}' pre-tokenizer has it {ignore_merges}: it would tokenize "
                              f"some words differently", where=where)
    norm = doc.get("normalizer")
    kind = norm.get("type") if isinstance(norm, dict) else norm
    if kind not in normalizers:
        raise PretrainedError(f"tokenizer.json's normalizer {str(norm)[:120]} has no llama.cpp form for the "
                              f"'{name}' pre-tokenizer (llama.cpp normalizes nothing)", where=where)
    return name


def _check_model(doc: dict, where: str) -> dict:
    model = doc.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "BPE":
        raise PretrainedError(f"expected a BPE tokenizer (tokenizer.json's model type 'BPE'), found "
                              f"{kind!r}: Ember's GGUF export converts byte-level BPE tokenizers only", where=where)
    norm = doc.get("normalizer") or {}
    parts = norm.get("normalizers", [norm]) if isinstance(norm, dict) else []
    if any(isinstance(p, dict) and p.get("type") in ("Prepend", "Replace") for p in parts):
        raise _sentencepiece(where, "a normalizer putting '▁' for spaces")
    if model.get("dropout"):
        raise PretrainedError(f"tokenizer.json's BPE has dropout {model['dropout']} (random tokenizations): "
                              f"llama.cpp has none", where=where)
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise PretrainedError(f"tokenizer.json's BPE has a {key} ({model[key]!r}): llama.cpp's byte-level BPE "
                                  f"has none", where=where)
    decoder, pre = _obj(doc.get("decoder")), _obj(doc.get("pre_tokenizer"))
    if "Metaspace" in (decoder.get("type"), pre.get("type")):
        raise _sentencepiece(where, "a Metaspace pre-tokenizer, '▁' for spaces")
    if decoder.get("type") != "ByteLevel":
        raise PretrainedError(f"expected a ByteLevel decoder in tokenizer.json (a byte-level BPE), found "
                              f"{decoder.get('type')!r}", where=where)
    if not isinstance(model.get("vocab"), dict) or not isinstance(model.get("merges"), list):
        raise PretrainedError("tokenizer.json's BPE model has no vocab object or merges list", where=where)
    return model


def _merges(model: dict, where: str) -> list[str]:
    out = []
    for i, m in enumerate(model["merges"]):
        pair = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) and p and " " not in p
                                                                   for p in pair)):
            raise PretrainedError(f"tokenizer.json's merges[{i}]: expected two tokens without spaces, found {m!r}",
                                  where=where)
        out.append(f"{pair[0]} {pair[1]}")
    return out


def _tokens(model: dict, added: list, vocab_size: int, where: str) -> tuple[list, list]:
    reverse = {}
    for text, i in model["vocab"].items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise PretrainedError(f"tokenizer.json's vocab: token {text!r} has id {i!r}", where=where)
        reverse[i] = text
    kinds = {}
    for entry in added:
        i, text = entry.get("id"), entry.get("content")
        if not isinstance(i, int) or not isinstance(text, str) or i < 0:
            raise PretrainedError(f"tokenizer.json's added_tokens: expected an id and a content, found "
                                  f"{str(entry)[:120]}", where=where)
        for flag in ("lstrip", "rstrip", "single_word"):
            if entry.get(flag):
                raise PretrainedError(f"tokenizer.json's added token {text!r} has {flag}: llama.cpp's GGUF "
                                      f"tokenizer has no such flag and would tokenize around it otherwise", where=where)
        reverse[i] = text
        kinds[i] = CONTROL if entry.get("special") or looks_special(text) else USER_DEFINED
    top = max(reverse, default=-1)
    if top >= vocab_size:
        raise PretrainedError(f"the tokenizer has id {top} ({reverse[top]!r}) but the model's vocab_size is "
                              f"{vocab_size}: the exported file could not embed it", where=where)
    tokens = [reverse.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [kinds.get(i, NORMAL) if i in reverse else UNUSED for i in range(vocab_size)]
    return tokens, types


def _content(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_ids(config: dict, model_config: dict, generation: dict, added: list) -> dict:
    def first(value):
        value = value[0] if isinstance(value, list) and value else value
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
    ids = {}
    for kind in _SPECIAL_KINDS:
        text = _content(config.get(f"{kind}_token"))
        hit = first(next((a["id"] for a in added if text is not None and a.get("content") == text), None))
        if hit is None:
            hit = first(model_config.get(f"{kind}_token_id"))
        if hit is None and kind == "eos":
            hit = first(generation.get("eos_token_id"))
        if hit is not None:
            ids[kind] = hit
    return ids


def _adds(doc: dict, config: dict, ids: dict, tokens: list, where: str) -> tuple[bool, bool]:
    """(add_bos, add_eos): tokenizer_config.json's, else what the post-processor's template adds."""
    add_bos = add_eos = False
    post = _obj(doc.get("post_processor"))
    procs = post.get("processors", [post])
    for proc in procs if isinstance(procs, list) else [procs]:
        kind = _obj(proc).get("type")
        if proc in (None, {}) or kind == "ByteLevel":
            continue
        if kind != "TemplateProcessing":
            raise PretrainedError(f"tokenizer.json's post-processor {kind!r} has no llama.cpp form (it adds "
                                  f"bos / eos only)", where=where)
        single = proc.get("single") if isinstance(proc.get("single"), list) else []
        specials = [(n, _obj(_obj(item).get("SpecialToken")).get("id")) for n, item in enumerate(single)
                    if "SpecialToken" in _obj(item)]
        for n, text in specials:
            if n == 0 and "bos" in ids and tokens[ids["bos"]] == text:
                add_bos = True
            elif n == len(single) - 1 and "eos" in ids and tokens[ids["eos"]] == text:
                add_eos = True
            else:
                raise PretrainedError(f"tokenizer.json's post-processor adds {text!r} at position {n}: llama.cpp "
                                      f"adds only the bos token first and the eos token last", where=where)
    bos, eos = config.get("add_bos_token"), config.get("add_eos_token")
    return (bos if isinstance(bos, bool) else add_bos), (eos if isinstance(eos, bool) else add_eos)


def _chat_template(folder: Path, config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if isinstance(template, str):
        return template
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        if jinja.stat().st_size > MAX_CONFIG_BYTES:
            raise PretrainedError(f"chat_template.jinja is over {MAX_CONFIG_BYTES} bytes", where=str(jinja))
        return jinja.read_text(encoding="utf-8")
    template = _optional_json(folder / "chat_template.json", MAX_CONFIG_BYTES).get("chat_template")
    return template if isinstance(template, str) else None


def folder_gguf_tokenizer(folder, vocab_size: int, name: str | None = None) -> FolderTokenizer:
    """The GGUF tokenizer keys of a Hugging Face folder's tokenizer (see this file's doc) for a model of
    `vocab_size` token rows; a PretrainedError naming the file for one llama.cpp would not tokenize the same."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    where = str(path)
    if not path.is_file():
        spm = " (it has a SentencePiece tokenizer.model: convert it with llama.cpp's convert_hf_to_gguf.py)" \
            if (folder / "tokenizer.model").is_file() else ""
        raise PretrainedError(f"expected a tokenizer.json in the model's folder to write the GGUF tokenizer from, "
                              f"found none{spm}", where=str(folder))
    doc = read_json(path, MAX_TOKENIZER_BYTES, "tokenizer.json")
    if not isinstance(doc, dict):
        raise PretrainedError(f"expected a JSON object, found {type(doc).__name__}", where=where)
    model = _obj(doc.get("model"))
    spm = model.get("type") == "BPE" and model.get("byte_fallback") is True
    if spm:  # SentencePiece-style: llama.cpp's "llama" tokenizer
        space = spm_space_prefix(doc, model, where)
    else:
        model = _check_model(doc, where)
        pre = _pre_name(doc, model, where)
    added = doc.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
        raise PretrainedError("tokenizer.json's added_tokens: expected a list of objects", where=where)
    for entry in added if spm and space else ():
        if entry.get("normalized") is True:
            raise PretrainedError(f"tokenizer.json's added token {str(entry.get('content'))[:60]!r} is matched in "
                                  f"the normalized text (normalized: true), so transformers puts no '▁' after it; "
                                  f"llama.cpp puts one after every added token", where=where)
    tokens, types = _tokens(model, added, int(vocab_size), where)
    config = _optional_json(folder / "tokenizer_config.json", MAX_CONFIG_BYTES)
    ids = _special_ids(config, _optional_json(folder / "config.json", MAX_CONFIG_BYTES),
                       _optional_json(folder / "generation_config.json", MAX_CONFIG_BYTES), added)
    ids = {k: v for k, v in ids.items() if v < len(tokens)}
    add_bos, add_eos = _adds(doc, config, ids, tokens, where)
    if spm:
        meta = {"general.name": name or folder.name, "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.scores": spm_scores(model, tokens, where),
                "tokenizer.ggml.token_type": spm_types(model, tokens, types, ids.get("unk")),
                "tokenizer.ggml.add_space_prefix": space}
    else:
        meta = {"general.name": name or folder.name, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.merges": _merges(model, where)}
    meta.update({f"tokenizer.ggml.{_ID_KEYS[k]}": v for k, v in ids.items()})
    meta["tokenizer.ggml.add_bos_token"] = add_bos
    meta["tokenizer.ggml.add_eos_token"] = add_eos
    template = _chat_template(folder, config)
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return FolderTokenizer(path, meta)
