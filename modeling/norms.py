"""Normalisation layers, chosen by name.

Shapes: B batch, T time, C channels.
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Scale by the root mean square, no centring and no bias; statistics in fp32 as T5 and Llama do. A half-precision
    norm answers in its own dtype, whatever the input's (T5's residual stream turns fp32 after a feed-forward kept in
    fp32; the projections after the norm are half)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        variance = x.float().pow(2).mean(-1, keepdim=True)
        normed = x.float() * torch.rsqrt(variance + self.eps)
        half = self.weight.dtype in (torch.float16, torch.bfloat16)
        return self.weight * normed.to(self.weight.dtype if half else x.dtype)


class RMSNormWeightedInFp32(RMSNorm):
    """gpt-oss's RMSNorm: the weight multiplies the fp32 normalised values, and the product is rounded to the input's
    dtype once (Llama's rounds before the weight multiplies). Stock keeps this weight in fp32 in fp16 models."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (self.weight * (x.float() * torch.rsqrt(variance + self.eps))).to(x.dtype)


class HeadRMSNorm(RMSNorm):
    """RMSNorm over each head's slice of a [B, T, H * D] projection: one weight of D shared by every head (Qwen3's
    q_norm/k_norm), applied before the heads are split off, so attention treats it like any other query norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H * D] -> [B, T, H * D]
        return super().forward(x.unflatten(-1, (-1, self.weight.shape[0]))).flatten(-2)


def _layernorm(dim: int, eps: float) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps)


def _layernorm_without_bias(dim: int, eps: float) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps, bias=False)


def _none(dim: int, eps: float) -> nn.Module:
    return nn.Identity()


NORMS = {
    "layernorm": _layernorm,
    "layernorm_nobias": _layernorm_without_bias,
    "rmsnorm": RMSNorm,
    "rmsnorm_weighted_in_fp32": RMSNormWeightedInFp32,
    "none": _none,
}


# Query/key norms, by what they normalise over: "head" each head's D values, "width" the whole projection (H * D
# for queries, K * D for keys, as OLMoE). Applied to the projection before rotary, as stock does.
QK_NORMS = {"none": _none, "head": HeadRMSNorm, "width": RMSNorm}


def build_qk_norm(kind: str, heads: int, head_dim: int, eps: float) -> nn.Module:
    if kind not in QK_NORMS:
        raise ValueError(f"unknown query/key norm {kind!r}; valid: {', '.join(sorted(QK_NORMS))}")
    return QK_NORMS[kind](head_dim if kind == "head" else heads * head_dim, eps)


def build_norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind not in NORMS:
        raise ValueError(f"unknown norm {kind!r}; valid: {', '.join(sorted(NORMS))}")
    return NORMS[kind](dim, eps)
