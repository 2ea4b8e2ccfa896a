"""conv2d (and the 2x2 max pool between the convolutions) at the MNIST benchmark's shapes.

Batch 64, float32: conv 1→64 3x3 on 28x28, max_pool2d 2x2 on the 64x26x26 result, conv 64→64
3x3 on 13x13. Forward, and forward + backward (gradients of input, weight and bias), for the
Ember engine, a straightforward NumPy reference (sliding_window_view + tensordot) and
PyTorch CPU when it is installed (a benchmark-only peer, not a project dependency).
Run with the stable malloc settings for steady numbers:
    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \
        .venv/bin/python benchmarks/conv.py [--threads N]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import threads_from_argv  # noqa: E402  (no NumPy: before it loads)

# `--threads N` pins the engine, NumPy's BLAS and PyTorch to N threads; `make bench` runs 1 and 2
THREADS = threads_from_argv()
from benchmarks._common import fmt_time, machine, print_table, timeit, torch_or_none  # noqa: E402
from engine import Tensor  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

BATCH = 64
CASES = [("conv2d 1→64 3x3, 28x28", 1, 64, 28), ("conv2d 64→64 3x3, 13x13", 64, 64, 13)]


def make(c_in, c_out, size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, c_in, size, size), dtype=np.float32)
    w = (rng.standard_normal((c_out, c_in, 3, 3), dtype=np.float32) * 0.1).astype(np.float32)
    b = rng.standard_normal(c_out, dtype=np.float32)
    g = rng.standard_normal((BATCH, c_out, size - 2, size - 2), dtype=np.float32)
    return x, w, b, g


# ---------------------------------------------------------------------- NumPy reference
def np_conv(x, w, b):
    win = sliding_window_view(x, w.shape[2:], axis=(2, 3))  # [B, C, OH, OW, KH, KW]
    return np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2) + b[None, :, None, None]


def np_conv_backward(x, w, g):
    win = sliding_window_view(x, w.shape[2:], axis=(2, 3))
    gw = np.tensordot(g, win, axes=([0, 2, 3], [0, 2, 3]))  # [O, C, KH, KW]
    gb = g.sum(axis=(0, 2, 3))
    kh, kw = w.shape[2:]
    gpad = np.pad(g, ((0, 0), (0, 0), (kh - 1, kh - 1), (kw - 1, kw - 1)))
    gwin = sliding_window_view(gpad, (kh, kw), axis=(2, 3))  # full correlation with the flipped kernel
    gx = np.tensordot(gwin, w[:, :, ::-1, ::-1], axes=([1, 4, 5], [0, 2, 3])).transpose(0, 3, 1, 2)
    return gx, gw, gb


def np_maxpool(x):
    b, c, h, w = x.shape
    return x[:, :, : h // 2 * 2, : w // 2 * 2].reshape(b, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


# ---------------------------------------------------------------------- runners
def check_agreement(x, w, b, g):
    xt, wt, bt = (Tensor.from_data(a).require_grad() for a in (x, w, b))
    y = xt.conv2d(wt, bt)
    grads = y.backward(Tensor.from_data(g))
    ref = np_conv(x, w, b)
    rgx, rgw, rgb = np_conv_backward(x, w, g)
    for got, want in ((y, ref), (xt.grad(grads), rgx), (wt.grad(grads), rgw), (bt.grad(grads), rgb)):
        scale = float(np.abs(want).max()) or 1.0
        assert np.abs(got.numpy() - want).max() <= 1e-4 * scale, "engine and NumPy reference disagree"


def engine_runners(x, w, b, g, device=None):
    """Forward, and forward + backward; on `device` (benchmarks/gpu_rows.py: cuda:0) when given."""
    xt0, wt0, bt0 = (Tensor.from_data(a, device=device) for a in (x, w, b))
    xt, wt, bt = (Tensor.from_data(a, device=device).require_grad() for a in (x, w, b))
    gt = Tensor.from_data(g, device=device)

    def fwd():
        return xt0.conv2d(wt0, bt0)

    def fwd_bwd():
        return xt.conv2d(wt, bt).backward(gt)

    return fwd, fwd_bwd


def torch_runners(torch, x, w, b, g):
    F = torch.nn.functional
    xt0, wt0, bt0 = (torch.from_numpy(a) for a in (x, w, b))
    xt, wt, bt = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    gt = torch.from_numpy(g)

    def fwd():
        with torch.no_grad():
            return F.conv2d(xt0, wt0, bt0)

    def fwd_bwd():
        for t in (xt, wt, bt):
            t.grad = None
        F.conv2d(xt, wt, bt).backward(gt)

    return fwd, fwd_bwd


def best_of_rounds(runners: dict, rounds: int = 3) -> dict:
    """Interleave the implementations over a few rounds and keep each one's best time, so
    that load from other processes on a shared machine hits them alike."""
    best = {}
    for _ in range(rounds):
        for key, fn in runners.items():
            t = timeit(fn, min_time=0.3, repeat=3)
            best[key] = min(best.get(key, t), t)
    return best


def main():
    torch = torch_or_none()
    if torch is not None and THREADS is not None:
        torch.set_num_threads(THREADS)
    peer = f"PyTorch CPU {torch.__version__}" if torch is not None else None
    rows = []
    for name, c_in, c_out, size in CASES:
        x, w, b, g = make(c_in, c_out, size)
        check_agreement(x, w, b, g)
        e_f, e_fb = engine_runners(x, w, b, g)
        runners = {
            ("NumPy reference", "f"): lambda: np_conv(x, w, b),
            ("NumPy reference", "fb"): lambda: (np_conv(x, w, b), np_conv_backward(x, w, g)),
            ("Ember engine", "f"): e_f,
            ("Ember engine", "fb"): e_fb,
        }
        if torch is not None:
            t_f, t_fb = torch_runners(torch, x, w, b, g)
            runners[(peer, "f")] = t_f
            runners[(peer, "fb")] = t_fb
        best = best_of_rounds(runners)
        for impl in dict.fromkeys(k[0] for k in runners):
            rows.append([name, impl, fmt_time(best[(impl, "f")]), fmt_time(best[(impl, "fb")])])
        if torch is not None:
            rows.append([name, "engine / PyTorch", f"{best[('Ember engine', 'f')] / best[(peer, 'f')]:.2f}×",
                         f"{best[('Ember engine', 'fb')] / best[(peer, 'fb')]:.2f}×"])

    # the pool between the two convolutions
    x = np.random.default_rng(1).standard_normal((BATCH, 64, 26, 26), dtype=np.float32)
    gp = np.random.default_rng(2).standard_normal((BATCH, 64, 13, 13), dtype=np.float32)
    xt0, xt, gpt = Tensor.from_data(x), Tensor.from_data(x).require_grad(), Tensor.from_data(gp)
    assert np.array_equal(xt0.max_pool2d(2).numpy(), np_maxpool(x))
    runners = {
        ("NumPy reference (forward only)", "f"): lambda: np_maxpool(x),
        ("Ember engine", "f"): lambda: xt0.max_pool2d(2),
        ("Ember engine", "fb"): lambda: xt.max_pool2d(2).backward(gpt),
    }
    if torch is not None:
        F = torch.nn.functional
        tx0, tx, tg = torch.from_numpy(x), torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(gp)

        def t_f():
            with torch.no_grad():
                return F.max_pool2d(tx0, 2)

        def t_fb():
            tx.grad = None
            F.max_pool2d(tx, 2).backward(tg)

        runners[(peer, "f")] = t_f
        runners[(peer, "fb")] = t_fb
    best = best_of_rounds(runners)
    name = "max_pool2d 2x2, 64x26x26"
    for impl in dict.fromkeys(k[0] for k in runners):
        fb = best.get((impl, "fb"))
        rows.append([name, impl, fmt_time(best[(impl, "f")]), fmt_time(fb) if fb is not None else ""])
    if torch is not None:
        rows.append([name, "engine / PyTorch", f"{best[('Ember engine', 'f')] / best[(peer, 'f')]:.2f}×",
                     f"{best[('Ember engine', 'fb')] / best[(peer, 'fb')]:.2f}×"])

    threads = f", {THREADS} thread(s)" if THREADS is not None else ""
    print_table(f"conv2d / max_pool2d, batch {BATCH}, float32, best of 3 interleaved rounds{threads} ({machine()})",
                ["operation", "implementation", "forward", "forward + backward"], rows)
    print("\nforward + backward: gradients of input, weight and bias from a given output gradient.")
    if torch is None:
        print("PyTorch is not installed: no PyTorch rows.")


if __name__ == "__main__":
    main()
