"""One training step of an MLP (batch 256, 784→512→10, float32, cross-entropy, SGD).

Engine vs hand-written NumPy vs PyTorch CPU (when installed), side by side in one run. The
engine is timed twice: written with tensor operations and a hand-written SGD update (the
direct analogue of the NumPy and PyTorch code), and written as users write a model (two
`nn.Linear`, `nn.Relu`, `nn.CrossEntropyLoss`, `optim.Sgd` mapping the module). All of them
start from the same weights and compute the same losses (checked before timing). They run in
turn in short blocks of steps, in shuffled order (`_common.paired`); a ratio is the median,
over the sets of blocks, of a block's time over the base's block of the same set, so that this
shared VM's drift in speed hits both sides of every ratio alike. One table compares with NumPy,
a second run with PyTorch (whose spinning threads would slow the NumPy blocks). The best and
the median block are shown too.
Run with the stable malloc settings for steady numbers:
    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \
        .venv/bin/python benchmarks/mlp.py [--threads N]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import threads_from_argv  # noqa: E402  (no NumPy: before it loads)

# `--threads N` pins the engine, NumPy's BLAS and PyTorch to N threads; `make bench` runs 1 and 2
THREADS = threads_from_argv()
from benchmarks._common import fmt_time, machine, paired, print_table, torch_or_none  # noqa: E402
from engine import Module, Tensor, nn, optim  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)

B, D_IN, D_H, D_OUT, LR = 256, 784, 512, 10, 0.01
BLOCKS, CALLS = 150, 10  # many short paired blocks: this shared VM speeds up and slows down over seconds
SETTLE = 0.02  # seconds of pause before each block of the PyTorch runs: its spinning threads go idle


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, D_IN), dtype=np.float32)
    y = rng.integers(0, D_OUT, B)
    w1 = (rng.standard_normal((D_IN, D_H), dtype=np.float32) * 0.03).astype(np.float32)
    w2 = (rng.standard_normal((D_H, D_OUT), dtype=np.float32) * 0.03).astype(np.float32)
    return x, y, w1, np.zeros(D_H, np.float32), w2, np.zeros(D_OUT, np.float32)


def numpy_step_factory():
    x, y, w1, b1, w2, b2 = data()
    params = [w1, b1, w2, b2]
    onehot = np.eye(D_OUT, dtype=np.float32)[y]

    def step():
        w1, b1, w2, b2 = params
        z = x @ w1 + b1
        h = np.maximum(z, 0)
        logits = h @ w2 + b2
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        p = e / s
        loss = -(np.log(p) * onehot).sum() / B
        g = (p - onehot) / B
        gw2 = h.T @ g
        gb2 = g.sum(0)
        gh = g @ w2.T
        gz = gh * (z > 0)
        gw1 = x.T @ gz
        gb1 = gz.sum(0)
        params[:] = [w1 - LR * gw1, b1 - LR * gb1, w2 - LR * gw2, b2 - LR * gb2]
        return loss

    return step


def engine_step_factory():
    x, y, w1, b1, w2, b2 = data()
    xt = Tensor.from_data(x)
    onehot = Tensor.from_data(np.eye(D_OUT, dtype=np.float32)[y])
    params = [Tensor.from_data(a).require_grad() for a in (w1, b1, w2, b2)]

    def step():
        w1, b1, w2, b2 = params
        h = (xt @ w1 + b1).relu()
        logits = h @ w2 + b2
        loss = -(logits.log_softmax(1) * onehot).sum() * (1.0 / B)
        grads = loss.backward()
        # the update itself is not recorded (PyTorch's side runs it under no_grad)
        params[:] = [(p.detach() - p.grad(grads) * LR).require_grad() for p in params]
        return loss

    return step


class Mlp(Module):
    def __init__(self, w1, b1, w2, b2):
        super().__init__()
        self.linear1 = nn.LinearConfig(D_IN, D_H).init()
        self.activation = nn.Relu()
        self.linear2 = nn.LinearConfig(D_H, D_OUT).init()
        # the benchmark's shared starting weights instead of the layers' own initializers
        self.linear1.weight = self.linear1.weight.map(lambda _: Tensor.from_data(w1))
        self.linear1.bias = self.linear1.bias.map(lambda _: Tensor.from_data(b1))
        self.linear2.weight = self.linear2.weight.map(lambda _: Tensor.from_data(w2))
        self.linear2.bias = self.linear2.bias.map(lambda _: Tensor.from_data(b2))

    def forward(self, x):
        return self.linear2.forward(self.activation.forward(self.linear1.forward(x)))


def engine_nn_step_factory(device=None):
    """The engine's step; on `device` (benchmarks/gpu_rows.py: cuda:0) when given."""
    x, y, w1, b1, w2, b2 = data()
    xt, yt = Tensor.from_data(x, device=device), Tensor.from_data(y, device=device)
    model = Mlp(w1, b1, w2, b2)
    state = {"model": (model if device is None else model.fork(device)).train()}
    loss_fn = nn.CrossEntropyLossConfig().init()
    optimizer = optim.SgdConfig().init()

    def step():
        model = state["model"]
        loss = loss_fn.forward(model.forward(xt), yt)
        grads = optim.GradientsParams.from_grads(loss.backward(), model)
        state["model"] = optimizer.step(LR, model, grads)
        return loss

    return step


def torch_step_factory(torch):
    x, y, w1, b1, w2, b2 = data()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    params = [torch.from_numpy(a.copy()).requires_grad_() for a in (w1, b1, w2, b2)]
    ce = torch.nn.functional.cross_entropy

    def step():
        w1, b1, w2, b2 = params
        logits = torch.relu(xt @ w1 + b1) @ w2 + b2
        loss = ce(logits, yt)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= LR * p.grad
                p.grad = None
        return loss

    return step


def main():
    torch = torch_or_none()
    if torch is not None and THREADS is not None:
        torch.set_num_threads(THREADS)
    makers = {"numpy": numpy_step_factory, "engine": engine_step_factory, "engine_nn": engine_nn_step_factory}
    if torch is not None:
        makers["torch"] = lambda: torch_step_factory(torch)
    # every implementation computes the same losses over three steps
    losses = {}
    for k, make in makers.items():
        f = make()
        losses[k] = [_scalar(f()) for _ in range(3)]
    for k, ls in losses.items():
        assert np.allclose(ls, losses["numpy"], rtol=1e-4, atol=1e-5), (k, ls, losses["numpy"])
    engines = [("Ember engine: tensor ops, hand-written SGD", "engine"),
               ("Ember engine: nn.Linear, CrossEntropyLoss, optim.Sgd", "engine_nn")]
    # PyTorch's worker threads keep spinning for a while after each step and slow whatever
    # runs next (measured: NumPy's step 10-15 % slower right after PyTorch's): the NumPy ratios
    # come from blocks of NumPy and the engine alone, the PyTorch ratios from a second run of
    # PyTorch and the engine, with a pause before every block (SETTLE). The NumPy run has no
    # pause: there it only widened the spread (middle half 0.99-1.23 against 1.02-1.13)
    _table("NumPy", [("hand-written NumPy", "numpy")] + engines, makers)
    if torch is not None:
        _table("PyTorch", [("PyTorch CPU " + torch.__version__, "torch")] + engines, makers, settle=SETTLE)


def _table(peer: str, sides: list, makers: dict, settle: float = 0.0) -> None:
    base = sides[0][1]
    res = paired({k: makers[k]() for _, k in sides}, base, blocks=BLOCKS, calls=CALLS, settle=settle)
    rows = [[label, fmt_time(res[k].best), fmt_time(res[k].median), f"{res[k].ratio:.2f}×",
             f"{res[k].ratio_q1:.2f}–{res[k].ratio_q3:.2f}"] for label, k in sides]
    print_table(f"MLP training step vs {peer}, batch {B}, {D_IN}→{D_H}→{D_OUT}, float32, {BLOCKS} paired blocks of "
                f"{CALLS} steps{'' if THREADS is None else f', {THREADS} thread(s)'} ({machine()})",
                ["implementation", "best block", "median block", f"vs {peer}", "middle half of the sets"], rows)


def _scalar(loss) -> float:
    if isinstance(loss, Tensor):
        return float(loss.numpy().reshape(-1)[0])
    return float(loss.item()) if hasattr(loss, "item") else float(loss)


if __name__ == "__main__":
    main()
