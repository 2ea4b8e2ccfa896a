"""The engine's kernel threads: the blocked kernels give the same bits on any thread count."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from engine import Tensor
from engine.nn import _ops
from engine.tensor.cpu import norm as cpu_norm
from engine.tensor import ops_conv, ops_pool
from engine.tensor.cpu import threads


@pytest.fixture
def many_small_blocks(monkeypatch):
    """Every blocked kernel cut into many blocks and handed to threads even for small tensors."""
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(threads, "ELEMENTWISE_MIN_BYTES", 0)
    monkeypatch.setattr(ops_pool, "_POOL_BLOCK_BYTES", 512)
    monkeypatch.setattr(ops_conv, "_IMAGES_PER_PARTIAL", 2)
    monkeypatch.setattr(cpu_norm, "BN_BLOCK_BYTES", 512)
    yield
    threads.set_num_threads(None)


def _run(fn, n_threads):
    threads.set_num_threads(n_threads)
    try:
        return fn()
    finally:
        threads.set_num_threads(None)


def _grads_of(make_loss, *leaves):
    loss = make_loss(*leaves)
    g = loss.backward()
    return [loss.numpy()] + [t.grad(g).numpy() for t in leaves]


def _leaf(rng, shape, scale=1.0):
    return Tensor.from_data(rng.standard_normal(shape).astype(np.float32) * scale).require_grad()


CASES = {
    "conv2d": lambda x, w, b: (x.conv2d(w, b, padding=1) ** 2).sum(),
    "conv2d strided, dilated": lambda x, w, b: (x.conv2d(w, b, stride=2, dilation=2, padding=2) ** 2).sum(),
    "conv2d, one input channel": lambda x, w, b: (x[:, :1].conv2d(w[:, :1], b) ** 2).sum(),
    "conv_transpose2d": lambda x, w, b: (x.conv_transpose2d(w.swap_dims(0, 1), b, stride=2) ** 2).sum(),
    "max_pool2d": lambda x, w, b: (ops_pool.max_pool2d(x, 2) * w.sum()).sum() + b.sum(),
    "max_pool2d overlapping": lambda x, w, b: (ops_pool.max_pool2d(x, 3, stride=1, padding=1) * b.sum()).sum()
    + w.sum(),
    "batch norm": lambda x, w, b: (_ops.normalize(x, (0, 2, 3), 1e-5, w.reshape(6).abs() + 0.5,
                                                  b, (1, 6, 1, 1)) ** 3).sum(),
    "relu": lambda x, w, b: (x.relu() * x).sum() + w.sum() + b.sum(),
}


@pytest.mark.parametrize("case", list(CASES))
def test_blocked_kernels_give_the_same_bits_on_one_and_three_threads(case, many_small_blocks):
    rng = np.random.default_rng(7)
    x = _leaf(rng, (9, 6, 10, 11))
    w = _leaf(rng, (6, 6, 3, 3), 0.2)
    b = _leaf(rng, (6,))
    if case == "batch norm":
        w = _leaf(rng, (6, 1, 1, 1))
    fn = CASES[case]
    one = _run(lambda: _grads_of(fn, x, w, b), 1)
    three = _run(lambda: _grads_of(fn, x, w, b), 3)
    for a, c in zip(one, three):
        np.testing.assert_array_equal(a, c)
    assert np.isfinite(one[1]).all() and np.abs(one[1]).sum() > 0


def test_run_blocks_runs_every_block_once_across_threads():
    seen = []
    lock = threading.Lock()
    names = set()

    def fn(i):
        with lock:
            seen.append(i)
            names.add(threading.current_thread().name)
        time.sleep(0.002)  # long enough for the workers to wake and join (trivial blocks would all
        # be taken by this thread before they do, as they should)

    _run(lambda: threads.run_blocks(fn, range(40)), 4)
    assert sorted(seen) == list(range(40))
    assert len(names) > 1  # the work really went to worker threads


def test_run_blocks_raises_a_block_error_once_every_thread_has_stopped():
    # the threads take blocks in order: every block before the failing one runs; once it has
    # failed no thread takes another, so at most the blocks already in the other two threads'
    # hands finish after it; and nothing runs after run_blocks has raised
    done = []

    def fn(i):
        if i == 5:
            raise ValueError("block 5 failed")
        time.sleep(0.003)
        done.append(i)

    with pytest.raises(ValueError, match="block 5 failed"):
        _run(lambda: threads.run_blocks(fn, range(12)), 3)
    finished = sorted(done)
    time.sleep(0.02)
    assert sorted(done) == finished
    assert [i for i in finished if i < 5] == [0, 1, 2, 3, 4]
    assert len([i for i in finished if i > 5]) <= 4  # of 6, without the stop all would run


def test_run_chunks_hands_out_blocks_in_order_to_whichever_thread_is_free():
    # the calling thread starts at once; a worker that wakes later takes what is left, and a
    # block is never run twice or skipped, however the threads' speeds differ
    taken = {}

    def fn(chunk):
        name = threading.current_thread().name
        for b in chunk:
            taken[b] = name
            if name != threading.main_thread().name:
                time.sleep(0.002)  # a slow worker

    _run(lambda: threads.run_chunks(fn, range(30)), 2)
    assert sorted(taken) == list(range(30))
    # the fast thread took most (a fixed split would give it 15); the slow one needs 2 ms a block
    assert list(taken.values()).count(threading.main_thread().name) > 20


def test_a_kernel_called_from_a_worker_runs_inline_instead_of_waiting_on_the_pool():
    inner_threads = []

    def inner(i):
        inner_threads.append(threading.current_thread().name)

    def outer(i):
        threads.run_blocks(inner, range(4))

    _run(lambda: threads.run_blocks(outer, range(2)), 2)  # would deadlock on a saturated pool
    assert len(inner_threads) == 8


def test_a_kernel_called_from_the_callers_own_run_stays_on_the_caller():
    """The calling thread works blocks itself; a kernel called inside one (a copy_into, say)
    must run there too: handed to the pool, it would wait for the busy worker instead."""
    pairs = []

    def outer(chunk):
        for b in chunk:
            here = threading.current_thread().name
            threads.run_blocks(lambda i: pairs.append((b, here, threading.current_thread().name)), range(4))

    _run(lambda: threads.run_chunks(outer, range(6)), 2)
    assert sorted({b for b, _, _ in pairs}) == list(range(6)) and len(pairs) == 24
    assert all(outer_thread == inner_thread for _, outer_thread, inner_thread in pairs)
    assert threading.main_thread().name in {o for _, o, _ in pairs}
    assert not getattr(threads._inside, "worker", False)  # the caller is a caller again afterwards
    seen = []

    def slow(i):
        seen.append(threading.current_thread().name)
        time.sleep(0.005)

    _run(lambda: threads.run_blocks(slow, range(8)), 2)
    assert len(set(seen)) == 2  # and its next kernel uses the pool


@pytest.fixture
def openblas():
    """NumPy's OpenBLAS (set, get), its count restored after the test, or a skip."""
    api = threads._openblas_api()
    if api is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count threadpoolctl can set")
    threads.blas_threads_by_size()  # decided now, so the test's own setting is not overridden
    before = int(api[1]())
    yield api
    api[0](before)


def test_one_blas_thread_holds_openblas_at_one_and_restores_the_count_it_found(openblas, monkeypatch):
    """Without BLAS's threads by size (EMBER_BLAS_THREADS=all), the hold restores the count it found."""
    monkeypatch.setattr(threads, "_by_size", False)
    openblas[0](2)
    with threads.one_blas_thread():
        assert int(openblas[1]()) == 1
        with threads.one_blas_thread():  # nested (another kernel on another thread, say)
            assert int(openblas[1]()) == 1
        assert int(openblas[1]()) == 1
    assert int(openblas[1]()) == 2


def test_with_blas_threads_by_size_a_hold_leaves_one_thread_or_the_count_a_large_product_raised(openblas, monkeypatch):
    monkeypatch.setattr(threads, "_by_size", True)
    monkeypatch.setattr(threads, "_BLAS", 2)
    openblas[0](2)  # set behind the engine's back: a hold still gives one thread
    with threads.one_blas_thread():
        assert int(openblas[1]()) == 1
    assert int(openblas[1]()) == 1
    monkeypatch.setattr(threads, "_blas_raised", 1)  # a large product running on another thread
    with threads.one_blas_thread():
        assert int(openblas[1]()) == 1
    assert int(openblas[1]()) == 2  # handed back to that product


class _FakeBlas:
    """Records the thread counts the engine sets on OpenBLAS."""

    def __init__(self):
        self.count, self.sets = 1, []

    def set(self, n):
        self.count = n
        self.sets.append(n)

    def get(self):
        return self.count


@pytest.fixture
def fake_blas(monkeypatch):
    fake = _FakeBlas()
    monkeypatch.setattr(threads, "_blas_api", [(fake.set, fake.get)])
    monkeypatch.setattr(threads, "_by_size", True)
    monkeypatch.setattr(threads, "_by_size_checked", True)
    monkeypatch.setattr(threads, "_BLAS", 2)
    return fake


def test_only_large_products_get_openblas_threads(fake_blas):
    rng = np.random.default_rng(0)
    side = 128
    rows = threads.BLAS_THREADED_MIN_WORK // (side * side)  # rows x 128 x 128 multiply-adds: the threshold
    assert rows * side * side == threads.BLAS_THREADED_MIN_WORK and rows % 4 == 0
    a = rng.standard_normal((rows, side)).astype(np.float32)
    b = rng.standard_normal((side, side)).astype(np.float32)
    np.testing.assert_array_equal(threads.matmul(a[:-1], b), a[:-1] @ b)  # just under: one thread
    assert fake_blas.sets == []
    out = np.empty((rows, side), np.float32)
    r = threads.matmul(a, b, out=out)
    assert r is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    assert fake_blas.sets == [2, 1]  # raised for the call, one thread after
    # stacked: OpenBLAS makes one product per matrix of the stack, so the work is counted per
    # matrix: four of a quarter of the threshold each stay on one thread, four of it each do not
    fake_blas.sets.clear()
    stack = rng.standard_normal((4, rows // 4, side)).astype(np.float32)
    np.testing.assert_allclose(threads.matmul(stack, b), stack.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    assert fake_blas.sets == []
    stack = rng.standard_normal((4, rows, side)).astype(np.float32)
    np.testing.assert_allclose(threads.matmul(stack, b), stack.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    assert fake_blas.sets == [2, 1]


def test_products_with_few_outputs_keep_one_thread(fake_blas):
    # a small layer's weight gradient: much work into few outputs, and OpenBLAS splits a product
    # over its outputs, so a second thread has little to take: one thread below 4096 outputs
    small = int(np.sqrt(threads.BLAS_THREADED_MIN_OUT))
    assert small * small == threads.BLAS_THREADED_MIN_OUT
    k = 2 * threads.BLAS_THREADED_MIN_WORK // threads.BLAS_THREADED_MIN_OUT
    a = np.ones((k, small - 1), np.float32).T  # (small - 1) x k, the transposed view a gradient uses
    b = np.ones((k, small), np.float32)
    np.testing.assert_array_equal(threads.matmul(a, b), np.full((small - 1, small), k, np.float32))
    assert fake_blas.sets == []
    a = np.ones((k, small), np.float32).T
    np.testing.assert_array_equal(threads.matmul(a, b), np.full((small, small), k, np.float32))
    assert fake_blas.sets == [2, 1]


def test_large_products_inside_kernel_threads_or_a_hold_keep_one_thread(fake_blas):
    side = 128
    a = np.ones((threads.BLAS_THREADED_MIN_WORK // (side * side), side), np.float32)
    w = np.ones((side, side), np.float32)
    with threads.one_blas_thread():
        threads.matmul(a, w)
    assert fake_blas.sets and set(fake_blas.sets) == {1}  # never raised inside the hold
    fake_blas.sets.clear()
    seen = []

    def product(_):
        threads.matmul(a, w)
        seen.append(threading.get_ident())
        time.sleep(0.002)

    _run(lambda: threads.run_blocks(product, range(6)), 2)
    assert fake_blas.sets == [] and len(seen) == 6
    # run here alone (one block), a kernel's large product is the only work: it gets the threads
    _run(lambda: threads.run_chunks(lambda run: [threads.matmul(a, w) for _ in run], range(1), own_products=True), 2)
    assert fake_blas.sets == [2, 1]


def test_products_of_other_arrays_are_theirs(fake_blas):
    class Other:
        def __matmul__(self, other):
            return "theirs"

    assert threads.matmul(Other(), np.ones((2, 2))) == "theirs"
    assert fake_blas.sets == []


def test_the_first_product_sets_openblas_to_one_thread_unless_all_threads_are_asked_for():
    code = ("import engine, numpy as np\n"
            "from engine.tensor.cpu import threads\n"
            "api = threads._openblas_api()\n"
            "if api is None: print('none'); raise SystemExit\n"
            "before = int(api[1]())\n"
            "x = engine.Tensor.from_data(np.ones((8, 4), np.float32))\n"
            "y = x @ engine.Tensor.from_data(np.ones((4, 3), np.float32))\n"
            "print(before, int(api[1]()), threads.blas_threads_by_size())")
    env = {**_base_env(), "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    if out.stdout.strip() == "none":
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count threadpoolctl can set")
    assert out.stdout.split() == ["2", "1", "True"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "EMBER_BLAS_THREADS": "all"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "2", "False"]
    out = subprocess.run([sys.executable, "-c", code], env={**_base_env(), "OPENBLAS_NUM_THREADS": "1"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "False"]  # one thread anyway: nothing to decide


_WHICH_OPENBLAS = r"""
import ctypes, json, threading
import numpy as np
import scipy.linalg  # noqa: F401 - SciPy's own OpenBLAS copy is loaded too
from threadpoolctl import ThreadpoolController
from engine.tensor.cpu import threads

libs = ThreadpoolController().select(user_api="blas", internal_api="openblas").lib_controllers
DOJOB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                            ctypes.c_void_p, ctypes.c_int)
seen, keep = [], []
for i, lib in enumerate(libs):
    setter = lib._get_symbol("openblas_set_threads_callback_function")
    if setter is None:
        continue
    def jobs(sync, dojob, n, size, data, extra, i=i):
        seen.append(i)
        run = DOJOB(dojob)
        others = [threading.Thread(target=run, args=(j, data + j * size, extra)) for j in range(1, n)]
        for t in others:
            t.start()
        run(0, data, extra)
        for t in others:
            t.join()
    keep.append((setter, CALLBACK(jobs)))
    setter(keep[-1][1])
    lib.set_num_threads(2)
a = np.ones((256, 256), np.float32)
a @ a  # split over threads: only the OpenBLAS NumPy calls runs its callback
for setter, _ in keep:
    setter(None)
chosen = threads._numpys_openblas(libs)
chosen_reversed = threads._numpys_openblas(list(reversed(libs)))
print(json.dumps({"paths": [str(lib.filepath) for lib in libs], "callbacks": len(keep),
                  "used": sorted(set(seen)),
                  "chosen": None if chosen is None else libs.index(chosen),
                  "chosen_reversed": None if chosen_reversed is None else libs.index(chosen_reversed)}))
"""


def test_the_engine_sets_the_threads_of_the_openblas_numpy_calls_not_another_copy():
    """SciPy brings its own OpenBLAS; the order threadpoolctl lists the copies in changes from
    process to process, and setting the wrong copy's threads left NumPy's at all of them. Which
    copy NumPy calls is told here independently: each copy's job callback counts its split calls,
    and one product is made through NumPy."""
    pytest.importorskip("scipy.linalg")
    env = {**_base_env(), "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _WHICH_OPENBLAS], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if not got["paths"]:
        pytest.skip("NumPy's BLAS is not an OpenBLAS that threadpoolctl finds")
    if len(got["used"]) != 1:
        pytest.skip(f"no OpenBLAS copy here can report its split calls ({got['callbacks']} callbacks)")
    numpys = got["used"][0]
    assert got["chosen"] == numpys, got
    assert got["chosen_reversed"] == numpys, got


class _OtherOpenBLAS:
    """A controller of an OpenBLAS copy NumPy does not call: its symbols have another name."""
    _symbol_prefix, _symbol_suffix = "not_numpys_", ""

    def _get_symbol(self, name):
        return None


class _OldController:
    """A threadpoolctl controller without the internals the lookup reads."""


class _SameNamesOtherCode:
    """A copy whose symbols carry the names NumPy's copy uses but are other code (libc's)."""

    def __init__(self, prefix, suffix):
        import ctypes.util

        self._symbol_prefix, self._symbol_suffix = prefix, suffix
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"))

    def _get_symbol(self, name):
        return self._libc.getpid


def test_an_openblas_numpy_does_not_call_is_never_the_one_set():
    assert threads._numpys_openblas([_OtherOpenBLAS()]) is None
    # the names NumPy's core module resolves are not enough: the functions must be the same ones
    from threadpoolctl import ThreadpoolController

    real = threads._numpys_openblas(
        ThreadpoolController().select(user_api="blas", internal_api="openblas").lib_controllers)
    if real is not None:
        decoy = _SameNamesOtherCode(real._symbol_prefix, real._symbol_suffix)
        assert threads._numpys_openblas([decoy]) is None
        assert threads._numpys_openblas([decoy, real]) is real
    assert threads._numpys_openblas([_OtherOpenBLAS(), _OtherOpenBLAS()]) is None
    # without threadpoolctl's internals: a single copy is NumPy's, of several none can be told
    only = _OldController()
    assert threads._numpys_openblas([only]) is only
    assert threads._numpys_openblas([_OldController(), _OldController()]) is None


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_runs_blocks_on_a_fresh_pool():
    import os

    _run(lambda: threads.run_blocks(lambda i: None, range(4)), 2)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker threads are gone; this must not hang
        try:
            seen = []
            threads.set_num_threads(2)
            threads.run_blocks(seen.append, range(6))
            os._exit(0 if sorted(seen) == list(range(6)) else 1)
        except BaseException:
            os._exit(2)
    import signal
    import time

    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung waiting on the parent's thread pool")
        time.sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_set_num_threads_checks_its_argument():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="expected an int >= 1 or None"):
            threads.set_num_threads(bad)
    threads.set_num_threads(3)
    assert threads.num_threads() == 3
    threads.set_num_threads(None)
    assert threads.num_threads() >= 1


def test_the_default_thread_count_follows_the_environment():
    code = "from engine.tensor.cpu import threads; print(threads.num_threads())"
    for env, expected in (({"EMBER_NUM_THREADS": "3"}, "3"), ({"OPENBLAS_NUM_THREADS": "1"}, "1"),
                          ({"EMBER_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}, "2")):
        out = subprocess.run([sys.executable, "-c", code], env={**_base_env(), **env}, capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == expected, (env, out.stdout)


def test_importing_the_engine_first_shortens_openblas_spinning_unless_the_user_chose():
    code = "import os, engine, numpy; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    out = subprocess.run([sys.executable, "-c", code], env=_base_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "20"
    out = subprocess.run([sys.executable, "-c", code], env={**_base_env(), "OPENBLAS_THREAD_TIMEOUT": "4"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"
    code = "import os, numpy, engine; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    out = subprocess.run([sys.executable, "-c", code], env=_base_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"  # too late once NumPy has loaded OpenBLAS: left alone


def _base_env():
    import os

    keep = ("PATH", "HOME", "PYTHONPATH", "LANG", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONPATH"] = str(__import__("pathlib").Path(__file__).resolve().parents[3])
    return env


@pytest.mark.parametrize("by_size", [False, True], ids=["BLAS threads for every call", "BLAS threads by size"])
def test_own_products_hold_openblas_at_one_thread_only_while_blocks_are_shared(by_size, openblas, monkeypatch):
    """Blocks that make their own products run with OpenBLAS at one thread while several threads
    share them. Run here alone (one block), their products keep OpenBLAS's count where every call
    has BLAS's threads, and have one thread (a large one raises it: `threads.matmul`) by size."""
    monkeypatch.setattr(threads, "_BLAS", 2)
    monkeypatch.setattr(threads, "_by_size", by_size)
    base = 1 if by_size else 2
    openblas[0](base)
    seen = []

    def fn(chunk):
        for _ in chunk:
            seen.append(int(openblas[1]()))
            time.sleep(0.002)

    _run(lambda: threads.run_chunks(fn, range(4), own_products=True), 2)
    assert seen and set(seen) == {1}
    assert int(openblas[1]()) == base  # restored
    seen.clear()
    _run(lambda: threads.run_chunks(fn, range(1), own_products=True), 2)
    assert seen == [base]
    seen.clear()
    _run(lambda: threads.run_chunks(fn, range(4)), 2)  # products not the blocks' own: untouched
    assert set(seen) == {base}


def test_min_blocks_asks_for_the_bar_in_data_fewer_times_the_cost(monkeypatch):
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 4 << 20)
    assert threads.min_blocks(1 << 19) == 8  # a streaming pass: 4 MB of 512 KB blocks
    assert threads.min_blocks(1 << 19, cost=4) == 2  # 4x the work per byte: 1 MB
    assert threads.min_blocks(1 << 19, cost=16) == 2  # never fewer than two blocks
    assert threads.min_blocks(0) == 4 << 20  # empty blocks: the bar itself, no division by zero
    monkeypatch.setattr(threads, "PARALLEL_MIN_BYTES", 0)  # read at call time
    assert threads.min_blocks(1 << 19) == 2
