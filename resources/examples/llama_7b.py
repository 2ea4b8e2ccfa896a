"""Llama-2-7B: `engine.models.LlamaForCausalLM` built from Llama-2-7B's config.json settings (32
layers, hidden size 4096, 32 heads and 32 key/value heads, SwiGLU feed-forward of 11008, rms eps
1e-5, rotary theta 10000 over 4096 positions, vocabulary 32000, untied head) -- 6,738,415,616
parameters, named as Hugging Face names them less `model.` (`layers.0.self_attn.query.weight` is
`model.layers.0.self_attn.q_proj.weight`), so a real Llama-2 folder's tensors load into it.

Every parameter is lazy: building, counting and displaying the model allocate no weights (the
rotary table is computed on first use too). `build_config(...)` gives the same architecture at
any size, e.g. a tiny one that runs a forward pass in tests.
"""
from engine import Tensor
from engine.models.llama import LlamaConfig, LlamaForCausalLM

DESCRIPTION = "Llama-2-7B (LlamaForCausalLM, 32 layers, hidden 4096): 6.7 B lazy parameters"

# Llama-2-7B's config.json (meta-llama/Llama-2-7b-hf)
LLAMA_2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                  max_position_embeddings=4096, tie_word_embeddings=False)

# the short names this example took before it was the real architecture
_ALIASES = {"d_model": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
            "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size", "max_seq_length": "max_position_embeddings",
            "norm_eps": "rms_norm_eps"}


def config(**overrides) -> LlamaConfig:
    """Llama-2-7B's config with `overrides` (config.json names, or d_model / n_layers / n_heads / d_ff /
    max_seq_length); the key/value heads follow the heads unless given."""
    values = dict(LLAMA_2_7B)
    given = {_ALIASES.get(k, k): v for k, v in overrides.items()}
    if "num_attention_heads" in given and "num_key_value_heads" not in given:
        given["num_key_value_heads"] = given["num_attention_heads"]
    values.update(given)
    return LlamaConfig(**values)


def build_config(device=None, **overrides) -> LlamaForCausalLM:
    return LlamaForCausalLM(config(**overrides), device)


def build(device=None) -> LlamaForCausalLM:
    return LlamaForCausalLM(config(), device)


def example_input(batch: int, device=None):
    return Tensor.from_data([[1, 450, 4996, 17354, 1701, 29916, 432, 17204][: 8]] * batch, device=device)
