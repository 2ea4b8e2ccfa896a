"""The GPU rows: the engine's own benchmark steps on `cuda:0` (CuPy) beside the same steps on the
CPU, each timed after warm-up as the median of several runs (issue 44, item 6).

Rows (the models of the CPU benchmarks, built by their own code):
- mlp.py's MLP train step (784 -> 512 -> 10, batch 256, cross entropy, SGD);
- conv.py's 64 -> 64 3x3 convolution, forward + backward (batch 64, 15x15 input);
- gpt.py's small GPT train step (forward, cross entropy, backward) at batch 16, d 32 / 256,
  seq 128 / 12.

A GPU step is timed to its end (the device synchronized after each call). Prints one markdown
table; exits 2 when no CUDA device is usable (CuPy missing or no GPU), saying which.

    .venv/bin/python benchmarks/gpu_rows.py [--device cuda:0] [--runs 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import Device  # noqa: E402  (the engine first, as users import it)
from engine.tensor.device import cuda_device_count, cupy_module  # noqa: E402


def _sync(device: Device) -> None:
    if device.kind == "cuda":
        cupy_module().cuda.Device(device.index).synchronize()


def _time(step, device: Device, runs: int, warm: int = 5) -> float:
    for _ in range(warm):
        step()
    _sync(device)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mlp_step(device: Device):
    from benchmarks import mlp  # noqa: PLC0415

    return mlp.engine_nn_step_factory(device)


def conv_step(device: Device):
    from benchmarks import conv  # noqa: PLC0415

    return conv.engine_runners(*conv.make(64, 64, 15), device=device)[1]  # forward + backward


def gpt_step(device: Device, batch: int, d: int, seq: int):
    from benchmarks import gpt  # noqa: PLC0415

    return gpt.engine_step(batch, d, seq, device)


ROWS = [
    ("MLP train step (784-512-10, batch 256)", mlp_step),
    ("conv 64->64 3x3 fwd+bwd (batch 64, 15x15)", conv_step),
    ("small GPT step (batch 16, d 32, seq 128)", lambda dev: gpt_step(dev, 16, 32, 128)),
    ("small GPT step (batch 16, d 256, seq 12)", lambda dev: gpt_step(dev, 16, 256, 12)),
]


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    if cupy_module() is None:
        print("no CUDA device: CuPy is not installed (pip install -e '.[cuda]')", file=sys.stderr)
        return 2
    if cuda_device_count() == 0:
        print("no CUDA device: CuPy found no GPU (driver missing, or CUDA_VISIBLE_DEVICES empty)", file=sys.stderr)
        return 2
    gpu, cpu = Device(args.device), Device("cpu")
    print(f"### GPU rows: {args.device} against cpu, median of {args.runs} runs after warm-up\n")
    print("| row | cpu | " + args.device + " | cpu / gpu |")
    print("|---|---:|---:|---:|")
    failed = 0
    for name, make in ROWS:
        try:
            t_cpu = _time(make(cpu), cpu, max(3, args.runs // 4))
            t_gpu = _time(make(gpu), gpu, args.runs)
        except Exception as exc:  # noqa: BLE001 - one row's failure is reported, the others still run
            failed += 1
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:160]} | | |")
            continue
        print(f"| {name} | {_fmt(t_cpu)} | {_fmt(t_gpu)} | {t_cpu / t_gpu:.2f}× |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
