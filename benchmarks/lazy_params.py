"""Lazy parameters at scale: a 6.7-billion-parameter model (400 lazy [4096, 4096] weights) is
built, counted, displayed, moved and switched to validation without running an initializer.

Also times the per-step hot paths a forward pass touches: `param.val()` on an initialized
parameter and a passing `assert_shape`.

Target: building + counting + displaying under 0.5 s and under 50 MB of resident memory.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import fmt_time, print_table, timeit  # noqa: E402
from engine import Device, Module, Param, Tensor, assert_shape  # noqa: E402
from engine.module import DisplaySettings, Initializer  # noqa: E402

D = 4096
N_LAYERS = 100  # 4 weights each: 400 lazy [4096, 4096] parameters


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Block(Module):
    def __init__(self, device):
        init = Initializer.KaimingUniform(1 / math.sqrt(3), False)
        for name in ("q", "k", "v", "o"):
            p = init.init_with([D, D], fan_in=D, device=device)
            setattr(self, name, p)

    def custom_settings(self):
        return DisplaySettings().with_new_line_after_attribute(False)


class Big(Module):
    def __init__(self, device=None):
        self.blocks = [Block(device) for _ in range(N_LAYERS)]


def main():
    rows = []
    base = rss_bytes()
    t0 = time.perf_counter()
    model = Big(Device("cpu"))
    t_build = time.perf_counter() - t0

    t0 = time.perf_counter()
    n = model.num_params()
    t_count = time.perf_counter() - t0

    t0 = time.perf_counter()
    text = str(model)
    t_display = time.perf_counter() - t0

    t0 = time.perf_counter()
    forked = model.fork(Device("cpu:1"))
    valid = forked.valid()
    t_move = time.perf_counter() - t0
    grown = rss_bytes() - base

    initialized = sum(p.is_initialized() for _, p in valid.named_params()) + sum(
        p.is_initialized() for _, p in model.named_params())
    assert n == 400 * D * D, n
    assert initialized == 0, "an initializer ran"
    assert text.endswith(f"params: {n}\n}}")

    rows.append(["build 400 lazy [4096, 4096] params", fmt_time(t_build)])
    rows.append(["num_params()", fmt_time(t_count)])
    rows.append(["str(model) (display)", fmt_time(t_display)])
    rows.append(["fork(cpu:1) + valid()", fmt_time(t_move)])
    rows.append(["total (build + count + display)", fmt_time(t_build + t_count + t_display)])
    rows.append(["resident memory growth", f"{grown / 2**20:.1f} MB"])
    rows.append(["parameters declared", f"{n:,}"])
    rows.append(["initializers run", str(initialized)])
    print_table("Lazy parameters (target: < 0.5 s and < 50 MB)", ["step", "result"], rows)

    p = Param(Tensor.ones([4, 4]))
    x = Tensor.zeros([8, 128, 64])
    hot = [
        ["param.val() (initialized, no reparameterization)", fmt_time(timeit(p.val))],
        ["assert_shape(x, [8, 128, 64]) passing", fmt_time(timeit(lambda: assert_shape(x, [8, 128, 64])))],
        ["assert_shape(x, [..., 64]) passing", fmt_time(timeit(lambda: assert_shape(x, [..., 64])))],
    ]
    print_table("Per-step hot paths", ["call", "time per call"], hot)


if __name__ == "__main__":
    main()
