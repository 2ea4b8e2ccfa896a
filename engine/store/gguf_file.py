"""GGUF files (llama.cpp, Ollama, LM Studio) read with the `gguf` package, llama.cpp's own reader.

`open_gguf(path)` parses the header with `gguf.GGUFReader` (it memory-maps the file and builds
its key/value fields and tensor table), copies out what Ember needs (the metadata as Python
values, every tensor's name, type, dims, offset and size) and lets the mapping go; tensors are read
later, each at its first use, through `engine.store.filesource.FileSource` (the file checked to be
unchanged before and after each read, never a mapping a truncation could turn into SIGBUS).

Hostile files: the fixed header's counts are checked before the reader runs (at most
`MAX_TENSORS` tensors and `MAX_KV` keys), the reader's every read is bounded by the file (a read
past its end is an error at once, not an empty array, so a string length or an array length in
the billions fails on the first element that is not there instead of looping), the number of
reads is bounded (`MAX_READS`: what a 256k-token vocabulary with its merges needs, several times
over), and every tensor's type, dims and byte range are checked against the file before anything
is read. Every problem is a `GGUFError` (a `RecordError`) naming the file.

Dims: GGUF lists a tensor's dims fastest first (`ne0` = the row length); `GGUFTensor.shape` is
NumPy's order (rows first), which is the PyTorch / Hugging Face layout of the same tensor.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import RecordError
from .filesource import FileSource

__all__ = ["GGUFError", "GGUFFile", "GGUFTensor", "MAX_KV", "MAX_READS", "MAX_TENSORS", "SUPPORTED_TYPES", "open_gguf"]

MAX_TENSORS = 100_000     # as for safetensors headers: no real model has more
MAX_KV = 100_000          # metadata keys
MAX_READS = 4_000_000     # reads of the reader over the header (each a small NumPy view): a 256k-token
                          # vocabulary with scores, types and merges needs about 1.5 million
MAX_SIZE = 2 ** 31 - 1    # the largest dim: as for a Hugging Face config's sizes
MAX_DIMS = 4              # ggml tensors have at most 4 dims (GGML_MAX_DIMS)
GGUF_MAGIC = b"GGUF"

# the ggml types Ember reads: the float types and the block quantizations `gguf.quants` dequantizes
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
                   "Q5_K", "Q6_K")
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: `name`, ggml `type` name ("Q4_1"), `shape` (NumPy order: rows
    first), `offset` (absolute, in the file) and `nbytes` (as stored)."""

    name: str
    type: str
    shape: tuple
    offset: int
    nbytes: int

    @property
    def quantized(self) -> bool:
        return self.type not in FLOAT_TYPES

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class GGUFFile:
    """An opened GGUF file: `metadata` (key -> Python value; arrays as lists, except the
    tokenizer's long arrays which stay NumPy arrays where numeric), `tensors` (name -> GGUFTensor,
    in file order), `read(name)` (the stored bytes or values, owned) and `close()`."""

    def __init__(self, path: Path, metadata: dict, tensors: dict, source: FileSource):
        self.path = path
        self.metadata = metadata
        self.tensors: dict[str, GGUFTensor] = tensors
        self._source = source

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def read(self, name: str) -> np.ndarray:
        """The tensor's stored data as a new owned array: F32 / F16 as float32 / float16 of its
        shape, BF16 as uint16 of its shape, a block type as uint8 `[rows, bytes per row]`."""
        t = self.tensors[name]
        if t.type == "F32":
            return self._source.read_array(t.offset, np.float32, t.numel).reshape(t.shape)
        if t.type == "F16":
            return self._source.read_array(t.offset, np.float16, t.numel).reshape(t.shape)
        if t.type == "BF16":
            return self._source.read_array(t.offset, np.uint16, t.numel).reshape(t.shape)
        rows = t.numel // t.shape[-1] if t.shape else 1
        return self._source.read_array(t.offset, np.uint8, t.nbytes).reshape(rows, t.nbytes // rows)

    def read_rows(self, name: str, start: int, count: int) -> np.ndarray:
        """Rows `start` .. `start + count` of the tensor viewed as `[rows, last dim]` (one expert of a
        stacked experts tensor), read alone: float32 / float16 / uint16 (BF16) `[count, last dim]`, a
        block type's uint8 `[count, bytes per row]`."""
        t = self.tensors[name]
        rows = t.numel // t.shape[-1] if t.shape else 1
        if start < 0 or count < 0 or start + count > rows:
            raise GGUFError(f"tensor {name!r}: rows {start}..{start + count} asked of {rows}", where=str(self.path))
        row_bytes = t.nbytes // rows
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}.get(t.type, np.uint8)
        per_row = row_bytes // np.dtype(dtype).itemsize
        data = self._source.read_array(t.offset + start * row_bytes, dtype, count * per_row)
        return data.reshape(count, per_row)

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {self.architecture}, {len(self.tensors)} tensors)"


class GGUFError(RecordError):
    """A GGUF file cannot be read: the message says what was expected and found, `where` names the file."""


def _fail(path, message):
    raise GGUFError(message, where=str(path))


def _reader_class():
    import gguf  # noqa: PLC0415 - imported on the first GGUF opened

    value_type = gguf.GGUFValueType

    class BoundedReader(gguf.GGUFReader):
        """llama.cpp's reader, bounded and faster on long arrays.

        - `_get` (the reader's one primitive read) never goes past the end of the file and counts
          its reads; it slices a plain view of the mapping (the reader's own slice, without
          `np.memmap`'s per-slice bookkeeping, which was two thirds of the time);
        - the array branch of `_get_field_parts` reads an array of numbers as one NumPy view
          and an array of strings in one loop over its lengths (the reader makes two views per
          string: 98,000 strings took seconds); the field's `parts` / `data` keep the reader's
          meaning for the strings (one part per string) and hold the numbers as one part;
        - `_build_tensors` keeps the tensor-info fields for `_tensors`, which checks each one
          against the file before describing it (the reader would build a view of every tensor).
        """

        reads = 0
        _plain = None

        def _get(self, offset, dtype, count=1, override_order=None):
            count = int(count)
            dt = np.dtype(dtype)
            plain = self._plain
            if plain is None:
                plain = self._plain = np.asarray(self.data).view(np.ndarray)
            offset = int(offset)
            if offset < 0 or count < 0 or offset + dt.itemsize * count > plain.shape[0]:
                raise _Truncated(f"{count} value(s) of {dt.name} at byte {offset} run past the end of "
                                 f"the file ({plain.shape[0]} bytes)")
            self.reads += 1
            if self.reads > MAX_READS:
                raise _Truncated(f"the header needs more than {MAX_READS} reads (arrays too long to be metadata)")
            arr = plain[offset:offset + dt.itemsize * count].view(dt)
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type != value_type.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            offs = orig_offs
            raw_itype = self._get(offs, np.uint32)
            alen = self._get(offs + 4, np.uint64)
            offs += 12
            count = int(alen[0])
            try:
                itype = value_type(int(raw_itype[0]))
            except ValueError:
                raise ValueError(f"unknown array item type {int(raw_itype[0])}") from None
            nptype = self.gguf_scalar_to_np.get(itype)
            if nptype is not None:
                values = self._get(offs, nptype, count)
                size = int(values.nbytes)
                return offs + size - orig_offs, [raw_itype, alen, values], [2] if count else [], \
                    [value_type.ARRAY] + ([itype] if count else [])
            if itype != value_type.STRING:
                return super()._get_field_parts(orig_offs, raw_type)
            plain = self._plain
            end = plain.shape[0]
            order = ">" if self.byte_order == "S" else "<"
            fmt = struct.Struct(order + "Q")
            if count > (end - offs) // 8:
                raise _Truncated(f"an array of {count} strings at byte {offs} cannot fit the file ({end} bytes)")
            buf = memoryview(plain)
            parts: list = [raw_itype, alen]
            for _ in range(count):
                if offs + 8 > end:
                    raise _Truncated(f"a string at byte {offs} runs past the end of the file ({end} bytes)")
                (n,) = fmt.unpack_from(buf, offs)
                if n > end - offs - 8:
                    raise _Truncated(f"a string of {n} bytes at byte {offs} runs past the end of the file "
                                     f"({end} bytes)")
                parts.append(bytes(buf[offs + 8:offs + 8 + n]))
                offs += 8 + n
            self.reads += count
            if self.reads > MAX_READS:
                raise _Truncated(f"the header needs more than {MAX_READS} reads (arrays too long to be metadata)")
            return offs - orig_offs, parts, list(range(2, 2 + count)), \
                [value_type.ARRAY] + ([value_type.STRING] if count else [])

        def _build_tensors(self, start_offs, fields):
            self.tensor_start = start_offs
            self.tensor_fields = fields  # checked and described by _tensors; no view built here

    return gguf, BoundedReader


class _Truncated(ValueError):
    pass


def _header_counts(path: Path) -> tuple[int, int, int]:
    """(version, tensor count, key count) from the fixed 24-byte header, before the reader runs."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as exc:
        _fail(path, f"cannot read: {exc.strerror or exc}")
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        _fail(path, f"not a GGUF file: expected the magic bytes 'GGUF', found {head[:4]!r}")
    if len(head) < 24:
        _fail(path, f"the file ends inside the GGUF header ({len(head)} bytes; 24 expected)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version & 0xFFFF == 0:  # the other byte order
        version, n_tensors, n_kv = struct.unpack(">IQQ", head[4:24])
    if n_tensors > MAX_TENSORS:
        _fail(path, f"the header claims {n_tensors} tensors; at most {MAX_TENSORS} expected (refused before reading)")
    if n_kv > MAX_KV:
        _fail(path, f"the header claims {n_kv} metadata keys; at most {MAX_KV} expected (refused before reading)")
    return version, n_tensors, n_kv


def _value(field, gguf):
    """A reader field as a Python value: scalars and strings as themselves, arrays of numbers as
    NumPy arrays (copied out of the mapping), arrays of strings as lists of str."""
    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) == 1:  # an empty array
            return []
        sub = types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        if sub == gguf.GGUFValueType.ARRAY:
            raise ValueError("arrays of arrays are not metadata Ember reads")
        if not field.data:
            return np.zeros(0)
        return np.concatenate([np.asarray(field.parts[i]).reshape(-1) for i in field.data]).astype(
            field.parts[field.data[0]].dtype.newbyteorder("="))
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8")
    v = field.parts[-1][0]
    if types[0] == gguf.GGUFValueType.BOOL:
        return bool(v)
    return v.item()


def _tensors(reader, gguf, path: Path, size: int) -> dict[str, GGUFTensor]:
    out: dict[str, GGUFTensor] = {}
    start = int(reader.tensor_start)
    for field in reader.tensor_fields:
        _name_len, name_data, n_dims, dims, raw_type, offset = field.parts
        name = bytes(name_data).decode("utf-8")
        where = f"tensor {name!r}"
        if name in out:
            _fail(path, f"{where} is listed twice")
        if int(n_dims[0]) > MAX_DIMS:
            _fail(path, f"{where} has {int(n_dims[0])} dims; at most {MAX_DIMS} expected")
        try:
            qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
        except ValueError:
            _fail(path, f"{where} has ggml type {int(raw_type[0])}, which no llama.cpp type is; supported: "
                        f"{', '.join(SUPPORTED_TYPES)}")
        if qtype.name not in SUPPORTED_TYPES:
            _fail(path, f"{where} is stored as {qtype.name}, which Ember does not read; supported: "
                        f"{', '.join(SUPPORTED_TYPES)}")
        ne = [int(d) for d in dims]
        if any(d <= 0 or d > MAX_SIZE for d in ne):
            _fail(path, f"{where} has dims {ne}; each between 1 and {MAX_SIZE} expected")
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if ne[0] % block:
            _fail(path, f"{where} ({qtype.name}) has rows of {ne[0]} values; a multiple of its block of {block} "
                        f"expected")
        numel = math.prod(ne)
        nbytes = numel // block * type_size
        begin = start + int(offset[0])
        if begin % reader.alignment or begin + nbytes > size:
            _fail(path, f"{where}: {nbytes} bytes at offset {begin} do not fit the file of {size} bytes "
                        f"(aligned to {reader.alignment})")
        out[name] = GGUFTensor(name, qtype.name, tuple(reversed(ne)), begin, nbytes)
    return out


def open_gguf(path) -> GGUFFile:
    """Open a GGUF file: its header parsed by `gguf.GGUFReader`, nothing of the tensors read
    (see the module docstring). Raises GGUFError naming the file and the problem."""
    path = Path(os.fspath(path)).expanduser()
    try:
        if not path.is_file():
            _fail(path, "no such file; a .gguf file expected")
    except OSError as exc:
        _fail(path, f"cannot read: {exc.strerror or exc}")
    _header_counts(path)
    gguf, reader_class = _reader_class()
    try:
        reader = reader_class(path, "r")
    except GGUFError:
        raise
    except (_Truncated, ValueError, KeyError, IndexError, OverflowError, RecursionError, UnicodeDecodeError) as exc:
        text = str(exc) or type(exc).__name__
        _fail(path, f"not a readable GGUF file: {text}")
    except OSError as exc:
        _fail(path, f"cannot read: {exc.strerror or exc}")
    try:
        if reader.byte_order == "S":
            _fail(path, "a big-endian GGUF file; Ember reads little-endian ones (what llama.cpp writes on "
                        "x86 and ARM)")
        size = len(reader.data)
        metadata = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                metadata[key] = _value(field, gguf)
            except (ValueError, UnicodeDecodeError) as exc:
                _fail(path, f"metadata {key!r}: {exc}")
        tensors = _tensors(reader, gguf, path, size)
    finally:
        del reader  # the mapping goes with the reader's views
    source = FileSource(path, str(path))
    if source.size != size:
        source.close()
        _fail(path, "the file changed while its header was read")
    return GGUFFile(path, metadata, tensors, source)
