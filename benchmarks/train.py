"""Training steps per second: engine vs PyTorch CPU, one run, same models, same batches.

A step is forward, cross-entropy, backward, gradients matched to parameters, Adam update:
- MLP: the `spirals` example (2 -> 64 -> 64 -> 2, Relu), batch 64;
- MNIST: the `digits` example, the burn-mnist CNN (two conv blocks of 64 channels, BatchNorm,
  max-pool, dropout 0.25, 1600 -> 128 -> 128 -> 10, Gelu), batch 64 of 28x28 images;
- the optimizer update alone (Adam over the MNIST model's 208k parameters), as the hot path
  this package owns;
- the whole loop (`Learner`, events, DataLoader) on the MLP, to show what the loop adds.

Both sides run with the same number of threads, 1 and then 2, each in a fresh process
(NumPy's OpenBLAS reads OPENBLAS_NUM_THREADS at start-up; PyTorch gets `set_num_threads`):
on a 2-core machine that other work shares, two spinning BLAS threads can cost more than they
gain, for either library. Within a process the engine and PyTorch are timed in turn over
many short rounds (this VM's speed drifts over seconds) and each keeps its best, so
background load hits both alike. The engine is imported before NumPy, as an application
would, so that it sets OpenBLAS's spin time for its kernel threads. The children get
the stable malloc settings (benchmarks/_common.py) unless the caller set MALLOC_* itself.
Target: the engine within 1.3x of PyTorch (ratio = engine time / PyTorch time).

    .venv/bin/python benchmarks/train.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import STABLE_MALLOC, alternate, fmt_time, machine, print_table, torch_or_none  # noqa: E402
from engine import Device, Tensor, optim  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)
from engine.train import Learner, TrainingConfig, build_task, cross_entropy  # noqa: E402
from resources.examples import build_example  # noqa: E402

B = 64
LR = 1e-3
ROUNDS = 15  # many short rounds: this shared VM speeds up and slows down over seconds


def engine_stepper(name, x, y):
    dev = Device("cpu")
    dev.seed(0)
    state = {"model": build_example(name, dev).train()}
    opt = optim.AdamConfig().init()
    xt, yt = Tensor.from_data(x), Tensor.from_data(y)

    def step():
        model = state["model"]
        loss = cross_entropy(model.forward(xt), yt)
        grads = optim.GradientsParams.from_grads(loss.backward(), model)
        state["model"] = opt.step(LR, model, grads)

    return step, state, opt, xt, yt


def torch_models(torch):
    nn, F = torch.nn, torch.nn.functional

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(2, 64), nn.Linear(64, 64), nn.Linear(64, 2)

        def forward(self, x):
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    class Block(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv, self.norm, self.pool = nn.Conv2d(cin, cout, 3), nn.BatchNorm2d(cout), nn.MaxPool2d(2, 2)

        def forward(self, x):
            return self.pool(F.relu(self.norm(self.conv(x))))

    class Mnist(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = Block(1, 64), Block(64, 64)
            self.dropout = nn.Dropout(0.25)
            self.fc1, self.fc2, self.fc3 = nn.Linear(1600, 128), nn.Linear(128, 128), nn.Linear(128, 10)

        def forward(self, x):
            b = x.shape[0]
            x = self.conv2(self.conv1(x.reshape(b, 1, 28, 28))).reshape(b, 1600)
            x = self.dropout(F.gelu(self.fc1(x)))
            x = self.dropout(F.gelu(self.fc2(x)))
            return self.fc3(x)

    return {"spirals": MLP, "digits": Mnist}


def torch_stepper(torch, name, x, y):
    torch.manual_seed(0)
    model = torch_models(torch)[name]()
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=1e-5)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()

    return step, model, opt


def batches():
    spirals = build_task("spirals", n_train=B, n_valid=1)
    digits = build_task("digits", n_train=B, n_valid=10)
    return {
        "spirals": (spirals.train.inputs, spirals.train.targets.astype(np.int64)),
        "digits": (np.ascontiguousarray(digits.train.inputs), digits.train.targets.astype(np.int64)),
    }


def race(engine_fn, torch_fn, rounds: int, min_time: float):
    """Best seconds per call of each side, the two timed in turn (see `alternate`)."""
    best = alternate({"engine": engine_fn, "torch": torch_fn}, rounds=rounds, min_time=min_time)
    return best["engine"], best["torch"]


def measure(threads: int, rounds: int = ROUNDS) -> list:
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(threads)
    data = batches()
    rows = []
    for name, label in (("spirals", "MLP 2-64-64-2, batch 64"), ("digits", "MNIST CNN, batch 64")):
        x, y = data[name]
        step, state, opt, xt, yt = engine_stepper(name, x, y)
        min_time = 0.1 if name == "spirals" else 0.35
        tstep = None
        if torch is not None:
            tstep, tmodel, topt = torch_stepper(torch, name, x, y)
        t_engine, t_torch = race(step, tstep, rounds, min_time)
        rows.append((f"train step: {label}", t_engine, t_torch))

        if name == "digits":
            # the optimizer update alone, on the same gradients each time
            model = state["model"]
            loss = cross_entropy(model.forward(xt), yt)
            grads = optim.GradientsParams.from_grads(loss.backward(), model)
            saved = dict(grads._by_id)

            def update():
                g = optim.GradientsParams()
                g._by_id.update(saved)
                state["model"] = opt.step(LR, state["model"], g)

            if torch is not None:
                tstep()  # gradients in place
            t_upd, t_tupd = race(update, topt.step if torch is not None else None, rounds, 0.3)
            n = sum(p.numel() for _, p in state["model"].named_params() if p.is_require_grad())
            rows.append((f"Adam update alone ({n:,} params)", t_upd, t_tupd))

    # the whole loop on the MLP: Learner with DataLoader, metrics and events
    task = build_task("spirals", n_train=B * 50, n_valid=B)
    learner = Learner(lambda d: build_example("spirals", d), optim.AdamConfig().init(), lr=LR, task=task,
                      config=TrainingConfig(num_epochs=3, batch_size=B, seed=0))
    t0 = time.perf_counter()
    result = learner.run()
    steps = len(result.step_losses)
    rows.append((f"Learner loop: MLP, batch 64 ({steps} steps + validation)", (time.perf_counter() - t0) / steps, None))
    return rows


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(measure(int(sys.argv[2]))))
        return
    torch = torch_or_none()
    rows = []
    own_malloc = any(k in os.environ for k in STABLE_MALLOC)
    for threads in (1, 2):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
        if not own_malloc:
            env.update(STABLE_MALLOC)
        out = subprocess.run([sys.executable, __file__, "--child", str(threads)], env=env, capture_output=True,
                             text=True, check=True)
        for label, t_engine, t_torch in json.loads(out.stdout.strip().splitlines()[-1]):
            rows.append(_row(label, threads, t_engine, t_torch))
    where = machine().rsplit(", ", 1)[0] + (", MALLOC_* as set by the caller" if own_malloc else ", stable malloc settings")
    print_table(f"Training steps per second — engine vs PyTorch {torch.__version__ if torch else 'not installed'}, "
                f"same thread count on both sides, best of {ROUNDS} alternating rounds ({where})",
                ["what", "threads", "engine steps/s", "engine time/step", "PyTorch steps/s", "PyTorch time/step",
                 "engine / PyTorch time"], rows)


def _row(label, threads, t_engine, t_torch):
    if t_torch is None:
        return [label, threads, f"{1 / t_engine:,.0f}", fmt_time(t_engine), "-", "-", "-"]
    return [label, threads, f"{1 / t_engine:,.0f}", fmt_time(t_engine), f"{1 / t_torch:,.0f}", fmt_time(t_torch),
            f"{t_engine / t_torch:.2f}x"]


if __name__ == "__main__":
    main()
