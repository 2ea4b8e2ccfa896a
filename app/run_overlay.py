"""The Training tab's "Overlay run…": the curves of a run folder that is not the open document's
(another model's run, another project's) drawn beside its own runs, to compare them. An overlaid
run is shown only: it is not saved with the project, not resumed, and goes with the next model."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from engine.train.run_folder import read_curves
from engine.train.run_history import RunHistory


class OverlayError(ValueError):
    """A folder that holds no run's curves."""


def history_from_folder(folder, taken: set[str]) -> RunHistory:
    """The curves of the run folder `folder` (its curves.json) under a name not in `taken`."""
    path = Path(folder)
    data = read_curves(path)
    if data is None:
        raise OverlayError(f"{path}: expected a run folder with curves.json (Ember writes one in each run "
                           f"folder under the project's .runs folder); found none that reads as JSON")
    base = f"{path.name} (overlay)"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base} {n}"
    history = RunHistory(name, str(path))
    history.load_json(data)  # a malformed entry is left out
    if not history.steps and not history.epochs:
        raise OverlayError(f"{path / 'curves.json'}: expected a run's curves (steps and epochs), found none")
    return history


class RunOverlay:
    """Connects the curves' "Overlay run…" to a folder picker; `overlay(folder)` adds one."""

    def __init__(self, curves, *, start_folder, show_error):
        """`start_folder()`: where the picker opens (the runs folder); `show_error(text)`: the
        panel's error line."""
        self.curves = curves
        self.start_folder = start_folder
        self.show_error = show_error
        curves.overlay_requested.connect(self.ask)

    def ask(self) -> RunHistory | None:
        folder = QFileDialog.getExistingDirectory(self.curves, "Overlay a run (a run folder with curves.json)",
                                                  str(self.start_folder()))
        return self.overlay(folder) if folder else None

    def overlay(self, folder) -> RunHistory | None:
        try:
            history = history_from_folder(folder, {r.name for r in self.curves.runs()})
        except OverlayError as exc:
            self.show_error(str(exc))
            return None
        self.curves.add_run(history)
        self.curves.redraw()
        return history
