"""sdpa on the CPU with grouped key/value heads read where they are.

transformers' sdpa copies each key/value head once for every query head it serves (`repeat_kv`) whenever a mask is
given to more than one query, or the call is traced, because CUDA's fused kernels take no mask with grouped heads
(one query in eager it folds into the key/value heads, copying nothing). torch's CPU flash kernel indexes the shared
heads itself (`enable_gqa`), mask or not, with the same outputs and gradients. Compiled, a SmolLM2-sized decoding
step (9 query heads over 3, a 96-position `StaticCache`) took 1.1-1.6 ms less of its 10.5 without those copies
(benchmarks/quantized.py). Every other call, and any call under `torch.jit.trace` (whose shapes are tensors), goes
to transformers' sdpa unchanged.

Shapes: B batch, T time (the queries), S key positions, H query heads, K key/value heads, D head dim.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def reads_grouped_heads(module: nn.Module, query: torch.Tensor, kwargs: dict) -> bool:
    """Whether this call is one the CPU kernel can take with the heads grouped: grouped heads on the CPU, and none of
    the extras only transformers' function handles (a position bias, a softcap, a request for weights)."""
    return (
        getattr(module, "num_key_value_groups", 1) > 1
        and not torch.jit.is_tracing()
        and query.device.type == "cpu"
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    )


def grouped_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, K, S, D]
    value: torch.Tensor,  # [B, K, S, D]
    attention_mask: torch.Tensor | None,  # bool (True = attend) or additive float, broadcast over heads; or None
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa_attention_forward`, with the same arguments and result ([B, T, H, D], no weights)."""
    if not reads_grouped_heads(module, query, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal=is_causal, **kwargs
        )
    t = query.shape[2]
    # As transformers decides it: a causal flag only where no mask says more, and never for one query (the shape
    # first: a traced shape's comparison must not be the value left).
    flag = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = t > 1 and attention_mask is None and flag
    if causal and key.shape[2] > t:  # the prefill of an empty StaticCache: the keys past the queries are unwritten
        key, value = key[:, :, :t], value[:, :, :t]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, enable_gqa=True
    )  # [B, H, T, D]
    return out.transpose(1, 2).contiguous(), None
