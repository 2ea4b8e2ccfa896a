"""The benchmark helpers' arithmetic, on a fake clock (no timing happens in the test suite)."""
import os

import pytest

from benchmarks import _common as common


def test_paired_ratios_follow_each_set_through_drift():
    cost = {"base": 1.0, "fast": 0.9, "slow": 1.2}
    state = {"now": 0.0, "slowness": 1.0, "reads": 0}
    calls = dict.fromkeys(cost, 0)
    # the machine slows down and speeds up from one set of blocks to the next, as this VM does
    speeds = iter([1.0, 3.0, 1.5, 2.0, 1.0, 4.0] * 10)

    def clock():
        state["reads"] += 1
        if state["reads"] % 6 == 0:  # 3 sides x 2 reads per block: a set has ended
            state["slowness"] = next(speeds)
        return state["now"]

    def side(name):
        def fn():
            calls[name] += 1
            state["now"] += cost[name] * state["slowness"]

        return fn

    res = common.paired({k: side(k) for k in cost}, "base", blocks=12, calls=4, warmup=2, clock=clock)
    assert calls == dict.fromkeys(cost, 2 + 12 * 4)
    assert res["base"].ratio == pytest.approx(1.0)
    assert res["fast"].ratio == pytest.approx(0.9)
    assert res["slow"].ratio == pytest.approx(1.2)
    assert res["slow"].ratio_q1 == pytest.approx(1.2) and res["slow"].ratio_q3 == pytest.approx(1.2)
    # the best block is the fastest phase's; the median block sits above it
    assert res["fast"].best == pytest.approx(0.9)
    assert res["fast"].median > res["fast"].best
    assert len(res["base"].times) == 12


def test_paired_names_a_missing_base():
    with pytest.raises(KeyError, match="'numpy' is not one of the sides"):
        common.paired({"engine": lambda: None}, "numpy", blocks=1, calls=1)


def test_threads_from_argv_pins_every_thread_variable(monkeypatch):
    _common = common

    for var in _common.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    assert _common.threads_from_argv(["mlp.py"]) is None
    assert all(var not in os.environ for var in _common.THREAD_VARS)
    assert _common.threads_from_argv(["mlp.py", "--threads", "2"]) == 2
    assert all(os.environ[var] == "2" for var in _common.THREAD_VARS)
