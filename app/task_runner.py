"""The window's task runner: starts `BackgroundTask`s, shows them in the status bar's progress widget, and
makes sure a stale result never arrives.

Orange3's `concurrent.py` pattern: a task started with a `kind` replaces the running task of the
same kind, which is cancelled and disconnected, so its result is never delivered. A task can
also be bound to a condition (`valid_while`, say "the document still holds the module I
started from"): when the result arrives and the condition no longer holds, it is dropped and the
status bar says so (`dropped`).
"""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer

from widgets.task_progress import TaskProgress

from .workers import BackgroundTask


class TaskRunner(QObject):
    def __init__(self, progress: TaskProgress, error: Callable[[str, str, str], Any],
                 status: Callable[[str], None], parent: QObject | None = None):
        super().__init__(parent)
        self.progress = progress
        self._error = error
        self._status = status
        self.running: list[BackgroundTask] = []
        self._by_kind: dict[str, BackgroundTask] = {}
        progress.cancel_requested.connect(self.cancel_all)

    def start(self, task: BackgroundTask, on_finished: Callable[[Any], None], on_failed: Callable[[Any], None] | None = None,
              *, kind: str | None = None, valid_while: Callable[[], bool] | None = None,
              dropped: str = "") -> BackgroundTask:
        """Run `task`; `on_finished(result)` or `on_failed(TaskFailure)` follows in the GUI thread.
        A running task of the same `kind` is cancelled and never delivers; a result that arrives
        when `valid_while()` is false is dropped with the status line `dropped`."""
        if kind is not None:
            old = self._by_kind.pop(kind, None)
            if old is not None and old.is_running():
                self._retire(old)
            self._by_kind[kind] = task
        self.running.append(task)
        self.progress.begin(task.title)
        task.progress.connect(self.progress.set_progress)
        task.status.connect(self.progress.set_status)

        def finished(result):
            if valid_while is not None and not valid_while():
                self._status(dropped or f"{task.title}: the model changed meanwhile; the result was dropped.")
                return
            on_finished(result)

        task.finished.connect(finished)
        task.failed.connect(on_failed or (lambda f: self._error(task.title, str(f), f.traceback)))
        task.cancelled.connect(lambda: self._status(f"{task.title}: cancelled"))
        task.done.connect(lambda: self._done(task, kind))
        return task.start()

    def _retire(self, task: BackgroundTask) -> None:
        """Cancel a replaced task and cut it off: nothing it emits reaches the window any more,
        except its `done`, which takes it off the progress widget."""
        task.cancel()
        for signal in (task.finished, task.failed, task.cancelled, task.progress, task.status):
            signal.disconnect()

    def _done(self, task: BackgroundTask, kind: str | None) -> None:
        if task in self.running:
            self.running.remove(task)
        if kind is not None and self._by_kind.get(kind) is task:
            del self._by_kind[kind]
        if not self.running:
            self.progress.end()
        # after every slot of `done` has run (a release now would cut the rest off): the result,
        # the closures connected to the task and the task itself go, so a finished task holds
        # no model and no file
        QTimer.singleShot(0, task.release)

    def cancel_all(self) -> None:
        for task in self.running:
            task.cancel()
