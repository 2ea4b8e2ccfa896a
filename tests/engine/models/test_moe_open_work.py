"""The work of opening a sparse mixture-of-experts checkpoint lazily, counted without a clock
(benchmarks/moe_open.py times it on Qwen3-30B-A3B's 18,867 tensors): the Python function calls of
`from_pretrained` + `num_params` grow linearly with the stored tensors, by a small fixed number per
tensor, whether the experts or the layers grow, and no stored tensor is read. The checkpoints are
the benchmark's: real safetensors headers, data areas left as holes."""
from __future__ import annotations


import pytest

from benchmarks.moe_open import write_sparse
from engine.models import from_pretrained, pretrained_names
from tests.work import counted_calls

# Python calls per stored tensor as the checkpoint grows: about 72 (experts) and 76 (layers) now,
# 169 and 173 before the open matched the parameters in one walk (issue 47, must-show 3)
MOST_CALLS_PER_TENSOR = 100


def _config(experts: int, layers: int) -> dict:
    """A tiny Qwen3-MoE config.json (the layout of benchmarks/moe_open.py's Qwen3-30B-A3B)."""
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": layers, "head_dim": 8, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 64, "num_experts": experts, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 128}


def _calls_to_open(folder) -> int:
    """The Python function calls of `from_pretrained(folder).num_params()` (after one warm-up open,
    so that imports and first-use caches are not counted)."""
    from_pretrained(folder).num_params()
    with counted_calls(builtins=False) as calls:
        model = from_pretrained(folder)
        model.num_params()
    assert not any(p.is_initialized() for _, p in model.named_params())  # nothing read
    return calls.n


@pytest.mark.parametrize("grow", ["experts", "layers"])
def test_opening_a_sparse_mixture_is_linear_and_small_per_tensor(grow, tmp_path):
    sizes = [(16, 2), (32, 2), (64, 2)] if grow == "experts" else [(16, 2), (16, 4), (16, 8)]
    points = []
    for experts, layers in sizes:
        folder = tmp_path / f"{experts}x{layers}"
        made = write_sparse(folder, _config(experts, layers))
        assert len(pretrained_names(from_pretrained(folder))) == made["tensors"]
        points.append((made["tensors"], _calls_to_open(folder)))
    (t0, c0), (t1, c1), (t2, c2) = points
    first, second = (c1 - c0) / (t1 - t0), (c2 - c1) / (t2 - t1)
    # linear: doubling the tensors again costs the same per added tensor (quadratic work would double it)
    assert abs(second - first) <= 0.02 * first, points
    assert second <= MOST_CALLS_PER_TENSOR, f"{second:.1f} Python calls per added tensor: {points}"
    assert c2 <= MOST_CALLS_PER_TENSOR * t2 + 5000, points  # and a small fixed part
