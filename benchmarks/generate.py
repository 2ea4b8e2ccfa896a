"""Greedy generation (issue 20): tokens per second of `engine.models.generate` with its key/value
cache against transformers' `generate`, on the same model, prompt and thread count.

The model is a random Llama (hidden 256, 4 layers, 8 heads / 2 kv heads, intermediate 688, vocab
32000, float32) made once by transformers in a temporary folder. Each side runs in a fresh process
with 1 and then 2 threads: it opens the folder, warms up on a short generation, then times greedy
generation of 64 new tokens after a 32-token prompt (the prompt's forward included, eos never
stops it), best of its repeats and of the alternating rounds. Ember runs twice: with the cache
(the default) and with `use_cache=False`, which recomputes the whole sequence every step (what
the cache saves). The sides' new ids are compared.

Needs a Python with torch and transformers for the model and the peer: this one, or the one named
by `EMBER_ORACLE_PYTHON`; without one the transformers rows say so and Ember runs alone on the
committed llama-gqa fixture.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \\
    EMBER_ORACLE_PYTHON=/tmp/torchvenv/bin/python .venv/bin/python benchmarks/generate.py
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import child_env, cpu_name, machine_line, oracle_python, print_table, run_side  # noqa: E402

SIZES = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "intermediate_size": 688, "vocab_size": 32000, "max_position_embeddings": 512}
PROMPT, NEW = 32, 64
THREADS = (1, 2)
ROUNDS, REPEATS = 3, 3

MAKE_MODEL = textwrap.dedent("""
    import json, sys, torch, transformers
    folder, sizes = sys.argv[1], json.loads(sys.argv[2])
    torch.manual_seed(20)
    cfg = transformers.LlamaConfig(**sizes, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=0)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(folder)
""")

EMBER_SIDE = textwrap.dedent("""
    import json, sys, time
    import engine  # first, as users do: it configures OpenBLAS (its threads' spin) before NumPy loads it
    import numpy as np
    from engine.models import from_pretrained, generate
    folder, ids_file, new, repeats, use_cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \\
        sys.argv[5] == "1"
    model = from_pretrained(folder)
    prompt = np.load(ids_file)[0].tolist()
    generate(model, None, prompt, 4, temperature=0, eos_token_id=[], use_cache=use_cache)  # warm-up
    best, ids = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = generate(model, None, prompt, new, temperature=0, eos_token_id=[], use_cache=use_cache)  # as min_new_tokens
        best = min(best, time.perf_counter() - t0)
        ids = r.token_ids
    print(json.dumps({"seconds": best, "ids": ids, "threads": engine.num_threads()}))
""")

TORCH_SIDE = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import torch
    import transformers
    folder, ids_file, new, repeats, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \\
        int(sys.argv[5])
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.from_numpy(np.load(ids_file))
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        best, out = float("inf"), None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)  # eos never stops it
            best = min(best, time.perf_counter() - t0)
    print(json.dumps({"seconds": best, "ids": out[0, ids.shape[1]:].tolist(), "threads": torch.get_num_threads()}))
""")



def main() -> int:
    import numpy as np

    print(machine_line())
    tmp = Path(tempfile.mkdtemp(prefix="ember-generate-bench-"))
    try:
        oracle = oracle_python()
        if oracle is not None:
            py, versions = oracle
            folder = tmp / "llama"
            proc = subprocess.run([py, "-c", MAKE_MODEL, str(folder), json.dumps(SIZES)], capture_output=True,
                                  text=True, env=child_env(1), timeout=900)
            if proc.returncode != 0:
                print(f"could not make the model with {py}: {proc.stderr.strip()[-800:]}")
                oracle = None
        if oracle is None:
            folder = ROOT / "tests" / "fixtures" / "hf" / "llama-gqa"
            vocab, prompt, new = 128, 16, 32
            what = "the llama-gqa fixture (hidden 48, 2 layers, vocab 128; no torch/transformers for the peer)"
        else:
            vocab, prompt, new = SIZES["vocab_size"], PROMPT, NEW
            what = (f"random Llama (hidden {SIZES['hidden_size']}, {SIZES['num_hidden_layers']} layers, "
                    f"{SIZES['num_attention_heads']} heads / {SIZES['num_key_value_heads']} kv, intermediate "
                    f"{SIZES['intermediate_size']}, vocab {vocab}, float32)")
        ids_file = tmp / "ids.npy"
        np.save(ids_file, np.random.default_rng(0).integers(3, vocab, size=(1, prompt)).astype(np.int64))
        rows, agree = [], []
        for threads in THREADS:
            sides = {
                "Ember, KV cache": (sys.executable, EMBER_SIDE, [str(folder), str(ids_file), str(new), str(REPEATS),
                                                                 "1"]),
                "Ember, no cache (whole sequence each step)": (sys.executable, EMBER_SIDE,
                                                               [str(folder), str(ids_file), str(new), "1", "0"]),
            }
            if oracle is not None:
                sides[f"transformers generate (torch, transformers {versions})"] = (
                    py, TORCH_SIDE, [str(folder), str(ids_file), str(new), str(REPEATS), str(threads)])
            best: dict = {}
            for _ in range(ROUNDS):
                for name, (python, code, args) in sides.items():
                    r = run_side(python, code, args, threads)
                    if name not in best or r["seconds"] < best[name]["seconds"]:
                        best[name] = r
            peer = next((best[k] for k in best if k.startswith("transformers")), None)
            cached = best["Ember, KV cache"]
            for name, r in best.items():
                ratio = "–"
                if peer is not None:
                    ratio = f"{peer['seconds'] / r['seconds']:.2f}×"
                rows.append([str(threads), name, f"{new / r['seconds']:.1f}", f"{r['seconds'] / new * 1e3:.2f} ms",
                             f"{r['seconds']:.3f} s", str(r["threads"]), ratio])
            agree.append(all(r["ids"] == cached["ids"] for r in best.values()))
        print_table(f"Greedy generation, tokens/s: {what}, prompt {prompt} tokens, {new} new tokens, each side in a "
                    f"fresh process, best of {REPEATS} repeats x {ROUNDS} alternating rounds (CPU: {cpu_name()})",
                    ["threads", "side", "tokens/s", "per token", "generate() call", "threads seen",
                     "tokens/s vs transformers"], rows)
        print()
        print(f"- the sides' new ids are {'identical' if all(agree) else 'NOT identical'} at every thread count")
        if oracle is not None:
            for threads in THREADS:
                part = [r for r in rows if r[0] == str(threads)]
                ember = next(r for r in part if r[1] == "Ember, KV cache")
                print(f"- {threads} thread(s): Ember with the cache at {ember[6]} transformers' tokens/s "
                      f"(target >= 1.0x)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
