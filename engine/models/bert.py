"""BERT (`BertModel`) from `engine.nn` layers, and its Hugging Face family.

    BertModel {embeddings, encoder: {layer: [BertLayer]}, pooler}

Embeddings: word + learned position + token type, then `LayerNorm` (eps 1e-12) and dropout.
Post-norm encoder layers: `attention.self` (`nn.MultiHeadAttention`: `query`, `key`, `value`,
and `output`, which is transformers' `attention.output.dense`), `attention.output.LayerNorm` over
the residual sum, `intermediate.dense` + gelu (the exact erf form), `output.dense` +
`output.LayerNorm` over the residual sum. The pooler is `dense` + tanh on the first token.

`forward(input_ids, attention_mask=None, token_type_ids=None)` -> the last hidden state
`[batch, seq, hidden_size]` (padding keys, attention_mask 0, are masked); `pooled(...)` -> the
pooler output `[batch, hidden_size]`; `pool(hidden)` pools hidden states already computed. The
model is built in training mode like every Ember module, so its dropout is active on autodiff
inputs; `model.valid()` is the inference model (transformers' `eval()`).

Stored names: a folder written by `BertModel` has `embeddings.*`, `encoder.*`, `pooler.*`; one
written by a task model (`BertForMaskedLM`, `BertForSequenceClassification`, ...) has them under
`bert.` and carries its task head (`cls.*`, `classifier.*`, ...), which is not part of `BertModel`
and is ignored. The prefix follows `config.json`'s `architectures`. Task models that have no
pooler (masked LM, token classification, question answering) give a `BertModel` without one (a
pooler such a file still holds, as files converted from pre-training checkpoints do, is ignored).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import nn
from ..module import Module
from ..module import init as initializers
from ..tensor import Tensor
from .gpt2 import MASKED, ConfigReader, activation, attention_masks, check_ids
from .mapping import Rule, Transpose, WeightMap
from .pretrained import Family, layer_range

__all__ = [
    "FAMILY", "BertAttention", "BertConfig", "BertEmbeddings", "BertEncoder", "BertIntermediate", "BertLayer",
    "BertModel", "BertOutput", "BertPooler", "BertSelfOutput",
]

_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")
# transformers' BERT task models that build BertModel(add_pooling_layer=False)
_NO_POOLER = ("BertForMaskedLM", "BertLMHeadModel", "BertForTokenClassification", "BertForQuestionAnswering")
_TASK_MODELS = _NO_POOLER + ("BertForPreTraining", "BertForSequenceClassification", "BertForMultipleChoice",
                             "BertForNextSentencePrediction")


@dataclass(frozen=True)
class BertConfig:
    """The settings of `BertModel` that `config.json` holds (transformers' names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    add_pooling_layer: bool = True
    # "" for a folder written by BertModel, "bert." for one written by a task model
    prefix: str = ""
    architecture: str = "BertModel"

    @staticmethod
    def from_json(raw: dict) -> "BertConfig":
        r = ConfigReader(raw, "BERT")
        r.refuse("position_embedding_type", "absolute", "relative position embeddings")
        r.refuse("is_decoder", False, "a causal decoder")
        r.refuse("add_cross_attention", False, "cross-attention blocks of an encoder-decoder")
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
        r.divides("hidden_size", hidden, "num_attention_heads", heads)
        archs = raw.get("architectures") or ["BertModel"]
        arch = next((a for a in archs if a == "BertModel" or a in _TASK_MODELS), "BertModel")
        return BertConfig(
            vocab_size=r.int("vocab_size"), hidden_size=hidden, num_hidden_layers=r.int("num_hidden_layers"),
            num_attention_heads=heads, intermediate_size=r.int("intermediate_size"),
            max_position_embeddings=r.int("max_position_embeddings"), type_vocab_size=r.int("type_vocab_size", 2),
            hidden_act=r.choice("hidden_act", "gelu", _ACTIVATIONS),
            hidden_dropout_prob=r.float("hidden_dropout_prob", 0.1, maximum=1.0),
            attention_probs_dropout_prob=r.float("attention_probs_dropout_prob", 0.1, maximum=1.0),
            layer_norm_eps=r.float("layer_norm_eps", 1e-12), pad_token_id=r.token_id("pad_token_id"),
            add_pooling_layer=arch not in _NO_POOLER, prefix="" if arch == "BertModel" else "bert.",
            architecture=arch,
        )

    def to_json(self) -> dict:
        return {
            "architectures": [self.architecture], "model_type": "bert",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size, "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size, "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "layer_norm_eps": self.layer_norm_eps, "pad_token_id": self.pad_token_id,
            "position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False,
        }


# ---------------------------------------------------------------------------------- the model
def _norm(c: BertConfig, device):
    return nn.LayerNormConfig(c.hidden_size, epsilon=c.layer_norm_eps).init(device)


def _linear(d_in, d_out, device):
    return nn.LinearConfig(d_in, d_out, initializer=initializers.Normal(0.0, 0.02)).init(device)


class BertEmbeddings(Module):
    """`LayerNorm(word + position + token type)`, then dropout."""

    def __init__(self, c: BertConfig, device=None):
        init = initializers.Normal(0.0, 0.02)
        d = c.hidden_size
        self.word_embeddings = nn.EmbeddingConfig(c.vocab_size, d, initializer=init).init(device)
        self.position_embeddings = nn.EmbeddingConfig(c.max_position_embeddings, d, initializer=init).init(device)
        self.token_type_embeddings = nn.EmbeddingConfig(c.type_vocab_size, d, initializer=init).init(device)
        self.LayerNorm = _norm(c, device)
        self.dropout = nn.DropoutConfig(c.hidden_dropout_prob).init()

    def forward(self, input_ids, token_type_ids=None):
        batch, seq = input_ids.shape
        n_positions = self.position_embeddings.weight.shape[0]
        if seq > n_positions:
            raise ValueError(f"input_ids: {seq} tokens, but this BERT has {n_positions} positions "
                             f"(max_position_embeddings)")
        positions = Tensor.arange(seq, device=input_ids.device).reshape(1, seq)
        if token_type_ids is None:
            token_type_ids = Tensor.zeros([batch, seq], device=input_ids.device, dtype=input_ids.dtype)
        else:
            token_type_ids = check_ids(token_type_ids, "token_type_ids")
            if tuple(token_type_ids.shape) != (batch, seq):
                raise ValueError(f"token_type_ids: expected dims [{batch}, {seq}] (the input ids' dims), found "
                                 f"{list(token_type_ids.shape)}")
        x = (self.word_embeddings.forward(input_ids) + self.position_embeddings.forward(positions)
             + self.token_type_embeddings.forward(token_type_ids))
        return self.dropout.forward(self.LayerNorm.forward(x))


class BertSelfOutput(Module):
    """`LayerNorm(dropout(attention) + x)` (the attention's output projection is in `self.output`)."""

    def __init__(self, c: BertConfig, device=None):
        self.LayerNorm = _norm(c, device)
        self.dropout = nn.DropoutConfig(c.hidden_dropout_prob).init()

    def forward(self, attended, x):
        return self.LayerNorm.forward(self.dropout.forward(attended) + x)


class BertAttention(Module):
    """Self-attention (`self`: query, key, value, output) and its residual norm (`output`)."""

    def __init__(self, c: BertConfig, device=None):
        # transformers' field names: `self` is the attention, `output` the norm after it
        setattr(self, "self", nn.MultiHeadAttentionConfig(
            c.hidden_size, c.num_attention_heads, dropout=c.attention_probs_dropout_prob, min_float=MASKED,
            initializer=initializers.Normal(0.0, 0.02)).init(device))
        self.output = BertSelfOutput(c, device)

    def forward(self, x, mask_pad):
        inp = nn.MhaInput.self_attn(x)
        if mask_pad is not None:
            inp = inp.mask_pad(mask_pad)
        attention = getattr(self, "self")
        return self.output.forward(attention.forward(inp).context, x)


class BertIntermediate(Module):
    """`act(dense(x))` (gelu by default)."""

    def __init__(self, c: BertConfig, device=None):
        self.dense = _linear(c.hidden_size, c.intermediate_size, device)
        self.intermediate_act_fn = activation(c.hidden_act)

    def forward(self, x):
        return self.intermediate_act_fn.forward(self.dense.forward(x))


class BertOutput(Module):
    """`LayerNorm(dropout(dense(h)) + x)`."""

    def __init__(self, c: BertConfig, device=None):
        self.dense = _linear(c.intermediate_size, c.hidden_size, device)
        self.LayerNorm = _norm(c, device)
        self.dropout = nn.DropoutConfig(c.hidden_dropout_prob).init()

    def forward(self, h, x):
        return self.LayerNorm.forward(self.dropout.forward(self.dense.forward(h)) + x)


class BertLayer(Module):
    """One post-norm encoder layer: attention, then the feed-forward block."""

    def __init__(self, c: BertConfig, device=None):
        self.attention = BertAttention(c, device)
        self.intermediate = BertIntermediate(c, device)
        self.output = BertOutput(c, device)

    def forward(self, x, mask_pad):
        x = self.attention.forward(x, mask_pad)
        return self.output.forward(self.intermediate.forward(x), x)


class BertEncoder(Module):
    """The encoder layers, in order (`layer.0`, `layer.1`, ...)."""

    def __init__(self, c: BertConfig, device=None):
        self.layer = [BertLayer(c, device) for _ in layer_range(c.num_hidden_layers)]

    def forward(self, x, mask_pad):
        for layer in self.layer:
            x = layer.forward(x, mask_pad)
        return x


class BertPooler(Module):
    """`tanh(dense(hidden[:, 0]))`: the first token's hidden state, projected."""

    def __init__(self, c: BertConfig, device=None):
        self.dense = _linear(c.hidden_size, c.hidden_size, device)
        self.activation = nn.Tanh()

    def forward(self, hidden):
        first = hidden.narrow(1, 0, 1).squeeze_dim(1)
        return self.activation.forward(self.dense.forward(first))


class BertModel(Module):
    """BERT's encoder (see the module docstring). `config` is its BertConfig."""

    def __init__(self, config: BertConfig, device=None):
        self.embeddings = BertEmbeddings(config, device)
        self.encoder = BertEncoder(config, device)
        self.pooler = BertPooler(config, device) if config.add_pooling_layer else None
        self._config = config

    @property
    def config(self) -> BertConfig:
        return self._config

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        """The last hidden state `[batch, seq, hidden_size]` of int `input_ids` `[batch, seq]`;
        `attention_mask` `[batch, seq]` (1 = token, 0 = padding) hides padding keys;
        `token_type_ids` `[batch, seq]` (segment A = 0, B = 1) defaults to zeros."""
        ids = check_ids(input_ids)
        batch, seq = ids.shape
        mask_pad = attention_masks(attention_mask, batch, seq, ids.device)
        return self.encoder.forward(self.embeddings.forward(ids, token_type_ids), mask_pad)

    def pool(self, hidden: Tensor) -> Tensor:
        """The pooler output `[batch, hidden_size]` of hidden states from `forward`."""
        if self.pooler is None:
            raise ValueError(f"this BertModel has no pooler (the checkpoint is a {self._config.architecture}, "
                             f"which has none)")
        return self.pooler.forward(hidden)

    def pooled(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        """transformers' `pooler_output` `[batch, hidden_size]`: `pool(forward(...))`."""
        return self.pool(self.forward(input_ids, attention_mask, token_type_ids))


def build(config: BertConfig, device=None) -> BertModel:
    """The model with every parameter lazy (nothing allocated until used)."""
    return BertModel(config, device)


def _linear_rules(hf: str, ember: str) -> list[Rule]:
    # torch nn.Linear stores [out, in]; Ember's Linear [in, out]
    return [Rule(f"{hf}.weight", f"{ember}.weight", [Transpose()]), Rule(f"{hf}.bias", f"{ember}.bias")]


def _norm_rules(hf: str, ember: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{ember}.gamma"), Rule(f"{hf}.bias", f"{ember}.beta")]


def weight_map(config: BertConfig) -> WeightMap:
    p = config.prefix
    e, lay = f"{p}embeddings", f"{p}encoder.layer.{{i}}"
    rules = [Rule(f"{e}.{name}.weight", f"embeddings.{name}.weight")
             for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    rules += _norm_rules(f"{e}.LayerNorm", "embeddings.LayerNorm")
    for part in ("query", "key", "value"):
        rules += _linear_rules(f"{lay}.attention.self.{part}", f"encoder.layer.{{i}}.attention.self.{part}")
    rules += _linear_rules(f"{lay}.attention.output.dense", "encoder.layer.{i}.attention.self.output")
    rules += _norm_rules(f"{lay}.attention.output.LayerNorm", "encoder.layer.{i}.attention.output.LayerNorm")
    rules += _linear_rules(f"{lay}.intermediate.dense", "encoder.layer.{i}.intermediate.dense")
    rules += _linear_rules(f"{lay}.output.dense", "encoder.layer.{i}.output.dense")
    rules += _norm_rules(f"{lay}.output.LayerNorm", "encoder.layer.{i}.output.LayerNorm")
    if config.add_pooling_layer:
        rules += _linear_rules(f"{p}pooler.dense", "pooler.dense")
    ignore = [r"(\A|\.)embeddings\.position_ids\Z", r"(\A|\.)embeddings\.token_type_ids\Z"]
    if p:  # a task model's head is not part of BertModel
        ignore.append(r"\A(?!bert\.)")
    if not config.add_pooling_layer:  # files converted from pre-training checkpoints still hold one
        ignore.append(r"\A(bert\.)?pooler\.")
    # old (TF-converted) files name LayerNorm's weight/bias gamma/beta; a BertModel config over a
    # task model's file (bert.-prefixed, with a head) reads the encoder and leaves the head
    aliases = [(r"\.LayerNorm\.gamma\Z", ".LayerNorm.weight"), (r"\.LayerNorm\.beta\Z", ".LayerNorm.bias")]
    if not p:
        aliases.append((r"\Abert\.", ""))
        ignore.append(r"\A(cls|classifier|qa_outputs)\.")
    return WeightMap(rules, ignore=ignore, aliases=aliases)


FAMILY = Family(
    name="bert",
    architectures=("BertModel",) + _TASK_MODELS,
    model_types=("bert",),
    config_from_json=BertConfig.from_json,
    config_to_json=BertConfig.to_json,
    build=build,
    weight_map=weight_map,
    layers=lambda cfg: ("num_hidden_layers", cfg.num_hidden_layers),
)
