"""The BackgroundTask: progress, partial results, results, failures and cancellation arrive
as queued signals in the GUI thread, and the window's event loop keeps running meanwhile."""
import threading

import pytest
from PySide6.QtCore import QThread

from app.workers import Cancelled, BackgroundTask


def test_result_and_progress_arrive_in_the_gui_thread(qtbot):
    gui_thread = QThread.currentThread()
    seen = []

    def work(state, n):
        for i in range(n):
            state.set_progress((i + 1) / n)
            state.set_partial_result(i)
        return sum(range(n))

    task = BackgroundTask(work, 5, title="sum")
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

    task = BackgroundTask(work)
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

    task = BackgroundTask(work)
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

    task = BackgroundTask(work)
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

    task = BackgroundTask(work)
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
    task = BackgroundTask(lambda state: None)
    with qtbot.waitSignal(task.done, timeout=5000):
        task.start()
    with pytest.raises(RuntimeError, match="already started"):
        task.start()


def test_cancelled_is_an_exception_the_function_may_raise(qtbot):
    def work(state):
        raise Cancelled()

    task = BackgroundTask(work)
    with qtbot.waitSignal(task.cancelled, timeout=5000):
        task.start()


def _runner():
    from app.task_runner import TaskRunner
    from widgets.task_progress import TaskProgress

    progress, notes = TaskProgress(), []
    runner = TaskRunner(progress, lambda title, text, details: notes.append(("error", text)),
                        lambda text: notes.append(("status", text)))
    return runner, progress, notes


def test_a_new_task_of_a_kind_cancels_and_cuts_off_the_old_one(qtbot):
    runner, progress, notes = _runner()
    qtbot.addWidget(progress)
    gate = threading.Event()
    got = []

    def slow(state):
        gate.wait(5)
        return "old"

    old = runner.start(BackgroundTask(slow, title="old"), got.append, kind="check")
    new = runner.start(BackgroundTask(lambda state: "new", title="new"), got.append, kind="check")
    assert old.is_cancel_requested() and not new.is_cancel_requested()
    gate.set()
    qtbot.waitUntil(lambda: not runner.running, timeout=5000)
    assert got == ["new"]  # the replaced task's result never arrives, nor its "cancelled" note
    assert notes == [] and not progress.isVisible()


def test_a_result_that_arrives_when_its_condition_no_longer_holds_is_dropped(qtbot):
    runner, progress, notes = _runner()
    qtbot.addWidget(progress)
    state = {"model": "a"}
    got = []
    with qtbot.waitSignal(runner.start(BackgroundTask(lambda s: 1, title="t"), got.append,
                                       valid_while=lambda: state["model"] == "b", dropped="dropped: changed").done,
                          timeout=5000):
        pass
    assert got == [] and notes == [("status", "dropped: changed")]
    with qtbot.waitSignal(runner.start(BackgroundTask(lambda s: 2, title="t"), got.append,
                                       valid_while=lambda: state["model"] == "a").done, timeout=5000):
        pass
    assert got == [2]
