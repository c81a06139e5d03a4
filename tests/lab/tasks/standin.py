"""A tiny stand-in model for runner smoke tests (embedding + GRU + head), until the real
host models replace it. ``model.dropout`` (default 0) draws from torch's RNG every step,
which a resumed run must continue exactly."""

from __future__ import annotations

from torch import nn

from srope.lab.tasks.common import ModelRequest


class TinyGRU(nn.Module):
    def __init__(self, vocab_size: int, hidden: int = 32, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.lm_head = nn.Linear(hidden, vocab_size)

    def forward(self, input_ids):
        return self.lm_head(self.dropout(self.rnn(self.embed(input_ids))[0]))


def gru_factory(request: ModelRequest) -> nn.Module:
    return TinyGRU(request.vocab_size, hidden=int(request.model.get("hidden_size", 32)), dropout=float(request.model.get("dropout", 0.0)))
