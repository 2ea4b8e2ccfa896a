"""Forward + backward of built-in layers, engine vs PyTorch CPU, side by side in one run.

- the burn-mnist CNN (resources/examples/burn_mnist.py), batch 64, with cross-entropy;
- that CNN stage by stage (conv, batch norm, relu, max pool, then the fully connected head),
  forward and backward of each stage alone on the input the stage sees in the model;
- one transformer encoder layer (d_model 128, 4 heads, d_ff 512, sequence 64, batch 16).

Training mode (dropout and batch statistics on), float32. Both sides run with the same
number of threads, 1 and then 2, each count in a fresh process (NumPy's OpenBLAS reads
OPENBLAS_NUM_THREADS at start-up; PyTorch gets `set_num_threads`). Within a process the
engine and PyTorch alternate over several rounds and each keeps its best time, so that load
from other processes on a shared machine hits both alike. The children get the stable malloc
settings (benchmarks/_common.py) unless the caller set MALLOC_* itself.
Target: the engine within 1.5x of PyTorch (ratio = engine time / PyTorch time).

    .venv/bin/python benchmarks/layers.py [--threads 1,2] [--rounds 5]
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import STABLE_MALLOC, alternate, fmt_time, print_table, torch_or_none  # noqa: E402
from engine import Tensor, nn  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)
from resources.examples import build_example  # noqa: E402

MNIST_BATCH = 64
D_MODEL, N_HEADS, D_FF, SEQ, BATCH = 128, 4, 512, 64, 16


def race(pairs: dict, rounds: int, min_time: float) -> dict:
    """{key: (engine_fn, torch_fn or None)} -> {key: (best engine s, best torch s or None)}.

    Each round times every engine function and then its PyTorch peer, so both sides see the
    same background load; the best of the rounds is kept."""
    fns = {}
    for key, (fe, ft) in pairs.items():
        fns[key, "engine"] = fe
        fns[key, "torch"] = ft
    best = alternate(fns, rounds=rounds, min_time=min_time, warmup=1)
    return {key: (best[key, "engine"], best[key, "torch"]) for key in pairs}


# ---------------------------------------------------------------------- the whole CNN
def mnist_data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((MNIST_BATCH, 28, 28), dtype=np.float32), rng.integers(0, 10, MNIST_BATCH)


def engine_mnist():
    model = build_example("burn-mnist")
    x_np, y_np = mnist_data()
    x, y = Tensor.from_data(x_np), Tensor.from_data(y_np)
    loss_fn = nn.CrossEntropyLossConfig().init()

    def step():
        loss = loss_fn.forward(model.forward(x), y)
        loss.backward()
        return loss

    return step, model


def torch_mnist_model(torch):
    tn = torch.nn

    def block(cin, cout):
        return tn.Sequential(tn.Conv2d(cin, cout, 3), tn.BatchNorm2d(cout), tn.ReLU(), tn.MaxPool2d(2, 2))

    return tn.Sequential(
        block(1, 64), block(64, 64), tn.Flatten(),
        tn.Linear(1600, 128), tn.GELU(), tn.Dropout(0.25),
        tn.Linear(128, 128), tn.GELU(), tn.Dropout(0.25),
        tn.Linear(128, 10),
    ).train()


def torch_mnist(torch):
    model = torch_mnist_model(torch)
    x_np, y_np = mnist_data()
    x = torch.from_numpy(x_np).reshape(MNIST_BATCH, 1, 28, 28)
    y = torch.from_numpy(y_np)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    return step


# ---------------------------------------------------------------------- the CNN stage by stage
def stage_pairs(torch, model) -> dict:
    """Per stage: (engine fwd, torch fwd, engine fwd+bwd, torch fwd+bwd) on the stage's input."""
    x_np, y_np = mnist_data()
    rng = np.random.default_rng(5)
    h = Tensor.from_data(x_np).reshape(MNIST_BATCH, 1, 28, 28)
    tm = torch_mnist_model(torch) if torch is not None else None
    ce = nn.CrossEntropyLossConfig().init()

    def head(x):
        z = model.dropout.forward(model.activation.forward(model.fc1.forward(x.reshape(MNIST_BATCH, 1600))))
        z = model.dropout.forward(model.activation.forward(model.fc2.forward(z)))
        return ce.forward(model.fc3.forward(z), Tensor.from_data(y_np))

    stages = []
    for i, blk in enumerate((model.conv1, model.conv2), 1):
        tb = tm[i - 1] if tm is not None else None
        stages += [(f"conv{i}", blk.conv.forward, tb[0] if tb is not None else None),
                   (f"batch norm {i}", blk.norm.forward, tb[1] if tb is not None else None),
                   (f"relu {i}", blk.activation.forward, tb[2] if tb is not None else None),
                   (f"max pool {i}", blk.pool.forward, tb[3] if tb is not None else None)]
    if tm is not None:
        y_t = torch.from_numpy(y_np)

        def t_head(x):
            return torch.nn.functional.cross_entropy(tm[2:](x), y_t)
    stages.append(("head: fc 1600-128-128-10, gelu, dropout, CE", head, t_head if tm is not None else None))

    pairs = {}
    for name, fe, ft in stages:
        a = h.numpy()
        first = name == "conv1"  # the model's input takes no part in the graph
        xe0 = Tensor.from_data(a)
        xe = xe0 if first else Tensor.from_data(a).require_grad()
        out = fe(xe)
        ge = Tensor.from_data(rng.standard_normal(out.shape).astype(np.float32))
        e_f = (lambda fe=fe, xe0=xe0: fe(xe0.autodiff()))  # training mode: autodiff input, no graph
        e_fb = (lambda fe=fe, xe=xe, ge=ge: fe(xe).backward(ge))
        t_f = t_fb = None
        if ft is not None:
            xt0 = torch.from_numpy(a.copy())
            xt = xt0 if first else torch.from_numpy(a.copy()).requires_grad_()
            gt = torch.from_numpy(ge.numpy())
            params = list(ft.parameters()) if hasattr(ft, "parameters") else list(tm.parameters())

            def t_f(ft=ft, xt0=xt0):
                with torch.no_grad():
                    return ft(xt0)

            def t_fb(ft=ft, xt=xt, gt=gt, params=params, first=first):
                for p in params:
                    p.grad = None
                if not first:
                    xt.grad = None
                out = ft(xt)
                out.backward(gt if out.dim() else None)
        if out.rank == 1 and out.shape == (1,):  # the head ends in the loss: seed with ones
            e_fb = (lambda fe=fe, xe=xe: fe(xe).backward())
        pairs[(name, "f")] = (e_f, t_f)
        pairs[(name, "fb")] = (e_fb, t_fb)
        h = out.detach()
    return pairs


# ---------------------------------------------------------------------- transformer encoder layer
def encoder_data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((BATCH, SEQ, D_MODEL), dtype=np.float32)


def engine_encoder():
    layer = nn.TransformerEncoderConfig(D_MODEL, D_FF, N_HEADS, 1, dropout=0.1).init()
    x = Tensor.from_data(encoder_data())

    def step():
        out = layer.forward(x)
        out.backward()
        return out

    return step


def torch_encoder(torch):
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.1, activation="gelu",
                                             batch_first=True).train()
    x = torch.from_numpy(encoder_data())

    def step():
        layer.zero_grad(set_to_none=True)
        out = layer(x)
        out.backward(torch.ones_like(out))
        return out

    return step


# ---------------------------------------------------------------------- one thread count (child)
def measure(threads: int, rounds: int) -> dict:
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(threads)
    mnist_step, model = engine_mnist()
    whole = {
        "mnist": (mnist_step, torch_mnist(torch) if torch is not None else None),
        "encoder": (engine_encoder(), torch_encoder(torch) if torch is not None else None),
    }
    res = {"whole": race(whole, rounds, 0.6)}
    res["stages"] = race(stage_pairs(torch, model), rounds, 0.15)
    res["torch"] = torch.__version__ if torch is not None else None
    return {k: ({"|".join(kk) if isinstance(kk, tuple) else kk: vv for kk, vv in v.items()} if isinstance(v, dict) else v)
            for k, v in res.items()}


def _ratio(te, tt):
    return f"{te / tt:.2f}x" if tt else "-"


def main() -> None:
    args = sys.argv[1:]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 5
    if args and args[0] == "--child":
        print(json.dumps(measure(int(args[1]), rounds)))
        return
    counts = [int(t) for t in args[args.index("--threads") + 1].split(",")] if "--threads" in args else [1, 2]
    whole_rows, stage_rows, version = [], [], None
    for threads in counts:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
        own_malloc = any(k in os.environ for k in STABLE_MALLOC)
        if not own_malloc:
            env.update(STABLE_MALLOC)
        out = subprocess.run([sys.executable, __file__, "--child", str(threads), "--rounds", str(rounds)], env=env,
                             capture_output=True, text=True, check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        version = res["torch"]
        labels = {"mnist": f"burn-mnist CNN, batch {MNIST_BATCH}, fwd+bwd+CE",
                  "encoder": f"TransformerEncoder layer d{D_MODEL} h{N_HEADS} ff{D_FF}, seq {SEQ}, batch {BATCH}, fwd+bwd"}
        for key, label in labels.items():
            te, tt = res["whole"][key]
            whole_rows.append([label, threads, fmt_time(te), fmt_time(tt) if tt else "-", _ratio(te, tt)])
        names = list(dict.fromkeys(k.split("|")[0] for k in res["stages"]))
        for name in names:
            ef, tf = res["stages"][f"{name}|f"]
            efb, tfb = res["stages"][f"{name}|fb"]
            stage_rows.append([name, threads, fmt_time(ef), fmt_time(tf) if tf else "-", _ratio(ef, tf),
                               fmt_time(efb), fmt_time(tfb) if tfb else "-", _ratio(efb, tfb)])
    peer = f"PyTorch {version} CPU" if version else "PyTorch (not installed)"
    note = f"best of {rounds} alternating rounds, same thread count on both sides"
    where = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"{'MALLOC_* as set by the caller' if own_malloc else 'stable malloc settings'}")
    print_table(f"Layers, engine vs {peer} — {note} ({where})",
                ["case", "threads", "engine", "PyTorch", "engine / PyTorch"], whole_rows)
    print_table(f"burn-mnist CNN stage by stage, batch {MNIST_BATCH}, float32, training mode — {note}",
                ["stage", "threads", "engine fwd", "PyTorch fwd", "ratio", "engine fwd+bwd", "PyTorch fwd+bwd", "ratio"],
                stage_rows)


if __name__ == "__main__":
    main()
