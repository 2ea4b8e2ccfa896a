"""Background tasks: work on a thread, progress and results back through queued signals.

The shape follows Orange3's `concurrent.py`: the function runs on a worker thread and gets a
`TaskState` through which it reports progress, a status line and partial results, and asks
whether it was cancelled. The `BackgroundTask` (a QObject living in the GUI thread) re-emits all of it
as signals, delivered queued in the GUI thread, so slots never run on the worker.

    task = BackgroundTask(load_checkpoint, path)
    task.progress.connect(bar.setValue)
    task.finished.connect(on_loaded)
    task.failed.connect(show_error)
    task.start()
    ...
    task.cancel()      # the function sees state.is_cancelled() and stops at its next check

The function and its arguments are dropped when it returns; `release()` (which the window's
`TaskRunner` calls once a task's outcome was delivered) drops the result and the connections.
"""
from __future__ import annotations

import threading
import traceback
import warnings
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, Signal, Slot


class Cancelled(Exception):
    """Raised inside a task function (by `TaskState.check_cancelled`) to stop early."""


class TaskState(QObject):
    """The worker's side of a task: report progress and check for cancellation.

    Its signals are emitted from the worker thread; `BackgroundTask` receives them through queued
    connections, so they are thread-safe to call at any rate.
    """

    progress_changed = Signal(float)
    status_changed = Signal(str)
    partial_result = Signal(object)
    _done = Signal(str, object)  # ("finished" | "failed" | "cancelled", payload)

    def __init__(self):
        super().__init__()
        self._cancel = threading.Event()

    def set_progress(self, fraction: float) -> None:
        """Report progress as a fraction in [0, 1]."""
        self.progress_changed.emit(min(1.0, max(0.0, float(fraction))))

    def set_status(self, text: str) -> None:
        self.status_changed.emit(str(text))

    def set_partial_result(self, value: Any) -> None:
        self.partial_result.emit(value)

    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        """Raise `Cancelled` when cancellation was requested."""
        if self._cancel.is_set():
            raise Cancelled()


class TaskFailure:
    """What a failed task leaves behind: the exception and its formatted traceback."""

    def __init__(self, exc: BaseException, tb: str):
        self.exception = exc
        self.traceback = tb

    def __str__(self) -> str:
        return f"{type(self.exception).__name__}: {self.exception}"


class BackgroundTask(QObject):
    """Run `fn(state, *args, **kwargs)` on a worker thread.

    Signals (all delivered in the thread that owns the BackgroundTask, normally the GUI thread):
    `progress(float)`, `status(str)`, `partial(object)`, then exactly one of
    `finished(result)`, `failed(TaskFailure)` or `cancelled()`, then `done()`.
    """

    progress = Signal(float)
    status = Signal(str)
    partial = Signal(object)
    finished = Signal(object)
    failed = Signal(object)
    cancelled = Signal()
    done = Signal()

    def __init__(self, fn: Callable[..., Any], *args, title: str = "", **kwargs):
        super().__init__()
        self.title = title or getattr(fn, "__name__", "task")
        self._fn = fn
        self._args = args
        self._kwargs = kwargs
        self._state = TaskState()
        self._thread: threading.Thread | None = None
        self._finished_event = threading.Event()
        self.outcome: str | None = None  # "finished" | "failed" | "cancelled" once done
        self.result: Any = None
        q = Qt.ConnectionType.QueuedConnection
        self._state.progress_changed.connect(self.progress, q)
        self._state.status_changed.connect(self.status, q)
        self._state.partial_result.connect(self.partial, q)
        self._state._done.connect(self._on_done, q)

    # ---- control ------------------------------------------------------------------------
    def start(self) -> "BackgroundTask":
        if self._thread is not None:
            raise RuntimeError(f"task {self.title!r} was already started")
        self._thread = threading.Thread(target=self._run, name=f"ember-task-{self.title}", daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Ask the function to stop; `cancelled` follows once it has."""
        self._state._cancel.set()

    def is_running(self) -> bool:
        return self._thread is not None and self.outcome is None

    def is_cancel_requested(self) -> bool:
        return self._state.is_cancelled()

    def wait_thread(self, timeout: float | None = None) -> bool:
        """Block until the worker function has returned (signals may still be queued)."""
        return self._finished_event.wait(timeout)

    # ---- worker side --------------------------------------------------------------------
    def _run(self) -> None:
        fn, args, kwargs = self._fn, self._args, self._kwargs
        # the function, its arguments and closures (a model, a file) are not kept past the run
        self._fn, self._args, self._kwargs = None, (), {}
        try:
            value = fn(self._state, *args, **kwargs)
        except Cancelled:
            kind, payload = "cancelled", None
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the GUI thread
            if self._state.is_cancelled():
                kind, payload = "cancelled", None
            else:
                kind, payload = "failed", TaskFailure(exc, traceback.format_exc())
        else:
            if self._state.is_cancelled():
                kind, payload = "cancelled", None
            else:
                kind, payload = "finished", value
        del fn, args, kwargs
        self._finished_event.set()
        self._state._done.emit(kind, payload)

    # ---- GUI side -----------------------------------------------------------------------
    @Slot(str, object)
    def _on_done(self, kind: str, payload: Any) -> None:
        self.outcome = kind
        if kind == "finished":
            self.result = payload
            self.finished.emit(payload)
        elif kind == "failed":
            self.result = payload
            self.failed.emit(payload)
        else:
            self.cancelled.emit()
        self.done.emit()

    def release(self) -> None:
        """Let go of everything the task made or was given once its outcome was delivered: the
        result (a model, say), and every connection to its signals (the closures connected to
        them hold what they were started with, and the task itself). `outcome` stays."""
        self.result = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # PySide warns about a signal with no slots
            for signal in (self.progress, self.status, self.partial, self.finished, self.failed, self.cancelled,
                           self.done):
                try:
                    signal.disconnect()
                except (RuntimeError, TypeError):  # nothing connected
                    pass
