"""Task heads shared by the encoder families.

Shapes: B batch, T time, C channels, V vocabulary, L labels.
"""

import torch
from torch import nn

from .feedforward import activation
from .linear import Linear
from .norms import build_norm


class Pooler(nn.Module):
    """dense + activation (tanh unless configured) on the first token: BERT's and ViT's `pooler_output`."""

    def __init__(self, hidden_size: int, out_size: int | None = None, act: str = "tanh"):
        super().__init__()
        self.dense = Linear(hidden_size, out_size or hidden_size)
        self.act = activation(act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, C] (or [B, out_size])
        return self.act(self.dense(hidden_states[:, 0]))


class MaskedLMHead(nn.Module):
    """dense -> activation -> norm -> decoder (weight tied to the word embeddings when configured)."""

    def __init__(self, hidden_size: int, vocab_size: int, act: str, norm: str, norm_eps: float, bias: bool = True):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size, bias=bias)
        self.act = activation(act)
        self.norm = build_norm(norm, hidden_size, norm_eps)
        self.decoder = Linear(hidden_size, vocab_size, bias=bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, V]
        return self.decoder(self.norm(self.act(self.dense(hidden_states))))


class PooledClassifier(Linear):
    """dropout -> linear on the pooler output (BERT)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float):
        super().__init__(hidden_size, num_labels)
        self.dropout = nn.Dropout(dropout)

    def forward(self, outputs) -> torch.Tensor:  # pooler_output [B, C] -> [B, L]
        return super().forward(self.dropout(outputs.pooler_output))


class FirstTokenClassifier(nn.Module):
    """dropout -> dense -> tanh -> dropout -> out_proj on the first token (RoBERTa)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = Linear(hidden_size, hidden_size)
        self.out_proj = Linear(hidden_size, num_labels)

    def forward(self, outputs) -> torch.Tensor:  # last_hidden_state [B, T, C] -> [B, L]
        x = self.dropout(outputs.last_hidden_state[:, 0])
        x = self.dropout(torch.tanh(self.dense(x)))
        return self.out_proj(x)


SEQUENCE_CLASSIFIERS = {"pooled": PooledClassifier, "first_token": FirstTokenClassifier}
# Which classifiers read `pooler_output`, so the base model must build its pooler.
CLASSIFIERS_NEEDING_POOLER = {"pooled"}


def build_sequence_classifier(kind: str, hidden_size: int, num_labels: int, dropout: float) -> nn.Module:
    if kind not in SEQUENCE_CLASSIFIERS:
        raise ValueError(f"unknown sequence classifier {kind!r}; valid: {', '.join(sorted(SEQUENCE_CLASSIFIERS))}")
    return SEQUENCE_CLASSIFIERS[kind](hidden_size, num_labels, dropout)
