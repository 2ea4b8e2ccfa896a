"""One training step of an MLP (batch 256, 784→512→10, float32, cross-entropy, SGD).

Engine vs hand-written NumPy vs PyTorch CPU (when installed), side by side in one run. The
engine is timed twice: written with tensor operations and a hand-written SGD update (the
direct analogue of the NumPy and PyTorch code), and written as users write a model (two
`nn.Linear`, `nn.Relu`, `nn.CrossEntropyLoss`, `optim.Sgd` mapping the module). All of them
start from the same weights and compute the same losses (checked before timing). They are
timed in turn over several rounds and each keeps its best round, so that load from other
processes on this shared machine hits every side alike.
Run with the stable malloc settings for steady numbers:
    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \
        .venv/bin/python benchmarks/mlp.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import alternate, fmt_time, machine, print_table, torch_or_none  # noqa: E402
from engine import Module, Tensor, nn, optim  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)

B, D_IN, D_H, D_OUT, LR = 256, 784, 512, 10, 0.01
ROUNDS = 25  # many short rounds: this shared VM speeds up and slows down over seconds


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


def engine_nn_step_factory():
    x, y, w1, b1, w2, b2 = data()
    xt, yt = Tensor.from_data(x), Tensor.from_data(y)
    state = {"model": Mlp(w1, b1, w2, b2).train()}
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
    best = alternate({k: make() for k, make in makers.items()}, rounds=ROUNDS, min_time=0.25)
    t_np = best["numpy"]
    rows = [
        ["hand-written NumPy", fmt_time(t_np), "1.00×"],
        ["Ember engine: tensor ops, hand-written SGD", fmt_time(best["engine"]), f"{best['engine'] / t_np:.2f}×"],
        ["Ember engine: nn.Linear, CrossEntropyLoss, optim.Sgd", fmt_time(best["engine_nn"]),
         f"{best['engine_nn'] / t_np:.2f}×"],
    ]
    if torch is not None:
        t_pt = best["torch"]
        rows.append(["PyTorch CPU " + torch.__version__, fmt_time(t_pt), f"{t_pt / t_np:.2f}×"])
        rows.append(["engine (tensor ops) / PyTorch", "", f"{best['engine'] / t_pt:.2f}×"])
        rows.append(["engine (nn) / PyTorch", "", f"{best['engine_nn'] / t_pt:.2f}×"])
    print_table(f"MLP training step, batch {B}, {D_IN}→{D_H}→{D_OUT}, float32, best of {ROUNDS} alternating rounds "
                f"({machine()})", ["implementation", "time / step", "vs NumPy"], rows)


def _scalar(loss) -> float:
    if isinstance(loss, Tensor):
        return float(loss.numpy().reshape(-1)[0])
    return float(loss.item()) if hasattr(loss, "item") else float(loss)


if __name__ == "__main__":
    main()
