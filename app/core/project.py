"""Project files on disk: one `.ember.json` holding a `schema.Project`, written atomically and
read with every field checked (a `ProjectError` names the file, the field, what was expected
and what was found)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from engine.store.atomic import atomic_write_text

from .schema import Project, SchemaError

PROJECT_SUFFIX = ".ember.json"


class ProjectError(ValueError):
    """A project file that cannot be read: says which file and what was wrong."""


def write_json_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_project(path: str | os.PathLike) -> Project:
    """Read and validate a project file; a `ProjectError` says what is wrong and where."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProjectError(f"{path}: no such project file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProjectError(f"{path}: not a project file (expected JSON): {e}") from None
    if not isinstance(data, dict):
        raise ProjectError(f"{path}: expected a JSON object at the top, found {type(data).__name__}")
    try:
        return Project.from_json(data)
    except SchemaError as e:
        raise ProjectError(f"{path}: {e}") from None
