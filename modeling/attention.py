"""Multi-head attention: projections and position scheme here, the kernel chosen in kernels.py.

Shapes: B batch, T time, S key positions, C channels, H query heads, K key/value heads, D head dim.
"""

from dataclasses import dataclass

import torch
from torch import nn

from .kernels import attention_kernel
from .linear import Linear, linears_on_one_input
from .norms import build_qk_norm
from .padding import PackedSequences
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
    rotary_theta: float | None = None  # the rotary base, for positions="rotary"
    # How the rotary frequencies are computed: "default", or a key of transformers' ROPE_INIT_FUNCTIONS ("linear",
    # "dynamic", "yarn", "llama3", ...), which read the model config's `rope_parameters` (rotary.py).
    rope_type: str = "default"
    qk_norm: str = "none"  # key in QK_NORMS: RMSNorm of queries and keys per head ("head"), across heads ("width")
    qk_norm_eps: float = 1e-6
    window: int | None = None  # a sliding window: keys at most this many positions from the query; None: all
    sinks: bool = False  # a learned logit per head that joins every row's softmax and takes its share of nothing

    @property
    def per_head(self) -> int:
        """D, the width of one head."""
        return self.head_dim or self.hidden_size // self.num_heads

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown positions {self.positions!r}; valid: {', '.join(sorted(POSITIONS))}")
        if (self.positions == "rotary") != (self.rotary_theta is not None):
            raise ValueError("rotary positions need a rotary_theta, and only they take one")


class AbsolutePositions(nn.Module):
    """Positions already live in the embeddings (or a bias in the mask): queries and keys pass unchanged."""

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
        self.head_dim = spec.per_head
        # Read by transformers' kernels: sdpa treats a module without `is_causal` as causal.
        self.is_causal = spec.is_causal
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = spec.scaling if spec.scaling is not None else self.head_dim**-0.5
        self.dropout = nn.Dropout(spec.dropout)  # a module, so that code adjusting every nn.Dropout reaches it

        self.q_proj = Linear(spec.hidden_size, self.num_heads * self.head_dim, bias=spec.bias)
        self.k_proj = Linear(spec.hidden_size, self.num_kv_heads * self.head_dim, bias=spec.bias)
        self.v_proj = Linear(spec.hidden_size, self.num_kv_heads * self.head_dim, bias=spec.bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, spec.hidden_size, bias=spec.out_bias)
        self.q_norm = build_qk_norm(spec.qk_norm, self.num_heads, self.head_dim, spec.qk_norm_eps)
        self.k_norm = build_qk_norm(spec.qk_norm, self.num_kv_heads, self.head_dim, spec.qk_norm_eps)
        self.positions = POSITIONS[spec.positions]()
        self.rotary_theta = spec.rotary_theta  # the stack builds one (cos, sin) table per distinct base
        # gpt-oss's attention sinks ([H], `s_aux` to the kernels); None: every row's weights sum to one.
        # Absent (not None) without sinks: transformers' paged kernels test for the attribute itself.
        if spec.sinks:
            self.sinks = nn.Parameter(torch.zeros(self.num_heads))

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T, C]
        attention_mask: torch.Tensor | PackedSequences | None = None,  # PackedSequences: T is the packed tokens
        position_embeddings: object = None,
        cache=None,  # a transformers Cache (decoders): this layer's keys/values are appended and all returned
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, _ = hidden_states.shape
        query, key, value = linears_on_one_input(hidden_states, self.q_proj, self.k_proj, self.v_proj)
        query = self.q_norm(query).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        key = self.k_norm(key).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, K, T, D]
        value = value.view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, K, T, D]
        query, key = self.positions(query, key, position_embeddings)
        if cache is not None:
            # As stock passes them: a paged cache (continuous batching) reads its indices from the kwargs and rewrites
            # them in place for the kernel (this call's own dict: every layer gets a fresh one).
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)  # [B, K, S, D]
        return self.attend(query, key, value, attention_mask, **kwargs)

    def attend(
        self,
        query: torch.Tensor,  # [B, H, T, D]
        key: torch.Tensor,  # [B, K, S, D]
        value: torch.Tensor,  # [B, K, S, D]
        attention_mask: torch.Tensor | PackedSequences | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kernel for this call, then the output projection: [B, T, C] and the weights (eager only)."""
        b, _, t, _ = query.shape
        sinks = getattr(self, "sinks", None)
        if sinks is not None:
            kwargs["s_aux"] = sinks
        out, weights = attention_kernel(self.config, attention_mask, sinks is not None)(
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


# What stock's BERT, RoBERTa and GPT-2 record besides hidden states and attentions: their cross-attention layers'
# maps, an empty tuple where no layer attends across. Their outputs have the field, and a tuple output the entry.
CROSS_ATTENTIONS_RECORD = {"cross_attentions": CrossAttention}
