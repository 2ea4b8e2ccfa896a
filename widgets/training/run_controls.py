"""Start / pause / resume / stop buttons, resume from the last checkpoint, and a progress bar
with steps per second and the time left.

The widget only asks: each button emits a signal; `set_state` says which buttons make sense
(idle, running, paused, finished, stopped, failed) and `set_progress` what the bar shows.
"""
from __future__ import annotations

import math

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QVBoxLayout, QWidget

ACTIVE = ("starting", "running", "paused", "stopping")


def format_duration(seconds: float | None) -> str:
    """`1:05:03`, `4:07`, `0:09`; `?` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class RunControls(QWidget):
    start_requested = Signal()
    pause_requested = Signal()
    resume_requested = Signal()
    stop_requested = Signal()
    resume_checkpoint_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.state = "idle"
        self._can_start = True
        self._checkpoint_text = ""

        def button(text, name, tip, signal):
            b = QPushButton(text)
            b.setObjectName(name)
            b.setToolTip(tip)
            b.clicked.connect(signal.emit)
            return b

        self.start_button = button("Start", "start", "Train a copy of the model with these settings",
                                   self.start_requested)
        self.pause_button = button("Pause", "pause", "Pause between two steps", self.pause_requested)
        self.resume_button = button("Resume", "resume", "Continue the paused run", self.resume_requested)
        self.stop_button = button("Stop", "stop", "Stop after the current step; the model trained so far is kept",
                                  self.stop_requested)
        self.checkpoint_button = button("Resume from checkpoint", "resume-checkpoint",
                                        "Continue a stopped or crashed run from its last checkpoint",
                                        self.resume_checkpoint_requested)
        self.bar = QProgressBar()
        self.bar.setObjectName("progress")
        self.bar.setRange(0, 1000)
        self.bar.setValue(0)
        self.bar.setFormat("%p%")
        self.rate_label = QLabel("")
        self.rate_label.setObjectName("rate")
        # own rows and fixed heights: text changing several times a second must not relayout
        self.rate_label.setFixedHeight(self.rate_label.fontMetrics().height() + 4)
        self.rate_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.status_label = QLabel("Ready.")
        self.status_label.setObjectName("run-status")
        self.status_label.setFixedHeight(self.status_label.fontMetrics().height() + 4)
        self.status_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        row = QHBoxLayout()
        for b in (self.start_button, self.pause_button, self.resume_button, self.stop_button, self.checkpoint_button):
            row.addWidget(b)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.bar)
        layout.addWidget(self.rate_label)
        layout.addWidget(self.status_label)
        self.set_state("idle")

    def set_can_start(self, ok: bool) -> None:
        """Whether the settings are valid (and a model is open)."""
        self._can_start = bool(ok)
        self._update()

    def set_checkpoint_available(self, text: str) -> None:
        """A description of the checkpoint that 'Resume from checkpoint' would use ('' for none)."""
        self._checkpoint_text = text
        self.checkpoint_button.setToolTip(
            f"Continue from {text}" if text else "No checkpoint to resume from yet")
        self._update()

    def set_state(self, state: str, message: str | None = None) -> None:
        self.state = state
        if message is not None:
            self.status_label.setText(message)
            self.status_label.setToolTip(message)
        self._update()

    def _update(self) -> None:
        s = self.state
        active = s in ACTIVE
        self.start_button.setEnabled(not active and self._can_start)
        self.pause_button.setEnabled(s == "running")
        self.resume_button.setEnabled(s == "paused")
        self.stop_button.setEnabled(s in ("running", "paused", "starting"))
        self.checkpoint_button.setEnabled(not active and self._can_start and bool(self._checkpoint_text))

    def set_progress(self, fraction: float, steps_per_second: float | None, seconds_left: float | None,
                     where: str = "") -> None:
        self.bar.setValue(int(round(max(0.0, min(1.0, fraction)) * 1000)))
        parts = []
        if where:
            parts.append(where)
        if steps_per_second and steps_per_second >= 0.1:
            parts.append(f"{steps_per_second:,.1f} steps/s")
        elif steps_per_second:  # a big model on a CPU: "0.0 steps/s" would say nothing
            parts.append(f"{1.0 / steps_per_second:,.0f} s/step")
        if seconds_left is not None:
            parts.append(f"{format_duration(seconds_left)} left")
        self.rate_label.setText(" · ".join(parts))
