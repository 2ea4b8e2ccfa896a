"""Fuzzing the model folder readers (issue 43, must-show 3): config.json (through
`from_pretrained`), the safetensors index (through `open_checkpoint`, every tensor read) and a
PEFT adapter's adapter_config.json and adapter_model.safetensors (through `load_peft_adapter`).

Seeded mutations of the committed fixtures: bit flips, truncations, structural edits of the JSON
(values replaced, dropped, retyped; odd numbers, long and path-like names, deep nesting, NaN and
1e400), hostile tensors (NaN, trailing bytes). Every case must end in a clean load (an adapter: one whose
logits are finite) or a `PretrainedError` (never another exception: no RecursionError, OverflowError, OSError,
MemoryError, ...) with the process's address space capped a few hundred MiB above its size at
the start (`capped_memory`), so that a reader that trusted a size from the file fails the test.
A few hundred cases run by default; EMBER_LONG_TESTS=1 runs five times as many."""
from __future__ import annotations

import json
import math
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.models import PretrainedError, from_pretrained, load_peft_adapter
from engine.models.hf_folder import open_checkpoint
from engine.module.reparam import iter_param_slots

from tests.limits import capped_memory

from .json_fuzz import mutate_json

FIX = Path(__file__).resolve().parents[2] / "fixtures"
HF, PEFT = FIX / "hf", FIX / "peft"
SLOW = 5  # the long variants (EMBER_LONG_TESTS=1) run this many times the cases

ODD = [None, True, False, -1, 0, 1, 2, 3, 4, 7, 2 ** 31, 2 ** 63, -2 ** 63, 1.5, -0.0, 1e-300, 1e308, "", "x",
       "../x", "/etc/passwd", "a" * 5000, "C:\\x", "x/y", "\x00", [], {}, [1, 2], ["q_proj"], {"a": 1},
       "model-00001-of-00004.safetensors", "LlamaForCausalLM", "llama", "gpt2", "LORA", "all-linear", "(.*)*x",
       "float16", "BF16"]
RAW = {"1e400": "1e400", "-1e400": "-1e400", "NaN": "NaN", "5000 digits": "9" * 5000,
       "deep": "[" * 5000 + "]" * 5000, "nested 70": "[" * 70 + "]" * 70}


def _leaf(value, rng: random.Random):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and rng.random() < 0.5:
        return rng.choice([value + 1, value - 1, -value, value * 2, value / 2 if value else 0.5])
    if rng.random() < 0.15:  # raw JSON text the json module cannot write: marked, substituted below
        return "@@" + rng.choice(list(RAW)) + "@@"
    return rng.choice(ODD)


def _mutate(value, rng: random.Random):
    return mutate_json(value, rng, ODD, ["", "x", "_pattern"], _leaf, dict_p=0.85)


def _json_text(doc) -> str:
    text = json.dumps(doc, indent=1)
    for key, raw in RAW.items():
        text = text.replace(f'"@@{key}@@"', raw)
    return text


def _mutated_bytes(seed: bytes, rng: random.Random, case: int) -> bytes:
    """A JSON file's bytes: structural edits most of the time, else bit flips or a truncation."""
    kind = case % 5
    if kind == 3:
        b = bytearray(seed)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 4:
        return seed[: rng.randrange(len(seed))]
    doc = json.loads(seed)
    for _ in range(rng.randint(1, 3)):
        doc = _mutate(doc, rng)
    return _json_text(doc).encode()


def _run(fn, counts):
    """One case: a clean result or a PretrainedError; anything else fails the test."""
    counts["cases"] += 1
    try:
        with capped_memory():
            fn()
        counts["accepted"] += 1
    except PretrainedError:
        counts["rejected"] += 1


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------ config.json
def _fuzz_config(tmp_path, cases: int, seed: int):
    rng = random.Random(seed)
    counts = {"cases": 0, "accepted": 0, "rejected": 0}
    folders = {name: _copy(HF / name, tmp_path / name) for name in ("llama-gqa", "gpt2", "bert", "vit")}
    for case in range(cases):
        name = rng.choice(list(folders))
        folder = folders[name]
        original = (HF / name / "config.json").read_bytes()
        # sizes too (2**31, 2**63, doubled, negated): from_pretrained checks them against the
        # tensors the folder holds before it builds anything
        (folder / "config.json").write_bytes(_mutated_bytes(original, rng, case))
        _run(lambda: from_pretrained(folder), counts)
    return counts


# ------------------------------------------------------------------------------ the index
def _fuzz_index(tmp_path, cases: int, seed: int):
    rng = random.Random(seed)
    counts = {"cases": 0, "accepted": 0, "rejected": 0}
    folder = _copy(HF / "llama-sharded", tmp_path / "llama-sharded")
    index = folder / "model.safetensors.index.json"
    original = (HF / "llama-sharded" / index.name).read_bytes()
    for case in range(cases):
        index.write_bytes(_mutated_bytes(original, rng, case))

        def load():
            with open_checkpoint(folder) as ckpt:
                for t in ckpt.tensors.values():
                    t.read()
        _run(load, counts)
    return counts


# ------------------------------------------------------------------------------ PEFT adapters
def _mutated_weights(seed: bytes, rng: random.Random, case: int) -> bytes:
    (n,) = struct.unpack_from("<Q", seed)
    kind = case % 5
    if kind == 0:  # flips in the length and the header
        b = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(8 + n)] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 1:  # the header's JSON edited
        header = json.loads(seed[8:8 + n])
        for _ in range(rng.randint(1, 2)):
            header = _mutate(header, rng)
        text = _json_text(header).encode()
        return struct.pack("<Q", len(text)) + text + seed[8 + n:]
    if kind == 2:  # a float32 of the data set to NaN or infinity (finite but huge values: test_peft)
        b = bytearray(seed)
        at = 8 + n + 4 * rng.randrange((len(seed) - 8 - n) // 4)
        struct.pack_into("<f", b, at, rng.choice([math.nan, math.inf, -math.inf]))
        return bytes(b)
    if kind == 3:  # bytes after the data
        return seed + bytes(rng.choice([1, 7, 4096]))
    return seed[: rng.randrange(len(seed))]


def _finite_logits(model):
    """An adapter that loads must not be silently broken: its logits are finite. (The mutations
    write NaN and infinity, not finite values that overflow the forward: an adapter of huge
    finite values is refused only where its update scale * B @ A leaves float32.)"""
    logits = model.valid().forward(Tensor.from_data(np.array([[1, 5, 9, 2]]))).numpy()
    assert np.isfinite(logits).all(), "an adapter loaded and made the logits NaN or infinite"


def _fuzz_adapter(tmp_path, cases: int, seed: int):
    rng = random.Random(seed)
    counts = {"cases": 0, "accepted": 0, "rejected": 0}
    model = from_pretrained(HF / "llama-gqa")
    names = ["llama-lora-qv", "llama-rslora-all-linear", "llama-dora", "llama-embed-regex"]
    folders = {name: _copy(PEFT / name, tmp_path / name) for name in names}
    for case in range(cases):
        name = rng.choice(names)
        folder = folders[name]
        config, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
        config.write_bytes((PEFT / name / config.name).read_bytes())
        weights.write_bytes((PEFT / name / weights.name).read_bytes())
        if case % 2:
            config.write_bytes(_mutated_bytes(config.read_bytes(), rng, case // 2))
        else:
            weights.write_bytes(_mutated_weights(weights.read_bytes(), rng, case // 2))
        _run(lambda: _finite_logits(load_peft_adapter(model, folder)), counts)
    assert not any(p.reparameterization for _, p in iter_param_slots(model))  # never changed in place
    return counts


# ------------------------------------------------------------------------------ the runs
# each reader: its fuzzer, cases, the seeds of the default and long runs, and the share of
# cases that must end in a PretrainedError (more than 1/n)
READERS = {"config.json": (_fuzz_config, 150, (43, 4343), 3),
           "index": (_fuzz_index, 150, (431, 43431), 2),
           "PEFT adapter": (_fuzz_adapter, 200, (4300, 430043), 3)}


@pytest.mark.parametrize("run", [0, pytest.param(1, marks=pytest.mark.long, id="more")], ids=["default", "more"])
@pytest.mark.parametrize("reader", list(READERS))
def test_fuzzed_reader(tmp_path, reader, run):
    fuzz, cases, seeds, share = READERS[reader]
    counts = fuzz(tmp_path, cases * SLOW ** run, seed=seeds[run])
    assert counts["rejected"] > counts["cases"] // share and counts["accepted"] > 0, counts
    print(f"\n{reader} fuzz: {counts}")
