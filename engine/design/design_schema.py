"""The typed schema of design data, checked before anything in it is trusted, and a bounded
JSON reader for the files Ember writes (projects and designs).

`check_source(data, where)` validates a project source of kind "design" (schema 1 or 2) and
`check_bare(data, where)` a bare schema-1 design file: every key has the type it must have,
every text and list is bounded, every node kind is one the catalog knows, every number is
finite. Nothing is evaluated, imported or looked up on disk: a design names layers of
`engine.nn` by their class names only, so a node kind such as `../../evil.py` or a key such as
`script` is refused here with the place it was found (`source.design.nodes[2].kind`).
A fault raises `DesignSchemaError(where, expected, found)`, a `DesignFileError`.

`read_json_file(path, what, error)` parses a JSON file with its size, nesting and numbers
bounded (a file nested 100,000 deep never reaches the recursive parser; an integer of 4,300
digits, NaN, Infinity and a key given twice in one object are refused).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["DesignFileError", "DesignSchemaError", "check_source", "check_bare", "check_design", "read_json_file", "MAX_JSON_BYTES",
           "MAX_JSON_DEPTH", "MAX_NODES", "MAX_EDGES"]

SCHEMA_VERSIONS = (1, 2)
MAX_NODES = 10_000
MAX_EDGES = 100_000
MAX_NAME = 256  # node, port, kind and design names
MAX_TEXT = 4096  # a text in a configuration
MAX_LIST = 1024  # a list in a configuration (dims, sizes, paddings)
MAX_INT = 1 << 53  # an integer in a configuration: beyond this no size is real
MAX_COORD = 1e9  # a canvas coordinate
MAX_PORTS = 256  # the inputs of an Add or Concat: each is a port on the canvas


class DesignFileError(ValueError):
    """A design file that cannot be read: names the file and what was wrong."""


class DesignSchemaError(DesignFileError):
    """Design data that does not fit the schema: where, what was expected and what was found."""

    def __init__(self, where: str, expected: str, found: Any):
        self.where = where
        self.expected = expected
        self.found = found if isinstance(found, _Said) else _show(found)
        super().__init__(f"{where}: expected {expected}, found {self.found}")


class _Said(str):
    """A `found` already in words."""


_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "nothing (the key is missing)"
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value):,} characters)"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10 ** 18 else f"an integer of {len(str(abs(value))):,} digits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return f"a list of {len(value):,} item(s)"
    if isinstance(value, dict):
        return f"an object of {len(value):,} key(s)"
    return type(value).__name__


def _object(value: Any, where: str, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise DesignSchemaError(where, "an object", value)
    extra = [k for k in value if k not in keys]
    if extra:
        raise DesignSchemaError(f"{where}.{extra[0]}" if isinstance(extra[0], str) else where,
                                f"only the keys {', '.join(keys)}", _Said(f"the unknown key {extra[0]!r}"))
    for k in required:
        if k not in value:
            raise DesignSchemaError(f"{where}.{k}", _EXPECT.get(k, "a value"), _MISSING)
    return value


_EXPECT = {"name": "a name (text)", "kind": "a node kind (text)", "nodes": "a list of nodes",
           "design": "a design object", "schema_version": "a design schema version (1 or 2)",
           "from": "a node name (text)", "to": "a node name (text)", "from_port": "a port name (text)",
           "to_port": "a port name (text)", "type": "a node kind (text)"}


def _text(value: Any, where: str, expected: str, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str):
        raise DesignSchemaError(where, expected, value)
    if len(value) > limit:
        raise DesignSchemaError(where, f"{expected} of at most {limit:,} characters",
                                _Said(f"{len(value):,} characters"))
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise DesignSchemaError(where, f"{expected} of valid unicode text", value) from None
    if "\x00" in value:
        raise DesignSchemaError(where, f"{expected} without NUL characters", value)
    return value


def _list(value: Any, where: str, expected: str, limit: int) -> list:
    if not isinstance(value, list):
        raise DesignSchemaError(where, expected, value)
    if len(value) > limit:
        raise DesignSchemaError(where, f"{expected} of at most {limit:,} items", _Said(f"{len(value):,} items"))
    return value


def _number(value: Any, where: str, expected: str, limit: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DesignSchemaError(where, expected, value)
    if isinstance(value, int) and abs(value) > MAX_INT or not math.isfinite(value) or abs(value) > limit:
        raise DesignSchemaError(where, f"{expected} (finite, at most {limit:g} in size)", value)
    return value


def _kind(value: Any, where: str) -> str:
    from .catalog import catalog  # noqa: PLC0415 - the catalog imports engine.nn; only when a design is read

    text = _text(value, where, "a node kind (text)")
    if text not in catalog():
        raise DesignSchemaError(where, "a node kind: a layer of engine.nn by its class name (Linear, Conv2d, ...) "
                                "or a structural node (Input, Output, Add, Concat, Reshape, Flatten, Split, Op)",
                                _Said(f"the unknown node kind {text[:60]!r}"))
    return text


def _value(value: Any, where: str, depth: int = 0) -> None:
    """A configuration value: a number, text, true/false, null, or a (short, shallow) list of them."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        _number(value, where, "a number", float(MAX_INT))
    elif isinstance(value, str):
        _text(value, where, "a text", MAX_TEXT)
    elif isinstance(value, list) and depth < 2:
        _list(value, where, "a list", MAX_LIST)
        for i, v in enumerate(value):
            _value(v, f"{where}[{i}]", depth + 1)
    else:
        raise DesignSchemaError(where, "a number, a text, true/false, null or a list of those", value)


def _config(value: Any, where: str, kind: str) -> None:
    if not isinstance(value, dict):
        raise DesignSchemaError(where, f"the {kind} node's configuration (an object of field -> value)", value)
    if len(value) > 64:
        raise DesignSchemaError(where, "a configuration of at most 64 fields", _Said(f"{len(value):,} fields"))
    from .catalog import spec_for  # noqa: PLC0415

    fields = [f.name for f in spec_for(kind).fields]
    for key, v in value.items():
        _text(key, where, "field names (text)")
        if key not in fields:
            raise DesignSchemaError(f"{where}.{key[:60]}", f"a field of {kind} ({', '.join(fields) or 'none'})",
                                    _Said(f"the unknown field {key[:60]!r}"))
        _value(v, f"{where}.{key}")
    inputs = value.get("inputs")
    if kind in ("Add", "Concat") and isinstance(inputs, int) and not isinstance(inputs, bool) \
            and not 2 <= inputs <= MAX_PORTS:
        raise DesignSchemaError(f"{where}.inputs", f"a number of inputs from 2 to {MAX_PORTS}", inputs)
    if kind == "Op":
        _op_config(value, where)


MAX_OP_ELEMENTS = 1 << 31  # elements in one constant of an Op node


def _op_config(value: dict, where: str) -> None:
    """The primitive-op node's fields: a known op, input ports in range, operands and constants that parse."""
    from .primitive import PRIMITIVE_OPS, OpError, check_op_settings, parse_constants, parse_operands  # noqa: PLC0415

    op = value.get("op", "Identity")
    if op not in PRIMITIVE_OPS:
        raise DesignSchemaError(f"{where}.op", f"a primitive op ({', '.join(PRIMITIVE_OPS)})", op)
    inputs = value.get("inputs", 1)
    if isinstance(inputs, bool) or not isinstance(inputs, int) or not 0 <= inputs <= MAX_PORTS:
        raise DesignSchemaError(f"{where}.inputs", f"a number of input ports from 0 to {MAX_PORTS}", inputs)
    try:
        operands = parse_operands(value.get("operands", "in0"))
    except OpError as e:
        raise DesignSchemaError(f"{where}.operands", "operands such as 'in0,c0' (inN an input port, cK a constant)",
                                _Said(str(e))) from None
    try:
        constants = parse_constants(value.get("constants", ""))
    except OpError as e:
        raise DesignSchemaError(f"{where}.constants", "constants such as 'float32[2,3];int64[]'", _Said(str(e))) \
            from None
    for i, (_dtype, dims) in enumerate(constants):
        n = math.prod(dims)
        if n > MAX_OP_ELEMENTS:
            raise DesignSchemaError(f"{where}.constants", f"constants of at most {MAX_OP_ELEMENTS:,} elements",
                                    _Said(f"constant c{i} of dims {list(dims)} ({n:,} elements)"))
    try:
        check_op_settings(op, value.get("mode", ""), value.get("starts"), value.get("ends"))
    except (OpError, TypeError, ValueError) as e:
        raise DesignSchemaError(f"{where}.mode", f"settings {op} takes", _Said(str(e))) from None
    for t in operands:
        if t is None:
            continue
        limit = inputs if t[0] == "in" else len(constants)
        if t[1] >= limit:
            what = "input port" if t[0] == "in" else "constant"
            raise DesignSchemaError(f"{where}.operands", f"operands naming the node's {limit} {what}(s)",
                                    _Said(f"{t[0]}{t[1]}"))


def _position(value: Any, where: str) -> None:
    _list(value, where, "a position [x, y]", 2)
    if len(value) != 2:
        raise DesignSchemaError(where, "a position [x, y]", value)
    for i, v in enumerate(value):
        _number(v, f"{where}[{i}]", "a coordinate (a number)", MAX_COORD)


def check_design(data: Any, where: str = "design") -> dict:
    """A schema-2 design: `{"name", "nodes": [{name, kind, config, position}], "edges": [{from, from_port, to,
    to_port}]}`."""
    data = _object(data, where, ("name", "nodes", "edges"))
    if "name" in data:
        _text(data["name"], f"{where}.name", "a class name (text)")
    nodes = _list(data.get("nodes", []), f"{where}.nodes", "a list of nodes", MAX_NODES)
    for i, node in enumerate(nodes):
        at = f"{where}.nodes[{i}]"
        _object(node, at, ("name", "kind", "config", "position"), ("name", "kind"))
        _text(node["name"], f"{at}.name", "a node name (text)")
        kind = _kind(node["kind"], f"{at}.kind")
        if node.get("config") is not None:
            _config(node["config"], f"{at}.config", kind)
        if node.get("position") is not None:
            _position(node["position"], f"{at}.position")
    edges = _list(data.get("edges", []), f"{where}.edges", "a list of edges", MAX_EDGES)
    for i, edge in enumerate(edges):
        at = f"{where}.edges[{i}]"
        keys = ("from", "from_port", "to", "to_port")
        _object(edge, at, keys, keys)
        for k in keys:
            _text(edge[k], f"{at}.{k}", _EXPECT[k])
    return data


def check_bare(data: Any, where: str = "design") -> dict:
    """A schema-1 design (a bare file, or the design of a schema-1 source): `{"ember_design": 1, "name",
    "nodes": {name: {"type", "params", "x", "y"}}, "links": [[src, dst] or [src, dst, port]]}`."""
    data = _object(data, where, ("ember_design", "name", "nodes", "links"), ("nodes",))
    if "name" in data:
        _text(data["name"], f"{where}.name", "a class name (text)")
    nodes = data["nodes"]
    if not isinstance(nodes, dict):
        raise DesignSchemaError(f"{where}.nodes", "an object of node name -> node (schema 1)", nodes)
    if len(nodes) > MAX_NODES:
        raise DesignSchemaError(f"{where}.nodes", f"at most {MAX_NODES:,} nodes", _Said(f"{len(nodes):,} nodes"))
    for name, node in nodes.items():
        at = f"{where}.nodes[{name[:60]!r}]"
        _text(name, at, "a node name (text)")
        _object(node, at, ("type", "params", "x", "y"), ("type",))
        kind = _kind(node["type"], f"{at}.type")
        if node.get("params") is not None:
            _config(node["params"], f"{at}.params", kind)
        for k in ("x", "y"):
            if k in node:
                _number(node[k], f"{at}.{k}", "a coordinate (a number)", MAX_COORD)
    links = _list(data.get("links", []), f"{where}.links", "a list of links", MAX_EDGES)
    for i, link in enumerate(links):
        at = f"{where}.links[{i}]"
        if not isinstance(link, list) or len(link) not in (2, 3):
            raise DesignSchemaError(at, "a link [source, destination] or [source, destination, port]", link)
        for j, v in enumerate(link):
            _text(v, f"{at}[{j}]", "a node or port name (text)")
    return data


def check_source(data: Any, where: str = "source") -> dict:
    """A project source of kind "design": `{"kind": "design", "schema_version": 1 or 2, "design": {...}}`."""
    data = _object(data, where, ("kind", "schema_version", "design"), ("kind", "schema_version", "design"))
    if data["kind"] != "design":
        raise DesignSchemaError(f"{where}.kind", "'design'", data["kind"])
    version = data["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version not in SCHEMA_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > max(SCHEMA_VERSIONS)
        raise DesignSchemaError(f"{where}.schema_version", "a design schema version this app reads (1 or 2"
                                + ("; update Ember to open a newer one)" if newer else ")"), version)
    if version == 1:
        check_bare(data["design"], f"{where}.design")
    else:
        check_design(data["design"], f"{where}.design")
    return data


# ---- bounded JSON files ---------------------------------------------------------------------------
# A project or design file is a few kilobytes; one this large is not one (and would stall the window).
MAX_JSON_BYTES = 16 << 20
# How deep JSON may nest: a project is about 6 levels deep, a design about 8.
MAX_JSON_DEPTH = 64


def _depth_ok(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether no bracket in the JSON text nests deeper than `limit` (strings skipped), checked
    before parsing so that a file nested 100,000 deep never reaches the recursive parser."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


class _Refused(ValueError):
    pass


def _no_duplicates(pairs: list) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Refused(f"the key {key[:60]!r} given twice in one object (which one counts is ambiguous)")
        seen[key] = value
    return seen


def _no_constant(name: str):
    raise _Refused(f"{name}, which is not a JSON number")


def read_json_file(path: str | os.PathLike, what: str = "design file", error: type = None) -> object:
    """Parse a project or design file with bounded size, nesting and numbers, no duplicate keys and
    no NaN or Infinity; every problem is `error` (default `DesignFileError`) naming the file."""
    error = error or DesignFileError
    path = Path(path)
    shown = str(path) if len(str(path)) <= 200 else str(path)[:100] + "…" + str(path)[-60:]
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise error(f"{shown}: not a {what} (expected a regular file)")
        if size > MAX_JSON_BYTES:
            raise error(f"{shown}: not a {what} (expected at most {MAX_JSON_BYTES >> 20} MiB of JSON, "
                        f"found {size / (1 << 20):.0f} MiB)")
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise error(f"{shown}: not a {what} (expected at most {MAX_JSON_BYTES >> 20} MiB of JSON)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise error(f"{shown}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{shown}: a folder, expected a {what}") from None
    except UnicodeDecodeError as e:
        raise error(f"{shown}: not a {what} (expected UTF-8 JSON): {e}") from None
    except (OSError, ValueError) as e:  # a name too long, a NUL in the name
        raise error(f"{shown}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    if not _depth_ok(text):
        raise error(f"{shown}: not a {what} (expected JSON nested at most {MAX_JSON_DEPTH} levels deep)")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Refused as e:
        raise error(f"{shown}: not a {what} (expected JSON with each key once and finite numbers): found {e}") \
            from None
    except json.JSONDecodeError as e:
        raise error(f"{shown}: not a {what} (expected JSON): {e}") from None
    except (ValueError, RecursionError) as e:  # an integer of thousands of digits; nesting past the check
        raise error(f"{shown}: not a {what} (expected JSON with numbers of ordinary size): {e}") from None
