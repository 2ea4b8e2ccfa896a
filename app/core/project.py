"""Project files on disk: one `.ember.json` holding a `schema.Project`, written atomically and
read with every field checked (a `ProjectError` names the file, the field, what was expected
and what was found)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from engine.design.design_schema import read_json_file as _read_json_file
from engine.store.atomic import atomic_write_text

from dataclasses import replace

from .schema import (CheckpointSource, LoadEdit, OnnxSource, PeftEdit, PretrainedSource, Project, SchemaError,
                     ScriptSource)

PROJECT_SUFFIX = ".ember.json"


class ProjectError(ValueError):
    """A project file that cannot be read: says which file and what was wrong."""


def write_json_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json_file(path: str | os.PathLike, what: str = "project file", error: type = None) -> object:
    """Parse a project or design file with bounded size, nesting and numbers, each key once and no
    NaN (`engine.design.design_schema.read_json_file`); every problem is `error` (default
    `ProjectError`) naming the file."""
    return _read_json_file(path, what, error or ProjectError)


def read_project(path: str | os.PathLike) -> Project:
    """Read and validate a project file; a `ProjectError` says what is wrong and where.
    Relative paths in it (sources, loaded weights, run folders) are resolved against its folder."""
    path = Path(path)
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise ProjectError(f"{path}: expected a JSON object at the top, found {type(data).__name__}")
    try:
        project = Project.from_json(data)
    except SchemaError as e:
        raise ProjectError(f"{path}: {e}") from None
    except (RecursionError, ValueError, TypeError) as e:
        raise ProjectError(f"{path}: not a valid project: {type(e).__name__}: {e}") from None
    return with_paths(project, lambda p: _absolute(p, path.parent))


# ---- paths relative to the project file ----------------------------------------------------------
def _absolute(text: str, base: Path) -> str:
    if not text or os.path.isabs(text):
        return text
    return os.path.normpath(str(base / text))


def _relative(text: str, base: Path) -> str:
    if not text or not os.path.isabs(text):
        return text
    try:
        return Path(os.path.relpath(text, base)).as_posix()
    except ValueError:  # another drive (Windows)
        return text


def with_paths(project: Project, convert) -> Project:
    """The project with `convert` applied to every file path it holds: script and checkpoint
    sources, Hugging Face folders, ONNX files, load edits and run folders (designs hold none)."""
    def source(s):
        if isinstance(s, (ScriptSource, PretrainedSource, OnnxSource)):
            return replace(s, path=convert(s.path))
        if isinstance(s, CheckpointSource):
            return replace(s, path=convert(s.path), architecture=source(s.architecture))
        return s

    edits = [replace(e, path=convert(e.path)) if isinstance(e, (LoadEdit, PeftEdit)) else e
             for e in project.edits]
    runs = [replace(r, folder=convert(r.folder)) for r in project.runs]
    return Project(source(project.source), edits, dict(project.contracts), runs)


def project_data_at(project: Project, path: str | os.PathLike) -> dict:
    """The JSON of `project` saved at `path`: its file paths relative to the project's folder, so
    a moved or copied project folder opens whole."""
    base = Path(os.path.abspath(Path(path).parent))
    return with_paths(project, lambda p: _relative(p, base)).to_json()
