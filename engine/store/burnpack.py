"""The burnpack container (.bpk, version 1): Burn's checkpoint format, read and written.

Layout (see shared/spec/burnpack.md): a 10-byte header (`NRUB`, u16 version, u32
metadata length), CBOR metadata, zero padding to a multiple of 256, then the tensors' raw
little-endian bytes in traversal order, each start a multiple of 256.

This file is the format layer only: a list of `TensorEntry` (name, dtype, shape, array,
param_id) plus user metadata and scalars in, bytes out, and back. It knows nothing of
modules. `plan` reads the header and metadata alone and checks every tensor before any data
is touched: no size is trusted before it is checked against the file's length, and shapes
that NumPy cannot hold (more than 64 axes, a dimension or byte count past 2**63 - 1, even
with a zero dimension) are refused. `decode` makes views of an in-memory buffer from a plan;
`ModuleRecord.load` reads a file's tensors from the same plan through a
`filesource.FileSource`. Every problem is a `RecordError` naming what was expected, what was
found and where.

Dtypes. Each entry keeps Burn's dtype name so that a file round-trips bit for bit:
"F64" "F32" "Flex32" "F16" "BF16" "I64" "I32" "I16" "I8" "U64" "U32" "U16" "U8",
"Bool(Native)" "Bool(U8)" "Bool(U32)", and "QFloat" (with the scheme kept as decoded).
The entry's `array` is what NumPy can hold:
- BF16: NumPy has no bfloat16, so the array holds the raw bits as uint16 and the dtype stays
  "BF16"; `entry.values()` converts them exactly to float32 (bits << 16), and that is what a
  module receives.
- Bool(...): a NumPy bool array whatever the storage width; it is written back in the
  entry's storage width.
- QFloat: the packed bytes as a flat uint8 array (values, then the scheme's parameters);
  they round-trip but cannot be loaded into a module yet.
"""
from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass, field

import numpy as np

from . import cbor
from .errors import RecordError
from .filesource import MAX_DIMS, numpy_shape_problem

MAGIC = 0x4255524E
MAGIC_BYTES = struct.pack("<I", MAGIC)  # b"NRUB"
VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
MAX_METADATA_SIZE = 100 * 1024 * 1024
MAX_TENSORS = 100_000
MAX_TENSOR_BYTES = 10 * 1024 ** 3

# Burn dtype name -> NumPy dtype of the stored elements
_PLAIN = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "Flex32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
_BOOL_STORES = {"Native": np.dtype("u1"), "U8": np.dtype("u1"), "U32": np.dtype("<u4")}
DTYPES = tuple(_PLAIN) + tuple(f"Bool({s})" for s in _BOOL_STORES) + ("QFloat",)

_FROM_NUMPY = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32",
    np.dtype(np.uint16): "U16",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "Bool(Native)",
}


def storage_dtype(dtype: str) -> np.dtype:
    """The little-endian NumPy dtype of one stored element of a Burn dtype."""
    if dtype in _PLAIN:
        return _PLAIN[dtype]
    if dtype.startswith("Bool(") and dtype[5:-1] in _BOOL_STORES:
        return _BOOL_STORES[dtype[5:-1]]
    if dtype == "QFloat":
        return np.dtype("u1")
    raise RecordError(f"unknown burnpack dtype {dtype!r}: expected one of {', '.join(DTYPES)}")


def dtype_for_array(array: np.ndarray) -> str:
    """The Burn dtype name for a NumPy array's dtype."""
    try:
        return _FROM_NUMPY[np.dtype(array.dtype).newbyteorder("=")]
    except KeyError:
        raise RecordError(f"cannot store NumPy dtype {array.dtype} in burnpack: expected one of "
                          f"{', '.join(str(d) for d in _FROM_NUMPY)}") from None


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Exact widening of bfloat16 bit patterns (uint16) to float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns, rounding to nearest even (NaN stays NaN)."""
    x = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((x >> 16) | 0x40).astype(np.uint16), rounded)


@dataclass(frozen=True)
class Scalar:
    """A typed scalar stored in the metadata: kind is "Int", "UInt", "Float" or "Bool"."""

    kind: str
    value: int | float | bool

    @staticmethod
    def of(value) -> "Scalar":
        """Scalar for a Python value: bool -> Bool, float -> Float, int -> Int (UInt when it
        only fits u64). A Scalar is returned as it is."""
        if isinstance(value, Scalar):
            return value
        if isinstance(value, (bool, np.bool_)):
            return Scalar("Bool", bool(value))
        if isinstance(value, (int, np.integer)):
            v = int(value)
            if -(2 ** 63) <= v < 2 ** 63:
                return Scalar("Int", v)
            if 0 <= v < 2 ** 64:
                return Scalar("UInt", v)
            raise RecordError(f"scalar {v} does not fit a 64-bit integer")
        if isinstance(value, (float, np.floating)):
            return Scalar("Float", float(value))
        raise RecordError(f"a scalar must be a bool, int or float, got {type(value).__name__}")


@dataclass
class TensorEntry:
    """One named tensor of a container. `array` has `shape`; see the module docstring for
    how each dtype is held. `param_id` is the Burn ParamId (u64) or None."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    array: np.ndarray
    param_id: int | None = None
    scheme: object = None  # the QFloat quantization scheme, as decoded

    @staticmethod
    def from_array(name: str, array, param_id: int | None = None, dtype: str | None = None) -> "TensorEntry":
        arr = np.asarray(array)
        if dtype is None:
            dtype = dtype_for_array(arr)
        storage_dtype(dtype)  # validates the name
        return TensorEntry(name, dtype, tuple(int(d) for d in arr.shape), arr, param_id)

    @property
    def nbytes(self) -> int:
        if self.dtype == "QFloat":
            return int(self.array.size)
        return math.prod(self.shape) * storage_dtype(self.dtype).itemsize

    def values(self) -> np.ndarray:
        """The values as NumPy computes with them: BF16 widened to float32, Flex32 as
        float32, bools as bool; quantized data has no plain value and raises."""
        if self.dtype == "BF16":
            return bf16_to_float32(self.array).reshape(self.shape)
        if self.dtype == "QFloat":
            raise RecordError(f"tensor {self.name!r} is quantized (QFloat); loading quantized "
                              f"tensors into modules is not supported")
        return self.array

    def raw(self) -> np.ndarray:
        """The stored bytes' elements: a contiguous little-endian array in storage dtype."""
        sd = storage_dtype(self.dtype)
        arr = self.array
        if self.dtype.startswith("Bool("):
            a = np.asarray(arr)
            arr = a.view(np.uint8).astype(sd, copy=False) if a.dtype == np.bool_ else (a != 0).astype(sd)
        if self.dtype == "BF16" and np.asarray(arr).dtype.kind == "f":
            arr = float32_to_bf16(arr)
        arr = np.asarray(arr)
        if arr.dtype != sd:
            if arr.dtype.newbyteorder("<") != sd or arr.dtype.kind != sd.kind:
                raise RecordError(f"tensor {self.name!r}: its array has NumPy dtype {arr.dtype}, "
                                  f"which is not {self.dtype} storage ({sd})")
            arr = arr.astype(sd)
        if self.dtype != "QFloat" and tuple(arr.shape) != tuple(self.shape):
            raise RecordError(f"tensor {self.name!r}: shape {list(self.shape)} expected, its array has {list(arr.shape)}")
        return np.ascontiguousarray(arr)


@dataclass
class Burnpack:
    """The decoded contents of a burnpack: entries in data (traversal) order."""

    entries: list[TensorEntry]
    metadata: dict[str, str] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)


# ------------------------------------------------------------------ writing
def _align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _cbor_dtype(entry: TensorEntry):
    if entry.dtype in _PLAIN:
        return entry.dtype
    if entry.dtype.startswith("Bool("):
        return {"Bool": entry.dtype[5:-1]}
    if entry.dtype == "QFloat":
        return {"QFloat": entry.scheme}
    raise RecordError(f"unknown burnpack dtype {entry.dtype!r}")


def layout(entries, metadata=None, scalars=None):
    """Plan a file: (header+metadata bytes, data_start, [(entry, raw array, start)], total size)."""
    seen = set()
    placed = []
    offset = 0
    descriptors = {}
    for e in entries:
        if not isinstance(e.name, str):
            raise RecordError(f"tensor names must be text, got {e.name!r}")
        if e.name in seen:
            raise RecordError(f"duplicate tensor name {e.name!r}: each name may appear once")
        seen.add(e.name)
        raw = e.raw()
        nbytes = raw.nbytes
        start = _align(offset)
        placed.append((e, raw, start))
        desc = {
            "dtype": _cbor_dtype(e),
            "shape": [int(d) for d in e.shape],
            "data_offsets": [start, start + nbytes],
        }
        if e.param_id is not None:
            pid = int(e.param_id)
            if not 0 <= pid < 2 ** 64:
                raise RecordError(f"tensor {e.name!r}: param_id {pid} is not an unsigned 64-bit integer")
            desc["param_id"] = pid
        descriptors[e.name] = desc
        offset = start + nbytes
    if len(descriptors) > MAX_TENSORS:
        raise RecordError(f"{len(descriptors)} tensors: burnpack readers accept at most {MAX_TENSORS}")
    meta = {"tensors": {k: descriptors[k] for k in sorted(descriptors, key=lambda s: s.encode("utf-8"))}}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise RecordError(f"metadata must map text to text, got {k!r}: {v!r}")
        meta["metadata"] = {k: metadata[k] for k in sorted(metadata, key=lambda s: s.encode("utf-8"))}
    if scalars:
        out = {}
        for k in sorted(scalars, key=lambda s: s.encode("utf-8")):
            s = Scalar.of(scalars[k])
            v = s.value
            if s.kind == "Float":
                v = float(v)
            elif s.kind == "Bool":
                v = bool(v)
            out[k] = {s.kind: v}
        meta["scalars"] = out
    blob = cbor.dumps(meta)
    if len(blob) > MAX_METADATA_SIZE:
        raise RecordError(f"metadata of {len(blob)} bytes: burnpack readers accept at most {MAX_METADATA_SIZE}")
    head = MAGIC_BYTES + struct.pack("<HI", VERSION, len(blob)) + blob
    data_start = _align(len(head))
    return head, data_start, placed, data_start + offset


def write(fp, entries, metadata=None, scalars=None) -> int:
    """Stream a burnpack into a binary file object; return the number of bytes written."""
    head, data_start, placed, total = layout(entries, metadata, scalars)
    fp.write(head)
    pos = len(head)
    zeros = bytes(ALIGNMENT)
    for _, raw, start in placed:
        target = data_start + start
        if target > pos:
            fp.write(zeros[: target - pos])
            pos = target
        if raw.nbytes:
            fp.write(memoryview(raw.reshape(-1)).cast("B"))
            pos += raw.nbytes
    return total


def encode(entries, metadata=None, scalars=None) -> bytes:
    """The whole burnpack as bytes."""
    head, data_start, placed, total = layout(entries, metadata, scalars)
    buf = bytearray(total)
    buf[: len(head)] = head
    view = np.frombuffer(buf, dtype=np.uint8)
    for _, raw, start in placed:
        if raw.nbytes:
            view[data_start + start: data_start + start + raw.nbytes] = raw.reshape(-1).view(np.uint8)
    return bytes(buf)


# ------------------------------------------------------------------ reading
def _fail(where, message):
    raise RecordError(message, where=where)


def _uint(value, what, where, limit=2 ** 64):
    if type(value) is not int or not 0 <= value < limit:
        _fail(where, f"{what}: an unsigned integer below {limit} expected, found {value!r}")
    return value


def _parse_dtype(value, name, where):
    if isinstance(value, str):
        if value in _PLAIN:
            return value, None
    elif isinstance(value, dict) and len(value) == 1:
        (k, v), = value.items()
        if k == "Bool" and isinstance(v, str) and v in _BOOL_STORES:
            return f"Bool({v})", None
        if k == "QFloat":
            _check_plain(v, f"tensor {name!r}: QFloat scheme", where)
            return "QFloat", v
    _fail(where, f"tensor {name!r}: unknown dtype {value!r}, expected one of {', '.join(DTYPES)}")


def _check_plain(value, what, where, depth=0):
    """A QFloat scheme may hold only text, ints, bools, lists and text-keyed maps."""
    if depth > 8:
        _fail(where, f"{what} nests too deeply")
    if isinstance(value, (str, bool, int)):
        return
    if isinstance(value, list):
        for v in value:
            _check_plain(v, what, where, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                _fail(where, f"{what} has a non-text key {k!r}")
            _check_plain(v, what, where, depth + 1)
        return
    _fail(where, f"{what} holds a {type(value).__name__}, which a scheme cannot contain")


def _parse_scalar(name, value, where):
    if isinstance(value, dict) and len(value) == 1:
        (kind, v), = value.items()
        if kind == "Bool" and type(v) is bool:
            return Scalar("Bool", v)
        if kind == "Int" and type(v) is int and -(2 ** 63) <= v < 2 ** 63:
            return Scalar("Int", v)
        if kind == "UInt" and type(v) is int and 0 <= v < 2 ** 64:
            return Scalar("UInt", v)
        if kind == "Float" and type(v) in (float, int):
            return Scalar("Float", float(v))
    _fail(where, f"scalar {name!r}: one of {{Int: i64}}, {{UInt: u64}}, {{Float: f64}}, {{Bool: bool}} "
                 f"expected, found {value!r}")


def read_header(buf, where="bytes", size: int | None = None) -> tuple[int, int]:
    """Check the 10-byte header; return (metadata_len, data_start). `buf` holds at least the
    header (when the file has that many bytes); `size` is the whole file's (default len(buf))."""
    n = len(buf) if size is None else size
    if n < HEADER_SIZE or len(buf) < HEADER_SIZE:
        _fail(where, f"too short for a burnpack: a {HEADER_SIZE}-byte header expected, found {n} bytes")
    magic, version, meta_len = struct.unpack_from("<IHI", buf, 0)
    if magic != MAGIC:
        _fail(where, f"not a burnpack: magic bytes {MAGIC_BYTES!r} expected, found {bytes(buf[:4])!r}")
    if version > VERSION:
        _fail(where, f"burnpack version {version} is newer than the supported version {VERSION}")
    if meta_len > MAX_METADATA_SIZE:
        _fail(where, f"metadata length {meta_len} exceeds the {MAX_METADATA_SIZE}-byte limit")
    if HEADER_SIZE + meta_len > n:
        _fail(where, f"truncated: the header announces {meta_len} bytes of metadata, "
                     f"the file has {n - HEADER_SIZE} after the header")
    return meta_len, _align(HEADER_SIZE + meta_len)


def head_length(first: bytes, size: int, where: str = "bytes") -> int:
    """How many leading bytes `plan` needs (header and metadata), from the first HEADER_SIZE
    bytes of a file of `size` bytes."""
    meta_len, _ = read_header(first, where, size)
    return HEADER_SIZE + meta_len


@dataclass
class Planned:
    """One tensor of a file, checked but not read: its bytes are [offset, offset + nbytes)
    of the file (absolute), `count` elements of `storage_dtype(dtype)`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    param_id: int | None = None
    scheme: object = None

    @property
    def count(self) -> int:
        return self.nbytes // storage_dtype(self.dtype).itemsize


@dataclass
class Plan:
    """A file's tensors (in data order), user metadata and scalars, before any data is read."""

    tensors: list[Planned]
    metadata: dict[str, str] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)

    def spans(self) -> list[tuple[int, np.dtype, int]]:
        """(offset, storage dtype, count) per tensor, for `FileSource.read_arrays`."""
        return [(t.offset, storage_dtype(t.dtype), t.count) for t in self.tensors]


def check_shape(shape, dtype: str, name: str, where: str) -> None:
    """A RecordError unless NumPy can hold an array of `shape` (see filesource)."""
    problem = numpy_shape_problem(shape, storage_dtype(dtype).itemsize)
    if problem is not None:
        shown = list(shape) if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ...]"
        _fail(where, f"tensor {name!r}: shape {shown} of {dtype} cannot be held: a shape of at most "
                     f"{MAX_DIMS} axes whose size fits NumPy expected, found {problem}")


_BY_RANGE = operator.attrgetter("offset", "nbytes")


def check_ranges(planned: list[Planned], data_start: int, where: str) -> None:
    """Sort by offset and refuse overlapping non-empty ranges (reported as data_offsets,
    relative to `data_start`)."""
    planned.sort(key=_BY_RANGE)
    prev_end, prev_name = 0, None
    for p in planned:
        if p.nbytes:
            if p.offset < prev_end:
                start = p.offset - data_start
                _fail(where, f"tensor {p.name!r} (data bytes [{start}, {start + p.nbytes}]) overlaps "
                             f"tensor {prev_name!r}, which ends at {prev_end - data_start}")
            prev_end, prev_name = p.offset + p.nbytes, p.name


def plan(buf, size: int | None = None, where: str = "bytes") -> Plan:
    """Parse and validate a burnpack's header and metadata; `buf` holds at least the first
    `head_length` bytes, `size` is the whole file's length (default len(buf)). Nothing of the
    data section is read: every size is checked against `size` instead."""
    n = len(buf) if size is None else size
    meta_len, data_start = read_header(buf, where, n)
    try:
        meta = cbor.loads(bytes(memoryview(buf)[HEADER_SIZE:HEADER_SIZE + meta_len]))
    except cbor.CborError as exc:
        _fail(where, f"metadata: {exc}")
    if not isinstance(meta, dict):
        _fail(where, f"metadata: a map expected, found {type(meta).__name__}")
    tensors = meta.get("tensors")
    if not isinstance(tensors, dict):
        _fail(where, f"metadata: a 'tensors' map expected, found {type(tensors).__name__}")
    if len(tensors) > MAX_TENSORS:
        _fail(where, f"{len(tensors)} tensors exceed the limit of {MAX_TENSORS}")
    user = meta.get("metadata", {})
    if not isinstance(user, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in user.items()):
        _fail(where, "metadata: 'metadata' must map text to text")
    raw_scalars = meta.get("scalars", {})
    if not isinstance(raw_scalars, dict):
        _fail(where, "metadata: 'scalars' must be a map")
    scalars = {}
    for k, v in raw_scalars.items():
        if not isinstance(k, str):
            _fail(where, f"scalar names must be text, found {k!r}")
        scalars[k] = _parse_scalar(k, v, where)

    available = n - data_start
    planned = []
    for name, desc in tensors.items():
        if not isinstance(name, str):
            _fail(where, f"tensor names must be text, found {name!r}")
        if not isinstance(desc, dict):
            _fail(where, f"tensor {name!r}: a descriptor map expected, found {type(desc).__name__}")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in desc:
                _fail(where, f"tensor {name!r}: descriptor has no {key!r}")
        dtype, scheme = _parse_dtype(desc["dtype"], name, where)
        shape = desc["shape"]
        if not isinstance(shape, list):
            _fail(where, f"tensor {name!r}: shape must be an array, found {shape!r}")
        if len(shape) > MAX_DIMS:
            check_shape(shape, dtype, name, where)  # before looking at every entry of a long list
        shape = tuple(_uint(d, f"tensor {name!r}: shape", where) for d in shape)
        offsets = desc["data_offsets"]
        if not isinstance(offsets, list) or len(offsets) != 2:
            _fail(where, f"tensor {name!r}: data_offsets must be [start, end], found {offsets!r}")
        start = _uint(offsets[0], f"tensor {name!r}: data_offsets start", where)
        end = _uint(offsets[1], f"tensor {name!r}: data_offsets end", where)
        if start > end:
            _fail(where, f"tensor {name!r}: data_offsets start {start} is after end {end}")
        length = end - start
        if length > MAX_TENSOR_BYTES:
            _fail(where, f"tensor {name!r}: {length} bytes exceed the per-tensor limit of {MAX_TENSOR_BYTES}")
        if end > available:
            _fail(where, f"truncated: tensor {name!r} ends at data byte {end} (file byte {data_start + end}), "
                         f"the file has {n} bytes")
        pid = desc.get("param_id")
        if pid is not None:
            pid = _uint(pid, f"tensor {name!r}: param_id", where)
        itemsize = storage_dtype(dtype).itemsize
        if dtype != "QFloat":
            # Python ints: no overflow, and nothing is allocated from an unchecked size
            expected = math.prod(shape) * itemsize
            if expected != length:
                _fail(where, f"tensor {name!r}: shape {list(shape)} of {dtype} needs {expected} bytes, "
                             f"data_offsets [{start}, {end}] hold {length}")
        check_shape(shape, dtype, name, where)  # what fits the bytes may still not fit NumPy
        planned.append(Planned(name, dtype, shape, data_start + start, length, pid, scheme))
    check_ranges(planned, data_start, where)
    return Plan(planned, dict(user), scalars)


def entries(plan: Plan, arrays) -> list[TensorEntry]:
    """The entries of a plan from one flat storage-dtype array per tensor (views of a buffer
    or arrays read from a file): bools as bool, every other dtype reshaped to its shape."""
    out = []
    for t, arr in zip(plan.tensors, arrays):
        if t.dtype.startswith("Bool("):
            arr = _as_bool(arr)
        if t.dtype != "QFloat" and arr.shape != t.shape:
            arr = arr.reshape(t.shape)
        out.append(TensorEntry(t.name, t.dtype, t.shape, arr, t.param_id, t.scheme))
    return out


def views(buf, plan: Plan) -> list[np.ndarray]:
    """One flat array per planned tensor, viewing `buf` (no copy)."""
    return [np.frombuffer(buf, dtype=sd, count=count, offset=off) for off, sd, count in plan.spans()]


def decode(buf, where: str = "bytes") -> Burnpack:
    """Parse and validate a burnpack held in memory in `buf` (bytes, bytearray, memoryview).

    Tensor arrays are views into `buf` (no copy): read-only when `buf` is, writable when it
    is writable (a bytearray). Files are read by `ModuleRecord.load` through `plan` and a
    `FileSource` instead, into arrays of their own.
    """
    p = plan(buf, len(buf), where)
    return Burnpack(entries(p, views(buf, p)), p.metadata, p.scalars)


def _as_bool(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint8 and (arr.size == 0 or int(arr.max()) <= 1):
        return arr.view(np.bool_)  # zero-copy when the bytes are 0/1
    return arr != 0
