"""Checkpoint save and load: Ember's burnpack vs the safetensors library's NumPy API.

A 100,663,296-parameter model (24 float32 tensors of [4096, 1024], 403 MB) is saved and loaded
with both, in one run, on the same arrays and the same disk (/tmp by default). Rows:

- save, Ember: `model.into_record().save(path)`: a temporary file beside the target, written,
  flushed and fsync'ed, then renamed into place (atomic). Also shown without the fsync and
  rename (`burnpack.write` to a plain file) to separate the format from the durability cost.
- save, safetensors: `safetensors.numpy.save_file(arrays, path)` (no fsync), and the same
  followed by an fsync of the file, for a like-for-like durable save.
- load, Ember: `ModuleRecord.load(path)` reads every tensor into an array of its own (one
  `preadv` per 8 MiB piece, shared out over the engine's threads; no mapping, so the record
  never depends on the file afterwards); "+ load_record" also puts every tensor into the model
  (no further copy); "one thread" is the same with `engine.set_num_threads(1)`; "+ touch every
  page" then touches every page of every tensor (kept from when loading mapped the file: a
  mapping read nothing until touched).
- load, safetensors: `safetensors.numpy.load_file(path)` (reads everything into new arrays).

Each row is the best of several runs with the file in the page cache (a second read of a
checkpoint); the runs of the two libraries alternate so that noise hits both.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 \\
    MALLOC_TOP_PAD_=268435456 .venv/bin/python benchmarks/store.py [--dir /tmp] [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import fmt_time, machine, print_table  # noqa: E402
import engine  # noqa: E402
from engine import Tensor  # noqa: E402
import numpy as np  # noqa: E402  (after the engine, which configures OpenBLAS before it loads)
from engine.module import Module, Param  # noqa: E402
from engine.store import ModuleRecord, burnpack  # noqa: E402

N_TENSORS = 24
SHAPE = (4096, 1024)


class Big(Module):
    def __init__(self, arrays):
        self.layers = [Param(Tensor.from_data(a)) for a in arrays]


def touch(arrays) -> float:
    """Read one value per 4 KiB page of every array (forces the pages in)."""
    total = 0.0
    for a in arrays:
        flat = a.reshape(-1).view(np.uint8)
        total += float(flat[::4096].sum())
    return total


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import safetensors.numpy as stn

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(N_TENSORS)]
    n_params = sum(a.size for a in arrays)
    model = Big(arrays)
    named = {f"layers.{i}": a for i, a in enumerate(arrays)}
    work = Path(tempfile.mkdtemp(prefix="ember-store-bench-", dir=args.dir))
    bpk, raw_bpk, st = work / "model.bpk", work / "plain.bpk", work / "model.safetensors"

    def ember_save():
        model.into_record().save(bpk)

    def ember_write_plain():
        with open(raw_bpk, "wb") as f:
            burnpack.write(f, model.into_record().entries())

    def st_save():
        stn.save_file(named, str(st))

    def st_save_fsync():
        stn.save_file(named, str(st))
        fd = os.open(st, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    target = Big([np.zeros(1, np.float32)] * 0)
    target.layers = [Param(Tensor.zeros(SHAPE)) for _ in range(N_TENSORS)]

    def ember_load():
        return ModuleRecord.load(bpk)

    def ember_load_record():
        return target.load_record(ModuleRecord.load(bpk))

    def ember_load_record_one_thread():
        engine.set_num_threads(1)
        try:
            return target.load_record(ModuleRecord.load(bpk))
        finally:
            engine.set_num_threads(None)

    def ember_load_touch():
        m = target.load_record(ModuleRecord.load(bpk))
        return touch([p.val()._data for _, p in m.named_params()])

    def st_load():
        return stn.load_file(str(st))

    def st_load_touch():
        return touch(stn.load_file(str(st)).values())

    cases = [
        ("save", "Ember burnpack (atomic: temp + fsync + rename)", ember_save),
        ("save", "Ember burnpack, plain write (no fsync)", ember_write_plain),
        ("save", "safetensors.numpy.save_file (no fsync)", st_save),
        ("save", "safetensors.numpy.save_file + fsync", st_save_fsync),
        ("load", "Ember ModuleRecord.load (reads every tensor)", ember_load),
        ("load", "Ember load + load_record into the model", ember_load_record),
        ("load", "Ember load + load_record, one thread", ember_load_record_one_thread),
        ("load", "Ember load + load_record + touch every page", ember_load_touch),
        ("load", "safetensors.numpy.load_file", st_load),
        ("load", "safetensors.numpy.load_file + touch every page", st_load_touch),
    ]
    times = {name: [] for _, name, _ in cases}
    try:
        # the first run of every case writes the files and warms the page cache
        for _, name, fn in cases:
            fn()
        for _ in range(args.repeat):
            for _, name, fn in cases:
                dt, _ = timed(fn)
                times[name].append(dt)
        # correctness: both files hold the same tensors
        rec = ModuleRecord.load(bpk)
        ref = stn.load_file(str(st))
        assert all(np.array_equal(rec[f"layers.{i}"].array, ref[f"layers.{i}"]) for i in range(N_TENSORS))
        size_bpk, size_st = bpk.stat().st_size, st.stat().st_size
    finally:
        for p in (bpk, raw_bpk, st):
            p.unlink(missing_ok=True)
        work.rmdir()

    best = {k: min(v) for k, v in times.items()}
    gb = n_params * 4 / 1e9
    rows = []
    for op, name, _ in cases:
        b = best[name]
        rows.append([op, name, fmt_time(b), fmt_time(statistics.median(times[name])), f"{gb / b:.2f} GB/s"])
    print_table(
        f"Checkpoint save / load: {n_params:,} float32 parameters in {N_TENSORS} tensors "
        f"({size_bpk / 1e6:.1f} MB burnpack, {size_st / 1e6:.1f} MB safetensors); "
        f"best and median of {args.repeat}; {machine()}; files in {args.dir}",
        ["op", "what", "best", "median", "throughput (best)"],
        rows,
    )
    save_ratio = best["Ember burnpack (atomic: temp + fsync + rename)"] / best["safetensors.numpy.save_file + fsync"]
    save_ratio_plain = best["Ember burnpack, plain write (no fsync)"] / best["safetensors.numpy.save_file (no fsync)"]
    load_ratio = best["Ember load + load_record into the model"] / best["safetensors.numpy.load_file"]
    load_ratio_one = best["Ember load + load_record, one thread"] / best["safetensors.numpy.load_file"]
    load_ratio_touch = best["Ember load + load_record + touch every page"] / best["safetensors.numpy.load_file"]
    print()
    print(f"save, durable (Ember atomic vs safetensors + fsync): {save_ratio:.2f}x   (target <= 1.2x)")
    print(f"save, no fsync (Ember plain write vs safetensors):   {save_ratio_plain:.2f}x")
    print(f"load into the model vs safetensors load_file:       {load_ratio:.3f}x  (target <= 1x)")
    print(f"load into the model, one thread, vs load_file:      {load_ratio_one:.3f}x")
    print(f"load + touch every page vs safetensors load_file:    {load_ratio_touch:.2f}x")


if __name__ == "__main__":
    main()
