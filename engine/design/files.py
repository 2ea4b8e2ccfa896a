"""Design files (`.ember.json`), schema versions and their migration, autosave and recovery.

A design file is an Ember project whose model comes from a design graph, so the app opens it
like any project and a project saved from a design-built model is a design file:

    {"format": 1, "application": "ember",
     "source": {"kind": "design", "schema_version": 2, "design": {"name": ..., "nodes": [...], "edges": [...]}},
     "edits": [], "contracts": {}, "runs": []}

Schema history (`source.schema_version`):

1. the first draft: a bare file `{"ember_design": 1, "name", "nodes": {name: {"type", "params",
   "x", "y"}}, "links": [[src, dst] or [src, dst, dst_port]]}`. A link ran from the source's
   first output port to the destination's first input port unless it named the port.
2. the current form above: nodes in a list (order kept), `kind` / `config` / `position`, edges
   with both ports named; the design sits inside a project file.

`read_design` reads either and migrates; `save_design` always writes the current schema,
atomically (a temporary file beside the target, flushed, then renamed over it), with sorted
keys nowhere changed so that a saved file reads back and saves to the very same bytes.

Autosave: `write_autosave(dir, design, original)` keeps a copy of unsaved edits in `dir`
(atomically, one file per editing session); `list_autosaves(dir)` finds the copies left behind
by sessions that are no longer running (a crash), newest first; `Recovery.design()` gives the
design back; `discard_autosave(path)` removes one.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..store.atomic import atomic_write_text
from .design_schema import DesignFileError, DesignSchemaError, check_bare, check_source, read_json_file
from .fields import FieldError
from .graph import Design, DesignError

__all__ = [
    "SCHEMA_VERSION", "DESIGN_SUFFIX", "DesignFileError", "design_source", "design_from_source", "design_to_json",
    "read_design", "save_design", "migrate", "is_design_data", "Recovery", "write_autosave", "list_autosaves",
    "discard_autosave", "autosave_path", "other_process_running",
]

SCHEMA_VERSION = 2
DESIGN_SUFFIX = ".ember.json"
PROJECT_FORMAT = 1  # the app's project file format the design file is written in
AUTOSAVE_SUFFIX = ".ember-design.autosave"


# ---------------------------------------------------------------------------------- the data
def design_source(design: Design) -> dict:
    """The project `source` of a design-built model: `{"kind": "design", "schema_version", "design"}`."""
    return {"kind": "design", "schema_version": SCHEMA_VERSION, "design": design.to_dict()}


def design_to_json(design: Design) -> dict:
    """The whole design file's content."""
    return {"format": PROJECT_FORMAT, "application": "ember", "source": design_source(design), "edits": [],
            "contracts": {}, "runs": []}


def is_design_data(data) -> bool:
    """Whether parsed JSON is a design file of any schema (current or older)."""
    if not isinstance(data, dict):
        return False
    if "ember_design" in data:
        return True
    src = data.get("source")
    return isinstance(src, dict) and src.get("kind") == "design"


def migrate(data: dict, where: str = "design") -> dict:
    """The current-schema `source` dict for design data of any schema version, checked against the
    design schema (`design_schema`) first: a `DesignFileError` names the key and what was expected."""
    if not isinstance(data, dict):
        raise DesignFileError(f"{where}: expected a JSON object, found {type(data).__name__}")
    if "ember_design" in data:
        version = data["ember_design"]
        if type(version) is not int or version != 1:
            raise DesignFileError(f"{where}: a bare design file must be schema 1, found {version!r}")
        check_bare(data, where)
        return {"kind": "design", "schema_version": SCHEMA_VERSION, "design": _migrate_1_to_2(data, where)}
    project = "source" in data
    src = data.get("source") if project else data
    if not isinstance(src, dict) or src.get("kind") != "design":
        raise DesignFileError(f"{where}: not a design (expected a project whose source kind is 'design')")
    version = src.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise DesignFileError(f"{where}: 'schema_version' must be an integer, found {version!r}")
    if version > SCHEMA_VERSION:
        raise DesignFileError(f"{where}: design schema {version} is newer than this app reads "
                              f"(up to {SCHEMA_VERSION}); update Ember to open it")
    if version < 1:
        raise DesignFileError(f"{where}: unknown design schema {version}")
    check_source(src, f"{where}: source" if project else where)
    design = src.get("design")
    if version == 1:
        design = _migrate_1_to_2(design, where)
    return {"kind": "design", "schema_version": SCHEMA_VERSION, "design": design}


def _migrate_1_to_2(old, where: str) -> dict:
    if not isinstance(old, dict) or not isinstance(old.get("nodes"), dict):
        raise DesignFileError(f"{where}: a schema-1 design needs 'nodes' as a mapping of name to node")
    from .catalog import UnknownKind, spec_for  # noqa: PLC0415

    nodes = []
    for name, nd in old["nodes"].items():
        if not isinstance(nd, dict) or "type" not in nd:
            raise DesignFileError(f"{where}: schema-1 node {name!r} needs a 'type'")
        nodes.append({"name": name, "kind": nd["type"], "config": dict(nd.get("params") or {}),
                      "position": [nd.get("x", 0), nd.get("y", 0)]})
    kinds = {n["name"]: n["kind"] for n in nodes}
    edges = []
    for i, link in enumerate(old.get("links", [])):
        if not isinstance(link, list) or len(link) not in (2, 3):
            raise DesignFileError(f"{where}: schema-1 link #{i} must be [src, dst] or [src, dst, port], got {link!r}")
        src, dst = link[0], link[1]
        for n in (src, dst):
            if n not in kinds:
                raise DesignFileError(f"{where}: schema-1 link #{i} names an unknown node {n!r}")
        try:
            s_spec, d_spec = spec_for(kinds[src]), spec_for(kinds[dst])
        except UnknownKind as e:
            raise DesignFileError(f"{where}: {e}") from None
        cfg = next(n["config"] for n in nodes if n["name"] == dst)
        d_ports = d_spec.input_ports({**d_spec.defaults(), **cfg})
        s_cfg = next(n["config"] for n in nodes if n["name"] == src)
        s_ports = s_spec.output_ports({**s_spec.defaults(), **s_cfg})
        if not s_ports or not d_ports:
            raise DesignFileError(f"{where}: schema-1 link #{i} ({src} -> {dst}) joins nodes without ports")
        edges.append({"from": src, "from_port": s_ports[0], "to": dst,
                      "to_port": link[2] if len(link) == 3 else d_ports[0]})
    return {"name": old.get("name", "Model"), "nodes": nodes, "edges": edges}


def design_from_source(source: dict, where: str = "design") -> Design:
    """The design a project source (of any schema version) holds; `DesignFileError` says what is
    wrong and where."""
    src = migrate(source, where)
    try:
        return Design.from_dict(src["design"])
    except (DesignError, FieldError) as e:
        raise DesignFileError(f"{where}: {e}") from None
    except (TypeError, ValueError, KeyError, RecursionError) as e:  # a value the schema let by and a layer refused
        raise DesignFileError(f"{where}: not a valid design: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------- files
def read_design(path) -> Design:
    """Read a design file of any schema version; `DesignFileError` says what is wrong and where.
    The file is read bounded (size, nesting, numbers) and checked against the design schema
    before any of it is used; nothing in it is run."""
    path = Path(path)
    data = read_json_file(path, "design file", DesignFileError)
    if not is_design_data(data):
        raise DesignFileError(f"{path}: not a design file (a project whose model comes from "
                              f"{_kind_of(data)}, not from a design graph)")
    return design_from_source(data, str(path))


def _kind_of(data) -> str:
    src = data.get("source") if isinstance(data, dict) else None
    if isinstance(src, dict):
        kind = src.get("kind")
        if isinstance(kind, str):
            return f"a {kind[:60]!r} source"
        return "a source of no known kind"
    return "somewhere else"


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_atomic(path, text: str) -> None:
    """Write `text` to `path` atomically (temporary file beside it, fsync, rename)."""
    atomic_write_text(path, text, error=DesignFileError)


def save_design(design: Design, path) -> Path:
    """Save atomically (`.ember.json` appended when missing); returns the path written."""
    path = Path(path)
    if not path.name.endswith(DESIGN_SUFFIX):
        path = path.with_name(path.name + DESIGN_SUFFIX)
    write_atomic(path, dumps(design_to_json(design)))
    return path


# ---------------------------------------------------------------------------------- autosave
@dataclass(frozen=True)
class Recovery:
    """An autosaved copy left by an editing session that did not end cleanly."""

    path: Path
    original: str | None
    saved_at: float
    pid: int
    data: dict

    def design(self) -> Design:
        return design_from_source(self.data, str(self.path))

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.saved_at))
        what = Path(self.original).name if self.original else "an unsaved design"
        return f"{what}, autosaved {when}"


def autosave_path(directory, session: str) -> Path:
    """Where the editing session `session` keeps its autosave in `directory`."""
    return Path(directory) / f"{session}{AUTOSAVE_SUFFIX}"


def write_autosave(directory, session: str, design: Design, original=None) -> Path:
    """Keep a copy of the design's unsaved state (atomically); returns the autosave file."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = autosave_path(d, session)
    record = {"ember": "design-autosave", "pid": os.getpid(), "saved_at": time.time(),
              "original": str(original) if original else None, "source": design_source(design)}
    write_atomic(path, dumps(record))
    return path


def discard_autosave(path) -> None:
    try:
        Path(path).unlink()
    except FileNotFoundError:
        pass


def other_process_running(pid: int) -> bool:
    """Whether another process with this id is running (an editing session that has not ended; this
    process's own id counts as ended, so its earlier sessions' copies are found). On Windows, where
    `os.kill(pid, 0)` would send Ctrl+C, every other session counts as ended."""
    if pid == os.getpid() or not 0 < pid < 2 ** 31 or os.name == "nt":
        return False  # our own earlier session's copy is never "another running editor"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def list_autosaves(directory, include_running: bool = False) -> list[Recovery]:
    """Autosaves in `directory` from sessions no longer running (unless `include_running`), newest
    first. Unreadable copies are skipped."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for p in d.glob(f"*{AUTOSAVE_SUFFIX}"):
        try:
            rec = read_json_file(p, "design autosave", DesignFileError)  # bounded, as any design file
            if not isinstance(rec, dict) or rec.get("ember") != "design-autosave":
                continue
            pid = int(rec.get("pid", 0))
            if not include_running and other_process_running(pid):
                continue
            out.append(Recovery(p, rec.get("original"), float(rec.get("saved_at", 0.0)), pid, rec["source"]))
        except (OSError, ValueError, KeyError, TypeError, OverflowError):  # DesignFileError is a ValueError
            continue
    return sorted(out, key=lambda r: -r.saved_at)
