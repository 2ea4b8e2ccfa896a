"""Opening mixture-of-experts checkpoints lazily (issue 47, must-show 3): the sparse checkpoints of
Mixtral-8x7B, Qwen1.5-MoE-A2.7B (Qwen2-MoE) and Qwen3-30B-A3B, as `pretrained_open` does for Llama-2-7B.

Each folder (its real config.json sizes, bfloat16) is written to a temporary folder as transformers
shards it (5 GB shards, `model.safetensors.index.json`) in the per-expert layout transformers saves:
real safetensors headers, data areas left as holes (`truncate`), no disk space. Each checkpoint is
opened in a fresh process (so one model's memory is not another's), `--repeats` times (default 5):
timed, `from_pretrained` (config, headers, the lazy build, every tensor tied to its parameter with
its shape and dtype checked) and `num_params()`, the best and the median of the repeats shown (and
the least CPU time of one open: on a shared machine the wall time also counts the time other
processes held the cores), and the growth of resident memory over the first open. Target: under 1 s and 100 MB each, no stored
tensor read. Then the steps a user takes next (`families_open.py` adds them too), each timed apart, the
best of 3: `str(model)`, freezing the first half of the layers and LoRA rank 8 on every query/value
weight of the half-frozen model (target < 0.5 s each; tests/engine/models/test_moe_steps_work.py counts
their work).

    .venv/bin/python benchmarks/moe_open.py [--repeats N]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import fmt_time, machine_line, print_table, rss_mib  # noqa: E402

SHARD_BYTES = 5 * 10**9
COMMON = {"hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
MODELS = {
    "Mixtral-8x7B": {**COMMON, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                     "max_position_embeddings": 32768, "rope_theta": 1e6, "sliding_window": None},
    "Qwen1.5-MoE-A2.7B": {**COMMON, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                          "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                          "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
                          "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                          "shared_expert_intermediate_size": 5632, "max_position_embeddings": 8192},
    "Qwen3-30B-A3B": {**COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                      "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "head_dim": 128,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 151936,
                      "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                      "norm_topk_prob": True, "max_position_embeddings": 40960},
}


def tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The names and shapes transformers 5.25 saves for `cfg` (per-expert layout)."""
    d, v, mt = cfg["hidden_size"], cfg["vocab_size"], cfg["model_type"]
    hd = cfg.get("head_dim", d // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    n = cfg.get("num_local_experts", cfg.get("num_experts"))
    f = cfg["intermediate_size"] if mt == "mixtral" else cfg["moe_intermediate_size"]
    out = [("model.embed_tokens.weight", (v, d))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (q, d)), (p + "self_attn.k_proj.weight", (kv, d)),
                (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, q)),
                (p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]
        if mt == "qwen2_moe":
            out += [(p + "self_attn.q_proj.bias", (q,)), (p + "self_attn.k_proj.bias", (kv,)),
                    (p + "self_attn.v_proj.bias", (kv,))]
            s = cfg["shared_expert_intermediate_size"]
            out += [(p + "mlp.shared_expert.gate_proj.weight", (s, d)), (p + "mlp.shared_expert.up_proj.weight", (s, d)),
                    (p + "mlp.shared_expert.down_proj.weight", (d, s)), (p + "mlp.shared_expert_gate.weight", (1, d))]
        if mt == "qwen3_moe":
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        block, names = ("block_sparse_moe", ("w1", "w3", "w2")) if mt == "mixtral" else \
            ("mlp", ("gate_proj", "up_proj", "down_proj"))
        out.append((p + f"{block}.gate.weight", (n, d)))
        for e in range(n):
            out += [(p + f"{block}.experts.{e}.{names[0]}.weight", (f, d)),
                    (p + f"{block}.experts.{e}.{names[1]}.weight", (f, d)),
                    (p + f"{block}.experts.{e}.{names[2]}.weight", (d, f))]
    out += [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]
    return out


def write_sparse(folder: Path, cfg: dict) -> dict:
    from engine.store.safetensors_io import header

    folder.mkdir()
    shards, current, size = [], [], 0
    for name, shape in tensors(cfg):
        nbytes = math.prod(shape) * 2
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, "BF16", shape, nbytes))
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, specs in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        head = header(specs, {"format": "pt"})
        with open(folder / fname, "wb") as fp:
            fp.write(head)
            fp.truncate(len(head) + sum(s[3] for s in specs))
        weight_map.update({s[0]: fname for s in specs})
    all_t = tensors(cfg)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg))
    return {"tensors": len(all_t), "shards": len(shards), "params": sum(math.prod(s) for _, s in all_t)}


def one(label: str, folder: Path, repeats: int) -> dict:
    """Times one checkpoint's open in this process (run in a fresh process per checkpoint)."""
    from engine import ParamGroup
    from engine.models import from_pretrained, pretrained_names
    from engine.module import Lora

    import engine.models.moe  # noqa: F401  (the families, imported before timing)

    times, cpu = [], []
    gc.collect()
    r0 = rss_mib()
    for i in range(repeats):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        model = from_pretrained(folder)
        n = model.num_params()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if i == 0:
            grown = rss_mib() - r0
            named = len(pretrained_names(model))
        if i < repeats - 1:
            del model
    half = model.config.num_hidden_layers // 2
    first_half = ParamGroup.from_regex(r"^layers\.(" + "|".join(str(i) for i in range(half)) + r")\.")
    query_value = Lora(8, 16.0, param_group=ParamGroup.from_regex(r"\.self_attn\.(query|value)\.weight$"))
    frozen = model.freeze_group(first_half)
    steps = []  # the best of 3 of each step: the display, freezing the first half of the layers, LoRA q/v
    for step in (lambda: str(model), lambda: model.freeze_group(first_half), lambda: frozen.apply_lora(query_value)):
        best = math.inf
        for _ in range(3):
            gc.collect()
            t0 = time.perf_counter()
            out = step()
            best = min(best, time.perf_counter() - t0)
        steps.append(best)
    lora = out
    read = sum(1 for p, q in lora.named_params() if q.is_initialized() and ".lora." not in p)
    return {"times": times, "cpu": cpu, "grown": grown, "params": n, "named": named, "read": read, "steps": steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="opens per checkpoint (best and median shown)")
    parser.add_argument("--child", nargs=2, metavar=("LABEL", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the child: one checkpoint
        print(json.dumps(one(args.child[0], Path(args.child[1]), max(1, args.repeats))))
        return 0
    print(machine_line())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in MODELS.items():
            folder = Path(tmp) / label
            made = write_sparse(folder, cfg)
            proc = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--child", label,
                                   str(folder)], capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                rows.append([label, "", "", "", "failed: " + proc.stderr.strip().splitlines()[-1][:200], "", "", "", "", ""])
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            assert r["params"] == made["params"], (r, made)
            assert r["named"] == made["tensors"], (r, made)
            best, median = min(r["times"]), statistics.median(r["times"])
            met = best < 1.0 and r["grown"] < 100 and r["read"] == 0
            rows.append([label, f"{made['params'] / 1e9:.1f} B", f"{made['tensors']}", f"{made['shards']}",
                         fmt_time(best), f"{fmt_time(median)} ({len(r['times'])} opens)", fmt_time(min(r["cpu"])),
                         f"{r['grown']:+.1f} MB", f"{r['read']} read; {'met' if met else 'NOT met'}",
                         " / ".join(fmt_time(t) for t in r["steps"])])
            shutil.rmtree(folder, ignore_errors=True)
    print_table("Open a sparse mixture-of-experts checkpoint lazily (bfloat16, per-expert layout, each in a fresh "
                "process): from_pretrained + num_params, best of the opens; targets < 1 s and < 100 MB, no stored "
                "tensor read",
                ["checkpoint", "params", "tensors", "shards", "from_pretrained + num_params", "median of the opens",
                 "CPU time (least)", "resident memory",
                 "stored tensors / targets", "then display / freeze half / LoRA q/v (best of 3 each)"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
