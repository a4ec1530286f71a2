"""Rotary positions: a table of cos/sin computed from position ids, and the slot that rotates queries and keys.

The frequencies of a scaled rotary (linear, dynamic, yarn, llama3, ...) come from transformers' own
`ROPE_INIT_FUNCTIONS`, which read the model config's `rope_parameters`: fivefold never re-derives them. Like
stock, cos and sin are multiplied by the factor those functions return (yarn's mscale), and a "dynamic" table is
recomputed when a call reaches past the longest sequence seen, and reset when calls are short again.

Shapes: B batch, T time, H query heads, D head dim.
"""

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..configuration.validation import check_rope_type


def rotary_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] frequencies theta^(-2i/D), in fp32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class RotaryEmbedding(nn.Module):
    """Turns position ids into the (cos, sin) pair every rotary attention layer of a stack shares. `config` (the
    model's) is read by transformers' rope functions for any rope_type but "default"."""

    def __init__(self, head_dim: int, theta: float, rope_type: str = "default", config=None):
        super().__init__()
        check_rope_type(rope_type)
        self.head_dim = head_dim
        self.theta = theta
        self.rope_type = rope_type
        self.config = config
        inv_freq, self.attention_scaling = self.initial_frequencies()
        # Not persistent: rebuilt from the config, also after meta-device loading (see _init_weights).
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if self.dynamic:
            self.register_buffer("base_inv_freq", inv_freq.clone(), persistent=False)
            self.original_max_seq_len = self.max_seq_len_cached = config.max_position_embeddings

    @property
    def dynamic(self) -> bool:
        return "dynamic" in self.rope_type

    def initial_frequencies(self, seq_len: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """([D/2] inverse frequencies, the factor cos and sin are multiplied by), for sequences of `seq_len`."""
        if self.rope_type == "default":
            return rotary_inverse_frequencies(self.head_dim, self.theta), 1.0
        device = seq_len.device if seq_len is not None else None
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](self.config, device, seq_len=seq_len)
        if inv_freq.shape[-1] * 2 != self.head_dim:
            raise ValueError(
                f"rope_type {self.rope_type!r} gives {inv_freq.shape[-1] * 2} rotary dimensions for heads of "
                f"{self.head_dim}: fivefold rotates whole heads (partial_rotary_factor 1)"
            )
        return inv_freq, scaling

    def follow_length(self, position_ids: torch.Tensor) -> None:
        """Dynamic rope, as stock updates it: a longer call than any so far recomputes the table for its length; a
        call within the trained length after a longer one restores the trained table."""
        seq_len = torch.max(position_ids) + 1
        if seq_len > self.max_seq_len_cached:
            inv_freq, self.attention_scaling = self.initial_frequencies(seq_len)
            self.inv_freq = inv_freq
            self.max_seq_len_cached = seq_len
        if seq_len < self.original_max_seq_len < self.max_seq_len_cached:
            self.inv_freq = self.base_inv_freq.to(position_ids.device)
            self.max_seq_len_cached = self.original_max_seq_len

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids: [B, T] -> cos, sin: [B, T, D]; angles in fp32 whatever the model dtype, as in stock.
        if self.dynamic:
            self.follow_length(position_ids)
        angles = position_ids[..., None].float() * self.inv_freq.float()
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryPositions(nn.Module):
    """Attention's position slot for rotary models: rotates queries and keys by the (cos, sin) it is given."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]):
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)  # [B, 1, T, D], broadcast over heads
        return query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin
