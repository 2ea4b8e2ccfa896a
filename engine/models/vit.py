"""ViT (`ViTForImageClassification`) from `engine.nn` layers, and its Hugging Face family.

    ViTForImageClassification {embeddings, encoder: {layer: [ViTLayer]}, layernorm, classifier}

Patch embedding (`nn.Conv2d`, kernel = stride = patch size) flattened to `[batch, patches, d]`,
the class token (a parameter `[1, 1, d]`) in front, learned position embeddings (a parameter
`[1, patches + 1, d]`) added; pre-norm encoder layers (`x + attention(layernorm_before(x))`,
`x + output(intermediate(layernorm_after(x)))`, LayerNorm eps 1e-12, gelu); the final `layernorm`
and the `classifier` on the class token.

`forward(pixel_values)`: float `[batch, num_channels, image_size, image_size]` -> logits
`[batch, num_labels]`. The model is built in training mode like every Ember module, so its dropout
is active on autodiff inputs; `model.valid()` is the inference model (transformers' `eval()`).

Stored names are transformers' under `vit.` (the classifier at the top level); the Ember paths
drop the `vit.` wrapper, and the attention is one `nn.MultiHeadAttention` at
`encoder.layer.{i}.attention` (transformers' `attention.attention.query` ... and
`attention.output.dense`, which is its `output`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import nn
from ..module import Module
from ..module import init as initializers
from ..tensor import Tensor
from .hf_folder import MAX_SIZE
from .gpt2 import MASKED, ConfigReader, activation
from .mapping import Rule, Transpose, WeightMap
from .pretrained import Family, layer_range

__all__ = [
    "FAMILY", "ViTConfig", "ViTEmbeddings", "ViTEncoder", "ViTForImageClassification", "ViTIntermediate",
    "ViTLayer", "ViTOutput", "ViTPatchEmbeddings",
]

_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")


def _pair(r: ConfigReader, key: str, default: int) -> tuple[int, int]:
    v = r.raw.get(key)
    if v is None:
        v = default
    if isinstance(v, (list, tuple)) and len(v) == 2:
        items = list(v)
    else:
        items = [v, v]
    if any(isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= MAX_SIZE for i in items):
        r.fail(key, f"expected an int in [1, {MAX_SIZE}] (or two of them), found {v!r}")
    return int(items[0]), int(items[1])


@dataclass(frozen=True)
class ViTConfig:
    """The settings of `ViTForImageClassification` that `config.json` holds (transformers' names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    image_size: tuple[int, int] = (224, 224)
    patch_size: tuple[int, int] = (16, 16)
    num_channels: int = 3
    num_labels: int = 2
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-12
    id2label: dict | None = None

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1]

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @staticmethod
    def from_json(raw: dict) -> "ViTConfig":
        r = ConfigReader(raw, "ViT")
        r.refuse("qkv_bias", True, "query/key/value projections without a bias")
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
        r.divides("hidden_size", hidden, "num_attention_heads", heads)
        image, patch = _pair(r, "image_size", 224), _pair(r, "patch_size", 16)
        for axis in (0, 1):
            if image[axis] % patch[axis]:
                r.fail("image_size", f"{list(image)} is not a whole number of patches of {list(patch)} (patch_size)")
        id2label = raw.get("id2label")
        if id2label is not None and not isinstance(id2label, dict):
            r.fail("id2label", f"expected an object of label names, found {id2label!r}")
        if id2label:
            num_labels = len(id2label)
            given = raw.get("num_labels")
            if given is not None and given != num_labels:
                r.fail("num_labels", f"{given!r}, but id2label names {num_labels} labels")
        else:
            num_labels = r.int("num_labels", 2)
        return ViTConfig(
            hidden_size=hidden, num_hidden_layers=r.int("num_hidden_layers"), num_attention_heads=heads,
            intermediate_size=r.int("intermediate_size"), image_size=image, patch_size=patch,
            num_channels=r.int("num_channels", 3), num_labels=num_labels,
            hidden_act=r.choice("hidden_act", "gelu", _ACTIVATIONS),
            hidden_dropout_prob=r.float("hidden_dropout_prob", 0.0, maximum=1.0),
            attention_probs_dropout_prob=r.float("attention_probs_dropout_prob", 0.0, maximum=1.0),
            layer_norm_eps=r.float("layer_norm_eps", 1e-12),
            id2label=dict(id2label) if id2label else None,
        )

    def to_json(self) -> dict:
        out = {
            "architectures": ["ViTForImageClassification"], "model_type": "vit",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "intermediate_size": self.intermediate_size,
            "image_size": _size_json(self.image_size), "patch_size": _size_json(self.patch_size),
            "num_channels": self.num_channels, "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "layer_norm_eps": self.layer_norm_eps, "qkv_bias": True,
        }
        labels = self.id2label or {str(i): f"LABEL_{i}" for i in range(self.num_labels)}
        out["id2label"] = dict(labels)
        out["label2id"] = {v: int(k) for k, v in labels.items()}
        return out


def _size_json(pair):
    return pair[0] if pair[0] == pair[1] else list(pair)


# ---------------------------------------------------------------------------------- the model
def _norm(c: ViTConfig, device):
    return nn.LayerNormConfig(c.hidden_size, epsilon=c.layer_norm_eps).init(device)


def _linear(d_in, d_out, device):
    return nn.LinearConfig(d_in, d_out, initializer=initializers.Normal(0.0, 0.02)).init(device)


class ViTPatchEmbeddings(Module):
    """`projection`: a Conv2d with kernel = stride = patch size, `[b, c, H, W] -> [b, patches, d]`."""

    def __init__(self, c: ViTConfig, device=None):
        self.projection = nn.Conv2dConfig((c.num_channels, c.hidden_size), tuple(c.patch_size),
                                          stride=tuple(c.patch_size)).init(device)

    def forward(self, pixel_values):
        x = self.projection.forward(pixel_values)  # [b, d, gh, gw]
        return x.flatten(2, 3).swap_dims(1, 2)


class ViTEmbeddings(Module):
    """The class token, the patch embeddings and the position embeddings, then dropout."""

    def __init__(self, c: ViTConfig, device=None):
        d = c.hidden_size
        self.cls_token = initializers.Normal(0.0, 0.02).init_with((1, 1, d), None, None, device)
        self.position_embeddings = initializers.Normal(0.0, 0.02).init_with((1, c.num_patches + 1, d), None, None,
                                                                            device)
        self.patch_embeddings = ViTPatchEmbeddings(c, device)
        self.dropout = nn.DropoutConfig(c.hidden_dropout_prob).init()
        self.image_size = tuple(c.image_size)

    def forward(self, pixel_values):
        channels = self.patch_embeddings.projection.weight.shape[1]
        h, w = self.image_size
        if pixel_values.rank != 4 or tuple(pixel_values.shape[1:]) != (channels, h, w):
            raise ValueError(f"pixel_values: expected dims [batch, {channels}, {h}, {w}] (num_channels, image_size), "
                             f"found {list(pixel_values.shape)}")
        patches = self.patch_embeddings.forward(pixel_values)
        batch, _, d = patches.shape
        cls = self.cls_token.val().expand(batch, 1, d)
        x = Tensor.cat([cls, patches], 1) + self.position_embeddings.val()
        return self.dropout.forward(x)


class ViTIntermediate(Module):
    """`act(dense(x))` (gelu by default)."""

    def __init__(self, c: ViTConfig, device=None):
        self.dense = _linear(c.hidden_size, c.intermediate_size, device)
        self.intermediate_act_fn = activation(c.hidden_act)

    def forward(self, x):
        return self.intermediate_act_fn.forward(self.dense.forward(x))


class ViTOutput(Module):
    """`dropout(dense(h)) + x`."""

    def __init__(self, c: ViTConfig, device=None):
        self.dense = _linear(c.intermediate_size, c.hidden_size, device)
        self.dropout = nn.DropoutConfig(c.hidden_dropout_prob).init()

    def forward(self, h, x):
        return self.dropout.forward(self.dense.forward(h)) + x


class ViTLayer(Module):
    """Pre-norm encoder layer: `x + dropout(attention(layernorm_before(x)))`, then
    `x + output(intermediate(layernorm_after(x)))`."""

    def __init__(self, c: ViTConfig, device=None):
        self.layernorm_before = _norm(c, device)
        self.attention = nn.MultiHeadAttentionConfig(
            c.hidden_size, c.num_attention_heads, dropout=c.attention_probs_dropout_prob, min_float=MASKED,
            initializer=initializers.Normal(0.0, 0.02)).init(device)
        self.attention_dropout = nn.DropoutConfig(c.hidden_dropout_prob).init()
        self.layernorm_after = _norm(c, device)
        self.intermediate = ViTIntermediate(c, device)
        self.output = ViTOutput(c, device)

    def forward(self, x):
        attended = self.attention.forward(nn.MhaInput.self_attn(self.layernorm_before.forward(x))).context
        x = x + self.attention_dropout.forward(attended)
        return self.output.forward(self.intermediate.forward(self.layernorm_after.forward(x)), x)


class ViTEncoder(Module):
    """The encoder layers, in order (`layer.0`, `layer.1`, ...)."""

    def __init__(self, c: ViTConfig, device=None):
        self.layer = [ViTLayer(c, device) for _ in layer_range(c.num_hidden_layers)]

    def forward(self, x):
        for layer in self.layer:
            x = layer.forward(x)
        return x


class ViTForImageClassification(Module):
    """ViT with its classification head (see the module docstring). `config` is its ViTConfig."""

    def __init__(self, config: ViTConfig, device=None):
        self.embeddings = ViTEmbeddings(config, device)
        self.encoder = ViTEncoder(config, device)
        self.layernorm = _norm(config, device)
        self.classifier = _linear(config.hidden_size, config.num_labels, device)
        self._config = config

    @property
    def config(self) -> ViTConfig:
        return self._config

    def hidden_states(self, pixel_values) -> Tensor:
        """The encoder's output after `layernorm`: `[batch, patches + 1, hidden_size]` (class token first)."""
        if not isinstance(pixel_values, Tensor):
            raise TypeError(f"pixel_values: expected a Tensor [batch, channels, height, width], found "
                            f"{type(pixel_values).__name__}")
        return self.layernorm.forward(self.encoder.forward(self.embeddings.forward(pixel_values)))

    def forward(self, pixel_values) -> Tensor:
        """Logits `[batch, num_labels]` of float `pixel_values` `[batch, num_channels, H, W]`."""
        hidden = self.hidden_states(pixel_values)
        return self.classifier.forward(hidden.narrow(1, 0, 1).squeeze_dim(1))


def build(config: ViTConfig, device=None) -> ViTForImageClassification:
    """The model with every parameter lazy (nothing allocated until used)."""
    return ViTForImageClassification(config, device)


def _linear_rules(hf: str, ember: str) -> list[Rule]:
    # torch nn.Linear stores [out, in]; Ember's Linear [in, out]
    return [Rule(f"{hf}.weight", f"{ember}.weight", [Transpose()]), Rule(f"{hf}.bias", f"{ember}.bias")]


def _norm_rules(hf: str, ember: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{ember}.gamma"), Rule(f"{hf}.bias", f"{ember}.beta")]


def weight_map(config: ViTConfig) -> WeightMap:
    lay, ours = "vit.encoder.layer.{i}", "encoder.layer.{i}"
    rules = [
        Rule("vit.embeddings.cls_token", "embeddings.cls_token"),
        Rule("vit.embeddings.position_embeddings", "embeddings.position_embeddings"),
        # torch's Conv2d weight [out, in, kh, kw] is Ember's layout too
        Rule("vit.embeddings.patch_embeddings.projection.weight", "embeddings.patch_embeddings.projection.weight"),
        Rule("vit.embeddings.patch_embeddings.projection.bias", "embeddings.patch_embeddings.projection.bias"),
    ]
    for part in ("query", "key", "value"):
        rules += _linear_rules(f"{lay}.attention.attention.{part}", f"{ours}.attention.{part}")
    rules += _linear_rules(f"{lay}.attention.output.dense", f"{ours}.attention.output")
    rules += _linear_rules(f"{lay}.intermediate.dense", f"{ours}.intermediate.dense")
    rules += _linear_rules(f"{lay}.output.dense", f"{ours}.output.dense")
    rules += _norm_rules(f"{lay}.layernorm_before", f"{ours}.layernorm_before")
    rules += _norm_rules(f"{lay}.layernorm_after", f"{ours}.layernorm_after")
    rules += _norm_rules("vit.layernorm", "layernorm")
    rules += _linear_rules("classifier", "classifier")
    return WeightMap(rules)


FAMILY = Family(
    name="vit",
    architectures=("ViTForImageClassification",),
    model_types=("vit",),
    config_from_json=ViTConfig.from_json,
    config_to_json=ViTConfig.to_json,
    build=build,
    weight_map=weight_map,
    layers=lambda cfg: ("num_hidden_layers", cfg.num_hidden_layers),
)
