"""Rotary positions: a table of cos/sin computed from position ids, and the slot that rotates queries and keys.

Shapes: B batch, T time, H query heads, D head dim.
"""

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def rotary_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] frequencies theta^(-2i/D), in fp32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class RotaryEmbedding(nn.Module):
    """Turns position ids into the (cos, sin) pair every rotary attention layer of a stack shares. A scaled
    rotary (`rope_type` other than "default": yarn, ...) takes its frequencies and its cos/sin scale from
    transformers' own rope function for that type, read off the model's config, as stock does."""

    def __init__(self, head_dim: int, theta: float, rope_type: str = "default", config=None):
        super().__init__()
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"unknown rope_type {rope_type!r}; valid: default, {', '.join(ROPE_INIT_FUNCTIONS)}")
        self.head_dim = head_dim
        self.theta = theta
        self.rope_type = rope_type
        self.config = config
        inv_freq, self.attention_scaling = self.inverse_frequencies()
        # Not persistent: rebuilt by inverse_frequencies(), also after meta-device loading (see _init_weights).
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def inverse_frequencies(self) -> tuple[torch.Tensor, float]:
        """[D/2] fp32 frequencies and the factor cos and sin are scaled by."""
        if self.rope_type == "default":
            return rotary_inverse_frequencies(self.head_dim, self.theta), 1.0
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](self.config)
        return inv_freq.float(), float(scaling)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids: [B, T] -> cos, sin: [B, T, D]; angles in fp32 whatever the model dtype, as in stock.
        angles = position_ids[..., None].float() * self.inv_freq.float()
        angles = torch.cat((angles, angles), dim=-1)
        if self.attention_scaling == 1.0:
            return angles.cos().to(dtype), angles.sin().to(dtype)
        return (angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryPositions(nn.Module):
    """Attention's position slot for rotary models: rotates queries and keys by the (cos, sin) it is given."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]):
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)  # [B, 1, T, D], broadcast over heads
        return query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin
