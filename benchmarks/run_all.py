"""Run every benchmark and write benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/run_all.py [--only ops,mlp] [--out benchmarks/RESULTS.md]

Each script (benchmarks/*.py, in the order of SCRIPTS, then any others) runs as its own
process with the stable malloc settings (engine-notes.md: glibc otherwise returns large freed
temporaries to the OS and every step pays for page faults again), Qt offscreen. Its printed
tables go into RESULTS.md verbatim, and TARGETS picks the headline figures out of them: the
Ember figure, its peer measured in the same run (hand-written NumPy, PyTorch CPU,
safetensors), the ratio and the target, met or not. A figure that a script did not print (a
script missing, failing, or PyTorch absent) is listed as not measured, with the reason.

PyTorch is a benchmark-only peer, not a dependency: `.venv/bin/pip install torch==2.13.0`.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))
from benchmarks._common import STABLE_MALLOC, blas_line, cpu_name, openblas_kernels, two_core_line  # noqa: E402

SCRIPTS = ["ops", "mlp", "lazy_params", "conv", "layers", "store", "train", "gui_open", "gui_training",
           "pretrained_open", "families_open", "moe_open", "generate", "lora_step", "gpt", "onnx_export", "onnx_io"]
NOT_BENCHMARKS = {"run_all", "_common"}
# scripts that measure one thread count per process (OpenBLAS reads its thread count once, at
# start-up): run once per thread count, their outputs one after the other
VARIANTS = {"mlp": (["--threads", "1"], ["--threads", "2"]), "conv": (["--threads", "1"], ["--threads", "2"])}
TIMEOUT_S = 45 * 60


# ---------------------------------------------------------------------------------- parsing
@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> int:
        for i, h in enumerate(self.header):
            if h == name:
                return i
        for i, h in enumerate(self.header):
            if name.lower() in h.lower():
                return i
        raise LookupError(f"table {self.title!r} has no column {name!r} (columns: {self.header})")

    def row(self, *needles: str) -> list[str]:
        """The first row whose first cells contain the needles, in order (case-insensitive)."""
        for r in self.rows:
            if all(n.lower() in c.lower() for n, c in zip(needles, r)):
                return r
        raise LookupError(f"table {self.title!r} has no row {needles} (first cells: {[r[0] for r in self.rows]})")

    def cell(self, column: str, *needles: str) -> str:
        return self.row(*needles)[self.column(column)]


def parse_tables(text: str) -> list[Table]:
    """The markdown tables `_common.print_table` prints: a title line, a blank line, a header
    row, a rule, rows."""
    lines = text.splitlines()
    tables, i = [], 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and re.match(r"^\|[-|]+\|$", lines[i + 1]):
            title = ""
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j >= 0 and not lines[j].startswith("|"):
                title = lines[j].strip()
            header = _cells(lines[i])
            rows, k = [], i + 2
            while k < len(lines) and lines[k].startswith("|"):
                rows.append(_cells(lines[k]))
                k += 1
            tables.append(Table(title, header, rows))
            i = k
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def find_table(tables: list[Table], title_part: str, threads: str | None = None) -> Table:
    """The first table whose title contains `title_part` (and, given `threads`, ", N thread(s)")."""
    tag = None if threads is None else f", {threads} thread(s)"
    for t in tables:
        if title_part.lower() in t.title.lower() and (tag is None or tag in t.title):
            return t
    raise LookupError(f"no table titled like {title_part!r}{'' if tag is None else ' with ' + repr(tag)} "
                      f"(found: {[t.title[:60] for t in tables]})")


_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(text: str) -> float:
    """'12.3 µs' / '4.56 ms' / '1.20 s' -> seconds."""
    m = re.fullmatch(r"\s*([0-9.,]+)\s*(ns|µs|us|ms|s)\s*", text)
    if not m:
        raise ValueError(f"expected a time such as '4.56 ms', found {text!r}")
    return float(m.group(1).replace(",", "")) * _UNITS[m.group(2)]


def number(text: str) -> float:
    """'1.23x' / '1.23×' / '97 %' / '12,345' / '3.4 MB' -> the number."""
    m = re.search(r"-?[0-9][0-9,]*(?:\.[0-9]+)?", text)
    if not m:
        raise ValueError(f"expected a number, found {text!r}")
    return float(m.group(0).replace(",", ""))


def fmt_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


# ---------------------------------------------------------------------------------- targets
@dataclass
class Figure:
    """One summary row: the Ember figure, its peer, the ratio and whether the target is met."""

    ember: str
    peer: str = "–"
    peer_value: str = "–"
    ratio: str = "–"
    met: bool | None = None


@dataclass
class Target:
    script: str
    figure: str
    target: str
    source: str  # where the target comes from: the issue that set it, or "assumed"
    extract: Callable[[str, list[Table]], Figure]


def vs(ember_s: float, peer: str, peer_s: float, limit: float) -> Figure:
    ratio = ember_s / peer_s
    return Figure(fmt_seconds(ember_s), peer, fmt_seconds(peer_s), f"{ratio:.2f}×", ratio <= limit)


def torch_row(table: Table) -> list[str]:
    return table.row("PyTorch")


def _ops_headline(out, tables):
    t = find_table(tables, "c = a + b")
    return vs(seconds(t.cell("time", "Ember")), torch_row(t)[0], seconds(torch_row(t)[1]), 1.0)


def _ops_worst(out, tables):
    t = find_table(tables, "Per-op overhead")
    col = t.column("fwd+bwd engine/PyTorch")
    worst = max(t.rows, key=lambda r: number(r[col]))
    ratio = number(worst[col])
    return Figure(f"{worst[0]}: {worst[t.column('engine fwd+bwd')]}", "PyTorch CPU",
                  worst[t.column("PyTorch fwd+bwd")], f"{ratio:.2f}×", ratio <= 1.0)


def _mlp(peer: str, limit: float, threads: str):
    """The engine's MLP step (tensor ops) against a peer: the median paired ratio of mlp.py's
    table for that peer at `threads`, with the median blocks of both sides."""
    def extract(out, tables):
        t = find_table(tables, f"MLP training step vs {peer}", threads)
        ember = t.row("Ember engine: tensor ops")
        base = t.rows[0]
        median = t.column("median block")
        ratio = number(ember[t.column(f"vs {peer}")])
        return Figure(ember[median], base[0], base[median], f"{ratio:.2f}×", ratio <= limit)
    return extract


def _lazy(which: str):
    def extract(out, tables):
        t = find_table(tables, "Lazy parameters")
        if which == "time":
            value = seconds(t.cell("result", "total"))
            return Figure(fmt_seconds(value), met=value < 0.5)
        mb = number(t.cell("result", "resident memory"))
        init = t.cell("result", "initializers run")
        return Figure(f"{mb:.1f} MB ({init} initializers run)", met=mb < 50 and init == "0")
    return extract


def _onnx_shape_only(out, tables):
    t = find_table(tables, "ONNX export")
    value = seconds(t.cell("time", "shape-only trace llama-7b"))
    mb = number(t.cell("peak memory", "shape-only trace llama-7b"))
    note = t.cell("notes", "shape-only trace llama-7b")
    none = "; 0 parameters allocated" in note
    return Figure(f"{fmt_seconds(value)}, {mb:.0f} MB, {'none' if none else 'some'} allocated",
                  met=value < 2 and mb < 100 and none)


def _onnx_import(out, tables):
    t = find_table(tables, "Import a ResNet-50 ONNX graph")
    value = seconds(t.cell("time", "import_onnx"))
    mb = number(t.cell("resident memory", "import_onnx"))
    return Figure(f"{fmt_seconds(value)}, {mb:+.0f} MB (the 25.6 M weights included)")


def _conv(case: str, column: str, limit: float, threads: str):
    def extract(out, tables):
        t = find_table(tables, "conv2d / max_pool2d", threads)
        col = t.column(column)
        ember = seconds(t.row(case, "Ember")[col])
        peer = t.row(case, "PyTorch")
        return vs(ember, peer[1], seconds(peer[col]), limit)
    return extract


def _layers(case: str, threads: str, limit: float):
    def extract(out, tables):
        t = find_table(tables, "Layers, engine vs PyTorch")
        rows = [r for r in t.rows if case.lower() in r[0].lower()]
        if "threads" in t.header:
            rows = [r for r in rows if r[t.column("threads")] == threads]
        if not rows:
            raise LookupError(f"no row {case!r} at {threads} thread(s)")
        r = rows[0]
        peer = r[t.column("PyTorch")]
        if "not installed" in peer or peer == "-":
            raise LookupError("PyTorch is not installed")
        return vs(seconds(r[t.column("engine")]), "PyTorch CPU", seconds(peer), limit)
    return extract


def _gpt(threads: str, limit: float):
    """The slowest cell (highest ratio) of the small-GPT grid at `threads`."""
    def extract(out, tables):
        t = find_table(tables, "Small GPT training step")
        rows = [r for r in t.rows if r[t.column("threads")] == threads]
        if not rows:
            raise LookupError(f"no row at {threads} thread(s)")
        if any(r[t.column("PyTorch")] == "-" for r in rows):
            raise LookupError("PyTorch is not installed")
        worst = max(rows, key=lambda r: seconds(r[t.column("engine")]) / seconds(r[t.column("PyTorch")]))
        fig = vs(seconds(worst[t.column("engine")]), "PyTorch CPU", seconds(worst[t.column("PyTorch")]), limit)
        fig.ember += f" ({worst[0]})"
        return fig
    return extract


def _store(label: str, limit: float):
    def extract(out, tables):
        m = re.search(re.escape(label) + r"\s*:\s*([0-9.]+)x", out)
        if not m:
            raise LookupError(f"no line {label!r}")
        ratio = float(m.group(1))
        t = find_table(tables, "Checkpoint save / load")
        if label.startswith("save"):
            ember, peer = (t.cell("best", "save", "Ember burnpack (atomic"),
                           t.cell("best", "save", "safetensors.numpy.save_file + fsync"))
            peer_name = "safetensors save_file + fsync"
        else:
            ember, peer = (t.cell("best", "load", "Ember load + load_record into"),
                           t.cell("best", "load", "safetensors.numpy.load_file"))
            peer_name = "safetensors load_file"
        return Figure(ember, peer_name, peer, f"{ratio:.3g}×", ratio <= limit)
    return extract


def _train(what: str, threads: str, limit: float):
    def extract(out, tables):
        t = find_table(tables, "Training steps per second")
        for r in t.rows:
            if what.lower() in r[0].lower() and r[1] == threads:
                if r[t.column("PyTorch time/step")] == "-":
                    raise LookupError("PyTorch is not installed")
                return vs(seconds(r[t.column("engine time/step")]), "PyTorch CPU",
                          seconds(r[t.column("PyTorch time/step")]), limit)
        raise LookupError(f"no row {what!r} at {threads} thread(s)")
    return extract


def _gui_open(model: str, limit: float):
    def extract(out, tables):
        # model, modules, parameters, build s, tree s, target ("<1 ok"), window s, RSS +MiB, init, rows
        pattern = re.compile(r"\s+".join([re.escape(model) + r".*?", r"(?P<modules>[\d,]+)", r"(?P<params>[\d,]+)",
                                         r"(?P<build>[\d.]+)", r"(?P<tree>[\d.]+)", r"<[\d.]+ (?:ok|NO)",
                                         r"(?P<window>[\d.]+)", r"(?P<rss>[\d.]+)", r"(?P<init>\d+)", r"\d+"]))
        for line in out.splitlines():
            m = pattern.match(line)
            if m:
                tree_s, init = float(m["tree"]), m["init"]
                return Figure(f"tree {tree_s:.3f} s (window {float(m['window']):.3f} s, +{m['rss']} MiB, "
                              f"{init} initialized)", met=tree_s < limit and init == "0")
        raise LookupError(f"no line for {model!r}")
    return extract


def _gui_move(move: str):
    def extract(out, tables):
        # move, seconds, "<1", RSS +MiB, "<50", init, devices, ok|NO
        pattern = re.compile(re.escape(move) + r"\s+(?P<s>[\d.]+)\s+<1\s+(?P<rss>-?[\d.]+)\s+<50\s+(?P<init>\d+)")
        for line in out.splitlines():
            m = pattern.match(line)
            if m:
                s, rss, init = float(m["s"]), float(m["rss"]), int(m["init"])
                return Figure(f"{s:.3f} s, +{rss:.1f} MiB, {init} initialized", met=s < 1.0 and rss < 50 and init == 0)
        raise LookupError(f"no line for {move!r}")
    return extract


def _gui_training(which: str):
    def extract(out, tables):
        t = find_table(tables, "Training dashboard")
        r = t.row("dashboard")
        if which == "delay":
            delay = number(r[t.column("max delay")])
            return Figure(f"{delay:.1f} ms (p99 {r[t.column('p99')]})", met=delay < 50)
        head = t.row("headless")
        share = number(r[t.column("vs headless")])
        return Figure(f"{r[t.column('steps/s')]} steps/s", "headless run", f"{head[t.column('steps/s')]} steps/s",
                      f"{share / 100:.2f}×", share >= 90)
    return extract


def _pretrained_7b(out, tables):
    t = find_table(tables, "Open a 7 B sharded Hugging Face checkpoint")
    seconds_ = seconds(t.cell("time", "total"))
    mb = number(t.cell("resident memory", "total"))
    m = re.search(r"7B result: .*?(\d+) stored tensors read", out)
    if not m:
        raise LookupError("no '7B result' line")
    read = int(m.group(1))
    return Figure(f"{fmt_seconds(seconds_)}, {mb:+.1f} MB, {read} stored tensors read",
                  met=seconds_ < 1.0 and mb < 100 and read == 0)


def _families_7b(out, tables):
    """The slowest family's five steps, the most memory; met when every family's row is."""
    t = find_table(tables, "Open a 7 B-sized sparse checkpoint of each issue 47 family")
    total, mem, verdict = t.column("total"), t.column("resident memory"), t.column("stored tensors")
    if not t.rows or any(r[total] == "" for r in t.rows):
        raise LookupError("a family's checkpoint did not open")
    slowest = max(t.rows, key=lambda r: seconds(r[total]))
    most = max(number(r[mem]) for r in t.rows)
    met = all(r[verdict].endswith("; met") for r in t.rows)
    return Figure(f"slowest {slowest[0]}: {fmt_seconds(seconds(slowest[total]))}; at most {most:+.1f} MB; "
                  f"{len(t.rows)} families", met=met)


def _moe_open(out, tables):
    """The slowest mixture checkpoint's open (the best of its opens), the most memory; met when every
    checkpoint's row is."""
    t = find_table(tables, "Open a sparse mixture-of-experts checkpoint lazily")
    best, mem, verdict = t.column("from_pretrained + num_params"), t.column("resident memory"), t.column("stored tensors")
    if not t.rows or any(r[verdict] == "" for r in t.rows):
        raise LookupError("a mixture checkpoint did not open")
    slowest = max(t.rows, key=lambda r: seconds(r[best]))
    most = max(number(r[mem]) for r in t.rows)
    met = all(r[verdict].endswith("; met") for r in t.rows)
    return Figure(f"slowest {slowest[0]} ({slowest[t.column('tensors')]} tensors): {fmt_seconds(seconds(slowest[best]))}; "
                  f"at most {most:+.1f} MB; {len(t.rows)} checkpoints", met=met)


def _pretrained_first_forward(out, tables):
    t = find_table(tables, "First forward of a small real model")
    r = t.row("from_pretrained + first forward")
    peer = r[t.column("transformers (")] if any(h.startswith("transformers (") for h in t.header) else "not measured"
    ember = seconds(r[t.column("Ember")])
    if "not measured" in peer:
        raise LookupError("transformers (with torch) is not installed for the benchmark")
    theirs = seconds(peer)
    return Figure(fmt_seconds(ember), "transformers from_pretrained + first forward", fmt_seconds(theirs),
                  f"{ember / theirs:.2f}×", None)


def _generate(threads: str):
    def extract(out, tables):
        t = find_table(tables, "Greedy generation, tokens/s")
        rows = [r for r in t.rows if r[t.column("threads")] == threads]
        ember = next((r for r in rows if r[t.column("side")].startswith("Ember, KV cache")), None)
        peer = next((r for r in rows if r[t.column("side")].startswith("transformers")), None)
        if ember is None:
            raise LookupError(f"no 'Ember, KV cache' row at {threads} thread(s)")
        if peer is None:
            raise LookupError("transformers (with torch) is not installed for the benchmark")
        mine, theirs = number(ember[t.column("tokens/s")]), number(peer[t.column("tokens/s")])
        return Figure(f"{mine:.1f} tokens/s", "transformers generate", f"{theirs:.1f} tokens/s",
                      f"{mine / theirs:.2f}×", mine / theirs >= 1.0)
    return extract


def _lora_step(threads: str):
    def extract(out, tables):
        t = find_table(tables, "LoRA fine-tune step of a small Llama")
        rows = [r for r in t.rows if r[t.column("threads")] == threads]
        ember = next((r for r in rows if r[t.column("side")] == "Ember"), None)
        peer = next((r for r in rows if r[t.column("side")].startswith("PyTorch")), None)
        if ember is None:
            raise LookupError(f"no Ember row at {threads} thread(s)")
        if peer is None:
            raise LookupError("PyTorch + peft (with transformers) is not installed for the benchmark")
        col = t.column("step (median)")
        mem = t.column("step memory")
        fig = vs(seconds(ember[col]), "PyTorch + peft", seconds(peer[col]), 1.0)
        fig.ember += f" ({ember[mem]})"
        fig.peer_value += f" ({peer[mem]})"
        return fig
    return extract


TARGETS = [
    Target("ops", "c = a + b; c.sum().backward() on 2×2", "≤ 1.0× PyTorch", "issue 2", _ops_headline),
    Target("ops", "worst per-op fwd+bwd on 2×2", "≤ 1.0× PyTorch", "assumed", _ops_worst),
    Target("mlp", "MLP train step 784→512→10, batch 256, 2 threads", "≤ 1.1× NumPy", "issue 2",
           _mlp("NumPy", 1.1, "2")),
    Target("mlp", "MLP train step 784→512→10, batch 256, 1 thread", "≤ 1.0× PyTorch", "issue 22",
           _mlp("PyTorch", 1.0, "1")),
    Target("mlp", "MLP train step 784→512→10, batch 256, 2 threads", "≤ 1.0× PyTorch", "issue 22",
           _mlp("PyTorch", 1.0, "2")),
    Target("lazy_params", "6.7 B lazy params: build + count + display", "< 0.5 s", "issue 3", _lazy("time")),
    Target("lazy_params", "6.7 B lazy params: memory added", "< 50 MB, none initialized", "issue 3", _lazy("memory")),
    Target("conv", "conv2d 1→64 3x3, 28x28, fwd+bwd, 2 threads", "≤ 1.5× PyTorch", "assumed (issue 4's bound)",
           _conv("1→64", "forward + backward", 1.5, "2")),
    Target("conv", "conv2d 64→64 3x3, 13x13, fwd+bwd, 1 thread", "≤ 1.0× PyTorch", "issue 22",
           _conv("64→64", "forward + backward", 1.0, "1")),
    Target("conv", "conv2d 64→64 3x3, 13x13, fwd+bwd, 2 threads", "≤ 1.0× PyTorch", "issue 22",
           _conv("64→64", "forward + backward", 1.0, "2")),
    Target("conv", "max_pool2d 2x2, 64x26x26, fwd+bwd, 2 threads", "≤ 1.5× PyTorch", "assumed (issue 4's bound)",
           _conv("max_pool2d", "forward + backward", 1.5, "2")),
    Target("layers", "burn-mnist CNN fwd+bwd+CE, batch 64, 1 thread", "≤ 1.0× PyTorch", "issue 22",
           _layers("burn-mnist", "1", 1.0)),
    Target("layers", "burn-mnist CNN fwd+bwd+CE, batch 64, 2 threads", "≤ 1.0× PyTorch", "issue 22",
           _layers("burn-mnist", "2", 1.0)),
    Target("layers", "TransformerEncoder layer fwd+bwd, 1 thread", "≤ 1.0× PyTorch", "issue 22",
           _layers("TransformerEncoder", "1", 1.0)),
    Target("layers", "TransformerEncoder layer fwd+bwd, 2 threads", "≤ 1.0× PyTorch", "issue 22",
           _layers("TransformerEncoder", "2", 1.0)),
    Target("store", "save 100 M params, durable", "≤ 1.2× safetensors", "issue 5",
           _store("save, durable (Ember atomic vs safetensors + fsync)", 1.2)),
    Target("store", "load 100 M params into the model", "≤ 1× safetensors", "issue 5",
           _store("load into the model vs safetensors load_file", 1.0)),
    Target("train", "train step, MLP (spirals), 1 thread", "≤ 1.0× PyTorch", "issue 22", _train("MLP", "1", 1.0)),
    Target("train", "train step, MLP (spirals), 2 threads", "≤ 1.0× PyTorch", "issue 22", _train("MLP", "2", 1.0)),
    Target("train", "train step, MNIST CNN, 1 thread", "≤ 1.0× PyTorch", "issue 22", _train("MNIST", "1", 1.0)),
    Target("train", "train step, MNIST CNN, 2 threads", "≤ 1.0× PyTorch", "issue 22", _train("MNIST", "2", 1.0)),
    Target("train", "Adam update alone, 2 threads", "≤ 1.3× PyTorch", "issue 6", _train("Adam update", "2", 1.3)),
    Target("gui_open", "open the 6.7 B lazy model: tree painted", "< 1 s", "issue 8", _gui_open("llama-7b", 1.0)),
    Target("gui_open", "open a 10,000-module model: tree painted", "< 2 s", "issue 8", _gui_open("generated 10k", 2.0)),
    Target("gui_open", "fork the edited 6.7 B model in the window", "< 1 s, < 50 MB, none initialized", "issue 16",
           _gui_move("fork to cpu:1")),
    Target("gui_open", "transfer the edited 6.7 B model in the window", "< 1 s, < 50 MB, none initialized",
           "issue 16", _gui_move("transfer to cpu:2")),
    Target("gui_training", "timer delay while training (10 ms timer)", "< 50 ms", "issue 9", _gui_training("delay")),
    Target("gui_training", "dashboard throughput", "≥ 0.90× headless", "issue 9", _gui_training("throughput")),
    Target("pretrained_open", "open a 7 B sharded HF folder: open, count, display, freeze, LoRA",
           "< 1 s, < 100 MB, none read", "issue 19", _pretrained_7b),
    Target("families_open", "open a 7 B-sized sparse Qwen3 / Phi-3 / Gemma 1-3 checkpoint: open, count, display, "
           "freeze, LoRA", "< 1 s, < 100 MB, none read (each family)", "issue 47", _families_7b),
    Target("moe_open", "open a sparse Mixtral-8x7B / Qwen1.5-MoE-A2.7B / Qwen3-30B-A3B checkpoint: from_pretrained "
           "+ num_params", "< 1 s, < 100 MB, none read (each checkpoint)", "issue 47", _moe_open),
    Target("pretrained_open", "small HF Llama: from_pretrained + first forward", "side by side (no target)",
           "issue 19", _pretrained_first_forward),
    Target("generate", "greedy generation with the KV cache, 64 tokens, 1 thread", "≥ 1.0× transformers tokens/s",
           "issue 20", _generate("1")),
    Target("generate", "greedy generation with the KV cache, 64 tokens, 2 threads", "≥ 1.0× transformers tokens/s",
           "issue 20", _generate("2")),
    Target("lora_step", "LoRA q/v step, small Llama, batch 8 x 128, 1 thread", "≤ 1.0× PyTorch + peft", "issue 20",
           _lora_step("1")),
    Target("lora_step", "LoRA q/v step, small Llama, batch 8 x 128, 2 threads", "≤ 1.0× PyTorch + peft", "issue 20",
           _lora_step("2")),
    Target("gpt", "small GPT train step, worst of the batch/d/seq grid, 1 thread", "≤ 1.0× PyTorch", "issue 22",
           _gpt("1", 1.0)),
    Target("gpt", "small GPT train step, worst of the batch/d/seq grid, 2 threads", "≤ 1.0× PyTorch", "issue 22",
           _gpt("2", 1.0)),
    Target("onnx_export", "shape-only trace of llama-7b", "< 2 s, < 100 MB, none allocated", "issue 21",
           _onnx_shape_only),
    Target("onnx_io", "import_onnx of a ResNet-50-sized graph (25.6 M parameters)", "measured (no target)",
           "issue 21", _onnx_import),
]


# ---------------------------------------------------------------------------------- running
@dataclass
class Run:
    name: str
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    note: str = ""
    two_cores: str = ""  # the two-core check made just before the script ran


def discover(only: list[str] | None) -> list[str]:
    found = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_"))
    ordered = [s for s in SCRIPTS if s in found] + [s for s in found if s not in SCRIPTS]
    if only:
        unknown = [s for s in only if s not in found]
        if unknown:
            raise SystemExit(f"unknown benchmark(s) {unknown}: expected some of {ordered}")
        ordered = [s for s in ordered if s in only]
    return ordered


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(STABLE_MALLOC)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    env.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_script(name: str, timeout: float) -> Run:
    """The script once, or once per argument list of VARIANTS[name] (outputs joined in order;
    the first failure is the run's)."""
    two_cores = two_core_line()
    t0 = time.perf_counter()
    outs, errs, code = [], [], 0
    for args in VARIANTS.get(name, ([],)):
        cmd = [sys.executable, str(BENCH / f"{name}.py"), *args]
        print(f"--- {name}: {' '.join(cmd)}", flush=True)
        try:
            proc = subprocess.run(cmd, cwd=str(ROOT), env=bench_env(), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return Run(name, None, time.perf_counter() - t0, "\n".join(outs + [out]), "\n".join(errs),
                       f"stopped after {timeout:.0f} s", two_cores=two_cores)
        print(proc.stdout, flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr, flush=True)
            code = code or proc.returncode
        outs.append(proc.stdout)
        errs.append(proc.stderr)
    return Run(name, code, time.perf_counter() - t0, "\n".join(outs), "\n".join(errs), two_cores=two_cores)


def torch_version() -> str | None:
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def machine_lines() -> list[str]:
    cpu = cpu_name()
    mem = ""
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB memory"
    except (OSError, StopIteration, ValueError):
        pass
    import numpy as np  # noqa: PLC0415

    blas = ""
    try:
        cfg = np.show_config(mode="dicts")
        info = cfg["Build Dependencies"]["blas"]
        blas = f" ({info.get('name', '?')} {info.get('version', '')})".replace(" )", ")")
    except Exception:
        pass
    return [
        f"- CPU: {cpu}, {os.cpu_count()} logical cores{mem}",
        f"- OS: {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, NumPy {np.__version__}{blas}",
        f"- {openblas_kernels()}",
        f"- {blas_line()}",
    ]


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def git_commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(ROOT), capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(ROOT),
                           capture_output=True, text=True).stdout.strip()
    return (proc.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


# ---------------------------------------------------------------------------------- the report
def summarize(runs: dict[str, Run], torch: str | None) -> list[list[str]]:
    rows = []
    for t in TARGETS:
        run = runs.get(t.script)
        status_reason = None
        if run is None:
            status_reason = "not run" if (BENCH / f"{t.script}.py").is_file() else "no such benchmark yet"
        elif run.returncode is None:
            status_reason = run.note
        fig = None
        if status_reason is None:
            try:
                fig = t.extract(run.stdout, parse_tables(run.stdout))
            except (LookupError, ValueError, IndexError) as e:
                failed = f"exit status {run.returncode}; " if run.returncode else ""
                if torch is None and "PyTorch" in t.target:
                    status_reason = "PyTorch not installed"
                else:
                    status_reason = f"{failed}not in the output ({e})"
        target = t.target + (" *" if t.source.startswith("assumed") else "")
        if fig is None:
            rows.append([t.script, t.figure, "–", "–", "–", "–", target, f"not measured: {status_reason}"])
        else:
            verdict = "met" if fig.met else ("**not met**" if fig.met is False else "–")
            rows.append([t.script, t.figure, fig.ember, fig.peer, fig.peer_value, fig.ratio, target, verdict])
    return rows


def md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(c: str) -> str:
        return str(c).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def report(runs: dict[str, Run], order: list[str], torch: str | None, started: str, load_before: str,
           load_after: str, total_s: float, two_cores: tuple[str, str] = ("not measured", "not measured")) -> str:
    summary = summarize(runs, torch)
    met = sum(1 for r in summary if r[-1] == "met")
    not_met = sum(1 for r in summary if "not met" in r[-1])
    unmeasured = sum(1 for r in summary if r[-1].startswith("not measured"))
    out = ["# Benchmark results", "",
           f"Made by `benchmarks/run_all.py` (`make bench`) on {started}, commit {git_commit()}, in "
           f"{total_s / 60:.1f} minutes. Every peer was measured in the same run, on the same machine.", "",
           "## The machine", ""]
    out += machine_lines()
    out += [f"- PyTorch CPU (benchmark-only peer): {torch}" if torch else
            "- PyTorch: **not installed** — the PyTorch columns are empty and every ratio against PyTorch is "
            "not measured (`.venv/bin/pip install torch==2.13.0` installs the peer)",
            "- malloc: " + " ".join(f"{k}={v}" for k, v in STABLE_MALLOC.items()),
            f"- load average (1 / 5 / 15 min) before: {load_before}; after: {load_after}"
            + (" — **the machine was busy: figures are noisy**" if _busy(load_before, load_after) else ""),
            f"- two-core check (does the host give this VM two cores' worth?) before: {two_cores[0]}; "
            f"after: {two_cores[1]}. Each script's section gives the check made just before it.",
            "", "## Summary", "",
            f"{met} targets met, {not_met} not met, {unmeasured} not measured. Ratio = Ember / peer "
            "(lower is better) unless the target says otherwise. Targets marked * are assumed for this "
            "report (no issue states them); the others are the targets the issues set.", "",
            md_table(["benchmark", "figure", "Ember", "peer", "peer value", "ratio", "target", "result"], summary),
            "", "## Each benchmark's output", ""]
    for name in order:
        run = runs[name]
        status = (f"exit status {run.returncode}" if run.returncode is not None else run.note)
        cmds = " then ".join(f"`{Path(sys.executable).name} benchmarks/{name}.py{''.join(' ' + a for a in args)}`"
                             for args in VARIANTS.get(name, ([],)))
        out += [f"### {name}.py", "", f"{cmds}: {status}, "
                f"{run.seconds:.0f} s.", "", "```text", run.stdout.strip() or "(no output)", "```", ""]
        if run.two_cores:
            out += [f"Two-core check just before: {run.two_cores}.", ""]
        if run.returncode != 0 and run.stderr.strip():
            out += ["stderr (last lines):", "", "```text", "\n".join(run.stderr.strip().splitlines()[-15:]), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def runs_from_report(text: str) -> tuple[dict[str, Run], list[str]]:
    """The outputs a RESULTS.md recorded, as runs (to summarize them again without running)."""
    runs, order = {}, []
    pattern = re.compile(r"^### (\w+)\.py\n\n(?:`[^`]*`(?: then )?)+: (.*?), (\d+) s\.\n\n```text\n(.*?)\n```",
                         re.M | re.S)
    for m in pattern.finditer(text):
        name, status, secs, out = m.groups()
        code = re.fullmatch(r"exit status (-?\d+)", status)
        runs[name] = Run(name, int(code.group(1)) if code else None, float(secs), out, "", "" if code else status)
        order.append(name)
    return runs, order


def resummarize(path: Path) -> str:
    """RESULTS.md with its summary made again from its own recorded outputs (TARGETS changed)."""
    text = path.read_text(encoding="utf-8")
    runs, _ = runs_from_report(text)
    torch = None if "- PyTorch: **not installed**" in text else "installed"
    start, end = text.index("## Summary"), text.index("## Each benchmark's output")
    old = text[start:end]
    intro = old.split("\n\n")[1]  # the counts line
    summary = summarize(runs, torch)
    met = sum(1 for r in summary if r[-1] == "met")
    not_met = sum(1 for r in summary if "not met" in r[-1])
    unmeasured = sum(1 for r in summary if r[-1].startswith("not measured"))
    intro = re.sub(r"^\d+ targets met, \d+ not met, \d+ not measured\.",
                   f"{met} targets met, {not_met} not met, {unmeasured} not measured.", intro)
    header = ["benchmark", "figure", "Ember", "peer", "peer value", "ratio", "target", "result"]
    new = "\n\n".join(["## Summary", intro, md_table(header, summary), ""])
    return text[:start] + new + text[end:]


def _busy(*loads: str) -> bool:
    try:
        return any(float(x.split(" / ")[0]) > (os.cpu_count() or 1) * 0.75 for x in loads)
    except ValueError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated benchmark names (default: all)")
    ap.add_argument("--out", default=str(BENCH / "RESULTS.md"))
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per benchmark")
    ap.add_argument("--resummarize", metavar="RESULTS_MD",
                    help="run nothing: make the summary of an existing RESULTS.md again from the outputs it "
                         "recorded (after changing TARGETS), writing it to --out")
    args = ap.parse_args(argv)
    if args.resummarize:
        text = resummarize(Path(args.resummarize))
        Path(args.out).write_text(text, encoding="utf-8")
        print(text[text.index("## Summary"):text.index("## Each benchmark's output")])
        return 0
    order = discover(args.only.split(",") if args.only else None)
    torch = torch_version()
    if torch is None:
        print("PyTorch is not installed: ratios against PyTorch will be listed as not measured "
              "(.venv/bin/pip install torch==2.13.0 installs the benchmark-only peer)", flush=True)
    started = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load_before = load_average()
    two_cores_before = two_core_line()
    t0 = time.perf_counter()
    runs = {name: run_script(name, args.timeout) for name in order}
    total = time.perf_counter() - t0
    text = report(runs, order, torch, started, load_before, load_average(), total,
                  (two_cores_before, two_core_line()))
    Path(args.out).write_text(text, encoding="utf-8")
    summary = summarize(runs, torch)
    print(md_table(["benchmark", "figure", "Ember", "peer", "peer value", "ratio", "target", "result"], summary))
    print(f"\nwrote {args.out}")
    # a target not met is a result, not a failure; a script that crashed or hung is one
    broken = [n for n, r in runs.items() if r.returncode is None or (r.returncode != 0 and not r.stdout.strip())]
    if broken:
        print(f"benchmarks that crashed or timed out: {', '.join(broken)}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
