"""Opening Hugging Face checkpoint folders (issue 19): a 7 B sharded Llama-2 lazily, and a small
real model's first forward against transformers'.

1. A Llama-2-7B-sized folder (its config.json: hidden 4096, 32 layers, 32 heads and kv heads,
   intermediate 11008, vocab 32000, float16; 291 tensors, 6.74 B parameters, 13.5 GB) is written
   to a temporary folder as two shards and `model.safetensors.index.json`, as transformers
   shards it: every shard has its real safetensors header (`engine.store.safetensors_io.header`)
   and a data area left as a hole (`truncate`), so it takes no disk space. Then, timed, with the
   growth of resident memory: `from_pretrained` (config, headers, the model built lazily, every
   parameter tied to its stored tensor and every shape checked), `num_params()`, `str(model)`,
   freezing layers 0-15 (`freeze_group`), LoRA rank 8 on every query and value weight
   (`apply_lora`). Targets (issue 19): the five under 1 s together and under 100 MB, no stored
   tensor read.
2. First forward of a small real model: a random Llama (hidden 256, 4 layers, 8 heads, 4 kv heads,
   intermediate 688, vocab 32000, float32) made with transformers into a temporary folder; each
   side in a fresh process with the same thread count: import, `from_pretrained`, the first
   forward (one sequence of 128 tokens), a second forward; best of 3 alternating rounds. Both
   sides' logits are compared. Needs a Python with torch and transformers: this one, or the one
   named by `EMBER_ORACLE_PYTHON`; without one the transformers column says so and part 2 times
   Ember alone on the committed llama-gqa fixture.

    .venv/bin/python benchmarks/pretrained_open.py
    EMBER_ORACLE_PYTHON=/path/to/torch/python .venv/bin/python benchmarks/pretrained_open.py
"""
from __future__ import annotations

import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import child_env, fmt_time, machine_line, oracle_python, print_table, run_side, rss_mib  # noqa: E402

LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000,
}
SHARD_BYTES = 10 * 10**9  # transformers' "10GB" shards (Llama-2-7b-hf has two)
SMALL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "intermediate_size": 688, "vocab_size": 32000, "max_position_embeddings": 512}
SEQ = 128
ROUNDS = 3




# ---------------------------------------------------------------------------------- part 1
def llama_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The Hugging Face names and shapes of a Llama checkpoint, in transformers' order."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (v, d))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (d, d)), (p + "self_attn.k_proj.weight", (kv, d)),
                (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, d)),
                (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                (p + "mlp.down_proj.weight", (d, f)),
                (p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]
    out += [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]
    return out


def write_sparse_checkpoint(folder: Path, cfg: dict, dtype: str = "F16", itemsize: int = 2, tensors=None) -> dict:
    """config.json, shards with real headers and holes for data, and the index. Returns figures.
    `tensors`: [(name, shape)] in the file's order (default: a Llama's, from `cfg`)."""
    from engine.store.safetensors_io import header

    tensors = llama_tensors(cfg) if tensors is None else tensors
    shards, current, size = [], [], 0
    for name, shape in tensors:
        nbytes = math.prod(shape) * itemsize
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, dtype, shape, nbytes))
        size += nbytes
    shards.append(current)
    weight_map, disk = {}, 0
    n = len(shards)
    for i, specs in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        head = header(specs, {"format": "pt"})
        path = folder / fname
        with open(path, "wb") as fp:
            fp.write(head)
            fp.truncate(len(head) + sum(s[3] for s in specs))  # the data area: a hole
        disk += os.stat(path).st_blocks * 512
        weight_map.update({s[0]: fname for s in specs})
    total = sum(math.prod(s) * itemsize for _, s in tensors)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return {"tensors": len(tensors), "shards": n, "bytes": total, "disk": disk,
            "params": sum(math.prod(s) for _, s in tensors)}


def part1(tmp: Path) -> tuple[list, dict]:
    t0 = time.perf_counter()
    import engine.models.llama  # noqa: F401  (the family, imported before timing)
    from engine import ParamGroup
    from engine.models import from_pretrained, pretrained_names
    from engine.module import Lora
    t_import = time.perf_counter() - t0

    folder = tmp / "llama-2-7b"
    folder.mkdir()
    t0 = time.perf_counter()
    made = write_sparse_checkpoint(folder, LLAMA2_7B)
    t_write = time.perf_counter() - t0

    steps = []
    gc.collect()
    base = rss_mib()

    def step(label, fn):
        gc.collect()
        r0 = rss_mib()
        s0 = time.perf_counter()
        value = fn()
        seconds = time.perf_counter() - s0
        steps.append([label, seconds, rss_mib() - r0])
        return value

    model = step("from_pretrained(folder): config, 2 headers, lazy build, 291 tensors tied and checked",
                 lambda: from_pretrained(folder))
    n = step("num_params()", model.num_params)
    text = step("str(model) (display)", lambda: str(model))
    frozen = step("freeze layers 0-15 (freeze_group)",
                  lambda: model.freeze_group(ParamGroup.from_regex(r"^layers\.([0-9]|1[0-5])\.")))
    lora = step("LoRA rank 8 on every query/value weight (apply_lora)",
                lambda: frozen.apply_lora(Lora(8, 16.0, param_group=ParamGroup.from_regex(
                    r"\.self_attn\.(query|value)\.weight$"))))
    grown = rss_mib() - base
    total = sum(s[1] for s in steps)
    params = dict(lora.named_params())
    initialized = sum(1 for p in params.values() if p.is_initialized())
    base_read = sum(1 for path, p in params.items() if p.is_initialized() and ".lora." not in path)
    adapters = sum(1 for path in params if path.endswith(".lora.a"))
    frozen_n = sum(1 for path, p in dict(frozen.named_params()).items() if not p.is_require_grad())
    assert n == made["params"], (n, made["params"])
    assert len(pretrained_names(model)) == made["tensors"]
    # a value is read from its shard when first used (a hole reads as zeros)
    s0 = time.perf_counter()
    q = model.layers[0].self_attn.query.weight.val().numpy()
    t_read = time.perf_counter() - s0
    assert q.shape == (4096, 4096) and not q.any()

    rows = [[label, fmt_time(s), f"{mb:+.1f} MB"] for label, s, mb in steps]
    rows.append(["**total (the five steps)**", fmt_time(total), f"{grown:+.1f} MB"])
    info = {
        "total": total, "grown": grown, "n": n, "made": made, "initialized": initialized, "base_read": base_read,
        "adapters": adapters, "frozen": frozen_n, "lines": text.count("\n") + 1, "t_import": t_import,
        "t_write": t_write, "t_read": t_read,
    }
    return rows, info


# ---------------------------------------------------------------------------------- part 2
MAKE_SMALL = textwrap.dedent("""
    import json, sys, torch, transformers
    folder, sizes = sys.argv[1], json.loads(sys.argv[2])
    torch.manual_seed(19)
    cfg = transformers.LlamaConfig(**sizes, rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)
""")

EMBER_SIDE = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import engine
    from engine import Tensor
    from engine.models import from_pretrained
    import engine.models.llama
    t1 = time.perf_counter()
    folder, ids_file, out_file = sys.argv[1:4]
    model = from_pretrained(folder).valid()
    t2 = time.perf_counter()
    ids = Tensor.from_data(np.load(ids_file))
    logits = model.forward(ids).numpy()
    t3 = time.perf_counter()
    model.forward(ids).numpy()
    t4 = time.perf_counter()
    np.save(out_file, logits)
    print(json.dumps({"import": t1 - t0, "open": t2 - t1, "first": t3 - t2, "second": t4 - t3,
                      "threads": engine.num_threads()}))
""")

TORCH_SIDE = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # the model's module too, as Ember's
    t1 = time.perf_counter()
    folder, ids_file, out_file, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    t2 = time.perf_counter()
    ids = torch.from_numpy(np.load(ids_file))
    with torch.no_grad():
        logits = model(ids).logits.numpy()
        t3 = time.perf_counter()
        model(ids).logits.numpy()
    t4 = time.perf_counter()
    np.save(out_file, logits)
    print(json.dumps({"import": t1 - t0, "open": t2 - t1, "first": t3 - t2, "second": t4 - t3,
                      "threads": torch.get_num_threads()}))
""")


def part2(tmp: Path):
    import numpy as np

    oracle = oracle_python()
    threads = os.cpu_count() or 1
    if oracle is not None:
        py, versions = oracle
        folder = tmp / "llama-small"
        proc = subprocess.run([py, "-c", MAKE_SMALL, str(folder), json.dumps(SMALL)], capture_output=True, text=True,
                              env=child_env(threads), timeout=900)
        if proc.returncode != 0:
            print(f"could not make the small model with {py}: {proc.stderr.strip()[-800:]}")
            oracle = None
    if oracle is None:
        folder = ROOT / "tests" / "fixtures" / "hf" / "llama-gqa"
        vocab = 128
        what = "llama-gqa fixture (hidden 48, 2 layers, vocab 128)"
    else:
        vocab = SMALL["vocab_size"]
        what = (f"random Llama (hidden {SMALL['hidden_size']}, {SMALL['num_hidden_layers']} layers, "
                f"{SMALL['num_attention_heads']} heads / {SMALL['num_key_value_heads']} kv, intermediate "
                f"{SMALL['intermediate_size']}, vocab {vocab})")
    seq = min(SEQ, json.loads((folder / "config.json").read_text())["max_position_embeddings"])
    ids = np.random.default_rng(0).integers(3, vocab, size=(1, seq)).astype(np.int64)
    ids_file = tmp / "ids.npy"
    np.save(ids_file, ids)
    sides = {"Ember": (sys.executable, EMBER_SIDE, [str(folder), str(ids_file), str(tmp / "ember.npy")])}
    if oracle is not None:
        sides["transformers"] = (py, TORCH_SIDE, [str(folder), str(ids_file), str(tmp / "torch.npy"), str(threads)])
    best: dict = {}
    for _ in range(ROUNDS):
        for name, (python, code, args) in sides.items():
            r = run_side(python, code, args, threads)
            r["load_first"] = r["open"] + r["first"]
            for k, v in r.items():
                if k != "threads":
                    best.setdefault(name, {})[k] = min(v, best.get(name, {}).get(k, math.inf))
            best[name]["threads"] = r["threads"]
    params = sum(math.prod(s) for _, s in llama_tensors({**SMALL})) if oracle is not None else None
    diff = None
    if "transformers" in sides:
        diff = float(np.abs(np.load(tmp / "ember.npy") - np.load(tmp / "torch.npy")).max())
    rows = []
    for key, label in (("import", "import (engine.models + llama / torch + transformers + LlamaForCausalLM)"),
                       ("open", "from_pretrained(folder)"), ("first", f"first forward, 1 x {seq} tokens"),
                       ("load_first", "**from_pretrained + first forward**"),
                       ("second", f"second forward, 1 x {seq} tokens")):
        e = best["Ember"][key]
        t = best.get("transformers", {}).get(key)
        rows.append([label, fmt_time(e), fmt_time(t) if t is not None else "not measured (no torch/transformers)",
                     f"{e / t:.2f}×" if t else "–"])
    return rows, {"what": what, "threads": threads, "diff": diff, "versions": oracle[1] if oracle else None,
                  "params": params, "ember_threads": best["Ember"]["threads"],
                  "torch_threads": best.get("transformers", {}).get("threads")}


def main() -> int:
    print(machine_line())
    tmp = Path(tempfile.mkdtemp(prefix="ember-pretrained-bench-"))
    try:
        rows, info = part1(tmp)
        made = info["made"]
        met = info["total"] < 1.0 and info["grown"] < 100 and info["base_read"] == 0
        print_table(f"Open a 7 B sharded Hugging Face checkpoint, lazily (Llama-2-7B config, {made['params']:,} "
                    f"parameters, {made['tensors']} F16 tensors, {made['bytes'] / 1e9:.1f} GB in {made['shards']} "
                    f"sparse shards; targets: < 1 s and < 100 MB in all)", ["step", "time", "resident memory"], rows)
        print()
        print(f"7B result: {fmt_time(info['total'])}, {info['grown']:+.1f} MB, {info['base_read']} stored tensors "
              f"read -> {'met' if met else 'NOT met'} (< 1 s, < 100 MB, none read)")
        print(f"- the shards take {made['disk'] / 2**20:.2f} MiB on disk (headers; the data areas are holes), "
              f"written in {fmt_time(info['t_write'])}; importing engine.models + the Llama family took "
              f"{fmt_time(info['t_import'])} before the timing")
        print(f"- parameters counted: {info['n']:,}; display: {info['lines']} lines; frozen parameters: "
              f"{info['frozen']}; LoRA adapters: {info['adapters']} pairs; parameters initialized after the "
              f"five steps: {info['initialized']} (stored tensors read: {info['base_read']})")
        print(f"- afterwards, reading one q_proj weight ([4096, 4096] F16 -> float32) from its shard took "
              f"{fmt_time(info['t_read'])}")

        rows, info2 = part2(tmp)
        peers = f"transformers (torch, transformers {info2['versions']})" if info2["versions"] else "transformers"
        print_table(f"First forward of a small real model: {info2['what']}, each side in a fresh process, "
                    f"{info2['threads']} threads each (Ember {info2['ember_threads']}, torch "
                    f"{info2['torch_threads']}), best of {ROUNDS} alternating rounds",
                    ["step", "Ember", peers, "Ember / transformers"], rows)
        print()
        if info2["diff"] is not None:
            print(f"- {info2['params']:,} parameters (float32); the two sides' logits differ by at most "
                  f"{info2['diff']:.2g}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
