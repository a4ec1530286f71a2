"""Multi-head attention: projections and position scheme here, the kernel chosen by transformers' interface.

Shapes: B batch, T query time, S key time, C channels, H query heads, K key/value heads, D head dim.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .linear import Linear
from .padding import PackedSequences, packed_attention
from .rotary import RotaryPositions


@dataclass(frozen=True)
class AttentionSpec:
    hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None  # None: as many as query heads
    head_dim: int | None = None  # None: hidden_size // num_heads
    bias: bool = True  # on q/k/v projections
    out_bias: bool = True
    dropout: float = 0.0  # on attention probabilities, in training
    is_causal: bool = False
    scaling: float | None = None  # None: 1/sqrt(head_dim)
    positions: str = "absolute"  # key in POSITIONS: how queries and keys learn where they are


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, K, S, D] -> [B, K * groups, S, D], each key/value head serving `groups` query heads."""
    if groups == 1:
        return x
    b, k, s, d = x.shape
    return x[:, :, None].expand(b, k, groups, s, d).reshape(b, k * groups, s, d)


def causal_bool_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """[1, 1, T, S], True where query i may see key j (queries are the last T of S positions)."""
    offset = k_len - q_len
    q_pos = torch.arange(q_len, device=device)[:, None] + offset
    return (torch.arange(k_len, device=device)[None, :] <= q_pos)[None, None]


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, K, S, D]
    value: torch.Tensor,  # [B, K, S, D]
    attention_mask: torch.Tensor | None,  # bool [B, 1, T, S] (True = attend) or additive float, or None
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [B, H, T, S]
    if attention_mask is None and module.is_causal and query.shape[2] > 1:
        attention_mask = causal_bool_mask(query.shape[2], key.shape[2], query.device)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()  # [B, T, H, D]
    return out, weights


class AbsolutePositions(nn.Module):
    """Positions already live in the embeddings: queries and keys pass through unchanged."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, position_embeddings: object = None):
        return query, key


POSITIONS: dict[str, type[nn.Module]] = {"absolute": AbsolutePositions, "rotary": RotaryPositions}


class Attention(nn.Module):
    """Self-attention. `config` is kept only to read the kernel the user selected (`config._attn_implementation`)."""

    def __init__(self, config, spec: AttentionSpec, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads or spec.num_heads
        self.head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
        # Read by transformers' kernels: sdpa treats a module without `is_causal` as causal.
        self.is_causal = spec.is_causal
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = spec.scaling if spec.scaling is not None else self.head_dim**-0.5
        self.dropout = nn.Dropout(spec.dropout)  # a module, so that code adjusting every nn.Dropout reaches it

        self.q_proj = Linear(spec.hidden_size, self.num_heads * self.head_dim, bias=spec.bias)
        self.k_proj = Linear(spec.hidden_size, self.num_kv_heads * self.head_dim, bias=spec.bias)
        self.v_proj = Linear(spec.hidden_size, self.num_kv_heads * self.head_dim, bias=spec.bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, spec.hidden_size, bias=spec.out_bias)
        self.positions = POSITIONS[spec.positions]()

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T, C]
        attention_mask: torch.Tensor | PackedSequences | None = None,  # PackedSequences: T is the packed tokens
        position_embeddings: object = None,
        cache=None,  # a transformers Cache (decoders): this layer's keys/values are appended and all returned
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, _ = hidden_states.shape
        query = self.q_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        key = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, K, T, D]
        value = self.v_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, K, T, D]
        query, key = self.positions(query, key, position_embeddings)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # [B, K, S, D]
        return self.attend(query, key, value, attention_mask, **kwargs)

    def attend(
        self,
        query: torch.Tensor,  # [B, H, T, D]
        key: torch.Tensor,  # [B, K, S, D]
        value: torch.Tensor,  # [B, K, S, D]
        attention_mask: torch.Tensor | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kernel the user selected, then the output projection: [B, T, C] and the weights (eager only)."""
        b, _, t, _ = query.shape
        kernel: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention)
        if isinstance(attention_mask, PackedSequences):
            kernel = packed_attention
        out, weights = kernel(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.dropout.p if self.training else 0.0,
            **kwargs,
        )  # out: [B, T, H, D]
        return self.o_proj(out.reshape(b, t, -1)), weights


class CrossAttention(Attention):
    """Queries from this stack over another sequence (the encoder's output): no positions, no causality.

    With an `EncoderDecoderCache` the keys and values are computed once per sequence: the first call stores them
    in `cache.cross_attention_cache` and flags `cache.is_updated[layer_idx]`; later decoding steps reuse them.
    """

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T, C]
        encoder_hidden_states: torch.Tensor,  # [B, S, C]
        attention_mask: torch.Tensor | None = None,  # over the encoder's positions
        cache=None,  # a transformers EncoderDecoderCache, or None
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, _ = hidden_states.shape
        query = self.q_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        if cache is not None and cache.is_updated.get(self.layer_idx):
            stored = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = stored.keys, stored.values  # [B, K, S, D]
        else:
            s = encoder_hidden_states.shape[1]
            key = self.k_proj(encoder_hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, K, S, D]
            value = self.v_proj(encoder_hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, K, S, D]
            if cache is not None:
                key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
        return self.attend(query, key, value, attention_mask, **kwargs)
