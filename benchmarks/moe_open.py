"""Opening mixture-of-experts checkpoints lazily (issue 47, item 3): the sparse checkpoints of
Mixtral-8x7B, Qwen1.5-MoE-A2.7B (Qwen2-MoE) and Qwen3-30B-A3B, as `pretrained_open` does for Llama-2-7B.

Each folder (its real config.json sizes, bfloat16) is written to a temporary folder as transformers
shards it (5 GB shards, `model.safetensors.index.json`) in the per-expert layout transformers saves:
real safetensors headers, data areas left as holes (`truncate`), no disk space. Timed, with the growth
of resident memory: `from_pretrained` (config, headers, the lazy build, every tensor tied to its
parameter with its shape checked) and `num_params()`; no stored tensor is read. Target: under 1 s and
100 MB each.

    .venv/bin/python benchmarks/moe_open.py
"""
from __future__ import annotations

import gc
import json
import math
import os
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


def main():
    from engine.models import from_pretrained, pretrained_names
    import engine.models.moe  # noqa: F401  (the families, imported before timing)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in MODELS.items():
            made = write_sparse(Path(tmp) / label, cfg)
            gc.collect()
            r0 = rss_mib()
            t0 = time.perf_counter()
            model = from_pretrained(Path(tmp) / label)
            n = model.num_params()
            seconds = time.perf_counter() - t0
            grown = rss_mib() - r0
            assert n == made["params"], (n, made["params"])
            assert len(pretrained_names(model)) == made["tensors"]
            read = sum(1 for _, p in model.named_params() if p.is_initialized())
            rows.append([label, f"{made['params'] / 1e9:.1f} B", f"{made['tensors']}", f"{made['shards']}",
                         fmt_time(seconds), f"{grown:+.1f} MB", str(read)])
            del model
    print(machine_line())
    print_table("Opening sparse mixture-of-experts checkpoints (bfloat16, per-expert layout)", ["checkpoint", "params", "tensors", "shards", "from_pretrained + num_params", "memory", "read"], rows)


if __name__ == "__main__":
    main()
