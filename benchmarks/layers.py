"""Forward + backward of built-in layers: the burn-mnist CNN (batch 64) and one transformer
encoder layer (d_model 128, 4 heads, d_ff 512, sequence 64, batch 16), engine vs PyTorch CPU,
side by side in one run. Both in training mode (dropout and batch statistics on), float32.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \
        .venv/bin/python benchmarks/layers.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import fmt_time, machine, print_table, timeit, torch_or_none  # noqa: E402
from engine import Tensor, nn  # noqa: E402
from resources.examples import build_example  # noqa: E402

MNIST_BATCH = 64
D_MODEL, N_HEADS, D_FF, SEQ, BATCH = 128, 4, 512, 64, 16


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

    return step


def torch_mnist(torch):
    tn = torch.nn

    def block(cin, cout):
        return tn.Sequential(tn.Conv2d(cin, cout, 3), tn.BatchNorm2d(cout), tn.ReLU(), tn.MaxPool2d(2, 2))

    model = tn.Sequential(
        block(1, 64), block(64, 64), tn.Flatten(),
        tn.Linear(1600, 128), tn.GELU(), tn.Dropout(0.25),
        tn.Linear(128, 128), tn.GELU(), tn.Dropout(0.25),
        tn.Linear(128, 10),
    ).train()
    x_np, y_np = mnist_data()
    x = torch.from_numpy(x_np).reshape(MNIST_BATCH, 1, 28, 28)
    y = torch.from_numpy(y_np)
    loss_fn = tn.CrossEntropyLoss()

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    return step


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


def main():
    torch = torch_or_none()
    rows = []
    for name, eng, peer in (
        (f"burn-mnist CNN, batch {MNIST_BATCH}, fwd+bwd+CE", engine_mnist, torch_mnist),
        (f"TransformerEncoder layer d{D_MODEL} h{N_HEADS} ff{D_FF}, seq {SEQ}, batch {BATCH}, fwd+bwd",
         engine_encoder, torch_encoder),
    ):
        te = timeit(eng(), min_time=2.0, warmup=3, repeat=5)
        if torch is not None:
            tt = timeit(peer(torch), min_time=2.0, warmup=3, repeat=5)
            rows.append([name, fmt_time(te), fmt_time(tt), f"{te / tt:.2f}x"])
        else:
            rows.append([name, fmt_time(te), "torch not installed", "-"])
    print_table(f"Layers, engine vs PyTorch {torch.__version__ if torch else '(absent)'} CPU ({machine()})",
                ["case", "engine", "PyTorch", "engine / PyTorch"], rows)


if __name__ == "__main__":
    main()
