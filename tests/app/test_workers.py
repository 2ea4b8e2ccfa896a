"""The background Task: progress, partial results, results, failures and cancellation arrive
as queued signals in the GUI thread, and the window's event loop keeps running meanwhile."""
import threading

import pytest
from PySide6.QtCore import QThread

from app.workers import Cancelled, Task


def test_result_and_progress_arrive_in_the_gui_thread(qtbot):
    gui_thread = QThread.currentThread()
    seen = []

    def work(state, n):
        for i in range(n):
            state.set_progress((i + 1) / n)
            state.set_partial_result(i)
        return sum(range(n))

    task = Task(work, 5, title="sum")
    task.progress.connect(lambda f: seen.append(("progress", f, QThread.currentThread() is gui_thread)))
    task.partial.connect(lambda v: seen.append(("partial", v, QThread.currentThread() is gui_thread)))
    with qtbot.waitSignal(task.finished, timeout=5000) as blocker:
        task.start()
    assert blocker.args == [10]
    assert task.outcome == "finished" and task.result == 10
    assert [s[1] for s in seen if s[0] == "progress"] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert [s[1] for s in seen if s[0] == "partial"] == [0, 1, 2, 3, 4]
    assert all(on_gui for _, _, on_gui in seen)


def test_a_failure_carries_the_exception_and_traceback(qtbot):
    def work(state):
        raise ValueError("checkpoint is corrupt: bad magic")

    task = Task(work)
    with qtbot.waitSignal(task.failed, timeout=5000) as blocker:
        task.start()
    failure = blocker.args[0]
    assert isinstance(failure.exception, ValueError)
    assert "bad magic" in str(failure)
    assert "Traceback" in failure.traceback and "in work" in failure.traceback
    assert task.outcome == "failed"


def test_cancel_stops_the_function_at_its_next_check(qtbot):
    started = threading.Event()
    steps = []

    def work(state):
        started.set()
        for i in range(10_000):
            state.check_cancelled()
            steps.append(i)
            threading.Event().wait(0.001)
        return "ran to the end"

    task = Task(work)
    finished = []
    task.finished.connect(finished.append)
    task.start()
    assert started.wait(5)
    with qtbot.waitSignal(task.cancelled, timeout=5000):
        task.cancel()
    assert task.outcome == "cancelled"
    assert finished == []
    assert len(steps) < 10_000


def test_a_function_that_ignores_cancel_still_reports_cancelled(qtbot):
    gate = threading.Event()

    def work(state):
        gate.wait(5)
        return 1

    task = Task(work)
    got = []
    task.finished.connect(got.append)
    task.start()
    task.cancel()
    gate.set()
    with qtbot.waitSignal(task.done, timeout=5000):
        pass
    assert task.outcome == "cancelled" and got == []


def test_the_event_loop_runs_while_the_task_works(qtbot):
    gate = threading.Event()

    def work(state):
        gate.wait(5)
        return "ok"

    task = Task(work)
    task.start()
    ticks = []
    from PySide6.QtCore import QTimer

    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(5)
    qtbot.waitUntil(lambda: len(ticks) >= 3, timeout=2000)
    assert task.is_running()
    with qtbot.waitSignal(task.finished, timeout=5000):
        gate.set()
    timer.stop()


def test_a_task_starts_once(qtbot):
    task = Task(lambda state: None)
    with qtbot.waitSignal(task.done, timeout=5000):
        task.start()
    with pytest.raises(RuntimeError, match="already started"):
        task.start()


def test_cancelled_is_an_exception_the_function_may_raise(qtbot):
    def work(state):
        raise Cancelled()

    task = Task(work)
    with qtbot.waitSignal(task.cancelled, timeout=5000):
        task.start()
