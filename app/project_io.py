"""Where the window's model comes from and goes to: examples, scripts, checkpoints opened into an
architecture, project files (open, save, save as), the autosave beside an unsaved document and
the offer to recover it after a crash. The Qt-free parts live in `app.core` (`opening`,
`project`, `schema`); this file asks for paths, runs loads on the window's task runner and shows
the errors."""
from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from PySide6.QtWidgets import QFileDialog, QMessageBox

from engine.design.files import other_process_running
from widgets.checkpoint_dialog import CheckpointDialog

from .checkpoint_actions import show_load_failure, show_partial_load
from .core import checkpoints, edits, opening
from .core.project import PROJECT_SUFFIX, ProjectError, read_json_file, read_project, write_json_atomic
from .core.schema import (CheckpointSource, DesignSource, Edit, ExampleSource, OnnxSource, PretrainedSource,
                          ScriptSource, Source, source_from_json)
from .document import Document
from .host import Host
from .onnx_actions import OnnxActions
from .pretrained_actions import PretrainedActions
from .prompts import open_file, save_file
from .workers import BackgroundTask

PROJECT_FILTER = f"Ember projects (*{PROJECT_SUFFIX});;All files (*)"
AUTOSAVE_SUFFIX = PROJECT_SUFFIX + ".autosave"
# an untitled document's autosave in the settings folder: `untitled-<pid>-<session>` (or plain
# `untitled`, as versions before sessions named it)
UNTITLED_AUTOSAVE = re.compile(r"untitled(?:-(\d{1,10})-[0-9a-f]{8})?" + re.escape(AUTOSAVE_SUFFIX))


class _ReplayFailed(Exception):
    """A project's edits failed to replay after its checkpoint loaded (reported as a replay)."""


class ProjectIO:
    def __init__(self, document: Document, host: Host, *, examples_menu, recent_menu, pretrained: PretrainedActions,
                 onnx: OnnxActions, open_design: Callable[[Any], bool]):
        """`examples_menu` / `recent_menu`: File ▸ Open Example / Open Recent, filled here when
        shown; `pretrained` and `onnx` open the sources of their kinds; `open_design(path)` opens a
        design project in the designer (the window asks about the design and the model)."""
        self.host = host
        self.document = document
        self.settings = host.settings
        self.examples_menu = examples_menu
        self.recent_menu = recent_menu
        self.pretrained = pretrained
        self.onnx = onnx
        self.open_design = open_design
        # the untitled document's autosave is this session's own file: two running instances never
        # write one file, and a new session never overwrites the copy a crashed one left
        self.session = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._own: set[Path] = set()  # autosaves this session wrote or took over: the only ones it deletes
        self._recovering: list[tuple[Path, Source]] = []  # a Recover answered, its open not arrived yet
        self._offered: set[Path] = set()  # autosaves offered this session (each once)
        self.document.source_changed.connect(self._took_over)

    # ---- menus ------------------------------------------------------------------------------------
    def fill_examples_menu(self) -> None:
        menu = self.examples_menu
        menu.clear()
        names = opening.list_examples()
        for name in names:
            act = menu.addAction(name)
            act.setObjectName(f"example:{name}")
            act.setToolTip(opening.describe_example(name))
            act.triggered.connect(lambda _=False, n=name: self.open_example(n))
        if not names:
            menu.addAction("(no examples installed)").setEnabled(False)

    def fill_recent_menu(self) -> None:
        menu = self.recent_menu
        menu.clear()
        files = self.settings.recent_files()
        for entry in files:
            act = menu.addAction(entry)
            act.triggered.connect(lambda _=False, e=entry: self.open_path(e))
        if files:
            menu.addSeparator()
            menu.addAction("Clear Recent").triggered.connect(self.settings.clear_recent)
        else:
            menu.addAction("(none)").setEnabled(False)

    # ---- opening ----------------------------------------------------------------------------------
    def may_replace(self) -> bool:
        """Unsaved changes to the document are asked about (Save / Discard / Cancel) before it is
        replaced; False: Cancel, change nothing."""
        return self.host.maybe_discard(document=True)

    def open_example(self, name: str) -> bool:
        if not self.may_replace():
            return False
        try:
            module = opening.load_example(name)
        except opening.OpenError as e:
            self.host.error("Open example", e.message, e.details)
            return False
        self.document.set_model(module, ExampleSource(name))
        self.host.status(f"Opened the example {name}")
        return True

    def open_script(self, spec: str) -> bool:
        """Open `path.py[:factory]`; a script that raises shows its traceback and changes nothing."""
        if not self.may_replace():
            return False
        try:
            source = opening.source_for_script(spec)
            module = opening.load_script(source.path, source.factory)
        except opening.OpenError as e:
            self.host.error("Open model script", e.message, e.details)
            return False
        self.document.set_model(module, source)
        self.settings.add_recent(f"{source.path}:{source.factory}")
        self.host.status(f"Opened {Path(source.path).name}:{source.factory}()")
        return True

    def open_path(self, entry: str) -> bool:
        """Open what a recent-files entry or `--open` names: a project, a script, a Hugging Face
        model folder, a GGUF file, or a checkpoint (which needs an architecture: the dialog asks)."""
        text = str(entry)
        if text.endswith(PROJECT_SUFFIX):
            return self.open_project(text)
        if opening.is_pretrained_folder(text) or opening.is_gguf_file(text):  # a HF folder or GGUF: on a worker
            return self.pretrained.open_folder(text) is not None
        path, _factory = opening.split_script_spec(text)
        if path.suffix.lower() in (".bpk", ".safetensors"):
            dialog = self.ask_open_checkpoint()
            dialog.path.setText(str(path))
            return False
        return self.open_script(text)

    def ask_open_project(self) -> None:
        path = open_file(self.host.dialog_parent(), self.settings, "Open Project", PROJECT_FILTER)
        if path:
            self.open_project(path)

    def ask_open_checkpoint(self) -> CheckpointDialog:
        dialog = CheckpointDialog(self.host.dialog_parent(), examples=opening.list_examples(),
                                  title="Open Checkpoint into Architecture", current=self.current_architecture())
        dialog.chosen.connect(self._open_checkpoint_choice)
        return self.host.open_dialog(dialog)

    def current_architecture(self) -> dict | None:
        """The open model's architecture as the checkpoint dialog names it (None: no model, or one
        from a design)."""
        source = self.document.source
        if isinstance(source, CheckpointSource):
            source = source.architecture
        if isinstance(source, ExampleSource):
            return {"kind": "example", "name": source.name}
        if isinstance(source, ScriptSource):
            return {"kind": "script", "spec": f"{source.path}:{source.factory}"}
        return None

    def _open_checkpoint_choice(self, choice: dict) -> None:
        if not self.may_replace():
            return
        arch = choice["architecture"]
        arch = opening.source_for_script(arch["spec"]) if arch["kind"] == "script" else source_from_json(arch)
        self.open_source(CheckpointSource(choice["path"], arch, choice["allow_partial"]))

    def open_source(self, source: Source, *, edits_: list[Edit] | None = None, contracts_: dict | None = None,
                    project_path: Path | None = None, dirty: bool = False, from_file: bool = False,
                    runs_: list | None = None) -> bool:
        """Make the model a source describes, replay `edits_`, and show it. A checkpoint loads
        and edits replay on a worker (cancellable from the status bar; a cancelled or failed open
        leaves the document as it was); the window stays responsive. `from_file`: the source was
        read from a project file, so a Python file it names runs only once the user confirmed it
        (`confirm_script`). True: the model opened, or its load and replay started."""
        w = self.host
        if isinstance(source, PretrainedSource):  # a Hugging Face folder, opened on a worker (app/pretrained_actions.py)
            return self.pretrained.open_folder(source.path, edits_=edits_, contracts_=contracts_, project_path=project_path,
                                            dirty=dirty, runs_=runs_, ask=False) is not None
        if isinstance(source, OnnxSource):  # the ONNX file imported again on a worker (app/onnx_actions.py)
            return self.onnx.open_source(source, edits_=edits_, contracts_=contracts_, project_path=project_path,
                                      dirty=dirty, runs_=runs_) is not None
        checkpoint = isinstance(source, CheckpointSource)
        # a project's errors name the file first, then the part of it that failed
        where = f"{project_path}: " if project_path is not None else ""
        title = "Open project" if project_path is not None else "Open"
        try:
            base = opening.build(source.architecture if checkpoint else source,
                                 self.confirm_script if from_file else None, trusted=not from_file)
        except opening.OpenError as e:
            w.error(title, f"{where}{'source: ' if where else ''}{e.message}", e.details)
            return False
        replayed = list(edits_ or [])

        def finish(module: Any) -> None:
            self.document.set_model(module, source, edits=edits_, contracts=contracts_, project_path=project_path,
                                    runs=runs_, dirty=dirty)  # the project's runs: a save keeps them

        if not checkpoint and not replayed:
            finish(base)
            return True
        path, partial = (source.path, source.allow_partial) if checkpoint else ("", False)
        reports = []

        def load_and_replay(state):
            module = base
            if checkpoint:
                module, report = checkpoints.load(base, path, partial, state.set_progress)
                reports.append(report)
            try:  # regexes are matched with a time bound (engine.module.group); Cancel stops between edits
                return edits.replay(module, replayed, state.check_cancelled)
            except edits.EditError as e:
                state.check_cancelled()  # cancelled meanwhile: a cancel, not a failure
                raise _ReplayFailed(str(e)) from e

        def loaded(module):
            finish(module)
            if reports:
                show_partial_load(w, reports[0])

        def failed(failure) -> None:
            if isinstance(failure.exception, _ReplayFailed):
                w.error(title, f"{where}the model opened, but replaying its edits failed: {failure.exception}")
                return
            show_load_failure(w, failure, where)  # the checkpoint the project names: it says which project

        task_title = f"Loading {Path(path).name}" if checkpoint else \
            f"Replaying {len(replayed)} edit(s) of {Path(project_path).name if project_path else 'the model'}"
        # the user was asked about the open model before this started; one edited meanwhile is newer
        # work than the open, so the result is dropped rather than replacing it unasked
        doc, was, step = self.document, self.document.module, self.document.undo_stack.index()
        w.tasks.start(BackgroundTask(load_and_replay, title=task_title), loaded, failed, kind="open",
                      valid_while=lambda: doc.module is was and doc.undo_stack.index() == step,
                      dropped=f"{task_title}: the open model was changed meanwhile, so it was kept and "
                              f"{Path(project_path or path).name} was not opened.")
        return True

    def confirm_script(self, path: Path, digest: str) -> bool:
        """Ask before running a Python file a project names; remembered per path and content."""
        if self.settings.script_confirmed(path, digest):
            return True
        answer = QMessageBox.question(
            self.host.dialog_parent(), "Run a Python file?",
            f"This project builds its model by running the Python file\n\n{path}\n\nRunning it can do anything "
            "your account can. Run it only if you trust where it came from. Run this file?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
        if answer != QMessageBox.StandardButton.Yes:
            return False
        self.settings.confirm_script(path, digest)
        return True

    # ---- projects ---------------------------------------------------------------------------------
    def open_project(self, path: str | Path) -> bool:
        """Open a project file; a file that cannot be read shows why and changes nothing."""
        try:
            project = read_project(path)
        except ProjectError as e:
            self.host.error("Open project", str(e))
            return False
        if isinstance(project.source, DesignSource):  # the window asks about the design and the model
            ok = self.open_design(path)
            if ok:
                self.settings.add_recent(str(Path(path).resolve()))
            return ok
        if not self.may_replace():
            return False
        ok = self.open_source(project.source, edits_=project.edits, contracts_=project.contracts,
                              project_path=Path(path), from_file=True, runs_=project.runs)
        if ok:
            self.settings.add_recent(str(Path(path).resolve()))
            self.offer_recovery(Path(path))
        return ok

    def save_project(self) -> bool:
        if self.document.project_path is None:
            return self.save_project_as()
        return self.save_to(self.document.project_path)

    def save_project_as(self) -> bool:
        path = save_file(self.host.dialog_parent(), self.settings, "Save Project", PROJECT_FILTER)
        return bool(path) and self.save_to(Path(path))

    def save_to(self, path: Path) -> bool:
        if self.document.module is None:
            return False
        why = self.onnx.save_refusal()  # weights a project could not bring back: refused, nothing written
        if why:
            self.host.error("Save project", f"{path.name} was not written: {why}")
            return False
        try:
            written = self.document.save_project(path)
        except OSError as e:
            self.host.error("Save project", f"cannot write {path}: {e.strerror or e}")
            return False
        self.remove_autosave()
        self.settings.add_recent(str(written.resolve()))
        self.host.status(f"Saved {written}")
        return True

    # ---- autosave and recovery --------------------------------------------------------------------
    def autosave_path(self) -> Path:
        own = self.document.autosave_path()
        return own if own is not None else self.untitled_autosave()

    def autosave(self) -> bool:
        """Keep a copy of an unsaved document beside it (recovered after a crash)."""
        doc = self.document
        if doc.module is None or not doc.is_dirty():
            return False
        path = self.autosave_path()
        # who wrote it: a project's autosave of a session still running is not offered to another
        data = {**doc.project_data(), "autosave": {"pid": os.getpid(), "session": self.session}}
        try:
            write_json_atomic(path, data)
        except OSError:
            return False
        self._own.add(path)
        return True

    def crashed_autosaves(self) -> list[Path]:
        """Untitled documents' autosaves left by sessions that are no longer running (a crash),
        newest first. This session's own and those of another running Ember are not among them."""
        own = self.untitled_autosave()
        found = []
        for path in own.parent.glob(f"untitled*{AUTOSAVE_SUFFIX}"):
            m = UNTITLED_AUTOSAVE.fullmatch(path.name)
            if m is None or path == own or (m.group(1) and other_process_running(int(m.group(1)))):
                continue
            try:
                found.append((path.stat().st_mtime, path.name, path))
            except OSError:
                continue
        return [path for *_, path in sorted(found, reverse=True)]

    def offer_recoveries(self) -> QMessageBox | None:
        """On every start, whatever was opened: offer, one question after another, the newest
        untitled autosave a crash left and the autosave of each recent project that is newer than
        the project (none that this session offered already, as `--open` does). Returns the first
        question (None: nothing to recover)."""
        pending: list[Path | None] = [None] + [Path(e) for e in self.settings.recent_files() if e.endswith(PROJECT_SUFFIX)]

        def next_offer(_button=None) -> QMessageBox | None:
            while pending:
                project = pending.pop(0)
                if project is not None and project.with_name(project.name + ".autosave").resolve() in self._offered:
                    continue
                box = self.offer_recovery(project)
                if box is not None:
                    box.buttonClicked.connect(next_offer)  # after its answer (connected after `answered`)
                    return box
            return None
        return next_offer()

    def _written_by_running_session(self, auto: Path) -> bool:
        """Whether another Ember still running wrote this autosave (and keeps it up to date)."""
        try:
            data = read_json_file(auto, "autosave")
            pid = data["autosave"]["pid"] if isinstance(data, dict) and isinstance(data.get("autosave"), dict) else None
        except (ProjectError, OSError):
            return False
        return type(pid) is int and 0 < pid < 2 ** 31 and other_process_running(pid)

    def offer_recovery(self, project_path: Path | None = None) -> QMessageBox | None:
        """After a crash: offer the autosave of `project_path` when it is newer than the project, or
        (None) the newest autosave of an untitled document that a session no longer running left.
        Recover opens it unsaved (asking first about unsaved changes to the open model; Cancel
        keeps the copy for the next start); Discard deletes it. Called on every start, whatever
        was opened. An autosave that was not offered is never deleted (`remove_autosave`)."""
        project_path = Path(project_path) if project_path else None
        if project_path is not None:
            auto = project_path.with_name(project_path.name + ".autosave")
            if not auto.is_file():
                return None
            if project_path.is_file() and auto.stat().st_mtime <= project_path.stat().st_mtime:
                return None
            if self._written_by_running_session(auto):
                return None  # that session's work, not a crash's
        else:
            crashed = self.crashed_autosaves()
            if not crashed:
                return None
            auto = crashed[0]  # any others are offered at the next start
        try:
            project = read_project(auto)
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(auto.stat().st_mtime))
        except (ProjectError, OSError):
            return None
        self._offered.add(auto.resolve())
        box = QMessageBox(QMessageBox.Icon.Question, "Recover unsaved changes?",
                          f"Ember kept unsaved changes to {project_path.name if project_path else 'an untitled model'} "
                          f"from {when} ({len(project.edits)} edit(s)). Recover them?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Discard, self.host.dialog_parent())
        box.setObjectName("recovery")
        box.button(QMessageBox.StandardButton.Yes).setText("Recover")

        def answered(button):
            if box.buttonRole(button) != QMessageBox.ButtonRole.YesRole:
                try:
                    auto.unlink(missing_ok=True)
                except OSError as e:
                    self.host.error("Recover unsaved changes", f"cannot delete {auto}: {e.strerror or e}")
                    return
                self._own.discard(auto)
                return
            if not self.may_replace():
                return
            self._recovering.append((auto, project.source))
            if not self.open_source(project.source, edits_=project.edits, contracts_=project.contracts,
                                    project_path=project_path, dirty=True, from_file=True, runs_=project.runs):
                self._recovering = [r for r in self._recovering if r[0] != auto]

        box.buttonClicked.connect(answered)
        box.open()
        self.host.last_message = box
        return box

    def _took_over(self) -> None:
        """The document changed: a recovered autosave that it now holds is this session's to keep
        (in its own autosave from now on, the crashed session's copy removed once that is written)."""
        pending, self._recovering = self._recovering, []
        doc = self.document
        for auto, source in pending:
            # only a recovery opens a document dirty (a folder's source is made again, so its kind is compared)
            if not (doc.is_dirty() and type(doc.source) is type(source)):
                continue  # the open failed or was dropped: the copy stays for the next start
            self._own.add(auto)
            if self.autosave() and self.autosave_path() != auto:
                try:
                    auto.unlink(missing_ok=True)
                except OSError:
                    continue  # still this session's: removed with its own at the save or a clean quit
                self._own.discard(auto)

    def untitled_autosave(self) -> Path:
        """This session's autosave of an untitled document (in the settings folder)."""
        return Path(self.settings.q.fileName()).parent / f"untitled-{self.session}{AUTOSAVE_SUFFIX}"

    def remove_autosave(self) -> None:
        """Delete the autosaves this session wrote or took over from a crashed one (the document
        was saved, or the window closes with nothing unsaved or after the user was asked; those of
        documents it replaced were asked about then). An autosave this session was not offered,
        another session's, crashed or running, is never touched."""
        for path in sorted(self._own):
            try:
                path.unlink(missing_ok=True)
            except OSError:
                continue
            self._own.discard(path)
