"""A 6.7-billion-parameter model is built, counted and displayed without initializing anything.

(Timing lives in benchmarks/lazy_params.py; this test checks that nothing is allocated.)
"""
from engine import Device, Module

from .helpers import Counter


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Block(Module):
    def __init__(self, inits):
        self.q, self.k, self.v, self.o = (init.param() for init in inits)


class Big(Module):
    def __init__(self, inits):
        self.blocks = [Block(inits[i:i + 4]) for i in range(0, len(inits), 4)]


def test_declaring_6_7_billion_parameters_allocates_nothing():
    inits = [Counter([4096, 4096]) for _ in range(400)]
    before = rss_bytes()
    model = Big(inits)
    n = model.num_params()
    text = str(model)
    moved = model.fork(Device("cpu:1")).valid().train()
    shapes = [p.shape for _, p in moved.named_params()]
    grown = rss_bytes() - before
    assert n == 400 * 4096 * 4096 == 6_710_886_400
    assert text.endswith("params: 6710886400\n}")
    assert shapes == [(4096, 4096)] * 400
    assert moved.devices() == [Device("cpu:1")]
    assert sum(i.calls for i in inits) == 0, "an initializer ran"
    assert grown < 50 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MB"
