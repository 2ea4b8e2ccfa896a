"""The work of the steps a user takes after opening a sparse mixture of experts, counted without a clock
(benchmarks/moe_open.py times them on Qwen3-30B-A3B's 18,867 parameters): showing the model (`str`, the
display with every module's parameter count), the tree's statistics (`ModelStats`), freezing the first half
of the layers and attaching LoRA to every query / value weight. Each is a walk over the parameters: its
Python function calls grow linearly with them, by a small fixed number per parameter, whether the experts
or the layers grow. Before issue 47's steps round the display walked each module's subtree again for each
module shown (about 104 calls per parameter) and LoRA walked the model three times (77)."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.moe_open import write_sparse
from engine import ParamGroup
from engine.models import from_pretrained
from engine.module import Lora
from engine.module.summary import ModelStats
from tests.engine.models.test_moe_open_work import _config
from tests.work import counted_calls

# Python calls per added parameter, now about: display 11, stats 19, freeze 23, LoRA 44 (before: 104, 29, 37, 77)
MOST_CALLS_PER_PARAM = {"display": 20, "stats": 25, "freeze": 32, "lora": 55}


def _calls(fn) -> int:
    with counted_calls(builtins=False) as calls:
        fn()
    return calls.n


def _steps(model):
    half = len(model.layers) // 2
    first_half = ParamGroup.from_regex(r"^layers\.(" + "|".join(str(i) for i in range(half)) + r")\.")
    query_value = Lora(8, 16.0, param_group=ParamGroup.from_regex(r"\.self_attn\.(query|value)\.weight$"))
    frozen = model.freeze_group(first_half)
    return {"display": lambda: str(model), "stats": lambda: ModelStats(model),
            "freeze": lambda: model.freeze_group(first_half), "lora": lambda: frozen.apply_lora(query_value)}


@pytest.mark.parametrize("grow", ["experts", "layers"])
def test_display_stats_freeze_and_lora_are_linear_and_small_per_parameter(grow, tmp_path):
    sizes = [(16, 2), (32, 2), (64, 2)] if grow == "experts" else [(16, 2), (16, 4), (16, 8)]
    points = {step: [] for step in MOST_CALLS_PER_PARAM}
    for experts, layers in sizes:
        folder = tmp_path / f"{experts}x{layers}"
        write_sparse(folder, _config(experts, layers))
        model = from_pretrained(folder)
        n = len(model.named_params())
        steps = _steps(model)
        for step, fn in steps.items():
            fn()  # first-use caches (the regexes, the kinds of the field types) are not counted
            points[step].append((n, _calls(fn)))
        # the steps did what they say: half the layers frozen, LoRA on the other half's query and value only
        adapted = steps["lora"]()
        lora = [path for path, _ in adapted.named_params() if ".lora." in path]
        assert len(lora) == 2 * 2 * layers  # a and b of 2 weights per layer
        assert f"params: {model.num_params()}\n}}" in str(model)
        assert ModelStats(steps["freeze"]()).total.trainable < model.num_params()
    for step, ((n0, c0), (n1, c1), (n2, c2)) in points.items():
        first, second = (c1 - c0) / (n1 - n0), (c2 - c1) / (n2 - n1)
        # linear: doubling the parameters again costs the same per added parameter
        assert abs(second - first) <= 0.05 * first, (step, points[step])
        assert second <= MOST_CALLS_PER_PARAM[step], f"{step}: {second:.1f} calls per added parameter: {points[step]}"


def test_the_display_counts_a_shared_lora_a_once_and_every_module_alike():
    """The one-pass counts equal each module's own `num_params` (a parameter at several places once)."""
    from tests.engine.module.test_lora_shared_a import TiedFused

    model = TiedFused().apply_lora(Lora(2, 4.0))
    text = str(model)
    assert text.rstrip().endswith(f"params: {model.num_params()}\n}}")
    assert model.num_params() < sum(p.numel() for _, p in model.named_params()) + 5 * 2  # the a once
    for name in ("q", "k", "out"):
        child = getattr(model, name)
        assert f"params: {child.num_params()}" in text


def test_a_sparse_layer_builds_its_mixture_and_no_dense_block(monkeypatch):
    """A mixture's layers build the SparseMoe in the dense block's place (not a LlamaMlp replaced after:
    144 unused Linears on Qwen3-30B-A3B); a dense layer (`mlp_only_layers`) builds its LlamaMlp."""
    from engine.models import llama

    built = []
    dense_init = llama.LlamaMlp.__init__

    def counting(self, config, device=None):
        built.append(self)
        dense_init(self, config, device)

    monkeypatch.setattr(llama.LlamaMlp, "__init__", counting)
    model = from_pretrained(Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "qwen3-moe")
    kinds = [type(layer.mlp).__name__ for layer in model.layers]
    assert kinds.count("SparseMoe") >= 2 and kinds.count("LlamaMlp") >= 1, kinds
    assert len(built) == kinds.count("LlamaMlp")
