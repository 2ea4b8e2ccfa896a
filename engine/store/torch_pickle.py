"""PyTorch's zip checkpoints (`torch.save`, `pytorch_model.bin`, `.pt`), read without running code.

A `torch.save` file (PyTorch 1.6 and later) is a zip archive whose entries are stored
uncompressed:

    <archive>/data.pkl        a pickle of the object (here: a state dict name -> tensor)
    <archive>/data/<key>      one entry per storage: its raw bytes
    <archive>/byteorder       "little" or "big" (absent in older files: little)
    <archive>/version, .format_version, .storage_alignment, .data/serialization_id

A pickle is a small program: loading one with `pickle.load` may call any importable function
(`os.system`, `builtins.eval`, ...). Here the pickle is read by a restricted `pickle.Unpickler`
whose `find_class` resolves only the globals a state dict needs, each to a stand-in of this file
that records what the tensor is instead of building it:

- `collections.OrderedDict` (the state dict itself and the empty backward-hooks dict),
- `torch._utils._rebuild_tensor_v2` / `_rebuild_tensor` (storage, offset, size, stride, ...)
  -> a `TorchTensor` description, checked against its storage's length,
- `torch._utils._rebuild_parameter` / `_rebuild_parameter_with_state` -> the tensor inside,
- the storage types `torch.FloatStorage`, `HalfStorage`, `BFloat16Storage`, `DoubleStorage`,
  `LongStorage`, `IntStorage`, `ShortStorage`, `CharStorage`, `ByteStorage`, `BoolStorage`,
  `UntypedStorage` -> a marker carrying the dtype (persistent ids name the storage's zip entry).

Every other global (`os.system`, `builtins.eval`, `subprocess.Popen`, `torch.load`, ...) is
refused with a `RecordError` that names it and the file; nothing is called. Stand-ins refuse
BUILD (`__setstate__`), so a pickle cannot rewrite a description after it was checked. Before
the unpickler sees the pickle, its opcodes are walked (by their argument sizes, as `pickletools`
describes them; nothing runs): a memo index past the opcodes read so far (the C unpickler would
grow its memo to it: 8 bytes can ask for gigabytes) and the copyreg extension opcodes are
refused, and the state dict's entries are counted as they are set, so that more than
MAX_TENSORS stop the walk there. What a file can make a reader allocate is bounded by its size:
the pickle at most 32 MB, one tensor at most the file's size plus 16 MB (only expanded views
exceed their storage), all tensors together at most 8 times the file (views sharing storages).
The zip's entry count (a storage each, at most 2 * MAX_TENSORS + 16) is read from its end
record before zipfile builds the directory.

Nothing is read eagerly but the pickle: each storage's data offset is found from its zip local
header (entries must be ZIP_STORED, as torch writes them; a compressed storage is an error
saying so), and a tensor's bytes are read at first use through `filesource.FileSource` — only the
elements its view covers, then `as_strided` on that owned copy for transposed / sliced /
expanded views, then a contiguous copy. Every size, offset and stride is checked against the
storage's length before anything is read. Storage CRCs are not checked (that would mean reading
every storage whole); the pickle's CRC is.

Dtypes use burnpack's names ("F32", "BF16" as raw uint16, "Bool(Native)", ...), as safetensors does.
"""
from __future__ import annotations

import collections
import io
import math
import pickle
import struct
import zipfile

import numpy as np

from .burnpack import MAX_TENSORS, TensorEntry, check_shape, storage_dtype
from .errors import RecordError
from .filesource import MAX_DIMS, FileSource

__all__ = ["TorchTensor", "TorchZip", "ZIP_MAGIC", "is_torch_zip", "load_entries", "ALLOWED_GLOBALS"]

ZIP_MAGIC = b"PK\x03\x04"
MAX_PICKLE_BYTES = 32 * 1024 * 1024   # a state dict pickles to ~300 bytes a tensor: 100,000 tensors ~30 MB
MAX_ZIP_ENTRIES = 2 * MAX_TENSORS + 16
EXPAND_SLACK = 16 * 1024 * 1024       # how much larger than the file an (expanded) tensor may be ...
TOTAL_FACTOR = 8                      # ... and all tensors together, as a multiple of the file (shared storages)

# torch storage type name -> burnpack dtype name
STORAGE_DTYPES = {
    "FloatStorage": "F32", "DoubleStorage": "F64", "HalfStorage": "F16", "BFloat16Storage": "BF16",
    "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
    "ByteStorage": "U8", "BoolStorage": "Bool(Native)", "UntypedStorage": "U8",
}

ALLOWED_GLOBALS = (
    ["collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor",
     "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state"]
    + [f"torch.{name}" for name in STORAGE_DTYPES]
)


def is_torch_zip(first: bytes) -> bool:
    """Whether the first bytes of a file are a zip archive's (as `torch.save` writes)."""
    return bytes(first[:4]) == ZIP_MAGIC


def _fail(where, message):
    raise RecordError(message, where=where)


class _Refusing:
    """Stand-ins refuse to be changed by the pickle (BUILD) or pickled again."""

    __slots__ = ()

    def __setstate__(self, state):
        raise RecordError(f"the pickle tries to set the state of a {type(self).__name__[1:]} "
                          f"(BUILD), which a state dict never does; refused")

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled")


class _StorageType(_Refusing):
    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: str):
        self.name = name
        self.dtype = dtype


class _Storage(_Refusing):
    __slots__ = ("key", "dtype", "numel", "offset", "byteswap")

    def __init__(self, key, dtype, numel, offset, byteswap):
        self.key = key
        self.dtype = dtype
        self.numel = numel
        self.offset = offset      # the file offset of its first byte
        self.byteswap = byteswap


class _Rebuilt(_Refusing):
    """What `_rebuild_tensor_v2` was asked for, before it is named and checked."""

    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage, offset, size, stride):
        self.storage = storage
        self.offset = offset
        self.size = size
        self.stride = stride


def _int_tuple(value, what, where):
    if not isinstance(value, (tuple, list)):
        _fail(where, f"{what}: a tuple of integers expected, found {type(value).__name__}")
    if len(value) > MAX_DIMS:
        _fail(where, f"{what}: {len(value)} axes, at most {MAX_DIMS} expected")
    for d in value:
        if type(d) is not int or d < 0:
            _fail(where, f"{what}: non-negative integers expected, found {d!r}")
    return tuple(value)


def _rebuild_tensor_for(where):
    calls = [0]

    def _rebuild_tensor_v2(storage=None, storage_offset=None, size=None, stride=None, *rest, **kwargs):
        calls[0] += 1
        if calls[0] > MAX_TENSORS:  # a tensor shared by two names is rebuilt once
            _fail(where, f"the pickle rebuilds more than {MAX_TENSORS} tensors, the limit")
        if not isinstance(storage, _Storage):
            _fail(where, f"_rebuild_tensor_v2: a storage expected as the first argument, found "
                         f"{type(storage).__name__}")
        if type(storage_offset) is not int or storage_offset < 0:
            _fail(where, f"_rebuild_tensor_v2: a non-negative storage offset expected, found {storage_offset!r}")
        size = _int_tuple(size, "_rebuild_tensor_v2 size", where)
        stride = _int_tuple(stride, "_rebuild_tensor_v2 stride", where)
        if len(size) != len(stride):
            _fail(where, f"_rebuild_tensor_v2: size {list(size)} and stride {list(stride)} differ in rank")
        return _Rebuilt(storage, storage_offset, size, stride)
    return _rebuild_tensor_v2


def _rebuild_parameter_for(where):
    def _rebuild_parameter(data=None, *rest, **kwargs):
        if not isinstance(data, _Rebuilt):
            _fail(where, f"_rebuild_parameter: a tensor expected, found {type(data).__name__}")
        return data
    return _rebuild_parameter


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str, storages, prefix: str = ""):
        super().__init__(io.BytesIO(data))
        self._where = where
        self._prefix = prefix
        self._storages = storages   # key -> (file offset, nbytes) of the zip entry
        self._loaded: dict[tuple, _Storage] = {}
        self._byteswap = False
        rebuild, param = _rebuild_tensor_for(where), _rebuild_parameter_for(where)
        self._allowed = {
            ("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2"): rebuild,
            ("torch._utils", "_rebuild_tensor"): rebuild,
            ("torch._utils", "_rebuild_parameter"): param,
            ("torch._utils", "_rebuild_parameter_with_state"): param,
        }
        for name, dtype in STORAGE_DTYPES.items():
            self._allowed[("torch", name)] = _StorageType(name, dtype)

    def find_class(self, module, name):
        found = self._allowed.get((module, name))
        if found is None:
            shown = f"{module}.{name}"
            if len(shown) > 200:
                shown = shown[:200] + "..."
            raise RecordError(
                f"refused: the pickle asks for the global {shown}, which a state dict does not need "
                f"(nothing was run; allowed: {', '.join(ALLOWED_GLOBALS[:5])} and torch storage types)",
                where=self._where)
        return found

    def persistent_load(self, pid):
        where = self._where
        if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage":
            _fail(where, f"a persistent id ('storage', type, key, location, numel) expected, "
                         f"found {_short(pid)}")
        _, stype, key, location, numel = pid
        if not isinstance(stype, _StorageType):
            _fail(where, f"storage {_short(key)}: a torch storage type expected, found {_short(stype)}")
        if not isinstance(key, str) or key not in self._storages:
            _fail(where, f"storage {_short(key)}: the archive has no entry {self._prefix}data/<key> for it")
        if type(numel) is not int or numel < 0:
            _fail(where, f"storage {key!r}: a non-negative element count expected, found {_short(numel)}")
        offset, nbytes = self._storages[key]
        itemsize = storage_dtype(stype.dtype).itemsize
        if numel * itemsize != nbytes:
            _fail(where, f"storage {key!r}: {numel} elements of {stype.name} need {numel * itemsize} bytes, "
                         f"its entry data/{key} holds {nbytes}")
        cached = self._loaded.get((key, stype.dtype))
        if cached is None:
            cached = self._loaded[(key, stype.dtype)] = _Storage(key, stype.dtype, numel, offset, self._byteswap)
        return cached


def _short(value) -> str:
    text = repr(value) if isinstance(value, (str, int, bytes, tuple, type(None))) else type(value).__name__
    return text if len(text) <= 80 else text[:80] + "..."


class _SourceFile(io.RawIOBase):
    """A read-only, seekable file object over a FileSource, for zipfile: every byte read goes
    through the source (and its identity checks)."""

    def __init__(self, source: FileSource):
        self._src = source
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._src.size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if pos < 0:
            raise OSError("seek before the start of the file")
        self._pos = pos
        return pos

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._src.size - self._pos))
        if n:
            self._src.read_into(view[:n], self._pos)
            self._pos += n
        return n

    def read(self, n=-1):
        if n is None or n < 0:
            n = self._src.size - self._pos
        data = self._src.read_bytes(self._pos, n) if self._pos < self._src.size else b""
        self._pos += len(data)
        return data


class TorchTensor:
    """One tensor of a torch zip checkpoint, described but not read: `dtype` (burnpack name),
    `shape`, and where its elements are (`storage` key, element `offset`, `stride`)."""

    __slots__ = ("name", "dtype", "shape", "stride", "offset", "storage", "nbytes", "_zip", "_file_offset",
                 "_byteswap", "_span")

    def __init__(self, zipped: "TorchZip", name: str, rebuilt: _Rebuilt):
        st = rebuilt.storage
        where = zipped.where
        self.name = name
        self.dtype = st.dtype
        self.shape = rebuilt.size
        self.stride = rebuilt.stride
        self.offset = rebuilt.offset
        self.storage = st.key
        self._zip = zipped
        self._byteswap = st.byteswap
        check_shape(self.shape, self.dtype, name, where)
        itemsize = storage_dtype(self.dtype).itemsize
        count = math.prod(self.shape)
        self.nbytes = count * itemsize
        if self.nbytes > zipped.source.size + EXPAND_SLACK:
            # only a view with zero strides (expand) can be larger than its storage: refused past the
            # file's size, so that a small file cannot make a reader allocate without bound
            _fail(where, f"tensor {name!r}: shape {list(self.shape)} of {self.dtype} makes {self.nbytes} bytes, more than "
                         f"the whole file ({zipped.source.size} bytes); an expanded view that large is refused")
        if count == 0:
            self._span = 0
            if self.offset > st.numel:
                _fail(where, f"tensor {name!r}: storage offset {self.offset} is past the end of storage "
                             f"{st.key!r} ({st.numel} elements)")
        else:
            last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
            if last >= st.numel:
                _fail(where, f"tensor {name!r}: shape {list(self.shape)}, stride {list(self.stride)} and "
                             f"offset {self.offset} reach element {last} of storage {st.key!r}, which holds "
                             f"{st.numel} elements of {self.dtype}")
            self._span = last - self.offset + 1
        self._file_offset = st.offset + self.offset * itemsize

    def __repr__(self) -> str:
        return f"TorchTensor({self.name!r}, {self.dtype}, {list(self.shape)})"

    def read_stored(self) -> np.ndarray:
        """A new owned C-contiguous array of `shape` in the storage dtype (BF16 as uint16,
        bools as bool): exactly the stored elements the view selects."""
        sd = storage_dtype(self.dtype)
        if self._span == 0:
            out = np.zeros(self.shape, sd)
        else:
            flat = self._zip.source.read_array(self._file_offset, sd.newbyteorder(">") if self._byteswap else sd,
                                               self._span)
            if self._byteswap:
                flat = flat.astype(sd)
            if self._span == math.prod(self.shape) and _is_contiguous(self.shape, self.stride):
                out = flat.reshape(self.shape)
            else:
                isz = sd.itemsize
                out = np.lib.stride_tricks.as_strided(flat, shape=self.shape,
                                                      strides=tuple(s * isz for s in self.stride),
                                                      writeable=False).copy()
        if self.dtype.startswith("Bool("):
            out = out != 0
        return out


def _is_contiguous(shape, stride) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class TorchZip:
    """A `torch.save` zip file opened lazily: the pickle is read and checked, the tensors are
    described in `tensors` (name -> TorchTensor) and read at first use. Keeps the file open
    through a FileSource until `close()` (or the end of a `with` block)."""

    def __init__(self, path, where: str | None = None, source: FileSource | None = None):
        self.source = source if source is not None else FileSource(path, where)
        self.where = self.source.where if where is None else where
        try:
            self.tensors: dict[str, TorchTensor] = self._read()
        except BaseException:
            if source is None:
                self.source.close()
            raise

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> "TorchZip":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def _read(self) -> dict[str, TorchTensor]:
        where = self.where
        src = self.source
        first = src.read_bytes(0, 8)
        if not is_torch_zip(first):
            if first[:2] == b"\x80\x02" or first[:1] == b"\x80":
                _fail(where, "a PyTorch checkpoint in the legacy format (before PyTorch 1.6) is not supported: "
                             "a torch.save zip archive expected (re-save it with torch.save)")
            _fail(where, f"not a PyTorch zip checkpoint: bytes {ZIP_MAGIC!r} expected, found {bytes(first[:4])!r}")
        try:
            return self._read_zip()
        except RecordError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, TypeError,
                struct.error, NotImplementedError, KeyError, IndexError, AttributeError, OverflowError,
                RuntimeError, MemoryError, RecursionError, pickle.UnpicklingError, LookupError) as exc:
            _fail(where, f"not a readable PyTorch zip checkpoint (truncated or damaged): {type(exc).__name__}: "
                         f"{_clip(str(exc))}")

    def _read_zip(self) -> dict[str, TorchTensor]:
        where = self.where
        src = self.source
        announced = _zip_entry_count(src)
        if announced is not None and announced > MAX_ZIP_ENTRIES:
            # zipfile would build all of them first (300,000 entries: seconds)
            _fail(where, f"{announced} zip entries exceed the limit of {MAX_ZIP_ENTRIES} (a storage each: at most "
                         f"{MAX_TENSORS} tensors); refused from the archive's end record")
        with zipfile.ZipFile(_SourceFile(src)) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_ZIP_ENTRIES:
                _fail(where, f"{len(infos)} zip entries exceed the limit of {MAX_ZIP_ENTRIES}")
            pkls = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
            if len(pkls) != 1:
                names = ", ".join(i.filename for i in infos[:8])
                _fail(where, f"a torch.save archive expected (one <archive>/data.pkl entry), found "
                             f"{len(pkls)} among: {names or 'no entries'}")
            prefix = pkls[0].filename[: -len("data.pkl")]
            byteswap = False
            for i in infos:
                if i.filename == prefix + "byteorder":
                    if i.file_size > 16:
                        _fail(where, f"{i.filename}: 'little' or 'big' expected, found {i.file_size} bytes")
                    order = zf.read(i).decode("ascii", "replace").strip()
                    if order not in ("little", "big"):
                        _fail(where, f"{i.filename}: 'little' or 'big' expected, found {order!r}")
                    byteswap = order == "big"
            storages = {}
            data_prefix = prefix + "data/"
            for i in infos:
                if i.filename.startswith(data_prefix) and "/" not in i.filename[len(data_prefix):]:
                    key = i.filename[len(data_prefix):]
                    if key in storages:
                        _fail(where, f"storage entry {i.filename} appears twice in the archive")
                    storages[key] = self._entry_span(i)
            pkl = pkls[0]
            if pkl.file_size > MAX_PICKLE_BYTES:
                _fail(where, f"{pkl.filename}: {pkl.file_size} bytes exceed the limit of {MAX_PICKLE_BYTES} "
                             f"for a state dict's pickle")
            with zf.open(pkl) as f:
                data = f.read(MAX_PICKLE_BYTES + 1)
            if len(data) > MAX_PICKLE_BYTES:
                _fail(where, f"{pkl.filename}: more than {MAX_PICKLE_BYTES} bytes")
        _prescan(data, where, pkl.filename)
        unpickler = _RestrictedUnpickler(data, where, storages, prefix)
        unpickler._byteswap = byteswap
        try:
            root = unpickler.load()
        except RecordError:
            raise
        except Exception as exc:  # noqa: BLE001 (a damaged pickle: every failure is the file's)
            _fail(where, f"{pkl.filename}: the pickle cannot be read: {type(exc).__name__}: {_clip(str(exc))}")
        return self._describe(root)

    def _entry_span(self, info: zipfile.ZipInfo) -> tuple[int, int]:
        """(file offset of the data, byte count) of a stored zip entry, from its local header."""
        where = self.where
        if info.compress_type != zipfile.ZIP_STORED:
            _fail(where, f"storage entry {info.filename} is compressed (method {info.compress_type}); "
                         f"torch.save stores storages uncompressed, so the file was repacked: re-save it with torch.save")
        if info.file_size != info.compress_size:
            _fail(where, f"storage entry {info.filename}: a stored entry's sizes must agree, found "
                         f"{info.compress_size} stored and {info.file_size} uncompressed bytes")
        head = self.source.read_bytes(info.header_offset, 30)
        if len(head) < 30 or head[:4] != ZIP_MAGIC:
            _fail(where, f"storage entry {info.filename}: no zip local header at byte {info.header_offset}")
        name_len, extra_len = struct.unpack_from("<HH", head, 26)
        start = info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > self.source.size:
            _fail(where, f"truncated: storage entry {info.filename} needs bytes [{start}, {start + info.file_size}), "
                         f"the file has {self.source.size}")
        return start, info.file_size

    def _describe(self, root) -> dict[str, TorchTensor]:
        where = self.where
        if not isinstance(root, dict):
            _fail(where, f"a state dict (a dict of name -> tensor) expected, the pickle holds a "
                         f"{type(root).__name__}")
        if len(root) > MAX_TENSORS:
            _fail(where, f"{len(root)} tensors exceed the limit of {MAX_TENSORS}")
        out = {}
        for name, value in root.items():
            if not isinstance(name, str):
                _fail(where, f"tensor names must be text, found {_short(name)}")
            if isinstance(value, dict):
                keys = ", ".join(repr(k) for k in list(value)[:5])
                _fail(where, f"entry {name!r} holds a nested dict ({keys}); a flat state dict of tensors expected")
            if not isinstance(value, _Rebuilt):
                _fail(where, f"entry {name!r} holds a value of type {type(value).__name__}; a tensor expected")
            out[name] = TorchTensor(self, name, value)
        total = sum(t.nbytes for t in out.values())
        if total > TOTAL_FACTOR * self.source.size + EXPAND_SLACK:
            _fail(where, f"the state dict's {len(out)} tensors make {total} bytes, more than {TOTAL_FACTOR} times the "
                         f"file ({self.source.size} bytes): views that share or expand storages that far are refused")
        return out


_REFUSED_OPS = frozenset({"EXT1", "EXT2", "EXT4", "PERSID"})  # copyreg's registry; text ids (torch writes BINPERSID)
_PAIR_OPS = frozenset({"GLOBAL", "INST"})  # two newline-terminated arguments


def _opcode_table():
    """code -> (name, argument size or kind, stack items below a mark it takes or None, stack items
    it leaves or its stack change), from pickletools' descriptions of the opcodes."""
    import pickletools  # noqa: PLC0415 (only needed here)

    table = [None] * 256
    for op in pickletools.opcodes:
        before = [s.name for s in op.stack_before]
        after = len(op.stack_after)
        if "mark" in before:
            stack = (before.index("mark"), after)
        else:
            stack = (None, 0 if op.name == "MARK" else after - len(before))  # marks are kept apart
        table[ord(op.code)] = (op.name, op.arg.n if op.arg is not None else 0) + stack
    return table


_OPCODES = None


def _prescan(data: bytes, where: str, entry: str) -> None:
    """Walk the pickle's opcodes (reading their arguments' sizes, running nothing) before loading
    it, refusing:

    - a memo index beyond the number of opcodes read so far: the C unpickler grows its memo to any
      index a PUT names, so an 8-byte pickle `]r\xff\xff\xff\x07.` would allocate and clear 2 GB, and
      a pickler numbers its memo entries 0, 1, 2, ...;
    - the copyreg extension opcodes and text persistent ids, which state dicts do not use;
    - more than MAX_TENSORS entries set into the state dict (the dict at the bottom of the stack),
      counted as they come: a state dict of 300,000 tensors is refused a third of the way through
      its pickle, before a single tensor is described."""
    global _OPCODES
    if _OPCODES is None:
        _OPCODES = _opcode_table()
    table = _OPCODES
    n = len(data)
    pos = count = depth = entries = 0
    marks: list[int] = []
    find, from_bytes = data.find, int.from_bytes
    while True:
        if pos >= n:
            _fail(where, f"{entry}: the pickle cannot be read: it ends at byte {n} without a STOP opcode")
        at = pos
        info = table[data[pos]]
        if info is None:
            _fail(where, f"{entry}: the pickle cannot be read: unknown opcode {data[pos]:#04x} at byte {pos}")
        name, arg, below, after = info
        pos += 1
        value = None
        if arg > 0:
            if name in ("BINPUT", "LONG_BINPUT"):
                value = from_bytes(data[pos:pos + arg], "little")
            pos += arg
        elif arg == -1:  # up to a newline (GLOBAL and INST: two of them)
            end = find(b"\n", pos)
            if name in _PAIR_OPS and end >= 0:
                end = find(b"\n", end + 1)
            if end < 0:
                _fail(where, f"{entry}: the pickle cannot be read: {name} at byte {at} has no newline")
            if name == "PUT":
                text = data[pos:end]
                if not 0 < len(text) <= 20 or not text.isdigit():
                    _fail(where, f"{entry}: the pickle cannot be read: PUT at byte {at} has no memo index")
                value = int(text)
            pos = end + 1
        elif arg < 0:  # a length of 1, 4 (signed, unsigned) or 8 bytes, then that many bytes
            size = (0, 0, 1, 4, 4, 8)[-arg]
            length = from_bytes(data[pos:pos + size], "little", signed=arg == -3)
            pos += size + length
            if length < 0:
                _fail(where, f"{entry}: the pickle cannot be read: {name} at byte {at} has a negative length")
        if pos > n:
            _fail(where, f"{entry}: the pickle cannot be read: {name} at byte {at} runs past its end ({n} bytes)")
        if value is not None and not 0 <= value <= count:
            _fail(where, f"{entry}: memo index {_short(value)} at byte {at} is beyond the {count} opcodes "
                         f"before it; a pickler numbers them in order (refused, nothing was run)")
        if name in _REFUSED_OPS:
            _fail(where, f"{entry}: opcode {name} at byte {at} is not used by state dicts (refused, nothing "
                         f"was run)")
        if below is None:
            if name == "MARK":
                marks.append(depth)
            elif name == "SETITEM" and depth == 3:
                entries += 1
            elif name == "STOP":
                return
            depth += after
        else:  # takes the items above the last mark, the mark, and `below` items under it
            if not marks:
                _fail(where, f"{entry}: the pickle cannot be read: {name} at byte {at} without a MARK")
            mark = marks.pop()
            if name == "SETITEMS" and mark == 1:
                entries += (depth - mark) // 2
            depth = mark - below + after
        if depth < 0:
            _fail(where, f"{entry}: the pickle cannot be read: {name} at byte {at} takes more than the stack holds")
        if entries > MAX_TENSORS:
            _fail(where, f"{entry}: the state dict sets more than {MAX_TENSORS} entries (at byte {at}), the limit "
                         f"of tensors; refused before it was loaded")
        count += 1


def _zip_entry_count(src: FileSource) -> int | None:
    """The number of entries a zip archive's end record announces (its zip64 record's when the
    count does not fit 16 bits), read from the file's last 64 KiB; None where the records are
    not found (zipfile then says what is wrong)."""
    tail_start = max(0, src.size - (22 + 0xFFFF + 20))
    tail = src.read_bytes(tail_start, src.size - tail_start)
    end = tail.rfind(b"PK\x05\x06")
    if end < 0 or end + 22 > len(tail):
        return None
    count = struct.unpack_from("<H", tail, end + 10)[0]
    if count != 0xFFFF or end < 20 or tail[end - 20:end - 16] != b"PK\x06\x07":
        return count
    (offset,) = struct.unpack_from("<Q", tail, end - 20 + 8)
    if offset + 56 > src.size:
        return None
    record = src.read_bytes(offset, 56)
    if record[:4] != b"PK\x06\x06":
        return None
    return struct.unpack_from("<Q", record, 32)[0]


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."


def load_entries(source: FileSource, where: str | None = None) -> list[TensorEntry]:
    """Every tensor of a torch zip checkpoint read into arrays of its own (for
    `ModuleRecord.load`), in the state dict's order. The caller closes the source."""
    z = TorchZip(source.path, where, source=source)
    return [TensorEntry(t.name, t.dtype, t.shape, t.read_stored()) for t in z.tensors.values()]
