"""Issue 43, requirement 3 for text data: a seeded fuzz of mutated `.txt` / `.jsonl` files,
`tokenizer.json` and `tokenizer_config.json`, loaded with `load_tokenizer` and `load_text_data`
in a subprocess under an address-space limit. Every case ends in a data set or in one of the
project's errors (`TextDataError`, `TokenizerError`: `DataFileError`s) naming a file; never
another exception, an abort of the process (the Rust tokenizer's failed allocation or panic),
or memory beyond the limit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

FUZZ = r'''
import json, random, resource, sys, traceback
from pathlib import Path
from tests.limits import address_space_growth_limit
from engine.train.data_files import DataFileError
from engine.train.text import load_text_data, load_tokenizer

seed, cases, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rng = random.Random(seed)
FIXTURE = Path("tests/fixtures/hf/llama-gqa")
TOKENIZER = json.loads((FIXTURE / "tokenizer.json").read_text())
CONFIG = json.loads((FIXTURE / "tokenizer_config.json").read_text())
WORDS = ["the", "cat", "sat", "on", "a", "mat", "é", "日本", "\t", "  "]

def sentence():
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12)))

def weird_text():
    return rng.choice([
        "", " ", "\n", "\u2028", "\x85", "\ufeff", "\x00", "a" * rng.randint(1, 200_000), "a" * 40 + "!",
        " ".join(["cat"] * rng.randint(1, 60_000)), "\U0001f600" * rng.randint(1, 5000), sentence()])

def weird_json_value(depth=0):
    return rng.choice([
        None, True, -1, 0, 2 ** 31, 10 ** 30, 1e308, -0.0, "", "x" * 100_000, sentence(), [], {},
        "(a+)+$", {"Regex": "(a+)+$"}, {"String": "\u2028"}, [weird_json_value(depth + 1)] if depth < 3 else 7])

def raw_json_value():
    return rng.choice(["9" * 5000, "[" * 50_000 + "]" * 50_000, "1e99999", "NaN", "-Infinity", '"\\ud800"',
                      '"\\udfff\\ud800"', "{" * 3000, '"' + "\u2028" * 10 + '"'])

def jsonl_text():
    kind = rng.choice(["text", "pc"])
    lines = []
    for _ in range(rng.randint(1, 30)):
        if kind == "text":
            rec = {"text": weird_text() if rng.random() < 0.2 else sentence()}
        else:
            rec = {"prompt": sentence(), "completion": weird_text() if rng.random() < 0.2 else " " + sentence()}
        line = json.dumps(rec, ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.15:
            key = "text" if kind == "text" else "completion"
            line = "{" + json.dumps(key) + ": " + raw_json_value() + "}"
        lines.append(line)
    return rng.choice(["\n", "\r\n"]).join(lines)

def txt_text():
    return "\n".join(weird_text() if rng.random() < 0.2 else sentence() for _ in range(rng.randint(1, 40)))

def mutate_bytes(data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        at = rng.randrange(len(data) + 1)
        if op < 0.4 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op < 0.7:
            data[at:at] = rng.choice([b"\xff", b"\xc3", b"\n", b"\r", b"\x00", b'"', b"{", b"\xe2\x80\xa8",
                                      bytes([rng.randrange(256)]) * rng.randint(1, 50)])
        else:
            del data[at:at + rng.randint(1, 20)]
    return bytes(data)

def mutate_tree(value):
    """Replace, delete or add one node of a JSON tree, chosen at random."""
    paths = []
    def walk(v, path):
        paths.append(path)
        if isinstance(v, dict):
            for k in list(v)[:50]:
                walk(v[k], path + [k])
        elif isinstance(v, list):
            for i in range(min(len(v), 20)):
                walk(v[i], path + [i])
    walk(value, [])
    path = rng.choice(paths[1:] or paths)
    if not path:
        return weird_json_value()
    parent = value
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.2 and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = weird_json_value()
    return value

outcomes = {"loaded": 0, "TextDataError": 0, "TokenizerError": 0, "TextDataTooLarge": 0, "a panic in the library": 0}
failures = []
for case in range(cases):
    d = folder / f"case{case}"
    d.mkdir()
    tok_dir = d / "tok"
    tok_dir.mkdir()
    tokenizer_text = json.dumps(TOKENIZER)
    config_text = json.dumps(CONFIG)
    what = rng.random()
    if what < 0.25:
        tokenizer = json.loads(tokenizer_text)
        for _ in range(rng.randint(1, 3)):
            tokenizer = mutate_tree(tokenizer)
        tokenizer_text = json.dumps(tokenizer)
    elif what < 0.29:  # a pre-tokenizer regex: catastrophic on 'aaa…a!', unbalanced, or fine
        tokenizer = json.loads(tokenizer_text)
        tokenizer["pre_tokenizer"] = {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {
            "Regex": rng.choice(["(a+)+$", "(\\w+\\s?)+$", "(", "\\s+", "(?<=a)b{99999}"])}}
        tokenizer_text = json.dumps(tokenizer)
    elif what < 0.32:
        tokenizer_text = mutate_bytes(tokenizer_text.encode()).decode("utf-8", "replace")
    elif what < 0.4:
        config_text = json.dumps(mutate_tree(dict(CONFIG))) if rng.random() < 0.7 else \
            '{"eos_token": ' + raw_json_value() + "}"
    (tok_dir / "tokenizer.json").write_text(tokenizer_text, encoding="utf-8")
    (tok_dir / "tokenizer_config.json").write_text(config_text, encoding="utf-8")
    suffix = rng.choice([".txt", ".jsonl"])
    text = jsonl_text() if suffix == ".jsonl" else txt_text()
    if 0.25 <= what < 0.29 and suffix == ".txt":
        text += "\n" + "a" * 40 + "!"  # what a catastrophic pattern backtracks on
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.3:
        data = mutate_bytes(data)
    path = d / f"data{suffix}"
    path.write_bytes(data)
    options = rng.choice([dict(block_size=rng.choice([1, 4, 16])), dict(block_size=8, per_line=True),
                          dict(packing=False, per_line=True), dict(packing=False, block_size=8, truncate=True),
                          dict(block_size=8, vocab_size=rng.choice([16, 128]), max_positions=32)])
    try:
        with address_space_growth_limit(1 << 30):
            tok = load_tokenizer(tok_dir)
            ds = load_text_data(path, tok, **options)
        assert len(ds) > 0 and ds.inputs.shape[1] == ds.block_size
        outcomes["loaded"] += 1
    except DataFileError as e:
        name = type(e).__name__
        outcomes[name] = outcomes.get(name, 0) + 1
        outcomes["a panic in the library"] += "(a panic in the library" in str(e)
        if str(d) not in str(e):
            failures.append(f"case {case}: {name} names no file of the case: {e}"[:400])
    except BaseException as e:  # noqa: BLE001 - anything else is what the fuzz looks for
        failures.append(f"case {case} ({options}): {type(e).__name__}: {str(e)[:200]}\n"
                        + traceback.format_exc()[-1200:])
with open("/proc/self/status") as f:  # VmHWM, this process's own peak: ru_maxrss keeps the parent's across exec
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"outcomes": outcomes, "failures": failures[:5], "n_failures": len(failures), "peak": peak}))
'''


def fuzz(tmp_path, seed: int, cases: int) -> dict:
    env = {**os.environ, "RUST_BACKTRACE": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FUZZ, str(seed), str(cases), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])  # -6: an abort in the tokenizer
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(result: dict, cases: int) -> None:
    assert result["n_failures"] == 0, "\n\n".join(result["failures"])
    outcomes = result["outcomes"]
    assert sum(outcomes.values()) - outcomes["a panic in the library"] == cases
    # the fuzz reaches both sides: files that load and files each reader refuses
    assert outcomes["loaded"] > cases // 5 and outcomes["TextDataError"] > 0 and outcomes["TokenizerError"] > 0, \
        outcomes
    assert outcomes["a panic in the library"] > 0, outcomes  # a catastrophic regex was met
    assert result["peak"] < 1.5 * 2**30


def test_mutated_text_files_and_tokenizers_end_in_data_or_the_projects_errors(tmp_path):
    check(fuzz(tmp_path, seed=43, cases=200), 200)


@pytest.mark.long
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_text_files_and_tokenizers_longer_run(tmp_path, seed):
    check(fuzz(tmp_path, seed=seed, cases=1000), 1000)
