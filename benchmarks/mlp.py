"""One training step of an MLP (batch 256, 784→512→10, float32, cross-entropy, SGD).

Engine vs hand-written NumPy vs PyTorch CPU (when installed), side by side in one run.
Run with the stable malloc settings for steady numbers:
    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \
        .venv/bin/python benchmarks/mlp.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import fmt_time, machine, print_table, timeit, torch_or_none  # noqa: E402
from engine import Tensor  # noqa: E402

B, D_IN, D_H, D_OUT, LR = 256, 784, 512, 10, 0.01


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
        params[:] = [(p - p.grad(grads) * LR).detach().require_grad() for p in params]
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
    # the three implementations compute the same losses
    ls = [float(f()) for f in (numpy_step_factory(), engine_step_factory())]
    assert abs(ls[0] - ls[1]) < 1e-4, ls
    t_np = timeit(numpy_step_factory(), min_time=2.0)
    t_en = timeit(engine_step_factory(), min_time=2.0)
    rows = [["hand-written NumPy", fmt_time(t_np), "1.00×"], ["Ember engine", fmt_time(t_en), f"{t_en / t_np:.2f}×"]]
    if torch is not None:
        t_pt = timeit(torch_step_factory(torch), min_time=2.0)
        rows.append(["PyTorch CPU " + torch.__version__, fmt_time(t_pt), f"{t_pt / t_np:.2f}×"])
        rows.append(["engine / PyTorch", "", f"{t_en / t_pt:.2f}×"])
    print_table(f"MLP training step, batch {B}, {D_IN}→{D_H}→{D_OUT}, float32 ({machine()})",
                ["implementation", "time / step", "vs NumPy"], rows)


if __name__ == "__main__":
    main()
