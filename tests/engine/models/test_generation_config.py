"""The model's own stopping rules and generation settings (issue 45, item 2): `generate` stops at the
eos transformers stops at (generation_config.json's `eos_token_id`, an int or a list, else
config.json's), keeps the eos as the last new token, pads a batch with a token of the vocabulary
(a GPT-2 config whose eos / pad is outside it), applies `repetition_penalty` as transformers'
`RepetitionPenaltyLogitsProcessor` (checked against a float64 reference), and reads
generation_config.json's sampling defaults through the bounded JSON reader."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.autodiff.tape import no_recording
from engine.models import PretrainedError, from_pretrained, generate, pretrained_info
from engine.models.generate import GenerationError, generation_config, generation_defaults, penalize_repetition

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
PROMPT = [9, 8, 7]


@pytest.fixture(scope="module")
def unstopped():
    """llama-gqa, greedy from PROMPT for 16 tokens with no stop token, by whole-sequence forwards (not
    `generate`'s cache): transformers' eos 2 first comes 15th, a 3 13th, an 8 2nd (the stops below)."""
    seq = _greedy_reference(from_pretrained(HF / "llama-gqa"), PROMPT, 16)
    assert seq.index(8) == 1 and seq.index(3) == 12 and seq.index(2) == 14, seq
    return seq


def _folder(tmp_path, name="llama-gqa", config=None, generation="keep"):
    """A copy of the fixture folder `name` with config.json's keys updated by `config` and
    generation_config.json replaced by `generation` (a dict), removed (None) or kept ("keep")."""
    out = tmp_path / name
    shutil.copytree(HF / name, out)
    if config:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(config)
        (out / "config.json").write_text(json.dumps(cfg))
    if generation is None:
        (out / "generation_config.json").unlink(missing_ok=True)
    elif generation != "keep":
        (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def test_the_model_stops_at_its_eos_and_keeps_it(unstopped):
    model = from_pretrained(HF / "llama-gqa")  # generation_config.json and config.json: eos 2
    assert generate(model, None, PROMPT, 16, temperature=0, eos_token_id=[]).token_ids == unstopped
    r = generate(model, None, PROMPT, 16, temperature=0)
    assert r.token_ids == unstopped[:15] and r.token_ids[-1] == 2 and r.finish_reasons == ["stop"]

    class Tok:  # a tokenizer's eos counts only where the model names none; eos_token_id=[] turns both off
        eos_id, pad_id = 3, None

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    assert generate(model, Tok(), PROMPT, 16, temperature=0).token_ids == unstopped[:15]
    assert generate(model, Tok(), PROMPT, 16, temperature=0, eos_token_id=[]).token_ids == unstopped


@pytest.mark.parametrize("name", ["llama-gqa", "llama-tied", "mistral", "qwen2", "gpt2"])
def test_greedy_without_a_stop_argument_equals_transformers_generate(name):
    """The committed transformers outputs (made with the folder's eos): the model's own eos is enough,
    and a row that ends at it ends with it (llama-gqa's second prompt: two tokens, the eos last)."""
    exp = json.loads((HF / name / "generate_expected.json").read_text())
    model = from_pretrained(HF / name)
    for case in exp["cases"]:
        batched = case.get("batch", False)
        r = generate(model, None, case["prompt_ids"] if batched else case["prompt_ids"][0], exp["max_new_tokens"],
                     temperature=0)
        assert r.ids == case["new_ids"], (name, case)


def test_config_json_eos_without_a_generation_config(tmp_path, unstopped):
    model = from_pretrained(_folder(tmp_path, generation=None))
    assert pretrained_info(model).generation_config is None
    assert generation_config(model)["eos_token_id"] == [2] and generation_defaults(model) == {}
    assert generate(model, None, PROMPT, 16, temperature=0).token_ids == unstopped[:15]


def test_an_eos_list_stops_at_any_of_its_tokens(tmp_path, unstopped):
    model = from_pretrained(_folder(tmp_path, generation={"eos_token_id": [3, 2]}))
    assert generation_config(model)["eos_token_id"] == [3, 2]
    r = generate(model, None, PROMPT, 16, temperature=0)
    assert r.token_ids == unstopped[:13] and r.token_ids[-1] == 3 and r.finish_reasons == ["stop"]


def test_generation_config_json_takes_precedence_over_config_json(tmp_path, unstopped):
    model = from_pretrained(_folder(tmp_path, config={"eos_token_id": 2}, generation={"eos_token_id": 7}))
    assert generation_config(model)["eos_token_id"] == [7]
    assert generate(model, None, PROMPT, 16, temperature=0).token_ids == unstopped[:14]
    # a generation_config.json without an eos: transformers' GenerationConfig has none, config.json's unused
    model = from_pretrained(_folder(tmp_path / "none", generation={"do_sample": False}))
    assert generate(model, None, PROMPT, 16, temperature=0).token_ids == unstopped
    # the caller's eos replaces the model's (transformers' generate(eos_token_id=...))
    assert generate(model, None, PROMPT, 16, temperature=0, eos_token_id=8).token_ids == unstopped[:2]


def test_a_bad_generation_config_is_named(tmp_path):
    folder = _folder(tmp_path, generation={"eos_token_id": "</s>"})
    model = from_pretrained(folder)
    with pytest.raises(GenerationError, match=r"generation_config\.json.*eos_token_id.*'</s>'"):
        generate(model, None, PROMPT, 4, temperature=0)
    (folder / "generation_config.json").write_text("[1, 2")
    with pytest.raises(PretrainedError, match="generation_config.json"):
        from_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(GenerationError, match="temperature"):
        generation_defaults(from_pretrained(folder))


def test_a_gpt2_batch_whose_eos_and_pad_lie_outside_the_vocabulary(tmp_path):
    """GPT-2 configs name 50256 (eos) with any vocabulary and no pad: the left padding must be a
    token of the vocabulary (it is masked: each row gives what it gives alone)."""
    folder = _folder(tmp_path, "gpt2", config={"eos_token_id": 50256, "bos_token_id": 50256, "pad_token_id": None},
                     generation={"eos_token_id": 50256, "bos_token_id": 50256})
    model = from_pretrained(folder)
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    r = generate(model, None, prompts, 6, temperature=0)
    assert r.ids == [generate(model, None, p, 6, temperature=0).token_ids for p in prompts]
    assert r.finish_reasons == ["length", "length"]


def _reference_penalty(logits, seen, penalty):
    out = np.array(logits, dtype=np.float64)
    for t in set(seen):
        out[t] = out[t] * penalty if out[t] < 0 else out[t] / penalty
    return out


def test_penalize_repetition_equals_the_reference():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 50))
    rows = [[3, 3, 7, 49, 0], [1, 2, 2, 2]]
    got = penalize_repetition(logits, rows, 1.7)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(got[i], _reference_penalty(logits[i], row, 1.7))
    assert np.array_equal(penalize_repetition(logits, rows, 1.0), logits)


def _greedy_reference(model, prompt, n, penalty=1.0):
    """Whole-sequence forwards, the penalty over the prompt and the new tokens, argmax: `n` new tokens."""
    seq = list(prompt)
    valid = model.valid()
    with no_recording():
        for _ in range(n):
            logits = valid.forward(Tensor.from_data(np.array([seq], dtype=np.int64))).numpy()[0, -1]
            seq.append(int(np.argmax(_reference_penalty(logits, seq, penalty))))
    return seq[len(prompt):]


def test_greedy_with_a_repetition_penalty_equals_a_float64_reference():
    """The tokens `generate` gives are the reference's (the tied Llama repeats itself without a
    penalty, so the penalty changes them)."""
    model = from_pretrained(HF / "llama-tied")
    prompt, n, penalty = [9, 8, 7], 12, 1.5
    want = _greedy_reference(model, prompt, n, penalty)
    got = generate(model, None, prompt, n, temperature=0, repetition_penalty=penalty, eos_token_id=[]).token_ids
    assert got == want
    assert got != generate(model, None, prompt, n, temperature=0, eos_token_id=[]).token_ids
    with pytest.raises(GenerationError, match="repetition_penalty"):
        generate(model, None, prompt, 2, repetition_penalty=0)


def test_generation_defaults_follow_transformers(tmp_path):
    sampled = from_pretrained(_folder(tmp_path / "a", generation={
        "do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1, "max_new_tokens": 64}))
    assert generation_defaults(sampled) == {"temperature": 0.6, "top_k": 50, "top_p": 0.9,
                                            "repetition_penalty": 1.1, "max_new_tokens": 64}
    greedy = from_pretrained(_folder(tmp_path / "b", generation={"temperature": 0.6, "eos_token_id": 2}))
    assert generation_defaults(greedy) == {"temperature": 0.0, "top_k": 0, "top_p": 1.0}
