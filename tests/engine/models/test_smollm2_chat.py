"""SmolLM2-135M-Instruct, a real instruct model (issue 45, must-show 2): Ember's greedy chat answers to
ten questions equal transformers' token for token.

Optional: the model is never committed (~540 MB). The tests run on the folder benchmarks/smollm2.py
makes in the cache (`$EMBER_CACHE` or ~/.cache/ember); without it they are made there first when
`EMBER_ORACLE_PYTHON` names a Python with torch, transformers and gguf, else they skip and say how
to make it. The expected ids (fixtures/smollm2_chat/expected.json) were made once by transformers'
`apply_chat_template` + `generate(do_sample=False)` (make_expected.py there); with the oracle the
fixture is re-made live and must be what is committed.

    EMBER_ORACLE_PYTHON=/work/oracle-venv/bin/python pytest tests/engine/models/test_smollm2_chat.py
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import smollm2

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "smollm2_chat"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))
QUESTIONS = json.loads((FIXTURES / "questions.json").read_text(encoding="utf-8"))
ORACLE = os.environ.get("EMBER_ORACLE_PYTHON")
HOW = ("set EMBER_ORACLE_PYTHON to a Python with torch, transformers and gguf (or run "
       "`EMBER_ORACLE_PYTHON=... python benchmarks/smollm2.py` once) to make it")

@pytest.fixture(scope="module")
def folder() -> Path:
    done = smollm2.cached_folder()
    if done is not None:
        return done
    if not ORACLE:
        pytest.skip(f"SmolLM2-135M-Instruct is not in {smollm2.cache_root()}: {HOW}")
    try:
        return smollm2.smollm2_folder(ORACLE)
    except smollm2.SmolLM2Unavailable as e:
        pytest.skip(f"SmolLM2-135M-Instruct cannot be made here: {e}")


@pytest.fixture(scope="module")
def chat(folder):
    from engine.models import from_pretrained
    from engine.train.chat_template import read_chat_template
    from engine.train.tokenizer import load_tokenizer

    return from_pretrained(folder), load_tokenizer(folder), read_chat_template(folder)


def test_the_fixture_covers_the_ten_questions():
    assert [c["question"] for c in EXPECTED["cases"]] == QUESTIONS and len(QUESTIONS) == 10
    eos = EXPECTED["eos_token_id"]
    for case in EXPECTED["cases"]:
        new = case["new_ids"]
        # each answer ended at the model's eos or at the limit, nowhere else
        assert 0 < len(new) <= EXPECTED["max_new_tokens"]
        assert eos not in new[:-1] and (new[-1] == eos or len(new) == EXPECTED["max_new_tokens"])
    # some answers stop at eos, some run to the limit: both ways of ending are compared
    assert {len(c["new_ids"]) == EXPECTED["max_new_tokens"] for c in EXPECTED["cases"]} == {True, False}


@pytest.mark.slow
@pytest.mark.parametrize("n", range(len(QUESTIONS)))
def test_greedy_chat_answer_equals_transformers(chat, n):
    from engine.models import generate
    from engine.train.chat_template import encode_chat

    model, tokenizer, template = chat
    case = EXPECTED["cases"][n]
    messages = [{"role": "user", "content": case["question"]}]
    assert template.render(messages, add_generation_prompt=True).text == case["prompt_text"]
    ids = encode_chat(tokenizer, template, messages, add_generation_prompt=True)
    assert ids == case["prompt_ids"]
    # the model's own stopping rule (generation_config.json's eos), as transformers applies it
    result = generate(model, tokenizer, ids, EXPECTED["max_new_tokens"], temperature=0)
    assert result.token_ids == case["new_ids"], (case["question"], result.text, case["answer"])
    assert result.text == case["answer"]


@pytest.mark.slow
@pytest.mark.skipif(not ORACLE, reason="set EMBER_ORACLE_PYTHON to a Python with torch and transformers to "
                                       "re-make the expected answers live")
def test_expected_json_is_what_transformers_generates_now(folder):
    out = subprocess.run([ORACLE, str(FIXTURES / "make_expected.py"), str(folder)], capture_output=True, text=True,
                         timeout=900, check=True, env=dict(os.environ, TRANSFORMERS_VERBOSITY="error")).stdout
    live = json.loads(out)
    assert live["cases"] == EXPECTED["cases"]
