"""The one Transformer block every architecture stacks.

A recipe fills four norm slots: pre-norm models use the `before` ones, post-norm models the `after` ones, and
the unused slots are `nn.Identity()`, so `forward` never branches on the architecture. A decoder that reads an
encoder (T5) also gets a cross-attention sub-layer with its own norm slots, run when encoder states are passed.

Shapes: B batch, T time, S key positions (the encoder's time, for cross-attention), C channels.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import Attention, AttentionSpec, CrossAttention
from .feedforward import FeedForwardSpec
from .moe import MoESpec
from .norms import build_norm
from .parts import build_feedforward


@dataclass(frozen=True)
class BlockSpec:
    attention: AttentionSpec
    feedforward: FeedForwardSpec | MoESpec  # its `kind` is a key in parts.FEEDFORWARDS
    norm: str  # key in NORMS
    norm_eps: float
    prenorm: bool
    dropout: float = 0.0  # on each sub-layer's output, before the residual add
    mlp_out_dropout: float | None = None  # on the feed-forward output instead, when it differs (None: `dropout`)
    attn_input_norm: bool = True  # False: a pre-norm block whose input is already normalised (ModernBERT's first)
    cross_attention: AttentionSpec | None = None  # attention over an encoder's output, after self-attention
    clamp_fp16: bool = False  # pull fp16 activations back into range after each sub-layer (T5, trained in bf16)


class Fp16Clamp(nn.Module):
    """The residual stream clamped to fp16's finite range after each sub-layer, as stock T5 does (its activations
    outgrow fp16); a no-op in any other dtype. Where a value already overflowed, the bound is 1000 below fp16's
    largest, so that the next addition does not overflow again."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float16:
            return x
        largest = torch.finfo(x.dtype).max
        bound = torch.where(torch.isinf(x).any(), largest - 1000, largest)
        return torch.clamp(x, min=-bound, max=bound)


class Block(GradientCheckpointingLayer):
    def __init__(self, config, spec: BlockSpec, layer_idx: int):
        super().__init__()
        width = spec.attention.hidden_size

        def norm_if(wanted: bool) -> nn.Module:
            return build_norm(spec.norm, width, spec.norm_eps) if wanted else nn.Identity()

        self.norm_before_attn = norm_if(spec.prenorm and spec.attn_input_norm)
        self.attn = Attention(config, spec.attention, layer_idx)
        self.norm_after_attn = norm_if(not spec.prenorm)
        crosses = spec.cross_attention is not None
        self.norm_before_cross = norm_if(crosses and spec.prenorm)
        self.cross_attn = CrossAttention(config, spec.cross_attention, layer_idx) if crosses else None
        self.norm_after_cross = norm_if(crosses and not spec.prenorm)
        self.norm_before_mlp = norm_if(spec.prenorm)
        self.mlp = build_feedforward(spec.feedforward)
        self.norm_after_mlp = norm_if(not spec.prenorm)
        self.dropout = nn.Dropout(spec.dropout)
        self.mlp_dropout = nn.Dropout(spec.dropout if spec.mlp_out_dropout is None else spec.mlp_out_dropout)
        self.clamp = Fp16Clamp() if spec.clamp_fp16 else nn.Identity()

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T, C], or [1, N, C] packed tokens (attention_mask a PackedSequences)
        attention_mask: object = None,
        position_embeddings: object = None,
        encoder_hidden_states: torch.Tensor | None = None,  # [B, S, C], read by cross-attention
        encoder_attention_mask: torch.Tensor | None = None,  # over the encoder's positions
        encoder_decoder_cache=None,  # a transformers EncoderDecoderCache: cross-attention keys/values, once
        **kwargs,
    ) -> torch.Tensor:  # [B, T, C]
        # `.to`: under a device_map that splits a block (a mixture of experts spread over devices), a sub-layer may
        # answer on its own device; the residual stream stays where it is. A no-op on one device.
        attn_out, _ = self.attn(self.norm_before_attn(hidden_states), attention_mask, position_embeddings, **kwargs)
        hidden_states = self.norm_after_attn(hidden_states + self.dropout(attn_out).to(hidden_states.device))
        hidden_states = self.clamp(hidden_states)
        if encoder_hidden_states is not None:
            normed = self.norm_before_cross(hidden_states)
            cross_out, _ = self.cross_attn(normed, encoder_hidden_states, encoder_attention_mask, encoder_decoder_cache)
            hidden_states = self.norm_after_cross(hidden_states + self.dropout(cross_out).to(hidden_states.device))
            hidden_states = self.clamp(hidden_states)
        mlp_out = self.mlp(self.norm_before_mlp(hidden_states))
        return self.clamp(self.norm_after_mlp(hidden_states + self.mlp_dropout(mlp_out).to(hidden_states.device)))
