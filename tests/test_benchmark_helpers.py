"""The benchmark helpers' arithmetic, on a fake clock (no timing happens in the test suite)."""
import json
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


def test_two_core_check_times_each_thread_count_in_its_own_process():
    calls = []

    def fake_run(threads, argv):
        calls.append((threads, argv))
        return {1: 90.5, 2: 171.0}[threads]

    assert common.two_core_check(shape=(64, 32, 16), reps=4, run=fake_run) == (90.5, 171.0)
    assert calls == [(1, ["64", "32", "16", "4"]), (2, ["64", "32", "16", "4"])]


def test_two_core_verdict_flags_a_host_that_gave_one_core():
    fine = common.two_core_verdict(94.0, 181.0)
    assert fine.startswith("one float32 product 4096×256 @ 256×1024: 1 thread 94 GFLOPS, 2 threads 181 GFLOPS "
                           "(1.93× one thread)")
    assert common.two_core_verdict(1.0, 2.0, shape=(8, 4, 2)).startswith("one float32 product 8×4 @ 4×2:")
    assert "not representative" not in fine
    for one, two in [(94.0, 93.0), (94.0, 150.0), (0.0, 0.0)]:  # 0.99x, 1.60x - 0.01, nothing measured
        assert "less than two cores' worth" in common.two_core_verdict(one, two), (one, two)
    assert "not representative" not in common.two_core_verdict(100.0, 160.0)


def test_two_core_line_says_why_when_the_check_fails():
    def broken(threads, argv):
        raise RuntimeError("python failed (1): ImportError")

    assert common.two_core_line(run=broken) == "not measured (python failed (1): ImportError)"

    def garbled(threads, argv):  # what run_side raises for a last line that is not JSON
        return json.loads("Segmentation fault")

    line = common.two_core_line(run=garbled)
    assert line.startswith("not measured (Expecting value"), line


def test_report_carries_the_two_core_checks_and_still_reads_back():
    from benchmarks import run_all

    run = run_all.Run("ops", 0, 12.0, "Per-op overhead\n\n| op | x |\n|---|---|\n| add | 1 |", "",
                      two_cores="1 thread 90 GFLOPS, 2 threads 100 GFLOPS (1.11× one thread) — **under 1.6×**")
    text = run_all.report({"ops": run}, ["ops"], "2.13.0+cpu", "today", "0.1 / 0.1 / 0.1", "0.2 / 0.2 / 0.2", 60.0,
                          ("before-check", "after-check"))
    assert "- two-core check (does the host give this VM two cores' worth?) before: before-check; after: after-check" \
        in text
    assert "Two-core check just before: 1 thread 90 GFLOPS, 2 threads 100 GFLOPS (1.11× one thread)" in text
    runs, order = run_all.runs_from_report(text)
    assert order == ["ops"] and runs["ops"].stdout == run.stdout and runs["ops"].returncode == 0


def test_two_core_check_child_code_runs():
    # the real child processes on a tiny product: only that each prints a throughput (no figure is judged)
    one, two = common.two_core_check(shape=(8, 4, 2), reps=1)
    assert one > 0 and two > 0


ZEN5 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu sse2 avx avx2 avx512f avx512bw\n\nprocessor\t: 1\nmodel name\t: other\n")


def test_cpu_name_tells_family_model_and_vector_width():
    assert common.cpu_name(ZEN5) == "AMD EPYC (family 26 model 2, AVX-512)"  # the first processor's block
    zen3 = ZEN5.replace("26", "25").replace("model\t\t: 2", "model\t\t: 1").replace(" avx512f avx512bw", "")
    assert common.cpu_name(zen3) == "AMD EPYC (family 25 model 1, AVX2)"
    assert common.cpu_name("model name\t: Some CPU\n") == "Some CPU"


def test_openblas_kernels_says_when_the_environment_forces_them():
    import engine  # noqa: F401  (as the scripts do: the engine before NumPy's OpenBLAS is asked)
    import threadpoolctl

    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))
    numpys = [i for i in threadpoolctl.threadpool_info()
              if i.get("internal_api") == "openblas" and "numpy" in i.get("filepath", "")]
    free = common.openblas_kernels({})
    if len(numpys) == 1:  # NumPy's own wheel: its bundled copy (else a system BLAS: not asserted)
        assert free == f"OpenBLAS kernels (NumPy's copy): {numpys[0]['architecture']}, as OpenBLAS chose them for this CPU"
    assert free.endswith(", as OpenBLAS chose them for this CPU")
    forced = common.openblas_kernels({"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512", "OTHER": "x"})
    assert forced.endswith(", forced by OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=512 in the environment")
