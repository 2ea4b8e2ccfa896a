"""Training step of a small GPT, engine vs PyTorch CPU, side by side in one run (issue 22).

The model is the minimal GPT of the engine guide's decoder pieces: token + learned position
embedding, `LAYERS` pre-norm blocks (LayerNorm, causal multi-head self-attention, residual;
LayerNorm, Linear d -> 4d, exact GELU, Linear 4d -> d, residual), a final LayerNorm and an LM
head; the step is forward, cross-entropy over every position and backward (no optimizer: the
update is the same few elementwise passes on both sides). Dropout 0. PyTorch runs the same
architecture written with torch.nn (its MultiheadAttention with a causal mask, which takes its
fused scaled-dot-product path where it can).

Grid: batch 16 / 64, d_model 32 / 256, sequence 12 / 128, at 1 and 2 threads, each thread count
in a fresh process (OpenBLAS reads OPENBLAS_NUM_THREADS at start-up; PyTorch gets
`set_num_threads`). Within a process the engine and PyTorch alternate over several rounds and
each keeps its best time, so background load hits both alike (7 rounds for the small cells, 3 for
the others). Ratio = engine / PyTorch.

    .venv/bin/python benchmarks/gpt.py [--threads 1,2] [--rounds 3] [--quick]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import (STABLE_MALLOC, alternate, cpu_name, fmt_time, machine, print_table,  # noqa: E402
                               torch_or_none, two_core_line)
from engine import Module, Tensor, nn  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)

VOCAB, LAYERS = 256, 2
GRID = [(b, d, s) for b in (16, 64) for d in (32, 256) for s in (12, 128)]
QUICK_GRID = [(16, 32, 12), (16, 256, 128)]
SMALL_WORK, SMALL_ROUNDS = 2e7, 7  # cells under SMALL_WORK (batch * seq * d^2) run SMALL_ROUNDS rounds


def n_heads(d: int) -> int:
    return max(1, d // 32)


# ---------------------------------------------------------------------- Ember
class Block(Module):
    def __init__(self, d: int):
        self.ln1 = nn.LayerNormConfig(d).init()
        self.attn = nn.MultiHeadAttentionConfig(d, n_heads(d), dropout=0.0, causal=True).init()
        self.ln2 = nn.LayerNormConfig(d).init()
        self.fc = nn.LinearConfig(d, 4 * d).init()
        self.act = nn.Gelu()
        self.proj = nn.LinearConfig(4 * d, d).init()

    def forward(self, x):
        x = x + self.attn.forward(nn.MhaInput.self_attn(self.ln1.forward(x))).context
        return x + self.proj.forward(self.act.forward(self.fc.forward(self.ln2.forward(x))))


class GPT(Module):
    def __init__(self, d: int, seq: int):
        self.tok = nn.EmbeddingConfig(VOCAB, d).init()
        self.pos = nn.EmbeddingConfig(seq, d).init()
        self.blocks = [Block(d) for _ in range(LAYERS)]
        self.ln_f = nn.LayerNormConfig(d).init()
        self.head = nn.LinearConfig(d, VOCAB).init()
        self.positions = Tensor.arange(seq).reshape(1, seq)

    def forward(self, ids):
        x = self.tok.forward(ids) + self.pos.forward(self.positions)
        for block in self.blocks:
            x = block.forward(x)
        return self.head.forward(self.ln_f.forward(x))


def data(batch: int, seq: int):
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, (batch, seq)), rng.integers(0, VOCAB, batch * seq)


def engine_step(batch: int, d: int, seq: int, device=None):
    """The engine's step; on `device` (benchmarks/gpu_rows.py: cuda:0) when given."""
    model = GPT(d, seq) if device is None else GPT(d, seq).fork(device)
    ids_np, tgt_np = data(batch, seq)
    ids, tgt = Tensor.from_data(ids_np, device=device), Tensor.from_data(tgt_np, device=device)
    loss_fn = nn.CrossEntropyLossConfig().init()

    def step():
        logits = model.forward(ids)
        loss = loss_fn.forward(logits.reshape(batch * seq, VOCAB), tgt)
        loss.backward()
        return loss

    return step


# ---------------------------------------------------------------------- PyTorch
def torch_step(torch, batch: int, d: int, seq: int):
    tn = torch.nn

    class TBlock(tn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = tn.LayerNorm(d), tn.LayerNorm(d)
            self.attn = tn.MultiheadAttention(d, n_heads(d), dropout=0.0, batch_first=True)
            self.mlp = tn.Sequential(tn.Linear(d, 4 * d), tn.GELU(), tn.Linear(4 * d, d))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
            return x + self.mlp(self.ln2(x))

    class TGPT(tn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = tn.Embedding(VOCAB, d), tn.Embedding(seq, d)
            self.blocks = tn.ModuleList([TBlock() for _ in range(LAYERS)])
            self.ln_f, self.head = tn.LayerNorm(d), tn.Linear(d, VOCAB)

        def forward(self, ids, mask):
            x = self.tok(ids) + self.pos(torch.arange(seq)[None])
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln_f(x))

    model = TGPT().train()
    ids_np, tgt_np = data(batch, seq)
    ids, tgt = torch.from_numpy(ids_np), torch.from_numpy(tgt_np)
    mask = tn.Transformer.generate_square_subsequent_mask(seq)

    def step():
        model.zero_grad(set_to_none=True)
        loss = tn.functional.cross_entropy(model(ids, mask).reshape(batch * seq, VOCAB), tgt)
        loss.backward()
        return loss

    return step


# ---------------------------------------------------------------------- one thread count (child)
def measure(threads: int, rounds: int, grid) -> dict:
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(threads)
    out = {"torch": torch.__version__ if torch is not None else None, "rows": []}
    for b, d, s in grid:
        fns = {"engine": engine_step(b, d, s), "torch": torch_step(torch, b, d, s) if torch is not None else None}
        work = b * s * d * d  # keeps every cell near the same wall time
        small = work < SMALL_WORK
        min_time = 0.15 if small else 0.4
        # a small cell's round is short, so this VM's bursts of load spoil a larger share of
        # them: more rounds for those (each side keeps its best round either way)
        best = alternate(fns, rounds=max(rounds, SMALL_ROUNDS) if small else rounds, min_time=min_time, warmup=1)
        out["rows"].append([b, d, s, best["engine"], best["torch"]])
    return out



def main() -> None:
    args = sys.argv[1:]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 3
    grid = QUICK_GRID if "--quick" in args else GRID
    if args and args[0] == "--child":
        print(json.dumps(measure(int(args[1]), rounds, grid)))
        return
    counts = [int(t) for t in args[args.index("--threads") + 1].split(",")] if "--threads" in args else [1, 2]
    rows, version, checks = [], None, []
    own_malloc = any(k in os.environ for k in STABLE_MALLOC)
    for threads in counts:
        if threads > 1:
            checks.append(f"- two-core check just before the {threads}-thread process: {two_core_line()}")
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
        if not own_malloc:
            env.update(STABLE_MALLOC)
        cmd = [sys.executable, __file__, "--child", str(threads), "--rounds", str(rounds)]
        if "--quick" in args:
            cmd.append("--quick")
        res = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                         .stdout.strip().splitlines()[-1])
        version = res["torch"]
        for b, d, s, te, tt in res["rows"]:
            rows.append([f"batch {b}, d {d}, seq {s}", threads, fmt_time(te), fmt_time(tt) if tt else "-",
                         f"{te / tt:.2f}x" if tt else "-"])
    peer = f"PyTorch {version} CPU" if version else "PyTorch (not installed)"
    where = f"{cpu_name()}, {machine()}"
    print_table(f"Small GPT training step ({LAYERS} pre-norm blocks, vocab {VOCAB}, heads d/32, fwd+CE+bwd), "
                f"engine vs {peer} — best of {rounds} alternating rounds, {max(rounds, SMALL_ROUNDS)} for the cells of "
                f"batch·seq·d² < {SMALL_WORK:.0e} ({where})",
                ["case", "threads", "engine", "PyTorch", "engine / PyTorch"], rows)
    if checks:
        print()
        print("\n".join(checks))


if __name__ == "__main__":
    main()
