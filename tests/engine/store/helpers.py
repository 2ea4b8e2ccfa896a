"""Building burnpack files by hand, including malformed ones, for the store tests."""
from __future__ import annotations

import struct

from engine.store import cbor


def align(n: int) -> int:
    return -(-n // 256) * 256


def craft(meta=None, data: bytes = b"", *, meta_bytes: bytes | None = None, version: int = 1,
          magic: bytes = b"NRUB", meta_len: int | None = None) -> bytes:
    """A burnpack with the given metadata (a dict encoded as CBOR, or raw bytes) and data
    section; `meta_len` overrides the header's length field."""
    blob = meta_bytes if meta_bytes is not None else cbor.dumps(meta)
    n = len(blob) if meta_len is None else meta_len
    head = magic + struct.pack("<HI", version, n) + blob
    return head + bytes(align(len(head)) - len(head)) + data


def desc(start: int, end: int, shape, dtype="F32", param_id=None) -> dict:
    d = {"dtype": dtype, "shape": list(shape), "data_offsets": [start, end]}
    if param_id is not None:
        d["param_id"] = param_id
    return d
