"""Per-operation overhead on tiny (2×2) tensors: forward, and forward + backward.

Engine vs NumPy (forward only: NumPy has no autodiff) vs PyTorch CPU (when installed).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import fmt_time, machine, print_table, timeit, torch_or_none  # noqa: E402
from engine import Tensor  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)

OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b),
    "exp": (lambda a, b: a.exp(), lambda a, b: np.exp(a)),
    "sum(dim)": (lambda a, b: a.sum(1), lambda a, b: a.sum(1)),
    "relu": (lambda a, b: a.relu(), lambda a, b: np.maximum(a, 0)),
    "reshape": (lambda a, b: a.reshape(4), lambda a, b: a.reshape(4)),
    "softmax": (lambda a, b: a.softmax(1), None),
}
TORCH = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "matmul": lambda a, b: a @ b,
    "exp": lambda a, b: a.exp(),
    "sum(dim)": lambda a, b: a.sum(1),
    "relu": lambda a, b: a.relu(),
    "reshape": lambda a, b: a.reshape(4),
    "softmax": lambda a, b: a.softmax(1),
}


def main():
    torch = torch_or_none()
    an = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    bn = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    a, b = Tensor.from_data(an), Tensor.from_data(bn)
    ag, bg = Tensor.from_data(an).require_grad(), Tensor.from_data(bn).require_grad()
    if torch is not None:
        at, bt = torch.from_numpy(an), torch.from_numpy(bn)
        atg, btg = at.clone().requires_grad_(), bt.clone().requires_grad_()
    rows = []
    for name, (fe, fn) in OPS.items():
        t_np = timeit(lambda: fn(an, bn), min_time=0.2) if fn else None
        t_fwd = timeit(lambda: fe(a, b), min_time=0.2)
        t_rec = timeit(lambda: fe(ag, bg), min_time=0.2)
        t_bwd = timeit(lambda: fe(ag, bg).sum().backward(), min_time=0.2)
        row = [name, fmt_time(t_np) if t_np else "–", fmt_time(t_fwd), fmt_time(t_rec), fmt_time(t_bwd)]
        if torch is not None:
            ft = TORCH[name]
            p_fwd = timeit(lambda: ft(at, bt), min_time=0.2)
            p_bwd = timeit(lambda: ft(atg, btg).sum().backward(), min_time=0.2)
            row += [fmt_time(p_fwd), fmt_time(p_bwd), f"{t_bwd / p_bwd:.2f}×"]
        rows.append(row)
    header = ["op", "NumPy", "engine fwd", "engine fwd (recording)", "engine fwd+bwd"]
    if torch is not None:
        header += ["PyTorch fwd", "PyTorch fwd+bwd", "fwd+bwd engine/PyTorch"]
    print_table(f"Per-op overhead on 2×2 float32 tensors ({machine()})", header, rows)

    # the headline case: c = a + b; c.sum().backward()
    def engine_case():
        c = ag + bg
        c.sum().backward()

    t_e = timeit(engine_case, min_time=0.5)
    rows = [["Ember engine", fmt_time(t_e), ""]]
    if torch is not None:

        def torch_case():
            c = atg + btg
            c.sum().backward()
            atg.grad = None
            btg.grad = None

        t_t = timeit(torch_case, min_time=0.5)
        rows.append(["PyTorch CPU " + torch.__version__, fmt_time(t_t), ""])
        rows[0][2] = f"{t_e / t_t:.2f}× PyTorch"
    print_table("c = a + b; c.sum().backward() on 2×2", ["implementation", "time", "ratio"], rows)


if __name__ == "__main__":
    main()
