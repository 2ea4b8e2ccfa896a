"""CBOR for burnpack metadata, through `cbor2`, hardened for untrusted input.

Writing follows what Burn's serializer (ciborium) produces: definite lengths, integers in
their shortest form, floats in the shortest width that keeps the value bit for bit, map keys
in the order the caller built them.

Reading never trusts a length before checking it: a pure-Python pre-scan walks the item
headers first and rejects anything the metadata cannot contain (tags, indefinite lengths,
simple values other than false/true/null, reserved header values), claims of more items or
bytes than the input holds, nesting deeper than `MAX_DEPTH` and more than `MAX_ITEMS`
items. Only then does `cbor2` build the objects, with tags refused a second time (a tag hook
and semantic decoders that raise), duplicate keys refused and only text/bytes map keys.
So decoding allocates at most a small multiple of the input's size and runs no code from it.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping

import cbor2
import numpy as np

MAX_DEPTH = 32
MAX_ITEMS = 3_000_000


class CborError(ValueError):
    """Malformed or disallowed CBOR; the message says what and at which byte."""


# ------------------------------------------------------------------ encoding
def _encode_float(encoder, value: float) -> None:
    # ciborium writes a float in the narrowest IEEE width that converts back bit-exactly
    f64 = struct.pack(">d", value)
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.float16(value)
        s = np.float32(value)
    if struct.pack(">d", float(h)) == f64:
        encoder.write(b"\xf9" + struct.pack(">e", h))
    elif struct.pack(">d", float(s)) == f64:
        encoder.write(b"\xfa" + struct.pack(">f", s))
    else:
        encoder.write(b"\xfb" + f64)


def dumps(obj) -> bytes:
    """Encode dicts (in their insertion order), lists, str, int, float, bool, None."""
    return cbor2.dumps(obj, encoders={float: _encode_float})


# ------------------------------------------------------------------ decoding
def _refuse_tag(*_args):
    raise CborError("CBOR tags are not allowed in burnpack metadata")


class _RefuseAllTags(Mapping):
    """semantic_decoders that answers every tag number with a refusal (cbor2 otherwise
    decodes some tags itself, e.g. 35 into a compiled regular expression)."""

    def __getitem__(self, tag):
        return _refuse_tag

    def __contains__(self, tag) -> bool:
        return True

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0


_NO_TAGS = _RefuseAllTags()
_HEAD_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}


def prescan(buf: bytes, max_items: int = MAX_ITEMS, max_depth: int = MAX_DEPTH) -> int:
    """Walk the item headers of one CBOR data item filling `buf` exactly; return the number
    of items. Raises CborError for anything outside the subset burnpack metadata uses."""
    n = len(buf)
    pos = 0
    stack = [1]  # items still expected at each open level
    items = 0
    while stack:
        if stack[-1] == 0:
            stack.pop()
            continue
        stack[-1] -= 1
        if pos >= n:
            raise CborError(f"truncated: an item was expected at byte {pos}, the metadata has {n} bytes")
        start = pos
        ib = buf[pos]
        pos += 1
        major, ai = ib >> 5, ib & 31
        if ai < 24:
            arg = ai
        elif ai in _HEAD_SIZES:
            size = _HEAD_SIZES[ai]
            if pos + size > n:
                raise CborError(f"truncated item header at byte {start}")
            arg = int.from_bytes(buf[pos:pos + size], "big")
            pos += size
        elif ai == 31:
            raise CborError(f"indefinite-length item at byte {start}: burnpack metadata uses definite lengths")
        else:
            raise CborError(f"reserved CBOR header byte 0x{ib:02x} at byte {start}")
        items += 1
        if items > max_items:
            raise CborError(f"more than {max_items} CBOR items: not burnpack metadata")
        if major in (0, 1):
            continue
        if major in (2, 3):
            if arg > n - pos:
                raise CborError(f"string at byte {start} claims {arg} bytes, only {n - pos} remain")
            pos += arg
        elif major in (4, 5):
            count = arg * (2 if major == 5 else 1)
            if count > n - pos:  # every item takes at least one byte
                raise CborError(f"container at byte {start} claims {count} items, only {n - pos} bytes remain")
            if count:
                if len(stack) >= max_depth:
                    raise CborError(f"nesting deeper than {max_depth} levels at byte {start}")
                stack.append(count)
        elif major == 6:
            raise CborError(f"CBOR tag {arg} at byte {start}: tags are not allowed in burnpack metadata")
        else:  # major 7
            if ai in (20, 21, 22) or ai in (25, 26, 27):
                continue
            raise CborError(f"CBOR simple value {arg if ai == 24 else ai} at byte {start} is not allowed")
    if pos != n:
        raise CborError(f"{n - pos} trailing bytes after the metadata item (ends at byte {pos} of {n})")
    return items


def loads(buf: bytes):
    """Decode untrusted CBOR (see the module docstring); every failure is a CborError."""
    prescan(buf)
    try:
        return cbor2.loads(
            buf,
            tag_hook=_refuse_tag,
            semantic_decoders=_NO_TAGS,
            max_depth=MAX_DEPTH + 1,
            allow_indefinite=False,
            allow_duplicate_keys=False,
            strict_hashable_types=True,
        )
    except CborError:
        raise
    except Exception as exc:  # CBORDecodeError, UnicodeDecodeError, ValueError, ...
        raise CborError(f"invalid CBOR: {exc}") from None
