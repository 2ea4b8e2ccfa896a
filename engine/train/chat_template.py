"""Chat templates: a model's Jinja template that turns a conversation into its prompt text.

    from engine.train.chat_template import read_chat_template, encode_chat
    template = read_chat_template("SmolLM2-135M-Instruct")      # tokenizer_config.json / chat_template.jinja
    chat = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    chat.text, chat.generation_spans                            # the prompt; {% generation %} spans
    ids = encode_chat(tokenizer, template, messages, add_generation_prompt=True)

Where the template comes from, as transformers reads a folder: `chat_template.jinja` (and named
templates in `additional_chat_templates/<name>.jinja`) take precedence over `tokenizer_config.json`'s
`chat_template`, which is a string or a list of `{"name", "template"}` (the one named "default" unless
a name is asked); `ChatTemplate(text)` takes a template given directly (a GGUF file's
`tokenizer.chat_template`).

A template is code from a file, so it is rendered as transformers' `apply_chat_template` renders it
-- Jinja2's `ImmutableSandboxedEnvironment`, `trim_blocks`, `lstrip_blocks`, loop controls, the
`{% generation %}` block, `raise_exception`, `strftime_now`, a `tojson` that does not escape HTML --
and bounded: every loop step, call, attribute and item access, and operator the sandbox sees counts
against `MAX_RENDER_WORK`; strings and lists the template builds (`*`, `+`, `~`, `%`, filters, string
methods) and the output are held to `MAX_OUTPUT_CHARS`, checked before they are made where the size
is known in advance. What a template cannot do ends in a `ChatTemplateError` with the template's own
message (`raise_exception`) or what was refused.

Message text is tokenized without parsing special tokens (`encode_chat`): a user who types
`<|im_end|>` gets the text's ordinary tokens, never the token that ends a turn.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from ..store.json_file import read_json
from ..module import memory
from .tokenizer import TextTokenizer, TokenizerError, TokenizerTooLarge, tokenizer_memory

__all__ = ["ChatTemplate", "ChatTemplateError", "RenderedChat", "read_chat_template", "encode_chat",
           "MAX_TEMPLATE_CHARS", "MAX_OUTPUT_CHARS", "MAX_RENDER_WORK"]

MAX_TEMPLATE_CHARS = 1 * 2 ** 20  # a template longer than this is refused (real ones are < 20 kB)
MAX_OUTPUT_CHARS = 4 * 2 ** 20  # the rendered text, and any string or list a template builds
MAX_RENDER_WORK = 1_000_000  # loop steps, calls, attribute / item accesses and operators of one render
MAX_WIDTH = 4096  # an integer argument of a filter or a string method (a width, a count, an indent)
MAX_CONFIG_BYTES = 16 * 2 ** 20  # tokenizer_config.json
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# a width or precision of 5+ digits in a format string ('%99999s', '{:>99999}'), or one taken from the
# arguments ('%*s', '{:{}}'): what would make a string of any size from a short format
_PERCENT_WIDTH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d{5,}|\*|\d*\.(?:\d{5,}|\*))")
_BRACE_WIDTH = re.compile(r"\{[^{}]*:[^{}]*(?:\d{5,}|\{)")
# private-use marks around special-token text that came from the caller's messages (encode_chat)
_OPEN, _CLOSE = "\ue000", "\ue001"


class ChatTemplateError(ValueError):
    """A chat template cannot be read or rendered; the message says where and what was wrong."""

    def __init__(self, where, message: str):
        super().__init__(f"{where}: {message}")
        self.where = str(where)


@dataclass
class RenderedChat:
    """A rendered conversation: the text and the [start, end) character spans of the template's
    `{% generation %}` blocks (the assistant's text, where the template marks it; else empty), and the
    work the render took (the steps counted against MAX_RENDER_WORK)."""

    text: str
    generation_spans: list[tuple[int, int]] = field(default_factory=list)
    work: int = 0


# --- the bounded render -----------------------------------------------------------------------

class _Budget:
    """One render's account of work done; refuses past MAX_RENDER_WORK."""

    def __init__(self, where: str, spans: list):
        self.work = 0
        self.emitted = 0
        self.where = where
        self.spans = spans

    def charge(self, n: int = 1):
        self.work += n
        if self.work > MAX_RENDER_WORK:
            raise _Refused(f"expected a template that renders in at most {MAX_RENDER_WORK} steps "
                           f"(loop steps, calls, accesses), found one that takes more (a loop that does not end?)")


class _Refused(Exception):
    """Raised inside a render for what the bounds refuse; becomes a ChatTemplateError."""


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("ember_chat_budget", default=None)


def _charge(n: int = 1):
    budget = _BUDGET.get()
    if budget is not None:
        budget.charge(n)


def _check_size(value, what: str):
    if isinstance(value, (str, list, tuple, bytes, dict)) and len(value) > MAX_OUTPUT_CHARS:
        raise _Refused(f"expected {what} of at most {MAX_OUTPUT_CHARS} items, found one of {len(value)}")
    return value


def _check_format(fmt, what: str, pattern=_PERCENT_WIDTH):
    found = pattern.search(fmt) if isinstance(fmt, str) else None
    if found:
        raise _Refused(f"expected {what} with widths written in it and below {MAX_WIDTH}, found {found.group()!r}")


def _check_ints(args, kwargs, what: str):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_WIDTH:
            raise _Refused(f"expected {what}'s numbers to be at most {MAX_WIDTH}, found {v}")


# the filters whose integer arguments are widths or counts that size their result
_WIDTH_FILTERS = frozenset({"center", "indent", "wordwrap", "truncate", "batch", "slice", "urlize", "pprint"})


def _check_replace(s, old, new):
    if isinstance(s, str):
        old, new = str(old), str(new)
        _sized(len(s) + (len(s) + 1 if old == "" else s.count(old)) * len(new), "a replaced string")


def _sized(n: int, what: str):
    if n > MAX_OUTPUT_CHARS:
        raise _Refused(f"expected {what} of at most {MAX_OUTPUT_CHARS} characters, found one of {n}")


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}`: records the span of its text in the output."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("generation_span"), [], [], body).set_lineno(lineno)

        def generation_span(self, caller):
            text = caller()
            budget = _BUDGET.get()
            if budget is not None:  # the chunks before this block were all emitted (generate() is lazy)
                budget.spans.append((budget.emitted, budget.emitted + len(text)))
            return text

    class ChatNamespace(Namespace):
        """`namespace()` that stores no underscore names and no value over the size bound."""

        def __init__(*args, **kwargs):  # noqa: N805 - Namespace's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name, value in attrs.items():
                ChatNamespace._check(name, value)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            ChatNamespace._check(name, value)
            Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name, value):
            if isinstance(name, str) and name.startswith("_"):
                raise _Refused(f"expected namespace attributes without a leading underscore, found {name!r}")
            _check_size(value, "a namespace value")

    class ChatEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

        def call_binop(self, context, operator, left, right):
            _charge()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        _sized(len(seq) * max(n, 0), "a repeated string or list")
            elif operator == "**":
                if isinstance(right, int) and isinstance(left, int) and abs(right) > 64 and abs(left) > 1:
                    raise _Refused(f"expected a power with an exponent of at most 64, found {right}")
            elif operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                    _sized(len(left) + len(right), "a joined string or list")
            elif operator == "%" and isinstance(left, str):
                _check_format(left, "a '%' format")
            result = super().call_binop(context, operator, left, right)
            _charge(len(result) // 256 if isinstance(result, (str, list)) else 0)
            return _check_size(result, "an operator's result")

        def wrap_str_format(self, value):
            owner = getattr(value, "__self__", None)
            if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map"):
                _check_format(owner, "a format string", _BRACE_WIDTH)
            return super().wrap_str_format(value)

        def getattr(self, obj, attribute):
            _charge()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _charge()
            return super().getitem(obj, argument)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - the sandbox's own signature
            _charge()
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, (str, list, dict)):  # a string or list method: widths, counts, formats
                _check_ints(args, kwargs, f"{type(owner).__name__}.{getattr(__obj, '__name__', 'method')}")
                if isinstance(owner, str) and getattr(__obj, "__name__", "") == "replace" and len(args) >= 2:
                    _check_replace(owner, args[0], args[1])
            for a in list(args) + list(kwargs.values()):
                _check_size(a, "an argument")
            result = super().call(__context, __obj, *args, **kwargs)
            if isinstance(result, (str, list)):
                _charge(len(result) // 256)
            return _check_size(result, "a call's result")

    def guarded_filter(f, name):
        @functools.wraps(f)
        def run(*args, **kwargs):
            _charge()
            if name in _WIDTH_FILTERS:
                _check_ints(args, kwargs, f"the filter {name!r}")
            elif name == "format" and args:
                _check_format(args[0], "a format string")
            elif name == "replace" and args:
                rest = args[1:] if hasattr(args[0], "environment") else args  # do_replace takes the eval context
                if len(rest) >= 3:
                    _check_replace(*rest[:3])
            result = f(*args, **kwargs)
            if isinstance(result, (str, list)):
                _charge(len(result) // 256)
            return _check_size(result, f"the filter {name!r}'s result")
        return run

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if isinstance(indent, int) and indent > MAX_WIDTH:
            raise _Refused(f"expected a tojson indent of at most {MAX_WIDTH}, found {indent}")
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    def counted_range(*args):
        r = range(*args)  # the sandbox's own range refuses more than MAX_RANGE items afterwards
        _charge(min(len(r), MAX_RENDER_WORK + 1))
        return env_range(*args)

    def loop_guard(iterable):
        for item in iterable:
            _charge()
            yield item

    def concat(*parts):
        _sized(sum(len(p) for p in parts if isinstance(p, str)), "a '~' joined string")
        return "".join(parts)

    class TemplateDict:
        """`dict(...)` and `dict.fromkeys(...)` for templates, without the type itself (whose
        attributes lead back into Python)."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    env = ChatEnvironment(trim_blocks=True, lstrip_blocks=True,
                          extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env_range = env.globals["range"]
    env.filters = {name: guarded_filter(f, name) for name, f in env.filters.items()}
    env.filters["tojson"] = guarded_filter(tojson, "tojson")
    env.globals.pop("lipsum", None)  # a generator of any number of paragraphs: no chat template uses it
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, range=counted_range,
                       dict=TemplateDict(), namespace=ChatNamespace,
                       ember_loop_guard=loop_guard, ember_concat=concat)
    return env


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    return _ENV


def _guarded_ast(env, source: str):
    """The template's syntax tree with each `for` loop's iterable counted and each `~` sized."""
    from jinja2 import nodes

    tree = env.parse(source)
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Call(nodes.Name("ember_loop_guard", "load"), [loop.iter], [], None, None)
    for parent in list(tree.find_all(nodes.Node)):
        for name in parent.fields:
            value = getattr(parent, name, None)
            if isinstance(value, nodes.Concat):
                setattr(parent, name, _concat_call(nodes, value))
            elif isinstance(value, list):
                setattr(parent, name, [_concat_call(nodes, v) if isinstance(v, nodes.Concat) else v for v in value])
    return tree


def _concat_call(nodes, concat):
    return nodes.Call(nodes.Name("ember_concat", "load"),
                      [nodes.Filter(n, "string", [], [], None, None) for n in concat.nodes], [], None, None)


# --- the template ------------------------------------------------------------------------------

class ChatTemplate:
    """A compiled chat template with the tokenizer's special tokens (`bos_token`, `eos_token`, ...).

    `where` names the template's source in errors (a file, "GGUF metadata", ...)."""

    def __init__(self, source: str, special_tokens: dict | None = None, where: str = "the chat template",
                 name: str | None = None):
        if not isinstance(source, str):
            raise ChatTemplateError(where, f"expected a template string, found {type(source).__name__}")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(where, f"expected a template of at most {MAX_TEMPLATE_CHARS} characters, "
                                           f"found {len(source)}")
        self.source = source
        self.where = where
        self.name = name
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)}
        env = _env()
        try:
            self._template = env.from_string(_guarded_ast(env, source))
        except Exception as e:  # noqa: BLE001 - jinja's own message says what does not parse
            raise ChatTemplateError(where, f"expected a Jinja template, found one that does not parse: "
                                           f"{_message(e)}") from None
        except RecursionError:
            raise ChatTemplateError(where, "expected a Jinja template, found one nested too deeply to parse") from None

    @property
    def has_generation_blocks(self) -> bool:
        return bool(re.search(r"\{%-?\s*generation\s*-?%\}", self.source))

    def render(self, messages, add_generation_prompt: bool = False, tools=None, documents=None,
               **variables) -> RenderedChat:
        """The conversation as the model's prompt text, as transformers' `apply_chat_template(...,
        tokenize=False)` renders it; `variables` (`enable_thinking=False`, `date_string=...`) are the
        template's own. The tokenizer's special tokens are variables too (a variable given wins)."""
        context = {**self.special_tokens, **variables}
        spans: list[tuple[int, int]] = []
        budget = _Budget(self.where, spans)
        chunks: list[str] = []
        token = _BUDGET.set(budget)
        try:
            for chunk in self._template.generate(messages=_messages(messages), tools=_plain(tools),
                                                 documents=_plain(documents),
                                                 add_generation_prompt=add_generation_prompt, **_plain(context)):
                budget.emitted += len(chunk)
                budget.charge(1 + len(chunk) // 256)
                if budget.emitted > MAX_OUTPUT_CHARS:
                    raise _Refused(f"expected a rendered conversation of at most {MAX_OUTPUT_CHARS} characters, "
                                   f"found more")
                chunks.append(chunk)
        except _Refused as e:
            raise ChatTemplateError(self.where, f"refused while rendering: {e}") from None
        except RecursionError:
            raise ChatTemplateError(self.where, "expected a template that renders, found one that recurses "
                                                "deeper than Python allows") from None
        except MemoryError:
            raise ChatTemplateError(self.where, "expected a template that renders, found one that needs more "
                                                "memory than there is") from None
        except Exception as e:  # noqa: BLE001 - the template's own message (raise_exception) says what
            raise ChatTemplateError(self.where, f"the template refused the conversation: {_message(e)}") from None
        finally:
            _BUDGET.reset(token)
        return RenderedChat("".join(chunks), spans, budget.work)

    def __repr__(self) -> str:
        return f"ChatTemplate({self.where!r}, {len(self.source)} characters)"


def _message(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return text or type(e).__name__


def _plain(value, depth: int = 0):
    """What a template may see, as transformers rebuilds it: JSON scalars (subclasses such as enums
    and NumPy scalars back to their base type), dicts, lists, tuples, dataclasses as dicts; anything
    else an inert placeholder naming its type ("<ndarray>"), so no object's methods reach the sandbox."""
    if depth > 64:
        raise ChatTemplateError("the conversation", "expected messages nested at most 64 levels, found more")
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, depth + 1): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, depth + 1) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item(), depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _messages(messages) -> list:
    """The messages as the template sees them: plain data, and a message's reasoning under each name
    templates read it by (`reasoning_content`; `thinking` for gpt-oss), as transformers passes it."""
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError("the conversation", f"expected a list of messages, found {type(messages).__name__}")
    out = []
    for i, message in enumerate(_plain(list(messages))):
        if not isinstance(message, dict):
            raise ChatTemplateError("the conversation", f"message {i}: expected a dict with a role and content, "
                                                        f"found {type(message).__name__}")
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


# --- reading a model folder --------------------------------------------------------------------

def _special_tokens(config: dict) -> dict[str, str]:
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):  # an AddedToken
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > 4 * MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(path, f"expected a template of at most {MAX_TEMPLATE_CHARS} characters, "
                                          f"found a file of {size} bytes")
        with open(path, "rb") as fh:
            raw = fh.read(4 * MAX_TEMPLATE_CHARS + 1)
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ChatTemplateError(path, f"expected UTF-8 text, found undecodable bytes at offset {e.start}") from None
    except OSError as e:
        raise ChatTemplateError(path, f"cannot read the template: {e.strerror or e}") from None


def read_chat_template(folder, name: str | None = None) -> ChatTemplate:
    """The chat template of a model folder, with the special tokens of its tokenizer_config.json.

    `chat_template.jinja` (and `additional_chat_templates/<name>.jinja`) take precedence over
    tokenizer_config.json's `chat_template`, as in transformers; of several named templates the one
    called `name`, else "default". A GGUF file's is its metadata's `tokenizer.chat_template`."""
    folder = Path(folder).expanduser()
    if folder.suffix.lower() == ".gguf" and folder.is_file():
        from .gguf_tokenizer import gguf_chat_template  # noqa: PLC0415 - it builds on this module

        template = gguf_chat_template(folder)
        if template is None:
            raise ChatTemplateError(folder, "expected a chat template (tokenizer.chat_template in the GGUF "
                                            "metadata), found none: is this a base model?")
        return template
    config_path = folder / "tokenizer_config.json"
    config = {}
    if config_path.is_file():
        config = read_json(config_path, MAX_CONFIG_BYTES, "tokenizer_config.json", ChatTemplateError)
        if not isinstance(config, dict):
            raise ChatTemplateError(config_path, f"expected a JSON object, found {type(config).__name__}")
    special = _special_tokens(config)

    templates: dict[str, tuple[str, Path]] = {}  # name -> (text, where)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        templates["default"] = (_read_text(jinja), jinja)
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja"))[:64]:
            templates[f.stem] = (_read_text(f), f)
    if not templates:
        value = config.get("chat_template")
        if isinstance(value, str):
            templates["default"] = (value, config_path)
        elif isinstance(value, list):
            for i, entry in enumerate(value):
                if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                        and isinstance(entry.get("template"), str)):
                    raise ChatTemplateError(config_path, f"chat_template[{i}]: expected {{\"name\": ..., "
                                                         f"\"template\": ...}}, found {str(entry)[:80]!r}")
                templates[entry["name"]] = (entry["template"], config_path)
        elif value is not None:
            raise ChatTemplateError(config_path, f"chat_template: expected a string or a list of named templates, "
                                                 f"found {type(value).__name__}")
    if not templates:
        raise ChatTemplateError(folder, "expected a chat template (chat_template.jinja, or chat_template in "
                                        "tokenizer_config.json), found none: is this a base model?")
    chosen = name if name is not None else "default"
    if chosen not in templates:
        if name is None and len(templates) == 1:
            chosen = next(iter(templates))
        else:
            raise ChatTemplateError(folder, f"expected a chat template named {chosen!r}, found "
                                            f"{sorted(templates)}")
    text, where = templates[chosen]
    return ChatTemplate(text, special, where=str(where), name=chosen)


# --- tokenizing without special tokens from the messages ---------------------------------------

def _special_texts(tokenizer) -> list[str]:
    tok = tokenizer.tokenizer
    decoder = tok.get_added_tokens_decoder() if hasattr(tok, "get_added_tokens_decoder") else {}
    return sorted({t.content for t in decoder.values() if getattr(t, "special", False) and t.content},
                  key=len, reverse=True)


def _mark(value, pattern):
    if isinstance(value, str):
        value = value.replace(_OPEN, "").replace(_CLOSE, "")
        return pattern.sub(lambda m: _OPEN + m.group(0) + _CLOSE, value) if pattern is not None else value
    if isinstance(value, dict):
        return {k: _mark(v, pattern) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(v, pattern) for v in value]
    return value


def _mark_specials(tokenizer, *values) -> list:
    """`values` (messages, variables) with the special-token text they hold between the marks."""
    specials = _special_texts(tokenizer)
    pattern = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
    return [_mark(v, pattern) for v in values]


def _encode_marked(tokenizer, marked: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids of a text rendered from marked values (`_mark_specials`), and each token's
    [start, end) characters in `marked`: the template's text with its special tokens as tokens,
    the marked pieces (special-token text from the caller) as ordinary text."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    start = 0
    for i, piece in enumerate(re.split(f"[{_OPEN}{_CLOSE}]", marked)):
        if piece:
            tok = _as_text_tokenizer(tokenizer) if i % 2 else tokenizer
            enc = tok._call("encoding a conversation", tok.tokenizer.encode, piece, add_special_tokens=False)
            ids += enc.ids
            offsets += [(start + a, start + b) for a, b in enc.offsets]
        start += len(piece) + 1  # the mark after it
    return ids, offsets


def encode_chat(tokenizer, template: ChatTemplate, messages, add_generation_prompt: bool = False,
                **variables) -> list[int]:
    """The token ids of the rendered conversation (`tokenizer`: a `TextTokenizer`). Special tokens
    come only from the template: special-token text inside the messages (or tools, or variables) is
    encoded as ordinary text, so a user who types `<|im_end|>` cannot end a turn."""
    messages, variables = _mark_specials(tokenizer, messages, variables)
    marked = template.render(messages, add_generation_prompt=add_generation_prompt, **variables).text
    return _encode_marked(tokenizer, marked)[0]


_TEXT_ONLY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _as_text_tokenizer(tokenizer):
    """A copy of the library's tokenizer that encodes special-token text as ordinary text
    (`encode_special_tokens`), made once per tokenizer and only when a message holds such text: the
    shared tokenizer's own switch is never flipped, so other threads encoding with it are unaffected."""
    tok = tokenizer.tokenizer
    plain = _TEXT_ONLY.get(tok)
    if plain is None:
        text = tok.to_str()  # serialized once: its length sizes the copy, which is made from it
        refusal = tokenizer_memory("copying the tokenizer to encode message text", len(text),
                                   working=False).refusal(memory.available_memory())
        if refusal:  # the library aborts the process when an allocation fails
            raise TokenizerTooLarge(tokenizer.path, f"{refusal}: use a machine with more memory")
        try:
            copy = type(tok).from_str(text)
        except Exception as e:  # noqa: BLE001 - the library's own message says what failed
            raise TokenizerError(tokenizer.path, f"the tokenizers library cannot copy it: {_message(e)}") from None
        copy.encode_special_tokens = True
        plain = _TEXT_ONLY[tok] = TextTokenizer(copy, tokenizer.path)
    return plain
