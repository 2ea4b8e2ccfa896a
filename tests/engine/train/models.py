"""Small models the training tests share."""
from engine import nn
from engine.module import Module


class MLP(Module):
    def __init__(self, device=None, d_in=2, hidden=64, d_out=2, dropout=0.0):
        self.fc1 = nn.LinearConfig(d_in, hidden).init(device)
        self.fc2 = nn.LinearConfig(hidden, hidden).init(device)
        self.fc3 = nn.LinearConfig(hidden, d_out).init(device)
        self.dropout = nn.DropoutConfig(dropout).init()
        self.act = nn.Relu()

    def forward(self, x):
        x = self.dropout.forward(self.act.forward(self.fc1.forward(x)))
        x = self.dropout.forward(self.act.forward(self.fc2.forward(x)))
        return self.fc3.forward(x)
