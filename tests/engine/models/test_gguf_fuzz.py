"""Fuzzing the GGUF reader (issue 46, item 6): seeded mutations of the committed Qwen2 fixture
(bit flips in the header, its counts, lengths, dims, types and offsets set to hostile values, and
truncations) opened with `from_pretrained`, every tensor read by a forward pass, and its
tokenizer built. Every case must end in a clean load or a `PretrainedError` / `TokenizerError`
(never another exception) with the address space capped a few hundred MiB above its size at the
start (`tests.limits.capped_memory`), so that a reader that trusted a size from the file fails."""
from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from engine import Tensor  # noqa: E402
from engine.models import PretrainedError, from_pretrained  # noqa: E402
from engine.train.gguf_tokenizer import load_gguf_tokenizer  # noqa: E402
from engine.train.tokenizer import TokenizerError  # noqa: E402
from tests.limits import capped_memory  # noqa: E402

SEED_FILE = Path(__file__).resolve().parents[2] / "fixtures" / "gguf" / "tiny-qwen2-q8.gguf"
HOSTILE = [0, 1, 2, 3, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**64 - 1]


def _header_fields(raw: bytes) -> list[tuple[int, str]]:
    """(offset, struct format) of the header's integers, found with the gguf package's reader:
    counts, key lengths, value types, array lengths, tensor name lengths, dims, types, offsets."""
    reader = gguf.GGUFReader(str(SEED_FILE))
    out = [(8, "<Q"), (16, "<Q")]
    for field in list(reader.fields.values())[3:]:
        out.append((field.offset, "<Q"))                        # the key's length
        key_len = int(field.parts[0][0])
        out.append((field.offset + 8 + key_len, "<I"))          # the value type
        if field.types and field.types[0] in (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING):
            out.append((field.offset + 12 + key_len, "<I" if field.types[0] == gguf.GGUFValueType.ARRAY else "<Q"))
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                out.append((field.offset + 16 + key_len, "<Q"))  # the array's length
    for t in reader.tensors:
        at = t.field.offset
        name_len = int(t.field.parts[0][0])
        n_dims = int(t.field.parts[2][0])
        out.append((at, "<Q"))
        out.append((at + 8 + name_len, "<I"))
        for d in range(n_dims):
            out.append((at + 12 + name_len + 8 * d, "<Q"))
        out.append((at + 12 + name_len + 8 * n_dims, "<I"))     # the ggml type
        out.append((at + 16 + name_len + 8 * n_dims, "<Q"))     # the data offset
    return out


def _mutate(seed: bytes, fields, header_end: int, rng: random.Random, case: int) -> bytes:
    kind = case % 4
    b = bytearray(seed)
    if kind == 0:
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(4, header_end)] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind in (1, 2):
        for _ in range(rng.randint(1, 2)):
            at, fmt = rng.choice(fields)
            value = rng.choice(HOSTILE)
            struct.pack_into(fmt, b, at, value & (0xFFFFFFFF if fmt == "<I" else 0xFFFFFFFFFFFFFFFF))
        return bytes(b)
    return seed[: rng.randrange(len(seed))]


@pytest.mark.parametrize("run", [0, pytest.param(1, marks=pytest.mark.long, id="more")], ids=["default", "more"])
def test_fuzzed_gguf_files_load_cleanly_or_are_refused(tmp_path, run):
    seed = SEED_FILE.read_bytes()
    fields = _header_fields(seed)
    header_end = max(at for at, _ in fields) + 16
    rng = random.Random(46 if run == 0 else 4646)
    counts = {"cases": 0, "accepted": 0, "rejected": 0}
    path = tmp_path / "fuzz.gguf"
    ids = Tensor.from_data(np.array([[1, 5, 9, 2]]), dtype="int64")
    for case in range(160 * 5 ** run):
        path.write_bytes(_mutate(seed, fields, header_end, rng, case))
        counts["cases"] += 1
        try:
            with capped_memory():
                model = from_pretrained(path)
                model.forward(ids)
                load_gguf_tokenizer(path)
            counts["accepted"] += 1
        except (PretrainedError, TokenizerError):
            counts["rejected"] += 1
    print(f"\nGGUF fuzz: {counts}")
    assert counts["rejected"] > counts["cases"] // 2 and counts["accepted"] > 0, counts
