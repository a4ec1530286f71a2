"""T5's relative position bias: a learned scalar per head for each bucket of key-minus-query distance.

It is computed once per stack forward (stock T5 computes it in the first layer and hands it to the rest) and
added to the attention scores of every layer through the additive mask.

Shapes: H query heads, T time, S key positions.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RelativeBiasSpec:
    num_heads: int
    num_buckets: int
    max_distance: int
    bidirectional: bool  # encoder: keys on both sides; decoder: only the past (later keys share one bucket)


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Key position minus query position -> bucket in [0, num_buckets). Bidirectional buckets are split in
    half by sign; in each half, the first half are exact small distances, the rest log-spaced up to
    `max_distance`, beyond which all distances share the last bucket (Mesh TensorFlow's scheme)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    def __init__(self, spec: RelativeBiasSpec):
        super().__init__()
        self.spec = spec
        self.relative_attention_bias = nn.Embedding(spec.num_buckets, spec.num_heads)

    def forward(
        self,
        query_length: int,
        key_length: int,
        past_length: int | torch.Tensor = 0,
        device: torch.device | None = None,
    ) -> torch.Tensor:
        """[1, H, T, S]. Queries are the `query_length` positions after `past_length` cached ones (a 0-d tensor
        for a static cache, so that compiled decoding steps do not specialise on it). `device`: the activations',
        taken where the table's own is `meta` (accelerate offloads it and loads it only as the lookup runs)."""
        table = self.relative_attention_bias.weight.device
        device = table if device is None or table.type != "meta" else device
        query_position = torch.arange(query_length, device=device)[:, None] + past_length  # [T, 1]
        key_position = torch.arange(key_length, device=device)[None, :]  # [1, S]
        buckets = relative_position_bucket(
            key_position - query_position, self.spec.bidirectional, self.spec.num_buckets, self.spec.max_distance
        )  # [T, S]
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # [T, S, H] -> [1, H, T, S]
