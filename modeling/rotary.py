"""Rotary positions: a table of cos/sin computed from position ids, and the slot that rotates queries and keys.

Shapes: B batch, T time, H query heads, D head dim.
"""

import torch
from torch import nn


def rotary_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] frequencies theta^(-2i/D), in fp32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class RotaryEmbedding(nn.Module):
    """Turns position ids into the (cos, sin) pair every rotary attention layer of a stack shares."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        # Not persistent: rebuilt from (head_dim, theta), also after meta-device loading (see _init_weights).
        self.register_buffer("inv_freq", rotary_inverse_frequencies(head_dim, theta), persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids: [B, T] -> cos, sin: [B, T, D]; angles in fp32 whatever the model dtype, as in stock.
        angles = position_ids[..., None].float() * self.inv_freq.float()
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryPositions(nn.Module):
    """Attention's position slot for rotary models: rotates queries and keys by the (cos, sin) it is given."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]):
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)  # [B, 1, T, D], broadcast over heads
        return query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin
