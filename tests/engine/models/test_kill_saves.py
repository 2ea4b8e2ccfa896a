"""Kill tests (issue 43): a save over an earlier save, killed with SIGKILL at random moments,
leaves a folder that is exactly the old save or exactly the new one, never a mix.

`save_killer.py` (a subprocess) saves A and then B, A, B, ... into one folder back to back and
is killed at a random moment, once per trial; between two kills the test compares the folder
with reference saves of A and B: the files a loader reads (every file of the save, byte for
byte: transformers' view as well as Ember's), and what Ember loads from it (every tensor and
the config). The folder also holds files of the user's that are no part of a save: they must
survive every kill. The next save after the kills finishes or undoes what they left.

Three savers: a Llama folder written as several shards (float32 over float32, and a dtype
change: bfloat16 shards over float32 ones), a PEFT adapter of another rank, a Hugging Face
export with tokenizer and generation files (one file over shards). The default run makes 20
kills of each in a few seconds; EMBER_LONG_TESTS=1 runs 200.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.models import from_pretrained, load_peft_adapter
from engine.module.reparam import iter_param_slots

ROOT = Path(__file__).resolve().parents[3]
HF = ROOT / "tests" / "fixtures" / "hf"
KILLER = Path(__file__).with_name("save_killer.py")
USER = {"notes.txt": b"the user's notes, no part of a save\n"}


@pytest.fixture
def save_dir(tmp_path):
    """A scratch folder in memory (/dev/shm) where the machine has one: fsync and unlink cost
    nothing there, so a trial of the bigger saves takes milliseconds; a kill does to it what it
    does on disk. (The adapter's save is mostly computing on tmpfs, so its test uses the disk,
    where most of a save is writing.)"""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="ember-kill-saves-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _user_files(folder: Path) -> None:
    folder.mkdir()
    (folder / "notes.txt").write_bytes(USER["notes.txt"])
    os.symlink("notes.txt", folder / "notes-link")
    (folder / "runs").mkdir()
    (folder / "runs" / "log.txt").write_text("step 1\n")


def _save_files(folder: Path) -> dict[str, bytes]:
    """Every entry of the folder but the user's, as a loader sees it (the bytes of files)."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name in USER or p.name in ("notes-link", "runs"):
            continue
        out[p.name] = p.read_bytes() if p.is_file() and not p.is_symlink() else f"not a file: {p}".encode()
    return out


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def _values(model) -> dict[str, np.ndarray]:
    out = {path: p.val().numpy() for path, p in model.named_params()}
    for path, p in iter_param_slots(model):
        r = p.reparameterization
        if r is not None:
            out[path + ".lora.a"], out[path + ".lora.b"] = r.a.val().numpy(), r.b.val().numpy()
            out[path + ".lora.scale"] = np.float64(r.scale)
    return out


def _hf_load(folder: Path) -> dict:
    model = from_pretrained(folder)
    values = _values(model)
    return {"config": json.loads((folder / "config.json").read_text()), **values}


def _peft_load(folder: Path) -> dict:
    return {"config": json.loads((folder / "adapter_config.json").read_text()),
            **_values(load_peft_adapter(from_pretrained(HF / "llama-gqa"), folder))}


def _same(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        (got[k] == want[k]) if k == "config" else np.array_equal(got[k], want[k]) for k in want)


def run_kills(tmp_path: Path, settings: dict, trials: int, load) -> None:
    folder, ref_a, ref_b = tmp_path / "out", tmp_path / "ref_a", tmp_path / "ref_b"
    _user_files(folder)
    settings = dict(settings, folder=str(folder), ref_a=str(ref_a), ref_b=str(ref_b))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", EMBER_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(KILLER), json.dumps(settings)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    guard = threading.Timer(600, proc.kill)  # a hang guard, far above the few seconds it takes
    guard.start()
    try:
        ready = proc.stdout.readline().split()
        assert ready and ready[0] == "READY", f"the saver did not start: {ready}"
        one_save = float(ready[1])
        refs = {"A": _save_files(ref_a), "B": _save_files(ref_b)}
        assert refs["A"] != refs["B"]
        loaded = {k: load(ref) for k, ref in (("A", ref_a), ("B", ref_b))}
        rng = random.Random(43)
        killed_mid_save = 0
        for trial in range(trials):
            proc.stdin.write(f"KILL {rng.uniform(0, 2.5 * one_save):.6f}\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "KILLED\n"
            files = _save_files(folder)
            which = [k for k, want in refs.items() if files == want]
            assert which, (f"kill {trial}: the folder is neither save A nor save B: "
                           f"{ {n: [k for k in refs if refs[k].get(n) == b] for n, b in files.items()} } "
                           f"(file: the saves it equals); A has {sorted(refs['A'])}, B {sorted(refs['B'])}")
            assert _same(load(folder), loaded[which[0]]), f"kill {trial}: loads other values than save {which[0]}"
            assert (folder / "notes.txt").read_bytes() == USER["notes.txt"]
            assert os.readlink(folder / "notes-link") == "notes.txt"
            left = _leftovers(folder)
            killed_mid_save += bool(left)
            if not (folder / "runs").is_dir():  # moved aside by the swap and not yet back: beside it
                assert any((folder.parent / n / "runs" / "log.txt").is_file() for n in left), left
        proc.stdin.write("DONE\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the kills fell into saves, not only between them: 13-16 of 20 left a save's state behind
    # when measured (the rest fell where the saver computes); a quarter is far from chance
    assert killed_mid_save >= trials // 4, f"only {killed_mid_save} of {trials} kills interrupted a save"
    # the saver's last save (after DONE) finished or undid what the kills left, and brought
    # back the user's folder
    assert _leftovers(folder) == []
    assert (folder / "runs" / "log.txt").read_text() == "step 1\n"
    assert (folder / "notes.txt").read_bytes() == USER["notes.txt"]
    assert _save_files(folder) == refs["A"]


SHARDS = {"kind": "shards", "src_a": str(HF / "llama-gqa"), "src_b": str(HF / "llama-sharded"),
          "max_shard_size": 16_000}


@pytest.mark.parametrize("dtype_b", [None, "bfloat16"], ids=["float32", "dtype-change"])
def test_a_killed_multi_shard_save_leaves_the_old_or_the_new_folder(save_dir, dtype_b):
    run_kills(save_dir, dict(SHARDS, dtype_b=dtype_b), 20, _hf_load)


def test_a_killed_peft_adapter_save_leaves_the_old_or_the_new_adapter(tmp_path):
    run_kills(tmp_path, {"kind": "peft", "src_a": str(HF / "llama-gqa"), "rank_a": 4, "rank_b": 8}, 20, _peft_load)


def _extras_sources(tmp_path: Path) -> dict:
    src_a, src_b = tmp_path / "src_a", tmp_path / "src_b"
    shutil.copytree(HF / "llama-gqa", src_a)
    shutil.copytree(HF / "llama-sharded", src_b)
    (src_b / "tokenizer.json").write_text(json.dumps({"model": "B's tokenizer", "pad": "x" * 5000}))
    (src_b / "tokenizer.model").write_bytes(bytes(range(256)) * 40)
    (src_b / "generation_config.json").write_text(json.dumps({"max_length": 7}))
    return {"kind": "extras", "src_a": str(src_a), "src_b": str(src_b), "max_shard_size": 40_000}


def test_a_killed_export_with_extra_files_leaves_the_old_or_the_new_folder(save_dir):
    run_kills(save_dir, _extras_sources(save_dir), 20, _hf_load)


@pytest.mark.long
@pytest.mark.parametrize("kind", ["shards", "dtype-change", "peft", "extras"])
def test_many_kills(save_dir, tmp_path, kind):
    if kind == "peft":
        run_kills(tmp_path, {"kind": "peft", "src_a": str(HF / "llama-gqa"), "rank_a": 4, "rank_b": 8}, 200,
                  _peft_load)
    elif kind == "extras":
        run_kills(save_dir, _extras_sources(save_dir), 200, _hf_load)
    else:
        run_kills(save_dir, dict(SHARDS, dtype_b="bfloat16" if kind == "dtype-change" else None), 200, _hf_load)
