"""A small transformer learns the (reversed) copy task; without attention it cannot."""
from engine import Tensor, nn, optim
from engine.module import Module
from engine.train import Learner, TrainingConfig, ValidationMetrics, build_task

VOCAB, SEQ, D = 8, 6, 32


class CopyModel(Module):
    def __init__(self, device=None, attention=True):
        self.tokens = nn.EmbeddingConfig(VOCAB, D).init(device)
        self.positions = nn.EmbeddingConfig(SEQ, D).init(device)
        self.encoder = nn.TransformerEncoderConfig(d_model=D, d_ff=64, n_heads=4, n_layers=2, dropout=0.0).init(device) \
            if attention else None
        self.mix = nn.LinearConfig(D, D).init(device)
        self.head = nn.LinearConfig(D, VOCAB).init(device)

    def forward(self, tokens):
        b, s = tokens.shape
        pos = Tensor.arange(s, device=tokens.device).unsqueeze(0).expand((b, s))
        h = self.tokens.forward(tokens) + self.positions.forward(pos)
        if self.encoder is not None:
            h = self.encoder.forward(h)
        return self.head.forward(self.mix.forward(h).relu())


def accuracy(attention):
    task = build_task("copy", seed=0, seq_length=SEQ, vocab_size=VOCAB, reverse=True, n_train=2000, n_valid=200)
    events = []
    result = Learner(lambda d: CopyModel(d, attention), optim.AdamConfig().init(), lr=0.003, task=task,
                     config=TrainingConfig(num_epochs=3, batch_size=64, seed=0), listeners=[events.append]).run()
    assert result.status == "finished", result.error
    return [e for e in events if isinstance(e, ValidationMetrics)][-1].metrics["accuracy"]


def test_transformer_learns_to_reverse_a_sequence():
    assert accuracy(attention=True) >= 0.99


def test_without_attention_positions_cannot_be_routed():
    # each output position sees only its own token: the mirrored one is a guess (1 in 8)
    assert accuracy(attention=False) < 0.3
