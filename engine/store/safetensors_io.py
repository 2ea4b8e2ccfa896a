"""safetensors read and write, with the same hardening as the burnpack reader.

Layout: an 8-byte little-endian header length N, N bytes of JSON
`{"__metadata__": {text: text}, name: {"dtype", "shape", "data_offsets": [start, end]}}`,
then the tensors' bytes (offsets relative to the end of the header). The header is parsed
here rather than by the `safetensors` package so that reading can be zero-copy (views into
an mmap) and every malformed input ends in a `RecordError`; files written here are read by
`safetensors.numpy` and the other way round (tests check both directions).

Entries use the burnpack dtype names of `burnpack.py` ("F32", "BF16" as raw uint16,
"Bool(Native)" for safetensors' BOOL, ...), so one record type serves both formats.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np

from .burnpack import MAX_TENSOR_BYTES, MAX_TENSORS, Burnpack, TensorEntry, _as_bool, storage_dtype
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
_FROM_BURN["Flex32"] = "F32"


def _fail(where, message):
    raise RecordError(message, where=where)


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def decode(buf, where: str = "bytes") -> Burnpack:
    """Parse and validate a safetensors file held in `buf`; arrays are views into it."""
    n = len(buf)
    if n < 8:
        _fail(where, f"too short for safetensors: an 8-byte header length expected, found {n} bytes")
    (hlen,) = struct.unpack_from("<Q", buf, 0)
    if hlen > MAX_HEADER_SIZE:
        _fail(where, f"safetensors header length {hlen} exceeds the {MAX_HEADER_SIZE}-byte limit")
    if 8 + hlen > n:
        _fail(where, f"truncated: the header announces {hlen} bytes, the file has {n - 8} after the length")
    raw = bytes(memoryview(buf)[8:8 + hlen])
    if not raw.lstrip().startswith(b"{"):
        _fail(where, "safetensors header: a JSON object expected")
    if raw.count(b",") + raw.count(b":") > 2 * MAX_JSON_ITEMS:
        _fail(where, f"safetensors header holds more than {MAX_JSON_ITEMS} items")
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

    data_start = 8 + hlen
    available = n - data_start
    planned = []
    for name, desc in header.items():
        if not isinstance(desc, dict):
            _fail(where, f"tensor {name!r}: a descriptor object expected, found {type(desc).__name__}")
        st_dtype = desc.get("dtype")
        if not isinstance(st_dtype, str) or st_dtype not in _TO_BURN:
            _fail(where, f"tensor {name!r}: dtype {st_dtype!r} is not supported, expected one of {', '.join(_TO_BURN)}")
        dtype = _TO_BURN[st_dtype]
        shape = desc.get("shape")
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2 ** 64 for d in shape):
            _fail(where, f"tensor {name!r}: shape must be a list of unsigned integers, found {shape!r}")
        offsets = desc.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and 0 <= o < 2 ** 64 for o in offsets)):
            _fail(where, f"tensor {name!r}: data_offsets must be [start, end], found {offsets!r}")
        start, end = offsets
        if start > end:
            _fail(where, f"tensor {name!r}: data_offsets start {start} is after end {end}")
        if end - start > MAX_TENSOR_BYTES:
            _fail(where, f"tensor {name!r}: {end - start} bytes exceed the per-tensor limit of {MAX_TENSOR_BYTES}")
        if end > available:
            _fail(where, f"truncated: tensor {name!r} ends at data byte {end}, only {available} data bytes exist")
        expected = math.prod(shape) * storage_dtype(dtype).itemsize
        if expected != end - start:
            _fail(where, f"tensor {name!r}: shape {shape} of {st_dtype} needs {expected} bytes, "
                         f"data_offsets [{start}, {end}] hold {end - start}")
        planned.append((start, end, name, dtype, tuple(shape)))

    planned.sort(key=lambda p: (p[0], p[1]))
    prev_end, prev_name = 0, None
    for start, end, name, *_ in planned:
        if start < end:
            if start < prev_end:
                _fail(where, f"tensor {name!r} (data bytes [{start}, {end}]) overlaps tensor {prev_name!r}, "
                             f"which ends at {prev_end}")
            prev_end, prev_name = end, name

    entries = []
    for start, end, name, dtype, shape in planned:
        sd = storage_dtype(dtype)
        arr = np.frombuffer(buf, dtype=sd, count=(end - start) // sd.itemsize, offset=data_start + start)
        if dtype.startswith("Bool("):
            arr = _as_bool(arr)
        entries.append(TensorEntry(name, dtype, shape, arr.reshape(shape), None))
    return Burnpack(entries, dict(meta), {})


def layout(entries, metadata=None):
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise RecordError(f"metadata must map text to text, got {k!r}: {v!r}")
        header["__metadata__"] = dict(metadata)
    placed = []
    offset = 0
    for e in entries:
        if e.name in header:
            raise RecordError(f"duplicate tensor name {e.name!r}: each name may appear once")
        st = _FROM_BURN.get(e.dtype)
        if st is None:
            raise RecordError(f"tensor {e.name!r}: {e.dtype} cannot be stored in safetensors")
        raw = e.raw()
        if e.dtype == "Flex32":
            raw = raw.view("<f4")
        header[e.name] = {"dtype": st, "shape": [int(d) for d in e.shape],
                          "data_offsets": [offset, offset + raw.nbytes]}
        placed.append((raw, offset))
        offset += raw.nbytes
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the library writes it
    head = struct.pack("<Q", len(blob)) + blob
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
