"""A Llama-2-7B-shaped decoder: 32 layers, d_model 4096, 32 heads, RmsNorm, SwiGlu feed-forward
(d_ff 11008), rotary position encoding, vocabulary 32000 -- 6,738,415,616 parameters.

Every parameter is lazy: building, counting and displaying the model allocate no weights (the
rotary table is computed on first use too). `build_config(...)` gives the same architecture at
any size, e.g. a tiny one that runs a forward pass in tests.
"""
import math
from dataclasses import dataclass

from engine import Tensor, assert_shape, nn
from engine.module import Module

DESCRIPTION = "Llama-2-7B-shaped decoder (32 layers, d_model 4096): 6.7 B lazy parameters"


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    d_ff: int = 11008
    max_seq_length: int = 4096
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


class Attention(Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        lin = nn.LinearConfig(cfg.d_model, cfg.d_model, bias=False)
        self.wq = lin.init(device)
        self.wk = lin.init(device)
        self.wv = lin.init(device)
        self.wo = lin.init(device)
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads

    def forward(self, x, rope, mask):
        """Causal self-attention with rotary positions.

        # Shapes

        - x: `[batch_size, seq_length, d_model]`
        - output: `[batch_size, seq_length, d_model]`
        """
        b, s, d = x.dims()

        def heads(t):
            return t.reshape(b, s, self.n_heads, self.head_dim).swap_dims(1, 2)

        q = rope.forward(heads(self.wq.forward(x)))
        k = rope.forward(heads(self.wk.forward(x)))
        v = heads(self.wv.forward(x))
        scores = (q @ k.transpose()) * (1.0 / math.sqrt(self.head_dim))
        weights = scores.mask_fill(mask, -1.0e4).softmax(3)
        return self.wo.forward((weights @ v).swap_dims(1, 2).reshape(b, s, d))


class FeedForward(Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        self.swiglu = nn.SwiGluConfig(cfg.d_model, cfg.d_ff).init(device)
        self.w2 = nn.LinearConfig(cfg.d_ff, cfg.d_model, bias=False).init(device)

    def forward(self, x):
        """`w2(silu(x W1) * x W3)`.

        # Shapes

        - x: `[..., d_model]`
        - output: `[..., d_model]`
        """
        return self.w2.forward(self.swiglu.forward(x))


class TransformerBlock(Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        self.attention_norm = nn.RmsNormConfig(cfg.d_model, epsilon=cfg.norm_eps).init(device)
        self.attention = Attention(cfg, device)
        self.ffn_norm = nn.RmsNormConfig(cfg.d_model, epsilon=cfg.norm_eps).init(device)
        self.feed_forward = FeedForward(cfg, device)

    def forward(self, x, rope, mask):
        x = x + self.attention.forward(self.attention_norm.forward(x), rope, mask)
        return x + self.feed_forward.forward(self.ffn_norm.forward(x))


class Llama(Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        self.tok_embeddings = nn.EmbeddingConfig(cfg.vocab_size, cfg.d_model).init(device)
        self.rope = nn.RotaryEncodingConfig(cfg.max_seq_length, cfg.d_model // cfg.n_heads, cfg.rope_theta).init(device)
        self.layers = [TransformerBlock(cfg, device) for _ in range(cfg.n_layers)]
        self.norm = nn.RmsNormConfig(cfg.d_model, epsilon=cfg.norm_eps).init(device)
        self.output = nn.LinearConfig(cfg.d_model, cfg.vocab_size, bias=False).init(device)

    def forward(self, tokens):
        """Next-token logits.

        # Shapes

        - tokens: `[batch_size, seq_length]`
        - output: `[batch_size, seq_length, vocab_size]`
        """
        assert_shape(tokens, [None, None])
        b, s = tokens.dims()
        mask = nn.generate_autoregressive_mask(b, s, device=tokens.device).unsqueeze(1)
        x = self.tok_embeddings.forward(tokens)
        for layer in self.layers:
            x = layer.forward(x, self.rope, mask)
        return self.output.forward(self.norm.forward(x))


def build_config(device=None, **overrides) -> Llama:
    return Llama(LlamaConfig(**overrides), device)


def build(device=None) -> Llama:
    return Llama(LlamaConfig(), device)


def example_input(batch: int, device=None):
    return Tensor.from_data([[1, 450, 4996, 17354, 1701, 29916, 432, 17204][: 8]] * batch, device=device)
