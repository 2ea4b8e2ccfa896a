"""The structural JSON mutation that the model folder readers' fuzz tests share
(test_hf_folder.py: safetensors headers and indexes; test_reader_fuzz.py: config.json, the
index, adapter_config.json)."""
from __future__ import annotations

import random


def mutate_json(value, rng: random.Random, odd: list, suffixes: list, leaf, dict_p: float = 0.8):
    """A structural mutation of a JSON document: in a dict or list, an entry dropped, one added
    (a key + one of `suffixes`, a value from `odd`) or one mutated in turn; anything else is
    replaced by `leaf(value, rng)` (a number edited, a value retyped)."""
    if isinstance(value, dict) and value and rng.random() < dict_p:
        out = dict(value)
        key = rng.choice(list(out))
        r = rng.random()
        if r < 0.15:
            del out[key]
        elif r < 0.25:
            out[key + rng.choice(suffixes)] = rng.choice(odd)
        else:
            out[key] = mutate_json(out[key], rng, odd, suffixes, leaf, dict_p)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        out = list(value)
        i = rng.randrange(len(out))
        r = rng.random()
        if r < 0.2:
            del out[i]
        elif r < 0.3:
            out.append(rng.choice(odd))
        else:
            out[i] = mutate_json(out[i], rng, odd, suffixes, leaf, dict_p)
        return out
    return leaf(value, rng)
