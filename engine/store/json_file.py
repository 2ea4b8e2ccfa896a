"""Bounded JSON files: what a model folder's config.json, an index, adapter_config.json,
tokenizer_config.json are read with.

    doc = read_json(path, limit, "config.json")          # RecordError naming the file
    doc = read_json(path, limit, "config.json", error=MyError)  # MyError(where, message)

At most `limit` bytes (the size checked before reading), UTF-8, no
NaN / Infinity, integers of ordinary size, nested at most MAX_JSON_DEPTH levels -- checked by a walk
that does not recurse, since whatever the parser accepts deeper would reach recursive code later
(json.dumps on save, copies)."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import RecordError
from .filesource import FileSource

__all__ = ["MAX_JSON_DEPTH", "read_json", "read_limited", "parse_json"]

MAX_JSON_DEPTH = 64  # a configuration nests a few levels


def _record_error(where, message):
    return RecordError(message, where=str(where) if where is not None else None)


def read_json(path: Path, limit: int, what: str, error=_record_error):
    """The JSON document of the file `path` (see the module docstring); every problem is
    `error(where, message)`, raised."""
    return parse_json(read_limited(Path(path), limit, what, error), path, what, error)


def read_limited(path: Path, limit: int, what: str, error=_record_error) -> bytes:
    """The bytes of the file `path`, at most `limit` (its size checked before reading)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise error(path, f"cannot read {what}: {exc.strerror or exc}") from None
    if size > limit:
        raise error(path, f"{what} of {size} bytes exceeds the limit of {limit} bytes")
    try:
        with FileSource(path, str(path)) as src:
            raw = src.read_bytes(0, limit + 1)
    except RecordError as exc:
        raise error(exc.where or path, exc.reason) from None
    if len(raw) > limit:
        raise error(path, f"{what} exceeds the limit of {limit} bytes")
    return raw


def parse_json(raw: bytes, where, what: str, error=_record_error):
    """`raw` parsed as `read_json` does (see there)."""
    deep = f"{what}: nested deeper than {MAX_JSON_DEPTH} levels; a configuration nests a few"
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:  # the C parser counts its nesting against the interpreter's stack
        raise error(where, deep) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of thousands of digits
        raise error(where, f"{what}: not valid JSON: {exc}") from None
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if items is None:
            continue
        if depth > MAX_JSON_DEPTH:
            raise error(where, deep)
        stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))
    return doc


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")
