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

`--smollm2` (issue 45): greedy chat generation on SmolLM2-135M-Instruct (the folder benchmarks/smollm2.py
makes in the cache): the ten questions of tests/engine/models/fixtures/smollm2_chat, each one user
message rendered with the model's chat template and a generation prompt (Ember: `read_chat_template` +
`encode_chat`; transformers: `apply_chat_template`), answered greedily up to 48 new tokens, the model's
eos stopping it as in a chat; tokens/s = all the answers' new tokens over the time of all the `generate`
calls, best of the alternating rounds (each a fresh process).
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
CHAT_NEW, CHAT_ROUNDS = 48, 2
QUESTIONS = ROOT / "tests" / "engine" / "models" / "fixtures" / "smollm2_chat" / "questions.json"

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


EMBER_CHAT = textwrap.dedent("""
    import json, sys, time
    import engine  # first, as users do: it configures OpenBLAS (its threads' spin) before NumPy loads it
    from engine.models import from_pretrained, generate
    from engine.train.chat_template import encode_chat, read_chat_template
    from engine.train.tokenizer import load_tokenizer
    folder, questions, new = sys.argv[1], json.load(open(sys.argv[2], encoding="utf-8")), int(sys.argv[3])
    model, tok, template = from_pretrained(folder), load_tokenizer(folder), read_chat_template(folder)
    prompts = [encode_chat(tok, template, [{"role": "user", "content": q}], add_generation_prompt=True)
               for q in questions]
    generate(model, None, prompts[0], 4, temperature=0)  # warm-up
    seconds, ids = 0.0, []
    for p in prompts:
        t0 = time.perf_counter()
        r = generate(model, None, p, new, temperature=0)
        seconds += time.perf_counter() - t0
        ids.append(r.token_ids)
    print(json.dumps({"seconds": seconds, "ids": ids, "tokens": sum(map(len, ids)), "threads": engine.num_threads()}))
""")

TORCH_CHAT = textwrap.dedent("""
    import json, sys, time
    import torch
    import transformers
    folder, questions, new, threads = sys.argv[1], json.load(open(sys.argv[2], encoding="utf-8")), \\
        int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)["input_ids"] for q in questions]
    seconds, ids = 0.0, []
    with torch.no_grad():
        model.generate(prompts[0], attention_mask=torch.ones_like(prompts[0]), do_sample=False, max_new_tokens=4)
        for p in prompts:
            t0 = time.perf_counter()
            out = model.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=new)
            seconds += time.perf_counter() - t0
            ids.append(out[0, p.shape[1]:].tolist())
    print(json.dumps({"seconds": seconds, "ids": ids, "tokens": sum(map(len, ids)), "threads": torch.get_num_threads()}))
""")


def chat_main(argv=None) -> int:
    """`--smollm2`: greedy chat answers of SmolLM2-135M-Instruct, Ember against transformers."""
    import argparse  # noqa: PLC0415

    from benchmarks.smollm2 import smollm2_folder  # noqa: PLC0415

    ap = argparse.ArgumentParser(description="greedy chat generation on SmolLM2-135M-Instruct")
    ap.add_argument("--smollm2", action="store_true")
    ap.add_argument("--threads", default=",".join(map(str, THREADS)))
    ap.add_argument("--rounds", type=int, default=CHAT_ROUNDS, help="fresh processes per side and thread count")
    ap.add_argument("--questions", type=int, default=10, help="the first N of the ten questions")
    args = ap.parse_args(argv)
    threads, rounds = [int(t) for t in args.threads.split(",")], args.rounds
    print(machine_line())
    oracle = oracle_python()
    folder = smollm2_folder(oracle[0] if oracle is not None else None)
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))[:args.questions]
    n_questions = len(questions)
    tmp = Path(tempfile.mkdtemp(prefix="ember-chat-bench-"))
    chosen = tmp / "questions.json"
    chosen.write_text(json.dumps(questions), encoding="utf-8")
    rows, agree = [], []
    for n in threads:
        sides = {"Ember, KV cache": (sys.executable, EMBER_CHAT, [str(folder), str(chosen), str(CHAT_NEW)])}
        if oracle is not None:
            sides[f"transformers generate (torch, transformers {oracle[1]})"] = (
                oracle[0], TORCH_CHAT, [str(folder), str(chosen), str(CHAT_NEW), str(n)])
        best: dict = {}
        for _ in range(rounds):
            for name, (python, code, args) in sides.items():
                r = run_side(python, code, args, n, timeout=1800)
                if name not in best or r["tokens"] / r["seconds"] > best[name]["tokens"] / best[name]["seconds"]:
                    best[name] = r
        peer = next((best[k] for k in best if k.startswith("transformers")), None)
        for name, r in best.items():
            rate = r["tokens"] / r["seconds"]
            ratio = f"{rate / (peer['tokens'] / peer['seconds']):.2f}×" if peer is not None else "–"
            rows.append([str(n), name, f"{rate:.1f}", f"{r['seconds'] / r['tokens'] * 1e3:.2f} ms", str(r["tokens"]),
                         f"{r['seconds']:.2f} s", str(r["threads"]), ratio])
        agree.append(all(r["ids"] == best["Ember, KV cache"]["ids"] for r in best.values()))
    print_table(f"Greedy chat generation, tokens/s: SmolLM2-135M-Instruct (float32), {n_questions} questions, "
                f"each a user message with the chat template's generation prompt, up to {CHAT_NEW} new tokens (the "
                f"model's eos stops it), each side in a fresh process, best of {rounds} alternating rounds "
                f"(CPU: {cpu_name()})",
                ["threads", "side", "tokens/s", "per token", "new tokens", "generate() calls", "threads seen",
                 "tokens/s vs transformers"], rows)
    print()
    print(f"- the sides' answers are {'identical, token for token' if all(agree) else 'NOT identical'} at every "
          "thread count")
    if oracle is None:
        print("- transformers: not measured (no Python with torch and transformers: set EMBER_ORACLE_PYTHON)")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main() -> int:
    import numpy as np

    if "--smollm2" in sys.argv[1:]:
        return chat_main()
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
