"""What the app remembers between runs, kept in QSettings: window layout, theme, recent files.

The app uses `QSettings("Ember", "Ember")`; tests pass their own (an INI file in a temporary
folder), so nothing leaks between runs or into the user's settings.
"""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

ORGANIZATION = "Ember"
APPLICATION = "Ember"
MAX_RECENT = 10
THEMES = ("light", "dark")


class Settings:
    def __init__(self, qsettings: QSettings | None = None):
        self.q = qsettings if qsettings is not None else QSettings(ORGANIZATION, APPLICATION)

    @classmethod
    def at(cls, path: str | os.PathLike) -> "Settings":
        """Settings stored in an INI file at `path` (for tests and portable installs)."""
        return cls(QSettings(str(path), QSettings.Format.IniFormat))

    def data_dir(self) -> "Path | None":
        """A folder for the app's own files (design autosaves) beside an INI settings file,
        or None for the platform's settings store (callers then use the app data location)."""
        if self.q.format() == QSettings.Format.IniFormat:
            return Path(self.q.fileName()).parent
        return None

    # ---- recent files ------------------------------------------------------------------------
    def recent_files(self) -> list[str]:
        value = self.q.value("recent/files", [])
        if isinstance(value, str):  # QSettings gives back one string for a one-element list
            value = [value]
        return [str(v) for v in (value or [])]

    def add_recent(self, entry: str) -> list[str]:
        """Put `entry` first (a path, or `path.py:factory`), dropping duplicates and the oldest."""
        files = [entry] + [f for f in self.recent_files() if f != entry]
        files = files[:MAX_RECENT]
        self.q.setValue("recent/files", files)
        return files

    def remove_recent(self, entry: str) -> None:
        self.q.setValue("recent/files", [f for f in self.recent_files() if f != entry])

    def clear_recent(self) -> None:
        self.q.setValue("recent/files", [])

    # ---- Python files a project named and the user agreed to run ----------------------------
    def _confirmed(self) -> list[str]:
        value = self.q.value("trust/scripts", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def script_confirmed(self, path: str | os.PathLike, digest: str) -> bool:
        """Whether the user agreed to run this file with exactly this content (SHA-256)."""
        return f"{digest} {Path(path)}" in self._confirmed()

    def confirm_script(self, path: str | os.PathLike, digest: str) -> None:
        """Remember that the user agreed to run this file as it is now (a changed file asks again)."""
        entry = f"{digest} {Path(path)}"
        kept = [e for e in self._confirmed() if e.split(" ", 1)[-1] != str(Path(path))]
        self.q.setValue("trust/scripts", ([entry] + kept)[:200])

    # ---- the folder file dialogs start in ----------------------------------------------------
    def last_folder(self) -> str:
        """The folder of the last file chosen in a file dialog, while it exists; else the home folder."""
        value = self.q.value("files/last_folder", "")
        folder = Path(str(value)) if value else None
        if folder is not None and folder.is_dir():
            return str(folder)
        return str(Path.home())

    def remember_folder(self, chosen: str | os.PathLike) -> None:
        """Remember the folder of a file (or the folder) the user chose in a file dialog."""
        p = Path(chosen).expanduser()
        folder = p if p.is_dir() else p.parent
        self.q.setValue("files/last_folder", str(folder))

    def last_save_folder(self) -> str:
        """The folder last written to through a save dialog, while it exists; else the last folder
        used (opening a model does not move where saves start)."""
        value = self.q.value("files/last_save_folder", "")
        folder = Path(str(value)) if value else None
        if folder is not None and folder.is_dir():
            return str(folder)
        return self.last_folder()

    def remember_save_folder(self, folder: str | os.PathLike) -> None:
        """Remember `folder` as where saves start, and as the last folder used."""
        self.q.setValue("files/last_save_folder", str(Path(folder).expanduser()))
        self.q.setValue("files/last_folder", str(Path(folder).expanduser()))

    # ---- theme -------------------------------------------------------------------------------
    def theme(self) -> str:
        value = str(self.q.value("view/theme", "light"))
        return value if value in THEMES else "light"

    def set_theme(self, name: str) -> None:
        if name not in THEMES:
            raise ValueError(f"unknown theme {name!r}: expected one of {', '.join(THEMES)}")
        self.q.setValue("view/theme", name)

    # ---- window layout -----------------------------------------------------------------------
    def save_window(self, window) -> None:
        self.q.setValue("window/geometry", window.saveGeometry())
        self.q.setValue("window/state", window.saveState())

    def restore_window(self, window) -> bool:
        geometry = self.q.value("window/geometry")
        state = self.q.value("window/state")
        ok = False
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            ok = window.restoreGeometry(geometry)
        if isinstance(state, QByteArray) and not state.isEmpty():
            ok = window.restoreState(state) and ok
        return ok

    def tab_docks(self, tab: str) -> "list[str] | None":
        """The docks the user chose to show on `tab` ('display', 'designer', 'training'), or None
        when they never chose."""
        value = self.q.value(f"view/docks/{tab}")
        if value is None:
            return None
        return [v for v in str(value).split(",") if v]

    def set_tab_docks(self, tab: str, names: list[str]) -> None:
        self.q.setValue(f"view/docks/{tab}", ",".join(names))

    def sync(self) -> None:
        self.q.sync()
