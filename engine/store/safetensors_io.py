"""safetensors read and write, with the same hardening as the burnpack reader.

Layout: an 8-byte little-endian header length N, N bytes of JSON
`{"__metadata__": {text: text}, name: {"dtype", "shape", "data_offsets": [start, end]}}`,
then the tensors' bytes (offsets relative to the end of the header). The header is parsed
here rather than by the `safetensors` package so that every malformed input ends in a
`RecordError` (shapes NumPy cannot hold included, checked before any array is made) and so
that files are read through `filesource.FileSource` like burnpacks; files written here are read by
`safetensors.numpy` and the other way round (tests check both directions).

Entries use the burnpack dtype names of `burnpack.py` ("F32", "BF16" as raw uint16,
"Bool(Native)" for safetensors' BOOL, ...), so one record type serves both formats.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np

from .burnpack import (MAX_TENSOR_BYTES, MAX_TENSORS, Burnpack, Plan, Planned, check_ranges, check_shape, entries,
                       storage_dtype, views)
from .filesource import MAX_DIMS
from .errors import RecordError

MAX_HEADER_SIZE = 100_000_000  # the safetensors library's own limit
MAX_JSON_ITEMS = 3_000_000

_TO_BURN = {
    "F64": "F64", "F32": "F32", "F16": "F16", "BF16": "BF16",
    "I64": "I64", "I32": "I32", "I16": "I16", "I8": "I8",
    "U64": "U64", "U32": "U32", "U16": "U16", "U8": "U8",
    "BOOL": "Bool(Native)",
}
_FROM_BURN = {v: k for k, v in _TO_BURN.items()}
_ITEMSIZE = {b: storage_dtype(b).itemsize for b in _TO_BURN.values()}  # bytes per stored element
_INT = {int}  # the set of a header list's item types when each is an int (a bool's type is bool)
_FROM_BURN["Flex32"] = "F32"


def _fail(where, message):
    raise RecordError(message, where=where)


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def head_length(first: bytes, size: int, where: str = "bytes") -> int:
    """How many leading bytes `plan` needs (the length field and the JSON header), from the
    first 8 bytes of a file of `size` bytes."""
    if size < 8 or len(first) < 8:
        _fail(where, f"too short for safetensors: an 8-byte header length expected, found {size} bytes")
    (hlen,) = struct.unpack_from("<Q", first, 0)
    if hlen > MAX_HEADER_SIZE:
        _fail(where, f"safetensors header length {hlen} exceeds the {MAX_HEADER_SIZE}-byte limit")
    if 8 + hlen > size:
        _fail(where, f"truncated: the header announces {hlen} bytes, the file has {size - 8} after the length")
    return 8 + hlen


def plan(buf, size: int | None = None, where: str = "bytes") -> Plan:
    """Parse and validate a safetensors header; `buf` holds at least `head_length` bytes,
    `size` is the whole file's length (default len(buf)). No tensor data is read."""
    n = len(buf) if size is None else size
    data_start = head_length(bytes(memoryview(buf)[:8]), n, where)
    raw = bytes(memoryview(buf)[8:data_start])
    if not raw.lstrip().startswith(b"{"):
        _fail(where, "safetensors header: a JSON object expected")
    if raw.count(b",") + raw.count(b":") > 2 * MAX_JSON_ITEMS:
        _fail(where, f"safetensors header holds more than {MAX_JSON_ITEMS} items")
    # each tensor's descriptor has a "data_offsets" key: a header of more tensors than the limit is
    # refused in the time of a byte count, before the JSON is parsed
    described = raw.count(b'"data_offsets"')
    if described > MAX_TENSORS:
        _fail(where, f"{described} tensors exceed the limit of {MAX_TENSORS} (refused before parsing the header)")
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        _fail(where, f"safetensors header is not valid JSON: {exc}")
    if not isinstance(header, dict):
        _fail(where, f"safetensors header: a JSON object expected, found {type(header).__name__}")
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        _fail(where, "safetensors __metadata__ must map text to text")
    if len(header) > MAX_TENSORS:
        _fail(where, f"{len(header)} tensors exceed the limit of {MAX_TENSORS}")

    available = n - data_start
    planned = []
    data_end = 0
    for name, desc in header.items():
        if not isinstance(desc, dict):
            _fail(where, f"tensor {name!r}: a descriptor object expected, found {type(desc).__name__}")
        st_dtype = desc.get("dtype")
        if not isinstance(st_dtype, str) or st_dtype not in _TO_BURN:
            _fail(where, f"tensor {name!r}: dtype {st_dtype!r} is not supported, expected one of {', '.join(_TO_BURN)}")
        dtype = _TO_BURN[st_dtype]
        shape = desc.get("shape")
        if isinstance(shape, list) and len(shape) > MAX_DIMS:
            check_shape(shape, dtype, name, where)
        # every dim an int (no bool, no float) in [0, 2**64), checked without a Python call per dim
        if not isinstance(shape, list) or (shape and not ({*map(type, shape)} == _INT
                                                          and min(shape) >= 0 and max(shape) < 2 ** 64)):
            _fail(where, f"tensor {name!r}: shape must be a list of unsigned integers, found {shape!r}")
        offsets = desc.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2 or {*map(type, offsets)} != _INT
                or min(offsets) < 0 or max(offsets) >= 2 ** 64):
            _fail(where, f"tensor {name!r}: data_offsets must be [start, end], found {offsets!r}")
        start, end = offsets
        if start > end:
            _fail(where, f"tensor {name!r}: data_offsets start {start} is after end {end}")
        if end - start > MAX_TENSOR_BYTES:
            _fail(where, f"tensor {name!r}: {end - start} bytes exceed the per-tensor limit of {MAX_TENSOR_BYTES}")
        if end > available:
            _fail(where, f"truncated: tensor {name!r} ends at data byte {end}, only {available} data bytes exist")
        expected = math.prod(shape) * _ITEMSIZE[dtype]
        if expected != end - start:
            _fail(where, f"tensor {name!r}: shape {shape} of {st_dtype} needs {expected} bytes, "
                         f"data_offsets [{start}, {end}] hold {end - start}")
        if not expected:  # a shape of non-empty bytes fits NumPy (at most MAX_TENSOR_BYTES, MAX_DIMS axes) ...
            check_shape(shape, dtype, name, where)  # ... one with a 0 may still not
        planned.append(Planned(name, dtype, tuple(shape), data_start + start, end - start))
        data_end = max(data_end, end)
    if data_end != available:
        # as the safetensors library: the tensors' data ends the file. Bytes past it (a sparse hole
        # of gigabytes after a small adapter) are refused, never read
        _fail(where, f"{available - data_end} bytes after the last tensor's data (which ends at data byte "
                     f"{data_end}, the file has {available}); a safetensors file ends with its tensors")
    check_ranges(planned, data_start, where)
    return Plan(planned, dict(meta), {})


def decode(buf, where: str = "bytes") -> Burnpack:
    """Parse and validate a safetensors file held in memory in `buf`; arrays are views into
    it. Files are read by `ModuleRecord.load` through `plan` and a `FileSource`."""
    p = plan(buf, len(buf), where)
    return Burnpack(entries(p, views(buf, p)), p.metadata, {})


def header(specs, metadata=None) -> bytes:
    """The length field and JSON header of a safetensors file whose tensors are `specs`:
    (name, burnpack dtype, shape, byte count) in file order, the data packed back to back.
    Lets a writer stream tensors one at a time after it (see `write`)."""
    head = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise RecordError(f"metadata must map text to text, got {k!r}: {v!r}")
        head["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, nbytes in specs:
        if name in head:
            raise RecordError(f"duplicate tensor name {name!r}: each name may appear once")
        st = _FROM_BURN.get(dtype)
        if st is None:
            raise RecordError(f"tensor {name!r}: {dtype} cannot be stored in safetensors")
        head[name] = {"dtype": st, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + int(nbytes)]}
        offset += int(nbytes)
    blob = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the library writes it
    return struct.pack("<Q", len(blob)) + blob


def layout(entries, metadata=None):
    placed = []
    specs = []
    offset = 0
    for e in entries:
        raw = e.raw()
        if e.dtype == "Flex32":
            raw = raw.view("<f4")
        specs.append((e.name, e.dtype, e.shape, raw.nbytes))
        placed.append((raw, offset))
        offset += raw.nbytes
    head = header(specs, metadata)
    return head, placed, len(head) + offset


def write(fp, entries, metadata=None) -> int:
    head, placed, total = layout(entries, metadata)
    fp.write(head)
    for raw, _ in placed:
        if raw.nbytes:
            fp.write(memoryview(raw.reshape(-1)).cast("B"))
    return total


def encode(entries, metadata=None) -> bytes:
    head, placed, total = layout(entries, metadata)
    buf = bytearray(total)
    buf[: len(head)] = head
    view = np.frombuffer(buf, dtype=np.uint8)
    base = len(head)
    for raw, off in placed:
        if raw.nbytes:
            view[base + off: base + off + raw.nbytes] = raw.reshape(-1).view(np.uint8)
    return bytes(buf)
