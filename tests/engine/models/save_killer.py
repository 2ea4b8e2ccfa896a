"""The saving side of the kill tests (test_kill_saves.py): run as a script, never collected.

    python save_killer.py '<json settings>'

Builds two models, A and B (or two adapters), saves each once into the reference folders
`ref_a` / `ref_b`, then A into `folder`, and prints `READY <seconds one save takes>`. Then, for
each line `KILL <seconds>` read from stdin, it forks a child that saves B, A, B, A, ... into
`folder` back to back, kills the child with SIGKILL that many seconds after its first save
began, reaps it and
prints `KILLED`; after `DONE` it saves A once more and exits. The test looks at the folder
between two kills. Forking keeps a trial cheap:
the models are built and the libraries imported once.

Kinds: `shards` (two Llama folders written as several shards, B optionally in another dtype),
`peft` (two LoRA adapters of different ranks on one base), `extras` (two Llama folders with
different tokenizer / generation files, A as one file, B as shards).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from engine.models import from_pretrained, save_peft_adapter, save_pretrained  # noqa: E402
from engine.models.peft import peft_lora  # noqa: E402


def savers(settings: dict):
    kind = settings["kind"]
    if kind == "shards":
        a, b = from_pretrained(settings["src_a"]), from_pretrained(settings["src_b"])
        size = settings["max_shard_size"]
        return (lambda f: save_pretrained(a, f, max_shard_size=size, dtype=settings.get("dtype_a")),
                lambda f: save_pretrained(b, f, max_shard_size=size, dtype=settings.get("dtype_b")))
    if kind == "extras":
        a, b = from_pretrained(settings["src_a"]), from_pretrained(settings["src_b"])
        return (lambda f: save_pretrained(a, f),
                lambda f: save_pretrained(b, f, max_shard_size=settings["max_shard_size"]))
    if kind == "peft":
        base = from_pretrained(settings["src_a"])
        a = base.apply_lora(peft_lora(base, r=settings["rank_a"], lora_alpha=8, init_std=0.02))
        b = base.apply_lora(peft_lora(base, r=settings["rank_b"], lora_alpha=16, init_std=0.02))
        return lambda f: save_peft_adapter(a, f), lambda f: save_peft_adapter(b, f)
    raise SystemExit(f"unknown kind {kind!r}")


def main() -> None:
    settings = json.loads(sys.argv[1])
    save_a, save_b = savers(settings)
    save_a(settings["ref_a"])
    save_b(settings["ref_b"])
    folder = settings["folder"]
    save_a(folder)
    started = time.perf_counter()
    for _ in range(2):
        save_b(folder)
        save_a(folder)
    print(f"READY {(time.perf_counter() - started) / 4:.6f}", flush=True)
    for line in sys.stdin:
        word, _, arg = line.partition(" ")
        if word != "KILL":  # DONE: one more save, which cleans up after the kills
            save_a(folder)
            break
        sys.stdout.flush()
        started_r, started_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: saves until it is killed
            try:
                os.write(started_w, b"S")
                while True:
                    save_b(folder)
                    save_a(folder)
            finally:
                os._exit(1)
        os.read(started_r, 1)  # the delay counts from the child's first save, not from the fork
        os.close(started_r)
        os.close(started_w)
        time.sleep(float(arg))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print("KILLED", flush=True)


if __name__ == "__main__":
    main()
