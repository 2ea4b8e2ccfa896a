"""A chat template is code from a model's files (llama-cpp-python's CVE-2024-34359 and SGLang's
CVE-2026-5760 ran code through exactly this): each hostile template here ends in a
ChatTemplateError that says what was refused -- never a crash, a hang, or memory without bound.

The bounds are asserted as work and size (the steps a render counts, the characters it may make),
the memory under an address-space limit; wall-clock only as a hang guard far above normal.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import engine.train.chat_template as ct
from engine.train.chat_template import ChatTemplate, ChatTemplateError
from tests.limits import address_space_growth_limit

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] * 50
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"

HOSTILE = {
    # escapes to Python: attribute walks the sandbox refuses
    "read-a-file-via-mro": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "subclasses-of-tuple": ("{{ ().__class__.__base__.__subclasses__() }}", "unsafe"),
    "cycler-globals": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "unsafe"),
    "dict-global-walk": ("{{ dict.__class__.__init__.__globals__ }}", "unsafe"),
    "namespace-global-walk": ("{{ namespace.__init__.__globals__ }}", "unsafe"),
    "raise-exception-globals": ("{{ raise_exception.__globals__['json'].loads }}", "unsafe"),
    "joiner-globals": ("{{ joiner.__init__.__globals__ }}", "unsafe"),
    "namespace-dunder": ("{% set ns = namespace(__class__=1) %}", "underscore"),
    "open-is-undefined": ("{{ open('/etc/passwd').read() }}", "undefined"),
    "config-object": ("{{ self.__init__.__globals__ }}", "unsafe"),
    "lipsum-is-gone": ("{{ lipsum(10**9) }}", "undefined"),
    # work without end
    "nested-ranges": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    "nested-message-loops": ("{% for a in messages %}{% for b in messages %}{% for c in messages %}"
                             "{% endfor %}{% endfor %}{% endfor %}", "steps"),
    "huge-range": ("{% for i in range(10**12) %}{% endfor %}", "steps"),
    "recursive-macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses"),
    "recursive-loop": ("{% for m in [messages] recursive %}{{ loop([m]) }}{% endfor %}", "recurses"),
    # output and memory without end
    "string-times-huge": ("{{ 'x' * 10**10 }}", "repeated"),
    "list-times-huge": ("{{ ([1] * 10**10) | length }}", "repeated"),
    "doubling-with-tilde": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                            "{% endfor %}{{ ns.s | length }}", "joined"),
    "doubling-with-plus": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                           "{% endfor %}", "joined"),
    "doubling-macro-arguments": ("{% macro d(s) %}{{ d(s ~ s) }}{% endmacro %}{{ d('x') }}", "joined"),
    "print-gigabytes": ("{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 4000 }}"
                        "{% endfor %}{% endfor %}", "characters"),
    "center-filter": ("{{ 'x' | center(10**9) }}", "at most"),
    "indent-filter": ("{{ ('x\n' * 1000) | indent(10**8) }}", "at most"),
    "ljust-method": ("{{ 'x'.ljust(10**9) }}", "at most"),
    "percent-width": ("{{ '%999999999s' % 'x' }}", "widths"),
    "format-width": ("{{ '{:>999999999}'.format(1) }}", "widths"),
    "format-filter-width": ("{{ '%*s' | format(10**9, 'x') }}", "widths"),
    "format-star-width": ("{{ '%*s' % (10**9, 'x') }}", "widths"),
    "format-nested-width": ("{{ '{:{}}'.format('x', 10**9) }}", "widths"),
    "replace-empty": ("{% set s = 'x' * 1000000 %}{{ s.replace('', s) | length }}", "replaced"),
    "replace-filter-empty": ("{% set s = 'x' * 1000000 %}{{ s | replace('', s) | length }}", "replaced"),
    "slice-filter": ("{{ messages | slice(10**9) | list | length }}", "at most"),
    "tojson-indent": ("{{ messages | tojson(indent=10**9) }}", "indent"),
    "power-tower": ("{{ 10 ** 100000000 }}", "exponent"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_ends_in_a_chat_template_error(name):
    source, says = HOSTILE[name]
    started = time.perf_counter()
    with address_space_growth_limit(512 * 2 ** 20):  # 7 of these would need GBs if they ran
        with pytest.raises(ChatTemplateError) as caught:
            ChatTemplate(source, where=f"hostile/{name}.jinja").render(MESSAGES)
    assert str(caught.value).startswith(f"hostile/{name}.jinja: ")
    assert says in str(caught.value), str(caught.value)
    assert time.perf_counter() - started < 20, "hang guard (each ends in well under a second normally)"


def test_ordinary_formatting_is_not_refused():
    t = ChatTemplate("{{ 'Order 123456: %s' % 'x' }}|{{ 'id 1234567 {}'.format(1) }}|{{ '%5s|%.3f' % ('a', 1.5) }}|"
                     "{{ '{:>5}'.format('b') }}|{{ '%s-%d' | format('q', 123456789) }}|{{ 'a-b' | replace('-', '+') }}|"
                     "{{ 'abc' | center(7) }}|{{ 10 ** 3 }}")
    assert t.render([]).text == "Order 123456: x|id 1234567 1|    a|1.500|    b|q-123456789|a+b|  abc  |1000"


def test_attribute_walks_in_format_strings_reach_nothing():
    # the sandbox's formatter looks attributes up as the sandbox does: an unsafe one is undefined
    text = ChatTemplate("{{ '{0.__class__}|{0.__init__}'.format(messages) }}").render(MESSAGES).text
    assert text == "|"


def test_the_work_bound_is_counted_not_timed(monkeypatch):
    loop = "{% for i in range(1000) %}{{ i }}{% endfor %}"
    work = ChatTemplate(loop).render([]).work
    assert 1000 <= work < 5000  # each loop step counts
    monkeypatch.setattr(ct, "MAX_RENDER_WORK", work - 1)
    with pytest.raises(ChatTemplateError, match=f"at most {work - 1} steps"):
        ChatTemplate(loop).render([])


def test_the_output_bound_is_counted_as_it_is_made(monkeypatch):
    monkeypatch.setattr(ct, "MAX_OUTPUT_CHARS", 10_000)
    ok = ChatTemplate("{% for i in range(999) %}x{% endfor %}").render([])
    assert len(ok.text) == 999
    with pytest.raises(ChatTemplateError, match="at most 10000 characters"):
        ChatTemplate("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}").render([])


def test_real_templates_use_a_small_part_of_the_bounds():
    conversation = [{"role": "system", "content": "Be brief."}] + MESSAGES
    for path in sorted(FIXTURES.glob("*.jinja")):
        if "gemma" in path.name:  # refuses a system message
            continue
        chat = ChatTemplate(path.read_text(encoding="utf-8"), {"bos_token": "<s>", "eos_token": "</s>"},
                            where=path.name).render(conversation, add_generation_prompt=True, date_string="1 Jan 2025")
        # 101 messages in under 1 % of the work a render may do: a conversation of ~10,000 turns fits
        assert chat.work < ct.MAX_RENDER_WORK // 100, (path.name, chat.work)


def test_raise_exception_is_the_templates_message_in_ember_error():
    t = ChatTemplate("{{ raise_exception('Conversation roles must alternate user/assistant') }}", where="t.jinja")
    with pytest.raises(ChatTemplateError, match=r"^t\.jinja: .*Conversation roles must alternate user/assistant$"):
        t.render([])


def test_renders_in_threads_keep_their_own_accounts():
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    results, errors = [], []

    def run(n):
        try:
            results.append(template.render([{"role": "user", "content": str(n)}] * n).text)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in (10, 20, 30, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and sorted(results, key=len) == [str(n) * n for n in (10, 20, 30, 40)]
