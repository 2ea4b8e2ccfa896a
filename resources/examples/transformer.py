"""A small transformer encoder classifier: token embedding, sinusoidal positions, a 2-layer
transformer encoder, mean pooling over the (unpadded) sequence and a linear head."""
from engine import Tensor, assert_shape, nn
from engine.module import Module

DESCRIPTION = "Transformer encoder classifier: Embedding + PositionalEncoding + 2 encoder layers + Linear"


class TextClassifier(Module):
    def __init__(self, vocab_size=1000, d_model=64, n_heads=4, d_ff=128, n_layers=2, num_classes=4,
                 max_seq_length=128, dropout=0.1, device=None):
        self.embedding = nn.EmbeddingConfig(vocab_size, d_model).init(device)
        self.positions = nn.PositionalEncodingConfig(d_model, max_sequence_size=max_seq_length).init(device)
        self.encoder = nn.TransformerEncoderConfig(d_model, d_ff, n_heads, n_layers, dropout=dropout,
                                                   norm_first=True).init(device)
        self.norm = nn.LayerNormConfig(d_model).init(device)
        self.output = nn.LinearConfig(d_model, num_classes).init(device)
        self.pad_token = 0

    def forward(self, tokens):
        """Class logits for a batch of token sequences (token 0 is padding).

        # Shapes

        - tokens: `[batch_size, seq_length]`
        - output: `[batch_size, num_classes]`
        """
        assert_shape(tokens, [None, None])
        mask_pad = tokens.equal(self.pad_token)
        x = self.positions.forward(self.embedding.forward(tokens))
        x = self.encoder.forward(nn.TransformerEncoderInput(x).mask_pad(mask_pad))
        x = self.norm.forward(x)
        keep = mask_pad.bool_not().cast(x.dtype).unsqueeze(2)
        pooled = (x * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.output.forward(pooled)


def build(device=None) -> TextClassifier:
    return TextClassifier(device=device)


def example_input(batch: int, device=None):
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 1000, size=(batch, 32))
    for i in range(batch):
        tokens[i, 32 - (i % 8):] = 0  # some padding at the end
    return Tensor.from_data(tokens, device=device)
