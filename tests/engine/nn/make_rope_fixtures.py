"""Write tests/engine/nn/fixtures/rope_scaling_transformers.json: transformers' inverse rotary
frequencies for Llama-3 and linear rope scaling, for `test_attention_rotary.py` to compare
`nn.Llama3RopeScaling` / `nn.LinearRopeScaling` against.

Run by hand only, from the repository root, with the oracle venv (transformers and torch are not
Ember dependencies):

    PYTHONPATH=. /tmp/torchvenv/bin/python tests/engine/nn/make_rope_fixtures.py

Each case gives the config (head_dim, rope_theta, the scaling parameters) and transformers'
`ROPE_INIT_FUNCTIONS[rope_type](config)` inverse frequencies (float32 values written as floats)
and attention factor.
"""
from __future__ import annotations

import json
from pathlib import Path

CASES = [
    {"head_dim": 8, "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    {"head_dim": 64, "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"head_dim": 128, "rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"head_dim": 16, "rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0},
    {"head_dim": 16, "rope_theta": 10000.0, "rope_type": "default"},
]


def main():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    out = []
    for case in CASES:
        params = {k: v for k, v in case.items() if k != "head_dim"}
        cfg = LlamaConfig(hidden_size=case["head_dim"] * 2, num_attention_heads=2, head_dim=case["head_dim"],
                          max_position_embeddings=131072, rope_parameters=params)
        kind = case["rope_type"]
        if kind == "default":
            fn = LlamaRotary_default
        else:
            fn = ROPE_INIT_FUNCTIONS[kind]
        inv, factor = fn(cfg)
        out.append({**case, "inv_freq": [float(v) for v in inv.float().numpy()], "attention_factor": float(factor)})
    path = Path(__file__).parent / "fixtures" / "rope_scaling_transformers.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def LlamaRotary_default(cfg):  # noqa: N802  transformers keeps the default in the model class
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)


if __name__ == "__main__":
    main()
