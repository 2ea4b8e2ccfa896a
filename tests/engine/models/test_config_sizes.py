"""A config.json's sizes against what the folder holds (issue 43, item 6): a layer count the
tensors do not bear out, or a size beyond any model, is refused before the model is built (the
build is linear in the layer count: 10**12 layers never finished); `check` stops a long open
between layers. Work is counted (parameters made, layers built), not timed."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.models import PretrainedError, from_pretrained
from engine.module import Param
from engine.store import safetensors_io

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
LAYER_KEYS = {"llama-gqa": "num_hidden_layers", "gpt2": "n_layer", "bert": "num_hidden_layers",
              "vit": "num_hidden_layers"}
_LAYER_TENSORS = [("self_attn.q_proj.weight", (4, 4)), ("self_attn.k_proj.weight", (4, 4)),
                  ("self_attn.v_proj.weight", (4, 4)), ("self_attn.o_proj.weight", (4, 4)),
                  ("input_layernorm.weight", (4,)), ("post_attention_layernorm.weight", (4,)),
                  ("mlp.gate_proj.weight", (4, 4)), ("mlp.up_proj.weight", (4, 4)), ("mlp.down_proj.weight", (4, 4))]


def tiny_llama_folder(folder: Path, layers, num_hidden_layers: int | None = None) -> Path:
    """A Llama folder (hidden 4, vocab 8) holding the tensors of `layers` (indices), zeros;
    config.json says `num_hidden_layers` (default: how many layers it holds)."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {"model.embed_tokens.weight": (8, 4), "model.norm.weight": (4,), "lm_head.weight": (8, 4)}
    for i in layers:
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in _LAYER_TENSORS})
    specs = [(name, "F32", shape, 4 * int(np.prod(shape))) for name, shape in shapes.items()]
    with open(folder / "model.safetensors", "wb") as f:
        f.write(safetensors_io.header(specs))
        f.write(bytes(sum(s[3] for s in specs)))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8, "hidden_size": 4,
              "intermediate_size": 4, "num_attention_heads": 2, "max_position_embeddings": 16,
              "num_hidden_layers": len(list(layers)) if num_hidden_layers is None else num_hidden_layers}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


class _TooMuchWork(Exception):
    pass


@pytest.fixture
def made_params(monkeypatch):
    """Counts the lazy parameters the build makes; past 10,000 the open is stopped (a build that
    would run for hours fails the test at once instead)."""
    count = [0]
    original = Param.uninitialized.__func__

    def counting(cls, *args, **kwargs):
        count[0] += 1
        if count[0] > 10_000:
            raise _TooMuchWork(f"{count[0]} parameters made")
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Param, "uninitialized", classmethod(counting))
    return count


def _with_config(tmp_path, name, **changes) -> Path:
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name", sorted(LAYER_KEYS))
@pytest.mark.parametrize("layers", [10 ** 12, 100_000])
def test_a_layer_count_beyond_the_folders_tensors_is_refused_before_building(tmp_path, made_params, name, layers):
    key = LAYER_KEYS[name]
    folder = _with_config(tmp_path, name, **{key: layers})
    with pytest.raises(PretrainedError) as info:
        from_pretrained(folder)
    text = str(info.value)
    assert f"'{key}'" in text and str(layers) in text and "config.json" in text
    if layers == 100_000:  # what the folder holds: the fixtures' 2 layers
        assert "2 layer(s) (layers 0-1)" in text
    else:
        assert "at most 2147483647" in text
    assert made_params[0] == 0  # nothing was built


def test_fewer_layers_than_the_folder_holds_and_a_missing_layer_are_named(tmp_path, made_params):
    with pytest.raises(PretrainedError, match=r"'num_hidden_layers' is 1, but the checkpoint holds the tensors of 2 "
                                              r"layer\(s\) \(layers 0-1\): expected those of layer 0"):
        from_pretrained(_with_config(tmp_path, "llama-gqa", num_hidden_layers=1))
    gap = tiny_llama_folder(tmp_path / "gap", [0, 1, 3, 4, 9], num_hidden_layers=10)
    with pytest.raises(PretrainedError, match=r"'num_hidden_layers' is 10, but the checkpoint holds the tensors of 5 "
                                              r"layer\(s\) \(layers 0-1, 3-4, 9\): expected those of layers 0-9"):
        from_pretrained(gap)
    assert made_params[0] == 0
    assert len(from_pretrained(tiny_llama_folder(tmp_path / "ok", range(3))).layers) == 3


@pytest.mark.parametrize("name, key", [("llama-gqa", "vocab_size"), ("llama-gqa", "max_position_embeddings"),
                                       ("gpt2", "n_positions"), ("bert", "intermediate_size"), ("vit", "image_size")])
def test_a_size_beyond_any_model_is_refused_naming_the_key(tmp_path, made_params, name, key):
    with pytest.raises(PretrainedError, match=rf"'{key}'.*2147483647") as info:
        from_pretrained(_with_config(tmp_path, name, **{key: 2 ** 40}))
    assert "config.json" in str(info.value)
    assert made_params[0] == 0


def test_check_runs_between_layers_and_what_it_raises_stops_the_open(tmp_path, made_params):
    folder = tiny_llama_folder(tmp_path / "m", range(40))
    calls = [0]

    def count():
        calls[0] += 1

    model = from_pretrained(folder, check=count)
    assert len(model.layers) == 40 and calls[0] >= 40  # at least once a layer
    full = made_params[0]

    class Stop(Exception):
        pass

    def stop_at_third_layer():
        calls[0] += 1
        if calls[0] == 3:
            raise Stop()

    made_params[0], calls[0] = 0, 0
    with pytest.raises(Stop):
        from_pretrained(folder, check=stop_at_third_layer)
    per_layer = 9  # each layer's parameters (2 norms, 4 projections, 3 MLP weights)
    assert made_params[0] <= 2 + 3 * per_layer < full  # the embedding, at most 3 layers, nothing after
